/* Version manifests: JSON (jansson), parsed strictly because they come
 * from a shared file system that another cluster writes. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "daemon/storage/storage_int.h"
#include "gpu/codec.h"

void dts_manifest_fini(struct dts_manifest *m)
{
	free(m->numel);
	free(m->changed);
	free(m->delta.c);
	free(m->key.c);
	memset(m, 0, sizeof(*m));
}

int dts_mpart_add(struct dts_mpart *p, const struct dts_mchunk *c)
{
	if ((p->n & (p->n - 1)) == 0) {	/* grow at powers of two */
		struct dts_mchunk *n = realloc(p->c, (p->n ? 2 * p->n : 1) * sizeof(*n));

		if (!n)
			return DTS_ENOMEM;
		p->c = n;
	}
	p->c[p->n++] = *c;
	p->raw += c->raw;
	p->stored += c->stored;
	return DTS_OK;
}

static json_t *hex64(uint64_t v)
{
	char s[17];

	snprintf(s, sizeof(s), "%016" PRIx64, v);
	return json_string(s);
}

static json_t *dump_part(const struct dts_mpart *p)
{
	json_t *o = json_object(), *a = json_array();

	if (!o || !a)
		goto fail;
	for (size_t i = 0; i < p->n; i++) {
		const struct dts_mchunk *c = &p->c[i];

		if (json_array_append_new(a, json_pack("{s:s,s:I,s:I,s:o}", "file", c->file,
						       "raw", (json_int_t)c->raw,
						       "stored", (json_int_t)c->stored,
						       "xxh3", hex64(c->xxh3))))
			goto fail;
	}
	if (json_object_set_new(o, "chunks", a)) {
		a = NULL;
		goto fail;
	}
	if (json_object_set_new(o, "elements", json_integer((json_int_t)p->elems)) ||
	    json_object_set_new(o, "raw", json_integer((json_int_t)p->raw)) ||
	    json_object_set_new(o, "stored", json_integer((json_int_t)p->stored)))
		goto fail_o;
	return o;
fail:
	json_decref(a);
fail_o:
	json_decref(o);
	return NULL;
}

char *dts_manifest_dump(const struct dts_manifest *m)
{
	json_t *o, *numel = json_array(), *changed = json_array(), *tensors;
	char *text = NULL;

	for (uint32_t i = 0; numel && changed && i < m->ntensors; i++) {
		if (json_array_append_new(numel, json_integer((json_int_t)m->numel[i])) ||
		    json_array_append_new(changed, json_integer((json_int_t)m->changed[i]))) {
			json_decref(numel);
			json_decref(changed);
			return NULL;
		}
	}
	tensors = json_pack("{s:o,s:o}", "numel", numel, "changed", changed);
	o = json_pack("{s:i,s:s,s:I,s:I,s:s,s:o,s:f,s:o,s:o}",
		      "format", (int)m->format, "job", m->job,
		      "version", (json_int_t)m->version, "base", (json_int_t)m->base,
		      "kind", m->keyframe ? "keyframe" : "delta",
		      "spec_hash", hex64(m->spec_hash), "created", m->created,
		      "tensors", tensors, "delta", dump_part(&m->delta));
	if (o && m->keyframe && json_object_set_new(o, "keyframe", dump_part(&m->key))) {
		json_decref(o);
		return NULL;
	}
	if (o)
		text = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	return text;
}

/* ---- parse ---------------------------------------------------------- */

static int get_u64(json_t *o, const char *key, uint64_t max, uint64_t *v,
		   char *err, size_t errlen)
{
	json_t *j = json_object_get(o, key);

	if (!json_is_integer(j) || json_integer_value(j) < 0 ||
	    (uint64_t)json_integer_value(j) > max) {
		DTS_ERR(err, errlen, "manifest: '%s' missing or not an integer in range", key);
		return DTS_EMANIFEST;
	}
	*v = (uint64_t)json_integer_value(j);
	return DTS_OK;
}

static int get_hex(json_t *o, const char *key, uint64_t *v, char *err, size_t errlen)
{
	const char *s = json_string_value(json_object_get(o, key));
	char *end;

	if (!s || strlen(s) != 16 || strspn(s, "0123456789abcdef") != 16) {
		DTS_ERR(err, errlen, "manifest: '%s' is not 16 hex digits", key);
		return DTS_EMANIFEST;
	}
	*v = strtoull(s, &end, 16);
	return DTS_OK;
}

/* Chunk names are produced by the writer: one letter, five digits, .dtc —
 * anything else (a path, "..") is refused before it reaches open(). */
static int chunk_name_ok(const char *s, char kind)
{
	return s && strlen(s) == 10 && s[0] == kind && strspn(s + 1, "0123456789") == 5 &&
	       !strcmp(s + 6, ".dtc");
}

static int parse_part(json_t *o, const char *key, char kind, struct dts_mpart *p,
		      char *err, size_t errlen)
{
	json_t *po = json_object_get(o, key), *a, *c;
	uint64_t elems, raw, stored;
	size_t i;
	int rc;

	memset(p, 0, sizeof(*p));
	if (!json_is_object(po) || !json_is_array(a = json_object_get(po, "chunks")) ||
	    json_array_size(a) > DTS_CHUNKS_MAX) {
		DTS_ERR(err, errlen, "manifest: '%s' needs a chunks list", key);
		return DTS_EMANIFEST;
	}
	if ((rc = get_u64(po, "elements", INT64_MAX, &elems, err, errlen)) ||
	    (rc = get_u64(po, "raw", INT64_MAX, &raw, err, errlen)) ||
	    (rc = get_u64(po, "stored", INT64_MAX, &stored, err, errlen)))
		return rc;
	json_array_foreach(a, i, c) {
		struct dts_mchunk ch;
		const char *file = json_string_value(json_object_get(c, "file"));

		memset(&ch, 0, sizeof(ch));
		if (!json_is_object(c) || !chunk_name_ok(file, kind)) {
			DTS_ERR(err, errlen, "manifest: %s chunk %zu has no valid file name", key, i);
			rc = DTS_EMANIFEST;
			goto fail;
		}
		memcpy(ch.file, file, 11);
		if ((rc = get_u64(c, "raw", DTS_MAX_CHUNK_MAX, &ch.raw, err, errlen)) ||
		    (rc = get_u64(c, "stored", dtc_chunk_bound(DTS_MAX_CHUNK_MAX), &ch.stored,
				  err, errlen)) ||
		    (rc = get_hex(c, "xxh3", &ch.xxh3, err, errlen)))
			goto fail;
		if (ch.stored < 3 * DTC_CHUNK_HDR || ch.stored > dtc_chunk_bound(ch.raw) + 2 * DTC_CHUNK_HDR ||
		    ch.raw < DTS_CHUNK_HDR) {
			DTS_ERR(err, errlen, "manifest: %s chunk %s has impossible sizes", key, file);
			rc = DTS_EMANIFEST;
			goto fail;
		}
		for (size_t j = 0; j < p->n; j++) {
			if (!strcmp(p->c[j].file, ch.file)) {
				DTS_ERR(err, errlen, "manifest: chunk %s listed twice", file);
				rc = DTS_EMANIFEST;
				goto fail;
			}
		}
		if ((rc = dts_mpart_add(p, &ch)) != DTS_OK)
			goto fail;
	}
	if (p->raw != raw || p->stored != stored) {
		DTS_ERR(err, errlen, "manifest: %s totals disagree with its chunks", key);
		rc = DTS_EMANIFEST;
		goto fail;
	}
	p->elems = elems;
	return DTS_OK;
fail:
	free(p->c);
	memset(p, 0, sizeof(*p));
	return rc;
}

static int parse_tensors(json_t *root, struct dts_manifest *m, char *err, size_t errlen)
{
	json_t *t = json_object_get(root, "tensors");
	json_t *numel = json_object_get(t, "numel"), *changed = json_object_get(t, "changed");
	uint64_t sum = 0, total = 0;
	size_t n;

	if (!json_is_array(numel) || !json_is_array(changed) ||
	    (n = json_array_size(numel)) != json_array_size(changed) || n == 0 ||
	    n > DTS_TENSORS_MAX) {
		DTS_ERR(err, errlen, "manifest: tensors needs equal, non-empty numel and changed lists");
		return DTS_EMANIFEST;
	}
	m->ntensors = (uint32_t)n;
	m->numel = calloc(n, sizeof(*m->numel));
	m->changed = calloc(n, sizeof(*m->changed));
	if (!m->numel || !m->changed)
		return DTS_ENOMEM;
	for (size_t i = 0; i < n; i++) {
		json_t *a = json_array_get(numel, i), *b = json_array_get(changed, i);

		if (!json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) <= 0 ||
		    json_integer_value(b) < 0 || json_integer_value(b) > json_integer_value(a)) {
			DTS_ERR(err, errlen, "manifest: tensor %zu: bad numel/changed", i);
			return DTS_EMANIFEST;
		}
		m->numel[i] = (uint64_t)json_integer_value(a);
		m->changed[i] = (uint64_t)json_integer_value(b);
		if (m->numel[i] > INT64_MAX - total) {
			DTS_ERR(err, errlen, "manifest: model too large");
			return DTS_EMANIFEST;
		}
		total += m->numel[i];
		sum += m->changed[i];
	}
	if (sum != m->delta.elems) {
		DTS_ERR(err, errlen, "manifest: delta has %llu elements, tensors add up to %llu",
			(unsigned long long)m->delta.elems, (unsigned long long)sum);
		return DTS_EMANIFEST;
	}
	if (m->keyframe && m->key.elems != total) {
		DTS_ERR(err, errlen, "manifest: keyframe has %llu elements, model has %llu",
			(unsigned long long)m->key.elems, (unsigned long long)total);
		return DTS_EMANIFEST;
	}
	return DTS_OK;
}

int dts_manifest_parse(const char *text, size_t len, struct dts_manifest *m,
		       char *err, size_t errlen)
{
	json_error_t je;
	json_t *root;
	const char *job, *kind;
	json_t *jbase, *jcreated;
	uint64_t format;
	int rc = DTS_EMANIFEST;

	memset(m, 0, sizeof(*m));
	if (!text || len > DTS_MANIFEST_MAX)
		return DTS_EINVAL;
	root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	if (!root) {
		DTS_ERR(err, errlen, "manifest: not valid JSON (%s at byte %d) — truncated?",
			je.text, je.position);
		return DTS_EMANIFEST;
	}
	if (!json_is_object(root)) {
		DTS_ERR(err, errlen, "manifest: not a JSON object");
		goto fail;
	}
	if ((rc = get_u64(root, "format", 1000, &format, err, errlen)))
		goto fail;
	if (format != DTS_FORMAT) {
		DTS_ERR(err, errlen, "manifest: format %llu, this build reads %d",
			(unsigned long long)format, DTS_FORMAT);
		rc = DTS_EMANIFEST;
		goto fail;
	}
	m->format = (uint32_t)format;
	job = json_string_value(json_object_get(root, "job"));
	kind = json_string_value(json_object_get(root, "kind"));
	if (!job || !dts_job_name_ok(job) || !kind ||
	    (strcmp(kind, "delta") && strcmp(kind, "keyframe"))) {
		DTS_ERR(err, errlen, "manifest: needs a valid job and kind delta|keyframe");
		rc = DTS_EMANIFEST;
		goto fail;
	}
	snprintf(m->job, sizeof(m->job), "%s", job);
	m->keyframe = !strcmp(kind, "keyframe");
	if ((rc = get_u64(root, "version", INT64_MAX - 1, &m->version, err, errlen)) ||
	    (rc = get_hex(root, "spec_hash", &m->spec_hash, err, errlen)))
		goto fail;
	jbase = json_object_get(root, "base");
	if (!json_is_integer(jbase) ||
	    (json_integer_value(jbase) != -1 &&
	     (uint64_t)json_integer_value(jbase) + 1 != m->version)) {
		DTS_ERR(err, errlen, "manifest: base must be version-1 or -1");
		rc = DTS_EMANIFEST;
		goto fail;
	}
	m->base = json_integer_value(jbase);
	jcreated = json_object_get(root, "created");
	m->created = json_is_number(jcreated) ? json_number_value(jcreated) : 0;
	if ((rc = parse_part(root, "delta", 'd', &m->delta, err, errlen)))
		goto fail;
	if (m->keyframe && (rc = parse_part(root, "keyframe", 'k', &m->key, err, errlen)))
		goto fail;
	if (!m->keyframe && json_object_get(root, "keyframe")) {
		DTS_ERR(err, errlen, "manifest: a delta version with a keyframe section");
		rc = DTS_EMANIFEST;
		goto fail;
	}
	if (m->base < 0 && (!m->keyframe || m->delta.n || m->delta.elems)) {
		DTS_ERR(err, errlen, "manifest: a version without base must be a bare keyframe");
		rc = DTS_EMANIFEST;
		goto fail;
	}
	if ((rc = parse_tensors(root, m, err, errlen)))
		goto fail;
	json_decref(root);
	return DTS_OK;
fail:
	json_decref(root);
	dts_manifest_fini(m);
	return rc;
}

int dts_manifest_load(const char *path, struct dts_manifest *m, char *err, size_t errlen)
{
	uint8_t *data;
	size_t len;
	int rc;

	memset(m, 0, sizeof(*m));
	if ((rc = dts_read_file(path, DTS_MANIFEST_MAX, &data, &len, err, errlen)) != DTS_OK)
		return rc == DTS_ECHUNK ? DTS_EMANIFEST : rc;	/* DTS_EAGAIN: not there */
	rc = dts_manifest_parse((const char *)data, len, m, err, errlen);
	free(data);
	return rc;
}

int dts_manifest_check_model(const struct dts_manifest *m, const struct dts_model *expect,
			     char *err, size_t errlen)
{
	if (m->spec_hash != expect->spec_hash) {
		DTS_ERR(err, errlen, "model-spec hash %016" PRIx64 ", expected %016" PRIx64,
			m->spec_hash, expect->spec_hash);
		return DTS_ESPEC;
	}
	if (m->ntensors != expect->ntensors) {
		DTS_ERR(err, errlen, "manifest has %u tensors, model has %u", m->ntensors,
			expect->ntensors);
		return DTS_ESPEC;
	}
	for (uint32_t i = 0; i < m->ntensors; i++) {
		if (m->numel[i] != expect->numel[i]) {
			DTS_ERR(err, errlen, "tensor %u: %llu elements in manifest, %llu in model", i,
				(unsigned long long)m->numel[i],
				(unsigned long long)expect->numel[i]);
			return DTS_ESPEC;
		}
	}
	return DTS_OK;
}

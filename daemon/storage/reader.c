/* Storage reader: committed manifests only, everything verified before a
 * version is handed out, broken links repaired from the next keyframe. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "daemon/storage/storage_int.h"
#include "gpu/codec.h"
#include "gpu/compute.h"
#include "gpu/xxh.h"

struct dts_reader {
	char      root[4096];
	char      jobdir[4096];
	char      job[DTS_JOB_NAME_MAX];
	char      name[128];
	uint64_t  spec_hash;
	uint32_t  ntensors;
	uint64_t *numel;
	int64_t   pos;            /* last applied, -1 none */
	int64_t   need_key_from;  /* after a broken link: keyframe >= this; -1 none */
};

void dts_version_free(struct dts_version *v)
{
	if (!v)
		return;
	for (uint32_t i = 0; v->t && i < v->ntensors; i++) {
		free(v->t[i].pos);
		free(v->t[i].val);
	}
	free(v->t);
	free(v);
}

static struct dts_version *version_alloc(const struct dts_manifest *m, int dense)
{
	struct dts_version *v = calloc(1, sizeof(*v));

	if (!v || !(v->t = calloc(m->ntensors, sizeof(*v->t)))) {
		free(v);
		return NULL;
	}
	v->ntensors = m->ntensors;
	v->version = m->version;
	v->dense = dense;
	v->base = dense ? -1 : m->base;
	for (uint32_t i = 0; i < m->ntensors; i++) {
		uint64_t n = dense ? m->numel[i] : m->changed[i];

		v->t[i].count = n;
		v->changed += n;
		if (!n)
			continue;
		if (n > SIZE_MAX / 8 || !(v->t[i].val = malloc(n * sizeof(uint16_t))) ||
		    (!dense && !(v->t[i].pos = malloc(n * sizeof(uint64_t))))) {
			dts_version_free(v);
			return NULL;
		}
	}
	return v;
}

/* Read, check and decode one chunk file into the sink. */
static int load_chunk(const char *vdir, const struct dts_mchunk *c, int kind,
		      struct dts_sink *s, uint64_t version, char *err, size_t errlen)
{
	char path[4096 + 32], why[256] = "";
	struct dts_buf raw = { 0 };
	uint8_t *data = NULL;
	size_t len;
	int rc;

	if (dts_path(path, sizeof(path), "%s/%s", vdir, c->file))
		return DTS_EINVAL;
	if ((rc = dts_read_file(path, c->stored, &data, &len, why, sizeof(why))) != DTS_OK) {
		DTS_ERR(err, errlen, "v%" PRIu64 " chunk %s: %s", version, c->file,
			rc == DTS_EAGAIN ? "file missing" : why);
		return rc == DTS_ENOMEM ? rc : DTS_ECHUNK;
	}
	if (len != c->stored) {
		DTS_ERR(err, errlen, "v%" PRIu64 " chunk %s: %zu bytes, manifest says %" PRIu64,
			version, c->file, len, c->stored);
		rc = DTS_ECHUNK;
		goto out;
	}
	if (XXH3_64bits(data, len) != c->xxh3) {
		DTS_ERR(err, errlen, "v%" PRIu64 " chunk %s: xxh3 mismatch (file corrupt)",
			version, c->file);
		rc = DTS_ECHECKSUM;
		goto out;
	}
	if ((rc = dts_chunk_unpack(data, len, c->raw, &raw, why, sizeof(why))) != DTS_OK) {
		DTS_ERR(err, errlen, "v%" PRIu64 " chunk %s: %s", version, c->file, why);
		goto out;
	}
	if ((rc = dts_chunk_decode(raw.p, raw.len, kind, s, why, sizeof(why))) != DTS_OK)
		DTS_ERR(err, errlen, "v%" PRIu64 " chunk %s: %s", version, c->file, why);
out:
	dts_buf_fini(&raw);
	free(data);
	return rc;
}

static int load_part(const char *jobdir, const struct dts_manifest *m, enum dts_part part,
		     struct dts_version **out, char *err, size_t errlen)
{
	const struct dts_mpart *p = part == DTS_PART_KEYFRAME ? &m->key : &m->delta;
	int dense = part == DTS_PART_KEYFRAME;
	struct dts_version *v;
	struct dts_sink s = { 0 };
	char vdir[4096 + 32];
	int rc = DTS_OK;

	*out = NULL;
	if (dense && !m->keyframe) {
		DTS_ERR(err, errlen, "v%" PRIu64 " is not a keyframe", m->version);
		return DTS_EINVAL;
	}
	snprintf(vdir, sizeof(vdir), "%s/v%" PRIu64, jobdir, m->version);
	if (!(v = version_alloc(m, dense)))
		return DTS_ENOMEM;
	s.ntensors = m->ntensors;
	s.numel = m->numel;
	s.t = v->t;
	s.cap = calloc(m->ntensors, sizeof(*s.cap));
	s.fill = calloc(m->ntensors, sizeof(*s.fill));
	if (!s.cap || !s.fill) {
		rc = DTS_ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < m->ntensors; i++)
		s.cap[i] = v->t[i].count;
	for (size_t i = 0; i < p->n && rc == DTS_OK; i++) {
		rc = load_chunk(vdir, &p->c[i], dense ? DTS_KIND_DENSE : DTS_KIND_SPARSE, &s,
				m->version, err, errlen);
		v->stored += p->c[i].stored;
	}
	for (uint32_t i = 0; i < m->ntensors && rc == DTS_OK; i++) {
		if (s.fill[i] != s.cap[i]) {
			DTS_ERR(err, errlen, "v%" PRIu64 " %s: tensor %u has %" PRIu64 " of %" PRIu64
				" elements", m->version, dense ? "keyframe" : "delta", i, s.fill[i],
				s.cap[i]);
			rc = DTS_ECORRUPT;
		}
	}
out:
	free(s.cap);
	free(s.fill);
	if (rc != DTS_OK) {
		dts_version_free(v);
		return rc;
	}
	*out = v;
	return DTS_OK;
}

/* Manifest of v, checked against the job and (if given) the model. */
static int load_manifest(const char *jobdir, const char *job, uint64_t version,
			 const struct dts_model *expect, struct dts_manifest *m,
			 char *err, size_t errlen)
{
	char path[4096 + 32], why[256] = "";
	int rc;

	snprintf(path, sizeof(path), "%s/v%" PRIu64 ".manifest", jobdir, version);
	if ((rc = dts_manifest_load(path, m, why, sizeof(why))) != DTS_OK) {
		DTS_ERR(err, errlen, "v%" PRIu64 ": %s", version, why);
		return rc;
	}
	if (strcmp(m->job, job) || m->version != version) {
		DTS_ERR(err, errlen, "v%" PRIu64 ": manifest names job %s version %" PRIu64,
			version, m->job, m->version);
		rc = DTS_EMANIFEST;
	} else if (expect && (rc = dts_manifest_check_model(m, expect, why, sizeof(why)))) {
		DTS_ERR(err, errlen, "v%" PRIu64 ": %s", version, why);
	}
	if (rc != DTS_OK)
		dts_manifest_fini(m);
	return rc;
}

int dts_version_load(const char *root, const char *job, uint64_t version, enum dts_part part,
		     const struct dts_model *expect, struct dts_version **out,
		     char *err, size_t errlen)
{
	struct dts_manifest m;
	char jobdir[4096];
	int rc;

	*out = NULL;
	if (!root || !dts_job_name_ok(job) || dts_path(jobdir, sizeof(jobdir), "%s/%s", root, job))
		return DTS_EINVAL;
	if ((rc = load_manifest(jobdir, job, version, expect, &m, err, errlen)) != DTS_OK)
		return rc;
	rc = load_part(jobdir, &m, part, out, err, errlen);
	dts_manifest_fini(&m);
	return rc;
}

/* ---- reader --------------------------------------------------------- */

int dts_reader_open(struct dts_reader **out, const struct dts_reader_cfg *cfg,
		    char *err, size_t errlen)
{
	struct dts_reader *r;
	char dir[4096 + 16];
	int rc;

	*out = NULL;
	if (!cfg || !cfg->root || !dts_job_name_ok(cfg->job) || !cfg->model.ntensors ||
	    !cfg->model.numel || cfg->model.ntensors > DTS_TENSORS_MAX ||
	    (cfg->name && !dts_job_name_ok(cfg->name))) {
		DTS_ERR(err, errlen, "reader: bad configuration (root, job, model, name)");
		return DTS_EINVAL;
	}
	if (!(r = calloc(1, sizeof(*r))) ||
	    !(r->numel = malloc(cfg->model.ntensors * sizeof(*r->numel)))) {
		free(r);
		return DTS_ENOMEM;
	}
	memcpy(r->numel, cfg->model.numel, cfg->model.ntensors * sizeof(*r->numel));
	r->ntensors = cfg->model.ntensors;
	r->spec_hash = cfg->model.spec_hash;
	r->pos = -1;
	r->need_key_from = -1;
	snprintf(r->job, sizeof(r->job), "%s", cfg->job);
	snprintf(r->name, sizeof(r->name), "%s", cfg->name ? cfg->name : "");
	if (dts_path(r->root, sizeof(r->root), "%s", cfg->root) ||
	    dts_path(r->jobdir, sizeof(r->jobdir), "%s/%s", cfg->root, cfg->job)) {
		DTS_ERR(err, errlen, "reader: path too long");
		dts_reader_close(r);
		return DTS_EINVAL;
	}
	/* The reader may start before the writer: make the directory to watch. */
	snprintf(dir, sizeof(dir), "%s/readers", r->jobdir);
	if ((rc = dts_mkdir(r->jobdir, err, errlen)) ||
	    (r->name[0] && (rc = dts_mkdir(dir, err, errlen)))) {
		dts_reader_close(r);
		return rc;
	}
	*out = r;
	return DTS_OK;
}

void dts_reader_close(struct dts_reader *r)
{
	if (!r)
		return;
	free(r->numel);
	free(r);
}

int64_t dts_reader_position(const struct dts_reader *r)
{
	return r->pos;
}

void dts_reader_set_position(struct dts_reader *r, int64_t version)
{
	r->pos = version < 0 ? -1 : version;
	r->need_key_from = -1;
}

static struct dts_model reader_model(const struct dts_reader *r)
{
	struct dts_model m = { r->spec_hash, r->ntensors, r->numel };

	return m;
}

/* The first keyframe that verifies among committed versions, ascending
 * from `from` (from >= 0) or descending from the newest (from < 0). */
static int find_keyframe(struct dts_reader *r, int64_t from, struct dts_version **out,
			 char *err, size_t errlen)
{
	struct dts_model model = reader_model(r);
	uint64_t *v = NULL;
	size_t n = 0;
	int rc, seen_bad = 0;

	*out = NULL;
	if ((rc = dts_scan(r->jobdir, &v, &n, NULL, NULL, err, errlen)) != DTS_OK)
		return rc;
	rc = DTS_EAGAIN;
	for (size_t k = 0; k < n; k++) {
		uint64_t ver = from < 0 ? v[n - 1 - k] : v[k];
		struct dts_manifest m;
		char why[512];

		if (from >= 0 && ver < (uint64_t)from)
			continue;
		if (load_manifest(r->jobdir, r->job, ver, &model, &m, why, sizeof(why))) {
			if (from >= 0) {
				/* Ascending: a broken manifest is skipped for good. */
				r->need_key_from = (int64_t)ver + 1;
				DTS_ERR(err, errlen, "%s", why);
				rc = DTS_EMANIFEST;
				break;
			}
			continue;
		}
		if (!m.keyframe) {
			dts_manifest_fini(&m);
			continue;
		}
		rc = load_part(r->jobdir, &m, DTS_PART_KEYFRAME, out, why, sizeof(why));
		dts_manifest_fini(&m);
		if (rc == DTS_OK)
			break;
		if (rc == DTS_ENOMEM)
			break;
		DTS_ERR(err, errlen, "%s", why);
		seen_bad = 1;
		if (from >= 0) {
			r->need_key_from = (int64_t)ver + 1;
			break;
		}
		rc = DTS_EAGAIN;
	}
	if (from < 0 && rc == DTS_EAGAIN && seen_bad)
		rc = DTS_ECORRUPT;	/* every keyframe there is broken: say why */
	free(v);
	return rc;
}

int dts_reader_next(struct dts_reader *r, struct dts_version **out, char *err, size_t errlen)
{
	struct dts_model model = reader_model(r);
	struct dts_manifest m;
	uint64_t want, *v = NULL;
	size_t n = 0;
	char why[512];
	int rc;

	*out = NULL;
	if (r->pos < 0 && r->need_key_from < 0)
		return find_keyframe(r, -1, out, err, errlen);
	if (r->need_key_from >= 0)
		return find_keyframe(r, r->need_key_from, out, err, errlen);
	want = (uint64_t)r->pos + 1;
	rc = load_manifest(r->jobdir, r->job, want, &model, &m, why, sizeof(why));
	if (rc == DTS_EAGAIN) {
		/* Not committed yet, unless a newer version exists: then a gap. */
		int newer = 0;

		if (dts_fs_hook && dts_fs_hook->armed() == DTS_HOOK_READ_MISS)
			dts_fs_hook->reached(DTS_HOOK_READ_MISS, r->jobdir);
		if (dts_scan(r->jobdir, &v, &n, NULL, NULL, NULL, 0) == DTS_OK && n)
			newer = v[n - 1] > want;
		free(v);
		if (!newer)
			return DTS_EAGAIN;
		/* A writer commits its versions in order, so a newer one in the
		 * scan means `want` was committed before it, or never will be
		 * (a writer that died in it).  The miss above may be older than
		 * that commit (this reader was preempted, or stopped, between
		 * the two looks): look once more before calling it a gap. */
		rc = load_manifest(r->jobdir, r->job, want, &model, &m, why, sizeof(why));
		if (rc == DTS_EAGAIN) {
			r->need_key_from = (int64_t)want;
			DTS_ERR(err, errlen, "v%" PRIu64 " is missing but newer versions exist; "
				"repairing from the next keyframe", want);
			return DTS_EGAP;
		}
	}
	if (rc != DTS_OK) {
		if (rc != DTS_ENOMEM)
			r->need_key_from = (int64_t)want + 1;
		DTS_ERR(err, errlen, "%s; repairing from the next keyframe", why);
		return rc;
	}
	if (m.base < 0)	/* a writer restarted with a bare keyframe */
		rc = load_part(r->jobdir, &m, DTS_PART_KEYFRAME, out, why, sizeof(why));
	else
		rc = load_part(r->jobdir, &m, DTS_PART_DELTA, out, why, sizeof(why));
	if (rc != DTS_OK && rc != DTS_ENOMEM) {
		/* This version's own keyframe (if any) may still be intact. */
		r->need_key_from = m.keyframe && m.base >= 0 ? (int64_t)want : (int64_t)want + 1;
		DTS_ERR(err, errlen, "%s; repairing from the next keyframe", why);
	}
	dts_manifest_fini(&m);
	return rc;
}

int dts_reader_ack(struct dts_reader *r, uint64_t version, char *err, size_t errlen)
{
	char dir[4096 + 16], *text;
	json_t *o;
	int rc;

	if (version > INT64_MAX)
		return DTS_EINVAL;
	r->pos = (int64_t)version;
	r->need_key_from = -1;
	if (!r->name[0])
		return DTS_OK;
	snprintf(dir, sizeof(dir), "%s/readers", r->jobdir);
	o = json_pack("{s:s,s:I,s:f}", "name", r->name, "version", (json_int_t)version,
		      "updated", dts_now());
	text = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	if (!text)
		return DTS_ENOMEM;
	rc = dts_write_atomic(dir, r->name, text, strlen(text), DTS_HOOK_NONE, err, errlen);
	free(text);
	return rc;
}

int dts_reader_registered(const char *root, const char *job, const char *name,
			  int64_t *version)
{
	char path[4096];
	uint8_t *data;
	size_t len;
	json_t *o, *jv;
	int rc = DTS_EMANIFEST;

	*version = -1;
	if (!root || !dts_job_name_ok(job) || !dts_job_name_ok(name) ||
	    dts_path(path, sizeof(path), "%s/%s/readers/%s", root, job, name))
		return DTS_EINVAL;
	if ((rc = dts_read_file(path, 65536, &data, &len, NULL, 0)) != DTS_OK)
		return rc == DTS_EAGAIN ? DTS_OK : rc;
	o = json_loadb((const char *)data, len, 0, NULL);
	jv = json_object_get(o, "version");
	if (json_is_integer(jv) && json_integer_value(jv) >= 0) {
		*version = json_integer_value(jv);
		rc = DTS_OK;
	}
	json_decref(o);
	free(data);
	return rc;
}

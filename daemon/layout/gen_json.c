/* daemon/layout/gen_json.c — declarative pieces for runtimes without a
 * generator.  Format (one side of a job, source or sink):
 *
 *   { "spec_hash": "0123456789abcdef",          optional; checked if given
 *     "buffers": [ {"rank": 0, "id": 0, "length": 4096, "name": "w"} ],
 *                                               optional; else each buffer
 *                                               is as long as its pieces need
 *     "pieces": [ {"tensor": "model.norm.weight", "lo": [0], "hi": [64],
 *                  "rank": 0, "buffer": 0, "offset": 0, "strides": [1],
 *                  "exp_avg": 1, "exp_avg_sq": 2, "group": 1} ] }
 *
 * exp_avg/exp_avg_sq are required for a source and ignored for a sink;
 * group defaults to the spec's (norms and biases no-decay).  Everything is
 * checked (dte_layout_validate) before the layout is used.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "daemon/layout/gen.h"

#define JSON_MAX_PIECES  (1 << 22)
#define JSON_MAX_RANK    (1 << 20)
#define JSON_MAX_BUF     (INT64_C(1) << 31)
#define JSON_MAX_COORD   (INT64_C(1) << 48)

static int jint(json_t *o, const char *key, int64_t def, int64_t min, int64_t max,
		int64_t *out, const char *where, size_t i, char *err, size_t errlen)
{
	json_t *v = json_object_get(o, key);

	if (!v) {
		if (def == INT64_MIN)
			return dte_layout_err(err, errlen, "%s[%zu]: missing \"%s\"", where, i, key);
		*out = def;
		return 0;
	}
	if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
		return dte_layout_err(err, errlen, "%s[%zu]: \"%s\" must be an integer in [%lld, %lld]",
				      where, i, key, (long long)min, (long long)max);
	*out = json_integer_value(v);
	return 0;
}

static int jarr(json_t *o, const char *key, uint32_t ndim, int64_t min, int64_t max,
		int64_t *out, size_t i, char *err, size_t errlen)
{
	json_t *a = json_object_get(o, key);
	uint32_t d;

	if (!json_is_array(a) || json_array_size(a) != ndim)
		return dte_layout_err(err, errlen, "pieces[%zu]: \"%s\" must be an array of %u integers", i, key, ndim);
	for (d = 0; d < ndim; d++) {
		json_t *v = json_array_get(a, d);
		if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
			return dte_layout_err(err, errlen, "pieces[%zu]: \"%s\"[%u] must be an integer in [%lld, %lld]",
					      i, key, d, (long long)min, (long long)max);
		out[d] = json_integer_value(v);
	}
	return 0;
}

static int32_t json_tensor(const struct dte_spec *spec, const char *name, int32_t *last)
{
	int32_t id;

	/* Files list pieces mostly in spec order: try the neighbours first. */
	for (id = *last; id <= *last + 1 && id >= 0 && (uint32_t)id < spec->n; id++)
		if (!strcmp(spec->t[id].name, name))
			return *last = id;
	id = dte_spec_find(spec, name);
	if (id >= 0)
		*last = id;
	return id;
}

static int json_piece(struct dte_layout *l, const struct dte_spec *spec, json_t *o, size_t i,
		      int32_t *last, char *err, size_t errlen)
{
	const struct dte_spec_tensor *t;
	struct dte_piece p;
	json_t *name = json_object_get(o, "tensor");
	int64_t v;
	int32_t id;

	if (!json_is_object(o))
		return dte_layout_err(err, errlen, "pieces[%zu]: not an object", i);
	if (!json_is_string(name))
		return dte_layout_err(err, errlen, "pieces[%zu]: \"tensor\" must be a tensor name", i);
	id = json_tensor(spec, json_string_value(name), last);
	if (id < 0)
		return dte_layout_err(err, errlen, "pieces[%zu]: tensor \"%s\" is not in the model spec",
				      i, json_string_value(name));
	t = &spec->t[id];
	memset(&p, 0, sizeof(p));
	p.tensor = (uint32_t)id;
	p.ndim = t->ndim;
	if (jarr(o, "lo", t->ndim, 0, JSON_MAX_COORD, p.lo, i, err, errlen) ||
	    jarr(o, "hi", t->ndim, 0, JSON_MAX_COORD, p.hi, i, err, errlen) ||
	    jarr(o, "strides", t->ndim, -JSON_MAX_COORD, JSON_MAX_COORD, p.stride, i, err, errlen) ||
	    jint(o, "offset", 0, 0, JSON_MAX_COORD, &p.offset, "pieces", i, err, errlen))
		return -1;
	if (jint(o, "rank", INT64_MIN, 0, JSON_MAX_RANK - 1, &v, "pieces", i, err, errlen))
		return -1;
	p.rank = (uint32_t)v;
	if (jint(o, "buffer", INT64_MIN, 0, UINT32_MAX, &v, "pieces", i, err, errlen))
		return -1;
	p.buf = (uint32_t)v;
	if (l->role == DTE_LAYOUT_SOURCE) {
		if (jint(o, "exp_avg", INT64_MIN, 0, UINT32_MAX, &v, "pieces", i, err, errlen))
			return -1;
		p.buf_m = (uint32_t)v;
		if (jint(o, "exp_avg_sq", INT64_MIN, 0, UINT32_MAX, &v, "pieces", i, err, errlen))
			return -1;
		p.buf_v = (uint32_t)v;
		if (jint(o, "group", t->group, 0, 255, &v, "pieces", i, err, errlen))
			return -1;
		p.group = (uint32_t)v;
	}
	if (dte_layout_add_piece(l, &p))
		return dte_layout_err(err, errlen, "out of memory");
	return 0;
}

/* Without a "buffers" list: each (rank, id) is as long as its pieces reach
 * (within the cap; the bounds themselves are checked by validation). */
static int json_infer_buffers(struct dte_layout *l, char *err, size_t errlen)
{
	size_t i, k;

	for (i = 0; i < l->npieces; i++) {
		const struct dte_piece *p = &l->pieces[i];
		uint32_t ids[3] = { p->buf, p->buf_m, p->buf_v };
		__int128 max = p->offset;
		uint32_t d, nb = l->role == DTE_LAYOUT_SOURCE ? 3 : 1;

		for (d = 0; d < p->ndim; d++)
			if (p->stride[d] > 0 && p->hi[d] > p->lo[d])
				max += (__int128)(p->hi[d] - p->lo[d] - 1) * p->stride[d];
		if (max >= JSON_MAX_BUF)
			return dte_layout_err(err, errlen, "pieces[%zu]: reaches past %lld elements of its buffer",
					      i, (long long)JSON_MAX_BUF);
		for (k = 0; k < nb; k++) {
			struct dte_layout_buffer *b = NULL;
			size_t j;
			for (j = 0; j < l->nbufs; j++)
				if (l->bufs[j].rank == p->rank && l->bufs[j].id == ids[k])
					b = &l->bufs[j];
			if (!b) {
				if (dte_layout_add_buffer(l, p->rank, ids[k], 0, "buffer %u", ids[k]) < 0)
					return dte_layout_err(err, errlen, "out of memory");
				b = &l->bufs[l->nbufs - 1];
			}
			if ((int64_t)max + 1 > b->length)
				b->length = (int64_t)max + 1;
		}
	}
	return 0;
}

static int json_buffers(struct dte_layout *l, json_t *arr, char *err, size_t errlen)
{
	size_t i;

	if (!json_is_array(arr))
		return dte_layout_err(err, errlen, "\"buffers\" must be an array");
	for (i = 0; i < json_array_size(arr); i++) {
		json_t *o = json_array_get(arr, i), *name;
		int64_t rank, id, len;
		if (!json_is_object(o))
			return dte_layout_err(err, errlen, "buffers[%zu]: not an object", i);
		if (jint(o, "rank", INT64_MIN, 0, JSON_MAX_RANK - 1, &rank, "buffers", i, err, errlen) ||
		    jint(o, "id", INT64_MIN, 0, UINT32_MAX, &id, "buffers", i, err, errlen) ||
		    jint(o, "length", INT64_MIN, 0, JSON_MAX_BUF, &len, "buffers", i, err, errlen))
			return -1;
		name = json_object_get(o, "name");
		if (dte_layout_add_buffer(l, (uint32_t)rank, id, len, "%s",
					  json_is_string(name) ? json_string_value(name) : "") < 0)
			return dte_layout_err(err, errlen, "out of memory");
	}
	return 0;
}

int dte_layout_load_json(struct dte_layout *l, const struct dte_spec *spec,
			 const char *path, char *err, size_t errlen)
{
	json_error_t jerr;
	json_t *root, *pieces, *hash, *bufs;
	int32_t last = 0;
	size_t i;
	int rc = -1;

	snprintf(l->desc, sizeof(l->desc), "json:%s", path);
	root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
	if (!root && json_error_code(&jerr) == json_error_cannot_open_file)
		return dte_layout_err(err, errlen, "%s", jerr.text);
	if (!root)
		return dte_layout_err(err, errlen, "%s: malformed JSON at line %d: %s", path, jerr.line, jerr.text);
	if (!json_is_object(root)) {
		dte_layout_err(err, errlen, "%s: top level is not an object", path);
		goto out;
	}
	hash = json_object_get(root, "spec_hash");
	if (hash) {
		char want[32];
		snprintf(want, sizeof(want), "%016" PRIx64, spec->hash);
		if (!json_is_string(hash) || strcmp(json_string_value(hash), want)) {
			dte_layout_err(err, errlen, "%s: spec_hash %s does not match the model spec hash %s",
				       path, json_is_string(hash) ? json_string_value(hash) : "(not a string)", want);
			goto out;
		}
	}
	pieces = json_object_get(root, "pieces");
	if (!json_is_array(pieces) || json_array_size(pieces) == 0 ||
	    json_array_size(pieces) > JSON_MAX_PIECES) {
		dte_layout_err(err, errlen, "%s: \"pieces\" must be a non-empty array of at most %d pieces", path, JSON_MAX_PIECES);
		goto out;
	}
	for (i = 0; i < json_array_size(pieces); i++)
		if (json_piece(l, spec, json_array_get(pieces, i), i, &last, err, errlen))
			goto out;
	bufs = json_object_get(root, "buffers");
	if (bufs ? json_buffers(l, bufs, err, errlen) : json_infer_buffers(l, err, errlen))
		goto out;
	dte_layout_sort_buffers(l);
	rc = 0;
out:
	json_decref(root);
	return rc;
}

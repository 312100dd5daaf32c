/* Chunk codec for storage: canonical sparse/dense segments, the gap coding
 * of gpu/codec.h with BF16 byte planes, before zstd (dtc_chunk_pack). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/storage/storage_int.h"
#include "gpu/codec.h"
#include "gpu/compute.h"


int dts_from_dtc(int rc)
{
	switch (rc) {
	case DTC_OK:        return DTS_OK;
	case DTC_ENOMEM:    return DTS_ENOMEM;
	case DTC_ECHECKSUM: return DTS_ECHECKSUM;
	case DTC_ERANGE:    return DTS_ERANGE;
	case DTC_EINVAL:    return DTS_EINVAL;
	default:            return DTS_ECORRUPT;
	}
}

void dts_buf_fini(struct dts_buf *b)
{
	free(b->p);
	b->p = NULL;
	b->len = b->cap = 0;
}

int dts_buf_reserve(struct dts_buf *b, size_t more)
{
	size_t cap = b->cap ? b->cap : 4096;
	uint8_t *p;

	if (more > SIZE_MAX / 2 - b->len)
		return DTS_ENOMEM;
	if (b->len + more <= b->cap)
		return DTS_OK;
	while (cap < b->len + more)
		cap *= 2;
	if (!(p = realloc(b->p, cap)))
		return DTS_ENOMEM;
	b->p = p;
	b->cap = cap;
	return DTS_OK;
}

void dts_chunk_fini(struct dts_chunk *c)
{
	dts_buf_fini(&c->meta);
	dts_buf_fini(&c->hi);
	dts_buf_fini(&c->lo);
}

void dts_chunk_start(struct dts_chunk *c, int kind)
{
	c->kind = kind;
	c->meta.len = c->hi.len = c->lo.len = 0;
}

size_t dts_chunk_size(const struct dts_chunk *c)
{
	return DTS_CHUNK_HDR + 2 * DTC_VARINT_MAX + c->meta.len + c->hi.len + c->lo.len;
}

int dts_chunk_empty(const struct dts_chunk *c)
{
	return !c->meta.len;
}

static int planes_put(struct dts_chunk *c, const uint8_t *le, uint64_t n)
{
	int rc;

	if ((rc = dts_buf_reserve(&c->hi, n)) || (rc = dts_buf_reserve(&c->lo, n)))
		return rc;
	for (uint64_t i = 0; i < n; i++) {
		c->hi.p[c->hi.len + i] = le[2 * i + 1];
		c->lo.p[c->lo.len + i] = le[2 * i];
	}
	c->hi.len += n;
	c->lo.len += n;
	return DTS_OK;
}

static int meta_put(struct dts_chunk *c, const uint64_t *v, int nv, const uint8_t *bytes,
		    size_t len)
{
	int rc;

	if ((rc = dts_buf_reserve(&c->meta, (size_t)nv * DTC_VARINT_MAX + len)))
		return rc;
	for (int i = 0; i < nv; i++)
		c->meta.len += dtc_varint_put(c->meta.p + c->meta.len, v[i]);
	if (len)
		memcpy(c->meta.p + c->meta.len, bytes, len);
	c->meta.len += len;
	return DTS_OK;
}

int dts_chunk_put_sparse(struct dts_chunk *c, struct dts_buf *scratch, uint32_t tensor,
			 uint64_t numel, const uint64_t *pos, const uint16_t *val,
			 uint64_t count, size_t room, uint64_t *taken)
{
	uint64_t k, hdr[2];
	size_t enc = 0;
	int rc = DTC_ENOSPC;

	*taken = 0;
	if (c->kind != DTS_KIND_SPARSE)
		return DTS_EINVAL;
	if (room <= DTS_SEG_HDR_MAX + DTC_VARINT_MAX || !count)
		return DTS_OK;
	room -= DTS_SEG_HDR_MAX;
	/* Every element takes at least 3 bytes; shrink until it fits. */
	k = count < room / 3 ? count : room / 3;
	while (k > 0) {
		size_t cap = dtc_sparse_bound(k) < room ? dtc_sparse_bound(k) : room;

		scratch->len = 0;
		if ((rc = dts_buf_reserve(scratch, cap)) != DTS_OK)
			return rc;
		rc = dtc_sparse_encode(pos, val, k, numel, scratch->p, cap, &enc);
		if (rc != DTC_ENOSPC)
			break;
		k = k > 8 ? k - k / 4 : k - 1;
	}
	if (k == 0)
		return DTS_OK;
	if (rc != DTC_OK)
		return dts_from_dtc(rc);
	/* Gap codes (with their count) to meta, the values to the planes. */
	hdr[0] = tensor;
	hdr[1] = enc - 2 * k;
	if ((rc = meta_put(c, hdr, 2, scratch->p, enc - 2 * k)) ||
	    (rc = planes_put(c, scratch->p + enc - 2 * k, k)))
		return rc;
	*taken = k;
	return DTS_OK;
}

int dts_chunk_put_dense(struct dts_chunk *c, uint32_t tensor, uint64_t start,
			const uint16_t *val, uint64_t count)
{
	uint64_t hdr[3] = { tensor, start, count };
	int rc;

	if (c->kind != DTS_KIND_DENSE || count > (SIZE_MAX - 64) / 2)
		return DTS_EINVAL;
	if ((rc = meta_put(c, hdr, 3, NULL, 0)) || (rc = dts_buf_reserve(&c->hi, count)) ||
	    (rc = dts_buf_reserve(&c->lo, count)))
		return rc;
	for (uint64_t i = 0; i < count; i++) {
		c->hi.p[c->hi.len + i] = (uint8_t)(val[i] >> 8);
		c->lo.p[c->lo.len + i] = (uint8_t)val[i];
	}
	c->hi.len += count;
	c->lo.len += count;
	return DTS_OK;
}

/* The head of the logical raw chunk: header, section lengths, meta. */
static int head_build(const struct dts_chunk *c, struct dts_buf *out)
{
	uint64_t lens[2] = { c->meta.len, c->hi.len };
	int rc;

	out->len = 0;
	if ((rc = dts_buf_reserve(out, DTS_CHUNK_HDR + 2 * DTC_VARINT_MAX + c->meta.len)))
		return rc;
	memcpy(out->p, DTS_CHUNK_MAGIC, 4);
	out->p[4] = DTS_CHUNK_FORMAT;
	out->p[5] = (uint8_t)c->kind;
	out->p[6] = out->p[7] = 0;
	out->len = DTS_CHUNK_HDR;
	for (int i = 0; i < 2; i++)
		out->len += dtc_varint_put(out->p + out->len, lens[i]);
	if (c->meta.len)
		memcpy(out->p + out->len, c->meta.p, c->meta.len);
	out->len += c->meta.len;
	return DTS_OK;
}

int dts_chunk_serialize(const struct dts_chunk *c, struct dts_buf *raw)
{
	int rc;

	if ((rc = head_build(c, raw)) || (rc = dts_buf_reserve(raw, c->hi.len + c->lo.len + 1)))
		return rc;
	if (c->hi.len) {
		memcpy(raw->p + raw->len, c->hi.p, c->hi.len);
		memcpy(raw->p + raw->len + c->hi.len, c->lo.p, c->lo.len);
	}
	raw->len += c->hi.len + c->lo.len;
	return DTS_OK;
}

/* Three zstd frames, each with its own literal statistics: gap codes,
 * high bytes (sign, exponent: few distinct) and low bytes (mantissa:
 * near random).  One frame over all three costs ~0.4 B per element. */
int dts_chunk_pack(const struct dts_chunk *c, int zlevel, struct dts_buf *head,
		   struct dts_buf *file, uint64_t *rawlen)
{
	const struct dts_buf *sec[3] = { head, &c->hi, &c->lo };
	int rc;

	if ((rc = head_build(c, head)))
		return rc;
	file->len = 0;
	*rawlen = 0;
	for (int i = 0; i < 3; i++) {
		size_t bound = dtc_chunk_bound(sec[i]->len), n;

		if ((rc = dts_buf_reserve(file, bound)))
			return rc;
		rc = dtc_chunk_pack(sec[i]->len ? sec[i]->p : file->p, sec[i]->len, zlevel,
				    file->p + file->len, bound, &n);
		if (rc != DTC_OK)
			return dts_from_dtc(rc);
		file->len += n;
		*rawlen += sec[i]->len;
	}
	return DTS_OK;
}

static uint64_t rd64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

int dts_chunk_unpack(const uint8_t *file, size_t len, uint64_t rawlen, struct dts_buf *raw,
		     char *err, size_t errlen)
{
	size_t off = 0;
	int rc;

	raw->len = 0;
	if (rawlen > SIZE_MAX / 2 || (rc = dts_buf_reserve(raw, rawlen ? rawlen : 1)))
		return rawlen > SIZE_MAX / 2 ? DTS_ECORRUPT : rc;
	for (int i = 0; i < 3; i++) {
		uint64_t stored, r;
		size_t n;

		if (len - off < DTC_CHUNK_HDR) {
			DTS_ERR(err, errlen, "frame %d truncated", i);
			return DTS_ECORRUPT;
		}
		r = rd64(file + off + 8);
		stored = rd64(file + off + 16);
		if (stored > len - off - DTC_CHUNK_HDR || r > rawlen - raw->len) {
			DTS_ERR(err, errlen, "frame %d: sizes beyond the chunk", i);
			return DTS_ECORRUPT;
		}
		rc = dtc_chunk_unpack(file + off, DTC_CHUNK_HDR + (size_t)stored, raw->p + raw->len,
				      rawlen - raw->len, &n);
		if (rc != DTC_OK) {
			DTS_ERR(err, errlen, "frame %d: %s", i, dtc_strerror(rc));
			return rc == DTC_ECHECKSUM ? DTS_ECHECKSUM : DTS_ECORRUPT;
		}
		raw->len += n;
		off += DTC_CHUNK_HDR + (size_t)stored;
	}
	if (off != len || raw->len != rawlen) {
		DTS_ERR(err, errlen, "chunk holds %zu raw bytes in %zu, manifest says %llu in %zu",
			raw->len, off, (unsigned long long)rawlen, len);
		return DTS_ECORRUPT;
	}
	return DTS_OK;
}

struct planes {
	const uint8_t *hi, *lo;
	uint64_t       n, used;
};

static int decode_sparse(const uint8_t **pp, const uint8_t *end, uint32_t t,
			 struct dts_sink *s, struct planes *pl, uint8_t *scratch,
			 char *err, size_t errlen)
{
	struct dts_tensor_data *td = &s->t[t];
	uint64_t glen, c, got, room = s->cap[t] - s->fill[t];
	const uint8_t *g, *q;
	int rc;

	if (dtc_varint_get(pp, end, &glen) != DTC_OK || !glen || glen > (uint64_t)(end - *pp)) {
		DTS_ERR(err, errlen, "tensor %u: truncated sparse segment", t);
		return DTS_ECORRUPT;
	}
	g = *pp;
	*pp += glen;
	q = g;
	if (dtc_varint_get(&q, g + glen, &c) != DTC_OK || c > (uint64_t)(g + glen - q) ||
	    c > pl->n - pl->used) {
		DTS_ERR(err, errlen, "tensor %u: sparse segment count does not fit", t);
		return DTS_ECORRUPT;
	}
	if (c > room) {
		DTS_ERR(err, errlen, "tensor %u: more changed elements than the manifest's %llu",
			t, (unsigned long long)s->cap[t]);
		return DTS_ECORRUPT;
	}
	/* Rebuild gpu/codec.h's layout: count and gap codes, then values. */
	memcpy(scratch, g, glen);
	for (uint64_t i = 0; i < c; i++) {
		scratch[glen + 2 * i] = pl->lo[pl->used + i];
		scratch[glen + 2 * i + 1] = pl->hi[pl->used + i];
	}
	/* A tensor the manifest lists as unchanged has no arrays (NULL), yet
	 * may still get an empty segment: no pointer arithmetic on NULL. */
	rc = dtc_sparse_decode(scratch, glen + 2 * c, s->numel[t],
			       td->pos ? td->pos + s->fill[t] : NULL,
			       td->val ? td->val + s->fill[t] : NULL, room, &got);
	if (rc != DTC_OK) {
		DTS_ERR(err, errlen, "tensor %u: sparse segment: %s", t, dtc_strerror(rc));
		return rc == DTC_ERANGE ? DTS_ERANGE : DTS_ECORRUPT;
	}
	/* Segments of one tensor continue where the previous one stopped. */
	if (got && s->fill[t] && td->pos[s->fill[t]] <= td->pos[s->fill[t] - 1]) {
		DTS_ERR(err, errlen, "tensor %u: positions not increasing across segments", t);
		return DTS_ERANGE;
	}
	s->fill[t] += got;
	pl->used += c;
	return DTS_OK;
}

static int decode_dense(const uint8_t **pp, const uint8_t *end, uint32_t t,
			struct dts_sink *s, struct planes *pl, char *err, size_t errlen)
{
	uint64_t start, n;

	if (dtc_varint_get(pp, end, &start) != DTC_OK || dtc_varint_get(pp, end, &n) != DTC_OK ||
	    n > pl->n - pl->used) {
		DTS_ERR(err, errlen, "tensor %u: malformed dense segment", t);
		return DTS_ECORRUPT;
	}
	if (start != s->fill[t] || n > s->cap[t] - start) {
		DTS_ERR(err, errlen, "tensor %u: dense segment [%llu, +%llu) out of order or range",
			t, (unsigned long long)start, (unsigned long long)n);
		return DTS_ERANGE;
	}
	for (uint64_t i = 0; i < n; i++)
		s->t[t].val[start + i] = (uint16_t)(pl->hi[pl->used + i] << 8 | pl->lo[pl->used + i]);
	s->fill[t] += n;
	pl->used += n;
	return DTS_OK;
}

int dts_chunk_decode(const uint8_t *raw, size_t len, int kind, struct dts_sink *s,
		     char *err, size_t errlen)
{
	const uint8_t *p = raw + DTS_CHUNK_HDR, *end, *rend = raw + len;
	uint64_t mlen, plen;
	struct planes pl;
	uint8_t *scratch = NULL;
	int rc = DTS_OK;

	if (len < DTS_CHUNK_HDR || memcmp(raw, DTS_CHUNK_MAGIC, 4) ||
	    raw[4] != DTS_CHUNK_FORMAT || raw[5] != kind || raw[6] || raw[7]) {
		DTS_ERR(err, errlen, "not a %s chunk of format %d",
			kind == DTS_KIND_DENSE ? "dense" : "sparse", DTS_CHUNK_FORMAT);
		return DTS_ECORRUPT;
	}
	if (dtc_varint_get(&p, rend, &mlen) != DTC_OK || dtc_varint_get(&p, rend, &plen) != DTC_OK ||
	    mlen > (uint64_t)(rend - p) || plen > ((uint64_t)(rend - p) - mlen) / 2 ||
	    mlen + 2 * plen != (uint64_t)(rend - p)) {
		DTS_ERR(err, errlen, "chunk sections do not add up to its %zu bytes", len);
		return DTS_ECORRUPT;
	}
	end = p + mlen;
	pl.hi = end;
	pl.lo = end + plen;
	pl.n = plen;
	pl.used = 0;
	if (kind == DTS_KIND_SPARSE && !(scratch = malloc(len)))
		return DTS_ENOMEM;
	while (p < end) {
		uint64_t t;

		if (dtc_varint_get(&p, end, &t) != DTC_OK) {
			DTS_ERR(err, errlen, "truncated segment header");
			rc = DTS_ECORRUPT;
			goto out;
		}
		if (t >= s->ntensors) {
			DTS_ERR(err, errlen, "segment for tensor %llu of %u",
				(unsigned long long)t, s->ntensors);
			rc = DTS_ERANGE;
			goto out;
		}
		if (kind == DTS_KIND_SPARSE)
			rc = decode_sparse(&p, end, (uint32_t)t, s, &pl, scratch, err, errlen);
		else
			rc = decode_dense(&p, end, (uint32_t)t, s, &pl, err, errlen);
		if (rc != DTS_OK)
			goto out;
	}
	if (pl.used != pl.n) {
		DTS_ERR(err, errlen, "%llu values left over after the last segment",
			(unsigned long long)(pl.n - pl.used));
		rc = DTS_ECORRUPT;
	}
out:
	free(scratch);
	return rc;
}

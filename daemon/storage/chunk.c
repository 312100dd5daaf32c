/* Chunk codec for storage: canonical sparse/dense segments, the gap coding
 * of gpu/codec.h with BF16 byte planes, before zstd (dtc_chunk_pack). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/storage/storage_int.h"
#include "gpu/codec.h"
#include "gpu/compute.h"

#define VARINT_MAX 10

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

static size_t varint_put(uint8_t *p, uint64_t v)
{
	size_t n = 0;

	while (v >= 0x80) {
		p[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	p[n++] = (uint8_t)v;
	return n;
}

static int varint_get(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	uint64_t r = 0;

	for (unsigned i = 0, shift = 0; i < VARINT_MAX; i++, shift += 7) {
		uint8_t b;

		if (*p >= end)
			return DTS_ECORRUPT;
		b = *(*p)++;
		if (i == VARINT_MAX - 1 && b > 1)
			return DTS_ECORRUPT;
		r |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*v = r;
			return DTS_OK;
		}
	}
	return DTS_ECORRUPT;
}

int dts_chunk_start(struct dts_buf *b, int kind)
{
	int rc;

	b->len = 0;
	if ((rc = dts_buf_reserve(b, DTS_CHUNK_HDR)) != DTS_OK)
		return rc;
	memcpy(b->p, DTS_CHUNK_MAGIC, 4);
	b->p[4] = DTS_FORMAT;
	b->p[5] = (uint8_t)kind;
	b->p[6] = b->p[7] = 0;
	b->len = DTS_CHUNK_HDR;
	return DTS_OK;
}

/* Split n interleaved little-endian BF16 values into planes (hi, then lo). */
static void planes_split(uint8_t *dst, const uint8_t *src, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++) {
		dst[i] = src[2 * i + 1];
		dst[n + i] = src[2 * i];
	}
}

static void planes_join(uint8_t *dst, const uint8_t *src, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++) {
		dst[2 * i + 1] = src[i];
		dst[2 * i] = src[n + i];
	}
}

static void seg_header(struct dts_buf *b, uint32_t tensor, size_t len)
{
	b->len += varint_put(b->p + b->len, tensor);
	b->len += varint_put(b->p + b->len, len);
}

int dts_chunk_put_sparse(struct dts_buf *b, struct dts_buf *scratch, uint32_t tensor,
			 uint64_t numel, const uint64_t *pos, const uint16_t *val,
			 uint64_t count, size_t room, uint64_t *taken)
{
	uint64_t k;
	size_t enc = 0;
	int rc = DTC_ENOSPC;

	*taken = 0;
	if (room <= DTS_SEG_HDR_MAX + VARINT_MAX || !count)
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
	if ((rc = dts_buf_reserve(b, enc + DTS_SEG_HDR_MAX)) != DTS_OK)
		return rc;
	seg_header(b, tensor, enc);
	memcpy(b->p + b->len, scratch->p, enc - 2 * k);
	planes_split(b->p + b->len + enc - 2 * k, scratch->p + enc - 2 * k, k);
	b->len += enc;
	*taken = k;
	return DTS_OK;
}

int dts_chunk_put_dense(struct dts_buf *b, uint32_t tensor, uint64_t start,
			const uint16_t *val, uint64_t count)
{
	uint8_t tmp[VARINT_MAX];
	size_t hn = varint_put(tmp, start), len;
	uint8_t *o;
	int rc;

	if (count > (SIZE_MAX - 64) / 2)
		return DTS_EINVAL;
	len = hn + 2 * (size_t)count;
	if ((rc = dts_buf_reserve(b, len + DTS_SEG_HDR_MAX)) != DTS_OK)
		return rc;
	seg_header(b, tensor, len);
	memcpy(b->p + b->len, tmp, hn);
	o = b->p + b->len + hn;
	for (uint64_t i = 0; i < count; i++) {
		o[i] = (uint8_t)(val[i] >> 8);
		o[count + i] = (uint8_t)val[i];
	}
	b->len += len;
	return DTS_OK;
}

static int decode_sparse(const uint8_t *p, size_t len, uint32_t t, struct dts_sink *s,
			 uint8_t *scratch, char *err, size_t errlen)
{
	struct dts_tensor_data *td = &s->t[t];
	uint64_t c, got, room = s->cap[t] - s->fill[t];
	int rc;

	if ((rc = dtc_sparse_count(p, len, s->numel[t], &c)) != DTC_OK) {
		DTS_ERR(err, errlen, "tensor %u: bad sparse segment header (%s)", t,
			dtc_strerror(rc));
		return dts_from_dtc(rc) == DTS_ERANGE ? DTS_ERANGE : DTS_ECORRUPT;
	}
	if (c > room) {
		DTS_ERR(err, errlen, "tensor %u: more changed elements than the manifest's %llu",
			t, (unsigned long long)s->cap[t]);
		return DTS_ECORRUPT;
	}
	/* dtc_sparse_count guarantees len >= 3c, so the planes are inside. */
	memcpy(scratch, p, len - 2 * c);
	planes_join(scratch + len - 2 * c, p + len - 2 * c, c);
	/* A tensor the manifest lists as unchanged has no arrays (NULL), yet
	 * may still get an empty segment: no pointer arithmetic on NULL. */
	rc = dtc_sparse_decode(scratch, len, s->numel[t], td->pos ? td->pos + s->fill[t] : NULL,
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
	return DTS_OK;
}

static int decode_dense(const uint8_t *p, size_t len, uint32_t t, struct dts_sink *s,
			char *err, size_t errlen)
{
	const uint8_t *q = p, *end = p + len;
	uint64_t start, n;

	if (varint_get(&q, end, &start) != DTS_OK || (size_t)(end - q) % 2) {
		DTS_ERR(err, errlen, "tensor %u: malformed dense segment", t);
		return DTS_ECORRUPT;
	}
	n = (uint64_t)(end - q) / 2;
	if (start != s->fill[t] || n > s->cap[t] - start) {
		DTS_ERR(err, errlen, "tensor %u: dense segment [%llu, +%llu) out of order or range",
			t, (unsigned long long)start, (unsigned long long)n);
		return DTS_ERANGE;
	}
	for (uint64_t i = 0; i < n; i++)
		s->t[t].val[start + i] = (uint16_t)(q[i] << 8 | q[n + i]);
	s->fill[t] += n;
	return DTS_OK;
}

int dts_chunk_decode(const uint8_t *raw, size_t len, int kind, struct dts_sink *s,
		     char *err, size_t errlen)
{
	const uint8_t *p = raw + DTS_CHUNK_HDR, *end = raw + len;
	uint8_t *scratch = NULL;
	int rc = DTS_OK;

	if (len < DTS_CHUNK_HDR || memcmp(raw, DTS_CHUNK_MAGIC, 4) || raw[4] != DTS_FORMAT ||
	    raw[5] != kind || raw[6] || raw[7]) {
		DTS_ERR(err, errlen, "not a %s chunk of format %d",
			kind == DTS_KIND_DENSE ? "dense" : "sparse", DTS_FORMAT);
		return DTS_ECORRUPT;
	}
	if (kind == DTS_KIND_SPARSE && !(scratch = malloc(len ? len : 1)))
		return DTS_ENOMEM;
	while (p < end) {
		uint64_t t, slen;

		if (varint_get(&p, end, &t) != DTS_OK || varint_get(&p, end, &slen) != DTS_OK ||
		    slen > (uint64_t)(end - p)) {
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
			rc = decode_sparse(p, (size_t)slen, (uint32_t)t, s, scratch, err, errlen);
		else
			rc = decode_dense(p, (size_t)slen, (uint32_t)t, s, err, errlen);
		if (rc != DTS_OK)
			goto out;
		p += slen;
	}
out:
	free(scratch);
	return rc;
}

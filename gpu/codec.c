/* Sparse/dense payload codecs and chunk framing (zstd + xxh3). */
#include <string.h>
#include <zstd.h>
#include "gpu/codec.h"
#include "gpu/compute.h"
#include "gpu/xxh.h"

#define GAP1_MAX	DTC_GAP1_MAX
#define GAP2_MAX	DTC_GAP2_MAX
#define GAP_ESCAPE	DTC_GAP_ESCAPE
#define VARINT_MAX	DTC_VARINT_MAX

size_t dtc_varint_put(uint8_t *p, uint64_t v)
{
	size_t n = 0;

	while (v >= 0x80) {
		p[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	p[n++] = (uint8_t)v;
	return n;
}

int dtc_varint_get(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	uint64_t r = 0;

	for (unsigned shift = 0, i = 0; i < VARINT_MAX; i++, shift += 7) {
		uint8_t b;

		if (*p >= end)
			return DTC_ETRUNC;
		b = *(*p)++;
		if (i == VARINT_MAX - 1 && b > 1)
			return DTC_ECORRUPT;
		r |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*v = r;
			return DTC_OK;
		}
	}
	return DTC_ECORRUPT;
}

size_t dtc_gap_put(uint8_t *p, uint64_t gap)
{
	if (gap < GAP1_MAX) {
		p[0] = (uint8_t)gap;
		return 1;
	}
	if (gap < GAP2_MAX) {
		gap -= GAP1_MAX;
		p[0] = (uint8_t)(0x80 | (gap >> 8));
		p[1] = (uint8_t)gap;
		return 2;
	}
	p[0] = GAP_ESCAPE;
	return 1 + dtc_varint_put(p + 1, gap);
}

static void put_u64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

size_t dtc_sparse_bound(uint64_t count)
{
	/* count varint + worst gap (escape + 10) + value, per element */
	return VARINT_MAX + (size_t)count * (1 + VARINT_MAX + 2);
}

int dtc_sparse_encode(const uint64_t *pos, const uint16_t *val, uint64_t count,
		      uint64_t box_size, uint8_t *out, size_t cap, size_t *outlen)
{
	uint8_t tmp[1 + VARINT_MAX];
	uint64_t next = 0;	/* smallest position allowed next: prev + 1 */
	size_t o = 0, n;

	if ((count && (!pos || !val)) || !out || !outlen || count > box_size)
		return DTC_EINVAL;
	n = dtc_varint_put(tmp, count);
	if (n > cap)
		return DTC_ENOSPC;
	memcpy(out, tmp, n);
	o = n;
	for (uint64_t i = 0; i < count; i++) {
		uint64_t gap;

		if (pos[i] < next || pos[i] >= box_size)
			return DTC_EINVAL;	/* unsorted, duplicate or outside */
		gap = pos[i] - next;
		n = dtc_gap_put(tmp, gap);
		if (cap - o < n)
			return DTC_ENOSPC;
		memcpy(out + o, tmp, n);
		o += n;
		next = pos[i] + 1;
	}
	if ((cap - o) / 2 < count)
		return DTC_ENOSPC;
	for (uint64_t i = 0; i < count; i++) {
		out[o++] = (uint8_t)val[i];
		out[o++] = (uint8_t)(val[i] >> 8);
	}
	*outlen = o;
	return DTC_OK;
}

int dtc_sparse_count(const uint8_t *in, size_t len, uint64_t box_size, uint64_t *count)
{
	const uint8_t *p = in, *end = in + len;
	uint64_t c;
	int rc;

	if (!in || !count)
		return DTC_EINVAL;
	if ((rc = dtc_varint_get(&p, end, &c)) != DTC_OK)
		return rc;
	if (c > box_size)
		return DTC_ECORRUPT;
	/* Each element takes at least 3 bytes (gap code + value). */
	if (c > (uint64_t)(end - p) / 3)
		return DTC_ETRUNC;
	*count = c;
	return DTC_OK;
}

int dtc_sparse_decode(const uint8_t *in, size_t len, uint64_t box_size,
		      uint64_t *pos, uint16_t *val, uint64_t cap, uint64_t *count)
{
	const uint8_t *p = in, *end = in + len;
	uint64_t c, next = 0;
	int rc;

	if ((rc = dtc_sparse_count(in, len, box_size, &c)) != DTC_OK)
		return rc;
	if (c > cap || (c && (!pos || !val)))
		return c > cap ? DTC_ENOSPC : DTC_EINVAL;
	(void)dtc_varint_get(&p, end, &c);	/* skip the count, checked above */
	for (uint64_t i = 0; i < c; i++) {
		uint64_t gap;

		if ((rc = dtc_gap_get(&p, end, &gap)) != DTC_OK)
			return rc;
		if (next >= box_size || gap >= box_size - next)
			return DTC_ERANGE;
		pos[i] = next + gap;
		next = pos[i] + 1;
	}
	if ((uint64_t)(end - p) < 2 * c)
		return DTC_ETRUNC;
	if ((uint64_t)(end - p) > 2 * c)
		return DTC_ECORRUPT;
	for (uint64_t i = 0; i < c; i++, p += 2)
		val[i] = (uint16_t)(p[0] | (p[1] << 8));
	*count = c;
	return DTC_OK;
}

int dtc_dense_encode(const uint16_t *vals, uint64_t box_size, uint8_t *out, size_t cap,
		     size_t *outlen)
{
	if ((box_size && !vals) || !out || !outlen)
		return DTC_EINVAL;
	if (box_size > cap / 2)
		return DTC_ENOSPC;
	for (uint64_t i = 0; i < box_size; i++) {
		out[2 * i] = (uint8_t)vals[i];
		out[2 * i + 1] = (uint8_t)(vals[i] >> 8);
	}
	*outlen = (size_t)box_size * 2;
	return DTC_OK;
}

int dtc_dense_decode(const uint8_t *in, size_t len, uint64_t box_size, uint16_t *vals)
{
	if (!in || (box_size && !vals))
		return DTC_EINVAL;
	if (len / 2 < box_size)
		return DTC_ETRUNC;
	if (len != box_size * 2)
		return DTC_ECORRUPT;
	for (uint64_t i = 0; i < box_size; i++)
		vals[i] = (uint16_t)(in[2 * i] | (in[2 * i + 1] << 8));
	return DTC_OK;
}

size_t dtc_chunk_bound(size_t len)
{
	size_t z = ZSTD_compressBound(len);

	return DTC_CHUNK_HDR + (z > len ? z : len);
}

static void chunk_header(uint8_t *out, int codec, uint64_t raw, uint64_t stored, uint64_t h)
{
	memcpy(out, "DTC1", 4);
	out[4] = (uint8_t)codec;
	out[5] = out[6] = out[7] = 0;
	put_u64(out + 8, raw);
	put_u64(out + 16, stored);
	put_u64(out + 24, h);
}

int dtc_chunk_pack(const void *in, size_t len, int zlevel, uint8_t *out, size_t cap,
		   size_t *outlen)
{
	uint64_t h;

	if ((len && !in) || !out || !outlen || zlevel < 0 || zlevel > 3)
		return DTC_EINVAL;
	if (cap < DTC_CHUNK_HDR)
		return DTC_ENOSPC;
	h = XXH3_64bits(in, len);
	if (zlevel > 0 && len > 0) {
		size_t z = ZSTD_compress(out + DTC_CHUNK_HDR, cap - DTC_CHUNK_HDR, in, len, zlevel);

		if (!ZSTD_isError(z) && z < len) {
			chunk_header(out, DTC_CODEC_ZSTD, len, z, h);
			*outlen = DTC_CHUNK_HDR + z;
			return DTC_OK;
		}
	}
	if (cap - DTC_CHUNK_HDR < len)
		return DTC_ENOSPC;
	if (len)
		memcpy(out + DTC_CHUNK_HDR, in, len);
	chunk_header(out, DTC_CODEC_RAW, len, len, h);
	*outlen = DTC_CHUNK_HDR + len;
	return DTC_OK;
}

int dtc_chunk_seal_raw(uint8_t *buf, size_t len)
{
	if (!buf)
		return DTC_EINVAL;
	chunk_header(buf, DTC_CODEC_RAW, len, len, XXH3_64bits(buf + DTC_CHUNK_HDR, len));
	return DTC_OK;
}

int dtc_chunk_seal_raw_hashed(uint8_t *buf, size_t len, uint64_t xxh3)
{
	if (!buf)
		return DTC_EINVAL;
	chunk_header(buf, DTC_CODEC_RAW, len, len, xxh3);
	return DTC_OK;
}

int dtc_chunk_view(const uint8_t *in, size_t len, const uint8_t **raw, size_t *raw_len)
{
	uint64_t n;
	int codec, rc;

	if (!raw || !raw_len)
		return DTC_EINVAL;
	if ((rc = dtc_chunk_info(in, len, &n, &codec)) != DTC_OK)
		return rc;
	*raw = NULL;
	*raw_len = (size_t)n;
	if (codec != DTC_CODEC_RAW)
		return DTC_OK;
	if (XXH3_64bits(in + DTC_CHUNK_HDR, (size_t)n) != get_u64(in + 24))
		return DTC_ECHECKSUM;
	*raw = in + DTC_CHUNK_HDR;
	return DTC_OK;
}

int dtc_chunk_info(const uint8_t *in, size_t len, uint64_t *raw_len, int *codec)
{
	uint64_t raw, stored;

	if (!in || !raw_len || !codec)
		return DTC_EINVAL;
	if (len < DTC_CHUNK_HDR)
		return DTC_ETRUNC;
	if (memcmp(in, "DTC1", 4) != 0 || in[5] || in[6] || in[7] ||
	    (in[4] != DTC_CODEC_RAW && in[4] != DTC_CODEC_ZSTD))
		return DTC_ECORRUPT;
	raw = get_u64(in + 8);
	stored = get_u64(in + 16);
	if (stored > len - DTC_CHUNK_HDR)
		return DTC_ETRUNC;
	if (stored < len - DTC_CHUNK_HDR || (in[4] == DTC_CODEC_RAW && raw != stored))
		return DTC_ECORRUPT;
	*raw_len = raw;
	*codec = in[4];
	return DTC_OK;
}

uint64_t dtc_chunk_xxh3(const uint8_t *in)
{
	return get_u64(in + 24);
}

int dtc_chunk_unpack(const uint8_t *in, size_t len, uint8_t *out, size_t cap,
		     size_t *outlen)
{
	uint64_t raw;
	int codec, rc;

	if ((rc = dtc_chunk_info(in, len, &raw, &codec)) != DTC_OK)
		return rc;
	if (!out || !outlen)
		return DTC_EINVAL;
	if (raw > cap)
		return DTC_ENOSPC;
	if (codec == DTC_CODEC_ZSTD) {
		size_t n = ZSTD_decompress(out, (size_t)raw, in + DTC_CHUNK_HDR, len - DTC_CHUNK_HDR);

		if (ZSTD_isError(n) || n != raw)
			return DTC_ECORRUPT;
	} else if (raw) {
		memcpy(out, in + DTC_CHUNK_HDR, (size_t)raw);
	}
	if (XXH3_64bits(out, (size_t)raw) != get_u64(in + 24))
		return DTC_ECHECKSUM;
	*outlen = (size_t)raw;
	return DTC_OK;
}

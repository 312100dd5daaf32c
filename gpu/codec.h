/* gpu/codec.h — payload encodings (DESIGN §5).
 *
 * Sparse payload of one plan entry:
 *     count        LEB128 varint
 *     positions    `count` gap codes, gap = pos - prev - 1 (prev = -1 first):
 *                    0xxxxxxx                 gap 0..127
 *                    10xxxxxx yyyyyyyy        gap 128 + x·256 + y (..16511)
 *                    0xC0 <LEB128 gap>        any larger gap
 *                  (so positions are strictly increasing by construction)
 *     values       `count` BF16, 2 bytes little-endian each
 * Dense payload: box_size BF16 values, little-endian, canonical order.
 *
 * Chunk: a payload (or several) framed for the wire or storage, optionally
 * zstd-compressed, with an xxh3-64 of the raw bytes:
 *     "DTC1" | codec u8 (0 raw, 1 zstd) | 3 zero bytes |
 *     raw_len u64 | stored_len u64 | xxh3 u64 | stored bytes      (LE)
 *
 * Decoders treat input as hostile: every length and position is checked
 * before use, errors are DTC_ETRUNC / DTC_ECORRUPT / DTC_ERANGE, and no
 * byte outside [in, in+len) is read.  On error, what was written to the
 * output arrays is unspecified; counts are written only on success.
 */
#ifndef DTC_CODEC_H
#define DTC_CODEC_H

#include <stddef.h>
#include <stdint.h>
#include "gpu/compute.h"

/* Upper bound of the encoded size of `count` positions and values. */
size_t dtc_sparse_bound(uint64_t count);

/* Encode sorted, unique positions (< box_size) and their values. */
int dtc_sparse_encode(const uint64_t *pos, const uint16_t *val, uint64_t count,
		      uint64_t box_size, uint8_t *out, size_t cap, size_t *outlen);

/* Read and sanity-check the count (it must fit in len and box_size), so a
 * caller can size pos/val before dtc_sparse_decode(). */
int dtc_sparse_count(const uint8_t *in, size_t len, uint64_t box_size, uint64_t *count);

/* Decode and validate the whole payload; `cap` is the room in pos/val. */
int dtc_sparse_decode(const uint8_t *in, size_t len, uint64_t box_size,
		      uint64_t *pos, uint16_t *val, uint64_t cap, uint64_t *count);

/* Dense: values only; the decoder insists on exactly box_size values. */
int dtc_dense_encode(const uint16_t *vals, uint64_t box_size, uint8_t *out, size_t cap,
		     size_t *outlen);
int dtc_dense_decode(const uint8_t *in, size_t len, uint64_t box_size, uint16_t *vals);

#define DTC_CHUNK_HDR	32
#define DTC_CODEC_RAW	0
#define DTC_CODEC_ZSTD	1

/* Bound on the framed size of `len` raw bytes. */
size_t dtc_chunk_bound(size_t len);

/* Frame `len` bytes; zlevel 0 stores raw, 1..3 tries zstd at that level
 * (kept only if smaller). */
int dtc_chunk_pack(const void *in, size_t len, int zlevel, uint8_t *out, size_t cap,
		   size_t *outlen);

/* Frame in place, raw: `buf` holds DTC_CHUNK_HDR free bytes and then the
 * `len` payload bytes; writes the header, so buf becomes a chunk of
 * DTC_CHUNK_HDR + len bytes without a second copy of the payload. */
int dtc_chunk_seal_raw(uint8_t *buf, size_t len);
/* The same with the payload's XXH3_64bits already known (the caller
 * hashed it as it wrote it, in order: daemon/job_capture.c). */
int dtc_chunk_seal_raw_hashed(uint8_t *buf, size_t len, uint64_t xxh3);

/* A raw-stored chunk's payload in place, checksum verified (*raw points
 * into `in`); *raw = NULL when it is compressed (use dtc_chunk_unpack). */
int dtc_chunk_view(const uint8_t *in, size_t len, const uint8_t **raw, size_t *raw_len);

/* Header fields of a chunk (checked for consistency with len). */
int dtc_chunk_info(const uint8_t *in, size_t len, uint64_t *raw_len, int *codec);
/* The xxh3 a chunk's header carries (of its raw bytes); `in` holds at
 * least DTC_CHUNK_HDR bytes.  Unchecked: dtc_chunk_view / _unpack check it. */
uint64_t dtc_chunk_xxh3(const uint8_t *in);

/* Unframe, decompress, verify the checksum; `cap` is the room in out. */
int dtc_chunk_unpack(const uint8_t *in, size_t len, uint8_t *out, size_t cap,
		     size_t *outlen);

/* LEB128 varints, shared with the storage chunk format.  put writes at
 * most DTC_VARINT_MAX bytes and returns how many; get reads from
 * [*p, end), advances *p, and rejects truncation (DTC_ETRUNC) and values
 * over 64 bits (DTC_ECORRUPT). */
#define DTC_VARINT_MAX 10
size_t dtc_varint_put(uint8_t *p, uint64_t v);
int dtc_varint_get(const uint8_t **p, const uint8_t *end, uint64_t *v);

/* One gap code of a sparse payload's positions (the three forms above):
 * put writes at most DTC_GAP_MAX bytes and returns how many; get reads
 * from [*p, end), advances *p only on success, and refuses truncation
 * (DTC_ETRUNC) and the escape form of a gap that has a shorter one
 * (DTC_ECORRUPT), so every gap has exactly one encoding. */
#define DTC_GAP_MAX (1 + DTC_VARINT_MAX)
#define DTC_GAP1_MAX	128u			/* 0xxxxxxx */
#define DTC_GAP2_MAX	(128u + 16384u)		/* 10xxxxxx yyyyyyyy */
#define DTC_GAP_ESCAPE	0xC0u			/* 0xC0 <LEB128> */
size_t dtc_gap_put(uint8_t *p, uint64_t gap);

/* Inline: the apply's position loop runs it once an element. */
static inline int dtc_gap_get(const uint8_t **pp, const uint8_t *end, uint64_t *gap)
{
	const uint8_t *p = *pp;
	uint8_t b;
	int rc;

	if (p >= end)
		return DTC_ETRUNC;
	b = *p++;
	if (b < 0x80) {
		*gap = b;
	} else if (b < DTC_GAP_ESCAPE) {
		if (p >= end)
			return DTC_ETRUNC;
		*gap = DTC_GAP1_MAX + ((uint64_t)(b & 0x3f) << 8) + *p++;
	} else if (b == DTC_GAP_ESCAPE) {
		if ((rc = dtc_varint_get(&p, end, gap)) != DTC_OK)
			return rc;
		if (*gap < DTC_GAP2_MAX)
			return DTC_ECORRUPT;	/* non-canonical: refused */
	} else {
		return DTC_ECORRUPT;
	}
	*pp = p;
	return DTC_OK;
}

#endif

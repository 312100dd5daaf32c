/* tests/fuzz/fuzz_codec.c — payload decoders (gpu/codec.h) and the apply
 * kernels they feed, against a random plan entry.
 *
 * Input: [mode u8][flags u8][ndim u8][extent u8 x6][dst stride x6]
 *        [dst_offset i16][dst_len u16][payload...]
 * mode % 4: 0 sparse payload, 1 dense payload, 2 chunk (then the unpacked
 * bytes as sparse, or dense when mode & 4), 3 round trip.
 *
 * Every decoder output array is malloc()ed to exactly the size the decoder
 * was told, so ASan sees any write past it.  Properties:
 *  - a decoded sparse payload is sorted, unique and inside the box, and
 *    decode(encode(it)) gives it back; the count fits the input;
 *  - dense decode succeeds exactly when the payload is 2·box_size bytes,
 *    and returns the little-endian values;
 *  - scatter/dense apply succeed exactly when the whole box maps inside the
 *    destination (checked here with 128-bit arithmetic, independently of
 *    gpu/box.c), write what an index-by-index reference writes, and leave
 *    the destination untouched on error;
 *  - a chunk unpacks to exactly its raw_len, and repacking at any level
 *    unpacks to the same bytes;
 *  - the one-pass payload check accepts exactly what decode accepts (same
 *    count); the one-pass payload apply succeeds exactly when decode does
 *    and the box maps inside the destination, then writes what scatter
 *    writes and reports the checksum change of the destination as its
 *    delta; on error it leaves the destination untouched;
 *  - round trip: for positions and values taken from the input,
 *    sparse/dense decode(unpack(pack(encode(x)))) == x at zstd levels 0-3.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "gpu/backend.h"
#include "gpu/codec.h"
#include "gpu/compute.h"
#include "tests/fuzz/fuzz_util.h"

#define MAX_BOX (1u << 20)

struct fz_entry {
	struct dte_box_map e;
	uint64_t box;		/* 0: shape the compute layer must refuse */
	uint64_t dst_len;
	int in_range;		/* whole box maps into [0, dst_len) */
};

static const struct dtc_backend *cpu;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	cpu = dtc_backend_cpu();
	if (!cpu)
		abort();
	return 0;
}

static __int128 ref_dst(const struct dte_box_map *e, uint64_t pos)
{
	__int128 idx = e->dst_offset;

	for (int d = (int)e->ndim - 1; d >= 0; d--) {
		uint64_t ext = (uint64_t)e->extent[d];

		idx += (__int128)(pos % ext) * e->dst_stride[d];
		pos /= ext;
	}
	return idx;
}

static void read_entry(struct fz_entry *fe, struct fuzz_in *in, uint8_t flags)
{
	struct dte_box_map *e = &fe->e;
	__int128 lo, hi;
	uint64_t box = 1;
	int bad = 0;

	memset(fe, 0, sizeof(*fe));
	e->ndim = fuzz_u8(in) % (DTE_MAX_DIMS + 2);	/* 7: over the limit */
	for (int d = 0; d < DTE_MAX_DIMS; d++) {
		uint8_t b = fuzz_u8(in);

		e->extent[d] = b % 9;	/* 0 is a bad shape too */
		if (d == 0 && (flags & 0x80))
			e->extent[d] = (int64_t)b << 9 | 1;	/* gaps past 16511 */
		if (flags & 0x40)
			e->extent[d] -= 4;	/* negative extents */
	}
	for (int d = 0; d < DTE_MAX_DIMS; d++) {
		if (flags & 0x20)	/* strides that overflow int64 arithmetic */
			e->dst_stride[d] = (int64_t)fuzz_uint(in, 8);
		else
			e->dst_stride[d] = (int8_t)fuzz_u8(in) % 9;
	}
	e->dst_offset = (int16_t)fuzz_uint(in, 2);
	fe->dst_len = fuzz_uint(in, 2);

	if (e->ndim > DTE_MAX_DIMS)
		bad = 1;
	for (uint32_t d = 0; !bad && d < e->ndim; d++) {
		if (e->extent[d] < 1 || (uint64_t)e->extent[d] > MAX_BOX / box)
			bad = 1;
		else
			box *= (uint64_t)e->extent[d];
	}
	/* Larger boxes are valid, just too slow to walk here: skip the input. */
	fe->box = bad ? 0 : box;
	if (bad && e->ndim <= DTE_MAX_DIMS) {
		for (uint32_t d = 0; d < e->ndim; d++)
			if (e->extent[d] < 1)
				return;	/* genuinely bad: box stays 0 */
		fe->box = UINT64_MAX;	/* valid but too large */
	}
	if (bad)
		return;
	lo = hi = e->dst_offset;
	for (uint32_t d = 0; d < e->ndim; d++) {
		__int128 span = (__int128)(e->extent[d] - 1) * e->dst_stride[d];

		if (span < 0)
			lo += span;
		else
			hi += span;
	}
	fe->in_range = lo >= 0 && hi < (__int128)fe->dst_len;
}

static uint16_t *new_dst(uint64_t n, uint16_t **copy)
{
	uint16_t *d = malloc((n ? n : 1) * sizeof(*d));

	*copy = malloc((n ? n : 1) * sizeof(*d));
	if (!d || !*copy)
		abort();
	for (uint64_t i = 0; i < n; i++)
		d[i] = (*copy)[i] = (uint16_t)(i * 0x9e37u);
	return d;
}

static void check_scatter(const struct fz_entry *fe, const uint64_t *pos, const uint16_t *val,
			  uint64_t n)
{
	uint16_t *ref, *dst = new_dst(fe->dst_len, &ref);
	int rc = dtc_scatter_apply(cpu, &fe->e, pos, val, n, dst, fe->dst_len);

	if (fe->in_range) {
		FUZZ_CHECK(rc == DTC_OK, "scatter of an in-range entry failed: %s",
			   dtc_strerror(rc));
		for (uint64_t i = 0; i < n; i++)
			ref[(uint64_t)ref_dst(&fe->e, pos[i])] = val[i];
	} else {
		FUZZ_CHECK(rc != DTC_OK, "scatter accepted an entry outside its buffer");
	}
	FUZZ_CHECK(memcmp(dst, ref, fe->dst_len * sizeof(*dst)) == 0,
		   "scatter wrote what the reference did not (rc %d)", rc);
	free(dst);
	free(ref);
}

static void check_dense_apply(const struct fz_entry *fe, const uint16_t *vals)
{
	uint16_t *ref, *dst = new_dst(fe->dst_len, &ref);
	int rc = dtc_dense_apply(cpu, &fe->e, vals, dst, fe->dst_len);

	if (fe->in_range) {
		FUZZ_CHECK(rc == DTC_OK, "dense apply of an in-range entry failed: %s",
			   dtc_strerror(rc));
		for (uint64_t i = 0; i < fe->box; i++)
			ref[(uint64_t)ref_dst(&fe->e, i)] = vals[i];
	} else {
		FUZZ_CHECK(rc != DTC_OK, "dense apply accepted an entry outside its buffer");
	}
	FUZZ_CHECK(memcmp(dst, ref, fe->dst_len * sizeof(*dst)) == 0,
		   "dense apply wrote what the reference did not (rc %d)", rc);
	free(dst);
	free(ref);
}

static uint64_t buf_sum(const uint16_t *d, uint64_t n)
{
	uint64_t s = 0;

	for (uint64_t i = 0; i < n; i++)
		s += dtc_csum_term(i, d[i]);
	return s;
}

/* The one-pass check and apply straight from the payload bytes, against
 * the decoder's verdict (ok, and pos/val/n when ok). */
static void check_payload(const struct fz_entry *fe, const uint8_t *in, size_t len, uint64_t box,
			  int ok, const uint64_t *pos, const uint16_t *val, uint64_t n)
{
	uint64_t cnt = UINT64_MAX, delta = 0, before;
	uint16_t *ref, *dst;
	int rc = dtc_sparse_payload_check(in, len, box, &cnt);

	FUZZ_CHECK((rc == DTC_OK) == ok, "payload check says %s, decode %s", dtc_strerror(rc),
		   ok ? "ok" : "refuses");
	FUZZ_CHECK(!ok || cnt == n, "payload check counted %llu, decode %llu",
		   (unsigned long long)cnt, (unsigned long long)n);
	if (!fe->box || fe->box == UINT64_MAX)
		return;
	dst = new_dst(fe->dst_len, &ref);
	before = buf_sum(dst, fe->dst_len);
	cnt = UINT64_MAX;
	rc = dtc_sparse_apply_payload(cpu, &fe->e, in, len, dst, fe->dst_len, &cnt, &delta);
	if (ok && fe->in_range) {
		FUZZ_CHECK(rc == DTC_OK, "payload apply failed: %s", dtc_strerror(rc));
		FUZZ_CHECK(cnt == n, "payload apply wrote %llu of %llu", (unsigned long long)cnt,
			   (unsigned long long)n);
		for (uint64_t i = 0; i < n; i++)
			ref[(uint64_t)ref_dst(&fe->e, pos[i])] = val[i];
		FUZZ_CHECK(delta == buf_sum(dst, fe->dst_len) - before,
			   "payload apply delta is not the checksum change");
	} else {
		FUZZ_CHECK(rc != DTC_OK, "payload apply accepted a bad payload or entry");
		FUZZ_CHECK(delta == 0, "delta changed on error");
	}
	FUZZ_CHECK(memcmp(dst, ref, fe->dst_len * sizeof(*dst)) == 0,
		   "payload apply wrote what the reference did not (rc %d)", rc);
	free(dst);
	free(ref);
}

/* Encode, frame at `zlevel`, unframe and decode again: must give x back. */
static void sparse_roundtrip(const uint64_t *pos, const uint16_t *val, uint64_t n, uint64_t box,
			     int zlevel)
{
	size_t cap = dtc_sparse_bound(n), clen, elen, ulen;
	uint8_t *enc = malloc(cap), *chunk = malloc(dtc_chunk_bound(cap)), *raw;
	uint64_t *p2 = malloc((n ? n : 1) * sizeof(*p2)), n2 = UINT64_MAX;
	uint16_t *v2 = malloc((n ? n : 1) * sizeof(*v2));
	int rc;

	if (!enc || !chunk || !p2 || !v2)
		abort();
	rc = dtc_sparse_encode(pos, val, n, box, enc, cap, &elen);
	FUZZ_CHECK(rc == DTC_OK, "encode of a valid set failed: %s", dtc_strerror(rc));
	rc = dtc_chunk_pack(enc, elen, zlevel, chunk, dtc_chunk_bound(cap), &clen);
	FUZZ_CHECK(rc == DTC_OK, "chunk pack failed: %s", dtc_strerror(rc));
	raw = malloc(elen);
	if (!raw)
		abort();
	rc = dtc_chunk_unpack(chunk, clen, raw, elen, &ulen);
	FUZZ_CHECK(rc == DTC_OK && ulen == elen && memcmp(raw, enc, elen) == 0,
		   "chunk round trip failed: %s", dtc_strerror(rc));
	rc = dtc_sparse_decode(raw, ulen, box, p2, v2, n, &n2);
	FUZZ_CHECK(rc == DTC_OK, "decode of our own encoding failed: %s", dtc_strerror(rc));
	FUZZ_CHECK(n2 == n && (n == 0 || (memcmp(p2, pos, n * sizeof(*pos)) == 0 &&
					  memcmp(v2, val, n * sizeof(*val)) == 0)),
		   "sparse round trip changed the set");
	free(enc);
	free(chunk);
	free(raw);
	free(p2);
	free(v2);
}

static void fuzz_sparse(const struct fz_entry *fe, const uint8_t *in, size_t len, int zlevel)
{
	uint64_t box = fe->box == UINT64_MAX ? UINT64_C(1) << 40 : fe->box;
	uint64_t count = UINT64_MAX, n = UINT64_MAX;
	uint64_t *pos;
	uint16_t *val;
	int rc;

	if (dtc_sparse_count(in, len, box, &count) != DTC_OK) {
		FUZZ_CHECK(dtc_sparse_decode(in, len, box, NULL, NULL, 0, &n) != DTC_OK,
			   "decode accepted what count refused");
		check_payload(fe, in, len, box, 0, NULL, NULL, 0);
		return;
	}
	FUZZ_CHECK(count <= box && count <= len / 3, "count %llu does not fit (len %zu)",
		   (unsigned long long)count, len);
	pos = malloc((count ? count : 1) * sizeof(*pos));
	val = malloc((count ? count : 1) * sizeof(*val));
	if (!pos || !val)
		abort();
	if (count)	/* one short: must refuse, not overflow */
		FUZZ_CHECK(dtc_sparse_decode(in, len, box, pos, val, count - 1, &n) != DTC_OK,
			   "decode into too small arrays succeeded");
	rc = dtc_sparse_decode(in, len, box, pos, val, count, &n);
	if (rc == DTC_OK) {
		FUZZ_CHECK(n == count, "decoded %llu of %llu", (unsigned long long)n,
			   (unsigned long long)count);
		for (uint64_t i = 0; i < n; i++)
			FUZZ_CHECK(pos[i] < box && (i == 0 || pos[i] > pos[i - 1]),
				   "position %llu: %llu not sorted/inside", (unsigned long long)i,
				   (unsigned long long)pos[i]);
		sparse_roundtrip(pos, val, n, box, zlevel);
		if (fe->box && fe->box != UINT64_MAX)
			check_scatter(fe, pos, val, n);
		check_payload(fe, in, len, box, 1, pos, val, n);
	} else {
		FUZZ_CHECK(n == UINT64_MAX, "count written on error");
		check_payload(fe, in, len, box, 0, NULL, NULL, 0);
	}
	free(pos);
	free(val);
}

static void fuzz_dense(const struct fz_entry *fe, const uint8_t *in, size_t len)
{
	uint16_t *vals;
	int rc;

	if (!fe->box || fe->box == UINT64_MAX)
		return;
	vals = malloc(fe->box * sizeof(*vals));
	if (!vals)
		abort();
	rc = dtc_dense_decode(in, len, fe->box, vals);
	FUZZ_CHECK((rc == DTC_OK) == (len == 2 * fe->box), "dense decode of %zu bytes for %llu "
		   "values: %s", len, (unsigned long long)fe->box, dtc_strerror(rc));
	if (rc == DTC_OK) {
		for (uint64_t i = 0; i < fe->box; i++)
			FUZZ_CHECK(vals[i] == (uint16_t)(in[2 * i] | in[2 * i + 1] << 8),
				   "dense value %llu wrong", (unsigned long long)i);
		check_dense_apply(fe, vals);
	}
	free(vals);
}

static void fuzz_chunk(const struct fz_entry *fe, const uint8_t *in, size_t len, int dense,
		       int zlevel)
{
	uint64_t raw_len;
	size_t olen = SIZE_MAX, clen, blen;
	uint8_t *out, *again, *back;
	int codec, rc;

	if (dtc_chunk_info(in, len, &raw_len, &codec) != DTC_OK)
		return;
	FUZZ_CHECK(codec == DTC_CODEC_RAW || codec == DTC_CODEC_ZSTD, "codec %d", codec);
	if (raw_len > (1u << 22))
		return;	/* a lie about the size: unpack would need that much room */
	out = malloc(raw_len ? raw_len : 1);
	if (!out)
		abort();
	if (raw_len)
		FUZZ_CHECK(dtc_chunk_unpack(in, len, out, raw_len - 1, &olen) != DTC_OK,
			   "unpack into too small a buffer succeeded");
	rc = dtc_chunk_unpack(in, len, out, raw_len, &olen);
	if (rc == DTC_OK) {
		FUZZ_CHECK(olen == raw_len, "unpacked %zu of %llu", olen,
			   (unsigned long long)raw_len);
		again = malloc(dtc_chunk_bound(olen));
		back = malloc(olen ? olen : 1);
		if (!again || !back)
			abort();
		rc = dtc_chunk_pack(out, olen, zlevel, again, dtc_chunk_bound(olen), &clen);
		FUZZ_CHECK(rc == DTC_OK, "repack failed");
		FUZZ_CHECK(dtc_chunk_unpack(again, clen, back, olen, &blen) == DTC_OK &&
			   blen == olen && memcmp(back, out, olen) == 0,
			   "repacked chunk does not unpack to the same bytes");
		if (codec == DTC_CODEC_RAW)
			FUZZ_CHECK(memcmp(out, in + DTC_CHUNK_HDR, olen) == 0,
				   "raw chunk unpacked to other bytes than it holds");
		free(again);
		free(back);
		if (dense)
			fuzz_dense(fe, out, olen);
		else
			fuzz_sparse(fe, out, olen, zlevel);
	}
	free(out);
}

/* Positions and values taken from the input, then the round trips. */
static void fuzz_roundtrip(const struct fz_entry *fe, const uint8_t *in, size_t len, int zlevel)
{
	uint64_t box = fe->box, n = 0, p = 0;
	uint64_t *pos;
	uint16_t *val;

	if (!box || box == UINT64_MAX)
		return;
	pos = malloc((len / 3 + 1) * sizeof(*pos));
	val = malloc((len / 3 + 1) * sizeof(*val));
	if (!pos || !val)
		abort();
	for (size_t i = 0; i + 3 <= len; i += 3) {
		/* Small gaps mostly, sometimes large ones (2-byte and escaped codes). */
		uint64_t gap = in[i] < 0xf0 ? in[i] % 0x90 : (uint64_t)(in[i] & 0xf) * 4099;

		if (box - p <= gap)
			break;
		p += gap;
		pos[n] = p;
		val[n++] = (uint16_t)(in[i + 1] | in[i + 2] << 8);
		if (++p >= box)
			break;
	}
	sparse_roundtrip(pos, val, n, box, zlevel);
	check_scatter(fe, pos, val, n);
	free(pos);
	free(val);

	if (box <= (1u << 16)) {
		uint16_t *vals = malloc(box * sizeof(*vals)), *back = malloc(box * sizeof(*back));
		uint8_t *enc = malloc(2 * box), *chunk = malloc(dtc_chunk_bound(2 * box)), *raw;
		size_t elen, clen, ulen;

		raw = malloc(2 * box);
		if (!vals || !back || !enc || !chunk || !raw)
			abort();
		for (uint64_t i = 0; i < box; i++)
			vals[i] = len ? (uint16_t)(in[i % len] * 0x101u + (i / len)) : 0;
		FUZZ_CHECK(dtc_dense_encode(vals, box, enc, 2 * box, &elen) == DTC_OK &&
			   elen == 2 * box, "dense encode failed");
		FUZZ_CHECK(dtc_chunk_pack(enc, elen, zlevel, chunk, dtc_chunk_bound(2 * box),
					  &clen) == DTC_OK, "dense chunk pack failed");
		FUZZ_CHECK(dtc_chunk_unpack(chunk, clen, raw, 2 * box, &ulen) == DTC_OK &&
			   ulen == elen, "dense chunk unpack failed");
		FUZZ_CHECK(dtc_dense_decode(raw, ulen, box, back) == DTC_OK &&
			   memcmp(back, vals, box * sizeof(*vals)) == 0, "dense round trip differs");
		check_dense_apply(fe, back);
		free(vals);
		free(back);
		free(enc);
		free(chunk);
		free(raw);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = { data, size };
	uint8_t mode = fuzz_u8(&in), flags = fuzz_u8(&in);
	int zlevel = flags & 3;
	struct fz_entry fe;
	uint8_t *payload;

	read_entry(&fe, &in, flags);
	/* A copy of exactly the payload, so reading one byte past is caught. */
	payload = malloc(in.n ? in.n : 1);
	if (!payload)
		abort();
	memcpy(payload, in.p, in.n);
	switch (mode % 4) {
	case 0:
		fuzz_sparse(&fe, payload, in.n, zlevel);
		break;
	case 1:
		fuzz_dense(&fe, payload, in.n);
		break;
	case 2:
		fuzz_chunk(&fe, payload, in.n, mode & 4, zlevel);
		break;
	case 3:
		fuzz_roundtrip(&fe, payload, in.n, zlevel);
		break;
	}
	free(payload);
	return 0;
}

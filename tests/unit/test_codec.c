/* Payload codecs: round trips, sizes, and hostile input (every prefix,
 * random corruption) decoded from exact-size heap copies so ASan sees any
 * read past the end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "gpu/codec.h"
#include "gpu/compute.h"
#include "gpu/elem.h"

static uint64_t seed = 42;

static uint64_t rnd(void)
{
	return dtc_mix64(seed++);
}

/* Sorted unique positions with a mix of 1-byte, 2-byte and escaped gaps. */
static uint64_t make_positions(uint64_t *pos, uint64_t n, uint64_t box)
{
	uint64_t p = 0, c = 0;

	for (uint64_t i = 0; i < n; i++) {
		uint64_t r = rnd() % 100, gap = r < 70 ? rnd() % 128 : r < 95 ? rnd() % 16000 : rnd() % 5000000;

		p += gap + (i ? 1 : 0);
		if (p >= box)
			break;
		pos[c++] = p;
	}
	return c;
}

static uint8_t *encode(const uint64_t *pos, const uint16_t *val, uint64_t n, uint64_t box, size_t *len)
{
	size_t cap = dtc_sparse_bound(n);
	uint8_t *buf = malloc(cap);

	assert_non_null(buf);
	assert_int_equal(dtc_sparse_encode(pos, val, n, box, buf, cap, len), DTC_OK);
	return buf;
}

static void test_roundtrip(void **state)
{
	const uint64_t boxes[] = { 1, 200, 1 << 20, (uint64_t)1 << 40 };

	for (size_t b = 0; b < 4; b++) {
		uint64_t box = boxes[b], n = 5000, *pos = malloc(n * 8), *out = malloc(n * 8);
		uint16_t *val = malloc(n * 2), *vout = malloc(n * 2);
		uint64_t count, got;
		size_t len;
		uint8_t *buf;

		count = make_positions(pos, n, box);
		for (uint64_t i = 0; i < count; i++)
			val[i] = (uint16_t)rnd();
		buf = encode(pos, val, count, box, &len);
		assert_int_equal(dtc_sparse_count(buf, len, box, &got), DTC_OK);
		assert_int_equal(got, count);
		assert_int_equal(dtc_sparse_decode(buf, len, box, out, vout, n, &got), DTC_OK);
		assert_int_equal(got, count);
		assert_memory_equal(out, pos, count * 8);
		assert_memory_equal(vout, val, count * 2);
		free(buf);
		free(pos);
		free(out);
		free(val);
		free(vout);
	}
}

static void test_sizes(void **state)
{
	uint64_t pos[4] = { 0, 127 + 1, 128 + 1 + 128 + 16383 + 1 + 0, 0 }, got;
	uint16_t val[4] = { 1, 2, 3, 4 };
	uint8_t buf[64];
	size_t len;

	/* every element of a dense run costs 1 + 2 bytes */
	{
		uint64_t all[300];
		uint16_t v[300] = { 0 };

		for (int i = 0; i < 300; i++)
			all[i] = (uint64_t)i;
		{
			uint8_t *b = encode(all, v, 300, 300, &len);

			assert_int_equal(len, 2 + 300 * 3);	/* varint(300) is 2 bytes */
			free(b);
		}
	}
	/* gap 127: 1 byte; gap 128: 2 bytes; gap 16511: 2 bytes; 16512: escape */
	pos[1] = 0 + 1 + 127;			/* gap 127 */
	pos[2] = pos[1] + 1 + 128;		/* gap 128 */
	pos[3] = pos[2] + 1 + 16512;		/* gap 16512 -> escape */
	assert_int_equal(dtc_sparse_encode(pos, val, 4, 1 << 20, buf, sizeof(buf), &len), DTC_OK);
	assert_int_equal(len, 1 + (1 + 1 + 2 + 4) + 8);
	{
		uint64_t out[4];
		uint16_t vo[4];

		assert_int_equal(dtc_sparse_decode(buf, len, 1 << 20, out, vo, 4, &got), DTC_OK);
		assert_memory_equal(out, pos, sizeof(pos));
	}
	/* encoder refuses unsorted, duplicate, out-of-box input and small caps */
	pos[2] = pos[1];
	assert_int_equal(dtc_sparse_encode(pos, val, 4, 1 << 20, buf, sizeof(buf), &len), DTC_EINVAL);
	pos[2] = pos[1] + 1;
	assert_int_equal(dtc_sparse_encode(pos, val, 4, pos[3], buf, sizeof(buf), &len), DTC_EINVAL);
	assert_int_equal(dtc_sparse_encode(pos, val, 4, 1 << 20, buf, 5, &len), DTC_ENOSPC);
	/* empty payload */
	assert_int_equal(dtc_sparse_encode(NULL, NULL, 0, 10, buf, sizeof(buf), &len), DTC_OK);
	assert_int_equal(len, 1);
	assert_int_equal(dtc_sparse_decode(buf, len, 10, NULL, NULL, 0, &got), DTC_OK);
	assert_int_equal(got, 0);
}

/* Decoding a copy of exactly `len` bytes: must not crash or over-read. */
static int decode_copy(const uint8_t *src, size_t len, uint64_t box, uint64_t *pos, uint16_t *val,
		       uint64_t cap, uint64_t *n)
{
	uint8_t *c = malloc(len ? len : 1);
	int rc;

	memcpy(c, src, len);
	rc = dtc_sparse_decode(c, len, box, pos, val, cap, n);
	free(c);
	return rc;
}

static void test_truncated(void **state)
{
	uint64_t n = 400, box = 1 << 24, *pos = malloc(n * 8), *out = malloc(n * 8), got, count;
	uint16_t *val = calloc(n, 2), *vo = malloc(n * 2);
	size_t len;
	uint8_t *buf;

	count = make_positions(pos, n, box);
	buf = encode(pos, val, count, box, &len);
	for (size_t l = 0; l < len; l++) {
		int rc = decode_copy(buf, l, box, out, vo, n, &got);

		if (rc != DTC_ETRUNC && rc != DTC_ECORRUPT)
			fail_msg("prefix %zu of %zu: %s", l, len, dtc_strerror(rc));
	}
	/* one byte too many is corrupt, not silently ignored */
	{
		uint8_t *longer = malloc(len + 1);

		memcpy(longer, buf, len);
		longer[len] = 0;
		assert_int_equal(decode_copy(longer, len + 1, box, out, vo, n, &got), DTC_ECORRUPT);
		free(longer);
	}
	free(buf);
	free(pos);
	free(out);
	free(val);
	free(vo);
}

static void test_corrupt(void **state)
{
	uint64_t n = 300, box = 1 << 20, *pos = malloc(n * 8), *out = malloc(n * 8), got, count;
	uint16_t *val = calloc(n, 2), *vo = malloc(n * 2);
	size_t len;
	uint8_t *buf, bad[16];
	int errors = 0;

	count = make_positions(pos, n, box);
	buf = encode(pos, val, count, box, &len);
	for (int trial = 0; trial < 20000; trial++) {
		uint8_t *c = malloc(len);
		int rc, flips = 1 + (int)(rnd() % 4);

		memcpy(c, buf, len);
		for (int f = 0; f < flips; f++)
			c[rnd() % len] ^= (uint8_t)(1 + rnd() % 255);
		rc = dtc_sparse_decode(c, len, box, out, vo, n, &got);
		if (rc == DTC_OK) {
			/* a valid-looking payload still yields valid positions */
			for (uint64_t i = 0; i < got; i++) {
				assert_true(out[i] < box);
				assert_true(i == 0 || out[i] > out[i - 1]);
			}
		} else {
			errors++;
		}
		free(c);
	}
	assert_true(errors > 0);
	/* directed: reserved code, position past the box, huge count,
	 * non-canonical escape, overlong varint */
	bad[0] = 1, bad[1] = 0xC1, bad[2] = 0, bad[3] = 0;
	assert_int_equal(decode_copy(bad, 4, box, out, vo, n, &got), DTC_ECORRUPT);
	bad[0] = 1, bad[1] = 0x7f, bad[2] = 0, bad[3] = 0;
	assert_int_equal(decode_copy(bad, 4, 100, out, vo, n, &got), DTC_ERANGE);
	bad[0] = 2, bad[1] = 0x7f, bad[2] = 0x00, bad[3] = 0, bad[4] = 0, bad[5] = 0, bad[6] = 0;
	assert_int_equal(decode_copy(bad, 7, 128, out, vo, n, &got), DTC_ERANGE);
	bad[0] = 0xff, bad[1] = 0xff, bad[2] = 0xff, bad[3] = 0x0f;
	assert_int_equal(decode_copy(bad, 4, box, out, vo, n, &got), DTC_ECORRUPT);
	bad[0] = 1, bad[1] = 0xC0, bad[2] = 5, bad[3] = 0, bad[4] = 0;
	assert_int_equal(decode_copy(bad, 5, box, out, vo, n, &got), DTC_ECORRUPT);
	memset(bad, 0xff, 11);
	assert_int_equal(decode_copy(bad, 11, box, out, vo, n, &got), DTC_ECORRUPT);
	/* count larger than the room given */
	assert_int_equal(decode_copy(buf, len, box, out, vo, count - 1, &got), DTC_ENOSPC);
	free(buf);
	free(pos);
	free(out);
	free(val);
	free(vo);
}

static void test_dense(void **state)
{
	uint16_t v[100], o[100];
	uint8_t buf[200];
	size_t len;

	for (int i = 0; i < 100; i++)
		v[i] = (uint16_t)(i * 977);
	assert_int_equal(dtc_dense_encode(v, 100, buf, sizeof(buf), &len), DTC_OK);
	assert_int_equal(len, 200);
	assert_int_equal(buf[2], (uint8_t)977);	/* little-endian on the wire */
	assert_int_equal(dtc_dense_decode(buf, len, 100, o), DTC_OK);
	assert_memory_equal(o, v, sizeof(v));
	assert_int_equal(dtc_dense_decode(buf, 199, 100, o), DTC_ETRUNC);
	assert_int_equal(dtc_dense_decode(buf, 200, 99, o), DTC_ECORRUPT);
	assert_int_equal(dtc_dense_encode(v, 100, buf, 199, &len), DTC_ENOSPC);
}

static void test_chunk(void **state)
{
	size_t n = 100000, cap = dtc_chunk_bound(n), len, outlen;
	uint8_t *raw = malloc(n), *packed = malloc(cap), *out = malloc(n);
	uint64_t raw_len;
	int codec;

	for (size_t i = 0; i < n; i++)
		raw[i] = (uint8_t)(i % 7 == 0 ? rnd() : 0);	/* compressible */
	for (int level = 0; level <= 3; level++) {
		assert_int_equal(dtc_chunk_pack(raw, n, level, packed, cap, &len), DTC_OK);
		assert_int_equal(dtc_chunk_info(packed, len, &raw_len, &codec), DTC_OK);
		assert_int_equal(raw_len, n);
		assert_int_equal(codec, level ? DTC_CODEC_ZSTD : DTC_CODEC_RAW);
		if (level)
			assert_true(len < n / 2);
		assert_int_equal(dtc_chunk_unpack(packed, len, out, n, &outlen), DTC_OK);
		assert_int_equal(outlen, n);
		assert_memory_equal(out, raw, n);
		/* truncated at every interesting length */
		for (size_t l = 0; l < len; l += l < 64 ? 1 : 997) {
			uint8_t *c = malloc(l ? l : 1);

			memcpy(c, packed, l);
			assert_int_not_equal(dtc_chunk_unpack(c, l, out, n, &outlen), DTC_OK);
			free(c);
		}
		/* a flipped payload byte is caught (checksum or zstd) */
		packed[DTC_CHUNK_HDR + len / 3] ^= 0x10;
		{
			int rc = dtc_chunk_unpack(packed, len, out, n, &outlen);

			assert_true(rc == DTC_ECHECKSUM || rc == DTC_ECORRUPT);
		}
		packed[DTC_CHUNK_HDR + len / 3] ^= 0x10;
		/* too little room for the raw bytes */
		assert_int_equal(dtc_chunk_unpack(packed, len, out, n - 1, &outlen), DTC_ENOSPC);
		/* bad magic */
		packed[0] = 'X';
		assert_int_equal(dtc_chunk_unpack(packed, len, out, n, &outlen), DTC_ECORRUPT);
		packed[0] = 'D';
	}
	/* incompressible data is stored raw even when zstd is asked for */
	for (size_t i = 0; i < n; i++)
		raw[i] = (uint8_t)rnd();
	assert_int_equal(dtc_chunk_pack(raw, n, 3, packed, cap, &len), DTC_OK);
	assert_int_equal(dtc_chunk_info(packed, len, &raw_len, &codec), DTC_OK);
	assert_int_equal(codec, DTC_CODEC_RAW);
	assert_int_equal(dtc_chunk_pack(raw, n, 4, packed, cap, &len), DTC_EINVAL);
	free(raw);
	free(packed);
	free(out);
}

/* Sealed in place == packed raw; a view reads it without a copy, refuses a
 * flipped byte and leaves compressed chunks to dtc_chunk_unpack. */
static void test_chunk_in_place(void **state)
{
	size_t n = 5000, cap = dtc_chunk_bound(n), len, vlen;
	uint8_t *buf = malloc(DTC_CHUNK_HDR + n), *packed = malloc(cap);
	const uint8_t *view;

	for (size_t i = 0; i < n; i++)
		buf[DTC_CHUNK_HDR + i] = (uint8_t)(i % 5 ? 0 : rnd());
	assert_int_equal(dtc_chunk_seal_raw(buf, n), DTC_OK);
	assert_int_equal(dtc_chunk_pack(buf + DTC_CHUNK_HDR, n, 0, packed, cap, &len), DTC_OK);
	assert_int_equal(len, DTC_CHUNK_HDR + n);
	assert_memory_equal(buf, packed, len);
	assert_int_equal(dtc_chunk_view(buf, len, &view, &vlen), DTC_OK);
	assert_ptr_equal(view, buf + DTC_CHUNK_HDR);
	assert_int_equal(vlen, n);
	buf[DTC_CHUNK_HDR + n / 2] ^= 1;
	assert_int_equal(dtc_chunk_view(buf, len, &view, &vlen), DTC_ECHECKSUM);
	assert_int_equal(dtc_chunk_view(buf, len - 1, &view, &vlen), DTC_ETRUNC);
	assert_int_not_equal(dtc_chunk_view(buf, 10, &view, &vlen), DTC_OK);
	assert_int_equal(dtc_chunk_pack(buf + DTC_CHUNK_HDR, n, 3, packed, cap, &len), DTC_OK);
	assert_int_equal(dtc_chunk_view(packed, len, &view, &vlen), DTC_OK);
	assert_null(view);
	assert_int_equal(vlen, n);
	assert_int_equal(dtc_chunk_seal_raw(NULL, 0), DTC_EINVAL);
	free(buf);
	free(packed);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_sizes),
		cmocka_unit_test(test_truncated),
		cmocka_unit_test(test_corrupt),
		cmocka_unit_test(test_dense),
		cmocka_unit_test(test_chunk),
		cmocka_unit_test(test_chunk_in_place),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

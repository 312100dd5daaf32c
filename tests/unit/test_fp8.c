/* FP8 E4M3FN conversion and block quantization (gpu/fp8.h): hand-checked
 * vectors (each also what torch 2.13's float8_e4m3fn cast gives), every
 * code's round trip, the engines' block formula on small blocks (the amax
 * clamp, UE8M0, partial edge blocks, NaN), and the BF16 -> FP8 diff
 * against two full quantizations.  tests/system/fp8_quant.py compares the
 * same functions with the engines' own Python quantizers. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "gpu/compute.h"
#include "gpu/elem.h"
#include "gpu/fp8.h"

struct vec {
	float in;
	uint8_t code;
};

static void test_conversion_vectors(void **state)
{
	static const struct vec v[] = {
		{ 0.0f, 0x00 }, { -0.0f, 0x80 },
		{ 0x1p-9f, 0x01 }, { -0x1p-9f, 0x81 },		/* smallest subnormal */
		{ 0x1p-10f, 0x00 },				/* half of it: ties to even 0 */
		{ 0x1.000002p-10f, 0x01 },			/* just above half */
		{ 0x3p-10f, 0x02 },				/* 1.5 steps: ties to even 2 */
		{ 0x1p-6f - 0x1p-10f, 0x08 },			/* 7.5 steps: up to the smallest normal */
		{ 0x1p-6f, 0x08 },
		{ 1e-45f, 0x00 },				/* FP32 subnormal */
		{ 0.1f, 0x1d },
		{ 1.0625f, 0x38 },				/* between 1 and 1.125: even 1 */
		{ 1.1875f, 0x3a },				/* between 1.125 and 1.25: even 1.25 */
		{ -300.0f, 0xf9 },
		{ 448.0f, 0x7e }, { 449.0f, 0x7e }, { 463.99f, 0x7e },
		{ 464.0f, 0x7e },				/* halfway 448..480: even 448 */
		{ 464.01f, 0x7e }, { 479.9f, 0x7e },		/* round to 480: saturate */
		{ 480.0f, 0x7e }, { 1e6f, 0x7e }, { -1e6f, 0xfe },
		{ INFINITY, 0x7e }, { -INFINITY, 0xfe },
		{ NAN, 0x7f }, { -NAN, 0xff },
	};

	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		uint8_t got = dtc_fp8_e4m3fn_from_f32(v[i].in);

		if (got != v[i].code)
			fail_msg("e4m3fn(%a) = 0x%02x, want 0x%02x", v[i].in, got, v[i].code);
	}
}

/* Every finite code decodes to a value that encodes back to it; the
 * midpoint between neighbours goes to the even one, just above it to the
 * upper one. */
static void test_round_trip_and_midpoints(void **state)
{
	for (unsigned c = 0; c < 256; c++) {
		float x = dtc_fp8_e4m3fn_to_f32((uint8_t)c);

		if ((c & 0x7f) == 0x7f) {
			assert_true(isnan(x));
			continue;
		}
		assert_int_equal(dtc_fp8_e4m3fn_from_f32(x), c);
		if ((c & 0x7f) == 0x7e)
			continue;
		float up = dtc_fp8_e4m3fn_to_f32((uint8_t)(c + 1));
		float mid = (x + up) / 2;	/* exact: both have <= 4 significant bits */
		uint8_t even = (c & 1) ? (uint8_t)(c + 1) : (uint8_t)c;

		assert_int_equal(dtc_fp8_e4m3fn_from_f32(mid), even);
		assert_int_equal(dtc_fp8_e4m3fn_from_f32(nextafterf(mid, up)), c + 1);
		assert_int_equal(dtc_fp8_e4m3fn_from_f32(nextafterf(mid, x)), c);
	}
	assert_true(dtc_fp8_e4m3fn_to_f32(0x7e) == 448.0f);
	assert_true(dtc_fp8_e4m3fn_to_f32(0x01) == 0x1p-9f);
	assert_true(signbit(dtc_fp8_e4m3fn_to_f32(0x80)));
}

static uint16_t bf(float x)
{
	return dtc_bf16_rne(x);
}

static void test_ceil_ue8m0(void **state)
{
	assert_true(dtc_fp8_ceil_ue8m0(1.0f) == 1.0f);
	assert_true(dtc_fp8_ceil_ue8m0(0x1.000002p0f) == 2.0f);	/* one ulp above: up */
	assert_true(dtc_fp8_ceil_ue8m0(0.75f) == 1.0f);
	assert_true(dtc_fp8_ceil_ue8m0(-0.75f) == 1.0f);
	assert_true(dtc_fp8_ceil_ue8m0(0.0f) == 0x1p-126f);		/* exponent clamped to 1 */
	assert_true(dtc_fp8_ceil_ue8m0(0x1p127f * 1.5f) == 0x1p127f);	/* ... and to 254 */
	assert_true(dtc_fp8_ceil_ue8m0(INFINITY) == 0x1p127f);
	assert_true(dtc_fp8_ceil_ue8m0(NAN) == 0x1p127f);

	/* vLLM's pow(2, ceil(log2)): the same on normal values, but no clamp
	 * and non-finite values pass. */
	for (float x = 0x1.8p-126f; x < 0x1p127f; x *= 1.37f)
		assert_true(dtc_fp8_ceil_pow2(x) == dtc_fp8_ceil_ue8m0(x));
	assert_true(dtc_fp8_ceil_pow2(0x1p127f) == 0x1p127f);
	assert_true(isinf(dtc_fp8_ceil_pow2(0x1.000002p127f)));
	assert_true(isinf(dtc_fp8_ceil_pow2(-INFINITY)) && dtc_fp8_ceil_pow2(-INFINITY) > 0);
	assert_true(isnan(dtc_fp8_ceil_pow2(NAN)));
	assert_true(dtc_fp8_ceil_pow2(0.0f) == 0.0f);
	assert_true(dtc_fp8_ceil_pow2(0x1.8p-140f) == 0x1p-139f);
	assert_true(dtc_fp8_ceil_pow2(0x1p-149f) == 0x1p-149f);
}

/* A 3x5 matrix in one 128x128 block (partial in both directions). */
static void test_partial_block(void **state)
{
	uint16_t w[15];
	uint8_t q[15];
	float s[1];

	for (int i = 0; i < 15; i++)
		w[i] = bf((i % 2 ? -0.25f : 0.125f) * (float)(i + 1) / 16);
	w[7] = bf(3.0f);
	assert_int_equal(dtc_fp8_quantize_bf16(w, 3, 5, 5, 128, 128, 0, q, s), DTC_OK);
	assert_true(s[0] == 3.0f / 448.0f);
	/* 3 * RN(1/RN(3/448)) is 447.99997, which rounds to 448. */
	assert_int_equal(q[7], 0x7e);
	for (int i = 0; i < 15; i++)
		assert_int_equal(q[i], dtc_fp8_e4m3fn_from_f32(dtc_bf16_f32(w[i]) * (1.0f / s[0])));

	/* UE8M0: 3/448 = 1.71 * 2^-8 -> 2^-7, so 3 -> 384 (0x7c). */
	assert_int_equal(dtc_fp8_quantize_bf16(w, 3, 5, 5, 128, 128, DTC_FP8_UE8M0, q, s), DTC_OK);
	assert_true(s[0] == 0x1p-7f);
	assert_int_equal(q[7], 0x7c);
	/* amax 1.75 * 2^k makes amax/448 a power of two: not rounded up. */
	w[7] = bf(1.75f);
	assert_int_equal(dtc_fp8_quantize_bf16(w, 3, 5, 5, 128, 128, DTC_FP8_UE8M0, q, s), DTC_OK);
	assert_true(s[0] == 0x1p-8f);
	assert_int_equal(q[7], 0x7e);
	/* The reciprocal variant: 3 * RN32(1/448) vs 3 / 448. */
	w[7] = bf(3.0f);
	assert_int_equal(dtc_fp8_quantize_bf16(w, 3, 5, 5, 128, 128, DTC_FP8_SCALE_RECIP, q, s),
			 DTC_OK);
	assert_true(s[0] == 3.0f * (float)(1.0 / 448.0));
}

/* All |x| below 1e-4: the scale is RN32(1e-4)/448, not amax/448. */
static void test_tiny_block_clamp(void **state)
{
	uint16_t w[4] = { bf(0x1p-20f), bf(-0x1p-20f), 0, 0x8000 };
	uint8_t q[4];
	float s[1];

	assert_int_equal(dtc_fp8_quantize_bf16(w, 2, 2, 2, 128, 128, 0, q, s), DTC_OK);
	assert_true(dtc_f32_bits(s[0]) == dtc_f32_bits(0x1.df595ap-23f));	/* torch: 1e-4/448 */
	assert_int_equal(q[0], 0x49);	/* 2^-20 * 4480 = 4.27 -> 4.5 */
	assert_int_equal(q[1], 0xc9);
	assert_int_equal(q[2], 0x00);
	assert_int_equal(q[3], 0x80);	/* -0 keeps its sign */
	w[0] = w[1] = 0;
	assert_int_equal(dtc_fp8_quantize_bf16(w, 2, 2, 2, 128, 128, 0, q, s), DTC_OK);
	assert_true(s[0] == 1e-4f / 448.0f);
}

/* 130 x 260 with 128x128 blocks: 2 x 3 scales, edge blocks 2 rows / 4
 * columns wide, each with its own amax; a leading dimension > cols. */
static void test_edge_blocks(void **state)
{
	enum { R = 130, C = 260, LD = 263, BR = 2, BC = 3 };
	uint16_t *w = calloc((size_t)R * LD, sizeof(*w));
	uint8_t *q = calloc((size_t)R * C, 1);
	float s[BR * BC];

	assert_non_null(w);
	assert_non_null(q);
	for (int r = 0; r < R; r++)
		for (int c = 0; c < LD; c++)
			w[r * LD + c] = bf((float)((r * 7 + c * 13) % 97 - 48) / 64.0f);
	/* A distinct maximum per block, and a huge value outside cols (in the
	 * ld padding) that must not count. */
	for (int b = 0; b < BR * BC; b++)
		w[(b / BC * 128 + (b / BC ? 1 : 5)) * LD + b % BC * 128 + (b % BC == 2 ? 3 : 9)] =
			bf((float)(b + 2));
	for (int r = 0; r < R; r++)
		w[r * LD + C + 1] = bf(1e30f);
	assert_int_equal(dtc_fp8_quantize_bf16(w, R, C, LD, 128, 128, 0, q, s), DTC_OK);
	for (int b = 0; b < BR * BC; b++)
		assert_true(s[b] == (float)(b + 2) / 448.0f);
	for (int r = 0; r < R; r++)
		for (int c = 0; c < C; c++) {
			float sf = s[r / 128 * BC + c / 128];

			assert_int_equal(q[r * C + c],
					 dtc_fp8_e4m3fn_from_f32(dtc_bf16_f32(w[r * LD + c]) * (1.0f / sf)));
		}
	/* Non-square blocks: [1, 128] is per-token-group along a row. */
	float s2[R * BC];

	assert_int_equal(dtc_fp8_quantize_bf16(w, R, C, LD, 1, 128, 0, q, s2), DTC_OK);
	assert_true(s2[5 * BC + 0] == 2.0f / 448.0f);
	free(w);
	free(q);
}

/* torch's amax propagates NaN: scale NaN (every code NaN); UE8M0 rounds
 * the NaN scale's bits to 2^127 (SGLang's ceil_to_ue8m0 on bits). */
static void test_nan_block(void **state)
{
	uint16_t w[4] = { bf(1.0f), 0x7fc0, bf(-2.0f), bf(0.5f) };
	uint8_t q[4];
	float s[1];

	assert_int_equal(dtc_fp8_quantize_bf16(w, 2, 2, 2, 128, 128, 0, q, s), DTC_OK);
	assert_true(isnan(s[0]));
	for (int i = 0; i < 4; i++)
		assert_int_equal(q[i] & 0x7f, 0x7f);
	assert_int_equal(dtc_fp8_quantize_bf16(w, 2, 2, 2, 128, 128, DTC_FP8_UE8M0, q, s), DTC_OK);
	assert_true(s[0] == 0x1p127f);
	assert_int_equal(q[0], 0x00);
	assert_int_equal(q[1] & 0x7f, 0x7f);
	/* vLLM's log2 form keeps the NaN scale; +Inf gives an Inf scale, so
	 * finite codes are ±0 and the Inf itself Inf * 0 = NaN. */
	assert_int_equal(dtc_fp8_quantize_bf16(w, 2, 2, 2, 128, 128, DTC_FP8_UE8M0_LOG2, q, s),
			 DTC_OK);
	assert_true(isnan(s[0]));
	for (int i = 0; i < 4; i++)
		assert_int_equal(q[i] & 0x7f, 0x7f);
	w[1] = 0x7f80;
	assert_int_equal(dtc_fp8_quantize_bf16(w, 2, 2, 2, 128, 128, DTC_FP8_UE8M0_LOG2, q, s),
			 DTC_OK);
	assert_true(isinf(s[0]));
	assert_int_equal(q[0], 0x00);
	assert_int_equal(q[1] & 0x7f, 0x7f);
	assert_int_equal(q[2], 0x80);
}

/* What the engines do after loading for DeepGEMM's UE8M0 kernels. */
static void test_requant(void **state)
{
	/* 130 x 5, [128, 128] blocks: rows 0..127 and the 2-row edge block. */
	enum { R = 130, C = 5 };
	uint8_t q[R * C], q2[R * C];
	float s[2] = { 3.0f / 448.0f, 0x1p-8f }, s2[2];

	for (int i = 0; i < R * C; i++)
		q[i] = (uint8_t)(i % 0x7e);
	q[7] = 0x7e;			/* the first block's max: 448 */
	q[128 * C + 1] = 0x7e;		/* and the edge block's */
	assert_int_equal(dtc_fp8_requant(q, s, R, C, 128, 128, DTC_FP8_UE8M0_LOG2, q2, s2),
			 DTC_OK);
	/* 448 * RN(3/448) / 448 rounds up to 2^-7: 448 -> 448 * (3/448) / 2^-7 = 384. */
	assert_true(s2[0] == 0x1p-7f);
	assert_int_equal(q2[7], 0x7c);
	/* A power-of-two scale with 448 in the block is a fixed point. */
	assert_true(s2[1] == 0x1p-8f);
	assert_memory_equal(q2 + 128 * C, q + 128 * C, 2 * C);
	/* In place gives the same. */
	uint8_t q3[R * C];
	float s3[2] = { s[0], s[1] };

	memcpy(q3, q, sizeof(q));
	assert_int_equal(dtc_fp8_requant(q3, s3, R, C, 128, 128, DTC_FP8_UE8M0_LOG2, q3, s3),
			 DTC_OK);
	assert_memory_equal(q3, q2, sizeof(q2));
	assert_memory_equal(s3, s2, sizeof(s2));
	assert_int_equal(dtc_fp8_requant(q, s, R, C, 128, 128,
					 DTC_FP8_UE8M0 | DTC_FP8_DEQUANT_BF16, q3, s3), DTC_OK);
	assert_true(s3[0] == 0x1p-7f && s3[1] == 0x1p-8f);
	assert_memory_equal(q3 + 128 * C, q + 128 * C, 2 * C);
	/* DEQUANT_BF16 means nothing to a quantizer of BF16. */
	uint16_t w[4] = { 0 };

	assert_int_equal(dtc_fp8_quantize_bf16(w, 2, 2, 2, 128, 128, DTC_FP8_DEQUANT_BF16, q3, s3),
			 DTC_EINVAL);
}

static void test_bad_arguments(void **state)
{
	uint16_t w[4] = { 0 };
	uint8_t q[4];
	float s[1] = { 7.0f };
	struct dtc_fp8_diff d;

	assert_int_equal(dtc_fp8_quantize_bf16(NULL, 2, 2, 2, 128, 128, 0, q, s), DTC_EINVAL);
	assert_int_equal(dtc_fp8_quantize_bf16(w, 2, 2, 2, 128, 128, 0, NULL, s), DTC_EINVAL);
	assert_int_equal(dtc_fp8_quantize_bf16(w, 2, 2, 2, 128, 128, 0, q, NULL), DTC_EINVAL);
	assert_int_equal(dtc_fp8_quantize_bf16(w, 2, 2, 2, 0, 128, 0, q, s), DTC_EINVAL);
	assert_int_equal(dtc_fp8_quantize_bf16(w, 2, 2, 1, 128, 128, 0, q, s), DTC_EINVAL);
	assert_int_equal(dtc_fp8_quantize_bf16(w, 2, 2, 2, 128, 128, 8, q, s), DTC_EINVAL);
	assert_int_equal(dtc_fp8_quantize_bf16(w, 2, 2, 2, 128, 128,
					       DTC_FP8_UE8M0 | DTC_FP8_UE8M0_LOG2, q, s), DTC_EINVAL);
	assert_int_equal(dtc_fp8_quantize_bf16(w, UINT64_MAX / 4, 8, 8, 128, 128, 0, q, s),
			 DTC_EINVAL);
	assert_true(s[0] == 7.0f);
	assert_int_equal(dtc_fp8_diff_bf16(w, w, 2, 2, 2, 128, 128, 0, NULL, NULL, NULL),
			 DTC_EINVAL);
	assert_int_equal(dtc_fp8_quantize_bf16(w, 0, 0, 0, 128, 128, 0, q, s), DTC_OK);
	assert_int_equal(dtc_fp8_diff_bf16(w, w, 0, 5, 5, 128, 128, 0, NULL, NULL, &d), DTC_OK);
	assert_int_equal(d.blocks, 0);
}

/* The diff against two full quantizations, for small random updates
 * (most blocks keep their amax) and ones that move a block's maximum. */
static void test_diff_matches_requantization(void **state)
{
	enum { R = 200, C = 300, N = R * C, NB = 2 * 3 };
	uint16_t *a = malloc(N * sizeof(*a)), *b = malloc(N * sizeof(*b));
	uint8_t *qa = malloc(N), *qb = malloc(N), sc[NB];
	uint64_t bits[(N + 63) / 64];
	float sa[NB], sb[NB];
	uint64_t x = 1;

	assert_true(a && b && qa && qb);
	for (unsigned flags = 0; flags <= DTC_FP8_FLAGS_ALL; flags++) {
		if ((flags & DTC_FP8_UE8M0) && (flags & DTC_FP8_UE8M0_LOG2))
			continue;
		for (int i = 0; i < N; i++) {
			x = dtc_mix64(x + (uint64_t)i);
			a[i] = bf(((float)(x % 20001) - 10000.0f) * 1e-6f);
			/* ~2% move by one BF16 ulp; a handful become a new block max. */
			b[i] = x % 50 == 0 ? (uint16_t)(a[i] + 1) : a[i];
			if (x % 20011 == 0)
				b[i] = bf(0.02f);
		}
		struct dtc_fp8_diff d;

		assert_int_equal(dtc_fp8_diff_bf16(a, b, R, C, C, 128, 128, flags, bits, sc, &d),
				 DTC_OK);
		assert_int_equal(dtc_fp8_quantize_bf16(a, R, C, C, 128, 128, flags, qa, sa), DTC_OK);
		assert_int_equal(dtc_fp8_quantize_bf16(b, R, C, C, 128, 128, flags, qb, sb), DTC_OK);
		uint64_t codes = 0, bf16 = 0, scales = 0;

		for (int i = 0; i < N; i++) {
			int ch = qa[i] != qb[i];

			codes += ch;
			bf16 += a[i] != b[i];
			assert_int_equal(!!(bits[i / 64] >> (i % 64) & 1), ch);
		}
		for (int k = 0; k < NB; k++) {
			int ch = dtc_f32_bits(sa[k]) != dtc_f32_bits(sb[k]);

			scales += ch;
			assert_int_equal(sc[k], ch);
		}
		assert_int_equal(d.codes_changed, codes);
		assert_int_equal(d.bf16_changed, bf16);
		assert_int_equal(d.scales_changed, scales);
		assert_int_equal(d.blocks, NB);
		assert_true(d.codes_changed > 0);
	}
	free(a);
	free(b);
	free(qa);
	free(qb);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_conversion_vectors),
		cmocka_unit_test(test_round_trip_and_midpoints),
		cmocka_unit_test(test_ceil_ue8m0),
		cmocka_unit_test(test_partial_block),
		cmocka_unit_test(test_tiny_block_clamp),
		cmocka_unit_test(test_edge_blocks),
		cmocka_unit_test(test_nan_block),
		cmocka_unit_test(test_requant),
		cmocka_unit_test(test_bad_arguments),
		cmocka_unit_test(test_diff_matches_requantization),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

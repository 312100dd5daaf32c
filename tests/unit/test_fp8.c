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

/* ------------------------------------------------ snapshot-free detect */

static uint64_t rng_state = 7;

static double unif(void)
{
	rng_state = dtc_mix64(rng_state + 0x9e3779b97f4a7c15ull);
	return ((double)(rng_state >> 11) + 0.5) * 0x1p-53;
}

static double gauss(void)
{
	return sqrt(-2.0 * log(unif())) * cos(6.283185307179586 * unif());
}

static void derive(struct dtc_consts *k, int variant, double lr, int64_t step)
{
	struct dtc_hparams hp = { lr, 0.9, 0.999, 1e-8, 0.01, step, variant };
	char why[128];

	assert_int_equal(dtc_hparams_derive(&hp, k, why, sizeof(why)), DTC_OK);
}

static void to_bf16(const float *th, uint16_t *b, int n)
{
	for (int i = 0; i < n; i++)
		b[i] = dtc_bf16_rne(th[i]);
}

struct det_tally {
	uint64_t steps, codes_true, scales_true, flagged, whole, fn_codes, fn_scales;
	uint64_t delta_bytes, dense_bytes, dense_steps, caught;
};

/* Simulated AdamW steps (elem.h's forward) on a matrix with partial edge
 * blocks and outliers that move block maxima: every code that changed
 * must be flagged or in a whole block, every block whose scale changed
 * must be whole, and the delta payload applied to the old FP8 must give
 * exactly the engine's quantization of the new BF16. */
static void run_detect(int variant, double lr, unsigned flags, struct det_tally *t)
{
	enum { R = 200, C = 300, N = R * C, NB = 2 * 3, STEPS = 5 };
	float *th = malloc(N * sizeof(float)), *m = calloc(N, sizeof(float));
	float *v = calloc(N, sizeof(float)), *prev = malloc(N * sizeof(float));
	uint16_t *bo = malloc(N * sizeof(uint16_t)), *bn = malloc(N * sizeof(uint16_t));
	uint8_t *qs = malloc(N), *qn = malloc(N), *out, sc[NB], whole[NB];
	uint64_t truth[(N + 63) / 64], flagged[(N + 63) / 64];
	float ss[NB], sn[NB];
	size_t cap = dtc_fp8_delta_bound(R, C, 128, 128, NB, N), len;

	out = malloc(cap);
	assert_true(th && m && v && prev && bo && bn && qs && qn && out);
	for (int i = 0; i < N; i++)
		th[i] = (float)(gauss() * (i % 499 == 0 ? 0.08 : 0.02));
	for (int t0 = 1; t0 <= STEPS; t0++) {
		struct dtc_consts k;
		struct dtc_fp8_diff d;
		struct dtc_fp8_detect det;

		derive(&k, variant, lr, t0);
		memcpy(prev, th, N * sizeof(float));
		for (int i = 0; i < N; i++) {
			/* outliers' gradients are large: their block's amax moves */
			float g = (float)(gauss() * 1e-3 * (i % 499 == 0 ? 100.0 : 1.0));

			m[i] = 0.9f * m[i] + 0.1f * g;
			v[i] = 0.999f * v[i] + 0.001f * g * g;
			th[i] = dtc_adamw_forward(&k, prev[i], m[i], v[i]);
		}
		to_bf16(prev, bo, N);
		to_bf16(th, bn, N);
		assert_int_equal(dtc_fp8_diff_bf16(bo, bn, R, C, C, 128, 128, flags, truth, sc, &d),
				 DTC_OK);
		assert_int_equal(dtc_fp8_detect_adamw(&k, th, m, v, R, C, C, 128, 128, flags,
						      flagged, whole, &det), DTC_OK);
		assert_int_equal(det.blocks, NB);
		for (int b = 0; b < NB; b++)
			t->fn_scales += sc[b] && !whole[b];
		for (int i = 0; i < N; i++) {
			int blk = (i / C / 128) * 3 + (i % C) / 128;
			int fl = (int)(flagged[i / 64] >> (i % 64) & 1);

			t->fn_codes += (truth[i / 64] >> (i % 64) & 1) && !fl && !whole[blk];
			assert_false(fl && whole[blk]);	/* bits only outside whole blocks */
		}
		t->codes_true += d.codes_changed;
		t->scales_true += d.scales_changed;
		t->flagged += det.codes;
		t->whole += det.whole;
		t->steps++;

		/* The sink: the engine's FP8 of the old BF16, then the delta. */
		uint64_t nc, nw;

		assert_int_equal(dtc_fp8_quantize_bf16(bo, R, C, C, 128, 128, flags, qs, ss), DTC_OK);
		assert_int_equal(dtc_fp8_quantize_bf16(bn, R, C, C, 128, 128, flags, qn, sn), DTC_OK);
		assert_int_equal(dtc_fp8_delta_encode(bn, R, C, C, 128, 128, flags, flagged, whole,
						      out, cap, &len), DTC_OK);
		/* the undo, taken before the apply */
		uint8_t *undo = malloc(len), *q0 = malloc(N);
		float s0[NB];
		uint64_t sm, sp;

		assert_true(undo && q0);
		memcpy(q0, qs, N);
		memcpy(s0, ss, sizeof(s0));
		assert_int_equal(dtc_fp8_delta_invert(out, len, R, C, C, 128, 128, qs, ss, undo, len),
				 DTC_OK);
		assert_int_equal(dtc_fp8_delta_apply(out, len, R, C, C, 128, 128, qs, ss, &nc, &nw),
				 DTC_OK);
		/* the verify reads memory: equal after the apply ... */
		assert_int_equal(dtc_fp8_delta_csum(out, len, R, C, C, 128, 128, qs, ss, &sm, &sp),
				 DTC_OK);
		assert_true(sm == sp);
		if (nc + nw) {
			/* ... and not with one write undone (a code, or a scale) */
			uint8_t *undone = malloc(N);

			assert_non_null(undone);
			memcpy(undone, qs, N);
			for (int i = 0; i < N; i++)
				if (undone[i] != q0[i]) {
					undone[i] = q0[i];
					break;
				}
			if (memcmp(undone, qs, N)) {
				assert_int_equal(dtc_fp8_delta_csum(out, len, R, C, C, 128, 128, undone,
								    ss, &sm, &sp), DTC_OK);
				assert_true(sm != sp);
				t->caught++;
			}
			free(undone);
		}
		/* the undo restores the old FP8 bit for bit, then the delta again */
		assert_int_equal(dtc_fp8_delta_apply(undo, len, R, C, C, 128, 128, qs, ss, NULL, NULL),
				 DTC_OK);
		assert_memory_equal(qs, q0, N);
		assert_memory_equal(ss, s0, sizeof(s0));
		assert_int_equal(dtc_fp8_delta_apply(out, len, R, C, C, 128, 128, qs, ss, NULL, NULL),
				 DTC_OK);
		free(undo);
		free(q0);
		if (nc == 0 && nw == NB) {	/* dense: the sparse form would not be smaller */
			t->dense_steps++;
		} else {
			assert_int_equal(nc, det.codes);
			assert_int_equal(nw, det.whole);
		}
		assert_true(len <= N + 5 * NB + 2);	/* never more than dense */
		assert_memory_equal(qs, qn, N);
		for (int b = 0; b < NB; b++)
			assert_int_equal(dtc_f32_bits(ss[b]), dtc_f32_bits(sn[b]));
		t->delta_bytes += len;
		t->dense_bytes += N + 4 * NB;
	}
	free(th);
	free(m);
	free(v);
	free(prev);
	free(bo);
	free(bn);
	free(qs);
	free(qn);
	free(out);
}

static void test_detect_adamw(void **state)
{
	static const unsigned fl[] = { 0, DTC_FP8_UE8M0, DTC_FP8_UE8M0_LOG2, DTC_FP8_SCALE_RECIP };
	static const double lrs[] = { 1e-6, 1e-5, 1e-4, 1e-3 };

	(void)state;
	for (int variant = DTC_VARIANT_TORCH; variant <= DTC_VARIANT_FUSED; variant++) {
		for (unsigned f = 0; f < sizeof(fl) / sizeof(fl[0]); f++) {
			struct det_tally all = { 0 };

			for (unsigned l = 0; l < sizeof(lrs) / sizeof(lrs[0]); l++) {
				struct det_tally t = { 0 };

				run_detect(variant, lrs[l], fl[f], &t);
				print_message("variant=%d flags=%u lr=%g codes=%llu flagged=%llu "
					      "scales=%llu whole=%llu bytes=%llu dense=%llu dense_steps=%llu\n",
					      variant, fl[f], lrs[l], (unsigned long long)t.codes_true,
					      (unsigned long long)t.flagged,
					      (unsigned long long)t.scales_true,
					      (unsigned long long)t.whole,
					      (unsigned long long)t.delta_bytes,
					      (unsigned long long)t.dense_bytes,
					      (unsigned long long)t.dense_steps);
				assert_int_equal(t.fn_codes, 0);
				assert_true(t.caught > 0);	/* the skipped write was tried */
				assert_int_equal(t.fn_scales, 0);
				/* few false alarms: at most twice the true changes, plus one per step */
				assert_true(t.flagged <= 2 * t.codes_true + t.steps);
				all.codes_true += t.codes_true;
				all.scales_true += t.scales_true;
			}
			/* the simulation exercises both kinds of change */
			assert_true(all.codes_true > 0);
			assert_true(all.scales_true > 0 || (fl[f] & (DTC_FP8_UE8M0 | DTC_FP8_UE8M0_LOG2)));
		}
	}
}

/* Values planted where the guard is all that stands between the detect
 * and a miss: θ_{t-1} within a few FP32 ulps of the midpoint of two BF16
 * values whose FP8 codes differ (one block, scale 2^-8 pinned by a 1.75
 * that does not move), with steps of a few ulps.  A trap is an element
 * whose reconstruction θ̂ rounds to the new code while θ_{t-1} had
 * another: without the guard's width the detect misses exactly those. */
static void test_detect_guard_traps(void **state)
{
	enum { R = 128, C = 128, N = R * C };
	float *th = malloc(N * sizeof(float)), *m = malloc(N * sizeof(float));
	float *v = malloc(N * sizeof(float)), *prev = malloc(N * sizeof(float));
	uint64_t flagged[N / 64];
	uint8_t whole;
	uint64_t traps = 0, missed = 0, changed = 0;

	(void)state;
	assert_true(th && m && v && prev);
	for (int variant = DTC_VARIANT_TORCH; variant <= DTC_VARIANT_FUSED; variant++) {
		for (int l = 0; l < 3; l++) {
			struct dtc_consts k;
			struct dtc_fp8_detect det;
			double lr = l == 0 ? 1e-6 : l == 1 ? 1e-4 : 1e-3;

			derive(&k, variant, lr, 3);
			for (int i = 0; i < N; i++) {
				/* BF16 pair (1 + (8 + 2q)/128)·2^-8 and the next: its FP8 codes
				 * (x·256, step 1/8) differ; q picks one of 4 such pairs */
				int q = (i >> 3) & 3, j = (i & 7) - 4, s = (i >> 5) % 97;
				float mid = (1.0f + (8.5f + 16.0f * (float)q) / 128.0f) * 0x1p-8f;

				prev[i] = dtc_bits_f32((uint32_t)((int32_t)dtc_f32_bits(mid) + j));
				if (i & 0x1000)
					prev[i] = -prev[i];
				/* a step of a few ulps either way: m from s, v fixed */
				m[i] = ((float)s - 48.0f) * 1e-12f;
				v[i] = 1e-20f;
			}
			prev[0] = 1.75f;	/* the block's amax: scale 1.75/448 = 2^-8 */
			m[0] = 0.0f;
			v[0] = 0.0f;
			for (int i = 0; i < N; i++)
				th[i] = dtc_adamw_forward(&k, prev[i], m[i], v[i]);
			/* decay moves the FP32 1.75 a little, never its BF16 */
			assert_int_equal(dtc_bf16_rne(th[0]), dtc_bf16_rne(1.75f));
			assert_int_equal(dtc_fp8_detect_adamw(&k, th, m, v, R, C, C, 128, 128, 0,
							      flagged, &whole, &det), DTC_OK);
			assert_int_equal(whole, 0);	/* the scale is pinned */
			float rs = 1.0f / dtc_fp8_block_scale(dtc_fabsf(dtc_bf16_f32(dtc_bf16_rne(th[0]))), 0);

			for (int i = 1; i < N; i++) {
				uint8_t qo = dtc_fp8_code(dtc_bf16_rne(prev[i]), rs);
				uint8_t qn = dtc_fp8_code(dtc_bf16_rne(th[i]), rs);
				float u = dtc_adamw_u(&k, m[i], v[i]);
				uint8_t qh = dtc_fp8_code(dtc_bf16_rne(dtc_adamw_prev(&k, th[i], u)), rs);
				int fl = (int)(flagged[i / 64] >> (i % 64) & 1);

				changed += qo != qn;
				traps += qo != qn && qh == qn;
				missed += qo != qn && !fl && !whole;
			}
		}
	}
	print_message("planted: changed=%llu traps=%llu missed=%llu\n",
		      (unsigned long long)changed, (unsigned long long)traps,
		      (unsigned long long)missed);
	assert_true(traps > 0);		/* the planting reaches the guard */
	assert_int_equal(missed, 0);
	free(th);
	free(m);
	free(v);
	free(prev);
}

/* A payload that the decoder must refuse, with the sink left as it was. */
/* What a source sends an FP8 sink (dtc_fp8_box_units): the 16-bit
 * units of a strided element box are the engine's codes two to a unit
 * and its scales' halves, exactly as dtc_fp8_quantize_bf16 of RNE(θ)
 * gives them, whether the rows are read in place or gathered (a
 * transposed source); and after real AdamW steps every unit that changed
 * is flagged (a code's unit, a whole block's every unit and its scale). */
static void test_box_units(void **state)
{
	enum { R = 300, C = 260, LD = 301, OFF = 7, NB = 3 * 3, NU = R * C / 2 };
	static const unsigned flag_sets[] = { 0, DTC_FP8_UE8M0 };
	const size_t n = OFF + (size_t)R * LD;
	float *th = malloc(n * sizeof(float)), *m = calloc(n, sizeof(float));
	float *v = calloc(n, sizeof(float)), *tt = malloc(n * sizeof(float));
	uint16_t *w = malloc((size_t)R * C * 2), *u0 = malloc(NU * 2), *u1 = malloc(NU * 2);
	uint16_t s0[2 * NB], s1[2 * NB];
	uint8_t *q = malloc((size_t)R * C);
	uint64_t cchg[(NU + 63) / 64], schg[(2 * NB + 63) / 64];
	float sc[NB];
	uint64_t changed = 0, units_changed = 0;

	(void)state;
	assert_true(th && m && v && tt && w && u0 && u1 && q);
	for (size_t i = 0; i < n; i++)
		th[i] = (float)(gauss() * (i % 311 == 0 ? 0.06 : 0.015));
	for (size_t f = 0; f < sizeof(flag_sets) / sizeof(*flag_sets); f++) {
		unsigned flags = flag_sets[f];
		const int64_t rows_st[2] = { LD, 1 }, cols_st[2] = { 1, R };

		/* in place: rows of LD, from OFF */
		assert_int_equal(dtc_fp8_box_units(NULL, th, NULL, NULL, n, OFF, rows_st, R, C, flags,
						   u0, s0, NULL, NULL, NULL), DTC_OK);
		for (int r = 0; r < R; r++)
			for (int c = 0; c < C; c++)
				w[r * C + c] = dtc_bf16_rne(th[OFF + r * LD + c]);
		assert_int_equal(dtc_fp8_quantize_bf16(w, R, C, C, 128, 128, flags, q, sc), DTC_OK);
		for (int i = 0; i < NU; i++)
			assert_int_equal(u0[i], q[2 * i] | q[2 * i + 1] << 8);
		for (int b = 0; b < NB; b++) {
			assert_int_equal(s0[2 * b], dtc_f32_bits(sc[b]) & 0xffff);
			assert_int_equal(s0[2 * b + 1], dtc_f32_bits(sc[b]) >> 16);
		}
		/* gathered: the same box stored column-major */
		for (int r = 0; r < R; r++)
			for (int c = 0; c < C; c++)
				tt[c * R + r] = th[OFF + r * LD + c];
		assert_int_equal(dtc_fp8_box_units(NULL, tt, NULL, NULL, n, 0, cols_st, R, C, flags,
						   u1, s1, NULL, NULL, NULL), DTC_OK);
		assert_memory_equal(u0, u1, NU * 2);
		assert_memory_equal(s0, s1, sizeof(s0));
		/* AdamW steps: nothing that changed goes unflagged */
		for (int t0 = 1; t0 <= 4; t0++) {
			struct dtc_consts k;
			struct dtc_fp8_detect det = { 0 };

			derive(&k, DTC_VARIANT_TORCH, t0 % 2 ? 1e-3 : 1e-5, t0);
			assert_int_equal(dtc_fp8_box_units(NULL, th, NULL, NULL, n, OFF, rows_st, R, C,
							   flags, u0, s0, NULL, NULL, NULL), DTC_OK);
			for (size_t i = 0; i < n; i++) {
				float g = (float)(gauss() * 1e-3 * (i % 311 == 0 ? 100.0 : 1.0));

				m[i] = 0.9f * m[i] + 0.1f * g;
				v[i] = 0.999f * v[i] + 0.001f * g * g;
				th[i] = dtc_adamw_forward(&k, th[i], m[i], v[i]);
			}
			assert_int_equal(dtc_fp8_box_units(&k, th, m, v, n, OFF, rows_st, R, C, flags,
							   u1, s1, cchg, schg, &det), DTC_OK);
			assert_int_equal(det.blocks, NB);
			for (int i = 0; i < NU; i++) {
				int fl = (int)(cchg[i / 64] >> (i % 64) & 1);

				changed += u0[i] != u1[i];
				units_changed += fl;
				if (u0[i] != u1[i] && !fl)
					fail_msg("flags %u step %d: code unit %d changed, not flagged", flags,
						 t0, i);
			}
			for (int i = 0; i < 2 * NB; i++)
				if (s0[i] != s1[i] && !(schg[i / 64] >> (i % 64) & 1))
					fail_msg("flags %u step %d: scale unit %d changed, not flagged",
						 flags, t0, i);
		}
	}
	assert_true(changed > 0 && units_changed >= changed);
	print_message("box-units: changed=%llu flagged=%llu\n", (unsigned long long)changed,
		      (unsigned long long)units_changed);
	/* odd columns, a map leaving θ, flags that conflict */
	{
		const int64_t st[2] = { LD, 1 };

		assert_int_equal(dtc_fp8_box_units(NULL, th, NULL, NULL, n, OFF, st, R, C - 1, 0, u0,
						   s0, NULL, NULL, NULL), DTC_EINVAL);
		assert_int_equal(dtc_fp8_box_units(NULL, th, NULL, NULL, OFF + (R - 1) * LD + C - 1,
						   OFF, st, R, C, 0, u0, s0, NULL, NULL, NULL), DTC_EBOX);
		assert_int_equal(dtc_fp8_box_units(NULL, th, NULL, NULL, n, OFF, st, R, C,
						   DTC_FP8_UE8M0 | DTC_FP8_UE8M0_LOG2, u0, s0, NULL,
						   NULL, NULL), DTC_EINVAL);
	}
	free(th);
	free(m);
	free(v);
	free(tt);
	free(w);
	free(u0);
	free(u1);
	free(q);
}

static void expect_refused(const uint8_t *in, size_t len, int want)
{
	enum { R = 130, C = 140, NB = 4 };
	uint8_t codes[R * C], before[R * C];
	float scales[NB], sbefore[NB];

	for (int i = 0; i < R * C; i++)
		codes[i] = before[i] = (uint8_t)(i * 7);
	for (int b = 0; b < NB; b++)
		scales[b] = sbefore[b] = (float)b + 0.5f;
	int rc = dtc_fp8_delta_apply(in, len, R, C, C, 128, 128, codes, scales, NULL, NULL);

	if (want)
		assert_int_equal(rc, want);
	else
		assert_true(rc < 0);
	assert_memory_equal(codes, before, sizeof(codes));
	assert_memory_equal(scales, sbefore, sizeof(scales));
}

static void test_delta_hostile(void **state)
{
	enum { R = 130, C = 140, N = R * C, NB = 4 };
	uint16_t w[N];
	uint64_t changed[(N + 63) / 64] = { 0 };
	uint8_t whole[NB] = { 0, 1, 0, 0 }, buf[N * 2], bad[N * 2];
	size_t len;

	(void)state;
	for (int i = 0; i < N; i++)
		w[i] = dtc_bf16_rne((float)(i % 101) * 1e-3f - 0.05f);
	changed[0] = 0x8001;			/* (0,0) and (0,15): block 0 */
	changed[(129 * C + 139) / 64] |= UINT64_C(1) << ((129 * C + 139) % 64);	/* block 3 */
	changed[(5 * C + 130) / 64] |= UINT64_C(1) << ((5 * C + 130) % 64);	/* in whole block 1: ignored */
	assert_int_equal(dtc_fp8_delta_encode(w, R, C, C, 128, 128, 0, changed, whole, buf,
					      sizeof(buf), &len), DTC_OK);
	/* 1 + 1 (block 1) + 1 + 3 gap codes (the last a long one) + 4 +
	 * 128 x 12 block codes + 3 codes */
	assert_int_equal(len, 1 + 1 + 1 + 1 + 1 + 4 + 4 + 128 * 12 + 3);
	for (size_t l = 0; l < len; l++) {
		static uint8_t inv[N * 2], mc[N];
		static float ms[NB];
		uint64_t a, b;

		expect_refused(buf, l, 0);	/* every truncation */
		assert_true(dtc_fp8_delta_invert(buf, l, R, C, C, 128, 128, mc, ms, inv,
						 sizeof(inv)) < 0);
		assert_true(dtc_fp8_delta_csum(buf, l, R, C, C, 128, 128, mc, ms, &a, &b) < 0);
	}
	memcpy(bad, buf, len);
	bad[len] = 0;
	expect_refused(bad, len + 1, DTC_ECORRUPT);	/* a trailing byte */
	memcpy(bad, buf, len);
	bad[0] = 5;				/* more whole blocks than the grid has */
	expect_refused(bad, len, DTC_ECORRUPT);
	bad[0] = 1;
	bad[1] = 4;				/* block index 4 of 4 */
	expect_refused(bad, len, DTC_ERANGE);
	bad[1] = 1;
	bad[4] = 0x7f;				/* second code jumps into whole block 1 */
	expect_refused(bad, len, DTC_ECORRUPT);
	memcpy(bad, buf, len);
	bad[5] = 0xC0;				/* a gap escape */
	bad[6] = 0x05;				/* ... of a gap that has a shorter form */
	expect_refused(bad, len, DTC_ECORRUPT);
	memcpy(bad, buf, len);
	bad[5] = 0xC1;				/* no such gap form */
	expect_refused(bad, len, DTC_ECORRUPT);

	/* and the untouched payload applies: 3 codes, 1 block */
	uint8_t codes[N] = { 0 };
	float scales[NB] = { 0 };
	uint64_t nc, nw;

	assert_int_equal(dtc_fp8_delta_apply(buf, len, R, C, C, 128, 128, codes, scales, &nc, &nw),
			 DTC_OK);
	assert_int_equal(nc, 3);
	assert_int_equal(nw, 1);
	assert_true(scales[1] > 0.0f && scales[0] == 0.0f);
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
		cmocka_unit_test(test_detect_adamw),
		cmocka_unit_test(test_detect_guard_traps),
		cmocka_unit_test(test_delta_hostile),
		cmocka_unit_test(test_box_units),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

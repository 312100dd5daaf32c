/* test_job_snapshot: snapshot-diff detection flags exactly the box
 * positions whose BF16 changed since the kept version, through strided
 * maps; first use flags all; bad input is refused with nothing written. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "daemon/job_snapshot.h"
#include "gpu/backend.h"
#include "gpu/elem.h"

#define ROWS 7
#define COLS 100

/* A transposed 2-D box: box position (r, c) reads param[c * ROWS + r]. */
static struct dte_box_map transposed(void)
{
	struct dte_box_map e;

	memset(&e, 0, sizeof(e));
	e.ndim = 2;
	e.extent[0] = ROWS;
	e.extent[1] = COLS;
	e.src_stride[0] = 1;
	e.src_stride[1] = ROWS;
	e.dst_stride[0] = COLS;
	e.dst_stride[1] = 1;
	return e;
}

static uint64_t popcount(const uint64_t *b, uint64_t w)
{
	uint64_t n = 0;

	for (uint64_t i = 0; i < w; i++)
		n += (uint64_t)__builtin_popcountll(b[i]);
	return n;
}

static void test_first_scan_flags_all(void **state)
{
	struct dte_box_map e = transposed();
	float param[ROWS * COLS];
	uint64_t words = dtc_bitmap_words(&e), bm[16] = { 0 }, cnt = 0;
	struct jsnap s = { 0 };

	for (int i = 0; i < ROWS * COLS; i++)
		param[i] = 0.01f * (float)i;
	assert_true(words <= 16);
	assert_int_equal(jsnap_scan(&s, dtc_backend_cpu(), &e, param, ROWS * COLS, bm, words, &cnt),
			 DTC_OK);
	assert_int_equal(cnt, ROWS * COLS);
	assert_int_equal(popcount(bm, words), ROWS * COLS);
	/* Nothing changed: a second scan adds nothing. */
	memset(bm, 0, sizeof(bm));
	assert_int_equal(jsnap_scan(&s, dtc_backend_cpu(), &e, param, ROWS * COLS, bm, words, &cnt),
			 DTC_OK);
	assert_int_equal(cnt, 0);
	jsnap_fini(&s);
	assert_null(s.vals);
}

static void test_exact_changes(void **state)
{
	const struct dtc_backend *cpu = dtc_backend_cpu();
	struct dte_box_map e = transposed();
	float param[ROWS * COLS];
	uint64_t words = dtc_bitmap_words(&e), bm[16] = { 0 }, cnt = 0, pos[8], n = 0;
	uint16_t val[8];
	struct jsnap s = { 0 };
	/* src indices changed past a BF16 step, and one changed below it */
	const int big[3] = { 0, 123, ROWS * COLS - 1 };
	const int tiny = 77;

	for (int i = 0; i < ROWS * COLS; i++)
		param[i] = 1.0f + 0.001f * (float)i;
	assert_int_equal(jsnap_scan(&s, cpu, &e, param, ROWS * COLS, bm, words, NULL), DTC_OK);
	memset(bm, 0, sizeof(bm));
	for (int k = 0; k < 3; k++)
		param[big[k]] *= 1.5f;
	param[tiny] += 1e-6f;	/* far below half a BF16 ulp of ~1.08 */
	assert_int_equal(jsnap_scan(&s, cpu, &e, param, ROWS * COLS, bm, words, &cnt), DTC_OK);
	assert_int_equal(cnt, 3);
	assert_int_equal(dtc_sparse_from_bitmap(cpu, &e, bm, words, param, ROWS * COLS, pos, val, 8,
						&n), DTC_OK);
	assert_int_equal(n, 3);
	for (uint64_t i = 0; i < n; i++) {
		/* box positions are row-major: p = r * COLS + c reads src c * ROWS + r */
		uint64_t r = pos[i] / COLS, c = pos[i] % COLS;
		int src = (int)(c * ROWS + r), hit = 0;

		for (int k = 0; k < 3; k++)
			hit |= src == big[k];
		assert_true(hit);
		assert_int_equal(val[i], dtc_bf16_rne(param[src]));
	}
	/* Changed and changed back between scans: the kept version is the
	 * one compared, so nothing is flagged. */
	memset(bm, 0, sizeof(bm));
	param[5] *= 3.0f;
	param[5] /= 3.0f;
	assert_int_equal(jsnap_scan(&s, cpu, &e, param, ROWS * COLS, bm, words, &cnt), DTC_OK);
	assert_int_equal(cnt, 0);
	jsnap_fini(&s);
}

static void test_keep_then_scan(void **state)
{
	struct dte_box_map e = transposed();
	float param[ROWS * COLS];
	uint16_t vals[ROWS * COLS];
	uint64_t words = dtc_bitmap_words(&e), bm[16] = { 0 }, cnt = 0;
	struct jsnap s = { 0 };

	for (int i = 0; i < ROWS * COLS; i++)
		param[i] = -2.0f + 0.003f * (float)i;
	/* A dense capture sent these values: keep them. */
	assert_int_equal(dtc_dense_extract(dtc_backend_cpu(), &e, param, ROWS * COLS, vals), DTC_OK);
	assert_int_equal(jsnap_keep(&s, vals, ROWS * COLS), DTC_OK);
	param[42] = 100.0f;
	assert_int_equal(jsnap_scan(&s, dtc_backend_cpu(), &e, param, ROWS * COLS, bm, words, &cnt),
			 DTC_OK);
	assert_int_equal(cnt, 1);
	/* src 42 = (r 0, c 6) -> box position r * COLS + c = 6 */
	assert_true(bm[0] == 1ull << 6);
	assert_int_equal(jsnap_keep(&s, vals, ROWS * COLS), DTC_OK);
	jsnap_fini(&s);
}

/* The fast path: a sub-box of contiguous rows that start off word
 * boundaries (rows of BW elements in a source of row length BW + 3), large
 * enough to be split over threads, with NaN, Inf, ties and values past the
 * BF16 maximum; the bitmap and the kept values must be what a scalar
 * dtc_bf16_rne comparison gives, every element. */
#define BH 1111
#define BW 1001
#define SW (BW + 3)
static void test_fast_path_matches_scalar(void **state)
{
	const struct dtc_backend *cpu = dtc_backend_cpu();
	struct dte_box_map e;
	uint64_t n = (uint64_t)BH * BW, words, cnt = 0, want = 0;
	float *p = malloc((size_t)BH * SW * sizeof(*p));
	uint16_t *ref = malloc(n * sizeof(*ref));
	uint64_t *bm, *wbm;
	struct jsnap s = { 0 };

	memset(&e, 0, sizeof(e));
	e.ndim = 2;
	e.extent[0] = BH;
	e.extent[1] = BW;
	e.src_offset = 2;
	e.src_stride[0] = SW;
	e.src_stride[1] = 1;
	e.dst_stride[0] = BW;
	e.dst_stride[1] = 1;
	words = dtc_bitmap_words(&e);
	bm = calloc(words, sizeof(*bm));
	wbm = calloc(words, sizeof(*wbm));
	assert_non_null(p);
	assert_non_null(ref);
	assert_non_null(bm);
	assert_non_null(wbm);
	for (uint64_t i = 0; i < (uint64_t)BH * SW; i++)
		p[i] = (float)((double)(dtc_mix64(i) >> 11) / 9007199254740992.0 - 0.5);
	assert_int_equal(jsnap_scan(&s, cpu, &e, p, (uint64_t)BH * SW, bm, words, &cnt), DTC_OK);
	assert_int_equal(cnt, n);
	for (uint64_t r = 0; r < BH; r++)
		for (uint64_t c = 0; c < BW; c++)
			ref[r * BW + c] = dtc_bf16_rne(p[2 + r * SW + c]);
	assert_memory_equal(s.vals, ref, n * sizeof(*ref));
	/* A step: small moves (some cross a rounding boundary), and specials. */
	for (uint64_t i = 0; i < (uint64_t)BH * SW; i++) {
		uint64_t h = dtc_mix64(i ^ 0x5eed);

		p[i] *= (h & 1) ? 1.0f + 2e-3f : 1.0f - 1e-4f;
		switch (h % 9973) {
		case 1: p[i] = __builtin_nanf(""); break;
		case 2: p[i] = -__builtin_inff(); break;
		case 3: p[i] = 3.3961e38f; break;			/* rounds to Inf */
		case 4: p[i] = dtc_bits_f32(0x3f808000u); break;	/* a tie, even */
		case 5: p[i] = dtc_bits_f32(0x3f818000u); break;	/* a tie, odd */
		case 6: p[i] = dtc_bits_f32(0x7f800001u); break;	/* a signalling NaN */
		default: break;
		}
	}
	memset(bm, 0, words * sizeof(*bm));
	for (uint64_t r = 0; r < BH; r++) {
		for (uint64_t c = 0; c < BW; c++) {
			uint64_t q = r * BW + c;
			uint16_t b = dtc_bf16_rne(p[2 + r * SW + c]);

			if (b != ref[q]) {
				wbm[q >> 6] |= 1ull << (q & 63);
				want++;
			}
			ref[q] = b;
		}
	}
	assert_true(want > n / 100 && want < n);
	assert_int_equal(jsnap_scan(&s, cpu, &e, p, (uint64_t)BH * SW, bm, words, &cnt), DTC_OK);
	assert_int_equal(cnt, want);
	assert_memory_equal(bm, wbm, words * sizeof(*bm));
	assert_memory_equal(s.vals, ref, n * sizeof(*ref));
	jsnap_fini(&s);
	free(p);
	free(ref);
	free(bm);
	free(wbm);
}

static void test_bad_input(void **state)
{
	struct dte_box_map e = transposed();
	float param[ROWS * COLS] = { 0 };
	uint64_t bm[16], cnt = 99;
	struct jsnap s = { 0 };

	memset(bm, 0xa5, sizeof(bm));
	/* The box reaches past the buffer. */
	assert_int_equal(jsnap_scan(&s, dtc_backend_cpu(), &e, param, ROWS * COLS - 1, bm, 16, &cnt),
			 DTC_EBOX);
	/* A bitmap too short for the box. */
	assert_int_equal(jsnap_scan(&s, dtc_backend_cpu(), &e, param, ROWS * COLS, bm, 1, &cnt),
			 DTC_EINVAL);
	assert_int_equal(jsnap_scan(NULL, dtc_backend_cpu(), &e, param, ROWS * COLS, bm, 16, &cnt),
			 DTC_EINVAL);
	e.extent[1] = 0;
	assert_int_equal(jsnap_scan(&s, dtc_backend_cpu(), &e, param, ROWS * COLS, bm, 16, &cnt),
			 DTC_EINVAL);
	for (int i = 0; i < 16; i++)
		assert_true(bm[i] == 0xa5a5a5a5a5a5a5a5ull);
	assert_int_equal(cnt, 99);
	assert_null(s.vals);
	assert_int_equal(jsnap_keep(&s, NULL, 4), DTC_EINVAL);
	jsnap_fini(&s);
	jsnap_fini(NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_first_scan_flags_all),
		cmocka_unit_test(test_exact_changes),
		cmocka_unit_test(test_keep_then_scan),
		cmocka_unit_test(test_fast_path_matches_scalar),
		cmocka_unit_test(test_bad_input),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

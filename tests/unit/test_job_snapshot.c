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
		cmocka_unit_test(test_bad_input),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

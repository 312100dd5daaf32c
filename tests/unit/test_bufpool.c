/* test_bufpool: daemon/bufpool.c keeps large released buffers and hands
 * them out again (the smallest that fits), never a too-small one; small
 * buffers and those past the byte limit are freed; trim empties it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <sys/mman.h>
#include <unistd.h>
#include "daemon/bufpool.h"

/* sizes in units of the smallest kept buffer */
#define U BPOOL_MIN

static void test_reuse_smallest_fit(void **state)
{
	struct bpool bp = BPOOL_INIT(64 * U);
	size_t c8, c16, c;
	void *a = bpool_get(&bp, 8 * U, &c8), *b = bpool_get(&bp, 16 * U, &c16), *x;

	assert_non_null(a);
	assert_non_null(b);
	assert_true(c8 >= 8 * U && c16 >= 16 * U);
	memset(a, 1, 4096);
	bpool_put(&bp, a, c8);
	bpool_put(&bp, b, c16);
	assert_int_equal(bp.n, 2);
	assert_int_equal(bp.held, c8 + c16);
	/* 4 units: the 8-unit one, not the 16 */
	x = bpool_get(&bp, 4 * U, &c);
	assert_ptr_equal(x, a);
	assert_int_equal(c, c8);
	assert_int_equal(bp.hits, 1);
	/* 12 units: only the 16 fits */
	assert_ptr_equal(bpool_get(&bp, 12 * U, &c), b);
	/* nothing kept now: a miss is a fresh buffer */
	x = bpool_get(&bp, 32 * U, &c);
	assert_non_null(x);
	assert_true(x != a && x != b);
	assert_int_equal(bp.misses, 3);
	assert_int_equal(bp.held, 0);
	free(a);
	free(b);
	free(x);
}

static void test_never_too_small(void **state)
{
	struct bpool bp = BPOOL_INIT(64 * U);
	size_t c;
	void *a = bpool_get(&bp, 2 * U, &c);

	bpool_put(&bp, a, c);
	a = bpool_get(&bp, 2 * U + 1, &c);
	assert_true(c >= 2 * U + 1);
	assert_int_equal(bp.n, 1);	/* the 2-unit one stays */
	bpool_put(&bp, a, c);
	bpool_trim(&bp);
	assert_int_equal(bp.n, 0);
	assert_int_equal(bp.held, 0);
}

static void test_limits(void **state)
{
	struct bpool bp = BPOOL_INIT(10 * U);
	size_t c;
	void *small = bpool_get(&bp, 4096, &c);

	/* small ones are never kept */
	bpool_put(&bp, small, c);
	assert_int_equal(bp.n, 0);
	/* past max_bytes: freed, not kept */
	bpool_put(&bp, malloc(8 * U), 8 * U);
	bpool_put(&bp, malloc(4 * U), 4 * U);
	assert_int_equal(bp.n, 1);
	assert_int_equal(bp.held, 8 * U);
	/* all slots full: a bigger one replaces the smallest */
	bpool_trim(&bp);
	bp.max_bytes = 1024 * U;
	for (int i = 0; i < BPOOL_SLOTS; i++)
		bpool_put(&bp, malloc((size_t)(i + 1) * U), (size_t)(i + 1) * U);
	assert_int_equal(bp.n, BPOOL_SLOTS);
	bpool_put(&bp, malloc(9 * U), 9 * U);
	assert_int_equal(bp.n, BPOOL_SLOTS);
	/* the 1-unit one went */
	assert_int_equal(bp.held, ((size_t)BPOOL_SLOTS * (BPOOL_SLOTS + 1) / 2 - 1 + 9) * U);
	bpool_put(&bp, NULL, 0);
	bpool_trim(&bp);
	assert_int_equal(bp.held, 0);
}

/* Every page of [p, p + len) is resident (mincore). */
static int resident(void *p, size_t len)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = (len + pg - 1) / pg, in = 0;
	unsigned char *v = malloc(n);

	assert_non_null(v);
	assert_int_equal(mincore(p, len, v), 0);
	for (size_t i = 0; i < n; i++)
		in += v[i] & 1;
	free(v);
	return in == n;
}

/* Prefill: buffers populated ahead (their pages resident before anyone
 * writes them), as many as asked minus those already kept that fit,
 * within the byte limit and the slots; too small a size is not kept. */
static void test_prefill(void **state)
{
	struct bpool bp = BPOOL_INIT(4 * U);
	size_t c;
	void *a, *b;

	assert_int_equal(bpool_prefill(&bp, U / 2, 3), 0);	/* never kept anyway */
	assert_int_equal(bp.n, 0);
	/* 8 asked, the limit holds 4 */
	assert_int_equal(bpool_prefill(&bp, U, 8), 4);
	assert_int_equal(bp.n, 4);
	assert_int_equal(bp.held, 4 * U);
	for (unsigned i = 0; i < bp.n; i++)
		assert_true(resident(bp.slot[i].p, bp.slot[i].cap));
	assert_int_equal(bpool_prefill(&bp, U, 8), 0);		/* full */
	/* handed out as kept buffers: hits, not misses */
	a = bpool_get(&bp, U, &c);
	assert_true(resident(a, c));
	assert_int_equal(bp.hits, 1);
	assert_int_equal(bp.misses, 0);
	bpool_put(&bp, a, c);
	bpool_trim(&bp);
	/* one kept that fits counts: 2 asked, 1 made */
	b = bpool_get(&bp, 2 * U, &c);
	bpool_put(&bp, b, c);
	assert_int_equal(bpool_prefill(&bp, U, 2), 1);
	assert_int_equal(bp.n, 2);
	/* a kept one too small does not count */
	bpool_trim(&bp);
	bpool_put(&bp, malloc(U), U);
	assert_int_equal(bpool_prefill(&bp, 2 * U, 1), 1);
	assert_int_equal(bp.n, 2);
	bpool_trim(&bp);
	assert_int_equal(bp.held, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reuse_smallest_fit),
		cmocka_unit_test(test_never_too_small),
		cmocka_unit_test(test_limits),
		cmocka_unit_test(test_prefill),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

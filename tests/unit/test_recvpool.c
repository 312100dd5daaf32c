/* test_recvpool: daemon/recvpool.c.  An arena is populated ahead by its
 * own thread (every page resident without a write of ours), hands out
 * 64-byte-aligned pieces until it is full, never after it is retired,
 * recognises its own pieces (and gives anything else to free(): ASan sees
 * a leak or a bad free otherwise), and is unmapped once retired with its
 * last piece back, not before. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <cmocka.h>
#include "daemon/recvpool.h"

#define MIB ((size_t)1 << 20)

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static unsigned arenas(void)
{
	struct recvpool_stats st;

	recvpool_stats(&st);
	return st.arenas;
}

/* Until the pool holds `want` arenas; fails after 10 s. */
static void wait_arenas(unsigned want)
{
	double end = now() + 10.0;

	while (arenas() != want && now() < end) {
		struct timespec ts = { 0, 1000000 };

		nanosleep(&ts, NULL);
	}
	assert_int_equal(arenas(), want);
}

/* Pages of [p, p + len) resident now (mincore). */
static size_t resident(const void *p, size_t len)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = (len + pg - 1) / pg, r = 0;
	unsigned char *v = malloc(n);

	assert_non_null(v);
	assert_int_equal(mincore((void *)(uintptr_t)p, len, v), 0);
	for (size_t i = 0; i < n; i++)
		r += v[i] & 1;
	free(v);
	return r;
}

static void test_populated_ahead(void **state)
{
	struct recvpool *a = recvpool_prepare(16 * MIB);
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	uint8_t *p;
	double end = now() + 10.0;

	(void)state;
	assert_non_null(a);
	/* The whole arena as one piece: nothing of ours writes it. */
	p = recvpool_get(16 * MIB);
	assert_non_null(p);
	while (resident(p, 16 * MIB) < 16 * MIB / pg && now() < end) {
		struct timespec ts = { 0, 1000000 };

		nanosleep(&ts, NULL);
	}
	assert_int_equal(resident(p, 16 * MIB), 16 * MIB / pg);
	/* Populated pages are zero and ours to write. */
	assert_int_equal(p[0] | p[16 * MIB - 1], 0);
	memset(p, 0xa5, 16 * MIB);
	recvpool_retire(a);
	recvpool_free(p);
	wait_arenas(0);
}

/* A piece written before the arena's thread reaches it (a receive that
 * landed early) keeps every byte: the thread's touch stores nothing of
 * its own.  The piece sits at the end of 256 MiB and is written at once,
 * while the thread is still populating the start (checked: the MiB before
 * the piece is not all resident yet when the write is done). */
static void test_written_while_populated(void **state)
{
	const size_t size = 256 * MIB, tail = MIB;
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	struct recvpool *a = recvpool_prepare(size);
	uint8_t *head, *p;
	double end = now() + 20.0;
	size_t bad = 0;

	(void)state;
	assert_non_null(a);
	head = recvpool_get(size - tail);
	p = recvpool_get(tail);
	assert_non_null(head);
	assert_non_null(p);
	assert_ptr_equal(p, head + size - tail);
	memset(p, 0x5a, tail);
	assert_true(resident(p - MIB, MIB) < MIB / pg);
	while (resident(head, size) < size / pg && now() < end) {
		struct timespec ts = { 0, 1000000 };

		nanosleep(&ts, NULL);
	}
	assert_int_equal(resident(head, size), size / pg);
	for (size_t i = 0; i < tail; i++)
		bad += p[i] != 0x5a;
	assert_int_equal(bad, 0);
	recvpool_retire(a);
	recvpool_free(head);
	recvpool_free(p);
	wait_arenas(0);
}

static void test_pieces(void **state)
{
	struct recvpool *a = recvpool_prepare(4 * MIB);
	struct recvpool_stats st0, st;
	void *pc[64], *m = malloc(100);
	size_t n = 0;

	(void)state;
	assert_non_null(a);
	assert_non_null(m);
	recvpool_stats(&st0);
	assert_null(recvpool_get(0));
	/* 100-byte pieces are 64-byte aligned and distinct; a request past
	 * what is left gets nothing (the caller mallocs). */
	for (n = 0; n < 8; n++) {
		pc[n] = recvpool_get(100);
		assert_non_null(pc[n]);
		assert_int_equal((uintptr_t)pc[n] % 64, 0);
		assert_true(recvpool_owns(pc[n]));
		if (n)
			assert_true((uint8_t *)pc[n] >= (uint8_t *)pc[n - 1] + 100);
		memset(pc[n], (int)n, 100);
	}
	assert_null(recvpool_get(4 * MIB));
	/* The rest but 64 bytes, then those 64: full. */
	pc[n] = recvpool_get(4 * MIB - 8 * 128 - 64);
	assert_non_null(pc[n++]);
	pc[n] = recvpool_get(64);
	assert_non_null(pc[n++]);
	assert_null(recvpool_get(1));
	assert_false(recvpool_owns(m));
	assert_false(recvpool_owns(NULL));
	recvpool_stats(&st);
	assert_int_equal(st.out, n);
	assert_int_equal(st.carved - st0.carved, n);
	for (size_t i = 0; i < 8; i++)
		assert_int_equal(((uint8_t *)pc[i])[99], (uint8_t)i);
	/* Not ours: free()'d (ASan would report a leak otherwise). */
	recvpool_free(m);
	recvpool_free(NULL);
	/* Retired with pieces out: still mapped, still readable, no new
	 * pieces even where there is room; it goes with the last one. */
	recvpool_free(pc[n - 2]);
	pc[n - 2] = pc[n - 1];
	n--;
	{
		struct recvpool *c = recvpool_prepare(MIB);

		assert_non_null(c);
		recvpool_retire(c);
		assert_null(recvpool_get(1));
		wait_arenas(1);
	}
	recvpool_retire(a);
	for (size_t i = 0; i + 1 < n; i++)
		recvpool_free(pc[i]);
	usleep(20000);
	assert_int_equal(arenas(), 1);
	assert_true(recvpool_owns(pc[n - 1]));
	memset(pc[n - 1], 1, 64);
	recvpool_free(pc[n - 1]);
	wait_arenas(0);
	recvpool_stats(&st);
	assert_int_equal(st.out, 0);
	assert_null(recvpool_get(1));
}

/* A retired arena with no piece out goes at once; two arenas serve in
 * turn and each goes on its own. */
static void test_retire(void **state)
{
	struct recvpool *a = recvpool_prepare(2 * MIB), *b = recvpool_prepare(2 * MIB);
	void *p, *q;

	(void)state;
	assert_non_null(a);
	assert_non_null(b);
	assert_int_equal(arenas(), 2);
	p = recvpool_get(2 * MIB);
	q = recvpool_get(2 * MIB);
	assert_non_null(p);
	assert_non_null(q);
	assert_null(recvpool_get(64));
	recvpool_free(p);
	recvpool_free(q);
	/* Both empty again, neither retired: both stay. */
	usleep(20000);
	assert_int_equal(arenas(), 2);
	recvpool_retire(a);
	wait_arenas(1);
	recvpool_retire(b);
	wait_arenas(0);
	recvpool_retire(NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_populated_ahead),
		cmocka_unit_test(test_written_while_populated),
		cmocka_unit_test(test_pieces),
		cmocka_unit_test(test_retire),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

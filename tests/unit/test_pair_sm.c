/* tests/unit/test_pair_sm.c — the source side of a (source, sink) pair
 * (daemon/pair_sm.h): every event from the states that matter, and a long
 * random walk checking the safety rules against a model of what the sink
 * holds (not against pair_sm's own rule). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include "daemon/pair_sm.h"

#define E1 11
#define E2 12

static struct pair_sm sent(uint64_t v, uint64_t epoch)
{
	struct pair_sm s;

	pair_sm_init(&s);
	for (uint64_t i = 1; i <= v; i++) {
		pair_sm_event(&s, PAIR_EV_SENT, i, epoch);
		pair_sm_event(&s, PAIR_EV_STAGED, i, 0);
		pair_sm_event(&s, PAIR_EV_APPLIED, i, 0);
	}
	return s;
}

static void test_initial(void **state)
{
	struct pair_sm s;

	(void)state;
	pair_sm_init(&s);
	assert_int_equal(pair_sm_decide(&s, 0, E1, 1, 0), PAIR_WHY_INITIAL);
	assert_int_equal(pair_sm_decide(&s, 5, E1, 1, 0), PAIR_WHY_INITIAL);
	assert_string_equal(pair_sm_why_name(PAIR_WHY_INITIAL), "initial");
	pair_sm_event(&s, PAIR_EV_SENT, 1, E1);
	assert_int_equal(pair_sm_decide(&s, 1, E1, 1, 0), PAIR_WHY_NONE);
	assert_string_equal(pair_sm_why_name(PAIR_WHY_NONE), "sparse");
	/* nothing published by the source: dense whatever was sent */
	assert_int_equal(pair_sm_decide(&s, 0, E1, 1, 0), PAIR_WHY_INITIAL);
}

static void test_steps_and_versions(void **state)
{
	struct pair_sm s = sent(3, E1);

	(void)state;
	assert_int_equal(pair_sm_decide(&s, 3, E1, 1, 0), PAIR_WHY_NONE);
	assert_int_equal(pair_sm_decide(&s, 3, E1, 0, 0), PAIR_WHY_STEP_GAP);
	assert_int_equal(pair_sm_decide(&s, 4, E1, 1, 0), PAIR_WHY_MISSED_VERSION);
	assert_int_equal(pair_sm_decide(&s, 3, E1, 1, 1), PAIR_WHY_REPAIR);
}

/* Rule 3: at most one unacknowledged version under a sparse one. */
static void test_unacked_base(void **state)
{
	struct pair_sm s = sent(2, E1);

	(void)state;
	pair_sm_event(&s, PAIR_EV_SENT, 3, E1);
	assert_int_equal(pair_sm_decide(&s, 3, E1, 1, 0), PAIR_WHY_NONE);	/* 2 staged */
	pair_sm_event(&s, PAIR_EV_SENT, 4, E1);					/* 3 not staged */
	assert_int_equal(pair_sm_decide(&s, 4, E1, 1, 0), PAIR_WHY_UNACKED_BASE);
	pair_sm_event(&s, PAIR_EV_STAGED, 3, 0);
	assert_int_equal(pair_sm_decide(&s, 4, E1, 1, 0), PAIR_WHY_NONE);
	/* an old acknowledgement arriving late changes nothing */
	pair_sm_event(&s, PAIR_EV_STAGED, 1, 0);
	assert_int_equal(s.staged, 3);
	assert_int_equal(pair_sm_decide(&s, 4, E1, 1, 0), PAIR_WHY_NONE);
}

/* Rule 4: v−1 sent under an older plan counts only once acknowledged. */
static void test_replan(void **state)
{
	struct pair_sm s = sent(2, E1), n;

	(void)state;
	pair_sm_event(&s, PAIR_EV_SENT, 3, E1);
	pair_sm_replanned(&n, &s);
	assert_memory_equal(&n, &s, sizeof(s));
	assert_int_equal(pair_sm_decide(&n, 3, E2, 1, 0), PAIR_WHY_REPLAN);
	pair_sm_event(&n, PAIR_EV_STAGED, 3, 0);
	assert_int_equal(pair_sm_decide(&n, 3, E2, 1, 0), PAIR_WHY_NONE);
	/* entries changed: a fresh pair, dense */
	pair_sm_replanned(&n, NULL);
	assert_int_equal(n.need_dense, 1);
	assert_int_equal(n.last_sent, 0);
	assert_int_equal(pair_sm_decide(&n, 3, E2, 1, 0), PAIR_WHY_INITIAL);
}

/* Rule 2: every failure makes the next version dense; sending clears it. */
static void test_failures(void **state)
{
	static const enum pair_event fail[] = { PAIR_EV_SEND_FAILED, PAIR_EV_CAPTURE_FAILED,
						PAIR_EV_APPLY_FAILED, PAIR_EV_REPAIR };

	(void)state;
	for (size_t i = 0; i < sizeof(fail) / sizeof(fail[0]); i++) {
		struct pair_sm s = sent(4, E1);

		pair_sm_event(&s, fail[i], 4, 0);
		assert_int_equal(pair_sm_decide(&s, 4, E1, 1, 0), PAIR_WHY_REPAIR);
		/* a later good acknowledgement does not clear it */
		pair_sm_event(&s, PAIR_EV_APPLIED, 4, 0);
		pair_sm_event(&s, PAIR_EV_STAGED, 4, 0);
		assert_int_equal(pair_sm_decide(&s, 4, E1, 1, 0), PAIR_WHY_REPAIR);
		pair_sm_event(&s, PAIR_EV_SENT, 5, E1);
		assert_int_equal(pair_sm_decide(&s, 5, E1, 1, 0), PAIR_WHY_NONE);
	}
}

static void test_resync(void **state)
{
	struct pair_sm s = sent(4, E1);

	(void)state;
	pair_sm_event(&s, PAIR_EV_RESYNC, 0, 0);
	assert_int_equal(pair_sm_decide(&s, 4, E1, 1, 0), PAIR_WHY_RESYNC);
	/* the operator's reason wins over everything but a version sent */
	assert_int_equal(pair_sm_decide(&s, 4, E1, 0, 1), PAIR_WHY_RESYNC);
	pair_sm_event(&s, PAIR_EV_SEND_FAILED, 5, 0);
	assert_int_equal(pair_sm_decide(&s, 4, E1, 1, 0), PAIR_WHY_RESYNC);
	pair_sm_event(&s, PAIR_EV_SENT, 5, E1);
	assert_int_equal(pair_sm_decide(&s, 5, E1, 1, 0), PAIR_WHY_NONE);
	pair_sm_event(&s, PAIR_EV_APPLY_FAILED, 5, 0);
	assert_int_equal(pair_sm_decide(&s, 5, E1, 1, 0), PAIR_WHY_REPAIR);
}

static void test_has(void **state)
{
	struct pair_sm s = sent(2, E1);

	(void)state;
	assert_int_equal(pair_sm_has(&s, 2), 1);
	assert_int_equal(pair_sm_has(&s, 3), 0);
	pair_sm_event(&s, PAIR_EV_APPLY_FAILED, 3, 0);
	assert_int_equal(pair_sm_has(&s, 3), -1);
	assert_int_equal(s.failed, 3);
	pair_sm_event(&s, PAIR_EV_APPLIED, 1, 0);	/* late, older: no step back */
	assert_int_equal(s.applied, 2);
	pair_sm_event(&s, PAIR_EV_APPLIED, 4, 0);
	assert_int_equal(pair_sm_has(&s, 3), 1);
}

/* A model of the wire and the sink, written from the protocol's rules
 * (docs/SYNC.md), not from pair_sm.c: the sink applies a sparse version
 * only on exactly its base, drops versions of an older epoch that it had
 * not staged when the plan changed, and stages in order.  Random events;
 * every version the decision sends sparse must find its base at the sink
 * or be refused — and a refusal must make the next decision dense.  The
 * check that matters: a sparse version is never sent on a base that two
 * or more unacknowledged versions separate from what the sink staged. */
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static void test_random_walk(void **state)
{
	struct pair_sm s;
	uint64_t src_last = 0, epoch = 1, inflight[64], ninflight = 0;
	uint64_t sink_staged = 0, sparse = 0, dense = 0, refused = 0;
	uint64_t in_base[64];
	int in_sparse[64];

	(void)state;
	pair_sm_init(&s);
	for (int it = 0; it < 200000; it++) {
		uint64_t r = next() % 100;

		if (r < 40) {		/* publish the next version */
			int stepped = next() % 10 != 0;
			enum pair_why why = pair_sm_decide(&s, src_last, epoch, stepped, 0);
			uint64_t v = src_last + 1;

			if (why == PAIR_WHY_NONE) {
				/* rule 1: on top of what the sink was sent last */
				assert_int_equal(s.last_sent, src_last);
				/* rule 3: at most one unacknowledged version under it */
				assert_true(s.staged >= s.prev_sent);
				sparse++;
			} else {
				dense++;
			}
			src_last = v;
			if (next() % 20 == 0) {
				pair_sm_event(&s, PAIR_EV_SEND_FAILED, v, epoch);
			} else if (ninflight < 64) {
				pair_sm_event(&s, PAIR_EV_SENT, v, epoch);
				in_base[ninflight] = v - 1;
				in_sparse[ninflight] = why == PAIR_WHY_NONE;
				inflight[ninflight++] = v;
			}
		} else if (r < 75 && ninflight) {	/* the oldest record reaches the sink */
			uint64_t v = inflight[0], base = in_base[0];
			int sp = in_sparse[0], lost = next() % 15 == 0;

			memmove(inflight, inflight + 1, (ninflight - 1) * sizeof(inflight[0]));
			memmove(in_base, in_base + 1, (ninflight - 1) * sizeof(in_base[0]));
			memmove(in_sparse, in_sparse + 1, (ninflight - 1) * sizeof(in_sparse[0]));
			ninflight--;
			if (lost)
				continue;	/* the sink never hears of it */
			if (sp && base != sink_staged) {
				/* refused: base mismatch; the source hears it */
				refused++;
				pair_sm_event(&s, PAIR_EV_APPLY_FAILED, v, 0);
				assert_int_not_equal(pair_sm_decide(&s, src_last, epoch, 1, 0), PAIR_WHY_NONE);
				continue;
			}
			sink_staged = v;
			pair_sm_event(&s, PAIR_EV_STAGED, v, 0);
			pair_sm_event(&s, PAIR_EV_APPLIED, v, 0);
		} else if (r < 78) {	/* re-plan, same entries; old-epoch records are dropped */
			struct pair_sm old = s;

			epoch++;
			ninflight = 0;
			pair_sm_replanned(&s, &old);
		} else if (r < 79) {
			pair_sm_event(&s, PAIR_EV_RESYNC, 0, 0);
			assert_int_equal(pair_sm_decide(&s, src_last, epoch, 1, 0), PAIR_WHY_RESYNC);
		}
	}
	/* The walk exercised both decisions and the refusals. */
	assert_true(sparse > 1000 && dense > 1000 && refused > 10);
	print_message("pair-sm: events=200000 sparse=%llu dense=%llu refused=%llu\n",
		      (unsigned long long)sparse, (unsigned long long)dense,
		      (unsigned long long)refused);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_initial),
		cmocka_unit_test(test_steps_and_versions),
		cmocka_unit_test(test_unacked_base),
		cmocka_unit_test(test_replan),
		cmocka_unit_test(test_failures),
		cmocka_unit_test(test_resync),
		cmocka_unit_test(test_has),
		cmocka_unit_test(test_random_walk),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

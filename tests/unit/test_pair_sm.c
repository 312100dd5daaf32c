/* tests/unit/test_pair_sm.c — the source side of a (source, sink) pair
 * (daemon/pair_sm.h): every state × event against a table transcribed
 * here from docs/SYNC.md ("The pair's state machine") cell by cell, and
 * what each event does to a pair in that state; every state × decision;
 * the doc's two tables themselves, parsed (tests/unit/doc_table.h) and
 * compared with the code cell by cell; every event from the states that
 * matter, and a long random walk checking the safety rules against a
 * model of what the sink holds (not against pair_sm's own rule). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include "daemon/pair_sm.h"
#include "tests/unit/doc_sm.h"

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

/* ------------------------------------------------ the state machine */

/* Columns: reset, replanned, sent, send_failed, capture_failed, staged,
 * applied, apply_failed, resync, repair.  "-" is the table's "—" (no
 * cell has one: every event reaches every state). */
static const char *const want[PAIR_S_COUNT][PAIR_EV_COUNT] = {
	[PAIR_S_FRESH] = { "fresh reset", "fresh carry", "clean sent", "fresh need_dense",
			   "fresh need_dense", "fresh staged", "fresh applied", "fresh failed",
			   "resync resync", "fresh need_dense" },
	[PAIR_S_CLEAN] = { "fresh reset", "clean carry", "clean sent", "repair need_dense",
			   "repair need_dense", "clean staged", "clean applied", "repair failed",
			   "resync resync", "repair need_dense" },
	[PAIR_S_REPAIR] = { "fresh reset", "repair carry", "clean sent", "repair need_dense",
			    "repair need_dense", "repair staged", "repair applied", "repair failed",
			    "resync resync", "repair need_dense" },
	[PAIR_S_RESYNC] = { "fresh reset", "resync carry", "clean sent", "resync need_dense",
			    "resync need_dense", "resync staged", "resync applied", "resync failed",
			    "resync resync", "resync need_dense" },
};

static void cell_of(enum pair_state s, enum pair_event e, char *got, size_t len)
{
	struct pair_step st = pair_sm_step(s, e);

	if (st.act == PAIR_A_NONE) {
		assert_int_equal(st.next, s);	/* "—" keeps the state */
		snprintf(got, len, "-");
	} else {
		snprintf(got, len, "%s %s", pair_sm_state_name(st.next), pair_sm_action_name(st.act));
	}
}

static void pair_cell(int s, int e, char *got, size_t len)
{
	cell_of((enum pair_state)s, (enum pair_event)e, got, len);
}

static const char *pair_state(int s)
{
	return pair_sm_state_name((enum pair_state)s);
}

static const char *pair_event(int e)
{
	return pair_sm_event_name((enum pair_event)e);
}

static const struct doc_sm pair_sm_doc = {
	"pair", PAIR_S_COUNT, PAIR_EV_COUNT, pair_cell, pair_state, pair_event
};

/* A pair in each state, made by events only: fresh (new), clean (3
 * versions sent, staged and applied under E1), repair, resync. */
static struct pair_sm in_state(enum pair_state st)
{
	struct pair_sm s;

	if (st == PAIR_S_FRESH) {
		pair_sm_replanned(&s, NULL);
		return s;
	}
	s = sent(3, E1);
	if (st == PAIR_S_REPAIR)
		pair_sm_event(&s, PAIR_EV_REPAIR, 0, 0);
	else if (st == PAIR_S_RESYNC)
		pair_sm_event(&s, PAIR_EV_RESYNC, 0, 0);
	return s;
}

static void test_every_cell(void **state)
{
	unsigned cells = 0, acting = 0;

	(void)state;
	for (int s = 0; s < PAIR_S_COUNT; s++) {
		struct pair_sm p0 = in_state((enum pair_state)s);

		assert_int_equal(pair_sm_state(&p0), s);
		for (int e = 0; e < PAIR_EV_COUNT; e++) {
			struct pair_sm p = p0;
			char got[96];

			assert_non_null(want[s][e]);
			cell_of((enum pair_state)s, (enum pair_event)e, got, sizeof(got));
			if (strcmp(got, want[s][e]))
				fail_msg("%s × %s: %s, the table says %s",
					 pair_sm_state_name((enum pair_state)s),
					 pair_sm_event_name((enum pair_event)e), got, want[s][e]);
			acting += strcmp(got, "-") != 0;
			cells++;
			/* the event on a pair in that state lands where the table says */
			if (e == PAIR_EV_RESET)
				pair_sm_replanned(&p, NULL);
			else if (e == PAIR_EV_REPLANNED)
				pair_sm_replanned(&p, &p0);
			else
				pair_sm_event(&p, (enum pair_event)e, 4, E1);
			if (pair_sm_state(&p) != pair_sm_step((enum pair_state)s,
							      (enum pair_event)e).next)
				fail_msg("%s × %s: the pair is %s after it",
					 pair_sm_state_name((enum pair_state)s),
					 pair_sm_event_name((enum pair_event)e),
					 pair_sm_state_name(pair_sm_state(&p)));
			/* ...stored, and the one its fields give */
			if (p.state_bugs || pair_sm_fields_state(&p) != pair_sm_state(&p))
				fail_msg("%s × %s: stored %s, the fields say %s",
					 pair_sm_state_name((enum pair_state)s),
					 pair_sm_event_name((enum pair_event)e),
					 pair_sm_state_name(pair_sm_state(&p)),
					 pair_sm_state_name(pair_sm_fields_state(&p)));
		}
	}
	assert_int_equal(cells, PAIR_S_COUNT * PAIR_EV_COUNT);
	/* out of range: nothing */
	assert_int_equal(pair_sm_step(PAIR_S_COUNT, PAIR_EV_SENT).act, PAIR_A_NONE);
	assert_int_equal(pair_sm_step(PAIR_S_CLEAN, PAIR_EV_COUNT).act, PAIR_A_NONE);
	print_message("pair-sm: cells=%u acting=%u\n", cells, acting);
}

/* The decision's columns, checked left to right (the first that holds
 * decides; the state's own reason comes first): nothing published,
 * marks lost, a step not in the dirty state, v−1 not sent to this sink,
 * the version under v−1 not staged, v−1 of an older epoch and not staged,
 * otherwise.  Each column's inputs make it the first that holds on a
 * clean pair (3 sent, staged, under E1). */
enum { DC_NONE_PUBLISHED, DC_MARKS_LOST, DC_STEP_GAP, DC_MISSED, DC_UNACKED, DC_REPLAN,
       DC_OTHERWISE, DC_COUNT };

static enum pair_why decide_in(enum pair_state st, int c)
{
	struct pair_sm s = in_state(st);
	uint64_t src_last = 3, epoch = E1;
	int stepped = 1, lost = 0;

	switch (c) {
	case DC_NONE_PUBLISHED: src_last = 0; break;
	case DC_MARKS_LOST:     lost = 1; break;
	case DC_STEP_GAP:       stepped = 0; break;
	case DC_MISSED:         src_last = 4; break;
	case DC_UNACKED:        s.staged = 1; break;	/* under prev_sent 2 */
	case DC_REPLAN:         epoch = E2; s.staged = 2; break;
	}
	return pair_sm_decide(&s, src_last, epoch, stepped, lost);
}

static const char *const want_decide[PAIR_S_COUNT][DC_COUNT] = {
	[PAIR_S_FRESH] = { "initial", "initial", "initial", "initial", "initial", "initial",
			   "initial" },
	[PAIR_S_CLEAN] = { "initial", "repair", "step_gap", "missed_version", "unacked_base",
			   "replan", "sparse" },
	[PAIR_S_REPAIR] = { "initial", "repair", "repair", "repair", "repair", "repair",
			    "repair" },
	[PAIR_S_RESYNC] = { "resync", "resync", "resync", "resync", "resync", "resync",
			    "resync" },
};

static void test_every_decision(void **state)
{
	struct pair_sm s;

	(void)state;
	for (int st = 0; st < PAIR_S_COUNT; st++)
		for (int c = 0; c < DC_COUNT; c++) {
			const char *got = pair_sm_why_name(decide_in((enum pair_state)st, c));

			if (strcmp(got, want_decide[st][c]))
				fail_msg("%s × column %d: %s, the table says %s",
					 pair_sm_state_name((enum pair_state)st), c, got,
					 want_decide[st][c]);
		}
	/* a fresh pair, made by init or by a reset, decides the same */
	pair_sm_init(&s);
	assert_int_equal(pair_sm_state(&s), PAIR_S_FRESH);
	assert_int_equal(pair_sm_decide(&s, 3, E1, 1, 0), PAIR_WHY_INITIAL);
	/* a resync asked before anything went out: resync */
	pair_sm_event(&s, PAIR_EV_RESYNC, 0, 0);
	assert_int_equal(pair_sm_state(&s), PAIR_S_RESYNC);
	assert_int_equal(pair_sm_decide(&s, 0, E1, 1, 0), PAIR_WHY_RESYNC);
}

/* The doc's tables (docs/SYNC.md, "The pair's state machine"; the test
 * runs from the repo root). */
static void test_doc_table(void **state)
{
	unsigned dashes;
	int rows = doc_sm_check(&pair_sm_doc, "docs/SYNC.md", "| pair state \xef\xbc\xbc event",
				&dashes);

	(void)state;
	if (rows == -1) {
		skip();
		return;
	}
	print_message("pair-sm-doc: rows=%d cols=%d dashes=%u\n", rows, PAIR_EV_COUNT, dashes);
}

static void test_doc_decide_table(void **state)
{
	static struct doc_table t;
	int rows = doc_table_read("docs/SYNC.md", "| pair state \xef\xbc\xbc at publish", DC_COUNT,
				  &t);
	unsigned seen = 0;

	(void)state;
	if (rows == -1) {
		skip();
		return;
	}
	if (rows < 0)
		fail_msg("docs/SYNC.md: pair decision table: %d %s", rows, t.bad);
	assert_int_equal(rows, PAIR_S_COUNT);
	for (int r = 0; r < rows; r++) {
		int s = -1;

		for (int k = 0; k < PAIR_S_COUNT; k++)
			if (!strcmp(t.cell[r][0], pair_sm_state_name((enum pair_state)k)))
				s = k;
		if (s < 0)
			fail_msg("docs/SYNC.md: a row of no state: \"%s\"", t.cell[r][0]);
		assert_false(seen & (1u << s));
		seen |= 1u << s;
		for (int c = 0; c < DC_COUNT; c++) {
			const char *got = pair_sm_why_name(decide_in((enum pair_state)s, c));

			if (strcmp(t.cell[r][1 + c], got))
				fail_msg("docs/SYNC.md pair decision %s × column %d: the doc says "
					 "\"%s\", the code \"%s\"", t.cell[r][0], c, t.cell[r][1 + c],
					 got);
		}
	}
	print_message("pair-sm-decide-doc: rows=%d cols=%d\n", rows, DC_COUNT);
}

/* --------------------------------------------------- events and rules */

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


/* ---- the cheaper mode (pair_sm_choose) ---- */

#define EL (1ull << 28)

/* A pair at version 3, sparse allowed, with one sparse version measured
 * at `frac` changed (3 B per changed element) and the given rates. */
static struct pair_sm costed(double frac, double link_Bps, double apply_Bps)
{
	struct pair_sm s = sent(3, E1);

	pair_cost_sent(&s, 3, 0, PAIR_WHY_NONE, (uint64_t)(frac * (double)EL), EL,
		       (uint64_t)(3.0 * frac * (double)EL));
	s.r.link.Bps = link_Bps;
	s.r.apply_sparse_Bps = s.r.apply_dense_Bps = apply_Bps;
	return s;
}

static struct pair_cost_in host(int local)
{
	/* host θ, m, v read at 12 GB/s */
	struct pair_cost_in in = { .elements = EL, .scan_Bps = 12e9, .local = local,
				   .policy = PAIR_MODE_AUTO };
	return in;
}

static void test_cost_fast_link_dense(void **state)
{
	/* 100 Gbit/s: the dense wire (0.043 s) and the read of θ (0.089 s)
	 * beat the detect's read of θ, m, v (0.27 s) */
	struct pair_sm s = costed(0.03, 12.5e9, 20e9);
	struct pair_cost_in in = host(0);
	struct pair_choice ch;

	(void)state;
	pair_sm_choose(&s, 3, E1, 1, 0, &in, &ch);
	assert_int_equal(ch.why, PAIR_WHY_COST);
	assert_true(ch.dense_s > 0.08 && ch.dense_s < 0.1);
	assert_true(ch.sparse_s > 0.26 && ch.sparse_s < 0.28);
	assert_non_null(strstr(ch.reason, "mode=dense reason=cost sparse_est_s="));
	assert_non_null(strstr(ch.reason, "dense_est_s="));
	assert_string_equal(pair_sm_why_name(PAIR_WHY_COST), "cost");
	/* a measured dense read rate is used when there is one */
	in.dense_Bps = 2e9;	/* 4 B/element at 2 GB/s: 0.54 s */
	pair_sm_choose(&s, 3, E1, 1, 0, &in, &ch);
	assert_int_equal(ch.why, PAIR_WHY_NONE);
	assert_non_null(strstr(ch.reason, "mode=sparse reason=cost"));
}

static void test_cost_slow_link_sparse(void **state)
{
	/* 1 Gbit/s: 2 B/element on the wire is 4.3 s, 3 % sparse 0.19 s */
	struct pair_sm s = costed(0.03, 1.25e8, 20e9);
	struct pair_cost_in in = host(0);
	struct pair_choice ch;

	(void)state;
	pair_sm_choose(&s, 3, E1, 1, 0, &in, &ch);
	assert_int_equal(ch.why, PAIR_WHY_NONE);
	assert_true(ch.dense_s > 4.0 && ch.sparse_s < 0.3);
	/* all of it changing: sparse is more bytes than dense, dense wins */
	s = costed(1.0, 1.25e8, 20e9);
	pair_sm_choose(&s, 3, E1, 1, 0, &in, &ch);
	assert_int_equal(ch.why, PAIR_WHY_COST);
}

static void test_cost_no_estimate(void **state)
{
	struct pair_sm s = sent(3, E1);
	struct pair_cost_in in = host(0);
	struct pair_choice ch;

	(void)state;
	/* nothing measured on the pair */
	pair_sm_choose(&s, 3, E1, 1, 0, &in, &ch);
	assert_int_equal(ch.why, PAIR_WHY_NONE);
	assert_string_equal(ch.reason, "mode=sparse reason=no_estimate");
	/* the changed fraction, but no link rate yet */
	s = costed(1.0, 0, 20e9);
	pair_sm_choose(&s, 3, E1, 1, 0, &in, &ch);
	assert_string_equal(ch.reason, "mode=sparse reason=no_estimate");
	/* no scan rate */
	s = costed(1.0, 12.5e9, 20e9);
	in.scan_Bps = 0;
	pair_sm_choose(&s, 3, E1, 1, 0, &in, &ch);
	assert_string_equal(ch.reason, "mode=sparse reason=no_estimate");
	/* a local pair needs an apply rate instead of a link */
	s = costed(1.0, 0, 0);
	in = host(1);
	pair_sm_choose(&s, 3, E1, 1, 0, &in, &ch);
	assert_string_equal(ch.reason, "mode=sparse reason=no_estimate");
	/* a small pair stays sparse whatever the estimates */
	s = costed(1.0, 12.5e9, 20e9);
	in = host(0);
	pair_sm_choose(&s, 3, E1, 1, 0, &in, &ch);
	assert_int_equal(ch.why, PAIR_WHY_COST);
	in.elements = PAIR_COST_MIN_ELEMENTS - 1;
	pair_sm_choose(&s, 3, E1, 1, 0, &in, &ch);
	assert_string_equal(ch.reason, "mode=sparse reason=small");
	/* a dense version does not measure the changed fraction */
	s = sent(3, E1);
	pair_cost_sent(&s, 3, 1, PAIR_WHY_INITIAL, EL, EL, 2 * EL);
	s.r.link.Bps = 12.5e9;
	in = host(0);
	pair_sm_choose(&s, 3, E1, 1, 0, &in, &ch);
	assert_string_equal(ch.reason, "mode=sparse reason=no_estimate");
}

static void test_cost_repair_wins(void **state)
{
	struct pair_sm s = costed(0.03, 1.25e8, 20e9);	/* sparse by cost */
	struct pair_cost_in in = host(0);
	struct pair_choice ch;

	(void)state;
	pair_sm_event(&s, PAIR_EV_APPLY_FAILED, 3, 0);
	pair_sm_choose(&s, 3, E1, 1, 0, &in, &ch);
	assert_int_equal(ch.why, PAIR_WHY_REPAIR);
	assert_string_equal(ch.reason, "mode=dense reason=repair");
	pair_sm_event(&s, PAIR_EV_RESYNC, 0, 0);
	pair_sm_choose(&s, 3, E1, 1, 0, &in, &ch);
	assert_string_equal(ch.reason, "mode=dense reason=resync");
	s = costed(0.03, 1.25e8, 20e9);
	pair_sm_choose(&s, 3, E1, 0, 0, &in, &ch);
	assert_string_equal(ch.reason, "mode=dense reason=step_gap");
	pair_sm_choose(&s, 0, E1, 1, 0, &in, &ch);
	assert_string_equal(ch.reason, "mode=dense reason=initial");
	/* forced sparse changes nothing of the repairs either */
	in.policy = PAIR_MODE_SPARSE;
	pair_sm_choose(&s, 3, E1, 1, 1, &in, &ch);
	assert_string_equal(ch.reason, "mode=dense reason=repair");
}

static void test_cost_forced_and_probe(void **state)
{
	struct pair_sm s = costed(0.03, 12.5e9, 20e9);	/* dense by cost */
	struct pair_cost_in in = host(0);
	struct pair_choice ch;

	(void)state;
	in.policy = PAIR_MODE_SPARSE;
	pair_sm_choose(&s, 3, E1, 1, 0, &in, &ch);
	assert_int_equal(ch.why, PAIR_WHY_NONE);
	assert_string_equal(ch.reason, "mode=sparse reason=forced");
	in.policy = PAIR_MODE_AUTO;
	/* dense for cost, version after version, then one sparse probe */
	for (uint64_t v = 4; v < 4 + PAIR_COST_PROBE; v++) {
		pair_sm_choose(&s, v - 1, E1, 1, 0, &in, &ch);
		assert_int_equal(ch.why, PAIR_WHY_COST);
		pair_sm_event(&s, PAIR_EV_SENT, v, E1);
		pair_sm_event(&s, PAIR_EV_STAGED, v, 0);
		pair_cost_sent(&s, v, 1, ch.why, EL, EL, 2 * EL);
	}
	pair_sm_choose(&s, 3 + PAIR_COST_PROBE, E1, 1, 0, &in, &ch);
	assert_int_equal(ch.why, PAIR_WHY_NONE);
	assert_string_equal(ch.reason, "mode=sparse reason=probe");
	pair_sm_event(&s, PAIR_EV_SENT, 4 + PAIR_COST_PROBE, E1);
	pair_cost_sent(&s, 4 + PAIR_COST_PROBE, 0, ch.why, EL / 100, EL, 3 * EL / 100);
	assert_int_equal(s.r.dense_run, 0);
	/* a dense version for another reason does not count toward the probe */
	pair_cost_sent(&s, 5 + PAIR_COST_PROBE, 1, PAIR_WHY_REPAIR, EL, EL, 2 * EL);
	assert_int_equal(s.r.dense_run, 0);
}

static void test_cost_local(void **state)
{
	/* same node: read and apply add up; apply at 2 GB/s of payload */
	struct pair_sm s = costed(0.01, 0, 2e9);
	struct pair_cost_in in = host(1);
	struct pair_choice ch;

	(void)state;
	/* 1 %: sparse 0.27 + 0.004 s, dense 0.09 + 0.27 s */
	pair_sm_choose(&s, 3, E1, 1, 0, &in, &ch);
	assert_int_equal(ch.why, PAIR_WHY_NONE);
	in.scan_Bps = 6e9;	/* a slower detect: dense is cheaper */
	pair_sm_choose(&s, 3, E1, 1, 0, &in, &ch);
	assert_int_equal(ch.why, PAIR_WHY_COST);
	in.scan_Bps = 12e9;
	s.r.apply_sparse_Bps = s.r.apply_dense_Bps = 1e9;	/* a slow sink: sparse */
	pair_sm_choose(&s, 3, E1, 1, 0, &in, &ch);
	assert_int_equal(ch.why, PAIR_WHY_NONE);
	/* 90 % changed: the sparse payload outgrows the dense one */
	s = costed(0.9, 0, 1e9);
	pair_sm_choose(&s, 3, E1, 1, 0, &in, &ch);
	assert_int_equal(ch.why, PAIR_WHY_COST);
}

static void test_cost_measure(void **state)
{
	struct pair_sm s;

	(void)state;
	pair_sm_init(&s);
	/* two parts overlap in [0, 3] ms, then idle, then one in [10, 11]:
	 * 12 MiB over 4 ms of busy link */
	pair_cost_part_out(&s, 0);
	pair_cost_part_out(&s, 1000000);
	pair_cost_part_done(&s, 2000000, 4u << 20);
	assert_true(s.r.link.Bps == 0);
	pair_cost_part_done(&s, 3000000, 4u << 20);
	assert_true(s.r.link.Bps > 2.79e9 && s.r.link.Bps < 2.8e9);	/* 8 MiB / 3 ms */
	pair_cost_part_out(&s, 10000000);
	pair_cost_part_done(&s, 11000000, 4u << 20);
	/* the idle 7 ms are not link time: the second sample is 4 GiB/s-ish */
	assert_true(s.r.link.Bps > 0.75 * 2.796e9 + 0.25 * 4.19e9 - 1e7 &&
		    s.r.link.Bps < 0.75 * 2.796e9 + 0.25 * 4.2e9 + 1e7);
	/* a completion with nothing in flight (state reset) is ignored */
	pair_cost_part_done(&s, 12000000, 1u << 30);
	assert_int_equal(s.r.link.inflight, 0);
	/* apply rate: only the version last sent, only with bytes */
	pair_cost_sent(&s, 7, 1, PAIR_WHY_INITIAL, 0, 1000000, 2000000);
	pair_cost_applied(&s, 7, 0.001);
	assert_true(s.r.apply_dense_Bps == 0);	/* a first version is cold */
	pair_cost_sent(&s, 7, 1, PAIR_WHY_REPAIR, 0, 1000000, 2000000);
	pair_cost_applied(&s, 6, 0.001);
	assert_true(s.r.apply_dense_Bps == 0);
	pair_cost_applied(&s, 7, 0.001);
	assert_true(s.r.apply_dense_Bps > 1.99e9 && s.r.apply_dense_Bps < 2.01e9);
	assert_true(s.r.apply_sparse_Bps == 0);
	/* changed fraction from sparse versions only, averaged */
	pair_cost_sent(&s, 8, 0, PAIR_WHY_NONE, 100, 1000, 300);
	assert_true(s.r.changed_frac > 0.099 && s.r.changed_frac < 0.101);
	assert_true(s.r.bytes_per_changed > 2.99 && s.r.bytes_per_changed < 3.01);
	pair_cost_sent(&s, 9, 0, PAIR_WHY_NONE, 500, 1000, 1000);
	assert_true(s.r.changed_frac > 0.299 && s.r.changed_frac < 0.301);	/* (0.1 + 0.5) / 2 */
	pair_cost_sent(&s, 10, 1, PAIR_WHY_COST, 1000, 1000, 2000);
	assert_true(s.r.changed_frac > 0.299 && s.r.changed_frac < 0.301);
	assert_int_equal(s.r.sparse_seen, 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_cell),
		cmocka_unit_test(test_every_decision),
		cmocka_unit_test(test_doc_table),
		cmocka_unit_test(test_doc_decide_table),
		cmocka_unit_test(test_initial),
		cmocka_unit_test(test_steps_and_versions),
		cmocka_unit_test(test_unacked_base),
		cmocka_unit_test(test_replan),
		cmocka_unit_test(test_failures),
		cmocka_unit_test(test_resync),
		cmocka_unit_test(test_has),
		cmocka_unit_test(test_random_walk),
		cmocka_unit_test(test_cost_fast_link_dense),
		cmocka_unit_test(test_cost_slow_link_sparse),
		cmocka_unit_test(test_cost_no_estimate),
		cmocka_unit_test(test_cost_repair_wins),
		cmocka_unit_test(test_cost_forced_and_probe),
		cmocka_unit_test(test_cost_local),
		cmocka_unit_test(test_cost_measure),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* tests/unit/test_sink_sm.c — one version at one sink (daemon/sink_sm.h):
 * every state × event against the table in docs/SYNC.md ("A version at a
 * sink"), transcribed here cell by cell as "next action" (not read from
 * sink_sm.c); the doc's table itself, parsed (tests/unit/doc_table.h)
 * and compared with the code cell by cell; and the state a sink's fields
 * give a version. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include "daemon/sink_sm.h"
#include "tests/unit/doc_table.h"

/* Columns: record, contradicts, complete, complete_no_base, worker_ok,
 * worker_failed, apply, cap, detached, replan, shutdown, superseded,
 * parked, unpark.  "-" is the
 * table's "—": the state is kept and nothing is done. */
static const char *const want[SINK_V_COUNT][SINK_EV_COUNT] = {
	[SINK_V_NONE] = { "collecting keep", "-", "-", "-", "-", "-", "none not_staged", "-", "-",
			  "-", "-", "-", "arriving arrive", "-" },
	[SINK_V_COLLECTING] = { "collecting keep", "refused refuse", "staging stage",
				"gone base_mismatch", "-", "-", "collecting not_staged",
				"gone drop_counted", "gone free", "gone free", "collecting stay",
				"gone free", "arriving arrive", "-" },
	[SINK_V_REFUSED] = { "refused drop", "refused drop", "-", "-", "-", "-",
			     "refused not_staged", "gone drop_counted", "gone free", "gone free",
			     "gone free", "gone free", "-", "-" },
	[SINK_V_STAGING] = { "staging drop", "staging drop", "-", "-", "staged send_staged",
			     "gone refuse", "staging not_staged", "-", "gone drop_result",
			     "staging continue", "gone cancel", "gone drop_result", "-", "-" },
	[SINK_V_STAGED] = { "staged drop", "staged drop", "-", "-", "-", "-", "applying apply",
			    "gone cap_refuse", "gone free", "staged stay", "gone free", "gone free",
			    "-", "-" },
	[SINK_V_APPLYING] = { "applying drop", "applying drop", "-", "-",
			      "applied send_applied", "failed send_checksum_failed",
			      "applying busy", "-", "gone went_away", "applying continue",
			      "applying drain", "-", "-", "-" },
	[SINK_V_APPLIED] = { "applied drop", "applied drop", "-", "-", "-", "-", "applied answer",
			     "-", "gone free", "-", "-", "-", "-", "-" },
	[SINK_V_FAILED] = { "failed drop", "failed drop", "-", "-", "-", "-", "failed answer", "-",
			    "gone free", "-", "-", "-", "-", "-" },
	[SINK_V_ARRIVING] = { "arriving swap", "undoing undo", "arriving verify", "-",
			      "staged send_staged", "undoing undo", "arriving not_staged", "-",
			      "gone undo", "undoing undo", "gone undo", "-", "-",
			      "retreating retreat" },
	[SINK_V_UNDOING] = { "undoing drop", "undoing drop", "-", "-", "gone send_failed",
			     "undoing continue",
			     "undoing not_staged", "-", "gone continue", "undoing continue",
			     "gone drain", "-", "-", "undoing continue" },
	[SINK_V_RETREATING] = { "retreating keep", "undoing refuse", "retreating stay", "-",
				"collecting restage", "retreating continue", "retreating not_staged", "-",
				"gone continue", "undoing continue", "gone drain", "-",
				"retreating stay", "retreating continue" },
	[SINK_V_GONE] = { "gone drop", "gone drop", "-", "-", "-", "-", "gone not_staged", "-", "-",
			  "-", "-", "-", "-", "-" },
};

static void test_every_cell(void **state)
{
	unsigned cells = 0, acting = 0;

	(void)state;
	for (int s = 0; s < SINK_V_COUNT; s++) {
		for (int e = 0; e < SINK_EV_COUNT; e++) {
			struct sink_step st = sink_sm_step((enum sink_vstate)s, (enum sink_vevent)e);
			char got[96];

			assert_non_null(want[s][e]);
			if (st.act == SINK_A_NONE) {
				/* "—" keeps the state */
				assert_int_equal(st.next, s);
				snprintf(got, sizeof(got), "-");
			} else {
				snprintf(got, sizeof(got), "%s %s", sink_sm_state_name(st.next),
					 sink_sm_action_name(st.act));
				acting++;
			}
			if (strcmp(got, want[s][e]))
				fail_msg("%s × event %d: %s, the table says %s",
					 sink_sm_state_name((enum sink_vstate)s), e, got, want[s][e]);
			cells++;
		}
	}
	assert_int_equal(cells, SINK_V_COUNT * SINK_EV_COUNT);
	/* out of range: nothing */
	assert_int_equal(sink_sm_step(SINK_V_COUNT, SINK_EV_RECORD).act, SINK_A_NONE);
	assert_int_equal(sink_sm_step(SINK_V_COLLECTING, SINK_EV_COUNT).act, SINK_A_NONE);
	print_message("sink-sm: cells=%u acting=%u\n", cells, acting);
}

/* Every record of a version the sink already holds, or is staging, or
 * refused, is dropped; only a new or collecting version keeps it. */
static void test_records(void **state)
{
	(void)state;
	for (int s = 0; s < SINK_V_COUNT; s++) {
		enum sink_vaction a = sink_sm_step((enum sink_vstate)s, SINK_EV_RECORD).act;

		if (s == SINK_V_NONE || s == SINK_V_COLLECTING || s == SINK_V_RETREATING)
			assert_int_equal(a, SINK_A_KEEP);
		else if (s == SINK_V_ARRIVING)
			assert_int_equal(a, SINK_A_SWAP);	/* kept, and swapped in */
		else
			assert_int_equal(a, SINK_A_DROP);
	}
}

static void test_state_of_fields(void **state)
{
	/* held 7: applied 3, an apply to 5 on a worker, 6 and 7 staged,
	 * 9 being staged, 10 collecting, 11 refused */
	struct sink_view w = { .held = 7, .staging = 9, .applying = 5, .applied = 3 };

	(void)state;
	assert_int_equal(sink_sm_state(&w, 2), SINK_V_APPLIED);
	assert_int_equal(sink_sm_state(&w, 3), SINK_V_APPLIED);
	assert_int_equal(sink_sm_state(&w, 4), SINK_V_APPLYING);
	assert_int_equal(sink_sm_state(&w, 5), SINK_V_APPLYING);
	w.chained = 1;
	assert_int_equal(sink_sm_state(&w, 6), SINK_V_STAGED);
	w.chained = 0;
	assert_int_equal(sink_sm_state(&w, 6), SINK_V_GONE);	/* superseded, not in the chain */
	assert_int_equal(sink_sm_state(&w, 7), SINK_V_GONE);
	assert_int_equal(sink_sm_state(&w, 8), SINK_V_NONE);
	assert_int_equal(sink_sm_state(&w, 9), SINK_V_STAGING);
	w.pending = 1;
	assert_int_equal(sink_sm_state(&w, 10), SINK_V_COLLECTING);
	w.pending = 2;
	assert_int_equal(sink_sm_state(&w, 11), SINK_V_REFUSED);
	/* a pending record at or below held is dropped as held, like before */
	assert_int_equal(sink_sm_state(&w, 7), SINK_V_GONE);
	/* nothing applying: 4 and 5 are gone (held 7 covers them) */
	w.applying = 0;
	w.pending = 0;
	assert_int_equal(sink_sm_state(&w, 4), SINK_V_GONE);
	/* the version on arrival: its own state, whatever else the fields say */
	w.arrive = 8;
	w.arrive_state = SINK_V_UNDOING;
	assert_int_equal(sink_sm_state(&w, 8), SINK_V_UNDOING);
	w.arrive_state = SINK_V_ARRIVING;
	assert_int_equal(sink_sm_state(&w, 8), SINK_V_ARRIVING);
	assert_int_equal(sink_sm_state(&w, 9), SINK_V_STAGING);
	/* a version whose check failed and was undone: failed, the sink on
	 * the version before it; one that failed and was not undone (device
	 * writes: applied moved on to it) is failed too */
	w.arrive = 0;
	w.applied = 3;
	w.failed = 4;
	assert_int_equal(sink_sm_state(&w, 4), SINK_V_FAILED);
	assert_int_equal(sink_sm_state(&w, 3), SINK_V_APPLIED);
	w.applied = 4;
	assert_int_equal(sink_sm_state(&w, 4), SINK_V_FAILED);
	w.failed = 0;
	assert_int_equal(sink_sm_state(&w, 4), SINK_V_APPLIED);
	/* a fresh sink */
	memset(&w, 0, sizeof(w));
	assert_int_equal(sink_sm_state(&w, 1), SINK_V_NONE);
}

/* The doc's table itself (docs/SYNC.md, "A version at a sink"; the test
 * runs from the repo root): a row per state, one column per event in
 * enum order, each cell "next action" in sink_sm.h's names ("—": the
 * code does nothing), compared with the code cell by cell. */
static void test_doc_table(void **state)
{
	static struct doc_table t;
	int rows = doc_table_read("docs/SYNC.md", "| state \xef\xbc\xbc event", SINK_EV_COUNT, &t);
	unsigned cells = 0, dashes = 0;

	(void)state;
	if (rows == -1) {
		skip();
		return;
	}
	if (rows < 0)
		fail_msg("docs/SYNC.md: sink table: %d %s", rows, t.bad);
	for (int r = 0; r < rows; r++) {
		int s = -1;

		for (int k = 0; k < SINK_V_COUNT; k++)
			if (!strcmp(t.cell[r][0], sink_sm_state_name((enum sink_vstate)k)))
				s = k;
		if (s < 0)
			fail_msg("docs/SYNC.md: a row of no state: \"%s\"", t.cell[r][0]);
		/* in the table's order: one row per state, as the enum */
		assert_int_equal(s, r);
		for (int e = 0; e < SINK_EV_COUNT; e++) {
			struct sink_step st = sink_sm_step((enum sink_vstate)s, (enum sink_vevent)e);
			char got[96];

			if (st.act == SINK_A_NONE)
				snprintf(got, sizeof(got), "\xe2\x80\x94");
			else
				snprintf(got, sizeof(got), "%s %s", sink_sm_state_name(st.next),
					 sink_sm_action_name(st.act));
			if (strcmp(t.cell[r][1 + e], got))
				fail_msg("docs/SYNC.md %s x event %d: the doc says \"%s\", the code \"%s\"",
					 sink_sm_state_name((enum sink_vstate)s), e, t.cell[r][1 + e],
					 got);
			dashes += st.act == SINK_A_NONE;
			cells++;
		}
	}
	assert_int_equal(rows, SINK_V_COUNT);
	print_message("sink-sm-doc: rows=%d cols=%d cells=%u dashes=%u\n", rows, SINK_EV_COUNT,
		      cells, dashes);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_cell),
		cmocka_unit_test(test_records),
		cmocka_unit_test(test_state_of_fields),
		cmocka_unit_test(test_doc_table),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

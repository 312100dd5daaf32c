/* tests/unit/test_coord_sm.c — the coordinator's membership and plan
 * terms (daemon/coord_sm.h): every member state × event and every sender
 * × term cell, against tables transcribed here from docs/SYNC.md ("Terms,
 * acknowledgements and restarts") cell by cell (not read from coord_sm.c),
 * and the doc's tables themselves, parsed (tests/unit/doc_table.h) and
 * compared with the code cell by cell. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include "daemon/coord_sm.h"
#include "proto/peer_protocol.h"
#include "tests/unit/doc_sm.h"

/* Columns: join_new, join_seen, join_empty, join_refused, leave,
 * leave_last, plan_sent, ack_current, ack_other, retry_due, deadline,
 * node_down.  "-" is the table's "—". */
static const char *const want[COORD_M_COUNT][COORD_EV_COUNT] = {
	[COORD_M_ABSENT] = { "planned replan", "-", "absent answer", "absent refuse", "-", "-",
			     "-", "-", "absent ignore", "-", "-", "-" },
	[COORD_M_JOINED] = { "planned replan", "joined resend", "absent depart", "joined refuse",
			     "planned replan", "absent remove", "planned send", "-",
			     "joined ignore", "-", "-", "absent remove" },
	[COORD_M_PLANNED] = { "planned replan", "planned resend", "absent depart",
			      "planned refuse", "planned replan", "absent remove", "planned send",
			      "acked ack", "planned ignore", "planned retry", "expired expire",
			      "absent remove" },
	[COORD_M_ACKED] = { "planned replan", "acked resend", "absent depart", "acked refuse",
			    "planned replan", "absent remove", "planned send", "-", "acked ignore",
			    "-", "-", "absent remove" },
	[COORD_M_EXPIRED] = { "planned replan", "expired resend", "absent depart",
			      "expired refuse", "planned replan", "absent remove", "planned send",
			      "acked ack", "expired ignore", "-", "expired retry_slow",
			      "absent remove" },
};

static void cell_of(enum coord_mstate s, enum coord_mevent e, char *got, size_t len)
{
	struct coord_step st = coord_sm_step(s, e);

	if (st.act == COORD_A_NONE) {
		assert_int_equal(st.next, s);	/* "—" keeps the state */
		snprintf(got, len, "-");
	} else {
		snprintf(got, len, "%s %s", coord_sm_state_name(st.next),
			 coord_sm_action_name(st.act));
	}
}

static void member_cell(int s, int e, char *got, size_t len)
{
	cell_of((enum coord_mstate)s, (enum coord_mevent)e, got, len);
}

static const char *member_state(int s)
{
	return coord_sm_state_name((enum coord_mstate)s);
}

static const char *member_event(int e)
{
	return coord_sm_event_name((enum coord_mevent)e);
}

static const struct doc_sm member_sm = {
	"member", COORD_M_COUNT, COORD_EV_COUNT, member_cell, member_state, member_event
};

static void test_every_cell(void **state)
{
	unsigned acting;

	(void)state;
	acting = doc_sm_check_want(&member_sm, &want[0][0]);
	assert_int_equal(coord_sm_step(COORD_M_COUNT, COORD_EV_JOIN_NEW).act, COORD_A_NONE);
	assert_int_equal(coord_sm_step(COORD_M_ACKED, COORD_EV_COUNT).act, COORD_A_NONE);
	print_message("coord-sm: cells=%d acting=%u\n", COORD_M_COUNT * COORD_EV_COUNT, acting);
}

/* What every member state does for its node going away, and that only a
 * planned member is retried. */
static void test_rules(void **state)
{
	(void)state;
	for (int s = 0; s < COORD_M_COUNT; s++) {
		struct coord_step d = coord_sm_step((enum coord_mstate)s, COORD_EV_NODE_DOWN);
		struct coord_step r = coord_sm_step((enum coord_mstate)s, COORD_EV_RETRY_DUE);

		if (s == COORD_M_ABSENT) {
			assert_int_equal(d.act, COORD_A_NONE);
		} else {
			assert_int_equal(d.act, COORD_A_REMOVE);
			assert_int_equal(d.next, COORD_M_ABSENT);
		}
		assert_int_equal(r.act, s == COORD_M_PLANNED ? COORD_A_RETRY : COORD_A_NONE);
		/* a refused JOIN never changes membership */
		assert_int_equal(coord_sm_step((enum coord_mstate)s, COORD_EV_JOIN_REFUSED).next, s);
	}
}

static void test_state_of_fields(void **state)
{
	struct coord_mview w = { 0 };

	(void)state;
	assert_int_equal(coord_sm_member_state(&w), COORD_M_ABSENT);
	w.member = 1;
	assert_int_equal(coord_sm_member_state(&w), COORD_M_JOINED);
	w.has_plan = 1;
	w.plan_term = peer_term(5, 2);
	w.acked_term = peer_term(5, 1);
	assert_int_equal(coord_sm_member_state(&w), COORD_M_PLANNED);
	w.expired = 1;
	assert_int_equal(coord_sm_member_state(&w), COORD_M_EXPIRED);
	w.acked_term = w.plan_term;
	assert_int_equal(coord_sm_member_state(&w), COORD_M_ACKED);	/* expired or not */
	w.expired = 0;
	assert_int_equal(coord_sm_member_state(&w), COORD_M_ACKED);
}

/* ------------------------------------------------------------ PLAN taken */

enum { TC_PROTO, TC_NOT_TERM, TC_RETIRED, TC_SAME, TC_OLDER, TC_OTHER_BOOT, TC_NEWER, TC_COUNT };

static const char *const want_plan[2][TC_COUNT] = {
	{ "reject", "refuse_not_term", "ignore_retired", "ack_again", "ignore_stale",
	  "adopt_new_boot", "adopt" },
	{ "refuse_proto", "refuse_not_coordinator", "refuse_not_coordinator",
	  "refuse_not_coordinator", "refuse_not_coordinator", "refuse_not_coordinator",
	  "refuse_not_coordinator" },
};

static const uint64_t retired_boots[PEER_TERM_RETIRED] = { 11, 12, 13, 14, 15, 16, 17, 18 };

/* A PLAN of the column's kind against a member holding term (7, 5) with
 * boots 11..18 retired. */
static struct coord_plan_in plan_in(int from_coord, int col)
{
	struct coord_plan_in in = {
		.proto_ok = 1, .from_coord = from_coord, .held = peer_term(7, 5),
		.retired = retired_boots, .nretired = PEER_TERM_RETIRED,
	};

	switch (col) {
	case TC_PROTO:
		in.proto_ok = 0;
		in.term = peer_term(7, 6);
		break;
	case TC_NOT_TERM:
		in.term = peer_term(7, 0);
		break;
	case TC_RETIRED:
		in.term = peer_term(13, 9);
		break;
	case TC_SAME:
		in.term = peer_term(7, 5);
		break;
	case TC_OLDER:
		in.term = peer_term(7, 4);
		break;
	case TC_OTHER_BOOT:
		in.term = peer_term(3, 1);	/* a smaller boot supersedes too */
		break;
	default:
		in.term = peer_term(7, 6);
		break;
	}
	return in;
}

static void test_plan_cells(void **state)
{
	unsigned cells = 0;

	(void)state;
	for (int r = 0; r < 2; r++)
		for (int c = 0; c < TC_COUNT; c++) {
			struct coord_plan_in in = plan_in(!r, c);
			struct coord_plan_out o = coord_sm_plan(&in);

			assert_non_null(o.reason);
			if (strcmp(coord_sm_verdict_name(o.v), want_plan[r][c]))
				fail_msg("plan %s × column %d: %s, the table says %s",
					 r ? "another" : "coordinator", c,
					 coord_sm_verdict_name(o.v), want_plan[r][c]);
			cells++;
		}
	print_message("coord-sm-plan: cells=%u\n", cells);
}

/* The faults of issue #17, as decisions. */
static void test_plan_cases(void **state)
{
	struct coord_plan_in in = plan_in(1, TC_NEWER);

	(void)state;
	/* a forged PLAN with a huge term from a non-coordinator: refused */
	in.from_coord = 0;
	in.term = peer_term((1ull << PEER_TERM_BOOT_BITS) - 1, (1ull << PEER_TERM_COUNTER_BITS) - 1);
	assert_int_equal(coord_sm_plan(&in).v, COORD_P_REFUSE_NOT_COORD);
	/* a restarted coordinator plans from counter 1 under a new boot:
	 * taken although its counter is below the held one */
	in.from_coord = 1;
	in.term = peer_term(99, 1);
	assert_int_equal(coord_sm_plan(&in).v, COORD_P_ADOPT_NEW_BOOT);
	/* the first plan a member takes */
	in.held = 0;
	assert_int_equal(coord_sm_plan(&in).v, COORD_P_ADOPT);
	/* boot 0 is no term */
	in.term = peer_term(0, 3);
	assert_int_equal(coord_sm_plan(&in).v, COORD_P_REFUSE_NOT_TERM);
	/* only the retired boots counted are retired */
	in.held = peer_term(7, 5);
	in.term = peer_term(18, 2);
	in.nretired = 3;
	assert_int_equal(coord_sm_plan(&in).v, COORD_P_ADOPT_NEW_BOOT);
	in.term = peer_term(12, 2);
	assert_int_equal(coord_sm_plan(&in).v, COORD_P_IGNORE_RETIRED);
	/* which verdicts mean the coordinator was heard */
	for (int v = 0; v < COORD_P_COUNT; v++)
		assert_int_equal(coord_sm_plan_heard((enum coord_plan_verdict)v),
				 v <= COORD_P_IGNORE_RETIRED);
}

/* ------------------------------------------------------ the doc's tables */

static void test_doc_member_table(void **state)
{
	unsigned dashes;
	int rows = doc_sm_check(&member_sm, "docs/SYNC.md", "| member state \xef\xbc\xbc event",
				&dashes);

	(void)state;
	if (rows == -1) {
		skip();
		return;
	}
	print_message("coord-sm-doc: rows=%d cols=%d dashes=%u\n", rows, COORD_EV_COUNT, dashes);
}

static void test_doc_plan_table(void **state)
{
	static struct doc_table t;
	int rows = doc_table_read("docs/SYNC.md", "| sender \xef\xbc\xbc term", TC_COUNT, &t);

	(void)state;
	if (rows == -1) {
		skip();
		return;
	}
	if (rows < 0)
		fail_msg("docs/SYNC.md: plan table: %d %s", rows, t.bad);
	assert_int_equal(rows, 2);
	assert_string_equal(t.cell[0][0], "the job's coordinator");
	assert_string_equal(t.cell[1][0], "another daemon");
	for (int r = 0; r < 2; r++)
		for (int c = 0; c < TC_COUNT; c++) {
			struct coord_plan_in in = plan_in(!r, c);
			const char *got = coord_sm_verdict_name(coord_sm_plan(&in).v);

			if (strcmp(t.cell[r][1 + c], got))
				fail_msg("docs/SYNC.md plan %s × column %d: the doc says \"%s\", the "
					 "code \"%s\"", t.cell[r][0], c, t.cell[r][1 + c], got);
		}
	print_message("coord-sm-plan-doc: rows=%d cols=%d\n", rows, TC_COUNT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_cell),
		cmocka_unit_test(test_rules),
		cmocka_unit_test(test_state_of_fields),
		cmocka_unit_test(test_plan_cells),
		cmocka_unit_test(test_plan_cases),
		cmocka_unit_test(test_doc_member_table),
		cmocka_unit_test(test_doc_plan_table),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

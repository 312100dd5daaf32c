/* tests/unit/test_reader_sm.c — one local sink fed by a storage reader
 * (daemon/reader_sm.h): every state × event against a table transcribed
 * here from docs/SYNC.md ("A sink fed from storage") cell by cell (not
 * read from reader_sm.c), the events a read's result and an apply give,
 * and the doc's table itself, parsed (tests/unit/doc_table.h) and compared
 * with the code cell by cell. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include "daemon/reader_sm.h"
#include "tests/unit/doc_sm.h"

/* Columns: announced, read, read_staged, read_not_staged, read_skipped,
 * applied, apply_failed, not_applied, gone.  "-" is the table's "—". */
static const char *const want[READER_S_COUNT][READER_EV_COUNT] = {
	[READER_S_NONE] = { "dense make", "-", "-", "-", "-", "-", "-", "-", "-" },
	[READER_S_DENSE] = { "-", "dense stage_dense", "staged hand", "dense not_staged",
			     "dense wait", "-", "-", "-", "none free" },
	[READER_S_SYNCED] = { "-", "synced stage_sparse", "staged hand", "dense not_staged", "-",
			      "-", "-", "-", "none free" },
	[READER_S_STAGED] = { "-", "-", "-", "-", "-", "synced verify", "dense repair",
			      "staged wait", "none free" },
};

static void cell_of(enum reader_sstate s, enum reader_sevent e, char *got, size_t len)
{
	struct reader_step st = reader_sm_step(s, e);

	if (st.act == READER_A_NONE) {
		assert_int_equal(st.next, s);	/* "—" keeps the state */
		snprintf(got, len, "-");
	} else {
		snprintf(got, len, "%s %s", reader_sm_state_name(st.next),
			 reader_sm_action_name(st.act));
	}
}

static void reader_cell(int s, int e, char *got, size_t len)
{
	cell_of((enum reader_sstate)s, (enum reader_sevent)e, got, len);
}

static const char *reader_state(int s)
{
	return reader_sm_state_name((enum reader_sstate)s);
}

static const char *reader_event(int e)
{
	return reader_sm_event_name((enum reader_sevent)e);
}

static const struct doc_sm reader_sm = {
	"reader", READER_S_COUNT, READER_EV_COUNT, reader_cell, reader_state, reader_event
};

static void test_every_cell(void **state)
{
	unsigned acting;

	(void)state;
	acting = doc_sm_check_want(&reader_sm, &want[0][0]);
	/* out of range: nothing */
	assert_int_equal(reader_sm_step(READER_S_COUNT, READER_EV_READ).act, READER_A_NONE);
	assert_int_equal(reader_sm_step(READER_S_DENSE, READER_EV_COUNT).act, READER_A_NONE);
	print_message("reader-sm: cells=%d acting=%u\n", READER_S_COUNT * READER_EV_COUNT, acting);
}

/* The rules the storage reader stands on (docs/STORAGE.md, "Reader"). */
static void test_rules(void **state)
{
	(void)state;
	for (int s = 0; s < READER_S_COUNT; s++) {
		struct reader_step g = reader_sm_step((enum reader_sstate)s, READER_EV_GONE);
		struct reader_step r = reader_sm_step((enum reader_sstate)s, READER_EV_READ);

		/* every sink the reader knows is freed when it goes */
		if (s == READER_S_NONE) {
			assert_int_equal(g.act, READER_A_NONE);
		} else {
			assert_int_equal(g.act, READER_A_FREE);
			assert_int_equal(g.next, READER_S_NONE);
		}
		/* a read never changes a sink's state: the loop leaves the
		 * rsinks alone while it is out */
		assert_int_equal(r.next, s);
		/* only a staged sink's apply is looked at */
		for (int e = READER_EV_APPLIED; e <= READER_EV_NOT_APPLIED; e++)
			assert_int_equal(reader_sm_step((enum reader_sstate)s,
							 (enum reader_sevent)e).act == READER_A_NONE,
					 s != READER_S_STAGED);
	}
	/* whatever fails, the next version is dense */
	assert_int_equal(reader_sm_step(READER_S_STAGED, READER_EV_APPLY_FAILED).next,
			 READER_S_DENSE);
	assert_int_equal(reader_sm_step(READER_S_SYNCED, READER_EV_READ_NOT_STAGED).next,
			 READER_S_DENSE);
	assert_int_equal(reader_sm_step(READER_S_DENSE, READER_EV_READ_NOT_STAGED).next,
			 READER_S_DENSE);
	/* only a verified apply makes a delta the next step */
	for (int s = 0; s < READER_S_COUNT; s++)
		for (int e = 0; e < READER_EV_COUNT; e++) {
			struct reader_step st = reader_sm_step((enum reader_sstate)s,
							       (enum reader_sevent)e);

			if (st.act != READER_A_NONE && st.next == READER_S_SYNCED && s != READER_S_SYNCED)
				assert_int_equal(st.act, READER_A_VERIFY);
		}
}

static void test_events(void **state)
{
	(void)state;
	assert_int_equal(reader_sm_read_event(0, 1), READER_EV_READ_STAGED);
	assert_int_equal(reader_sm_read_event(0, 0), READER_EV_READ_NOT_STAGED);
	assert_int_equal(reader_sm_read_event(1, 0), READER_EV_READ_SKIPPED);
	/* applied below the version staged: not yet, whatever the counters */
	assert_int_equal(reader_sm_apply_event(6, 7, 0, 0), READER_EV_NOT_APPLIED);
	assert_int_equal(reader_sm_apply_event(6, 7, 1, 0), READER_EV_NOT_APPLIED);
	assert_int_equal(reader_sm_apply_event(7, 7, 2, 2), READER_EV_APPLIED);
	assert_int_equal(reader_sm_apply_event(7, 7, 3, 2), READER_EV_APPLY_FAILED);
	/* applied past it counts too: the sink is at or past the version */
	assert_int_equal(reader_sm_apply_event(9, 7, 0, 0), READER_EV_APPLIED);
}

/* A sink's life through the table: made, read densely, staged, verified,
 * then deltas; a failed checksum makes it dense again. */
static void test_walk(void **state)
{
	static const struct {
		enum reader_sevent ev;
		enum reader_sstate next;
		enum reader_saction act;
	} walk[] = {
		{ READER_EV_ANNOUNCED, READER_S_DENSE, READER_A_MAKE },
		{ READER_EV_READ, READER_S_DENSE, READER_A_STAGE_DENSE },
		{ READER_EV_READ_SKIPPED, READER_S_DENSE, READER_A_WAIT },
		{ READER_EV_READ, READER_S_DENSE, READER_A_STAGE_DENSE },
		{ READER_EV_READ_STAGED, READER_S_STAGED, READER_A_HAND },
		{ READER_EV_NOT_APPLIED, READER_S_STAGED, READER_A_WAIT },
		{ READER_EV_APPLIED, READER_S_SYNCED, READER_A_VERIFY },
		{ READER_EV_READ, READER_S_SYNCED, READER_A_STAGE_SPARSE },
		{ READER_EV_READ_STAGED, READER_S_STAGED, READER_A_HAND },
		{ READER_EV_APPLY_FAILED, READER_S_DENSE, READER_A_REPAIR },
		{ READER_EV_READ, READER_S_DENSE, READER_A_STAGE_DENSE },
		{ READER_EV_READ_NOT_STAGED, READER_S_DENSE, READER_A_NOT_STAGED },
		{ READER_EV_GONE, READER_S_NONE, READER_A_FREE },
	};
	enum reader_sstate s = READER_S_NONE;

	(void)state;
	for (size_t i = 0; i < sizeof(walk) / sizeof(walk[0]); i++) {
		struct reader_step st = reader_sm_step(s, walk[i].ev);

		assert_int_equal(st.act, walk[i].act);
		assert_int_equal(st.next, walk[i].next);
		s = st.next;
	}
}

/* The doc's table itself (docs/SYNC.md, "A sink fed from storage"; the
 * test runs from the repo root). */
static void test_doc_table(void **state)
{
	unsigned dashes;
	int rows = doc_sm_check(&reader_sm, "docs/SYNC.md", "| reader sink \xef\xbc\xbc event",
				&dashes);

	(void)state;
	if (rows == -1) {
		skip();
		return;
	}
	print_message("reader-sm-doc: rows=%d cols=%d dashes=%u\n", rows, READER_EV_COUNT, dashes);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_cell),
		cmocka_unit_test(test_rules),
		cmocka_unit_test(test_events),
		cmocka_unit_test(test_walk),
		cmocka_unit_test(test_doc_table),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

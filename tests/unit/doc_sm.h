/* tests/unit/doc_sm.h — a state machine's state × event table in
 * docs/SYNC.md held to its code, cell by cell, for the state-machine tests
 * (test_coord_sm.c, test_pair_sm.c, test_reader_sm.c).  Include after
 * <cmocka.h>.
 *
 * A machine is seen through struct doc_sm: how many states and events,
 * their names, and cell(s, e): the code's "next action" for that cell, or
 * "-" where the event does not reach the state.  doc_sm_check() reads the
 * table whose header line starts with `head` (doc_table.h), finds each
 * row's state by name (every state once), and fails on the first cell
 * where the doc (an em dash read as "-") and the code differ.  Returns the
 * number of rows and *dashes the dash cells; -1 when the doc cannot be
 * read (the caller skips). */
#ifndef DTED_TEST_DOC_SM_H
#define DTED_TEST_DOC_SM_H

#include "tests/unit/doc_table.h"

struct doc_sm {
	const char *what;         /* "pair", "member", "reader": in messages */
	int nstates, nevents;
	void (*cell)(int s, int e, char *got, size_t len);
	const char *(*state_name)(int s);
	const char *(*event_name)(int e);
};

static inline int doc_sm_check(const struct doc_sm *sm, const char *path, const char *head,
			       unsigned *dashes)
{
	static struct doc_table t;
	int rows = doc_table_read(path, head, sm->nevents, &t);
	uint64_t seen = 0;

	*dashes = 0;
	if (rows == -1)
		return -1;
	if (rows < 0)
		fail_msg("%s: %s table: %d %s", path, sm->what, rows, t.bad);
	assert_int_equal(rows, sm->nstates);
	for (int r = 0; r < rows; r++) {
		int s = -1;

		for (int k = 0; k < sm->nstates; k++)
			if (!strcmp(t.cell[r][0], sm->state_name(k)))
				s = k;
		if (s < 0)
			fail_msg("%s: a row of no %s state: \"%s\"", path, sm->what, t.cell[r][0]);
		assert_false(seen & (1ull << s));
		seen |= 1ull << s;
		for (int e = 0; e < sm->nevents; e++) {
			const char *doc = t.cell[r][1 + e];
			char got[96];

			sm->cell(s, e, got, sizeof(got));
			if (!strcmp(doc, "\xe2\x80\x94")) {
				doc = "-";
				(*dashes)++;
			}
			if (strcmp(doc, got))
				fail_msg("%s %s × %s: the doc says \"%s\", the code \"%s\"", path,
					 sm->state_name(s), sm->event_name(e), doc, got);
		}
	}
	return rows;
}

/* The same against a typed copy of the table in the test (want[s][e],
 * nstates × nevents, row-major): every cell; returns the acting ones
 * (not "-"). */
static inline unsigned doc_sm_check_want(const struct doc_sm *sm, const char *const *want)
{
	unsigned acting = 0;

	for (int s = 0; s < sm->nstates; s++)
		for (int e = 0; e < sm->nevents; e++) {
			const char *w = want[s * sm->nevents + e];
			char got[96];

			assert_non_null(w);
			sm->cell(s, e, got, sizeof(got));
			if (strcmp(got, w))
				fail_msg("%s × %s: %s, the table says %s", sm->state_name(s),
					 sm->event_name(e), got, w);
			acting += strcmp(got, "-") != 0;
		}
	return acting;
}

#endif

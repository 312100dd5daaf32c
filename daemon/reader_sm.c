/* daemon/reader_sm.c — one local sink fed by a storage reader
 * (reader_sm.h; docs/SYNC.md, "A sink fed from storage"). */
#include "daemon/reader_sm.h"

#define S(n, a) { READER_S_##n, READER_A_##a }
#define NO(n)   { READER_S_##n, READER_A_NONE }

/* Rows: states; columns: enum reader_sevent in order (ANNOUNCED, READ,
 * READ_STAGED, READ_NOT_STAGED, READ_SKIPPED, APPLIED, APPLY_FAILED,
 * NOT_APPLIED, GONE). */
static const struct reader_step table[READER_S_COUNT][READER_EV_COUNT] = {
	[READER_S_NONE] = { S(DENSE, MAKE), NO(NONE), NO(NONE), NO(NONE), NO(NONE), NO(NONE),
			    NO(NONE), NO(NONE), NO(NONE) },
	/* Skipped: no keyframe could rebuild the version; it waits for the
	 * next one, dense again. */
	[READER_S_DENSE] = { NO(DENSE), S(DENSE, STAGE_DENSE), S(STAGED, HAND),
			     S(DENSE, NOT_STAGED), S(DENSE, WAIT), NO(DENSE), NO(DENSE), NO(DENSE),
			     S(NONE, FREE) },
	/* A synced sink is never skipped: a keyframe carries every value, a
	 * delta needs nothing rebuilt for it. */
	[READER_S_SYNCED] = { NO(SYNCED), S(SYNCED, STAGE_SPARSE), S(STAGED, HAND),
			      S(DENSE, NOT_STAGED), NO(SYNCED), NO(SYNCED), NO(SYNCED),
			      NO(SYNCED), S(NONE, FREE) },
	/* No read goes out while a staged version waits for its apply. */
	[READER_S_STAGED] = { NO(STAGED), NO(STAGED), NO(STAGED), NO(STAGED), NO(STAGED),
			      S(SYNCED, VERIFY), S(DENSE, REPAIR), S(STAGED, WAIT), S(NONE, FREE) },
};

struct reader_step reader_sm_step(enum reader_sstate s, enum reader_sevent ev)
{
	if ((unsigned)s >= READER_S_COUNT || (unsigned)ev >= READER_EV_COUNT)
		return (struct reader_step){ READER_S_NONE, READER_A_NONE };
	return table[s][ev];
}

enum reader_sevent reader_sm_read_event(int skipped, int staged)
{
	if (skipped)
		return READER_EV_READ_SKIPPED;
	return staged ? READER_EV_READ_STAGED : READER_EV_READ_NOT_STAGED;
}

enum reader_sevent reader_sm_apply_event(uint64_t applied, uint64_t version, uint64_t fails,
					 uint64_t fails0)
{
	if (applied < version)
		return READER_EV_NOT_APPLIED;
	return fails != fails0 ? READER_EV_APPLY_FAILED : READER_EV_APPLIED;
}

const char *reader_sm_state_name(enum reader_sstate s)
{
	static const char *const n[READER_S_COUNT] = { "none", "dense", "synced", "staged" };

	return (unsigned)s < READER_S_COUNT ? n[s] : "?";
}

const char *reader_sm_event_name(enum reader_sevent e)
{
	static const char *const n[READER_EV_COUNT] = {
		"announced", "read", "read_staged", "read_not_staged", "read_skipped", "applied",
		"apply_failed", "not_applied", "gone",
	};

	return (unsigned)e < READER_EV_COUNT ? n[e] : "?";
}

const char *reader_sm_action_name(enum reader_saction a)
{
	static const char *const n[READER_A_COUNT] = {
		"-", "make", "stage_dense", "stage_sparse", "hand", "not_staged", "wait", "verify",
		"repair", "free",
	};

	return (unsigned)a < READER_A_COUNT ? n[a] : "?";
}

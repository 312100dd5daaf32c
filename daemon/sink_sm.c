/* daemon/sink_sm.c — one version at one sink (sink_sm.h; docs/SYNC.md,
 * "A version at a sink"). */
#include "daemon/sink_sm.h"

#define S(n, a) { SINK_V_##n, SINK_A_##a }
#define NO(n)   { SINK_V_##n, SINK_A_NONE }

/* Rows: states; columns: enum sink_vevent in order (RECORD, CONTRADICTS,
 * COMPLETE, COMPLETE_NO_BASE, WORKER_OK, WORKER_FAILED, APPLY, CAP,
 * DETACHED, REPLAN, SHUTDOWN, SUPERSEDED, PARKED, UNPARK). */
static const struct sink_step table[SINK_V_COUNT][SINK_EV_COUNT] = {
	[SINK_V_NONE] = { S(COLLECTING, KEEP), NO(NONE), NO(NONE), NO(NONE), NO(NONE), NO(NONE),
			  S(NONE, NOT_STAGED), NO(NONE), NO(NONE), NO(NONE), NO(NONE), NO(NONE),
			  S(ARRIVING, ARRIVE), NO(NONE) },
	[SINK_V_COLLECTING] = { S(COLLECTING, KEEP), S(REFUSED, REFUSE), S(STAGING, STAGE),
				S(GONE, BASE_MISMATCH), NO(COLLECTING), NO(COLLECTING),
				S(COLLECTING, NOT_STAGED), S(GONE, DROP_COUNTED), S(GONE, FREE),
				S(GONE, FREE), S(COLLECTING, STAY), S(GONE, FREE),
			  S(ARRIVING, ARRIVE), NO(COLLECTING) },
	[SINK_V_REFUSED] = { S(REFUSED, DROP), S(REFUSED, DROP), NO(REFUSED), NO(REFUSED),
			     NO(REFUSED), NO(REFUSED), S(REFUSED, NOT_STAGED),
			     S(GONE, DROP_COUNTED), S(GONE, FREE), S(GONE, FREE), S(GONE, FREE),
			     S(GONE, FREE),
			  NO(REFUSED), NO(REFUSED) },
	[SINK_V_STAGING] = { S(STAGING, DROP), S(STAGING, DROP), NO(STAGING), NO(STAGING),
			     S(STAGED, SEND_STAGED), S(GONE, REFUSE), S(STAGING, NOT_STAGED),
			     NO(STAGING), S(GONE, DROP_RESULT), S(STAGING, CONTINUE),
			     S(GONE, CANCEL), S(GONE, DROP_RESULT),
			  NO(STAGING), NO(STAGING) },
	[SINK_V_STAGED] = { S(STAGED, DROP), S(STAGED, DROP), NO(STAGED), NO(STAGED), NO(STAGED),
			    NO(STAGED), S(APPLYING, APPLY), S(GONE, CAP_REFUSE), S(GONE, FREE),
			    S(STAGED, STAY), S(GONE, FREE), S(GONE, FREE),
			  NO(STAGED), NO(STAGED) },
	[SINK_V_APPLYING] = { S(APPLYING, DROP), S(APPLYING, DROP), NO(APPLYING), NO(APPLYING),
			      S(APPLIED, SEND_APPLIED), S(FAILED, SEND_CHECKSUM),
			      S(APPLYING, BUSY), NO(APPLYING), S(GONE, WENT_AWAY),
			      S(APPLYING, CONTINUE), S(APPLYING, DRAIN), NO(APPLYING),
			  NO(APPLYING), NO(APPLYING) },
	[SINK_V_APPLIED] = { S(APPLIED, DROP), S(APPLIED, DROP), NO(APPLIED), NO(APPLIED),
			     NO(APPLIED), NO(APPLIED), S(APPLIED, ANSWER), NO(APPLIED),
			     S(GONE, FREE), NO(APPLIED), NO(APPLIED), NO(APPLIED),
			  NO(APPLIED), NO(APPLIED) },
	[SINK_V_FAILED] = { S(FAILED, DROP), S(FAILED, DROP), NO(FAILED), NO(FAILED), NO(FAILED),
			    NO(FAILED), S(FAILED, ANSWER), NO(FAILED), S(GONE, FREE), NO(FAILED),
			    NO(FAILED), NO(FAILED),
			  NO(FAILED), NO(FAILED) },
	/* Apply on arrival.  Columns as above, then PARKED, UNPARK. */
	[SINK_V_ARRIVING] = { S(ARRIVING, SWAP), S(UNDOING, UNDO), S(ARRIVING, VERIFY), NO(ARRIVING),
			      S(STAGED, SEND_STAGED), S(UNDOING, UNDO), S(ARRIVING, NOT_STAGED),
			      NO(ARRIVING), S(GONE, UNDO), S(UNDOING, UNDO), S(GONE, UNDO),
			      NO(ARRIVING), NO(ARRIVING), S(RETREATING, RETREAT) },
	[SINK_V_UNDOING] = { S(UNDOING, DROP), S(UNDOING, DROP), NO(UNDOING), NO(UNDOING),
			     S(GONE, SEND_FAILED), S(UNDOING, CONTINUE), S(UNDOING, NOT_STAGED),
			     NO(UNDOING),
			     S(GONE, CONTINUE), S(UNDOING, CONTINUE), S(GONE, DRAIN), NO(UNDOING),
			     NO(UNDOING), S(UNDOING, CONTINUE) },
	[SINK_V_RETREATING] = { S(RETREATING, KEEP), S(UNDOING, REFUSE), S(RETREATING, STAY),
				NO(RETREATING), S(COLLECTING, RESTAGE), S(RETREATING, CONTINUE),
				S(RETREATING, NOT_STAGED), NO(RETREATING), S(GONE, CONTINUE),
				S(UNDOING, CONTINUE), S(GONE, DRAIN), NO(RETREATING),
				S(RETREATING, STAY), S(RETREATING, CONTINUE) },
	/* At or below the held version: whatever comes of it is dropped. */
	[SINK_V_GONE] = { S(GONE, DROP), S(GONE, DROP), NO(GONE), NO(GONE), NO(GONE), NO(GONE),
			  S(GONE, NOT_STAGED), NO(GONE), NO(GONE), NO(GONE), NO(GONE), NO(GONE),
			  NO(GONE), NO(GONE) },
};

struct sink_step sink_sm_step(enum sink_vstate s, enum sink_vevent ev)
{
	if ((unsigned)s >= SINK_V_COUNT || (unsigned)ev >= SINK_EV_COUNT)
		return (struct sink_step){ SINK_V_GONE, SINK_A_NONE };
	return table[s][ev];
}

enum sink_vstate sink_sm_state(const struct sink_view *w, uint64_t v)
{
	if (w->arrive && v == w->arrive)
		return w->arrive_state;	/* arriving, undoing or retreating */
	if (w->staging && v == w->staging)
		return SINK_V_STAGING;
	if (w->chained)
		return SINK_V_STAGED;
	/* An apply brings the sink from applied to applying: every version
	 * in between is on its way into the buffers. */
	if (w->applying && v > w->applied && v <= w->applying)
		return SINK_V_APPLYING;
	if (w->failed && v == w->failed)
		return SINK_V_FAILED;
	if (v <= w->applied)
		return SINK_V_APPLIED;
	if (v <= w->held)
		return SINK_V_GONE;	/* superseded: a later version is held */
	return w->pending == 2 ? SINK_V_REFUSED : w->pending ? SINK_V_COLLECTING : SINK_V_NONE;
}

const char *sink_sm_state_name(enum sink_vstate s)
{
	static const char *const n[SINK_V_COUNT] = {
		"none", "collecting", "refused", "staging", "staged", "applying", "applied",
		"failed", "arriving", "undoing", "retreating", "gone",
	};

	return (unsigned)s < SINK_V_COUNT ? n[s] : "?";
}

const char *sink_sm_action_name(enum sink_vaction a)
{
	static const char *const n[SINK_A_COUNT] = {
		"-", "keep", "drop", "refuse", "stage", "base_mismatch", "drop_counted", "free",
		"send_staged", "not_staged", "drop_result", "continue", "cancel", "apply",
		"cap_refuse", "send_applied", "send_checksum_failed", "busy", "went_away", "drain",
		"answer", "stay", "arrive", "swap", "verify", "undo", "retreat", "send_failed",
		"restage",
	};

	return (unsigned)a < SINK_A_COUNT ? n[a] : "?";
}

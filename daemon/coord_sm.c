/* daemon/coord_sm.c — membership and plan terms (coord_sm.h; docs/SYNC.md,
 * "Terms, acknowledgements and restarts"). */
#include "daemon/coord_sm.h"
#include "proto/peer_protocol.h"

#define S(n, a) { COORD_M_##n, COORD_A_##a }
#define NO(n)   { COORD_M_##n, COORD_A_NONE }

/* Rows: states; columns: enum coord_mevent in order (JOIN_NEW, JOIN_SEEN,
 * JOIN_EMPTY, JOIN_REFUSED, LEAVE, LEAVE_LAST, PLAN_SENT, ACK_CURRENT,
 * ACK_OTHER, RETRY_DUE, DEADLINE, NODE_DOWN). */
static const struct coord_step table[COORD_M_COUNT][COORD_EV_COUNT] = {
	/* A JOIN with no participants is answered, member or not: the
	 * member retries it until then (a lost one left a ghost). */
	[COORD_M_ABSENT] = { S(PLANNED, REPLAN), NO(ABSENT), S(ABSENT, ANSWER),
			     S(ABSENT, REFUSE), NO(ABSENT), NO(ABSENT), NO(ABSENT), NO(ABSENT),
			     S(ABSENT, IGNORE), NO(ABSENT), NO(ABSENT), NO(ABSENT) },
	[COORD_M_JOINED] = { S(PLANNED, REPLAN), S(JOINED, RESEND), S(ABSENT, DEPART),
			     S(JOINED, REFUSE), S(PLANNED, REPLAN), S(ABSENT, REMOVE),
			     S(PLANNED, SEND), NO(JOINED), S(JOINED, IGNORE), NO(JOINED),
			     NO(JOINED), S(ABSENT, REMOVE) },
	[COORD_M_PLANNED] = { S(PLANNED, REPLAN), S(PLANNED, RESEND), S(ABSENT, DEPART),
			      S(PLANNED, REFUSE), S(PLANNED, REPLAN), S(ABSENT, REMOVE),
			      S(PLANNED, SEND), S(ACKED, ACK), S(PLANNED, IGNORE),
			      S(PLANNED, RETRY), S(EXPIRED, EXPIRE), S(ABSENT, REMOVE) },
	/* A duplicate PLAN_ACK changes nothing. */
	[COORD_M_ACKED] = { S(PLANNED, REPLAN), S(ACKED, RESEND), S(ABSENT, DEPART),
			    S(ACKED, REFUSE), S(PLANNED, REPLAN), S(ABSENT, REMOVE),
			    S(PLANNED, SEND), NO(ACKED), S(ACKED, IGNORE), NO(ACKED), NO(ACKED),
			    S(ABSENT, REMOVE) },
	/* A late acknowledgement still counts; a JOIN is answered, not
	 * re-armed; its PLAN goes again slowly (a partition nobody is told of
	 * must end with the member on the current term). */
	[COORD_M_EXPIRED] = { S(PLANNED, REPLAN), S(EXPIRED, RESEND), S(ABSENT, DEPART),
			      S(EXPIRED, REFUSE), S(PLANNED, REPLAN), S(ABSENT, REMOVE),
			      S(PLANNED, SEND), S(ACKED, ACK), S(EXPIRED, IGNORE), NO(EXPIRED),
			      S(EXPIRED, RETRY_SLOW), S(ABSENT, REMOVE) },
};

struct coord_step coord_sm_step(enum coord_mstate s, enum coord_mevent ev)
{
	if ((unsigned)s >= COORD_M_COUNT || (unsigned)ev >= COORD_EV_COUNT)
		return (struct coord_step){ COORD_M_ABSENT, COORD_A_NONE };
	return table[s][ev];
}

enum coord_mstate coord_sm_member_state(const struct coord_mview *w)
{
	if (!w->member)
		return COORD_M_ABSENT;
	if (!w->has_plan)
		return COORD_M_JOINED;
	if (w->acked_term == w->plan_term)
		return COORD_M_ACKED;
	return w->expired ? COORD_M_EXPIRED : COORD_M_PLANNED;
}

const char *coord_sm_state_name(enum coord_mstate s)
{
	static const char *const n[COORD_M_COUNT] = {
		"absent", "joined", "planned", "acked", "expired",
	};

	return (unsigned)s < COORD_M_COUNT ? n[s] : "?";
}

const char *coord_sm_event_name(enum coord_mevent e)
{
	static const char *const n[COORD_EV_COUNT] = {
		"join_new", "join_seen", "join_empty", "join_refused", "leave", "leave_last",
		"plan_sent", "ack_current", "ack_other", "retry_due", "deadline", "node_down",
	};

	return (unsigned)e < COORD_EV_COUNT ? n[e] : "?";
}

const char *coord_sm_action_name(enum coord_maction a)
{
	static const char *const n[COORD_A_COUNT] = {
		"-", "refuse", "replan", "remove", "resend", "send", "ack", "ignore", "retry",
		"expire", "depart", "answer", "retry_slow",
	};

	return (unsigned)a < COORD_A_COUNT ? n[a] : "?";
}

/* ------------------------------------------------------------ (b) member */

static int retired(const struct coord_plan_in *in, uint64_t boot)
{
	for (unsigned i = 0; i < in->nretired && i < PEER_TERM_RETIRED; i++)
		if (in->retired[i] == boot)
			return 1;
	return 0;
}

/* In the order jplan_recv has always checked them (proto/peer_protocol.h). */
struct coord_plan_out coord_sm_plan(const struct coord_plan_in *in)
{
	uint64_t nb = peer_term_boot(in->term);

	if (!in->proto_ok)
		return in->from_coord ?
			(struct coord_plan_out){ COORD_P_REJECT_PROTO,
						 "the coordinator's peer protocol is not supported" } :
			(struct coord_plan_out){ COORD_P_REFUSE_PROTO,
						 "peer protocol not supported" };
	if (!in->from_coord)
		return (struct coord_plan_out){ COORD_P_REFUSE_NOT_COORD,
						"not from the job's coordinator" };
	if (!nb || !peer_term_counter(in->term))
		return (struct coord_plan_out){ COORD_P_REFUSE_NOT_TERM, "not a term" };
	if (retired(in, nb))
		return (struct coord_plan_out){ COORD_P_IGNORE_RETIRED,
						"its coordinator boot was superseded" };
	if (in->term == in->held)
		return (struct coord_plan_out){ COORD_P_ACK_AGAIN, "the term held" };
	if (in->held && peer_term_boot(in->held) == nb && in->term < in->held)
		return (struct coord_plan_out){ COORD_P_IGNORE_STALE,
						"older than the term held" };
	if (in->held && peer_term_boot(in->held) != nb)
		return (struct coord_plan_out){ COORD_P_ADOPT_NEW_BOOT,
						"a new coordinator boot" };
	return (struct coord_plan_out){ COORD_P_ADOPT, "a newer term" };
}

const char *coord_sm_verdict_name(enum coord_plan_verdict v)
{
	static const char *const n[COORD_P_COUNT] = {
		"adopt", "adopt_new_boot", "ack_again", "ignore_stale", "ignore_retired",
		"refuse_not_term", "refuse_not_coordinator", "refuse_proto", "reject",
	};

	return (unsigned)v < COORD_P_COUNT ? n[v] : "?";
}

/* daemon/coord_sm.h — the coordinator's membership and plan terms as
 * state machines (docs/SYNC.md, "Terms, acknowledgements and restarts":
 * the tables "Coordinator: one member node" and "Member: whether a PLAN
 * is taken").
 *
 * One owner: the loop thread of the daemon that holds the job.  Nothing
 * here reads a clock, a job or the network, so tests/unit/test_coord_sm.c
 * drives every cell directly.  job_coord.c names the state and the event,
 * asks, and only executes what it is told.
 *
 * (a) Coordinator, per member node: coord_sm_step() is the table state ×
 *     event → next state and action.  The states live in struct jmember's
 *     fields (job_state.h); coord_sm_member_state() reads them back.
 * (b) Member, per PLAN received: coord_sm_plan() decides whether it is
 *     taken (sender against the job's coordinator, its term against the
 *     term held and the retired boots), with the reason. */
#ifndef DTED_COORD_SM_H
#define DTED_COORD_SM_H

#include <stdint.h>

/* ------------------------------------------- (a) coordinator, per member */

enum coord_mstate {
	COORD_M_ABSENT = 0,       /* not a member (never joined, removed, went down) */
	COORD_M_JOINED,           /* a member with no PLAN kept (only until its first re-plan) */
	COORD_M_PLANNED,          /* its PLAN sent, not acknowledged, retried with backoff */
	COORD_M_ACKED,            /* it acknowledged the term of its PLAN */
	COORD_M_EXPIRED,          /* not acknowledged within the deadline: retried slowly */
	COORD_M_COUNT
};

enum coord_mevent {
	COORD_EV_JOIN_NEW = 0,    /* a valid JOIN with participants, join_seq not seen */
	COORD_EV_JOIN_SEEN,       /* a JOIN whose join_seq it processed (same join_boot) */
	COORD_EV_JOIN_EMPTY,      /* a valid JOIN with no participants (the last one left) */
	COORD_EV_JOIN_REFUSED,    /* a JOIN that fails validation (version, spec, layout, rank) */
	COORD_EV_LEAVE,           /* LEAVE of some of its participants, others stay */
	COORD_EV_LEAVE_LAST,      /* LEAVE of its last participants */
	COORD_EV_PLAN_SENT,       /* a re-plan made it a new PLAN (another member changed) */
	COORD_EV_ACK_CURRENT,     /* PLAN_ACK of the term of its PLAN */
	COORD_EV_ACK_OTHER,       /* PLAN_ACK of another term, or from no member */
	COORD_EV_RETRY_DUE,       /* its retry time came, before the deadline */
	COORD_EV_DEADLINE,        /* its retry time came, past the deadline */
	COORD_EV_NODE_DOWN,       /* the transport lost its node */
	COORD_EV_COUNT
};

enum coord_maction {
	COORD_A_NONE = 0,         /* "—": the event does not reach this state; nothing */
	COORD_A_REFUSE,           /* REFUSED to the sender; membership unchanged */
	COORD_A_REPLAN,           /* take its participants, re-plan: a new term to every member */
	COORD_A_REMOVE,           /* remove it, re-plan the others */
	COORD_A_RESEND,           /* send its kept PLAN again (acknowledges the JOIN) */
	COORD_A_SEND,             /* keep the new PLAN, send it, arm retry and deadline */
	COORD_A_ACK,              /* its acknowledged term is the PLAN's */
	COORD_A_IGNORE,           /* logged, nothing changes */
	COORD_A_RETRY,            /* send its PLAN again, backoff ×2 */
	COORD_A_EXPIRE,           /* logged (warning); from now on retried every PEER_PLAN_SLOW_MS */
	COORD_A_DEPART,           /* remove it, re-plan the others, answer its JOIN (an empty PLAN) */
	COORD_A_ANSWER,           /* answer its JOIN with a PLAN of the term holding nothing for it */
	COORD_A_RETRY_SLOW,       /* send its PLAN again, next in PEER_PLAN_SLOW_MS */
	COORD_A_COUNT
};

struct coord_step {
	enum coord_mstate next;
	enum coord_maction act;
};

struct coord_step coord_sm_step(enum coord_mstate s, enum coord_mevent ev);

/* What struct jmember's fields say (member NULL: absent). */
struct coord_mview {
	int member;               /* a struct jmember exists for the node */
	int has_plan;             /* jmember.plan kept */
	uint64_t plan_term, acked_term;
	int expired;              /* jmember.expired: its deadline passed unacknowledged */
};

enum coord_mstate coord_sm_member_state(const struct coord_mview *w);

const char *coord_sm_state_name(enum coord_mstate s);
const char *coord_sm_event_name(enum coord_mevent e);
const char *coord_sm_action_name(enum coord_maction a);

/* ------------------------------------------- (b) member, per PLAN received */

enum coord_plan_verdict {
	COORD_P_ADOPT = 0,        /* validate, adopt, PLAN_ACK */
	COORD_P_ADOPT_NEW_BOOT,   /* ...and retire the boot of the term held */
	COORD_P_ACK_AGAIN,        /* the term held: acknowledged again */
	COORD_P_IGNORE_STALE,     /* an older term of the boot held: logged */
	COORD_P_IGNORE_RETIRED,   /* a term of a retired boot: logged */
	COORD_P_REFUSE_NOT_TERM,  /* boot or counter 0: REFUSED (-EPROTO) */
	COORD_P_REFUSE_NOT_COORD, /* not from the job's coordinator: REFUSED (-EPERM), counted */
	COORD_P_REFUSE_PROTO,     /* another daemon's unsupported protocol: REFUSED (-EPROTONOSUPPORT) */
	COORD_P_REJECT_PROTO,     /* the coordinator's unsupported protocol: the plan is rejected */
	COORD_P_COUNT
};

struct coord_plan_in {
	int proto_ok;             /* peer_proto_supported(PLAN.peer_proto) */
	int from_coord;           /* the sender is the job's coordinator */
	uint64_t term;            /* PLAN.epoch */
	uint64_t held;            /* the term held (job.epoch), 0: none */
	const uint64_t *retired;  /* job.retired */
	unsigned nretired;        /* job.nretired (the last PEER_TERM_RETIRED of them count) */
};

struct coord_plan_out {
	enum coord_plan_verdict v;
	const char *reason;       /* one line, static */
};

struct coord_plan_out coord_sm_plan(const struct coord_plan_in *in);

/* From the coordinator, past the protocol and term checks: the PLAN
 * answers for the coordinator (its join_seq acknowledges, coord_down
 * ends). */
static inline int coord_sm_plan_heard(enum coord_plan_verdict v)
{
	return v <= COORD_P_IGNORE_RETIRED;
}

const char *coord_sm_verdict_name(enum coord_plan_verdict v);

#endif

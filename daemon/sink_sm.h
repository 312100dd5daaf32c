/* daemon/sink_sm.h — one version at one sink as a state machine
 * (docs/SYNC.md, "A version at a sink": its state × event table).
 *
 * One owner: the loop thread of the daemon that holds the sink.  Events
 * come from the sources' records (COUNTS and PAYLOAD parts, complete or
 * contradicting), from the staging and apply workers (done), from the
 * client (apply), from the staging cap, the sink going away, a re-plan
 * and shutdown.  sink_sm_step() is the table: for a version's state and
 * an event, the state after it and what the sink does.  Nothing here
 * reads a clock, a job or the network, so tests/unit/test_sink_sm.c
 * drives every row × event directly.  The sink's files (job_sink*.c)
 * make every transition of a sink version through it (sink_decide,
 * job_sink_version.c): they pass the version's stored state and the
 * event, sink_sm_step() decides, sink_decide writes the next state where
 * the version's state is stored, and the sink executes the action (and
 * logs a cell the table says cannot happen as a daemon bug).
 *
 * A version's state is stored with the object that holds it (job_state.h,
 * job_sink_int.h): collecting or refused in its struct jpend, staging and
 * applying in struct jsink beside the version numbers on a worker, staged
 * in its struct jstaged, arriving, undoing and retreating in its struct
 * jarrive; it moves with the version when the version moves.  None,
 * applied, failed and gone belong to no object: sink_sm_state() computes
 * them from the version numbers the sink holds, and says for any version
 * which object holds it (jsink_step_check compares that, after each
 * action, with the table's next state).  A failed version is `failed`
 * (its check did not match; its writes were undone, so `applied` stayed
 * on the version before it); a version above the held one that the sink
 * has no record of is NONE whether it never came or went (gone). */
#ifndef DTED_SINK_SM_H
#define DTED_SINK_SM_H

#include <stdint.h>

enum sink_vstate {
	SINK_V_NONE = 0,          /* no record of it (above the held version) */
	SINK_V_COLLECTING,        /* a jpend: records arriving */
	SINK_V_REFUSED,           /* a jpend kept without data: its records are dropped */
	SINK_V_STAGING,           /* on a worker (jsink.staging) */
	SINK_V_STAGED,            /* in the chain jsink.staged */
	SINK_V_APPLYING,          /* on a worker (jsink.applying) */
	SINK_V_APPLIED,           /* jsink.applied */
	SINK_V_FAILED,            /* applied, checksum did not match: dense repair asked */
	/* Apply on arrival (sink parked at its safe point, docs/SYNC.md):
	 * parts swapped into the buffers as they come (jsink.arrive). */
	SINK_V_ARRIVING,          /* parts swapped in on a worker as they arrive */
	SINK_V_UNDOING,           /* failed: every swap undone on a worker, then gone */
	SINK_V_RETREATING,        /* undone on a worker, then collected and staged as usual */
	SINK_V_GONE,              /* freed; at or below the held version */
	SINK_V_COUNT
};

enum sink_vevent {
	SINK_EV_RECORD = 0,       /* a COUNTS or PAYLOAD part */
	SINK_EV_CONTRADICTS,      /* duplicate part, range past the pair, more than COUNTS */
	SINK_EV_COMPLETE,         /* every record in, its base held (or dense) */
	SINK_EV_COMPLETE_NO_BASE, /* complete, sparse on a base not held and not pending */
	SINK_EV_WORKER_OK,        /* the staging or apply worker came back: checks/sums pass */
	SINK_EV_WORKER_FAILED,    /* ...they did not */
	SINK_EV_APPLY,            /* the client's apply(v), v this version or later */
	SINK_EV_CAP,              /* the staging cap (max_staged_versions) is reached */
	SINK_EV_DETACHED,         /* the sink detached or its connection closed */
	SINK_EV_REPLAN,           /* a new plan epoch */
	SINK_EV_SHUTDOWN,
	SINK_EV_SUPERSEDED,       /* a later version is held (staged dense, or at/below held) */
	SINK_EV_PARKED,           /* its COUNTS or a self-describing part: dense, or sparse on the applied base; the sink parked, nothing staged, staging or applying */
	SINK_EV_UNPARK,           /* the park ends (wait_staged answered or expired), or a record it cannot take on arrival */
	SINK_EV_COUNT
};

enum sink_vaction {
	SINK_A_NONE = 0,          /* "—": the event does not reach this state; nothing */
	SINK_A_KEEP,              /* keep the record */
	SINK_A_DROP,              /* drop the record */
	SINK_A_REFUSE,            /* drop the version's data, APPLIED refused */
	SINK_A_STAGE,             /* start staging (if none is; else it waits) */
	SINK_A_BASE_MISMATCH,     /* drop it, APPLIED base_mismatch */
	SINK_A_DROP_COUNTED,      /* the oldest pending version goes, counted (staging_drops) */
	SINK_A_FREE,              /* free it */
	SINK_A_SEND_STAGED,       /* STAGED to its sources */
	SINK_A_NOT_STAGED,        /* apply answered "not staged" */
	SINK_A_DROP_RESULT,       /* the worker's result is dropped when it comes back */
	SINK_A_CONTINUE,          /* the worker goes on with what it copied */
	SINK_A_CANCEL,            /* cancelled, or drained if it started */
	SINK_A_APPLY,             /* apply every staged version <= v on a worker */
	SINK_A_CAP_REFUSE,        /* the chain goes, APPLIED refused, held = applied (or applying) */
	SINK_A_SEND_APPLIED,      /* APPLIED ok */
	SINK_A_SEND_CHECKSUM,     /* APPLIED checksum_failed, dense repair asked */
	SINK_A_BUSY,              /* a second apply: ERR_BUSY */
	SINK_A_WENT_AWAY,         /* written, result dropped, the answer says it went away */
	SINK_A_DRAIN,             /* the apply completes before shutdown goes on (never torn) */
	SINK_A_ANSWER,            /* apply answered at once */
	SINK_A_STAY,              /* stays as it is */
	SINK_A_ARRIVE,            /* apply on arrival: its parts go to the buffers as they come */
	SINK_A_SWAP,              /* swap the part into the buffers on a worker (in arrival order) */
	SINK_A_VERIFY,            /* every part in: the sums on a worker */
	SINK_A_UNDO,              /* swap every part back (reverse order) on a worker */
	SINK_A_RETREAT,           /* undo, then the version is collected and staged as usual */
	SINK_A_SEND_FAILED,       /* undone: APPLIED refused or checksum_failed, dense repair */
	SINK_A_RESTAGE,           /* undone: its parts back in the pending version, staged as usual */
	SINK_A_COUNT
};

struct sink_step {
	enum sink_vstate next;
	enum sink_vaction act;
};

/* The table: state × event → next state and action. */
struct sink_step sink_sm_step(enum sink_vstate s, enum sink_vevent ev);

/* Where the sink's fields put a version (jsink, docs/SYNC.md). */
struct sink_view {
	uint64_t held;            /* newest staged (or applied) version */
	uint64_t staging;         /* 0: none */
	uint64_t applying;        /* 0: none */
	uint64_t applied;
	uint64_t failed;          /* the last version whose check failed; 0: none */
	int pending;              /* 0: no jpend of it, 1: collecting, 2: refused (its state) */
	int chained;              /* it is in the staged chain */
	uint64_t arrive;          /* the version applied on arrival (jsink.arrive); 0: none */
	enum sink_vstate arrive_state; /* its state: arriving, undoing or retreating */
};

enum sink_vstate sink_sm_state(const struct sink_view *w, uint64_t version);

const char *sink_sm_state_name(enum sink_vstate s);
const char *sink_sm_action_name(enum sink_vaction a);

#endif

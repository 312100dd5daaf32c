/* daemon/reader_sm.h — one local sink fed by a storage reader, as a state
 * machine (docs/SYNC.md, "A sink fed from storage"; docs/STORAGE.md,
 * "Reader").
 *
 * One owner: the loop thread of the daemon that holds the reader job
 * (job_storage.c).  Events come from the job's local sinks (one announced,
 * one gone), from the reader's read on a worker (handed out, and back:
 * the version staged into the sink, or not) and from the sink's apply of
 * the version staged (its checksum counter says whether the predicted sums
 * matched).  reader_sm_step() is the table: for the sink's state and an
 * event, the state after it and what job_storage.c does.  Nothing here
 * reads a clock, a job, a file or the network, so
 * tests/unit/test_reader_sm.c drives every state × event directly.
 *
 * The state is stored, in struct rsink (job_storage.c), and changed only
 * through the table (rsink_step). */
#ifndef DTED_READER_SM_H
#define DTED_READER_SM_H

#include <stdint.h>

enum reader_sstate {
	READER_S_NONE = 0,        /* no rsink: the reader does not know the sink */
	READER_S_DENSE,           /* new, or its last version failed or was not staged: the
				   * next is staged densely (rebuilt from a keyframe) */
	READER_S_SYNCED,          /* applied and verified the last version: the next is its delta */
	READER_S_STAGED,          /* a version staged into it, its apply awaited */
	READER_S_COUNT
};

enum reader_sevent {
	READER_EV_ANNOUNCED = 0,  /* a local sink of the job, announced, with no rsink */
	READER_EV_READ,           /* the next read goes to a worker with this sink in it */
	READER_EV_READ_STAGED,    /* the read came back with a version staged for it */
	READER_EV_READ_NOT_STAGED,/* ...the version could not be staged for it (its error) */
	READER_EV_READ_SKIPPED,   /* ...a dense version was wanted, there was none to stage */
	READER_EV_APPLIED,        /* the sink applied the version staged; no checksum failed */
	READER_EV_APPLY_FAILED,   /* ...and its checksum failures went up: a sum did not match */
	READER_EV_NOT_APPLIED,    /* the sink has not applied it yet */
	READER_EV_GONE,           /* the local sink went away */
	READER_EV_COUNT
};

enum reader_saction {
	READER_A_NONE = 0,        /* "—": the event does not reach this state; nothing */
	READER_A_MAKE,            /* its rsink (layout, pieces, checksums) */
	READER_A_STAGE_DENSE,     /* the read stages every element (rebuilt if the version is a delta) */
	READER_A_STAGE_SPARSE,    /* the read stages the version's delta (all of a keyframe) */
	READER_A_HAND,            /* the staged version to the sink's chain, held = it; counted */
	READER_A_NOT_STAGED,      /* logged; dense at the next version */
	READER_A_WAIT,            /* nothing yet */
	READER_A_VERIFY,          /* the predicted sums become the verified ones; counted ok */
	READER_A_REPAIR,          /* logged, counted failed; dense at the next version */
	READER_A_FREE,            /* its rsink freed */
	READER_A_COUNT
};

struct reader_step {
	enum reader_sstate next;
	enum reader_saction act;
};

/* The table: state × event → next state and action. */
struct reader_step reader_sm_step(enum reader_sstate s, enum reader_sevent ev);

/* A read's result for one sink: whether it was skipped (dense wanted,
 * nothing to stage from) and whether a version was staged for it. */
enum reader_sevent reader_sm_read_event(int skipped, int staged);

/* A staged sink's apply of `version`: what the sink applied, and its
 * checksum failures now and when the version was staged. */
enum reader_sevent reader_sm_apply_event(uint64_t applied, uint64_t version, uint64_t fails,
					 uint64_t fails0);

const char *reader_sm_state_name(enum reader_sstate s);
const char *reader_sm_event_name(enum reader_sevent e);
const char *reader_sm_action_name(enum reader_saction a);

#endif

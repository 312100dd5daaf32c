/* daemon/job_sink_engine.h — the sink role as the engine's upper layers call it
 * (daemon/job_sink*.c; daemon/job_sink_int.h says which file holds what):
 * records in, frees, re-plans, the park, applies.  (The control
 * operations are daemon/job_sink.h.)
 *
 * One header per layer (docs/SYNC.md, "Layers"): an engine file includes
 * the headers of the layers it may call, below its own, and the compiler
 * refuses a call to a layer it does not include; tests/system/
 * engine_layers.sh checks both the includes and the calls. */
#ifndef DTED_JOB_SINK_ENGINE_H
#define DTED_JOB_SINK_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/job_state.h"

/* Records of a term newer than the plan held wait for its PLAN: once a
 * plan is adopted (jplan_recv), those of its term go in as if they came
 * now, older ones are refused as any record of another term; the rest
 * keep waiting.  jsink_ahead_free: the job goes. */
void jsink_ahead_replay(struct job *j);
void jsink_ahead_free(struct job *j);
/* When the oldest record still waiting came (jio_now), 0: none waits. */
uint64_t jsink_ahead_oldest(const struct job *j);
/* A COUNTS or PAYLOAD for a local sink: m->dst's (to 0), or relayed to
 * sink `to` by its relay parent (RELAYED; docs/SYNC.md, "Relay between
 * sink daemons"), m->dst then that sink's tree root. */
void jsink_counts(struct job *j, const char *from, const Dtep__Counts *m, const uint8_t *hdr,
		  size_t hdrlen, uint64_t to);
void jsink_payload(struct job *j, const char *from, const Dtep__Payload *m, const void *data,
		   size_t len, uint64_t to);
void jsink_free(struct dte_engine *e, struct jlocal *l);
/* Send the APPLIED the storage writer's sink (struct jwriter) held back at its last apply. */
void jsink_send_deferred(struct job *j, struct jlocal *l);
void jsink_replanned(struct job *j);
/* A receive arena the size of sink l's dense version (recvpool.h), or NULL. */
struct recvpool *jsink_arena(const struct jlocal *l);
uint64_t jsink_newest_staged(const struct jlocal *l);
/* A version read back from storage (job_storage.c: the reader's table
 * handed it) joins sink l's staged chain, staged; it is the held one. */
void jsink_staged_hand(struct jlocal *l, struct jstaged *st);
/* Apply on arrival (docs/SYNC.md): the client's wait_staged on sink l
 * ends (answered or expired).  Nonzero while the sink's buffers hold a
 * version applied on arrival that is not yet staged or undone: the answer
 * must wait (jwait_check comes once it is undone and staged as usual).
 * jsink_parked / jsink_unparked: a wait_staged of l's starts / is over
 * (jsink.parked). */
int jsink_park_ending(struct job *j, struct jlocal *l);
void jsink_parked(struct dte_engine *e, struct jlocal *l);
void jsink_unparked(struct dte_engine *e, struct jlocal *l);

/* What an apply did (job_sink_apply.c, on a worker). */
struct jsink_apply_result {
	uint64_t version;         /* the newest version applied */
	uint32_t n;               /* versions applied */
	int ok, failed_apply, incremental;
	int undone;               /* !ok: every write undone, the buffers as before */
	uint64_t key;
	uint64_t checksum_failures;
	double work_ms;           /* on the worker */
	double ms;                /* from the request to the loop's completion */
	char why[256];
};
/* Internal callers (the storage writer) get the result here instead of
 * an answer to a client; j and l are NULL when the sink went away or the
 * apply never ran. */
typedef void (*jsink_applied_fn)(struct job *j, struct jlocal *l,
				 const struct jsink_apply_result *r, void *arg);
/* Apply every staged version <= version of sink l on a worker; the answer
 * goes to rq (JOP_APPLY), or to then(arg).  0, or a negative errno (then
 * nothing started). */
int jsink_apply_start(struct job *j, struct jlocal *l, uint64_t version, const struct jreq *rq,
		      jsink_applied_fn then, void *arg, char *err, size_t errlen);
/* The same, and prep(arg, first) on the worker before the first version
 * is written (the storage writer reads what it will change there). */
int jsink_apply_start_prep(struct job *j, struct jlocal *l, uint64_t version,
			   void (*prep)(void *arg, const struct jstaged *first),
			   jsink_applied_fn then, void *arg, char *err, size_t errlen);
/* The storage writer's canonical sink: hang a struct jwriter on sink l;
 * staged(j, l) is called on the loop for each version l stages (the
 * maker's completion: the storage writer mirrors it).  0, or -ENOMEM. */
int jsink_make_writer(struct jlocal *l, void (*staged)(struct job *j, struct jlocal *l));

#endif

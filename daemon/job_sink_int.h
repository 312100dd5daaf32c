/* daemon/job_sink_int.h — internal to the sink side: what its files
 * share.  Not for the rest of the engine: the sink's entry points are
 * declared in job_state.h and job_sink.h.
 *
 * One concern a file, each calling only the files below its own row
 * (docs/SYNC.md, "Layers"; tests/system/engine_layers.sh checks it):
 *   job_sink.c          entry points: apply, free, re-plan, the park
 *   job_sink_intake.c   records in: COUNTS and PAYLOAD parts kept per version
 *   job_sink_aoa.c      apply on arrival: parts swapped in as they come, undo
 *   job_sink_stage.c    staging: a complete version decoded on a worker, the chain
 *   job_sink_apply.c    apply and verify: written on a worker, the sums, undo
 *   job_sink_version.c  a version at a sink: frees, state, the table, APPLIED
 * job_sink.c and job_sink_intake.c share a row (neither calls the other),
 * and so do job_sink_stage.c and job_sink_apply.c. */
#ifndef DTED_JOB_SINK_INT_H
#define DTED_JOB_SINK_INT_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/job_state.h"
#include "daemon/sink_sm.h"

struct jaswap;
struct japplied;

/* Sink l staged a version: its maker hears it (the storage writer's
 * canonical sink, jsink_make_writer); nobody else does. */
static inline void sink_staged_tell(struct job *j, struct jlocal *l)
{
	const struct jsink *k = jsink_of(l);

	if (k->w && k->w->staged)
		k->w->staged(j, l);
}

enum ja_op { JA_SWAP, JA_VERIFY, JA_UNDO };

/* The version a sink applies on arrival (jsink.arrive, job_sink_aoa.c):
 * its parts, each swapped into the buffers on a worker as it comes, and
 * what undoes them.  The other sink files read its version and state;
 * the state changes only by sink_decide. */
struct jarrive {
	struct jtask t;
	char job[JOB_NAME_MAX];
	uint64_t participant, version;
	enum sink_vstate state;   /* arriving, undoing, retreating */
	int busy;                 /* t is on a worker */
	int orphan;               /* the sink went away: the task's done undoes and frees */
	enum ja_op op;
	size_t nbufs;
	struct dbuf **bufs;       /* referenced until freed */
	uint32_t *buf_ids;
	struct jaswap *sw;
	size_t nsw, cap, next;    /* next: the first part not yet swapped */
	size_t upto;              /* the swap task does sw[next..upto) */
	uint64_t *delta;          /* per slot: Σ mix(new) − mix(old) of the swaps */
	uint64_t *dsum;           /* per slot: Σ mix(new) over the dense entries swapped */
	uint64_t *srcs;           /* the version's sources (APPLIED) */
	size_t nsrcs;
	struct dte_engine *eng;   /* its engine (set at arrive_new, before any task) */
	int alter;                /* job_ext: alter the first swapped entry */
	int skip;                 /* job_ext: apply_skip on the first sparse entry swapped */
	int failed;               /* worker: a check or the sums failed (err) */
	char err[256];
	int reported;             /* the failure's APPLIED went out already */
	Dtep__ApplyResult result; /* ...or goes out once undone */
	char why[256];
	/* verify */
	struct jstaged *st;
	uint64_t *vsum, vkey, key;
	uint32_t since_full, full_every;
	uint64_t *sum;
	int incremental;
	uint64_t swapped_parts;   /* worker: parts the last swap task swapped in */
};

/* job_sink_version.c: pending and staged versions freed, their state,
 * the table's decision (sink_decide: every change of a stored state), the
 * check after the action (jsink_step_check), what the sources are told,
 * the receive arena. */
void jsink_staged_free(struct jstaged *s);
void jsink_pend_src_clear(struct jpend_src *s);
void jsink_pend_free(struct jpend *p);
/* p leaves the sink's pending list and is freed. */
void jsink_pend_drop(struct jlocal *l, struct jpend *p);
/* The table decides for the stored state *s (written: d.next). */
struct sink_step sink_decide(const struct jlocal *l, uint64_t v, enum sink_vstate *s,
			     enum sink_vevent ev);
void jsink_step_check(struct job *j, struct jlocal *l, uint64_t v, struct sink_step d);
enum sink_vstate jsink_vstate(struct jlocal *l, uint64_t v);
void jsink_japplied_free(struct japplied *a);
void jsink_arena_next(struct job *j, struct jlocal *l, int dense_next);
void jsink_send_applied(struct job *j, struct jlocal *l, uint64_t version, const uint64_t *srcs,
			size_t nsrcs, Dtep__ApplyResult result, const char *msg, double ms);
void jsink_applied_or_defer(struct job *j, struct jlocal *l, uint64_t version,
			    const uint64_t *srcs, size_t nsrcs, Dtep__ApplyResult result,
			    const char *why, double ms);
void jsink_refuse_version(struct job *j, struct jlocal *l, struct jpend *p,
			  Dtep__ApplyResult result, const char *why);
void jsink_pend_refuse_exec(struct job *j, struct jlocal *l, struct jpend *p, const char *why);
int jsink_pend_complete(const struct jpend *p);
int jsink_pend_all_dense(const struct jpend *p);
struct jpend_src *jsink_pend_src(struct jpend *p, uint64_t src);
/* A little-endian 64-bit length in a payload. */
uint64_t jsink_get64(const uint8_t *p);

/* job_sink_stage.c */
uint32_t jsink_staged_cap(const struct dte_engine *e);
int jsink_keep_encoded(const struct job *j, const struct jlocal *l, const struct dbuf *b);
void jsink_send_staged(struct job *j, struct jlocal *l, const struct jstaged *st);
void jsink_try_stage(struct job *j, struct jlocal *l);

/* job_sink_apply.c: the sums and the test build's skipped write, which
 * apply on arrival shares. */
uint64_t jsink_verify_key(struct dbuf *const *bufs, const struct jstaged *st);
int jsink_skip_one(void (*skip)(uint16_t *elem, uint16_t old), const struct dte_box_map *m,
		   const uint8_t *enc, size_t len, uint64_t n, uint16_t *dst);
int jsink_full_sums(size_t nbufs, struct dbuf *const *bufs, const struct jstaged *st,
		    uint64_t *sum);
uint32_t jsink_full_every(const struct dte_engine *e);

/* job_sink_aoa.c */
void jsink_arrive_orphan(struct jarrive *a);
enum sink_vaction jsink_arrive_event(struct job *j, struct jlocal *l, enum sink_vevent ev,
				     Dtep__ApplyResult result, const char *why);
void jsink_arrive_record(struct job *j, struct jlocal *l, struct jpend *p, struct jpend_src *s,
			 int counts);

#endif

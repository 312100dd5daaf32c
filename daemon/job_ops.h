/* daemon/job_ops.h — operator actions on the sync engine (`dtectl verify`,
 * `dtectl resync`) and the engine hooks they need.
 *
 * verify recomputes, for every local sink of a job, the checksum of each
 * buffer over the elements the plan maps into it, and compares it with
 * what the version it applied last should hold (the sum of the sources'
 * partials, kept at apply).  A mismatch counts as a checksum failure and
 * makes the sink's sources send the next version densely, exactly as a
 * failed apply does (DESIGN §2.3).
 *
 * resync forces the next version dense for a job's sinks, or for one.
 */
#ifndef DTED_JOB_OPS_H
#define DTED_JOB_OPS_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/job_api.h"

struct dte_engine;
struct job;
struct jlocal;
struct jpair;
struct jstaged;

/* The sums run on a worker: *deferred, the answer comes later
 * (JOP_VERIFY); none when the job has no local sink: answered now, with
 * res->note saying so.  res, as daemon/job.h's operations. */
int job_verify(struct dte_engine *e, const struct jreq *rq, const char *name,
	       struct jverify_res *res, int *deferred, char *err, size_t errlen);
/* sink: a participant id, 0 every sink. */
int job_resync(struct dte_engine *e, const char *job, uint64_t sink, struct jresync_res *res,
	       char *err, size_t errlen);

/* dte_engine_free: drops what resync remembered. */
void jops_fini(struct dte_engine *e);

/* job_sink_apply.c: a sink applied up to st (its checksums were just checked);
 * remember what its buffers must hold for a later verify. */
void jops_applied(struct dte_engine *e, struct jlocal *l, const struct jstaged *st);
/* job_sink.c: the sink goes away. */
void jops_sink_free(struct dte_engine *e, struct jlocal *l);

#endif

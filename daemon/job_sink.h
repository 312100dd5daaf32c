/* daemon/job_sink.h — the sink side's control operations (daemon/job_sink.c)
 * (part of the engine's control API, daemon/job.h, which includes it). */
#ifndef DTED_JOB_SINK_H
#define DTED_JOB_SINK_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/job_api.h"

struct dte_engine;

/* A sink recomputes every checksum at least every n applied versions
 * (config verify_full_every; docs/SYNC.md). */
void job_set_verify_full_every(struct dte_engine *e, uint32_t n);

/* The apply runs on a worker (docs/SYNC.md): *deferred, and the answer
 * comes later, unless the version is applied already (answered now). */
/* JOP_APPLY. */
int job_apply(struct dte_engine *e, const struct jreq *rq, const struct japply_args *a,
	      struct japply_res *res, int *deferred, char *err, size_t errlen);

#endif

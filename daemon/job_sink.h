/* daemon/job_sink.h — the sink side's control operations (daemon/job_sink.c)
 * (part of the engine's control API, daemon/job.h, which includes it). */
#ifndef DTED_JOB_SINK_H
#define DTED_JOB_SINK_H

#include <stddef.h>
#include <stdint.h>
#include "proto/dte.pb-c.h"

struct dte_engine;

/* A sink recomputes every checksum at least every n applied versions
 * (config verify_full_every; docs/SYNC.md). */
void job_set_verify_full_every(struct dte_engine *e, uint32_t n);

/* The apply runs on a worker (docs/SYNC.md): *deferred, and the answer
 * comes later, unless the version is applied already (answered now). */
int job_apply(struct dte_engine *e, uint64_t conn, uint32_t req_id, const Dte__ApplyRequest *rq,
	      Dte__ApplyReply *rep, int *deferred, char *err, size_t errlen);

#endif

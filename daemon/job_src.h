/* daemon/job_src.h — the source side's control operations (daemon/job_src.c)
 * (part of the engine's control API, daemon/job.h, which includes it). */
#ifndef DTED_JOB_SRC_H
#define DTED_JOB_SRC_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/job_api.h"

struct dte_engine;

/* A source sends a pair's payload in parts of about n bytes while it
 * still detects (config part_size; docs/SYNC.md); applies from the next
 * capture on. */
void job_set_part_bytes(struct dte_engine *e, size_t n);
/* Sparse or dense per pair and version: 0 auto (the cheaper, by the
 * running estimates), 1 sparse wherever allowed (config sync_mode;
 * enum pair_mode_policy). */
void job_set_mode_policy(struct dte_engine *e, int policy);

/* Publish and mark capture on a worker thread (the loop keeps serving):
 * with *deferred = 1 the answer comes when the capture is done.  A mark
 * that needs no scan is answered at once. */
/* JOP_PUBLISH, JOP_MARK. */
int job_publish(struct dte_engine *e, const struct jreq *rq, const struct jpublish_args *a,
		struct jpublish_res *res, int *deferred, char *err, size_t errlen);
int job_mark(struct dte_engine *e, const struct jreq *rq, const struct jmark_args *a,
	     struct jmark_res *res, int *deferred, char *err, size_t errlen);

#endif

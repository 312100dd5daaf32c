/* daemon/job_capture.h — a capture on a worker (daemon/job_capture.c) and
 * the pool of its parts' buffers.
 *
 * One header per layer (docs/SYNC.md, "Layers"): an engine file includes
 * the headers of the layers it may call, below its own, and the compiler
 * refuses a call to a layer it does not include; tests/system/
 * engine_layers.sh checks both the includes and the calls. */
#ifndef DTED_JOB_CAPTURE_H
#define DTED_JOB_CAPTURE_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/job_state.h"

struct jcap_pool *jcap_pool_new(struct dte_engine *e);
/* The engine goes: the pool is freed now, or by its last chunk back. */
void jcap_pool_release(struct jcap_pool *pool);

/* Worker side: 0, or -1 with c->err.  Parts are queued on c->q as they
 * are framed. */
int  jcap_run(struct jcap *c);
void jcap_free(struct jcap *c);
/* Loop side: takes the parts queued so far (NULL when none). */
struct jcap_part *jcap_take_parts(struct jcap *c);
void jcap_part_free(struct dte_engine *e, struct jcap_part *p);
/* A part's chunk given to the router (send_part) comes back here, on the
 * loop, once it is sent or dropped; arg is its capacity. */
void jcap_chunk_release(struct jcap_pool *pool, void *chunk, size_t cap);
void jcap_chunk_given(struct jcap_pool *pool);	/* count one before giving it */
/* A dense version of a pair with these entries is coming (a fresh sink, a
 * repair): its parts' buffers populated ahead, on a worker. */
void jcap_prefill_dense(struct dte_engine *eng, const struct jentry *e, size_t n,
			size_t part_bytes);

#endif

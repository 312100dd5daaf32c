/* daemon/job_src_engine.h — the source role as the engine's upper layers call it
 * (daemon/job_src.c): STAGED and APPLIED in, waits, captures done, frees.
 * (The control operations are daemon/job_src.h.)
 *
 * One header per layer (docs/SYNC.md, "Layers"): an engine file includes
 * the headers of the layers it may call, below its own, and the compiler
 * refuses a call to a layer it does not include; tests/system/
 * engine_layers.sh checks both the includes and the calls. */
#ifndef DTED_JOB_SRC_ENGINE_H
#define DTED_JOB_SRC_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/job_state.h"

void jsrc_staged(struct job *j, const Dtep__Staged *m);
void jsrc_applied(struct job *j, const Dtep__Applied *m);
/* The engine's parts_wake: send the parts every running capture framed. */
void jsrc_parts_ready(void *engine);
/* 1: every sink fed from here applied version; 0: not yet; -1: a sink
 * reported it failed (why in err). */
int jsrc_wait_done(struct job *j, uint64_t version, uint32_t *sinks, char *err, size_t errlen);
/* Frees what the source side allocated for l (job_local.c's jlocal_free). */
void jsrc_free(struct dte_engine *e, struct jlocal *l);
/* Source l's capture of `version` (0: its last publish): 1 when it no
 * longer reads the buffers (*rep: its counts when it is the last one),
 * 0 while it does, a negative errno with the reason when it failed or
 * was never published. */
int jsrc_captured(struct job *j, struct jlocal *l, uint64_t version, struct jpublish_res *rep,
		  char *err, size_t errlen);
/* Buffers ready for the local sources' dense versions after a re-plan. */
void jsrc_replanned(struct job *j);

#endif

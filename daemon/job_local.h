/* daemon/job_local.h — participants (daemon/job_local.c): made and freed
 * with both roles' state.
 *
 * One header per layer (docs/SYNC.md, "Layers"): an engine file includes
 * the headers of the layers it may call, below its own, and the compiler
 * refuses a call to a layer it does not include; tests/system/
 * engine_layers.sh checks both the includes and the calls. */
#ifndef DTED_JOB_LOCAL_H
#define DTED_JOB_LOCAL_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/job_state.h"

/* A zeroed participant of role (JROLE_*): a struct jsource or a struct
 * jsink, with nbufs buffer slots; NULL when out of memory.  jlocal_free()
 * frees either. */
struct jlocal *jlocal_new(int role, size_t nbufs);
void jlocal_free(struct dte_engine *e, struct jlocal *l);

#endif

/* daemon/job_task.h — heavy steps on workers (daemon/job_task.c) and the
 * shutdown drain.
 *
 * One header per layer (docs/SYNC.md, "Layers"): an engine file includes
 * the headers of the layers it may call, below its own, and the compiler
 * refuses a call to a layer it does not include; tests/system/
 * engine_layers.sh checks both the includes and the calls. */
#ifndef DTED_JOB_TASK_H
#define DTED_JOB_TASK_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/job_state.h"

void jtask_start(struct dte_engine *e, struct jtask *t);
/* Any capture or task of e still on a worker. */
int jtask_busy(struct dte_engine *e);
/* Shutdown: refuse new work, cancel what has not started and run the
 * loop until every capture and task came back (their callbacks). */
void job_tasks_drain(struct dte_engine *e);

#endif

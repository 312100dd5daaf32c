/* daemon/job_persist.h — jobs kept across a daemon's restarts
 * (daemon/job_persist.c; config [daemon] job_state_dir). */
#ifndef DTED_JOB_PERSIST_H
#define DTED_JOB_PERSIST_H

#include <stddef.h>
#include "proto/dte.pb-c.h"

struct dte_engine;

/* Keep jobs in path (created 0700 if missing); NULL or "" = keep none.
 * Returns 0 or a negative errno with the reason in err. */
int  jpersist_init(struct dte_engine *e, const char *path, char *err, size_t errlen);
/* job_create made a new job from rq: keep rq (logged when it cannot). */
void jpersist_save(struct dte_engine *e, const Dte__JobCreateRequest *rq);
/* Create every kept job again (after dte_engine_new, before serving anyone).
 * Returns how many files it tried; each outcome is logged. */
int  jpersist_restore(struct dte_engine *e);

#endif

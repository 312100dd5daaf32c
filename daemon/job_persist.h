/* daemon/job_persist.h — jobs kept across a daemon's restarts
 * (daemon/job_persist.c; config [daemon] job_state_dir). */
#ifndef DTED_JOB_PERSIST_H
#define DTED_JOB_PERSIST_H

#include <stddef.h>

struct dte_engine;
struct jcreate_args;

/* Keep jobs in path (created 0700 if missing); NULL or "" = keep none.
 * Returns 0 or a negative errno with the reason in err. */
int  jpersist_init(struct dte_engine *e, const char *path, char *err, size_t errlen);
/* job_create made a new job from a: keep a (logged when it cannot), as
 * the control protocol's JobCreateRequest packed (daemon/wire_job.h), the
 * format the files always had. */
void jpersist_save(struct dte_engine *e, const struct jcreate_args *a);
/* Create every kept job again (after dte_engine_new, before serving anyone).
 * Returns how many files it tried; each outcome is logged. */
int  jpersist_restore(struct dte_engine *e);

#endif

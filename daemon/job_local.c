/* daemon/job_local.c — a participant attached here, made and freed: the
 * one place that knows both roles' state (struct jsource, struct jsink;
 * daemon/job_state.h).  Above the role files (it frees a sink through
 * job_sink.c), below the files that attach and detach (job.c, the
 * storage writer in job_storage.c). */
#include <stdlib.h>
#include "daemon/buf.h"
#include "daemon/job_state.h"
#include "daemon/job_src_engine.h"
#include "daemon/job_sink_engine.h"
#include "daemon/job_local.h"

struct jlocal *jlocal_new(int role, size_t nbufs)
{
	struct jlocal *l;

	if (role == JROLE_SOURCE)
		l = calloc(1, sizeof(struct jsource));
	else if (role == JROLE_SINK)
		l = calloc(1, sizeof(struct jsink));
	else
		return NULL;
	if (!l)
		return NULL;
	l->info.role = role;
	l->nbufs = nbufs;
	if (!(l->bufs = calloc(nbufs ? nbufs : 1, sizeof(*l->bufs))) ||
	    !(l->buf_ids = calloc(nbufs ? nbufs : 1, sizeof(*l->buf_ids)))) {
		free(l->bufs);
		free(l);
		return NULL;
	}
	if (role == JROLE_SOURCE)
		jsource_of(l)->covered = -1;
	return l;
}

/* Frees what jlocal_new() and the role's code allocated, and drops the
 * buffer references it took. */
void jlocal_free(struct dte_engine *e, struct jlocal *l)
{
	if (!l)
		return;
	if (l->info.role == JROLE_SINK)
		jsink_free(e, l);
	else
		jsrc_free(e, l);
	for (size_t i = 0; i < l->nbufs; i++)
		if (l->bufs[i])
			dbuf_unref(l->bufs[i]);
	free(l->bufs);
	free(l->buf_ids);
	free(l);
}

/* daemon/job_sink.c — the sink side's entry points: apply (job_sink.h),
 * the sink freed, its pending versions after a re-plan, the newest
 * version it holds, and the park of its client's wait_staged (apply on
 * arrival's start and end).
 *
 * The sink collects COUNTS and PAYLOADs per version, decodes them (every
 * position checked against its entry) into staging, and applies staged
 * versions in order when the client asks, verifying each buffer's
 * checksum against the sum of the partials.  Its concerns are files of
 * their own (job_sink_int.h lists them, and what they share).
 *
 * A version is staged whole or not at all: a sparse pair must build on
 * exactly the version the sink holds (staged or applied last), otherwise
 * the version is refused (APPLIED base_mismatch) and the sources repair
 * densely.  A version that is dense from every source supersedes what is
 * staged before it.
 *
 * Calls: the sink's files below it (job_sink_aoa.c, job_sink_apply.c,
 * job_sink_version.c), job_ops.c, job_state.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include "daemon/job_sink.h"
#include "daemon/job_sink_int.h"
#include "daemon/job_state.h"
#include "daemon/job_sink_engine.h"
#include "daemon/job_ops.h"
#include "daemon/metrics.h"
#include "daemon/recvpool.h"
#include "daemon/sink_sm.h"

void jsink_free(struct dte_engine *e, struct jlocal *l)
{
	struct jsink *k = jsink_of(l);

	if (k->w) {
		jsink_japplied_free(k->w->deferred);
		free(k->w);
		k->w = NULL;
	}
	if (k->arrive) {
		struct jarrive *a = k->arrive;

		/* Every cell: → gone, the swaps undone (undo, continue,
		 * drain): on a worker, or here at shutdown once the workers
		 * are drained (the engine never finds a torn version). */
		(void)sink_decide(l, a->version, &a->state,
				  e->stopping ? SINK_EV_SHUTDOWN : SINK_EV_DETACHED);
		k->arrive = NULL;
		jsink_arrive_orphan(a);
	}
	jops_sink_free(e, l);
	recvpool_retire(k->rpool);
	k->rpool = NULL;
	free(k->vsum);
	k->vsum = NULL;
	k->vkey = 0;
	while (k->pend) {
		struct jpend *p = k->pend;

		k->pend = p->next;
		if (sink_decide(l, p->version, &p->state, SINK_EV_DETACHED).act == SINK_A_FREE)
			jsink_pend_free(p);
	}
	while (k->staged) {
		struct jstaged *s = k->staged;

		k->staged = s->next;
		if (sink_decide(l, s->version, &s->state, SINK_EV_DETACHED).act == SINK_A_FREE)
			jsink_staged_free(s);
	}
}

uint64_t jsink_newest_staged(const struct jlocal *l)
{
	const struct jsink *k = jsink_cof(l);
	const struct jstaged *s = k->staged;

	while (s && s->next)
		s = s->next;
	/* A version on its way into the buffers (an apply on a worker) is
	 * held too. */
	return s ? s->version : k->applying ? k->applying : k->applied;
}

void jsink_replanned(struct job *j)
{
	for (struct jlocal *l = j->locals; l; l = l->next) {
		struct jpend *p, *next;

		if (l->info.role != JROLE_SINK)
			continue;
		for (p = jsink_of(l)->pend; p; p = next) {
			uint64_t v = p->version;
			struct sink_step d;

			next = p->next;
			if (p->epoch == j->epoch)
				continue;
			if (jsink_of(l)->arrive && jsink_of(l)->arrive->version == v) {
				/* undone (the sources refuse it anyway) */
				jsink_arrive_event(j, l, SINK_EV_REPLAN,
						   DTEP__APPLY_RESULT__APPLY_REFUSED, "re-planned");
				if (!jsink_of(l)->arrive ||
				    jsink_of(l)->arrive->state != SINK_V_RETREATING)
					jsink_pend_drop(l, p);
				continue;
			}
			d = sink_decide(l, v, &p->state, SINK_EV_REPLAN);
			if (d.act == SINK_A_FREE) {
				jsink_pend_drop(l, p);
				jsink_step_check(j, l, v, d);
			}
		}
	}
}

void job_set_verify_full_every(struct dte_engine *e, uint32_t n)
{
	e->verify_full_every = n;
}

int job_apply(struct dte_engine *e, const struct jreq *req, const struct japply_args *rq,
	      struct japply_res *rep, int *deferred, char *err, size_t errlen)
{
	struct job *j = job_find(e, rq->job);
	struct jlocal *l;
	int st;

	if (!j) {
		snprintf(err, errlen, "unknown job \"%s\"", rq->job ? rq->job : "");
		return -ENOENT;
	}
	l = job_local_owned(j, rq->participant, req->conn);
	if (!l || l->info.role != JROLE_SINK) {
		snprintf(err, errlen, "job %s: no sink participant %llx on this connection", j->name,
			 (unsigned long long)rq->participant);
		return -ENOENT;
	}
	if (!jsink_of(l)->applying &&
	    (!jsink_of(l)->staged || jsink_of(l)->staged->version > rq->version)) {
		/* Nothing staged at or below it: its state answers (a query:
		 * every such cell keeps the state, so the copy is not kept). */
		enum sink_vstate vs = jsink_vstate(l, rq->version);

		if (sink_decide(l, rq->version, &vs, SINK_EV_APPLY).act == SINK_A_ANSWER) {
			/* A failed version (its check failed, undone): the sink
			 * holds the version before it, and says so. */
			rep->version = jsink_of(l)->applied;
			rep->checksum_ok = vs != SINK_V_FAILED;
			rep->checksum_failures = jsink_of(l)->checksum_failures;
			return 0;
		}
		snprintf(err, errlen, "job %s: version %llu is not staged (newest staged %llu, applied %llu)",
			 j->name, (unsigned long long)rq->version,
			 (unsigned long long)jsink_newest_staged(l),
			 (unsigned long long)jsink_of(l)->applied);
		return -ENOENT;
	}
	st = jsink_apply_start(j, l, rq->version, req, NULL, NULL, err, errlen);
	if (st == 0)
		*deferred = 1;
	return st;
}

int jsink_park_ending(struct job *j, struct jlocal *l)
{
	struct jarrive *a = jsink_of(l)->arrive;

	if (!a)
		return 0;
	if (a->state == SINK_V_ARRIVING)
		jsink_arrive_event(j, l, SINK_EV_UNPARK, 0, "its park ends");
	return jsink_of(l)->arrive != NULL;
}

/* Sinks parked in the engine (e->parked_total: the dted_sinks_parked
 * gauge). */
void jsink_parked(struct dte_engine *e, struct jlocal *l)
{
	jsink_of(l)->parked++;
	dmetrics_set(DM_SINKS_PARKED, NULL, (double)++e->parked_total);
}

void jsink_unparked(struct dte_engine *e, struct jlocal *l)
{
	if (!jsink_of(l)->parked)
		return;
	jsink_of(l)->parked--;
	if (e->parked_total)
		e->parked_total--;
	dmetrics_set(DM_SINKS_PARKED, NULL, (double)e->parked_total);
}

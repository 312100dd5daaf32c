/* daemon/job_task.c — heavy steps of the sync engine on the I/O's worker
 * threads (docs/SYNC.md, "Threads"; daemon/engine_io.h's worker pool).
 *
 * The loop owns every job, participant and version; a task is handed
 * everything its worker touches (copies, references on the buffers it
 * reads or writes, the staged versions it applies) and comes back through
 * its done callback on the loop, which looks the job and participant up
 * again by name and id: whatever went away meanwhile (a detach, a closed
 * connection, a deleted job, a re-plan) is seen there and the result is
 * dropped cleanly.  Shutdown cancels what has not started and runs the
 * loop until every started task's callback came back (job_tasks_drain):
 * no sleeps, no orphaned worker still reading client memory.
 */
#include "daemon/job_state.h"
#include "daemon/job_task.h"
#include "daemon/log.h"

static void task_work(struct dte_work *w)
{
	struct jtask *t = (struct jtask *)w;	/* work is its first member */

	t->run(t);
}

static void task_unlink(struct jtask *t)
{
	for (struct jtask **pp = &t->eng->tasks; *pp; pp = &(*pp)->next) {
		if (*pp == t) {
			*pp = t->next;
			return;
		}
	}
}

static void task_after(struct dte_work *w, int cancelled)
{
	struct jtask *t = (struct jtask *)w;

	task_unlink(t);
	t->done(t, cancelled);
}

void jtask_start(struct dte_engine *e, struct jtask *t)
{
	t->eng = e;
	t->next = e->tasks;
	e->tasks = t;
	if (jio_queue(e, &t->work, task_work, task_after) < 0) {
		/* No workers (unit tests without a loop) or none to be had:
		 * here. */
		task_work(&t->work);
		task_after(&t->work, 0);
	}
}

int jtask_busy(struct dte_engine *e)
{
	/* store_commits: a storage writer's commits on workers, deleted
	 * jobs' too (job_storage.c counts them in the engine). */
	return e->tasks || e->inflight || e->prefills || e->store_commits > 0;
}

void job_tasks_drain(struct dte_engine *e)
{
	e->stopping = 1;
	if (!e->io.run)
		return;
	if (jtask_busy(e)) {
		size_t n = 0;

		for (struct jtask *t = e->tasks; t; t = t->next)
			n++;
		for (struct jcap *c = e->inflight; c; c = c->next)
			n++;
		DLOG_N("shutdown: waiting for %zu tasks on workers%s", n,
		       e->store_commits > 0 ? " and a storage commit" : "");
	}
	/* Queued, not started: their callbacks come with cancelled set. */
	for (struct jtask *t = e->tasks; t; t = t->next)
		e->io.work_cancel(e->io.ctx, &t->work);
	for (struct jcap *c = e->inflight; c; c = c->next)
		e->io.work_cancel(e->io.ctx, &c->work);
	/* Storage commits are left to finish (a cancelled one would leave
	 * its version unwritten for no gain).  Each round blocks until
	 * something happens; a worker that ends wakes the loop, and its
	 * callback unlinks the task. */
	while (jtask_busy(e))
		if (e->io.run(e->io.ctx, 1) < 0)
			break;
}

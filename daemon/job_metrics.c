/* daemon/job_metrics.c — per-job and per-sink gauges (job_metrics.h).
 *
 * A sink's lag is read where the job's newest version is known: on the
 * daemon of its sources.  The newest version is the largest one a local
 * source published (its capture done); a sink's applied version is the
 * newest APPLIED its pairs with those sources heard (pair_sm.applied, as
 * `dtectl job` shows it for a sink on another node).  A sink fed from
 * more than one daemon shows on each; dashboards take the max. */
#include <inttypes.h>
#include <stdio.h>
#include "daemon/job_metrics.h"
#include "daemon/job_state.h"
#include "daemon/metrics.h"

void job_metrics_collect(struct dte_engine *e)
{
	dmetrics_clear(DM_JOB_PUBLISHED_VERSION);
	dmetrics_clear(DM_SINK_VERSIONS_BEHIND);
	dmetrics_clear(DM_LINK_RATE);
	for (struct job *j = e->jobs; j; j = j->next) {
		uint64_t latest = 0;
		int sources = 0;

		for (size_t i = 0; i < j->nlinks; i++)
			if (j->links[i].m.Bps > 0) {
				const char *labels[] = { j->name, j->links[i].node };

				dmetrics_set_labels(DM_LINK_RATE, labels, j->links[i].m.Bps);
			}

		for (struct jlocal *l = j->locals; l; l = l->next) {
			if (l->info.role != JROLE_SOURCE)
				continue;
			sources = 1;
			if (jsource_cof(l)->last_version > latest)
				latest = jsource_cof(l)->last_version;
		}
		if (!sources)
			continue;
		dmetrics_set(DM_JOB_PUBLISHED_VERSION, j->name, (double)latest);
		for (size_t i = 0; i < j->nparts; i++) {
			const struct jpinfo *pi = &j->parts[i];
			uint64_t applied = 0;
			int fed = 0;
			char id[24];

			if (pi->role != JROLE_SINK)
				continue;
			for (size_t q = 0; q < j->npairs; q++) {
				const struct jpair *p = &j->pairs[q];

				if (p->dst != pi->id || !job_local(j, p->src))
					continue;
				fed = 1;
				if (p->sm.applied > applied)
					applied = p->sm.applied;
			}
			if (!fed)
				continue;
			snprintf(id, sizeof(id), "0x%" PRIx64, pi->id);
			const char *labels[] = { j->name, id, pi->node };

			dmetrics_set_labels(DM_SINK_VERSIONS_BEHIND, labels,
					    latest > applied ? (double)(latest - applied) : 0.0);
		}
	}
}

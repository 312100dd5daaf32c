/* daemon/job_metrics.h — the sync engine's pull-style gauges, read when
 * the metrics are rendered (cmd_ops.c's collector, on the loop thread). */
#ifndef DTED_JOB_METRICS_H
#define DTED_JOB_METRICS_H

/* Sets dted_job_published_version{job_name} and
 * dted_sink_versions_behind{job_name,sink,sink_node} afresh from the jobs
 * as they are now: a job or sink gone since the last rendering has no
 * series.  The job's label is job_name, not job: Prometheus gives every
 * target a `job` label and would rename a `job` of ours to exported_job. */
struct dte_engine;
void job_metrics_collect(struct dte_engine *e);

#endif

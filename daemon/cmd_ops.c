/* daemon/cmd_ops.c — operator commands: verify, resync, metrics, config,
 * log-level; and the pull-style gauges the metrics show. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>
#include "daemon/conf.h"
#include "daemon/derr.h"
#include "daemon/dispatch.h"
#include "daemon/job_metrics.h"
#include "daemon/job_ops.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "daemon/registry.h"
#include "daemon/route_ucx.h"

/* rc: 0 or a negative errno from the engine (daemon/derr.h). */
static Dte__Status done(struct dreply *r, int rc, const char *err)
{
	if (rc < 0)
		dreply_msg(r, "%s", err);
	return derr_status(rc);
}

/* Gauges nobody pushes: read when metrics are rendered. */
static void collect(void *arg)
{
	const struct dsrv *srv = arg;
	struct droute_ucx *ru = droute_ucx_daemon();
	struct dreg_counts reg = dreg_counts();

	/* Milliseconds are plenty: 7.617, not 7.617794521. */
	dmetrics_set(DM_UPTIME, NULL, (double)((uv_hrtime() - srv->start_ns) / 1000000u) / 1e3);
	dmetrics_set(DM_CLIENTS, NULL, srv->clients);
	dmetrics_set(DM_JOBS, NULL, reg.jobs);
	dmetrics_set(DM_PEERS_UP, NULL, ru ? droute_ucx_peers_up(ru) : 0);
	/* Counted by ctl.c and the router; mirrored, never lowered. */
	dmetrics_raise(DM_REFUSED, "credentials", (double)srv->refused);
	dmetrics_raise(DM_REFUSED, "bad_frame", (double)srv->bad_frames);
	if (ru) {
		struct droute_ucx_stats st = { 0 };

		droute_ucx_stats(ru, &st);
		dmetrics_raise(DM_REFUSED, "peer_record", (double)st.bad);
	}
	if (srv->eng)
		job_metrics_collect(srv->eng);
}

void dcmd_ops_init(struct dsrv *srv)
{
	dmetrics_set_collector(collect, srv);
}

Dte__Status dcmd_verify(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			Dte__Response *resp, struct dreply *r)
{
	Dte__VerifyReply *rep = dreply_alloc(r, sizeof(*rep));
	struct jreq rq = dcmd_jreq(srv, s, req);
	struct jverify_res res = { 0 };
	char err[512];
	int deferred = 0;
	int st;

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__verify_reply__init(rep);
	resp->body_case = DTE__RESPONSE__BODY_VERIFY;
	resp->verify = rep;
	st = job_verify(srv->eng, &rq, req->verify->job, &res, &deferred, err, sizeof(err));
	if (st == 0 && deferred)
		dreply_defer(r);
	/* Answered now: nothing to check here (res.note says why); no results. */
	if (st == 0 && !deferred) {
		dcmd_verify_out(rep, &res, NULL, NULL);
		if (res.note[0])
			dreply_msg(r, "%s", res.note);
	}
	return done(r, st, err);
}

Dte__Status dcmd_resync(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			Dte__Response *resp, struct dreply *r)
{
	Dte__ResyncReply *rep = dreply_alloc(r, sizeof(*rep));
	struct jresync_res res = { 0 };
	char err[512];
	int st;

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__resync_reply__init(rep);
	resp->body_case = DTE__RESPONSE__BODY_RESYNC;
	resp->resync = rep;
	st = job_resync(srv->eng, req->resync->job, req->resync->sink, &res, err, sizeof(err));
	if (st == 0) {
		rep->job = (char *)res.job;
		rep->pairs = res.pairs;
		rep->remote = res.remote;
	}
	return done(r, st, err);
}

Dte__Status dcmd_metrics(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			 Dte__Response *resp, struct dreply *r)
{
	Dte__MetricsReply *rep = dreply_alloc(r, sizeof(*rep));
	struct dmetric_sample *smp = NULL;
	size_t len = 0, n = 0;
	char *text = dmetrics_render(&len);
	Dte__Status st = DTE__STATUS__STATUS_ERR_INTERNAL;

	if (!rep || !text || dmetrics_samples(&smp, &n) < 0)
		goto out;
	dte__metrics_reply__init(rep);
	rep->text = dreply_strdup(r, text);
	rep->samples = dreply_alloc(r, (n ? n : 1) * sizeof(*rep->samples));
	if (!rep->text || !rep->samples)
		goto out;
	for (size_t i = 0; i < n; i++) {
		Dte__MetricSample *m = dreply_alloc(r, sizeof(*m));

		if (!m)
			goto out;
		dte__metric_sample__init(m);
		m->name = dreply_strdup(r, smp[i].name);
		m->labels = dreply_strdup(r, smp[i].labels);
		m->value = smp[i].value;
		if (!m->name || !m->labels)
			goto out;
		rep->samples[rep->n_samples++] = m;
	}
	resp->body_case = DTE__RESPONSE__BODY_METRICS;
	resp->metrics = rep;
	st = DTE__STATUS__STATUS_OK;
out:
	if (st != DTE__STATUS__STATUS_OK)
		dreply_msg(r, "metrics: out of memory");
	free(text);
	free(smp);
	return st;
}

Dte__Status dcmd_config(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			Dte__Response *resp, struct dreply *r)
{
	Dte__ConfigReply *rep = dreply_alloc(r, sizeof(*rep));

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__config_reply__init(rep);
	rep->entries = dreply_alloc(r, DCONF_K__COUNT * sizeof(*rep->entries));
	if (!rep->entries)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	for (unsigned i = 0; i < DCONF_K__COUNT; i++) {
		Dte__ConfigEntry *e = dreply_alloc(r, sizeof(*e));
		const char *section, *key, *source;
		char val[PATH_MAX + 16];

		if (!e || dconf_describe(srv->conf, i, &section, &key, val, sizeof(val), &source) < 0)
			return DTE__STATUS__STATUS_ERR_INTERNAL;
		dte__config_entry__init(e);
		/* `dtectl log-level` changes the level until restart or SIGHUP. */
		if (i == DCONF_K_LOG_LEVEL && (int)dlog_get_level() != srv->conf->log_level) {
			snprintf(val, sizeof(val), "%s", dlog_level_name(dlog_get_level()));
			source = "runtime";
		}
		e->section = (char *)section;
		e->key = (char *)key;
		e->source = (char *)source;
		e->value = dreply_strdup(r, val);
		if (!e->value)
			return DTE__STATUS__STATUS_ERR_INTERNAL;
		rep->entries[rep->n_entries++] = e;
	}
	resp->body_case = DTE__RESPONSE__BODY_CONFIG;
	resp->config = rep;
	return DTE__STATUS__STATUS_OK;
}

Dte__Status dcmd_log_level(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			   Dte__Response *resp, struct dreply *r)
{
	Dte__LogLevelReply *rep = dreply_alloc(r, sizeof(*rep));
	const char *want = req->log_level->level;
	enum dlog_level prev = dlog_get_level();
	int l;

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__log_level_reply__init(rep);
	rep->previous = (char *)dlog_level_name(prev);
	if (want && *want) {
		l = dlog_level_parse(want);
		if (l < 0) {
			dreply_msg(r, "log-level: '%s' is not one of error|warn|notice|info|debug", want);
			return DTE__STATUS__STATUS_ERR_INVALID;
		}
		dlog_set_level((enum dlog_level)l);
		/* Logged at notice either way, so the change shows in the journal. */
		if (l != (int)prev) {
			dlog_set_level(DLOG_NOTICE > l ? DLOG_NOTICE : (enum dlog_level)l);
			DLOG_N("log level %s -> %s (dtectl, pid %d uid %u)", dlog_level_name(prev),
			       dlog_level_name((enum dlog_level)l), (int)s->pid, (unsigned)s->uid);
			dlog_set_level((enum dlog_level)l);
		}
	}
	rep->level = (char *)dlog_level_name(dlog_get_level());
	resp->body_case = DTE__RESPONSE__BODY_LOG_LEVEL;
	resp->log_level = rep;
	return DTE__STATUS__STATUS_OK;
}

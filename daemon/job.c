/* daemon/job.c — the engine's top layer (docs/SYNC.md, "Layers"): jobs created
 * and deleted, participants attached and detached, records in
 * (job_peer_recv, dispatched to the files below), deferred answers
 * (waits), introspection. */
#include <ctype.h>
#include <stdarg.h>
#include <errno.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include "daemon/dreply.h"
#include "daemon/job_cuda.h"
#include "daemon/job_ops.h"
#include "daemon/job_auth.h"
#include "daemon/job_ext.h"
#include "daemon/job.h"
#include "daemon/job_state.h"
#include "daemon/job_coord.h"
#include "daemon/job_src_engine.h"
#include "daemon/job_sink_engine.h"
#include "daemon/job_local.h"
#include "daemon/job_capture.h"
#include "daemon/job_task.h"
#include "daemon/job_storage.h"
#include "daemon/log.h"
#include "daemon/registry.h"
#include "gpu/compute.h"

/* Deferred control answers: attach (plan arrived), wait, wait_staged,
 * wait_captured.  Each is a struct jwait (job_state.h) whose completion
 * is waiter_try below: the engine's table keeps it, and any layer whose
 * progress may answer one asks the table (jwait_check), never this file.
 * arg: the participant (attach, staged, captured) or the version (wait);
 * arg2: the version (captured). */
enum { JW_ATTACH, JW_WAIT, JW_STAGED, JW_CAPTURED };

#define ATTACH_TIMEOUT_MS 15000u

static void jlocal_remove(struct job *j, struct jlocal *l)
{
	struct jlocal **pp;

	for (pp = &j->locals; *pp; pp = &(*pp)->next) {
		if (*pp == l) {
			*pp = l->next;
			break;
		}
	}
	jlocal_free(j->eng, l);
}

/* ---------------------------------------------------------------- waiters */

/* A wait_staged over: its sink is parked once less (jsink.parked). */
static void waiter_unpark(struct dte_engine *e, const struct jwait *w)
{
	struct job *j = w->kind == JW_STAGED ? job_find(e, w->job) : NULL;
	struct jlocal *l = j ? job_local(j, w->arg) : NULL;

	if (l && l->info.role == JROLE_SINK)
		jsink_unparked(e, l);
}

/* 1 when the waiter was answered. */
static int waiter_try(struct dte_engine *e, struct jwait *w, int expired)
{
	struct job *j = job_find(e, w->job);
	char msg[2048];

	if (!j) {
		job_done(&w->rq, -ENOENT, "job vanished", NULL);
		return 1;
	}
	switch (w->kind) {
	case JW_ATTACH: {
		struct jlocal *l = job_local(j, w->arg);
		struct jres res = { .op = JOP_ATTACH };

		if (l && l->announced) {
			res.attach.participant = l->info.id;
			res.attach.epoch = j->epoch;
			res.attach.complete = j->complete;
			job_done(&w->rq, 0, "", &res);
			return 1;
		}
		if (!l || l->refused[0] || expired) {
			/* Decided before l goes: jlocal_remove frees it. */
			int rc = !l ? -ENOENT : l->refused[0] ? -EINVAL : -ETIMEDOUT;

			snprintf(msg, sizeof(msg), "attach to job %s refused: %s%s%s", j->name,
				 !l ? "participant gone" : l->refused[0] ? l->refused :
				 "the coordinator did not answer in time",
				 l && !l->refused[0] && j->refusal_hint[0] ? "; " : "",
				 l && !l->refused[0] ? j->refusal_hint : "");
			if (l) {
				jlocal_remove(j, l);
				job_send_join(j);
			}
			job_done(&w->rq, rc, msg, NULL);
			return 1;
		}
		return 0;
	}
	case JW_WAIT: {
		struct jres res = { .op = JOP_WAIT };
		uint32_t sinks = 0;
		int st = jsrc_wait_done(j, w->arg, &sinks, msg, sizeof(msg));

		if (st < 0) {
			job_done(&w->rq, st, msg, NULL);
			return 1;
		}
		if (st > 0) {
			res.wait.version = w->arg;
			res.wait.sinks = sinks;
			job_done(&w->rq, 0, "", &res);
			return 1;
		}
		if (expired && msg[0]) {        /* a sink failed it; another never answered */
			job_done(&w->rq, -EIO, msg, NULL);
			return 1;
		}
		if (expired) {
			snprintf(msg, sizeof(msg), "job %s: version %llu not applied by every sink in time",
				 j->name, (unsigned long long)w->arg);
			job_done(&w->rq, -ETIMEDOUT, msg, NULL);
			return 1;
		}
		return 0;
	}
	case JW_STAGED: {
		struct jlocal *l = job_local(j, w->arg);
		struct jres res = { .op = JOP_WAIT_STAGED };

		if (l && l->info.role == JROLE_SINK &&
		    jsink_newest_staged(l) > jsink_of(l)->applied) {
			res.staged.version = jsink_newest_staged(l);
			res.staged.applied = jsink_of(l)->applied;
			job_done(&w->rq, 0, "", &res);
			return 1;
		}
		/* Apply on arrival: the client gets control back only once
		 * what its buffers hold is whole (docs/SYNC.md). */
		if (l && l->info.role == JROLE_SINK && expired && jsink_park_ending(j, l))
			return 0;
		if (!l || expired) {
			snprintf(msg, sizeof(msg), "job %s: %s%s%s", j->name,
				 l ? "no new version staged in time" : "participant gone",
				 j->coord_plan_err[0] ? "; no plan: " : "", j->coord_plan_err);
			job_done(&w->rq, l ? -ETIMEDOUT : -ENOENT, msg, NULL);
			return 1;
		}
		return 0;
	}
	case JW_CAPTURED: {
		struct jlocal *l = job_local(j, w->arg);
		struct jres res = { .op = JOP_WAIT_CAPTURED };
		int st;

		if (!l) {
			snprintf(msg, sizeof(msg), "job %s: participant gone", j->name);
			job_done(&w->rq, -ENOENT, msg, NULL);
			return 1;
		}
		st = jsrc_captured(j, l, w->arg2, &res.publish, msg, sizeof(msg));
		if (st < 0) {
			job_done(&w->rq, st, msg, NULL);
			return 1;
		}
		if (st > 0) {
			job_done(&w->rq, 0, "", &res);
			return 1;
		}
		if (expired) {
			snprintf(msg, sizeof(msg), "job %s: the capture of version %llu still reads the "
				 "source's buffers", j->name, (unsigned long long)w->arg2);
			job_done(&w->rq, -ETIMEDOUT, msg, NULL);
			return 1;
		}
		return 0;
	}
	}
	return 1;
}

static void on_tick(void *arg)
{
	jwait_check(arg);
}

/* The ctl timer: JOINs and PLANs due again (job_coord.c). */
static void on_ctl_tick(void *arg)
{
	jctl_retry(arg);
}

static int waiter_add(struct dte_engine *e, int kind, const struct jreq *rq,
		      const char *job, uint64_t arg, uint64_t arg2, uint32_t timeout_ms)
{
	struct jwait w = { .kind = kind, .rq = *rq, .arg = arg, .arg2 = arg2,
			   .try = waiter_try, .gone = waiter_unpark };

	snprintf(w.job, sizeof(w.job), "%s", job);
	return jwait_add(e, &w, timeout_ms);
}

/* --------------------------------------------------------------- lifecycle */

/* Records and node-downs from the transport (engine_io.h, attach): ctx
 * is the engine. */
static void peer_recv(void *ctx, const char *from, Dtep__PeerMsgType type, const uint8_t *hdr,
		      size_t hdrlen, const void *data, size_t len)
{
	job_peer_recv(ctx, from, type, hdr, hdrlen, data, len);
}

static void peer_down(void *ctx, const char *node)
{
	job_peer_down(ctx, node);
}

struct dte_engine *dte_engine_new_io(const struct dte_engine_io *io,
				     const struct dtc_backend *be, const char *backend_name)
{
	const char *node = io->self_node(io->ctx);
	struct dte_engine *e = calloc(1, sizeof(*e));

	if (!e || !(e->cpool = jcap_pool_new(e))) {
		DLOG_E("sync engine: out of memory");
		free(e);
		if (io->fini)
			io->fini(io->ctx);
		return NULL;
	}
	e->io = *io;
	e->be = be;
	e->backend_name = backend_name;
	/* A test build's extension points (job_ext.h); none in production. */
	if (&job_ext_builtin)
		e->ext = job_ext_builtin;
	/* Process-level: the device path (job_cuda.c) and the buffers it
	 * opens are the process's, set up and ended with its engine. */
	jcuda_init(be);
	if (peer_auth_init() < 0) {
		DLOG_E("sync engine: libsodium has no randomness source");
		dte_engine_free(e);
		return NULL;
	}
	/* 31 bits: participant ids (node_hash << 32 | local) stay below 2^63,
	 * so they survive JSON tools that hold integers as int64. */
	e->node_hash = (uint32_t)XXH64(node, strlen(node), 0x64746564u) & 0x7fffffffu;
	/* Workers hand payload parts to the loop as they frame them. */
	if (io->wake_new && !(e->parts_wake = io->wake_new(io->ctx, jsrc_parts_ready, e)))
		goto fail;
	if (io->timer_new && (!(e->timer = io->timer_new(io->ctx, on_tick, e)) ||
			      !(e->ctl_timer = io->timer_new(io->ctx, on_ctl_tick, e))))
		goto fail;
	/* The events the layers below raise (job_state.h, struct dte_engine). */
	/* Records come up from the transport through these (it never names
	 * the engine; it hands back the engine it was given). */
	io->attach(io->ctx, peer_recv, peer_down, job_auth_seal, e);
	return e;
fail:
	DLOG_E("sync engine: its timers or wake-up could not be made");
	dte_engine_free(e);
	return NULL;
}

void job_set_created_hook(struct dte_engine *e,
			  void (*created)(struct dte_engine *e, const struct jcreate_args *a))
{
	e->created = created;
}

void job_set_max_staged(struct dte_engine *e, uint32_t n)
{
	e->max_staged = n;
}

void job_set_relay(struct dte_engine *e, uint32_t fanout, uint32_t roots, uint32_t lag_ms)
{
	e->relay_fanout = fanout;
	e->relay_roots = roots;
	e->relay_lag_ms = lag_ms;
	jctl_update(e);	/* the lag check's timer (job_coord.c, relay_lag_check) */
}

void job_set_relay_shape(struct dte_engine *e, int measured, uint32_t rate_age_ms)
{
	e->relay_measured = measured;
	e->relay_rate_age_ms = rate_age_ms ? rate_age_ms : 300000;
	jctl_update(e);	/* rates' expiry (job_coord.c, shape_check) */
}

static void job_free(struct job *j)
{
	while (j->locals) {
		struct jlocal *l = j->locals;

		j->locals = l->next;
		jlocal_free(j->eng, l);
	}
	jsink_ahead_free(j);
	jplan_free(j);
	jcoord_free(j);
	jstore_free(j);
	dte_spec_fini(&j->spec);
	free(j->links);
	free(j->config);
	free(j);
}

void dte_engine_free(struct dte_engine *e)
{
	int last;

	if (!e)
		return;
	/* Workers may still read or write client memory: what has not
	 * started is cancelled, and the loop runs until every task's
	 * completion came back (job_task.c).  Their completions run against
	 * live state, before anything below frees it. */
	job_tasks_drain(e);
	last = jcuda_fini();
	jwait_fini(e);
	while (e->jobs) {
		struct job *j = e->jobs;

		e->jobs = j->next;
		job_free(j);
		dreg_job_removed();
	}
	/* Off the transport (if it still delivers to this engine), so no
	 * record reaches the memory freed below. */
	e->io.detach(e->io.ctx, e);
	if (e->timer)
		e->io.timer_free(e->io.ctx, e->timer);
	if (e->ctl_timer)
		e->io.timer_free(e->io.ctx, e->ctl_timer);
	e->timer = e->ctl_timer = NULL;
	/* Every worker has ended and its completion ran (drained above):
	 * nothing wakes it any more. */
	if (e->parts_wake)
		e->io.wake_free(e->io.ctx, e->parts_wake);
	e->parts_wake = NULL;
	/* The I/O lets go of what it still holds (the default: runs the
	 * loop until libuv has let go of the handles). */
	if (e->io.fini)
		e->io.fini(e->io.ctx);
	/* The buffer registry is the process's: the last engine ends it. */
	if (last)
		dbuf_fini();
	jops_fini(e);
	/* Chunks still with the router come back to the pool, which then
	 * goes (job_capture.c). */
	jcap_pool_release(e->cpool);
	free(e);
}

void job_conn_gone(struct dte_engine *e, uint64_t conn)
{
	jwait_drop_conn(e, conn);
	for (struct job *j = e->jobs; j; j = j->next) {
		int changed = 0;
		struct jlocal *l = j->locals, *next;

		for (; l; l = next) {
			next = l->next;
			if (l->owner != conn)
				continue;
			DLOG_N("job %s: %s participant %llx (%s rank %u) left with its connection",
			       j->name, l->info.role == JROLE_SOURCE ? "source" : "sink",
			       (unsigned long long)l->info.id, l->info.layout, l->info.rank);
			jlocal_remove(j, l);
			changed = 1;
		}
		if (changed)
			job_send_join(j);
	}
	dbuf_release_owner(conn);
	jwait_check(e);
}

/* ----------------------------------------------------------------- create */

static int name_ok(const char *s)
{
	size_t n = s ? strlen(s) : 0;

	if (n == 0 || n >= JOB_NAME_MAX)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)s[i]) && !strchr("._-", s[i]))
			return 0;
	return 1;
}

#define FAIL(rc, ...) derr_fail(err, errlen, rc, __VA_ARGS__)

/* An MLA engine derives w_kc/w_vc (SGLang, DeepseekV2AttentionMLA via
 * post_load_weights) or W_UK/W_UV (vLLM, MLAAttention.process_weights_
 * after_loading) from kv_b_proj after loading; dted writes kv_b_proj.  A
 * sink of such a model attaches only if it says it rebuilds them after
 * every apply (AttachRequest.rederives: dte.integrations.vllm does), so
 * none serves stale attention unknowingly.  (Tensors the engines hold in
 * FP32 move as their exact halves: layout/spec.h, job_capture.c
 * entry_raw.) */
static int sink_syncable(const struct job *j, const struct jattach_args *rq, char *err,
			 size_t errlen)
{
	if (j->spec.cfg.arch == DTE_SPEC_ARCH_MLA && !rq->rederives)
		return FAIL(-EOPNOTSUPP, "job %s: multi-head latent attention: the engines derive "
			    "w_kc/w_vc (SGLang) or W_UK/W_UV (vLLM) from kv_b_proj after loading and "
			    "dted writes kv_b_proj only; this sink does not say it rebuilds them "
			    "after every apply (dte_attach_params.flags DTE_ATTACH_REDERIVES; "
			    "dte.integrations.vllm does), so it would serve stale attention "
			    "(docs/SUPPORTED.md)", j->name);
	return 0;
}

int job_create(struct dte_engine *e, const struct jcreate_args *rq, struct jcreate_res *rep,
	       char *err, size_t errlen)
{
	const char *coord = rq->coordinator && *rq->coordinator ? rq->coordinator : "local";
	struct jstore_cfg scfg;
	uint32_t k = rq->publish_interval ? rq->publish_interval : 1;
	int detect;
	char serr[384];
	int src;
	struct dte_spec spec;
	struct job *j;

	if (!name_ok(rq->name))
		return FAIL(-EINVAL,
			    "job name must be 1..%d characters of [A-Za-z0-9._-]", JOB_NAME_MAX - 1);
	if (!rq->token || !*rq->token || strlen(rq->token) >= sizeof(j->token))
		return FAIL(-EINVAL, "job %s: token must be 1..%zu characters",
			    rq->name, sizeof(j->token) - 1);
	if (strcmp(coord, "local") && !strchr(coord, ':'))
		return FAIL(-EINVAL,
			    "job %s: coordinator must be \"local\" or host:port, not \"%s\"", rq->name, coord);
	if (strlen(coord) >= sizeof(j->coordinator))
		return FAIL(-EINVAL, "job %s: coordinator address too long", rq->name);
	if ((src = jstore_parse(rq, &scfg, serr, sizeof(serr))) < 0)
		return FAIL(src, "job %s: %s", rq->name, serr);
	if (k > 1000000)
		return FAIL(-EINVAL, "job %s: publish interval %u out of range",
			    rq->name, k);
	if (scfg.relay &&
	    (!rq->detect || !*rq->detect || !strcmp(rq->detect, "snapshot")))
		/* A relay reader's source holds stored BF16 values and no
		 * optimizer state (job_storage.c, relay_start). */
		detect = JDETECT_SNAPSHOT;
	else if (scfg.relay)
		return FAIL(-EINVAL, "job %s: a relay reader (storage_role reader, transport both) "
			    "finds changes by snapshot: it has no optimizer state for detect \"%s\"",
			    rq->name, rq->detect);
	else if (!rq->detect || !*rq->detect || !strcmp(rq->detect, "adamw"))
		detect = JDETECT_ADAMW;
	else if (!strcmp(rq->detect, "snapshot"))
		detect = JDETECT_SNAPSHOT;
	else
		return FAIL(-EINVAL,
			    "job %s: detect \"%s\" unknown (adamw, snapshot)", rq->name, rq->detect);
	if (rq->zstd_level > 3)
		return FAIL(-EINVAL, "job %s: zstd_level %u out of range (0..3)",
			    rq->name, rq->zstd_level);
	if (!rq->model_config || !*rq->model_config)
		return FAIL(-EINVAL, "job %s: model_config (config.json text) missing",
			    rq->name);
	if (dte_spec_load_string(&spec, rq->model_config, serr, sizeof(serr)) < 0)
		return FAIL(-EINVAL, "job %s: model config: %s", rq->name, serr);
	j = job_find(e, rq->name);
	if (j) {
		const char *why = spec.hash != j->spec.hash ? "model" :
				  strcmp(j->token, rq->token) ? "token" :
				  strcmp(j->coordinator, coord) ? "coordinator" :
				  j->interval != k ? "publish interval" :
				  j->detect != detect ? "detect mode" :
				  j->zstd_level != rq->zstd_level ? "zstd level" :
				  !jstore_same_job(j, &scfg) ? "transport or storage configuration" : NULL;

		dte_spec_fini(&spec);
		if (why)
			return FAIL(-EINVAL,
				    "job %s exists on this daemon with a different %s", rq->name, why);
		rep->created = 0;
		rep->coordinator = j->is_coord;
		rep->spec_hash = j->spec.hash;
		rep->tensors = j->spec.n;
		return 0;
	}
	j = calloc(1, sizeof(*j));
	if (!j || !(j->config = strdup(rq->model_config))) {
		free(j);
		dte_spec_fini(&spec);
		return FAIL(-ENOMEM, "out of memory");
	}
	j->eng = e;
	snprintf(j->name, sizeof(j->name), "%s", rq->name);
	snprintf(j->token, sizeof(j->token), "%s", rq->token);
	job_auth_setup(j);
	snprintf(j->coordinator, sizeof(j->coordinator), "%s", coord);
	/* This job's boot: its JOINs' join_boot, and as coordinator its
	 * terms' boot (proto/peer_protocol.h), so a restart plans anew. */
	j->boot = job_boot_new();
	snprintf(j->transport, sizeof(j->transport), "%s", jstore_transport_name(scfg.transport));
	j->spec = spec;
	j->interval = k;
	j->detect = detect;
	j->zstd_level = rq->zstd_level;
	j->is_coord = jio_is_self(e, NULL, coord);
	j->next = e->jobs;
	e->jobs = j;
	dreg_job_added();
	if ((src = jstore_start(j, &scfg, serr, sizeof(serr))) < 0) {
		e->jobs = j->next;
		job_free(j);
		dreg_job_removed();
		/* The root is the request's: what cannot be opened or read
		 * there makes the request invalid; out of memory is ours. */
		return FAIL(src == -ENOMEM ? src : -EINVAL, "job %s: storage: %s", rq->name, serr);
	}
	DLOG_N("job %s created: %u tensors, spec %016llx, K=%u, coordinator %s%s", j->name,
	       j->spec.n, (unsigned long long)j->spec.hash, k, coord, j->is_coord ? " (this daemon)" : "");
	if (e->created)
		e->created(e, rq);	/* a restart of this daemon creates it again */
	rep->created = 1;
	rep->coordinator = j->is_coord;
	rep->spec_hash = j->spec.hash;
	rep->tensors = j->spec.n;
	return 0;
}

/* ----------------------------------------------------------------- attach */

static void prefault_start(struct dte_engine *e, const struct jlocal *l);

int job_attach(struct dte_engine *e, const struct jreq *req, const struct jattach_args *rq,
	       int *deferred, char *err, size_t errlen)
{
	uint64_t conn = req->conn;
	struct job *j = job_find(e, rq->job);
	struct dte_layout lay;
	struct jlocal *l = NULL;
	char lerr[256];
	int64_t need;
	int lrc;
	int role;
	size_t n = 0, i, k;
	int st;

	*deferred = 0;
	if (!j)
		return FAIL(-ENOENT, "unknown job \"%s\" (job_create first)",
			    rq->job ? rq->job : "");
	if (!rq->token || strcmp(rq->token, j->token))
		return FAIL(-EACCES, "job %s: wrong token", j->name);
	if (rq->role && !strcmp(rq->role, "source"))
		role = JROLE_SOURCE;
	else if (rq->role && !strcmp(rq->role, "sink"))
		role = JROLE_SINK;
	else
		return FAIL(-EINVAL, "job %s: role must be source or sink", j->name);
	if (!rq->layout || !*rq->layout || strlen(rq->layout) >= JOB_DESC_MAX)
		return FAIL(-EINVAL, "job %s: layout description missing or too long",
			    j->name);
	if ((lrc = jstore_attach_check(j, role, lerr, sizeof(lerr))) < 0)
		return FAIL(lrc, "%s", lerr);
	if (!strcmp(rq->layout, JSTORE_CANON_LAYOUT))
		return FAIL(-EINVAL, "job %s: layout %s is the daemon's own (storage writer's sink, "
			    "relay reader's source), not a client's", j->name, JSTORE_CANON_LAYOUT);
	if (role == JROLE_SINK && (lrc = sink_syncable(j, rq, err, errlen)) < 0)
		return lrc;
	if (rq->shards && *rq->shards && (role != JROLE_SOURCE || !dte_layout_desc_sharded(rq->layout)))
		return FAIL(-EINVAL, "job %s: shards go with a source of an "
			    "mcore: or fsdp2: layout, not %s %s", j->name,
			    role == JROLE_SOURCE ? "source" : "sink", rq->layout);
	if ((lrc = jlayout_build(j, role, rq->layout, rq->rank, rq->shards, &lay, lerr,
				 sizeof(lerr))) < 0)
		return FAIL(lrc, "job %s: %s", j->name, lerr);
	if (role == JROLE_SINK && lay.nfp8 && (lrc = jstore_fp8_check(j, err, errlen)) < 0) {
		dte_layout_fini(&lay);
		return lrc;
	}
	/* A shard table names its own rank on every line: it must be this one. */
	for (i = 0; dte_layout_desc_sharded(rq->layout) && i < lay.nbufs; i++)
		if (lay.bufs[i].rank != rq->rank) {
			uint32_t other = lay.bufs[i].rank;

			dte_layout_fini(&lay);
			return FAIL(-EINVAL, "job %s: the shards of rank %u name "
				    "rank %u", j->name, rq->rank, other);
		}
	for (i = 0; i < lay.nbufs; i++)
		n += lay.bufs[i].rank == rq->rank;
	st = -EINVAL;
	if (rq->n_buffers != n) {
		FAIL(st, "job %s: %s rank %u has %zu buffers; %zu named", j->name, rq->layout, rq->rank,
		     n, rq->n_buffers);
		goto fail;
	}
	l = jlocal_new(role, n);
	if (!l) {
		st = FAIL(-ENOMEM, "out of memory");
		goto fail;
	}
	/* lay.bufs is sorted by (rank, id): the rank's buffers in id order. */
	for (i = 0, k = 0; i < lay.nbufs; i++) {
		const struct dte_layout_buffer *lb = &lay.bufs[i];
		struct dbuf *b;
		int want = role == JROLE_SOURCE ? DBUF_FP32 : DBUF_BF16;

		if (lb->rank != rq->rank)
			continue;
		b = dbuf_get(conn, rq->buffers[k]);
		if (!b) {
			st = FAIL(-ENOENT, "job %s: buffer %llu is not registered on this connection",
				  j->name, (unsigned long long)rq->buffers[k]);
			goto fail;
		}
		if (b->dtype != want) {
			FAIL(st, "job %s: buffer %llu (%s) is %s; a %s needs %s", j->name,
			     (unsigned long long)b->id, lb->name, dbuf_dtype_name(b->dtype),
			     role == JROLE_SOURCE ? "source" : "sink", dbuf_dtype_name(want));
			goto fail;
		}
		/* A sink's FP8 codes and scales are registered as 16-bit units. */
		need = role == JROLE_SINK ? dte_layout_units(&lay, lb->rank, lb->id, lb->length) :
					    lb->length;
		if (need < 0 || b->length < (uint64_t)need) {
			FAIL(st, "job %s: buffer %llu (%s) holds %llu elements; the layout needs %lld%s",
			     j->name, (unsigned long long)b->id, lb->name,
			     (unsigned long long)b->length, (long long)need,
			     need != lb->length ? " 16-bit units (FP8 codes two to a unit, scales "
			     "two a scale)" : "");
			goto fail;
		}
		for (size_t q = 0; q < k; q++)
			if (l->bufs[q] == b && role == JROLE_SINK) {
				st = FAIL(-EEXIST, "job %s: buffer %llu named twice", j->name,
					  (unsigned long long)b->id);
				goto fail;
			}
		l->bufs[k] = b;
		l->buf_ids[k] = lb->id;
		k++;
	}
	for (struct jlocal *o = j->locals; o; o = o->next) {
		if (o->info.role == role && o->info.rank == rq->rank && o->info.replica == rq->replica &&
		    !strcmp(o->info.layout, rq->layout)) {
			st = FAIL(-EEXIST,
				  "job %s: %s rank %u replica %u is already attached on this daemon",
				  j->name, rq->layout, rq->rank, rq->replica);
			goto fail;
		}
	}
	for (i = 0; i < n; i++)
		dbuf_ref(l->bufs[i]);
	l->info.id = job_participant_id_new(e);
	snprintf(l->info.layout, sizeof(l->info.layout), "%s", rq->layout);
	l->info.rank = rq->rank;
	l->info.replica = rq->replica;
	if (rq->shards && *rq->shards && !(jsource_of(l)->shards = strdup(rq->shards))) {
		for (i = 0; i < n; i++)
			dbuf_unref(l->bufs[i]);
		st = FAIL(-ENOMEM, "out of memory");
		goto fail;
	}
	snprintf(l->info.node, sizeof(l->info.node), "%s", jio_self(e));
	l->owner = conn;
	l->next = j->locals;
	j->locals = l;
	dte_layout_fini(&lay);
	DLOG_N("job %s: %s %s rank %u replica %u attached as %llx", j->name,
	       role == JROLE_SOURCE ? "source" : "sink", l->info.layout, l->info.rank,
	       l->info.replica, (unsigned long long)l->info.id);
	if (role == JROLE_SOURCE)
		prefault_start(e, l);
	else
		jsink_of(l)->rpool = jsink_arena(l);	/* its first version is dense */
	job_send_join(j);
	if (waiter_add(e, JW_ATTACH, req, j->name, l->info.id, 0, ATTACH_TIMEOUT_MS) < 0) {
		jlocal_remove(j, l);
		job_send_join(j);
		return FAIL(-ENOMEM, "out of memory");
	}
	*deferred = 1;
	return 0;
fail:
	if (l) {
		/* No buffer references taken yet: free the slots only. */
		memset(l->bufs, 0, l->nbufs * sizeof(*l->bufs));
		jlocal_free(e, l);
	}
	dte_layout_fini(&lay);
	return st;
}

/* A source's host buffers mapped in full once it attaches, on a worker:
 * the daemon's first read of each page of a client's memfd is a
 * page-table fault, which otherwise lands on the first versions that read
 * θ (the dense one) and m, v (the first sparse one): measured on the
 * 2^28-element bench model at 10 Gbit/s, the dense capture 0.78 -> 0.36 s
 * and the first sparse version 0.33 -> 0.17 s.  (With 1 MiB parts the
 * faster dense capture made the sink's receive stall, 0.9 -> 2 s; with
 * 256 KiB parts it did not: 0.63-0.72 s.)  A sink's pages fault in as its
 * first version writes them.
 *
 * By reading one byte per page, not MADV_POPULATE_READ: the madvise holds
 * mmap_lock across its chunk and yields the CPU inside it
 * (__get_user_pages' cond_resched), so on a busy machine the lock stayed
 * held while the worker waited for a core, every mmap of the process
 * (malloc's, under its arena lock) waited behind it, and the loop behind
 * that arena lock: loop_latency.py saw status polls answered in 15-57 ms.
 * A fault holds the lock (per VMA on Linux 6.4+) for one fault and never
 * sleeps in it for a slice; on a memfd it maps the pages around it too
 * (fault-around), as fast as the madvise (0.16 against 0.15-0.21 s per
 * GiB here).  The buffers are memfds sealed against shrinking (buf.c), so
 * no read inside the mapping can fault past the file's end. */
struct jprefault {
	struct jtask t;
	struct dbuf **bufs;
	size_t n;
};

static void prefault_run(struct jtask *t)
{
	struct jprefault *p = (struct jprefault *)t;
	const size_t chunk = (size_t)2 << 20;
	const long pg = sysconf(_SC_PAGESIZE);
	const size_t page = pg > 0 ? (size_t)pg : 4096;

	for (size_t i = 0; i < p->n && !t->eng->stopping; i++) {
		const struct dbuf *b = p->bufs[i];
		const volatile uint8_t *m = b->map;

		/* shutdown looks in every 2 MiB and does not wait for a model */
		for (size_t off = 0; off < b->map_len && !t->eng->stopping; off += chunk) {
			size_t end = b->map_len - off < chunk ? b->map_len : off + chunk;

			for (size_t o = off; o < end; o += page)
				(void)m[o];
		}
	}
}

static void prefault_done(struct jtask *t, int cancelled)
{
	struct jprefault *p = (struct jprefault *)t;

	(void)cancelled;
	for (size_t i = 0; i < p->n; i++)
		dbuf_unref(p->bufs[i]);
	free(p->bufs);
	free(p);
}

static void prefault_start(struct dte_engine *e, const struct jlocal *l)
{
	struct jprefault *p = calloc(1, sizeof(*p));

	if (!p || !(p->bufs = calloc(l->nbufs ? l->nbufs : 1, sizeof(*p->bufs)))) {
		free(p);
		return;	/* an optimisation only */
	}
	for (size_t i = 0; i < l->nbufs; i++) {
		struct dbuf *b = l->bufs[i];

		if (b && !b->cuda && b->map && b->map_len) {
			dbuf_ref(b);
			p->bufs[p->n++] = b;
		}
	}
	if (!p->n) {
		free(p->bufs);
		free(p);
		return;
	}
	p->t.run = prefault_run;
	p->t.done = prefault_done;
	jtask_start(e, &p->t);
}

int job_detach(struct dte_engine *e, uint64_t conn, const char *job, uint64_t participant,
	       char *err, size_t errlen)
{
	struct job *j = job_find(e, job);
	struct jlocal *l;

	if (!j)
		return FAIL(-ENOENT, "unknown job \"%s\"", job ? job : "");
	l = job_local_owned(j, participant, conn);
	if (!l)
		return FAIL(-ENOENT,
			    "job %s: participant %llx is not attached by this connection", j->name,
			    (unsigned long long)participant);
	jlocal_remove(j, l);
	job_send_join(j);
	jwait_check(e);
	return 0;
}

int job_wait(struct dte_engine *e, const struct jreq *req, const struct jwait_args *rq,
	     struct jwait_res *rep, int *deferred, char *err, size_t errlen)
{
	struct job *j = job_find(e, rq->job);
	uint32_t sinks = 0;
	int st;

	*deferred = 0;
	if (!j)
		return FAIL(-ENOENT, "unknown job \"%s\"", rq->job ? rq->job : "");
	st = jsrc_wait_done(j, rq->version, &sinks, err, errlen);
	if (st < 0)
		return st;
	if (st > 0) {
		rep->version = rq->version;
		rep->sinks = sinks;
		return 0;
	}
	if (rq->timeout_ms == 0 && err[0])      /* a sink failed it: the poll's deadline is now */
		return -EIO;
	if (rq->timeout_ms == 0)
		return FAIL(-ETIMEDOUT, "job %s: version %llu not applied everywhere yet",
			    j->name, (unsigned long long)rq->version);
	if (waiter_add(e, JW_WAIT, req, j->name, rq->version, 0, rq->timeout_ms) < 0)
		return FAIL(-ENOMEM, "out of memory");
	*deferred = 1;
	return 0;
}

int job_wait_captured(struct dte_engine *e, const struct jreq *req, const struct jwait_args *rq,
		      struct jpublish_res *rep, int *deferred, char *err, size_t errlen)
{
	struct job *j;
	struct jlocal *l;
	int st;

	*deferred = 0;
	if ((st = job_source_owned(e, rq->job, rq->participant, req->conn, &j, &l, err,
				   errlen)) < 0)
		return st;
	st = jsrc_captured(j, l, rq->version, rep, err, errlen);
	if (st < 0)
		return st;
	if (st > 0)
		return 0;
	if (rq->timeout_ms == 0)
		return FAIL(-ETIMEDOUT, "job %s: the capture of version %llu still reads the "
			    "source's buffers", j->name, (unsigned long long)
			    (rq->version ? rq->version : jsource_of(l)->accepted));
	if (waiter_add(e, JW_CAPTURED, req, j->name, l->info.id,
		       rq->version ? rq->version : jsource_of(l)->accepted, rq->timeout_ms) < 0)
		return FAIL(-ENOMEM, "out of memory");
	*deferred = 1;
	return 0;
}

int job_wait_staged(struct dte_engine *e, const struct jreq *req, const struct jwait_args *rq,
		    struct jstaged_res *rep, int *deferred, char *err, size_t errlen)
{
	struct job *j = job_find(e, rq->job);
	struct jlocal *l;

	*deferred = 0;
	if (!j)
		return FAIL(-ENOENT, "unknown job \"%s\"", rq->job ? rq->job : "");
	l = job_local_owned(j, rq->participant, req->conn);
	if (!l || l->info.role != JROLE_SINK)
		return FAIL(-ENOENT,
			    "job %s: no sink participant %llx on this connection", j->name,
			    (unsigned long long)rq->participant);
	if (jsink_newest_staged(l) > jsink_of(l)->applied) {
		rep->version = jsink_newest_staged(l);
		rep->applied = jsink_of(l)->applied;
		return 0;
	}
	if (rq->timeout_ms == 0)
		return FAIL(-ETIMEDOUT, "job %s: nothing staged", j->name);
	if (waiter_add(e, JW_STAGED, req, j->name, l->info.id, 0, rq->timeout_ms) < 0)
		return FAIL(-ENOMEM, "out of memory");
	jsink_parked(e, l);	/* its client waits at its safe point (apply on arrival) */
	*deferred = 1;
	return 0;
}

int job_query_version(struct dte_engine *e, uint64_t conn, const char *job,
		      uint64_t participant, struct jquery_res *rep, char *err, size_t errlen)
{
	struct job *j = job_find(e, job);
	struct jlocal *l;

	if (!j)
		return FAIL(-ENOENT, "unknown job \"%s\"", job ? job : "");
	l = job_local_owned(j, participant, conn);
	if (!l)
		return FAIL(-ENOENT,
			    "job %s: participant %llx is not attached by this connection", j->name,
			    (unsigned long long)participant);
	rep->applied = l->info.role == JROLE_SINK ? jsink_of(l)->applied :
		       jsource_of(l)->last_version;
	rep->staged = l->info.role == JROLE_SINK ? jsink_newest_staged(l) :
		      jsource_of(l)->last_version;
	rep->checksum_failures = l->info.role == JROLE_SINK ? jsink_of(l)->checksum_failures : 0;
	return 0;
}

/* -------------------------------------------------------------- records in */

static void refuse(struct dte_engine *e, const char *from, const char *job,
		   Dtep__PeerMsgType type, const char *reason)
{
	Dtep__Refused m = DTEP__REFUSED__INIT;

	e->refused++;
	DLOG_W("peer %s: refused %s record for job %s: %s", from, dtep__peer_msg_type__descriptor.values[
	       type < dtep__peer_msg_type__descriptor.n_values ? type : 0].name, job ? job : "?", reason);
	if (type == DTEP__PEER_MSG_TYPE__PEER_MSG_REFUSED)
		return;
	m.job = (char *)(job ? job : "");
	m.type = type;
	m.reason = (char *)reason;
	jio_send(e, from, NULL, DTEP__PEER_MSG_TYPE__PEER_MSG_REFUSED, &m.base, NULL, 0);
}

/* A membership record speaks for the node it came from, never another:
 * a JOIN or LEAVE naming some other node would replace or drop that
 * node's participants.  (The transport knows the sender by the name it
 * greeted with, and no peer may greet as this daemon.)  An empty node
 * field means the sender. */
static int speaks_for(struct job *j, const char *from, Dtep__PeerMsgType type, const char *node)
{
	char why[192];

	if (!node || !*node || !strcmp(node, from))
		return 1;
	j->refused++;
	snprintf(why, sizeof(why), "record speaks for node \"%.64s\" but came from \"%.64s\"", node,
		 from);
	refuse(j->eng, from, j->name, type, why);
	return 0;
}

/* The job a record names, if the record proves its key (job_auth.h: its
 * MAC, or with auth off its token).  Records from this daemon itself
 * never left the process: they carry no MAC. */
static struct job *check_ref(struct dte_engine *e, const char *from, Dtep__PeerMsgType type,
			     const Dtep__JobRef *ref,
			     const ProtobufCMessage *msg, const void *data, size_t len)
{
	struct job *j;
	char why[160];

	if (!ref || !ref->job) {
		refuse(e, from, NULL, type, "record names no job");
		return NULL;
	}
	j = job_find(e, ref->job);
	if (!j) {
		snprintf(why, sizeof(why), "unknown job \"%.64s\"", ref->job);
		refuse(e, from, ref->job, type, why);
		return NULL;
	}
	if (strcmp(from, jio_self(e)) &&
	    job_auth_check(j, from, type, msg, data, len, why, sizeof(why)) < 0) {
		j->refused++;
		refuse(e, from, ref->job, type, why);
		return NULL;
	}
	return j;
}

static void on_refused(struct dte_engine *e, const char *from, const Dtep__Refused *m)
{
	struct job *j = job_find(e, m->job);
	char why[160];

	if (j && strcmp(from, jio_self(e)) &&
	    job_auth_check_refused(j, from, m, why, sizeof(why)) < 0) {
		/* Not from a holder of the key: nothing changes.  Kept as a
		 * hint for an attach that times out (a peer with another
		 * token answers so). */
		j->refused++;
		snprintf(j->refusal_hint, sizeof(j->refusal_hint),
			 "%s answered with a REFUSED that does not verify under this job's key "
			 "(does it hold the same token?): %.160s", from, m->reason);
		DLOG_N("job %s: REFUSED of our record %d from %s not acted on (%s); it said: %s",
		       j->name, (int)m->type, from, why, m->reason);
		return;
	}
	DLOG_W("peer %s refused our record %d for job %s: %s", from, (int)m->type, m->job, m->reason);
	if (!j)
		return;
	j->refused++;
	if (m->type == DTEP__PEER_MSG_TYPE__PEER_MSG_JOIN) {
		int fresh = 0;

		for (struct jlocal *l = j->locals; l; l = l->next)
			if (!l->announced) {
				snprintf(l->refused, sizeof(l->refused), "coordinator: %s", m->reason);
				fresh = 1;
			}
		/* A refusal answers the JOIN of a new participant (its attach
		 * fails with the reason and a new JOIN goes without it), and
		 * a leave (no participant stays: nothing to retry for).  A
		 * rejoin of planned participants keeps being retried: a
		 * restarted coordinator may not know the job yet. */
		if (fresh || !j->locals)
			j->join_acked = j->join_seq;
	}
}

/* A RELAYED (docs/SYNC.md, "Relay between sink daemons"): the record a
 * relay forwards to sink m->to, as its source sealed it, after its data.
 * Checked as that record would be had it come from its source (the job,
 * its MAC over it and its data), then taken by the sink it is for. */
static void relayed_in(struct dte_engine *e, struct job *j, const char *from,
		       const Dtep__Relayed *m, const void *data, size_t len)
{
	const uint8_t *rec = NULL;
	size_t dlen = 0;
	ProtobufCMessage *in = NULL;
	const Dtep__JobRef *ref = NULL;
	const char *why = NULL;

	if (m->record_len && m->record_len <= len) {
		dlen = len - m->record_len;
		rec = (const uint8_t *)data + dlen;
	}
	if (!rec)
		why = "its record length is past its data";
	else if (m->type == DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS && dlen)
		why = "a COUNTS carries no data";
	else if (m->type != DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS &&
		 m->type != DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD)
		why = "it relays neither a COUNTS nor a PAYLOAD";
	else if (!(in = protobuf_c_message_unpack(m->type == DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS ?
						  &dtep__counts__descriptor :
						  &dtep__payload__descriptor,
						  NULL, m->record_len, rec)))
		why = "its record does not decode";
	else if (!(ref = peer_auth_ref(in)) || !ref->job || strcmp(ref->job, j->name))
		why = "its record names another job";
	if (why) {
		j->refused++;
		refuse(e, from, j->name, DTEP__PEER_MSG_TYPE__PEER_MSG_RELAYED, why);
		goto out;
	}
	/* The record's own MAC, over it and its data, as its source sealed
	 * it (or the relay, for a source on its node). */
	if (!check_ref(e, from, m->type, ref, in, dlen ? data : NULL, dlen))
		goto out;
	if (m->type == DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS)
		jsink_counts(j, from, (const Dtep__Counts *)in, rec, m->record_len, m->to);
	else
		jsink_payload(j, from, (const Dtep__Payload *)in, data, dlen, m->to);
out:
	if (in)
		protobuf_c_message_free_unpacked(in, NULL);
}

void job_peer_recv(struct dte_engine *e, const char *from, Dtep__PeerMsgType type,
		   const uint8_t *hdr, size_t hdrlen,
		   const void *data, size_t len)
{
	ProtobufCMessage *msg = NULL;
	const ProtobufCMessageDescriptor *d;
	struct job *j = NULL;

	switch (type) {
	case DTEP__PEER_MSG_TYPE__PEER_MSG_JOIN: d = &dtep__join__descriptor; break;
	case DTEP__PEER_MSG_TYPE__PEER_MSG_LEAVE: d = &dtep__leave__descriptor; break;
	case DTEP__PEER_MSG_TYPE__PEER_MSG_PLAN: d = &dtep__plan__descriptor; break;
	case DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS: d = &dtep__counts__descriptor; break;
	case DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD: d = &dtep__payload__descriptor; break;
	case DTEP__PEER_MSG_TYPE__PEER_MSG_STAGED: d = &dtep__staged__descriptor; break;
	case DTEP__PEER_MSG_TYPE__PEER_MSG_APPLIED: d = &dtep__applied__descriptor; break;
	case DTEP__PEER_MSG_TYPE__PEER_MSG_REFUSED: d = &dtep__refused__descriptor; break;
	case DTEP__PEER_MSG_TYPE__PEER_MSG_PLAN_ACK: d = &dtep__plan_ack__descriptor; break;
	case DTEP__PEER_MSG_TYPE__PEER_MSG_RELAYED: d = &dtep__relayed__descriptor; break;
	case DTEP__PEER_MSG_TYPE__PEER_MSG_RATES: d = &dtep__rates__descriptor; break;
	default:
		e->refused++;
		DLOG_W("peer %s: unknown record type %d dropped", from, (int)type);
		return;
	}
	msg = protobuf_c_message_unpack(d, NULL, hdrlen, hdr);
	if (!msg) {
		e->refused++;
		DLOG_W("peer %s: undecodable record of type %d (%zu bytes) dropped", from, (int)type, hdrlen);
		return;
	}
	if (dlog_get_level() >= DLOG_DEBUG) {
		uint64_t v = 0;

		switch (type) {
		case DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS:
			v = ((const Dtep__Counts *)msg)->version;
			break;
		case DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD:
			v = ((const Dtep__Payload *)msg)->version;
			break;
		case DTEP__PEER_MSG_TYPE__PEER_MSG_STAGED:
			v = ((const Dtep__Staged *)msg)->version;
			break;
		case DTEP__PEER_MSG_TYPE__PEER_MSG_APPLIED:
			v = ((const Dtep__Applied *)msg)->version;
			break;
		default:
			break;
		}
		/* The key the transport logged it under (route.h's route_deliver). */
		DLOG_D("job layer took: record type %d from %s version %llu key %016llx", (int)type,
		       from, (unsigned long long)v, e->io.record_key(e->io.ctx, hdr, hdrlen));
	}
	if (len && type != DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD &&
	    type != DTEP__PEER_MSG_TYPE__PEER_MSG_RELAYED) {
		refuse(e, from, NULL, type, "unexpected data after a record that carries none");
		goto out;
	}
	switch (type) {
	case DTEP__PEER_MSG_TYPE__PEER_MSG_JOIN: {
		const Dtep__Join *m = (const Dtep__Join *)msg;

		if ((j = check_ref(e, from, type, m->job, msg, data, len))) {
			if (!j->is_coord)
				refuse(e, from, j->name, type, "this daemon is not the job's coordinator");
			else if (speaks_for(j, from, type, m->node))
				jcoord_join(j, from, m);
		}
		break;
	}
	case DTEP__PEER_MSG_TYPE__PEER_MSG_LEAVE: {
		const Dtep__Leave *m = (const Dtep__Leave *)msg;

		if ((j = check_ref(e, from, type, m->job, msg, data, len)) && j->is_coord &&
		    speaks_for(j, from, type, m->node))
			jcoord_leave(j, from, m);
		break;
	}
	case DTEP__PEER_MSG_TYPE__PEER_MSG_PLAN: {
		const Dtep__Plan *m = (const Dtep__Plan *)msg;

		/* The coordinator takes plans from itself alone; another
		 * node's would replace the one it made for everyone. */
		if ((j = check_ref(e, from, type, m->job, msg, data, len))) {
			char why[256];

			if (j->is_coord && strcmp(from, jio_self(e))) {
				j->refused++;
				refuse(e, from, j->name, type, "this daemon is the job's coordinator: "
				       "plans come from it alone");
			} else if (jplan_recv(j, from, m, why, sizeof(why)) < 0) {
				j->refused++;
				refuse(e, from, j->name, type, why);
			}
		}
		break;
	}
	case DTEP__PEER_MSG_TYPE__PEER_MSG_RATES: {
		const Dtep__Rates *m = (const Dtep__Rates *)msg;

		if ((j = check_ref(e, from, type, m->job, msg, data, len)) && j->is_coord &&
		    speaks_for(j, from, type, m->node))
			jcoord_rates(j, from, m);
		break;
	}
	case DTEP__PEER_MSG_TYPE__PEER_MSG_PLAN_ACK: {
		const Dtep__PlanAck *m = (const Dtep__PlanAck *)msg;

		if ((j = check_ref(e, from, type, m->job, msg, data, len)) && j->is_coord &&
		    speaks_for(j, from, type, m->node))
			jcoord_plan_ack(j, from, m);
		break;
	}
	case DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS: {
		const Dtep__Counts *m = (const Dtep__Counts *)msg;

		if ((j = check_ref(e, from, type, m->job, msg, data, len)))
			jsink_counts(j, from, m, hdr, hdrlen, 0);
		if (j && jsink_ahead_oldest(j))
			jctl_update(e);	/* its wait for the plan is timed (jctl_retry) */
		break;
	}
	case DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD: {
		const Dtep__Payload *m = (const Dtep__Payload *)msg;

		if ((j = check_ref(e, from, type, m->job, msg, data, len)))
			jsink_payload(j, from, m, data, len, 0);
		if (j && jsink_ahead_oldest(j))
			jctl_update(e);	/* its wait for the plan is timed (jctl_retry) */
		break;
	}
	case DTEP__PEER_MSG_TYPE__PEER_MSG_RELAYED:
		if ((j = check_ref(e, from, type, ((const Dtep__Relayed *)msg)->job, msg, data, len)))
			relayed_in(e, j, from, (const Dtep__Relayed *)msg, data, len);
		break;
	case DTEP__PEER_MSG_TYPE__PEER_MSG_STAGED: {
		const Dtep__Staged *m = (const Dtep__Staged *)msg;

		if ((j = check_ref(e, from, type, m->job, msg, data, len))) {
			jsrc_staged(j, m);
			/* a member reports what its sources saw (RATES.seen) */
			if (!j->is_coord && jcoord_rates_wanted(j))
				j->rates_gen++;
		}
		break;
	}
	case DTEP__PEER_MSG_TYPE__PEER_MSG_APPLIED: {
		const Dtep__Applied *m = (const Dtep__Applied *)msg;

		if ((j = check_ref(e, from, type, m->job, msg, data, len)))
			jsrc_applied(j, m);
		break;
	}
	case DTEP__PEER_MSG_TYPE__PEER_MSG_REFUSED:
		on_refused(e, from, (const Dtep__Refused *)msg);
		break;
	default:
		break;
	}
	/* Sends timed for the send rates (a relay's forwards, a source's
	 * parts): the control timer reports them (job_coord.c, RATES). */
	if (j && !e->ctl_timer_on && (jlinks_busy(j) || j->rates_gen != j->rates_sent_gen) &&
	    jcoord_rates_wanted(j))
		jctl_update(e);
out:
	protobuf_c_message_free_unpacked(msg, NULL);
	jwait_check(e);
}

void job_peer_down(struct dte_engine *e, const char *node)
{
	for (struct job *j = e->jobs; j; j = j->next)
		if (j->is_coord)
			jcoord_node_down(j, node);
		else
			jmember_coord_down(j, node);
	jwait_check(e);
}

/* ----------------------------------------------------------- introspection */

static const char *role_name(int role)
{
	return role == JROLE_SOURCE ? "source" : "sink";
}

/* The participants `jobs` and `job` show: those in the job now, as this
 * daemon knows them.  The coordinator's own view is its members' (the
 * newest plan, also on a coordinator without participants of its own); a
 * member shows the plan the coordinator last sent it while it has local
 * participants.  Once its last one left, the coordinator drops it and
 * sends it no more plans, so the one it holds goes stale: nothing is
 * shown (a participant that left is never listed).  Local participants
 * not planned yet are added.  Returns a malloc()ed array (NULL when
 * empty or out of memory: *n 0, -ENOMEM for the latter) of *n entries;
 * *complete is 1 when every source rank is attached. */
static int view_parts(const struct job *j, const struct jpinfo ***outp, size_t *np,
		      int *complete)
{
	const struct jpinfo **out;
	size_t n = 0, max = 0, planned;

	*outp = NULL;
	*np = 0;
	*complete = 0;
	if (j->is_coord)
		for (const struct jmember *m = j->members; m; m = m->next)
			max += m->n;
	else if (j->locals)
		max = j->nparts;
	for (const struct jlocal *l = j->locals; l; l = l->next)
		max++;
	if (!max)
		return 0;
	out = calloc(max, sizeof(*out));
	if (!out)
		return -ENOMEM;
	if (j->is_coord) {
		for (const struct jmember *m = j->members; m; m = m->next)
			for (size_t i = 0; i < m->n; i++)
				out[n++] = &m->p[i];
		*complete = j->coord_complete && n > 0;
	} else if (j->locals) {
		for (size_t i = 0; i < j->nparts; i++)
			out[n++] = &j->parts[i];
		*complete = j->complete;
	}
	planned = n;
	for (const struct jlocal *l = j->locals; l; l = l->next) {
		size_t i;

		for (i = 0; i < planned && out[i]->id != l->info.id; i++)
			;
		if (i == planned)
			out[n++] = &l->info;
	}
	*outp = out;
	*np = n;
	return 0;
}

/* The term of the plan view_parts() shows. */
static uint64_t view_epoch(const struct job *j)
{
	if (j->is_coord && j->coord_epoch)
		return j->coord_epoch;
	return j->epoch;
}

int job_list(struct dte_engine *e, struct jjob_summary **jobs, size_t *np_out, struct dreply *r)
{
	struct jjob_summary *out;
	size_t n = 0, i = 0;

	for (struct job *j = e->jobs; j; j = j->next)
		n++;
	*jobs = NULL;
	*np_out = 0;
	out = n ? dreply_alloc(r, n * sizeof(*out)) : NULL;
	if (n && !out)
		return -ENOMEM;
	for (struct job *j = e->jobs; j; j = j->next, i++) {
		struct jjob_summary *s = &out[i];
		const struct jpinfo **parts;
		uint64_t v = 0;
		size_t np;
		int complete;

		if (view_parts(j, &parts, &np, &complete) < 0)
			return -ENOMEM;
		memset(s, 0, sizeof(*s));
		s->name = j->name;
		s->coordinator = j->is_coord;
		free(parts);
		s->epoch = view_epoch(j);
		s->complete = complete;
		s->participants = (uint32_t)np;
		for (struct jlocal *l = j->locals; l; l = l->next) {
			s->local_participants++;
			if (l->info.role == JROLE_SOURCE && jsource_of(l)->last_version > v)
				v = jsource_of(l)->last_version;
			if (l->info.role == JROLE_SINK && jsink_of(l)->applied > v)
				v = jsink_of(l)->applied;
		}
		s->version = v;
	}
	*jobs = out;
	*np_out = n;
	return 0;
}

int job_info(struct dte_engine *e, const char *name, struct jjob_info *rep, struct dreply *r,
	     char *err, size_t errlen)
{
	struct job *j = job_find(e, name);
	const struct jpinfo **parts = NULL;
	size_t n = 0, i;
	int complete, rc;

	if (!j)
		return FAIL(-ENOENT, "unknown job \"%s\"", name ? name : "");
	rep->name = j->name;
	rep->coordinator = j->coordinator;
	rep->is_coordinator = j->is_coord;
	rep->spec_hash = j->spec.hash;
	rep->publish_interval = j->interval;
	rep->epoch = view_epoch(j);
	rep->versions = j->published;
	rep->refused = j->refused;
	jstore_info(j, rep);
	/* The coordinator's reason it could not plan, else this member's
	 * reason it rejected the newest plan. */
	rep->plan_error = j->coord_plan_err[0] ? j->coord_plan_err :
			  j->plan_error[0] ? j->plan_error : NULL;
	for (i = 0; i < j->npairs; i++)
		rep->entries += j->pairs[i].n;
	/* Members: the coordinator's own list; a member's, the nodes of the
	 * plan it holds (none once it left: that plan is stale). */
	if (j->is_coord)
		for (struct jmember *m = j->members; m; m = m->next)
			n++;
	else if (j->locals)
		n = j->naddr;
	rep->members = n ? dreply_alloc(r, n * sizeof(char *)) : NULL;
	i = 0;
	if (j->is_coord)
		for (struct jmember *m = j->members; m && rep->members; m = m->next)
			rep->members[i++] = m->node;
	else
		for (; i < n && rep->members; i++)
			rep->members[i] = j->addr_node[i];
	rep->n_members = rep->members ? n : 0;
	if (view_parts(j, &parts, &n, &complete) < 0)
		return FAIL(-ENOMEM, "out of memory");
	rep->complete = complete;
	rep->participants = n ? dreply_alloc(r, n * sizeof(*rep->participants)) : NULL;
	rc = n && !rep->participants ? -ENOMEM : 0;
	rep->n_participants = rc ? 0 : n;
	for (i = 0; !rc && i < n; i++) {
		struct jpart_info *p = &rep->participants[i];
		const struct jpinfo *pi = parts[i];
		struct jlocal *l;

		memset(p, 0, sizeof(*p));
		l = job_local(j, pi->id);
		p->id = pi->id;
		p->role = role_name(pi->role);
		p->layout = pi->layout;
		p->rank = pi->rank;
		p->replica = pi->replica;
		p->node = pi->node;
		p->local = l != NULL;
		p->relay_parent = pi->relay_parent;
		if (l) {
			int sink = l->info.role == JROLE_SINK;

			p->version = sink ? jsink_of(l)->applied : jsource_of(l)->last_version;
			p->staged = sink ? jsink_newest_staged(l) : 0;
			p->checksum_failures = sink ? jsink_of(l)->checksum_failures : 0;
		} else if (pi->role == JROLE_SINK) {
			/* What the sources here heard from it. */
			for (size_t q = 0; q < j->npairs; q++) {
				if (j->pairs[q].dst != pi->id)
					continue;
				if (j->pairs[q].sm.applied > p->version)
					p->version = j->pairs[q].sm.applied;
				if (j->pairs[q].sm.staged > p->staged)
					p->staged = j->pairs[q].sm.staged;
			}
		}
	}
	free(parts);
	if (rc)
		return FAIL(rc, "out of memory");
	return 0;
}

int job_history(struct dte_engine *e, const char *name, uint32_t limit,
		struct jhist_entry **entries, size_t *np, struct dreply *r, char *err,
		size_t errlen)
{
	struct job *j = job_find(e, name);
	struct jhist_entry *out;
	size_t have, n, first;

	*entries = NULL;
	*np = 0;
	if (!j)
		return FAIL(-ENOENT, "unknown job \"%s\"", name ? name : "");
	have = j->nhist < JOB_HISTORY ? j->nhist : JOB_HISTORY;
	n = limit && limit < have ? limit : have;
	first = j->nhist - n;
	out = n ? dreply_alloc(r, n * sizeof(*out)) : NULL;
	if (n && !out)
		return FAIL(-ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		const struct jhist *h = &j->hist[(first + i) % JOB_HISTORY];
		struct jhist_entry *v = &out[i];

		memset(v, 0, sizeof(*v));
		v->version = h->version;
		v->step = h->step;
		v->mode = h->dense && h->sparse ? "mixed" : h->dense ? "dense" : "sparse";
		v->changed_pct = h->elements ? 100.0 * (double)h->changed / (double)h->elements : 0.0;
		v->bytes = h->bytes;
		v->capture_ms = h->capture_ms;
		v->transfer_ms = h->transfer_ms;
		v->apply_ms = h->apply_ms;
		v->checksum = h->failed ? "failed" : h->ok >= h->sinks && h->sinks ? "ok" :
			      h->sinks ? "pending" : "none";
		v->sinks = h->sinks;
		v->note = h->note;
		v->reason = h->reason;
	}
	*entries = out;
	*np = n;
	return 0;
}

/* daemon/cmd_job.c — control handlers of the sync engine: buffers, jobs,
 * the source and sink APIs, and what dtectl shows (jobs, job, history).
 * Arguments are checked in daemon/buf.c and daemon/job*.c, which say why
 * they refuse; these only move fields between the control protocol's
 * messages and the engine's plain requests and results (daemon/job_api.h),
 * and send the answers the engine defers (job_answer). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "daemon/buf.h"
#include "daemon/derr.h"
#include "daemon/dispatch.h"
#include "daemon/job.h"
#include "daemon/log.h"
#include "daemon/wire_job.h"


/* rc: 0 or a negative errno from the engine (daemon/derr.h). */
static Dte__Status done(struct dreply *r, int rc, const char *err)
{
	if (rc < 0)
		dreply_msg(r, "%s", err);
	return derr_status(rc);
}

Dte__Status dcmd_register_buffer(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
				 Dte__Response *resp, struct dreply *r)
{
	const Dte__RegisterBufferRequest *q = req->register_buffer;
	Dte__RegisterBufferReply *rep;
	int dtype = dbuf_dtype_parse(q->dtype);
	char err[256];
	uint64_t id;
	int rc;

	if (q->cuda) {
		rc = dbuf_register_cuda(s->conn_id, srv->backend, q->cuda_ipc_handle.data,
					q->cuda_ipc_handle.len, q->cuda_ipc_event.data,
					q->cuda_ipc_event.len, q->offset, q->length, dtype,
					q->cuda_device, q->name, &id, err, sizeof(err));
	} else {
		int fd = dsess_take_fd(s);

		if (dtype < 0) {
			if (fd >= 0)
				close(fd);
			dreply_msg(r, "register_buffer: dtype \"%s\" unknown (fp32, bf16)",
				   q->dtype ? q->dtype : "");
			return DTE__STATUS__STATUS_ERR_INVALID;
		}
		rc = dbuf_register_fd(s->conn_id, fd, q->offset, q->length, dtype, q->name, &id, err,
				      sizeof(err));
	}
	if (rc < 0) {
		dreply_msg(r, "register_buffer: %s", err);
		return derr_status(rc);
	}
	rep = dreply_alloc(r, sizeof(*rep));
	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__register_buffer_reply__init(rep);
	rep->buffer = id;
	resp->body_case = DTE__RESPONSE__BODY_REGISTER_BUFFER;
	resp->register_buffer = rep;
	return DTE__STATUS__STATUS_OK;
}

Dte__Status dcmd_unregister_buffer(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
				   Dte__Response *resp, struct dreply *r)
{
	Dte__UnregisterBufferReply *rep = dreply_alloc(r, sizeof(*rep));
	char err[256];
	int rc;

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	rc = dbuf_unregister(s->conn_id, req->unregister_buffer->buffer, err, sizeof(err));
	if (rc < 0) {
		dreply_msg(r, "unregister_buffer: %s", err);
		return derr_status(rc);
	}
	dte__unregister_buffer_reply__init(rep);
	resp->body_case = DTE__RESPONSE__BODY_UNREGISTER_BUFFER;
	resp->unregister_buffer = rep;
	return DTE__STATUS__STATUS_OK;
}

/* The wire's strings are never NULL (proto3: "" is unset). */
static char *str(const char *s)
{
	return (char *)(s ? s : "");
}

static void attach_out(Dte__AttachReply *o, const struct jattach_res *r)
{
	o->participant = r->participant;
	o->epoch = r->epoch;
	o->complete = r->complete;
}

static void wait_out(Dte__WaitReply *o, const struct jwait_res *r)
{
	o->version = r->version;
	o->sinks = r->sinks;
}

static void staged_out(Dte__WaitStagedReply *o, const struct jstaged_res *r)
{
	o->version = r->version;
	o->applied = r->applied;
}

static void publish_out(Dte__PublishReply *o, const struct jpublish_res *r)
{
	o->version = r->version;
	o->sinks = r->sinks;
	o->dense = r->dense;
	o->changed = r->changed;
	o->elements = r->elements;
	o->bytes = r->bytes;
	o->capture_ms = r->capture_ms;
	o->captured = r->captured;
	if (r->cuda_event) {
		o->cuda_capture_event.data = (uint8_t *)r->cuda_event;
		o->cuda_capture_event.len = r->cuda_event_len;
	}
}

static void mark_out(Dte__MarkReply *o, const struct jmark_res *r)
{
	o->dirty = r->dirty;
	o->gap = r->gap;
}

static void apply_out(Dte__ApplyReply *o, const struct japply_res *r)
{
	o->version = r->version;
	o->applied = r->applied;
	o->checksum_ok = r->checksum_ok;
	o->checksum_failures = r->checksum_failures;
	o->apply_ms = r->apply_ms;
}

/* sv, svp: room for r->n_results each (the caller's). */
void dcmd_verify_out(Dte__VerifyReply *o, const struct jverify_res *r, Dte__SinkVerify *sv,
		     Dte__SinkVerify **svp)
{
	o->job = str(r->job);
	o->sinks = r->sinks;
	o->ok = r->ok;
	o->mismatch = r->mismatch;
	for (size_t i = 0; i < r->n_results; i++) {
		const struct jverify_sink *k = &r->results[i];
		Dte__SinkVerify *v = &sv[i];

		dte__sink_verify__init(v);
		v->participant = k->participant;
		v->rank = k->rank;
		v->replica = k->replica;
		v->version = k->version;
		v->result = str(k->result);
		v->buffers = k->buffers;
		v->mismatched = k->mismatched;
		v->detail = str(k->detail);
		svp[i] = v;
	}
	o->results = r->n_results ? svp : NULL;
	o->n_results = r->n_results;
}

/* The engine's deferred answers (struct jreq's done): packed as the
 * control protocol's Response and sent on the connection that asked,
 * through the server's answer (rq->arg is the struct dsrv). */
static void job_answer(const struct jreq *rq, int rc, const char *err, const struct jres *res)
{
	Dte__Response resp = DTE__RESPONSE__INIT;
	Dte__AttachReply attach = DTE__ATTACH_REPLY__INIT;
	Dte__WaitReply wait = DTE__WAIT_REPLY__INIT;
	Dte__WaitStagedReply staged = DTE__WAIT_STAGED_REPLY__INIT;
	Dte__WaitCapturedReply captured = DTE__WAIT_CAPTURED_REPLY__INIT;
	Dte__PublishReply pub = DTE__PUBLISH_REPLY__INIT;
	Dte__MarkReply mark = DTE__MARK_REPLY__INIT;
	Dte__ApplyReply apply = DTE__APPLY_REPLY__INIT;
	Dte__VerifyReply verify = DTE__VERIFY_REPLY__INIT;
	Dte__SinkVerify *sv = NULL, **svp = NULL;
	const struct dsrv *srv = rq->arg;

	resp.id = rq->id;
	resp.code = derr_status(rc);
	resp.message = str(err);
	if (rc >= 0 && res) {
		switch (res->op) {
		case JOP_ATTACH:
			attach_out(&attach, &res->attach);
			resp.body_case = DTE__RESPONSE__BODY_ATTACH;
			resp.attach = &attach;
			break;
		case JOP_WAIT:
			wait_out(&wait, &res->wait);
			resp.body_case = DTE__RESPONSE__BODY_WAIT;
			resp.wait = &wait;
			break;
		case JOP_WAIT_STAGED:
			staged_out(&staged, &res->staged);
			resp.body_case = DTE__RESPONSE__BODY_WAIT_STAGED;
			resp.wait_staged = &staged;
			break;
		case JOP_WAIT_CAPTURED:
			publish_out(&pub, &res->publish);
			captured.publish = &pub;
			resp.body_case = DTE__RESPONSE__BODY_WAIT_CAPTURED;
			resp.wait_captured = &captured;
			break;
		case JOP_PUBLISH:
			publish_out(&pub, &res->publish);
			resp.body_case = DTE__RESPONSE__BODY_PUBLISH;
			resp.publish = &pub;
			break;
		case JOP_MARK:
			mark_out(&mark, &res->mark);
			resp.body_case = DTE__RESPONSE__BODY_MARK;
			resp.mark = &mark;
			break;
		case JOP_APPLY:
			apply_out(&apply, &res->apply);
			resp.body_case = DTE__RESPONSE__BODY_APPLY;
			resp.apply = &apply;
			break;
		case JOP_VERIFY: {
			size_t n = res->verify.n_results ? res->verify.n_results : 1;

			sv = calloc(n, sizeof(*sv));
			svp = calloc(n, sizeof(*svp));
			if (!sv || !svp) {
				resp.code = DTE__STATUS__STATUS_ERR_INTERNAL;
				resp.message = str("out of memory");
				break;
			}
			dcmd_verify_out(&verify, &res->verify, sv, svp);
			resp.body_case = DTE__RESPONSE__BODY_VERIFY;
			resp.verify = &verify;
			break;
		}
		}
	}
	if (srv && srv->answer)
		srv->answer(rq->conn, &resp);
	else
		DLOG_E("control: connection %llu: an answer with nowhere to go (no srv->answer)",
		       (unsigned long long)rq->conn);
	free(sv);
	free(svp);
}

/* The request as the engine takes it: this connection, this request id,
 * and where its deferred answer goes. */
struct jreq dcmd_jreq(struct dsrv *srv, const struct dsess *s, const Dte__Request *req)
{
	return (struct jreq){ .conn = s->conn_id, .id = req->id, .done = job_answer, .arg = srv };
}

/* Groups of a publish or mark as the engine takes them, from r. */
static struct jhparams *groups_in(struct dreply *r, Dte__HParams *const *g, size_t n)
{
	struct jhparams *out = dreply_alloc(r, (n ? n : 1) * sizeof(*out));

	for (size_t i = 0; out && i < n; i++)
		out[i] = (struct jhparams){
			.lr = g[i]->lr, .beta1 = g[i]->beta1, .beta2 = g[i]->beta2,
			.eps = g[i]->eps, .weight_decay = g[i]->weight_decay,
			.variant = g[i]->variant, .step = g[i]->step, .unchanged = g[i]->unchanged,
		};
	return out;
}

Dte__Status dcmd_job_create(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			    Dte__Response *resp, struct dreply *r)
{
	Dte__JobCreateReply *rep = dreply_alloc(r, sizeof(*rep));
	struct jcreate_args a;
	struct jcreate_res res = { 0 };
	char err[512];
	int st;

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__job_create_reply__init(rep);
	wire_jcreate_args(req->job_create, &a);
	st = job_create(srv->eng, &a, &res, err, sizeof(err));
	rep->created = res.created;
	rep->coordinator = res.coordinator;
	rep->spec_hash = res.spec_hash;
	rep->tensors = res.tensors;
	resp->body_case = DTE__RESPONSE__BODY_JOB_CREATE;
	resp->job_create = rep;
	return done(r, st, err);
}

Dte__Status dcmd_attach(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			Dte__Response *resp, struct dreply *r)
{
	const Dte__AttachRequest *q = req->attach;
	struct jreq rq = dcmd_jreq(srv, s, req);
	struct jattach_args a = {
		.job = q->job, .token = q->token, .role = q->role, .layout = q->layout,
		.rank = q->rank, .replica = q->replica, .buffers = q->buffers,
		.n_buffers = q->n_buffers, .shards = q->shards, .rederives = q->rederives,
	};
	char err[512];
	int deferred = 0;
	int st = job_attach(srv->eng, &rq, &a, &deferred, err, sizeof(err));

	if (st == 0 && deferred)
		dreply_defer(r);
	return done(r, st, err);
}

Dte__Status dcmd_detach(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			Dte__Response *resp, struct dreply *r)
{
	Dte__DetachReply *rep = dreply_alloc(r, sizeof(*rep));
	char err[512];

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__detach_reply__init(rep);
	resp->body_case = DTE__RESPONSE__BODY_DETACH;
	resp->detach = rep;
	return done(r, job_detach(srv->eng, s->conn_id, req->detach->job, req->detach->participant,
				  err, sizeof(err)), err);
}

Dte__Status dcmd_publish(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			 Dte__Response *resp, struct dreply *r)
{
	const Dte__PublishRequest *q = req->publish;
	Dte__PublishReply *rep = dreply_alloc(r, sizeof(*rep));
	struct jreq rq = dcmd_jreq(srv, s, req);
	struct jpublish_args a = {
		.job = q->job, .participant = q->participant, .version = q->version,
		.step = q->step, .n_groups = q->n_groups, .async = q->async,
	};
	struct jpublish_res res = { 0 };
	char err[512];
	int deferred = 0;
	int st;

	if (!rep || !(a.groups = groups_in(r, q->groups, q->n_groups)))
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__publish_reply__init(rep);
	resp->body_case = DTE__RESPONSE__BODY_PUBLISH;
	resp->publish = rep;
	st = job_publish(srv->eng, &rq, &a, &res, &deferred, err, sizeof(err));
	if (st == 0 && deferred)
		dreply_defer(r);
	publish_out(rep, &res);
	return done(r, st, err);
}

Dte__Status dcmd_wait_captured(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			       Dte__Response *resp, struct dreply *r)
{
	const Dte__WaitCapturedRequest *q = req->wait_captured;
	Dte__WaitCapturedReply *rep = dreply_alloc(r, sizeof(*rep));
	Dte__PublishReply *pub = dreply_alloc(r, sizeof(*pub));
	struct jreq rq = dcmd_jreq(srv, s, req);
	struct jwait_args a = {
		.job = q->job, .participant = q->participant, .version = q->version,
		.timeout_ms = q->timeout_ms,
	};
	struct jpublish_res res = { 0 };
	char err[512];
	int deferred = 0;
	int st;

	if (!rep || !pub)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__wait_captured_reply__init(rep);
	dte__publish_reply__init(pub);
	st = job_wait_captured(srv->eng, &rq, &a, &res, &deferred, err, sizeof(err));
	if (st == 0 && deferred)
		dreply_defer(r);
	if (st == 0 && !deferred) {
		publish_out(pub, &res);
		rep->publish = pub;
	}
	resp->body_case = DTE__RESPONSE__BODY_WAIT_CAPTURED;
	resp->wait_captured = rep;
	return done(r, st, err);
}

Dte__Status dcmd_mark(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
		      Dte__Response *resp, struct dreply *r)
{
	const Dte__MarkRequest *q = req->mark;
	Dte__MarkReply *rep = dreply_alloc(r, sizeof(*rep));
	struct jreq rq = dcmd_jreq(srv, s, req);
	struct jmark_args a = {
		.job = q->job, .participant = q->participant, .step = q->step,
		.n_groups = q->n_groups,
	};
	struct jmark_res res = { 0 };
	char err[512];
	int deferred = 0;
	int st;

	if (!rep || !(a.groups = groups_in(r, q->groups, q->n_groups)))
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__mark_reply__init(rep);
	resp->body_case = DTE__RESPONSE__BODY_MARK;
	resp->mark = rep;
	st = job_mark(srv->eng, &rq, &a, &res, &deferred, err, sizeof(err));
	if (st == 0 && deferred)
		dreply_defer(r);
	mark_out(rep, &res);
	return done(r, st, err);
}

Dte__Status dcmd_wait(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
		      Dte__Response *resp, struct dreply *r)
{
	const Dte__WaitRequest *q = req->wait;
	Dte__WaitReply *rep = dreply_alloc(r, sizeof(*rep));
	struct jreq rq = dcmd_jreq(srv, s, req);
	struct jwait_args a = { .job = q->job, .version = q->version, .timeout_ms = q->timeout_ms };
	struct jwait_res res = { 0 };
	char err[512];
	int deferred = 0;
	int st;

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__wait_reply__init(rep);
	st = job_wait(srv->eng, &rq, &a, &res, &deferred, err, sizeof(err));
	if (st == 0 && deferred)
		dreply_defer(r);
	wait_out(rep, &res);
	resp->body_case = DTE__RESPONSE__BODY_WAIT;
	resp->wait = rep;
	return done(r, st, err);
}

Dte__Status dcmd_wait_staged(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			     Dte__Response *resp, struct dreply *r)
{
	const Dte__WaitStagedRequest *q = req->wait_staged;
	Dte__WaitStagedReply *rep = dreply_alloc(r, sizeof(*rep));
	struct jreq rq = dcmd_jreq(srv, s, req);
	struct jwait_args a = {
		.job = q->job, .participant = q->participant, .timeout_ms = q->timeout_ms,
	};
	struct jstaged_res res = { 0 };
	char err[512];
	int deferred = 0;
	int st;

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__wait_staged_reply__init(rep);
	st = job_wait_staged(srv->eng, &rq, &a, &res, &deferred, err, sizeof(err));
	if (st == 0 && deferred)
		dreply_defer(r);
	staged_out(rep, &res);
	resp->body_case = DTE__RESPONSE__BODY_WAIT_STAGED;
	resp->wait_staged = rep;
	return done(r, st, err);
}

Dte__Status dcmd_apply(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
		       Dte__Response *resp, struct dreply *r)
{
	const Dte__ApplyRequest *q = req->apply;
	Dte__ApplyReply *rep = dreply_alloc(r, sizeof(*rep));
	struct jreq rq = dcmd_jreq(srv, s, req);
	struct japply_args a = {
		.job = q->job, .participant = q->participant, .version = q->version,
	};
	struct japply_res res = { 0 };
	char err[512];
	int deferred = 0;
	int st;

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__apply_reply__init(rep);
	resp->body_case = DTE__RESPONSE__BODY_APPLY;
	resp->apply = rep;
	st = job_apply(srv->eng, &rq, &a, &res, &deferred, err, sizeof(err));
	if (st == 0 && deferred)
		dreply_defer(r);
	apply_out(rep, &res);
	return done(r, st, err);
}

Dte__Status dcmd_query_version(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			       Dte__Response *resp, struct dreply *r)
{
	Dte__QueryVersionReply *rep = dreply_alloc(r, sizeof(*rep));
	struct jquery_res res = { 0 };
	char err[512];
	int st;

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__query_version_reply__init(rep);
	resp->body_case = DTE__RESPONSE__BODY_QUERY_VERSION;
	resp->query_version = rep;
	st = job_query_version(srv->eng, s->conn_id, req->query_version->job,
			       req->query_version->participant, &res, err, sizeof(err));
	rep->applied = res.applied;
	rep->staged = res.staged;
	rep->checksum_failures = res.checksum_failures;
	return done(r, st, err);
}

Dte__Status dcmd_jobs(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
		      Dte__Response *resp, struct dreply *r)
{
	Dte__JobsReply *rep = dreply_alloc(r, sizeof(*rep));
	struct jjob_summary *jobs;
	size_t n;
	int st;

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__jobs_reply__init(rep);
	resp->body_case = DTE__RESPONSE__BODY_JOBS;
	resp->jobs = rep;
	if ((st = job_list(srv->eng, &jobs, &n, r)) < 0)
		return derr_status(st);
	rep->jobs = n ? dreply_alloc(r, n * sizeof(*rep->jobs)) : NULL;
	if (n && !rep->jobs)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	for (size_t i = 0; i < n; i++) {
		Dte__JobSummary *o = dreply_alloc(r, sizeof(*o));

		if (!o)
			return DTE__STATUS__STATUS_ERR_INTERNAL;
		dte__job_summary__init(o);
		o->name = str(jobs[i].name);
		o->coordinator = jobs[i].coordinator;
		o->epoch = jobs[i].epoch;
		o->complete = jobs[i].complete;
		o->participants = jobs[i].participants;
		o->local_participants = jobs[i].local_participants;
		o->version = jobs[i].version;
		rep->jobs[i] = o;
	}
	rep->n_jobs = n;
	return DTE__STATUS__STATUS_OK;
}

Dte__Status dcmd_job(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
		     Dte__Response *resp, struct dreply *r)
{
	Dte__JobReply *rep = dreply_alloc(r, sizeof(*rep));
	struct jjob_info info = { 0 };
	char err[512];
	int st;

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__job_reply__init(rep);
	resp->body_case = DTE__RESPONSE__BODY_JOB;
	resp->job = rep;
	st = job_info(srv->eng, req->job->name, &info, r, err, sizeof(err));
	if (st < 0)
		return done(r, st, err);
	rep->name = str(info.name);
	rep->coordinator = str(info.coordinator);
	rep->is_coordinator = info.is_coordinator;
	rep->spec_hash = info.spec_hash;
	rep->publish_interval = info.publish_interval;
	rep->epoch = info.epoch;
	rep->complete = info.complete;
	rep->members = (char **)info.members;
	rep->n_members = info.n_members;
	if (info.n_participants &&
	    !(rep->participants = dreply_alloc(r, info.n_participants * sizeof(*rep->participants))))
		return done(r, -ENOMEM, "out of memory");
	for (size_t i = 0; i < info.n_participants; i++) {
		const struct jpart_info *pi = &info.participants[i];
		Dte__ParticipantInfo *p = dreply_alloc(r, sizeof(*p));

		if (!p)
			return done(r, -ENOMEM, "out of memory");
		dte__participant_info__init(p);
		p->id = pi->id;
		p->role = str(pi->role);
		p->layout = str(pi->layout);
		p->rank = pi->rank;
		p->replica = pi->replica;
		p->node = str(pi->node);
		p->local = pi->local;
		p->version = pi->version;
		p->staged = pi->staged;
		p->checksum_failures = pi->checksum_failures;
		p->relay_parent = pi->relay_parent;
		rep->participants[i] = p;
		rep->n_participants = i + 1;
	}
	rep->entries = info.entries;
	rep->versions = info.versions;
	rep->refused = info.refused;
	rep->transport = str(info.transport);
	rep->storage_root = str(info.storage_root);
	rep->storage_role = str(info.storage_role);
	rep->storage_head = info.storage_head;
	rep->storage_broken = info.storage_broken;
	rep->storage_error = str(info.storage_error);
	rep->plan_error = str(info.plan_error);
	return DTE__STATUS__STATUS_OK;
}

Dte__Status dcmd_history(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			 Dte__Response *resp, struct dreply *r)
{
	Dte__HistoryReply *rep = dreply_alloc(r, sizeof(*rep));
	struct jhist_entry *h;
	char err[512];
	size_t n;
	int st;

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__history_reply__init(rep);
	resp->body_case = DTE__RESPONSE__BODY_HISTORY;
	resp->history = rep;
	st = job_history(srv->eng, req->history->name, req->history->limit, &h, &n, r, err,
			 sizeof(err));
	if (st < 0)
		return done(r, st, err);
	rep->versions = n ? dreply_alloc(r, n * sizeof(*rep->versions)) : NULL;
	if (n && !rep->versions)
		return done(r, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		Dte__VersionRecord *v = dreply_alloc(r, sizeof(*v));

		if (!v)
			return done(r, -ENOMEM, "out of memory");
		dte__version_record__init(v);
		v->version = h[i].version;
		v->step = h[i].step;
		v->mode = str(h[i].mode);
		v->changed_pct = h[i].changed_pct;
		v->bytes = h[i].bytes;
		v->capture_ms = h[i].capture_ms;
		v->transfer_ms = h[i].transfer_ms;
		v->apply_ms = h[i].apply_ms;
		v->checksum = str(h[i].checksum);
		v->sinks = h[i].sinks;
		v->note = str(h[i].note);
		v->reason = str(h[i].reason);
		rep->versions[i] = v;
		rep->n_versions = i + 1;
	}
	return DTE__STATUS__STATUS_OK;
}

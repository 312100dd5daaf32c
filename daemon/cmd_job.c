/* daemon/cmd_job.c — control handlers of the sync engine: buffers, jobs,
 * the source and sink APIs, and what dtectl shows (jobs, job, history).
 * Arguments are checked in daemon/buf.c and daemon/job*.c, which say why
 * they refuse; these only move fields between messages. */
#include <stdio.h>
#include <unistd.h>
#include "daemon/buf.h"
#include "daemon/derr.h"
#include "daemon/dispatch.h"
#include "daemon/job.h"


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

Dte__Status dcmd_job_create(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			    Dte__Response *resp, struct dreply *r)
{
	Dte__JobCreateReply *rep = dreply_alloc(r, sizeof(*rep));
	char err[512];
	int st;

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__job_create_reply__init(rep);
	st = job_create(srv->eng, req->job_create, rep, err, sizeof(err));
	resp->body_case = DTE__RESPONSE__BODY_JOB_CREATE;
	resp->job_create = rep;
	return done(r, st, err);
}

Dte__Status dcmd_attach(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			Dte__Response *resp, struct dreply *r)
{
	char err[512];
	int deferred = 0;
	int st = job_attach(srv->eng, s->conn_id, req->id, req->attach, &deferred, err,
			    sizeof(err));

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
	return done(r, job_detach(srv->eng, s->conn_id, req->detach, err, sizeof(err)), err);
}

Dte__Status dcmd_publish(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			 Dte__Response *resp, struct dreply *r)
{
	Dte__PublishReply *rep = dreply_alloc(r, sizeof(*rep));
	char err[512];
	int deferred = 0;
	int st;

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__publish_reply__init(rep);
	resp->body_case = DTE__RESPONSE__BODY_PUBLISH;
	resp->publish = rep;
	st = job_publish(srv->eng, s->conn_id, req->id, req->publish, rep, &deferred, err,
			 sizeof(err));
	if (st == 0 && deferred)
		dreply_defer(r);
	return done(r, st, err);
}

Dte__Status dcmd_wait_captured(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			       Dte__Response *resp, struct dreply *r)
{
	Dte__WaitCapturedReply *rep = dreply_alloc(r, sizeof(*rep));
	Dte__PublishReply *pub = dreply_alloc(r, sizeof(*pub));
	char err[512];
	int deferred = 0;
	int st;

	if (!rep || !pub)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__wait_captured_reply__init(rep);
	dte__publish_reply__init(pub);
	st = job_wait_captured(srv->eng, s->conn_id, req->id, req->wait_captured, rep, pub,
			       &deferred, err, sizeof(err));
	if (st == 0 && deferred)
		dreply_defer(r);
	resp->body_case = DTE__RESPONSE__BODY_WAIT_CAPTURED;
	resp->wait_captured = rep;
	return done(r, st, err);
}

Dte__Status dcmd_mark(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
		      Dte__Response *resp, struct dreply *r)
{
	Dte__MarkReply *rep = dreply_alloc(r, sizeof(*rep));
	char err[512];
	int deferred = 0;
	int st;

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__mark_reply__init(rep);
	resp->body_case = DTE__RESPONSE__BODY_MARK;
	resp->mark = rep;
	st = job_mark(srv->eng, s->conn_id, req->id, req->mark, rep, &deferred, err, sizeof(err));
	if (st == 0 && deferred)
		dreply_defer(r);
	return done(r, st, err);
}

Dte__Status dcmd_wait(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
		      Dte__Response *resp, struct dreply *r)
{
	Dte__WaitReply *rep = dreply_alloc(r, sizeof(*rep));
	char err[512];
	int deferred = 0;
	int st;

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__wait_reply__init(rep);
	st = job_wait(srv->eng, s->conn_id, req->id, req->wait, rep, &deferred, err, sizeof(err));
	if (st == 0 && deferred)
		dreply_defer(r);
	resp->body_case = DTE__RESPONSE__BODY_WAIT;
	resp->wait = rep;
	return done(r, st, err);
}

Dte__Status dcmd_wait_staged(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			     Dte__Response *resp, struct dreply *r)
{
	Dte__WaitStagedReply *rep = dreply_alloc(r, sizeof(*rep));
	char err[512];
	int deferred = 0;
	int st;

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__wait_staged_reply__init(rep);
	st = job_wait_staged(srv->eng, s->conn_id, req->id, req->wait_staged, rep, &deferred,
			     err, sizeof(err));
	if (st == 0 && deferred)
		dreply_defer(r);
	resp->body_case = DTE__RESPONSE__BODY_WAIT_STAGED;
	resp->wait_staged = rep;
	return done(r, st, err);
}

Dte__Status dcmd_apply(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
		       Dte__Response *resp, struct dreply *r)
{
	Dte__ApplyReply *rep = dreply_alloc(r, sizeof(*rep));
	char err[512];
	int deferred = 0;
	int st;

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__apply_reply__init(rep);
	resp->body_case = DTE__RESPONSE__BODY_APPLY;
	resp->apply = rep;
	st = job_apply(srv->eng, s->conn_id, req->id, req->apply, rep, &deferred, err, sizeof(err));
	if (st == 0 && deferred)
		dreply_defer(r);
	return done(r, st, err);
}

Dte__Status dcmd_query_version(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			       Dte__Response *resp, struct dreply *r)
{
	Dte__QueryVersionReply *rep = dreply_alloc(r, sizeof(*rep));
	char err[512];

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__query_version_reply__init(rep);
	resp->body_case = DTE__RESPONSE__BODY_QUERY_VERSION;
	resp->query_version = rep;
	return done(r, job_query_version(srv->eng, s->conn_id, req->query_version, rep, err,
		    sizeof(err)), err);
}

Dte__Status dcmd_jobs(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
		      Dte__Response *resp, struct dreply *r)
{
	Dte__JobsReply *rep = dreply_alloc(r, sizeof(*rep));

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__jobs_reply__init(rep);
	resp->body_case = DTE__RESPONSE__BODY_JOBS;
	resp->jobs = rep;
	return derr_status(job_list(srv->eng, rep, r));
}

Dte__Status dcmd_job(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
		     Dte__Response *resp, struct dreply *r)
{
	Dte__JobReply *rep = dreply_alloc(r, sizeof(*rep));
	char err[512];

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__job_reply__init(rep);
	resp->body_case = DTE__RESPONSE__BODY_JOB;
	resp->job = rep;
	return done(r, job_info(srv->eng, req->job->name, rep, r, err, sizeof(err)), err);
}

Dte__Status dcmd_history(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			 Dte__Response *resp, struct dreply *r)
{
	Dte__HistoryReply *rep = dreply_alloc(r, sizeof(*rep));
	char err[512];

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__history_reply__init(rep);
	resp->body_case = DTE__RESPONSE__BODY_HISTORY;
	resp->history = rep;
	return done(r, job_history(srv->eng, req->history->name, req->history->limit, rep, r, err,
				   sizeof(err)), err);
}

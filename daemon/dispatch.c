/* daemon/dispatch.c — decode, check, dispatch, encode one request. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/conf.h"
#include "daemon/dispatch.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "proto/frame.h"

/* Daemon-side handler per command; adding a command adds one row here. */
static const dcmd_fn handlers[DTE_CMD__COUNT] = {
	[DTE_CMD_HELLO] = dcmd_hello,
	[DTE_CMD_PING] = dcmd_ping,
	[DTE_CMD_STATUS] = dcmd_status,
	[DTE_CMD_PEERS] = dcmd_peers,
	[DTE_CMD_REGISTER_BUFFER] = dcmd_register_buffer,
	[DTE_CMD_UNREGISTER_BUFFER] = dcmd_unregister_buffer,
	[DTE_CMD_JOB_CREATE] = dcmd_job_create,
	[DTE_CMD_ATTACH] = dcmd_attach,
	[DTE_CMD_DETACH] = dcmd_detach,
	[DTE_CMD_PUBLISH] = dcmd_publish,
	[DTE_CMD_MARK] = dcmd_mark,
	[DTE_CMD_WAIT] = dcmd_wait,
	[DTE_CMD_WAIT_STAGED] = dcmd_wait_staged,
	[DTE_CMD_WAIT_CAPTURED] = dcmd_wait_captured,
	[DTE_CMD_APPLY] = dcmd_apply,
	[DTE_CMD_QUERY_VERSION] = dcmd_query_version,
	[DTE_CMD_JOBS] = dcmd_jobs,
	[DTE_CMD_JOB] = dcmd_job,
	[DTE_CMD_HISTORY] = dcmd_history,
	[DTE_CMD_VERIFY] = dcmd_verify,
	[DTE_CMD_RESYNC] = dcmd_resync,
	[DTE_CMD_METRICS] = dcmd_metrics,
	[DTE_CMD_CONFIG] = dcmd_config,
	[DTE_CMD_LOG_LEVEL] = dcmd_log_level,
};

/* The commands served by the sync engine (srv->eng): refused by a
 * server that has none (tests of the protocol alone). */
static const unsigned char engine_cmd[DTE_CMD__COUNT] = {
	[DTE_CMD_JOB_CREATE] = 1, [DTE_CMD_ATTACH] = 1, [DTE_CMD_DETACH] = 1,
	[DTE_CMD_PUBLISH] = 1, [DTE_CMD_MARK] = 1, [DTE_CMD_WAIT] = 1,
	[DTE_CMD_WAIT_STAGED] = 1, [DTE_CMD_WAIT_CAPTURED] = 1, [DTE_CMD_APPLY] = 1,
	[DTE_CMD_QUERY_VERSION] = 1, [DTE_CMD_JOBS] = 1, [DTE_CMD_JOB] = 1,
	[DTE_CMD_HISTORY] = 1, [DTE_CMD_VERIFY] = 1, [DTE_CMD_RESYNC] = 1,
};

/* The `reason` label of dted_refused_total for a refused request. */
static const char *refusal_reason(Dte__Status code)
{
	switch (code) {
	case DTE__STATUS__STATUS_ERR_PROTOCOL: return "protocol";
	case DTE__STATUS__STATUS_ERR_VERSION: return "version";
	case DTE__STATUS__STATUS_ERR_UNKNOWN_COMMAND: return "unknown_command";
	case DTE__STATUS__STATUS_ERR_DENIED: return "denied";
	case DTE__STATUS__STATUS_ERR_INVALID: return "invalid";
	case DTE__STATUS__STATUS_ERR_NOT_FOUND: return "not_found";
	case DTE__STATUS__STATUS_ERR_BUSY: return "busy";
	case DTE__STATUS__STATUS_ERR_UNIMPLEMENTED: return "unimplemented";
	case DTE__STATUS__STATUS_ERR_TIMEOUT: return "timeout";
	default: return "internal";
	}
}

#define fail(r, code, ...) (dreply_msg((r), __VA_ARGS__), (code))

dcmd_fn ddispatch_handler(enum dte_cmd_id id)
{
	return (unsigned)id < DTE_CMD__COUNT ? handlers[id] : NULL;
}

static Dte__Status ladder(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			  Dte__Response *resp, struct dreply *r)
{
	const struct dte_cmd *cmd;
	dcmd_fn fn;

	if (s->denied) {
		s->close_after = 1;
		return fail(r, DTE__STATUS__STATUS_ERR_DENIED,
			    "uid %u is not allowed to use this daemon (allow_uids/allow_gids)",
			    (unsigned)s->uid);
	}
	if (req->cmd_case == DTE__REQUEST__CMD__NOT_SET) {
		/* A command newer than this daemon arrives as an unknown field. */
		s->close_after = 1;
		if (req->base.n_unknown_fields)
			return fail(r, DTE__STATUS__STATUS_ERR_UNKNOWN_COMMAND,
				    "unknown command (field %u)", req->base.unknown_fields[0].tag);
		return fail(r, DTE__STATUS__STATUS_ERR_PROTOCOL, "request names no command");
	}
	cmd = dte_cmd_by_field((unsigned)req->cmd_case);
	if (!cmd || !(cmd->flags & DTE_CMD_DAEMON)) {
		s->close_after = 1;
		return fail(r, DTE__STATUS__STATUS_ERR_UNKNOWN_COMMAND,
			    "command field %u is not served by the daemon", (unsigned)req->cmd_case);
	}
	if (!s->version && !(cmd->flags & DTE_CMD_NOHELLO)) {
		s->close_after = 1;
		return fail(r, DTE__STATUS__STATUS_ERR_PROTOCOL, "%s before hello", cmd->name);
	}
	if (s->deferred)
		return fail(r, DTE__STATUS__STATUS_ERR_BUSY,
			    "%s while an earlier request on this connection still waits for "
			    "its reply (one pending wait per connection)", cmd->name);
	fn = handlers[cmd->id];
	if (!fn)
		return fail(r, DTE__STATUS__STATUS_ERR_UNIMPLEMENTED,
			    "%s is not implemented by this daemon", cmd->name);
	if (engine_cmd[cmd->id] && !srv->eng)
		return fail(r, DTE__STATUS__STATUS_ERR_UNIMPLEMENTED,
			    "%s: this server has no sync engine", cmd->name);
	return fn(srv, s, req, resp, r);
}

static int pack(Dte__Response *resp, uint32_t max, uint8_t **out, size_t *outlen)
{
	int rc = dte_frame_pack(&resp->base, max, out, outlen);

	if (rc == DTE_FRAME_ETOOBIG) {
		/* Never send what the client's reader would refuse. */
		DLOG_E("reply to request %u over the frame cap (%u bytes)", resp->id, max);
		resp->body_case = DTE__RESPONSE__BODY__NOT_SET;
		resp->code = DTE__STATUS__STATUS_ERR_INTERNAL;
		resp->message = "reply larger than max_frame_bytes";
		rc = dte_frame_pack(&resp->base, max, out, outlen);
	}
	return rc == 0 ? 0 : -1;
}

int ddispatch(struct dsrv *srv, struct dsess *s, const uint8_t *body, size_t len,
	      uint8_t **out, size_t *outlen)
{
	Dte__Response resp = DTE__RESPONSE__INIT;
	struct dreply r = { 0 };
	Dte__Request *req;
	int rc;

	req = dte__request__unpack(NULL, len, body);
	if (!req) {
		DLOG_W("control: undecodable request (%zu bytes) from pid %d uid %u", len,
		       (int)s->pid, (unsigned)s->uid);
		s->close_after = 1;
		dmetrics_add(DM_REFUSED, refusal_reason(DTE__STATUS__STATUS_ERR_PROTOCOL), 1);
		return ddispatch_error(DTE__STATUS__STATUS_ERR_PROTOCOL, "undecodable request",
				       out, outlen);
	}
	resp.id = req->id;
	resp.code = ladder(srv, s, req, &resp, &r);
	{
		const struct dte_cmd *cmd = dte_cmd_by_field((unsigned)req->cmd_case);

		/* Only names from the table: a client cannot mint label values. */
		dmetrics_add(DM_CONTROL_REQUESTS, cmd ? cmd->name : "unknown", 1);
		if (resp.code != DTE__STATUS__STATUS_OK)
			dmetrics_add(DM_REFUSED, refusal_reason(resp.code), 1);
	}
	if (r.deferred && resp.code == DTE__STATUS__STATUS_OK) {
		s->deferred = 1;
		srv->requests++;
		dte__request__free_unpacked(req, NULL);
		dreply_release(&r);
		*out = NULL;
		*outlen = 0;
		return 0;
	}
	if (resp.code != DTE__STATUS__STATUS_OK) {
		resp.body_case = DTE__RESPONSE__BODY__NOT_SET;
		resp.message = r.msg[0] ? r.msg : "error";
		DLOG_W("control: pid %d uid %u: %s", (int)s->pid, (unsigned)s->uid, resp.message);
	} else {
		resp.message = r.msg;
	}
	srv->requests++;
	rc = pack(&resp, srv->conf->max_frame_bytes, out, outlen);
	dte__request__free_unpacked(req, NULL);
	dreply_release(&r);
	return rc;
}

int ddispatch_pack(Dte__Response *resp, uint32_t max, uint8_t **out, size_t *outlen)
{
	return pack(resp, max, out, outlen);
}

int ddispatch_error(Dte__Status code, const char *msg, uint8_t **out, size_t *outlen)
{
	Dte__Response resp = DTE__RESPONSE__INIT;

	resp.code = code;
	resp.message = (char *)msg;
	return dte_frame_pack(&resp.base, DCONF_MAX_FRAME, out, outlen) == 0 ? 0 : -1;
}

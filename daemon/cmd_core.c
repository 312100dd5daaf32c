/* daemon/cmd_core.c — hello, ping, status. */
#include <stdio.h>
#include <unistd.h>
#include <uv.h>
#include "daemon/conf.h"
#include "daemon/dispatch.h"
#include "daemon/log.h"
#include "daemon/registry.h"

Dte__Status dcmd_hello(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
		       Dte__Response *resp, struct dreply *r)
{
	const Dte__HelloRequest *h = req->hello;
	Dte__HelloReply *rep;
	uint32_t lo = h->min_version, hi = h->max_version, v;

	/* Overlap of [lo, hi] with what this build speaks; highest wins. */
	v = hi < DTE_PROTO_VERSION ? hi : DTE_PROTO_VERSION;
	if (lo > hi || v < lo || v < DTE_PROTO_MIN_VERSION) {
		s->close_after = 1;
		dreply_msg(r, "no common protocol version: client speaks %u..%u, daemon %u..%u",
			   lo, hi, DTE_PROTO_MIN_VERSION, DTE_PROTO_VERSION);
		return DTE__STATUS__STATUS_ERR_VERSION;
	}
	rep = dreply_alloc(r, sizeof(*rep));
	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__hello_reply__init(rep);
	rep->version = v;
	rep->daemon_min = DTE_PROTO_MIN_VERSION;
	rep->daemon_max = DTE_PROTO_VERSION;
	rep->daemon_version = DTE_VERSION;
	rep->node_name = (char *)srv->conf->node_name;
	resp->body_case = DTE__RESPONSE__BODY_HELLO;
	resp->hello = rep;
	if (!s->version)
		DLOG_D("control: hello from pid %d uid %u (%s), protocol %u", (int)s->pid,
		       (unsigned)s->uid, h->client, v);
	s->version = v;
	return DTE__STATUS__STATUS_OK;
}

Dte__Status dcmd_ping(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
		      Dte__Response *resp, struct dreply *r)
{
	Dte__PingReply *rep = dreply_alloc(r, sizeof(*rep));

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__ping_reply__init(rep);
	rep->nonce = req->ping->nonce;
	resp->body_case = DTE__RESPONSE__BODY_PING;
	resp->ping = rep;
	return DTE__STATUS__STATUS_OK;
}

Dte__Status dcmd_status(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			Dte__Response *resp, struct dreply *r)
{
	Dte__StatusReply *rep = dreply_alloc(r, sizeof(*rep));
	struct dreg_counts reg = dreg_counts();

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__status_reply__init(rep);
	rep->version = DTE_VERSION;
	rep->protocol = s->version;
	rep->pid = (int32_t)getpid();
	rep->uptime_s = (uv_hrtime() - srv->start_ns) / 1000000000u;
	rep->node_name = (char *)srv->conf->node_name;
	rep->backend = (char *)srv->backend;
	rep->jobs = reg.jobs;
	rep->peers = reg.peers;
	rep->clients = srv->clients;
	rep->refused = srv->refused;
	rep->log_level = (char *)dlog_level_name(dlog_get_level());
	rep->requests = srv->requests;
	rep->bad_frames = srv->bad_frames;
	rep->metrics_address = (char *)srv->metrics_address;
	rep->metrics_error = (char *)srv->metrics_error;
	resp->body_case = DTE__RESPONSE__BODY_STATUS;
	resp->status = rep;
	return DTE__STATUS__STATUS_OK;
}

/* client/dte_cmds.c — libdte's typed wrappers for daemon commands. */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "client/dte_internal.h"

int dte_ping(dte_t *h, uint64_t *rtt_ns)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__PingRequest ping = DTE__PING_REQUEST__INIT;
	Dte__Response *resp;
	struct timespec t0, t1;
	int rc;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	ping.nonce = ((uint64_t)t0.tv_sec << 32) ^ (uint64_t)t0.tv_nsec;
	req.cmd_case = DTE__REQUEST__CMD_PING;
	req.ping = &ping;
	rc = dte__call(h, &req, &resp);
	if (rc < 0)
		return rc;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (resp->ping->nonce != ping.nonce)
		rc = DTE_ERR_PROTOCOL;
	else if (rtt_ns)
		*rtt_ns = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000u +
			  (uint64_t)t1.tv_nsec - (uint64_t)t0.tv_nsec;
	dte__response__free_unpacked(resp, NULL);
	return rc;
}

#define FITS(out, f) (offsetof(struct dte_status, f) + sizeof((out)->f) <= (out)->size)
#define PUT(out, f, bit, val) do { if (FITS(out, f)) { (out)->f = (val); (out)->field_mask |= (bit); } } while (0)
#define PUTS(out, f, bit, val) do { if (FITS(out, f)) { snprintf((out)->f, sizeof((out)->f), "%s", (val) ? (val) : ""); (out)->field_mask |= (bit); } } while (0)

int dte_status(dte_t *h, struct dte_status *out)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__StatusRequest st = DTE__STATUS_REQUEST__INIT;
	Dte__Response *resp;
	const Dte__StatusReply *r;
	int rc;

	if (!out || out->size < offsetof(struct dte_status, version))
		return DTE_ERR_INVAL;
	req.cmd_case = DTE__REQUEST__CMD_STATUS;
	req.status = &st;
	rc = dte__call(h, &req, &resp);
	if (rc < 0)
		return rc;
	r = resp->status;
	out->field_mask = 0;
	PUTS(out, version, DTE_STATUS_VERSION, r->version);
	PUT(out, protocol, DTE_STATUS_PROTOCOL, r->protocol);
	PUT(out, pid, DTE_STATUS_PID, r->pid);
	PUT(out, uptime_s, DTE_STATUS_UPTIME, r->uptime_s);
	PUTS(out, node_name, DTE_STATUS_NODE_NAME, r->node_name);
	PUTS(out, backend, DTE_STATUS_BACKEND, r->backend);
	PUT(out, jobs, DTE_STATUS_JOBS, r->jobs);
	PUT(out, peers, DTE_STATUS_PEERS, r->peers);
	PUT(out, clients, DTE_STATUS_CLIENTS, r->clients);
	PUT(out, refused, DTE_STATUS_REFUSED, r->refused);
	PUTS(out, log_level, DTE_STATUS_LOG_LEVEL, r->log_level);
	PUT(out, requests, DTE_STATUS_REQUESTS, r->requests);
	PUT(out, bad_frames, DTE_STATUS_BAD_FRAMES, r->bad_frames);
	if (FITS(out, metrics_error)) {
		PUTS(out, metrics_address, DTE_STATUS_METRICS, r->metrics_address);
		PUTS(out, metrics_error, DTE_STATUS_METRICS, r->metrics_error);
	}
	dte__response__free_unpacked(resp, NULL);
	return DTE_OK;
}

/* daemon/cmd_peer.c — `dtectl peers`: the UCX router's view of other
 * daemons (one row per node, by name). */
#include <uv.h>
#include "daemon/conf.h"
#include "daemon/dispatch.h"
#include "daemon/route_ucx.h"

/* Nodes seen by one daemon stay few (the members of its jobs); the cap
 * only bounds the reply. */
#define PEERS_MAX 1024

Dte__Status dcmd_peers(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
		       Dte__Response *resp, struct dreply *r)
{
	struct droute_ucx *ru = droute_ucx_daemon();
	Dte__PeersReply *rep = dreply_alloc(r, sizeof(*rep));
	struct droute_peer_info *info = NULL;
	struct droute_ucx_stats st = { 0 };
	uint64_t now = uv_hrtime();
	size_t n = 0;

	if (!rep)
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	dte__peers_reply__init(rep);
	rep->node = (char *)srv->conf->node_name;
	rep->address = "";
	if (!ru) {
		dreply_msg(r, "peer transport not running (see the daemon log)");
		goto out;
	}
	rep->address = (char *)droute_ucx_address(ru);
	rep->listen_error = (char *)droute_ucx_listen_error(ru, &rep->listen_retries);
	droute_ucx_stats(ru, &st);
	rep->restarts = st.restarts;
	n = droute_ucx_peers(ru, NULL, 0);
	if (n > PEERS_MAX)
		n = PEERS_MAX;
	if (n) {
		info = dreply_alloc(r, n * sizeof(*info));
		rep->peers = dreply_alloc(r, n * sizeof(*rep->peers));
		if (!info || !rep->peers)
			return DTE__STATUS__STATUS_ERR_INTERNAL;
		/* Filled min(total, n); the total cannot have grown since. */
		if (droute_ucx_peers(ru, info, n) < n)
			return DTE__STATUS__STATUS_ERR_INTERNAL;
	}
	for (size_t i = 0; i < n; i++) {
		Dte__PeerInfo *p = dreply_alloc(r, sizeof(*p));

		if (!p)
			return DTE__STATUS__STATUS_ERR_INTERNAL;
		dte__peer_info__init(p);
		p->node = info[i].node;
		p->address = info[i].address;
		p->state = (char *)info[i].state;
		p->links = info[i].links;
		p->msgs_in = info[i].msgs_in;
		p->bytes_in = info[i].bytes_in;
		p->msgs_out = info[i].msgs_out;
		p->bytes_out = info[i].bytes_out;
		p->since_s = (now - info[i].since_ns) / 1000000000u;
		p->queued = info[i].queued;
		p->dropped = info[i].dropped;
		rep->peers[i] = p;
	}
	rep->n_peers = n;
out:
	resp->body_case = DTE__RESPONSE__BODY_PEERS;
	resp->peers = rep;
	return DTE__STATUS__STATUS_OK;
}

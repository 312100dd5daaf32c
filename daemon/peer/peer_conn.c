/* daemon/peer/peer_conn.c — listener, connect, HELLO handshake, endpoint
 * lifetime.
 *
 * A peer holds one reference for its endpoint and one per operation in
 * flight.  An endpoint error only records the reason: the force close that
 * UCX asks for afterwards runs from the loop (dte_peer__reap), never inside
 * the UCX error callback.  When the last reference goes the peer moves to
 * the reap list and its down callback runs from the loop too, so a peer is
 * never freed inside its own callback chain.
 */
#include "daemon/peer/peer_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ucs/debug/log_def.h>

static void peer_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
	dte_peer_t *peer = arg;

	dte_peer__log(peer->ctx, LOG_INFO, "peer %s (%s): endpoint error: %s",
	              peer->remote_name[0] ? peer->remote_name : "?",
	              peer->addr, ucs_status_string(status));
	dte_peer__fail(peer, dte_peer__errno(status), ucs_status_string(status));
}

static void peer_close_done(void *request, ucs_status_t status, void *arg)
{
	dte_peer_t *peer = arg;

	ucp_request_free(request);
	if (status != UCS_OK && !peer->reason[0]) {
		peer->down_status = dte_peer__errno(status);
		snprintf(peer->reason, sizeof(peer->reason), "close: %s",
		         ucs_status_string(status));
	}
	peer->ep = NULL;
	dte_peer__unref(peer);
}

/* Start closing the endpoint (flush, or force after an error); the ep
 * reference goes when UCX is done with it. */
int dte_peer__close_ep(dte_peer_t *peer, int force)
{
	ucp_request_param_t param = {
		.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS |
		                UCP_OP_ATTR_FIELD_CALLBACK |
		                UCP_OP_ATTR_FIELD_USER_DATA,
		.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0,
		.cb.send = peer_close_done,
		.user_data = peer,
	};
	ucs_status_ptr_t req;
	ucp_ep_h ep = peer->ep;

	if (!ep || peer->ep_closing)
		return 0;
	peer->ep_closing = 1;
	req = ucp_ep_close_nbx(ep, &param);
	if (UCS_PTR_IS_PTR(req))
		return 0;
	/* Done at once, or failed: either way UCX has released the ep. */
	if (UCS_PTR_STATUS(req) != UCS_OK && !peer->reason[0]) {
		peer->down_status = dte_peer__errno(UCS_PTR_STATUS(req));
		snprintf(peer->reason, sizeof(peer->reason), "close: %s",
		         ucs_status_string(UCS_PTR_STATUS(req)));
	}
	peer->ep = NULL;
	dte_peer__unref(peer);
	return 0;
}

int dte_peer_close(dte_peer_t *peer)
{
	if (!peer)
		return -EINVAL;
	if (peer->state == DTE_PEER_CLOSING)
		return -EALREADY;
	peer->state = DTE_PEER_CLOSING;
	if (!peer->reason[0]) {
		peer->down_status = 0;
		snprintf(peer->reason, sizeof(peer->reason), "closed");
	}
	return dte_peer__close_ep(peer, 0);
}

void dte_peer__reap(dte_peer_ctx_t *ctx)
{
	dte_peer_t *p, *next;

	for (p = ctx->peers; p; p = next) {
		next = p->next;
		if (p->failed && p->ep && !p->ep_closing)
			dte_peer__close_ep(p, 1);
	}
	dte_peer__ops_complete_deferred(ctx);
	while ((p = ctx->reap)) {
		ctx->reap = p->next;
		dte_peer__log(ctx, p->down_status ? LOG_NOTICE : LOG_DEBUG,
		              "peer %s id=%llu (%s) down: %s",
		              p->remote_name[0] ? p->remote_name : "?",
		              (unsigned long long)p->remote_id, p->addr, p->reason);
		if (p->announced) {
			ctx->stats.peers_down++;
			if (ctx->params.down_cb)
				ctx->params.down_cb(ctx, p, p->down_status, p->reason);
		}
		free(p);
	}
}

/* --- handshake --- */

static int peer_send_hello(dte_peer_t *peer, uint16_t flags)
{
	dte_peer_ctx_t *ctx = peer->ctx;
	struct dte_peer_hello h;

	memset(&h, 0, sizeof(h));
	h.magic = DTE_PEER_MAGIC;
	h.version = DTE_PEER_VERSION;
	h.flags = flags;
	h.node_id = ctx->params.node_id;
	memcpy(h.name, ctx->node_name, sizeof(h.name));
	return dte_peer__send(peer, DTE_PEER_AM_HELLO, &h, sizeof(h), NULL, 0,
	                      NULL, 0, NULL, NULL);
}

ucs_status_t dte_peer__hello_cb(void *arg, const void *header,
                                size_t header_len, void *data, size_t len,
                                const ucp_am_recv_param_t *param)
{
	dte_peer_ctx_t *ctx = arg;
	ucs_status_t drop = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ?
	                    UCS_ERR_REJECTED : UCS_OK;
	struct dte_peer_hello h;
	dte_peer_t *peer = NULL;
	int rc;

	if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
		peer = dte_peer__find(ctx, param->reply_ep);
	if (!peer || peer->state != DTE_PEER_CONNECTING) {
		ctx->stats.dropped_bad++;
		dte_peer__log(ctx, LOG_WARNING, "HELLO from %s: dropped",
		              peer ? "a connected peer" : "an unknown endpoint");
		return drop;
	}
	if (header_len != sizeof(h) || len != 0) {
		ctx->stats.dropped_bad++;
		dte_peer__fail(peer, -EPROTO, "malformed HELLO");
		return drop;
	}
	memcpy(&h, header, sizeof(h));
	if (h.magic != DTE_PEER_MAGIC || h.version != DTE_PEER_VERSION) {
		ctx->stats.dropped_bad++;
		dte_peer__fail(peer, -EPROTO, "HELLO: wrong magic or version");
		return drop;
	}
	h.name[DTE_PEER_NAME_MAX - 1] = '\0';
	peer->remote_id = h.node_id;
	memcpy(peer->remote_name, h.name, sizeof(h.name));
	if (!(h.flags & DTE_PEER_HELLO_REPLY)) {
		/* Accepting side: answer before any user message can follow. */
		rc = peer_send_hello(peer, DTE_PEER_HELLO_REPLY);
		if (rc < 0) {
			dte_peer__fail(peer, rc, "cannot answer HELLO");
			return UCS_OK;
		}
	}
	peer->state = DTE_PEER_UP;
	peer->announced = 1;
	ctx->stats.peers_up++;
	dte_peer__log(ctx, LOG_INFO, "peer %s id=%llu (%s) up", peer->remote_name,
	              (unsigned long long)peer->remote_id, peer->addr);
	if (ctx->params.up_cb)
		ctx->params.up_cb(ctx, peer);
	return UCS_OK;
}

/* --- listener and connect --- */

static int peer_sockaddr(const char *addr, uint16_t port,
                         struct sockaddr_storage *ss, socklen_t *len)
{
	struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;

	memset(ss, 0, sizeof(*ss));
	if (!addr)
		return -EINVAL;
	if (inet_pton(AF_INET, addr, &in4->sin_addr) == 1) {
		in4->sin_family = AF_INET;
		in4->sin_port = htons(port);
		*len = sizeof(*in4);
		return 0;
	}
	if (inet_pton(AF_INET6, addr, &in6->sin6_addr) == 1) {
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons(port);
		*len = sizeof(*in6);
		return 0;
	}
	return -EINVAL;
}

static void peer_format_addr(const struct sockaddr_storage *ss, char *buf,
                             size_t size)
{
	char host[INET6_ADDRSTRLEN] = "?";
	uint16_t port = 0;

	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *in4 = (const struct sockaddr_in *)ss;

		inet_ntop(AF_INET, &in4->sin_addr, host, sizeof(host));
		port = ntohs(in4->sin_port);
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;

		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
		port = ntohs(in6->sin6_port);
	}
	snprintf(buf, size, "%s:%u", host, port);
}

static void peer_conn_request_cb(ucp_conn_request_h req, void *arg)
{
	dte_peer_ctx_t *ctx = arg;
	ucp_conn_request_attr_t ra = {
		.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR,
	};
	ucp_ep_params_t ep = {
		.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST |
		              UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
		              UCP_EP_PARAM_FIELD_ERR_HANDLER,
		.conn_request = req,
		.err_mode = UCP_ERR_HANDLING_MODE_PEER,
		.err_handler.cb = peer_ep_err_cb,
	};
	char addr[64] = "?";
	dte_peer_t *peer;
	ucs_status_t st;

	if (ucp_conn_request_query(req, &ra) == UCS_OK)
		peer_format_addr(&ra.client_address, addr, sizeof(addr));
	if (ctx->closing) {
		dte_peer__log(ctx, LOG_INFO, "connection from %s refused: closing",
		              addr);
		ucp_listener_reject(ctx->listener, req);
		return;
	}
	peer = dte_peer__new(ctx, addr);
	if (!peer) {
		dte_peer__log(ctx, LOG_ERR, "connection from %s: out of memory",
		              addr);
		ucp_listener_reject(ctx->listener, req);
		return;
	}
	ep.err_handler.arg = peer;
	st = ucp_ep_create(ctx->worker, &ep, &peer->ep);
	if (st != UCS_OK) {
		dte_peer__log(ctx, LOG_ERR, "accepting %s: %s", addr,
		              ucs_status_string(st));
		peer->ep = NULL;
		dte_peer__fail(peer, dte_peer__errno(st), ucs_status_string(st));
		dte_peer__unref(peer);
		return;
	}
	dte_peer__log(ctx, LOG_DEBUG, "accepted connection from %s", addr);
}

/* What UCX itself logs (warnings and errors, straight to stderr) while
 * this thread creates a listener: held back, so that a port another
 * process holds is said once, by the caller, with what to do about it,
 * rather than by UCX's "bind() failed" on every retry. */
static __thread char *listen_ucx_msg;
static __thread size_t listen_ucx_len;

static ucs_log_func_rc_t listen_ucx_log(const char *file, unsigned line, const char *function,
                                        ucs_log_level_t level,
                                        const ucs_log_component_config_t *comp_conf,
                                        const char *fmt, va_list ap)
{
	if (!listen_ucx_msg || level > UCS_LOG_LEVEL_WARN)
		return UCS_LOG_FUNC_RC_CONTINUE;
	if (!listen_ucx_msg[0])
		vsnprintf(listen_ucx_msg, listen_ucx_len, fmt, ap);
	return UCS_LOG_FUNC_RC_STOP;
}

int dte_peer_listen(dte_peer_ctx_t *ctx, const char *addr, uint16_t port,
                    uint16_t *bound_port)
{
	ucp_listener_params_t lp = {
		.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
		              UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
		.conn_handler.cb = peer_conn_request_cb,
		.conn_handler.arg = ctx,
	};
	ucp_listener_attr_t la = {
		.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR,
	};
	struct sockaddr_storage ss;
	socklen_t len;
	ucp_listener_h listener;
	ucs_status_t st;
	char ucx_msg[256] = "";
	int rc;

	if (!ctx || !ctx->worker || ctx->closing)
		return -EINVAL;
	if (ctx->listener)
		return -EALREADY;
	rc = peer_sockaddr(addr, port, &ss, &len);
	if (rc < 0) {
		dte_peer__log(ctx, LOG_ERR, "listen: bad address '%s'",
		              addr ? addr : "(null)");
		return rc;
	}
	lp.sockaddr.addr = (const struct sockaddr *)&ss;
	lp.sockaddr.addrlen = len;
	listen_ucx_msg = ucx_msg;
	listen_ucx_len = sizeof(ucx_msg);
	ucs_log_push_handler(listen_ucx_log);
	st = ucp_listener_create(ctx->worker, &lp, &listener);
	ucs_log_pop_handler();
	listen_ucx_msg = NULL;
	if (st == UCS_ERR_BUSY)
		return -EADDRINUSE;	/* the port is in use: the caller's to say */
	if (st != UCS_OK) {
		dte_peer__log(ctx, LOG_ERR, "listen on %s:%u: %s%s%s", addr, port,
		              ucs_status_string(st), ucx_msg[0] ? "; ucx: " : "", ucx_msg);
		return dte_peer__errno(st);
	}
	if (ucx_msg[0])
		dte_peer__log(ctx, LOG_WARNING, "listen on %s:%u: ucx: %s", addr, port, ucx_msg);
	st = ucp_listener_query(listener, &la);
	if (st != UCS_OK) {
		dte_peer__log(ctx, LOG_ERR, "listener query: %s",
		              ucs_status_string(st));
		ucp_listener_destroy(listener);
		return dte_peer__errno(st);
	}
	ctx->listener = listener;
	if (bound_port)
		*bound_port = la.sockaddr.ss_family == AF_INET6 ?
		    ntohs(((struct sockaddr_in6 *)&la.sockaddr)->sin6_port) :
		    ntohs(((struct sockaddr_in *)&la.sockaddr)->sin_port);
	return 0;
}

int dte_peer_connect(dte_peer_ctx_t *ctx, const char *addr, uint16_t port,
                     dte_peer_t **peer_out)
{
	ucp_ep_params_t ep = {
		.field_mask = UCP_EP_PARAM_FIELD_FLAGS |
		              UCP_EP_PARAM_FIELD_SOCK_ADDR |
		              UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
		              UCP_EP_PARAM_FIELD_ERR_HANDLER,
		.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
		.err_mode = UCP_ERR_HANDLING_MODE_PEER,
		.err_handler.cb = peer_ep_err_cb,
	};
	struct sockaddr_storage ss;
	char name[64];
	socklen_t len;
	dte_peer_t *peer;
	ucs_status_t st;
	int rc;

	if (!ctx || !ctx->worker || ctx->closing || !peer_out || port == 0)
		return -EINVAL;
	rc = peer_sockaddr(addr, port, &ss, &len);
	if (rc < 0) {
		dte_peer__log(ctx, LOG_ERR, "connect: bad address '%s'",
		              addr ? addr : "(null)");
		return rc;
	}
	peer_format_addr(&ss, name, sizeof(name));
	peer = dte_peer__new(ctx, name);
	if (!peer)
		return -ENOMEM;
	ep.sockaddr.addr = (const struct sockaddr *)&ss;
	ep.sockaddr.addrlen = len;
	ep.err_handler.arg = peer;
	st = ucp_ep_create(ctx->worker, &ep, &peer->ep);
	if (st != UCS_OK) {
		dte_peer__log(ctx, LOG_ERR, "connect to %s: %s", name,
		              ucs_status_string(st));
		peer->ep = NULL;
		peer->refs = 0;
		ctx->peers = peer->next;
		free(peer);
		return dte_peer__errno(st);
	}
	/* Failures from here on come back as the down callback. */
	peer->announced = 1;
	rc = peer_send_hello(peer, 0);
	if (rc < 0)
		dte_peer__fail(peer, rc, "cannot send HELLO");
	*peer_out = peer;
	return 0;
}

const char *dte_peer_name(const dte_peer_t *peer)
{
	return peer ? peer->remote_name : "";
}

uint64_t dte_peer_id(const dte_peer_t *peer)
{
	return peer ? peer->remote_id : 0;
}

int dte_peer_is_up(const dte_peer_t *peer)
{
	return peer && peer->state == DTE_PEER_UP;
}

dte_peer_ctx_t *dte_peer_ctx(const dte_peer_t *peer)
{
	return peer ? peer->ctx : NULL;
}

void *dte_peer_get_data(const dte_peer_t *peer)
{
	return peer ? peer->data : NULL;
}

void dte_peer_set_data(dte_peer_t *peer, void *data)
{
	if (peer)
		peer->data = data;
}

/* daemon/peer/peer_base.c — the bottom of the peer module: its log and
 * UCX status -> errno, and the peer objects themselves (the context's
 * table, references, the first failure's reason).  Every other peer_*.c
 * file stands on this one, which calls none of them: peer_ctx.c (the
 * worker on the loop) -> peer_conn.c (listen, connect, HELLO, close) ->
 * peer_msg.c (sends, receives) -> peer_mem.c (registered memory) -> here.
 *
 * A peer holds one reference for its endpoint and one per operation in
 * flight; when the last goes it moves to the reap list, which
 * dte_peer__reap (peer_conn.c) empties from the loop.
 */
#include "daemon/peer/peer_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dte_peer__log(dte_peer_ctx_t *ctx, int level, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (level == LOG_DEBUG && !ctx->params.log_cb && !getenv("DTE_PEER_DEBUG"))
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (ctx->params.log_cb)
		ctx->params.log_cb(level, msg, ctx->params.user_data);
	else
		fprintf(stderr, "<%d>peer: %s\n", level, msg);
}

int dte_peer__errno(ucs_status_t status)
{
	switch (status) {
	case UCS_OK:                     return 0;
	case UCS_ERR_CANCELED:           return -ECANCELED;
	case UCS_ERR_NO_MEMORY:          return -ENOMEM;
	case UCS_ERR_INVALID_PARAM:      return -EINVAL;
	case UCS_ERR_UNREACHABLE:        return -EHOSTUNREACH;
	case UCS_ERR_CONNECTION_RESET:   return -ECONNRESET;
	case UCS_ERR_REJECTED:           return -ECONNREFUSED;
	case UCS_ERR_NOT_CONNECTED:      return -ENOTCONN;
	case UCS_ERR_TIMED_OUT:
	case UCS_ERR_ENDPOINT_TIMEOUT:   return -ETIMEDOUT;
	case UCS_ERR_BUSY:               return -EBUSY;
	case UCS_ERR_BUFFER_TOO_SMALL:
	case UCS_ERR_MESSAGE_TRUNCATED:  return -EMSGSIZE;
	case UCS_ERR_UNSUPPORTED:        return -ENOTSUP;
	case UCS_ERR_IO_ERROR:           return -EIO;
	default:                         return -EIO;
	}
}

dte_peer_t *dte_peer__new(dte_peer_ctx_t *ctx, const char *addr)
{
	dte_peer_t *peer = calloc(1, sizeof(*peer));

	if (!peer)
		return NULL;
	peer->ctx = ctx;
	peer->state = DTE_PEER_CONNECTING;
	peer->refs = 1;
	snprintf(peer->addr, sizeof(peer->addr), "%s", addr);
	peer->next = ctx->peers;
	ctx->peers = peer;
	return peer;
}

dte_peer_t *dte_peer__find(dte_peer_ctx_t *ctx, ucp_ep_h ep)
{
	dte_peer_t *p;

	for (p = ctx->peers; p; p = p->next)
		if (p->ep == ep && ep)
			return p;
	return NULL;
}

void dte_peer__ref(dte_peer_t *peer)
{
	peer->refs++;
}

void dte_peer__unref(dte_peer_t *peer)
{
	dte_peer_ctx_t *ctx = peer->ctx;
	dte_peer_t **pp;

	if (--peer->refs > 0)
		return;
	for (pp = &ctx->peers; *pp; pp = &(*pp)->next) {
		if (*pp == peer) {
			*pp = peer->next;
			break;
		}
	}
	peer->next = ctx->reap;
	ctx->reap = peer;
}

void dte_peer__fail(dte_peer_t *peer, int status, const char *reason)
{
	if (!peer->reason[0]) {
		peer->down_status = status;
		snprintf(peer->reason, sizeof(peer->reason), "%s", reason);
	}
	peer->state = DTE_PEER_CLOSING;
	peer->failed = 1;
}

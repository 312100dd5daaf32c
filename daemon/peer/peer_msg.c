/* daemon/peer/peer_msg.c — user messages: send, dispatch, rendezvous.
 *
 * Every user message travels under one UCX AM id with a small wire header
 * (magic, msg id, user header length) in front of the user header, so the
 * dispatch table, the size checks and the "unknown id" counter are ours,
 * not UCX's.  UCX picks eager or rendezvous; a rendezvous payload is pulled
 * into a buffer the handler's alloc callback chose (a registered staging
 * region when it lies in one) or into malloc'ed memory.
 */
#include "daemon/peer/peer_int.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>

/* A rendezvous receive in flight. */
struct dte_peer_recv_op {
	dte_peer_t *peer;
	unsigned    msg_id;
	void       *buf;
	size_t      len;
	int         owned;      /* buf is ours to free */
	size_t      hdr_len;
	uint8_t     hdr[];
};

int dte_peer_handler_set(dte_peer_ctx_t *ctx, unsigned msg_id,
                         dte_peer_recv_cb recv_cb, dte_peer_alloc_cb alloc_cb,
                         void *arg)
{
	if (!ctx || msg_id >= DTE_PEER_MSG_ID_MAX || (!recv_cb && alloc_cb))
		return -EINVAL;
	ctx->handlers[msg_id].recv_cb = recv_cb;
	ctx->handlers[msg_id].alloc_cb = alloc_cb;
	ctx->handlers[msg_id].arg = arg;
	return 0;
}

static void peer_op_done(void *request, ucs_status_t status, void *arg)
{
	struct dte_peer_op *op = arg;
	dte_peer_t *peer = op->peer;

	if (request)
		ucp_request_free(request);
	if (status != UCS_OK) {
		peer->ctx->stats.send_failed++;
		dte_peer__log(peer->ctx, LOG_DEBUG, "send to %s: %s",
		              peer->addr, ucs_status_string(status));
	}
	if (op->cb)
		op->cb(peer, dte_peer__errno(status), op->arg);
	free(op);
	dte_peer__unref(peer);
}

void dte_peer__ops_complete_deferred(dte_peer_ctx_t *ctx)
{
	struct dte_peer_op *op;

	while ((op = ctx->done)) {
		ctx->done = op->next;
		peer_op_done(NULL, UCS_OK, op);
	}
}

int dte_peer__send(dte_peer_t *peer, unsigned am_id,
                   const void *h1, size_t l1, const void *h2, size_t l2,
                   const struct iovec *iov, int iovcnt,
                   dte_peer_send_cb cb, void *arg)
{
	dte_peer_ctx_t *ctx = peer->ctx;
	ucp_request_param_t param = {
		.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
		                UCP_OP_ATTR_FIELD_USER_DATA |
		                UCP_OP_ATTR_FIELD_FLAGS,
		/* REPLY lets the receiver map the message to its endpoint. */
		.flags = UCP_AM_SEND_FLAG_REPLY,
		.cb.send = peer_op_done,
	};
	struct dte_peer_op *op;
	const void *buf = NULL;
	size_t count = 0, total = 0;
	ucs_status_ptr_t req;
	int i;

	if (!peer->ep)
		return -ENOTCONN;
	if (l1 + l2 > ctx->max_am_header)
		return -EMSGSIZE;
	op = calloc(1, sizeof(*op) + (size_t)iovcnt * sizeof(ucp_dt_iov_t) +
	               l1 + l2);
	if (!op)
		return -ENOMEM;
	op->peer = peer;
	op->cb = cb;
	op->arg = arg;
	op->iov = (ucp_dt_iov_t *)(op + 1);
	op->hdr = (uint8_t *)(op->iov + iovcnt);
	op->hdr_len = l1 + l2;
	if (l1)
		memcpy(op->hdr, h1, l1);
	if (l2)
		memcpy(op->hdr + l1, h2, l2);
	for (i = 0; i < iovcnt; i++) {
		op->iov[i].buffer = iov[i].iov_base;
		op->iov[i].length = iov[i].iov_len;
		total += iov[i].iov_len;
	}
	if (iovcnt == 1) {
		ucp_mem_h memh = dte_peer__mem_find(ctx, iov[0].iov_base,
		                                    iov[0].iov_len);

		buf = iov[0].iov_base;
		count = iov[0].iov_len;
		if (memh) {
			param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
			param.memh = memh;
		}
	} else if (iovcnt > 1) {
		param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
		param.datatype = ucp_dt_make_iov();
		buf = op->iov;
		count = (size_t)iovcnt;
	}
	param.user_data = op;

	dte_peer__ref(peer);
	req = ucp_am_send_nbx(peer->ep, am_id, op->hdr, op->hdr_len, buf, count,
	                      &param);
	if (UCS_PTR_IS_ERR(req)) {
		ctx->stats.send_failed++;
		dte_peer__log(ctx, LOG_WARNING, "send to %s: %s", peer->addr,
		              ucs_status_string(UCS_PTR_STATUS(req)));
		free(op);
		dte_peer__unref(peer);
		return dte_peer__errno(UCS_PTR_STATUS(req));
	}
	if (req == NULL) {
		/* Done already; the callback still runs from the loop, never
		 * inside this call. */
		op->next = ctx->done;
		ctx->done = op;
	}
	if (am_id == DTE_PEER_AM_MSG) {
		ctx->stats.msgs_sent++;
		ctx->stats.bytes_sent += total;
	}
	return 0;
}

int dte_peer_send(dte_peer_t *peer, unsigned msg_id,
                  const void *header, size_t header_len,
                  const struct iovec *iov, int iovcnt,
                  dte_peer_send_cb cb, void *arg)
{
	struct dte_peer_wire_hdr wh;
	int i;

	if (!peer || msg_id >= DTE_PEER_MSG_ID_MAX || (header_len && !header) ||
	    iovcnt < 0 || iovcnt > DTE_PEER_IOV_MAX || (iovcnt && !iov))
		return -EINVAL;
	for (i = 0; i < iovcnt; i++)
		if (iov[i].iov_len && !iov[i].iov_base)
			return -EINVAL;
	if (header_len > DTE_PEER_HEADER_MAX ||
	    sizeof(wh) + header_len > peer->ctx->max_am_header)
		return -EMSGSIZE;
	if (peer->state != DTE_PEER_UP)
		return -ENOTCONN;
	wh.magic = DTE_PEER_MAGIC;
	wh.msg_id = (uint16_t)msg_id;
	wh.hdr_len = (uint16_t)header_len;
	return dte_peer__send(peer, DTE_PEER_AM_MSG, &wh, sizeof(wh), header,
	                      header_len, iov, iovcnt, cb, arg);
}

void *dte_peer_take(dte_peer_ctx_t *ctx, const void *data)
{
	void *p;

	if (!ctx || !data || ctx->lend != data)
		return NULL;
	p = ctx->lend;
	ctx->lend = NULL;
	return p;
}

static void peer_deliver(dte_peer_ctx_t *ctx, dte_peer_t *peer,
                         unsigned msg_id, const void *hdr, size_t hdr_len,
                         void *data, size_t len)
{
	struct dte_peer_handler *h = &ctx->handlers[msg_id];

	ctx->stats.msgs_recv++;
	ctx->stats.bytes_recv += len;
	h->recv_cb(peer, msg_id, hdr, hdr_len, data, len, h->arg);
}

static void peer_recv_done(void *request, ucs_status_t status, size_t length,
                           void *arg)
{
	struct dte_peer_recv_op *op = arg;
	dte_peer_t *peer = op->peer;
	dte_peer_ctx_t *ctx = peer->ctx;

	if (request)
		ucp_request_free(request);
	if (status != UCS_OK || length != op->len) {
		ctx->stats.recv_failed++;
		dte_peer__log(ctx, LOG_WARNING,
		              "message %u from %s: rendezvous fetch failed: %s",
		              op->msg_id, peer->addr, ucs_status_string(status));
	} else if (!ctx->handlers[op->msg_id].recv_cb) {
		/* Handler removed while the data was in flight. */
		ctx->stats.dropped_unknown++;
	} else {
		void *outer = ctx->lend;

		ctx->stats.rndv_recv++;
		if (!op->owned)
			ctx->stats.staged_recv++;
		ctx->lend = op->owned ? op->buf : NULL;
		peer_deliver(ctx, peer, op->msg_id, op->hdr, op->hdr_len,
		             op->buf, op->len);
		if (op->owned && ctx->lend != op->buf)
			op->owned = 0;	/* the handler took it (dte_peer_take) */
		ctx->lend = outer;
	}
	if (op->owned)
		free(op->buf);
	free(op);
	dte_peer__unref(peer);
}

/* Memory of its own for a large message (a dense part, tens of MiB, that
 * the engine keeps as it is): on transparent huge pages where the kernel
 * allows them, so the receive faults once per 2 MiB instead of once per
 * 4 KiB (filling a fresh 32 MiB buffer: 25-34 ms with 4 KiB pages, 9-10
 * ms with huge pages, one core).  Freed with free() like any other. */
#define RECV_HUGE ((size_t)2 << 20)

static void *recv_alloc(size_t len)
{
	size_t c;
	void *p;

	if (len < 8 * RECV_HUGE)
		return malloc(len ? len : 1);
	c = (len + RECV_HUGE - 1) / RECV_HUGE * RECV_HUGE;
	if (!(p = aligned_alloc(RECV_HUGE, c)))
		return NULL;
	/* No MADV_HUGEPAGE: see daemon/bufpool.c (direct compaction cost
	 * more than the faults it saved, measured end to end). */
	return p;
}

static ucs_status_t peer_recv_rndv(dte_peer_ctx_t *ctx, dte_peer_t *peer,
                                   unsigned msg_id, const void *hdr,
                                   size_t hdr_len, void *desc, size_t len,
                                   void *dst)
{
	ucp_request_param_t param = {
		.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
		                UCP_OP_ATTR_FIELD_USER_DATA |
		                UCP_OP_ATTR_FIELD_RECV_INFO,
		.cb.recv_am = peer_recv_done,
	};
	struct dte_peer_recv_op *op;
	ucs_status_ptr_t req;
	size_t got = 0;
	ucp_mem_h memh;

	op = malloc(sizeof(*op) + hdr_len);
	if (!op)
		goto nomem;
	op->owned = 0;
	if (!dst) {
		if (len > ctx->params.max_recv) {
			dte_peer__log(ctx, LOG_WARNING,
			              "message %u from %s: %zu bytes over the %zu cap",
			              msg_id, peer->addr, len, ctx->params.max_recv);
			ctx->stats.dropped_bad++;
			free(op);
			return UCS_ERR_MESSAGE_TRUNCATED;
		}
		dst = recv_alloc(len);
		if (!dst) {
			free(op);
			goto nomem;
		}
		op->owned = 1;
	}
	op->peer = peer;
	op->msg_id = msg_id;
	op->buf = dst;
	op->len = len;
	op->hdr_len = hdr_len;
	memcpy(op->hdr, hdr, hdr_len);
	memh = dte_peer__mem_find(ctx, dst, len);
	if (memh) {
		param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
		param.memh = memh;
	}
	param.user_data = op;
	param.recv_info.length = &got;
	dte_peer__ref(peer);
	req = ucp_am_recv_data_nbx(ctx->worker, desc, dst, len, &param);
	if (UCS_PTR_IS_ERR(req))
		peer_recv_done(NULL, UCS_PTR_STATUS(req), 0, op);
	else if (req == NULL)
		peer_recv_done(NULL, UCS_OK, got, op);
	/* UCX owns desc once the receive has been started. */
	return UCS_OK;

nomem:
	ctx->stats.recv_failed++;
	dte_peer__log(ctx, LOG_ERR, "message %u from %s: no memory for %zu bytes",
	              msg_id, peer->addr, len);
	return UCS_ERR_NO_MEMORY;
}

ucs_status_t dte_peer__msg_cb(void *arg, const void *header,
                              size_t header_len, void *data, size_t len,
                              const ucp_am_recv_param_t *param)
{
	dte_peer_ctx_t *ctx = arg;
	int rndv = !!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV);
	/* A dropped rendezvous message fails the sender's send; an eager one
	 * can only be dropped silently. */
	ucs_status_t drop = rndv ? UCS_ERR_REJECTED : UCS_OK;
	struct dte_peer_wire_hdr wh;
	struct dte_peer_handler *h;
	dte_peer_t *peer = NULL;
	const uint8_t *uhdr;
	void *dst = NULL;

	if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
		peer = dte_peer__find(ctx, param->reply_ep);
	if (!peer || peer->state != DTE_PEER_UP) {
		ctx->stats.dropped_bad++;
		dte_peer__log(ctx, LOG_WARNING,
		              "message from %s peer dropped",
		              peer ? "a not yet greeted" : "an unknown");
		return drop;
	}
	if (header_len < sizeof(wh)) {
		ctx->stats.dropped_bad++;
		dte_peer__log(ctx, LOG_WARNING, "message from %s: header of %zu bytes "
		              "is too short", peer->addr, header_len);
		return drop;
	}
	memcpy(&wh, header, sizeof(wh));
	if (wh.magic != DTE_PEER_MAGIC || wh.hdr_len > DTE_PEER_HEADER_MAX ||
	    header_len != sizeof(wh) + wh.hdr_len) {
		ctx->stats.dropped_bad++;
		dte_peer__log(ctx, LOG_WARNING, "message from %s: malformed header "
		              "(%zu bytes, claims %u)", peer->addr, header_len,
		              wh.hdr_len);
		return drop;
	}
	if (wh.msg_id >= DTE_PEER_MSG_ID_MAX ||
	    !ctx->handlers[wh.msg_id].recv_cb) {
		ctx->stats.dropped_unknown++;
		dte_peer__log(ctx, LOG_WARNING, "message id %u from %s: no handler, "
		              "dropped", wh.msg_id, peer->addr);
		return drop;
	}
	h = &ctx->handlers[wh.msg_id];
	uhdr = (const uint8_t *)header + sizeof(wh);
	if (h->alloc_cb)
		dst = h->alloc_cb(peer, wh.msg_id, uhdr, wh.hdr_len, len, h->arg);
	if (rndv)
		return peer_recv_rndv(ctx, peer, wh.msg_id, uhdr, wh.hdr_len,
		                      data, len, dst);
	if (dst) {
		if (len)
			memcpy(dst, data, len);
		ctx->stats.staged_recv++;
		data = dst;
	}
	peer_deliver(ctx, peer, wh.msg_id, uhdr, wh.hdr_len, data, len);
	return UCS_OK;
}

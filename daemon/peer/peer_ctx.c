/* daemon/peer/peer_ctx.c — UCP context + worker driven by a libuv loop.
 *
 * The worker's event fd sits in a uv_poll; a uv_prepare drains progress and
 * re-arms the worker before every loop sleep, because ucp_worker_arm only
 * succeeds once nothing is pending (UCS_ERR_BUSY means "progress again").
 * Work that must not run inside UCX callbacks (force-closing failed
 * endpoints, reporting peers down, completing sends that finished at once)
 * is done from these two uv callbacks, after progress.
 */
#include "daemon/peer/peer_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DTE_PEER_MAX_RECV_DEFAULT ((size_t)1 << 30)

static void peer_ctx_finish(dte_peer_ctx_t *ctx);

/* Progress until UCX has nothing more to do, then run deferred work. */
static void peer_ctx_drain(dte_peer_ctx_t *ctx)
{
	while (ucp_worker_progress(ctx->worker))
		;
	dte_peer__reap(ctx);
}

static void peer_ctx_poll_cb(uv_poll_t *handle, int status, int events)
{
	dte_peer_ctx_t *ctx = handle->data;

	if (!ctx->worker)
		return;
	if (status < 0)
		dte_peer__log(ctx, LOG_WARNING, "poll on worker fd: %s",
		              uv_strerror(status));
	peer_ctx_drain(ctx);
	if (ctx->closing && !ctx->peers && !ctx->reap)
		peer_ctx_finish(ctx);
}

static void peer_ctx_prepare_cb(uv_prepare_t *handle)
{
	dte_peer_ctx_t *ctx = handle->data;
	ucs_status_t st;

	while (ctx->worker) {
		peer_ctx_drain(ctx);
		if (ctx->closing && !ctx->peers && !ctx->reap) {
			peer_ctx_finish(ctx);
			return;
		}
		st = ucp_worker_arm(ctx->worker);
		if (st == UCS_ERR_BUSY)
			continue;
		if (st != UCS_OK)
			dte_peer__log(ctx, LOG_ERR, "ucp_worker_arm: %s",
			              ucs_status_string(st));
		return;
	}
}

static void peer_ctx_handle_closed(uv_handle_t *handle)
{
	dte_peer_ctx_t *ctx = handle->data;

	if (--ctx->handles_open == 0 && ctx->close_cb)
		ctx->close_cb(ctx);
}

static void peer_ctx_set_am(dte_peer_ctx_t *ctx, unsigned id,
                            ucp_am_recv_callback_t cb, ucs_status_t *st)
{
	ucp_am_handler_param_t hp = {
		.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
		              UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
		              UCP_AM_HANDLER_PARAM_FIELD_CB |
		              UCP_AM_HANDLER_PARAM_FIELD_ARG,
		.id = id,
		.flags = UCP_AM_FLAG_WHOLE_MSG,
		.cb = cb,
		.arg = ctx,
	};

	if (*st == UCS_OK)
		*st = ucp_worker_set_am_recv_handler(ctx->worker, &hp);
}

int dte_peer_ctx_init(dte_peer_ctx_t *ctx, uv_loop_t *loop,
                      const dte_peer_params_t *params)
{
	ucp_params_t up = {
		.field_mask = UCP_PARAM_FIELD_FEATURES,
		.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
	};
	ucp_worker_params_t wp = {
		.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
		.thread_mode = UCS_THREAD_MODE_SINGLE,
	};
	ucp_worker_attr_t wa = {
		.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER,
	};
	ucp_config_t *config = NULL;
	ucs_status_t st;
	int rc;

	if (!ctx || !loop)
		return -EINVAL;
	memset(ctx, 0, sizeof(*ctx));
	if (params)
		ctx->params = *params;
	if (!(ctx->params.field_mask & DTE_PEER_PARAM_FIELD_NODE_ID))
		ctx->params.node_id = 0;
	if (ctx->params.field_mask & DTE_PEER_PARAM_FIELD_NODE_NAME) {
		if (!ctx->params.node_name ||
		    strlen(ctx->params.node_name) >= DTE_PEER_NAME_MAX)
			return -EINVAL;
		strcpy(ctx->node_name, ctx->params.node_name);
	}
	ctx->params.node_name = ctx->node_name;
	if (!(ctx->params.field_mask & DTE_PEER_PARAM_FIELD_UP_CB))
		ctx->params.up_cb = NULL;
	if (!(ctx->params.field_mask & DTE_PEER_PARAM_FIELD_DOWN_CB))
		ctx->params.down_cb = NULL;
	if (!(ctx->params.field_mask & DTE_PEER_PARAM_FIELD_USER_DATA))
		ctx->params.user_data = NULL;
	if (!(ctx->params.field_mask & DTE_PEER_PARAM_FIELD_LOG_CB))
		ctx->params.log_cb = NULL;
	if (!(ctx->params.field_mask & DTE_PEER_PARAM_FIELD_MAX_RECV) ||
	    ctx->params.max_recv == 0)
		ctx->params.max_recv = DTE_PEER_MAX_RECV_DEFAULT;
	ctx->loop = loop;
	ctx->efd = -1;

	/* A daemon restarted on its fixed port finds the old one's accepted
	 * connections in TIME_WAIT for about 60 s; without SO_REUSEADDR the
	 * tcp sockcm's bind then fails (EADDRINUSE) and the new daemon has no
	 * listener.  UCX 1.13 keeps it off by default (ucx_info -c:
	 * UCX_TCP_CM_REUSEADDR=n) and reads it from the environment when the
	 * sockcm component opens (ucp_config_modify does not reach it), so set
	 * it there before UCX starts, unless the operator set it. */
	if (setenv("UCX_TCP_CM_REUSEADDR", "y", 0) < 0)
		dte_peer__log(ctx, LOG_WARNING, "cannot set UCX_TCP_CM_REUSEADDR: %s",
		              strerror(errno));
	st = ucp_config_read(NULL, NULL, &config);
	if (st != UCS_OK)
		goto ucx_error;
	st = ucp_init(&up, config, &ctx->ucp);
	ucp_config_release(config);
	if (st != UCS_OK)
		goto ucx_error;
	st = ucp_worker_create(ctx->ucp, &wp, &ctx->worker);
	if (st != UCS_OK)
		goto cleanup_ucp;
	st = ucp_worker_query(ctx->worker, &wa);
	if (st != UCS_OK)
		goto cleanup_worker;
	ctx->max_am_header = wa.max_am_header;
	if (ctx->max_am_header < sizeof(struct dte_peer_hello)) {
		dte_peer__log(ctx, LOG_ERR, "UCX allows only %zu header bytes",
		              ctx->max_am_header);
		st = UCS_ERR_UNSUPPORTED;
		goto cleanup_worker;
	}
	peer_ctx_set_am(ctx, DTE_PEER_AM_HELLO, dte_peer__hello_cb, &st);
	peer_ctx_set_am(ctx, DTE_PEER_AM_MSG, dte_peer__msg_cb, &st);
	if (st != UCS_OK)
		goto cleanup_worker;
	st = ucp_worker_get_efd(ctx->worker, &ctx->efd);
	if (st != UCS_OK)
		goto cleanup_worker;

	rc = uv_poll_init(loop, &ctx->poll, ctx->efd);
	if (rc < 0) {
		dte_peer__log(ctx, LOG_ERR, "uv_poll_init: %s", uv_strerror(rc));
		goto cleanup_worker_rc;
	}
	ctx->poll.data = ctx;
	uv_prepare_init(loop, &ctx->prepare);
	ctx->prepare.data = ctx;
	ctx->handles_open = 2;
	uv_poll_start(&ctx->poll, UV_READABLE, peer_ctx_poll_cb);
	uv_prepare_start(&ctx->prepare, peer_ctx_prepare_cb);
	return 0;

cleanup_worker:
	rc = dte_peer__errno(st);
	dte_peer__log(ctx, LOG_ERR, "UCX worker setup: %s", ucs_status_string(st));
cleanup_worker_rc:
	ucp_worker_destroy(ctx->worker);
	ctx->worker = NULL;
	ucp_cleanup(ctx->ucp);
	ctx->ucp = NULL;
	return rc;
cleanup_ucp:
	ucp_cleanup(ctx->ucp);
	ctx->ucp = NULL;
ucx_error:
	dte_peer__log(ctx, LOG_ERR, "UCX init: %s", ucs_status_string(st));
	return dte_peer__errno(st);
}

/* Every peer is gone: release UCX, then the uv handles (the poll first
 * leaves epoll, so destroying the worker's fd afterwards is safe).  The
 * listener lives until here, refusing newcomers: UCX 1.13's tcp sockcm
 * crashes in its async thread when a listener is destroyed while a
 * connection it accepted is still being set up. */
static void peer_ctx_finish(dte_peer_ctx_t *ctx)
{
	dte_peer_mem_t *m;

	if (ctx->listener) {
		ucp_listener_destroy(ctx->listener);
		ctx->listener = NULL;
	}
	uv_close((uv_handle_t *)&ctx->poll, peer_ctx_handle_closed);
	uv_close((uv_handle_t *)&ctx->prepare, peer_ctx_handle_closed);
	while ((m = ctx->mems)) {
		ctx->mems = m->next;
		ucp_mem_unmap(ctx->ucp, m->memh);
		free(m);
	}
	ucp_worker_destroy(ctx->worker);
	ctx->worker = NULL;
	ucp_cleanup(ctx->ucp);
	ctx->ucp = NULL;
}

int dte_peer_ctx_close(dte_peer_ctx_t *ctx, dte_peer_ctx_close_cb cb)
{
	dte_peer_t *p, *next;

	if (!ctx || !ctx->worker || ctx->closing)
		return -EINVAL;
	ctx->closing = 1;
	ctx->close_cb = cb;
	for (p = ctx->peers; p; p = next) {
		next = p->next;
		if (p->state != DTE_PEER_CLOSING)
			dte_peer_close(p);
	}
	/* The listener goes in peer_ctx_finish, once every peer is down. */
	return 0;
}

void dte_peer_ctx_stats(const dte_peer_ctx_t *ctx, dte_peer_stats_t *out)
{
	if (ctx && out)
		*out = ctx->stats;
}

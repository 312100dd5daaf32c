/* daemon/engine_io_uv.c — the sync engine's I/O over libuv and the router
 * (daemon/engine_io.h): what dted and the unit tests that run a loop
 * give their engine.  The clock is uv_hrtime, timers are uv_timer_t,
 * workers libuv's thread pool, the wake daemon/wake.h's, the directory
 * watch daemon/storage/watch.h's, and the transport is route.c, which is
 * process-level (one receiver at a time: the engine made last).
 *
 * Handles are this file's memory: a timer, wake or watch the engine frees
 * is closed here and its memory goes once libuv lets go of it; fini runs
 * the loop until it has.
 */
#include <errno.h>
#include <stdlib.h>
#include <uv.h>
#include "daemon/engine_io.h"
#include "daemon/job.h"
#include "daemon/log.h"
#include "daemon/route.h"
#include "daemon/storage/watch.h"
#include "daemon/wake.h"

struct io_uv {
	uv_loop_t *loop;
	int closing;		/* handles closed, libuv not done with them */
	struct uv_wk_wake *wakes_closing;
};

struct dte_timer {
	uv_timer_t t;
	struct io_uv *u;
	void (*cb)(void *arg);
	void *arg;
};

struct uv_wk_wake {
	struct dwake w;		/* first: the dwake callback's pointer is ours */
	void (*cb)(void *arg);
	void *arg;
	struct uv_wk_wake *next;	/* io_uv.wakes_closing */
};

struct dte_watch {
	struct dts_watch w;
	struct io_uv *u;
	void (*cb)(void *arg);
	void *arg;
};

struct uv_wk_req {
	uv_work_t req;
	struct dte_work *w;
};

static uint64_t io_now(void *ctx)
{
	(void)ctx;
	return uv_hrtime();
}

/* ------------------------------------------------------------------ timers */

static void on_timer(uv_timer_t *h)
{
	struct dte_timer *t = h->data;

	if (t->cb)
		t->cb(t->arg);
}

static void on_closed(uv_handle_t *h)
{
	struct dte_timer *t = h->data;

	t->u->closing--;
	free(t);
}

static struct dte_timer *io_timer_new(void *ctx, void (*cb)(void *arg), void *arg)
{
	struct io_uv *u = ctx;
	struct dte_timer *t = calloc(1, sizeof(*t));
	int rc;

	if (!t)
		return NULL;
	if ((rc = uv_timer_init(u->loop, &t->t)) < 0) {
		DLOG_E("engine timer: %s", uv_strerror(rc));
		free(t);
		return NULL;
	}
	t->t.data = t;
	t->u = u;
	t->cb = cb;
	t->arg = arg;
	return t;
}

static void io_timer_start(void *ctx, struct dte_timer *t, uint64_t timeout_ms, uint64_t repeat_ms)
{
	(void)ctx;
	uv_timer_start(&t->t, on_timer, timeout_ms, repeat_ms);
}

static void io_timer_stop(void *ctx, struct dte_timer *t)
{
	(void)ctx;
	uv_timer_stop(&t->t);
}

static void io_timer_free(void *ctx, struct dte_timer *t)
{
	(void)ctx;
	if (!t)
		return;
	t->cb = NULL;
	t->u->closing++;
	uv_close((uv_handle_t *)&t->t, on_closed);
}

/* ------------------------------------------------------------------ workers */

static void on_work(uv_work_t *req)
{
	struct uv_wk_req *r = req->data;

	r->w->run(r->w);
}

static void on_work_after(uv_work_t *req, int status)
{
	struct uv_wk_req *r = req->data;
	struct dte_work *w = r->w;

	w->io_priv = NULL;
	free(r);
	w->after(w, status == UV_ECANCELED);
}

static int io_work_queue(void *ctx, struct dte_work *w)
{
	struct io_uv *u = ctx;
	struct uv_wk_req *r = calloc(1, sizeof(*r));
	int rc;

	if (!r)
		return -ENOMEM;
	r->req.data = r;
	r->w = w;
	w->io_priv = r;
	if ((rc = uv_queue_work(u->loop, &r->req, on_work, on_work_after)) < 0) {
		w->io_priv = NULL;
		free(r);
		return rc;
	}
	return 0;
}

static int io_work_cancel(void *ctx, struct dte_work *w)
{
	struct uv_wk_req *r = w->io_priv;

	(void)ctx;
	if (!r)
		return -EBUSY;
	return uv_cancel((uv_req_t *)&r->req);
}

static int io_run(void *ctx, int block)
{
	struct io_uv *u = ctx;

	return uv_run(u->loop, block ? UV_RUN_ONCE : UV_RUN_NOWAIT);
}

/* ------------------------------------------------------------------ wake */

static void on_wake(struct dwake *dw)
{
	struct uv_wk_wake *w = (struct uv_wk_wake *)dw;

	w->cb(w->arg);
}

static void reap_wakes(struct io_uv *u)
{
	for (struct uv_wk_wake **pp = &u->wakes_closing; *pp;) {
		struct uv_wk_wake *w = *pp;

		if (dwake_closing(&w->w)) {
			pp = &w->next;
			continue;
		}
		*pp = w->next;
		free(w);
	}
}

static struct dte_wake *io_wake_new(void *ctx, void (*cb)(void *arg), void *arg)
{
	struct io_uv *u = ctx;
	struct uv_wk_wake *w = calloc(1, sizeof(*w));
	int rc;

	if (!w)
		return NULL;
	w->cb = cb;
	w->arg = arg;
	if ((rc = dwake_init(u->loop, &w->w, on_wake)) < 0) {
		DLOG_E("engine wake: %s", uv_strerror(rc));
		if (dwake_closing(&w->w)) {
			w->next = u->wakes_closing;
			u->wakes_closing = w;
		} else {
			free(w);
		}
		return NULL;
	}
	return (struct dte_wake *)w;
}

static void io_wake_send(void *ctx, struct dte_wake *w)
{
	(void)ctx;
	dwake_send(&((struct uv_wk_wake *)w)->w);
}

static void io_wake_free(void *ctx, struct dte_wake *dw)
{
	struct io_uv *u = ctx;
	struct uv_wk_wake *w = (struct uv_wk_wake *)dw;

	if (!w)
		return;
	dwake_close(&w->w);
	w->next = u->wakes_closing;
	u->wakes_closing = w;
	reap_wakes(u);
}

/* ------------------------------------------------------------------ watch */

static void on_watch(struct dts_watch *dw)
{
	struct dte_watch *w = dw->data;

	if (w->cb)
		w->cb(w->arg);
}

static void on_watch_closed(struct dts_watch *dw)
{
	struct dte_watch *w = dw->data;

	w->u->closing--;
	free(w);
}

static int io_watch_new(void *ctx, const char *dir, int mode, uint64_t interval_ms,
			void (*cb)(void *arg), void *arg, struct dte_watch **out)
{
	struct io_uv *u = ctx;
	struct dte_watch *w = calloc(1, sizeof(*w));
	int rc;

	if (!w)
		return -ENOMEM;
	w->u = u;
	w->cb = cb;
	w->arg = arg;
	if ((rc = dts_watch_start(&w->w, u->loop, dir, (enum dts_watch_mode)mode, interval_ms,
				  on_watch, w)) < 0) {
		/* dts_watch_start closed what it had opened (close_cb NULL):
		 * the loop must let go of it before w goes. */
		if (!w->w.open_handles) {
			free(w);
			return rc;
		}
		w->cb = NULL;
		u->closing++;
		dts_watch_stop(&w->w, on_watch_closed);
		return rc;
	}
	*out = w;
	return 0;
}

static void io_watch_free(void *ctx, struct dte_watch *w)
{
	(void)ctx;
	if (!w)
		return;
	w->cb = NULL;
	w->u->closing++;
	dts_watch_stop(&w->w, on_watch_closed);
}

/* ------------------------------------------------------------------ transport */

static int io_send(void *ctx, const char *node, const char *address, Dtep__PeerMsgType type,
		   const ProtobufCMessage *msg, const void *data, size_t len)
{
	(void)ctx;
	return route_send(node, address, type, msg, data, len);
}

static int io_send_given(void *ctx, const char *node, const char *address,
			 Dtep__PeerMsgType type, const ProtobufCMessage *msg, void *data,
			 size_t len, void (*release)(void *data, void *rarg), void *rarg)
{
	(void)ctx;
	return route_send_given(node, address, type, msg, data, len, release, rarg);
}

static void *io_take_data(void *ctx, const void *data)
{
	(void)ctx;
	return route_take_data(data);
}

static const char *io_self_node(void *ctx)
{
	(void)ctx;
	return route_self_node();
}

static const char *io_self_address(void *ctx)
{
	(void)ctx;
	return route_self_address();
}

static int io_is_self(void *ctx, const char *node, const char *address)
{
	(void)ctx;
	return route_is_self(node, address);
}

static int io_node_is_at(void *ctx, const char *node, const char *address)
{
	(void)ctx;
	return route_node_is_at(node, address);
}

static unsigned long long io_record_key(void *ctx, const uint8_t *hdr, size_t hdrlen)
{
	(void)ctx;
	return route_record_key(hdr, hdrlen);
}

static void io_attach(void *ctx, dte_io_recv_fn recv, dte_io_down_fn down, dte_io_seal_fn seal,
		      void *engine)
{
	(void)ctx;
	route_set_receiver(recv, down, engine);
	route_set_sealer(seal, engine);
}

static void io_detach(void *ctx, void *engine)
{
	(void)ctx;
	route_unset(engine);
}

/* ------------------------------------------------------------------ the end */

static void io_fini(void *ctx)
{
	struct io_uv *u = ctx;

	if (u->loop) {
		reap_wakes(u);
		while (u->closing || u->wakes_closing) {
			uv_run(u->loop, UV_RUN_NOWAIT);
			reap_wakes(u);
		}
	}
	free(u);
}

int dte_engine_io_uv(uv_loop_t *loop, struct dte_engine_io *io)
{
	struct io_uv *u = calloc(1, sizeof(*u));

	if (!u)
		return -ENOMEM;
	u->loop = loop;
	*io = (struct dte_engine_io){
		.ctx = u,
		.now_ns = io_now,
		.send = io_send,
		.send_given = io_send_given,
		.take_data = io_take_data,
		.self_node = io_self_node,
		.self_address = io_self_address,
		.is_self = io_is_self,
		.node_is_at = io_node_is_at,
		.record_key = io_record_key,
		.attach = io_attach,
		.detach = io_detach,
		.fini = io_fini,
	};
	if (loop) {
		io->timer_new = io_timer_new;
		io->timer_start = io_timer_start;
		io->timer_stop = io_timer_stop;
		io->timer_free = io_timer_free;
		io->work_queue = io_work_queue;
		io->work_cancel = io_work_cancel;
		io->run = io_run;
		io->wake_new = io_wake_new;
		io->wake_send = io_wake_send;
		io->wake_free = io_wake_free;
		io->watch_new = io_watch_new;
		io->watch_free = io_watch_free;
	}
	return 0;
}

struct dte_engine *dte_engine_new(uv_loop_t *loop, const struct dtc_backend *be,
				  const char *backend_name)
{
	struct dte_engine_io io;

	if (dte_engine_io_uv(loop, &io) < 0) {
		DLOG_E("sync engine: out of memory");
		return NULL;
	}
	return dte_engine_new_io(&io, be, backend_name);
}

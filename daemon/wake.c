/* daemon/wake.c — see wake.h. */
#include <errno.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include "daemon/wake.h"

static void on_readable(uv_poll_t *h, int status, int events)
{
	struct dwake *w = h->data;
	uint64_t n;

	(void)status;
	(void)events;
	/* Drained before the flag is cleared: a send after the clear writes
	 * again, and that write is not read here. */
	while (read(w->fd, &n, sizeof(n)) < 0 && errno == EINTR)
		;
	__atomic_store_n(&w->pending, 0, __ATOMIC_SEQ_CST);
	w->cb(w);
}

static void on_closed(uv_handle_t *h);

int dwake_init(uv_loop_t *loop, struct dwake *w, dwake_cb cb)
{
	int e;

	w->init = 0;
	w->closing = 0;
	w->pending = 0;
	w->cb = cb;
	if ((w->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
		return -errno;
	if ((e = uv_poll_init(loop, &w->poll, w->fd)) < 0) {
		close(w->fd);
		w->fd = -1;
		return e;
	}
	w->poll.data = w;
	if ((e = uv_poll_start(&w->poll, UV_READABLE, on_readable)) < 0) {
		w->closing = 1;
		uv_close((uv_handle_t *)&w->poll, on_closed);	/* closes the fd */
		return e;
	}
	w->init = 1;
	return 0;
}

void dwake_send(struct dwake *w)
{
	static const uint64_t one = 1;

	if (__atomic_exchange_n(&w->pending, 1, __ATOMIC_SEQ_CST))
		return;
	/* An eventfd's counter cannot overflow on 1s: EAGAIN never comes. */
	while (write(w->fd, &one, sizeof(one)) < 0 && errno == EINTR)
		;
}

static void on_closed(uv_handle_t *h)
{
	struct dwake *w = h->data;

	close(w->fd);
	w->fd = -1;
	w->closing = 0;
}

void dwake_close(struct dwake *w)
{
	if (!w->init)
		return;
	w->init = 0;
	w->closing = 1;
	uv_close((uv_handle_t *)&w->poll, on_closed);
}

int dwake_closing(const struct dwake *w)
{
	return w->closing;
}

/* Directory watcher for storage readers: uv_fs_event or uv_timer. */
#include <string.h>
#include "daemon/storage/watch.h"

int dts_watch_mode_parse(const char *s)
{
	if (s && !strcmp(s, "inotify"))
		return DTS_WATCH_INOTIFY;
	if (s && !strcmp(s, "poll"))
		return DTS_WATCH_POLL;
	return -1;
}

static int is_manifest(const char *name)
{
	size_t n = name ? strlen(name) : 0;

	/* Temp files start with '.', committed manifests end in .manifest. */
	return n > 9 && name[0] == 'v' && !strcmp(name + n - 9, ".manifest");
}

static void on_event(uv_fs_event_t *h, const char *name, int events, int status)
{
	struct dts_watch *w = h->data;

	/* A NULL name means the kernel queue overflowed: look anyway. */
	if (status == 0 && name && !is_manifest(name))
		return;
	w->events++;
	w->cb(w);
}

static void on_timer(uv_timer_t *t)
{
	struct dts_watch *w = t->data;

	w->ticks++;
	w->cb(w);
}

int dts_watch_start(struct dts_watch *w, uv_loop_t *loop, const char *dir,
		    enum dts_watch_mode mode, uint64_t interval_ms, dts_watch_cb cb, void *data)
{
	int rc;

	if (!w || !loop || !dir || !cb || !interval_ms ||
	    (mode != DTS_WATCH_INOTIFY && mode != DTS_WATCH_POLL))
		return UV_EINVAL;
	memset(w, 0, sizeof(*w));
	w->mode = mode;
	w->cb = cb;
	w->data = data;
	if ((rc = uv_timer_init(loop, &w->timer)) < 0)
		return rc;
	w->timer.data = w;
	w->open_handles = 1;
	if (mode == DTS_WATCH_INOTIFY) {
		if ((rc = uv_fs_event_init(loop, &w->ev)) < 0)
			goto fail;
		w->ev.data = w;
		w->open_handles++;
		if ((rc = uv_fs_event_start(&w->ev, on_event, dir, 0)) < 0)
			goto fail;
	}
	if ((rc = uv_timer_start(&w->timer, on_timer, interval_ms, interval_ms)) < 0)
		goto fail;
	return 0;
fail:
	dts_watch_stop(w, NULL);
	return rc;
}

static void on_close(uv_handle_t *h)
{
	struct dts_watch *w = h->data;

	if (--w->open_handles == 0 && w->close_cb)
		w->close_cb(w);
}

void dts_watch_stop(struct dts_watch *w, dts_watch_cb close_cb)
{
	w->close_cb = close_cb;
	if (w->open_handles == 2 && !uv_is_closing((uv_handle_t *)&w->ev))
		uv_close((uv_handle_t *)&w->ev, on_close);
	if (!uv_is_closing((uv_handle_t *)&w->timer))
		uv_close((uv_handle_t *)&w->timer, on_close);
}

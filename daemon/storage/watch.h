/* daemon/storage/watch.h — wake a reader when a job directory changes.
 *
 * inotify (through libuv's uv_fs_event) on local file systems, with a slow
 * timer as a backstop; plain timer polling where change notification does
 * not cross machines (NFS, Lustre, most FUSE mounts).  The callback only
 * says "look again": the reader decides what is committed.
 */
#ifndef DTE_STORAGE_WATCH_H
#define DTE_STORAGE_WATCH_H

#include <stdint.h>
#include <uv.h>

enum dts_watch_mode { DTS_WATCH_INOTIFY = 0, DTS_WATCH_POLL = 1 };

struct dts_watch;
typedef void (*dts_watch_cb)(struct dts_watch *w);

struct dts_watch {
	uv_fs_event_t       ev;
	uv_timer_t          timer;
	enum dts_watch_mode mode;
	dts_watch_cb        cb;
	dts_watch_cb        close_cb;
	void               *data;
	int                 open_handles;
	uint64_t            events;   /* callbacks from inotify */
	uint64_t            ticks;    /* callbacks from the timer */
};

/* "inotify" or "poll"; -1 when neither. */
int dts_watch_mode_parse(const char *s);

/* Watch `dir` (which must exist).  interval_ms: poll period, or the
 * backstop period under inotify.  Returns 0 or a negative libuv error. */
int dts_watch_start(struct dts_watch *w, uv_loop_t *loop, const char *dir,
		    enum dts_watch_mode mode, uint64_t interval_ms, dts_watch_cb cb, void *data);

/* Close both handles; close_cb (may be NULL) runs once they are closed,
 * after which w may be freed. */
void dts_watch_stop(struct dts_watch *w, dts_watch_cb close_cb);

#endif

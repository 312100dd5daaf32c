/* Storage watcher: inotify wakes on a committed manifest (not on temp
 * files), polling ticks on its own; both close clean. */
#define _XOPEN_SOURCE 700
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include <uv.h>
#include "daemon/storage/watch.h"

struct ctx {
	char       dir[128];
	int        wakes, closed, step;
	uv_timer_t t;
	struct dts_watch w;
};

static void touch(const char *dir, const char *name)
{
	char p[256];
	FILE *f;

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	f = fopen(p, "w");
	assert_non_null(f);
	fclose(f);
}

static void on_wake(struct dts_watch *w)
{
	struct ctx *c = w->data;

	c->wakes++;
}

static void on_closed(struct dts_watch *w)
{
	struct ctx *c = w->data;

	c->closed++;
}

/* Steps 50 ms apart: a temp file (no wake), a rename to a manifest
 * (wake), then stop. */
static void on_step(uv_timer_t *t)
{
	struct ctx *c = t->data;
	char a[256], b[256];

	switch (c->step++) {
	case 0:
		touch(c->dir, ".v1.manifest.tmp.1");
		touch(c->dir, "readme");
		break;
	case 1:
		if (c->w.mode == DTS_WATCH_INOTIFY)
			assert_int_equal(c->wakes, 0);	/* temp files do not count */
		snprintf(a, sizeof(a), "%s/.v1.manifest.tmp.1", c->dir);
		snprintf(b, sizeof(b), "%s/v1.manifest", c->dir);
		assert_int_equal(rename(a, b), 0);
		break;
	default:
		uv_timer_stop(t);
		uv_close((uv_handle_t *)t, NULL);
		dts_watch_stop(&c->w, on_closed);
	}
}

static void run(enum dts_watch_mode mode, uint64_t interval, struct ctx *c)
{
	uv_loop_t loop;

	memset(c, 0, sizeof(*c));
	snprintf(c->dir, sizeof(c->dir), "/tmp/test_storage_watch.XXXXXX");
	assert_non_null(mkdtemp(c->dir));
	assert_int_equal(uv_loop_init(&loop), 0);
	assert_int_equal(dts_watch_start(&c->w, &loop, c->dir, mode, interval, on_wake, c), 0);
	uv_timer_init(&loop, &c->t);
	c->t.data = c;
	uv_timer_start(&c->t, on_step, 50, 50);
	uv_run(&loop, UV_RUN_DEFAULT);
	assert_int_equal(c->closed, 1);
	assert_int_equal(uv_loop_close(&loop), 0);
	unlink(strcat(strcpy((char[256]){ 0 }, c->dir), "/v1.manifest"));
	unlink(strcat(strcpy((char[256]){ 0 }, c->dir), "/readme"));
	rmdir(c->dir);
}

static void test_inotify(void **state)
{
	struct ctx c;

	/* Backstop far beyond the test: every wake comes from inotify. */
	run(DTS_WATCH_INOTIFY, 60000, &c);
	assert_true(c.wakes >= 1);
	assert_int_equal(c.w.ticks, 0);
	assert_int_equal(c.w.events, (uint64_t)c.wakes);
}

static void test_poll(void **state)
{
	struct ctx c;

	run(DTS_WATCH_POLL, 10, &c);
	assert_true(c.wakes >= 5);
	assert_int_equal(c.w.events, 0);
	assert_int_equal(c.w.ticks, (uint64_t)c.wakes);
}

static void test_bad_args(void **state)
{
	struct dts_watch w;
	uv_loop_t loop;

	assert_int_equal(dts_watch_mode_parse("inotify"), DTS_WATCH_INOTIFY);
	assert_int_equal(dts_watch_mode_parse("poll"), DTS_WATCH_POLL);
	assert_int_equal(dts_watch_mode_parse("fanotify"), -1);
	assert_int_equal(uv_loop_init(&loop), 0);
	assert_int_equal(dts_watch_start(&w, &loop, "/tmp", DTS_WATCH_POLL, 0, on_wake, NULL),
			 UV_EINVAL);
	/* A missing directory fails cleanly (the handles close). */
	assert_true(dts_watch_start(&w, &loop, "/nonexistent/dir", DTS_WATCH_INOTIFY, 100,
				    on_wake, NULL) < 0);
	uv_run(&loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_inotify),
		cmocka_unit_test(test_poll),
		cmocka_unit_test(test_bad_args),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

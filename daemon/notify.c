/* daemon/notify.c — sd_notify wrapper and watchdog timer. */
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>
#include <systemd/sd-daemon.h>
#include "daemon/log.h"
#include "daemon/notify.h"

static uv_timer_t wd_timer;
static int wd_active;

static void on_watchdog(uv_timer_t *t)
{
	sd_notify(0, "WATCHDOG=1");
}

int dnotify_init(uv_loop_t *loop)
{
	uint64_t usec = 0;
	int r = sd_watchdog_enabled(0, &usec);

	if (r < 0) {
		DLOG_W("watchdog: bad WATCHDOG_USEC/WATCHDOG_PID: %d", r);
		return 0;
	}
	if (r == 0 || usec == 0)
		return 0;
	/* Half the interval, as sd_watchdog_enabled(3) advises, never 0 ms. */
	uint64_t ms = usec / 2000;

	if (ms == 0)
		ms = 1;
	uv_timer_init(loop, &wd_timer);
	uv_timer_start(&wd_timer, on_watchdog, ms, ms);
	wd_active = 1;
	DLOG_I("watchdog: pinging systemd every %llu ms", (unsigned long long)ms);
	return 0;
}

void dnotify_fini(void)
{
	if (wd_active) {
		uv_timer_stop(&wd_timer);
		uv_close((uv_handle_t *)&wd_timer, NULL);
		wd_active = 0;
	}
}

void dnotify_ready(const char *status)
{
	sd_notifyf(0, "READY=1\nSTATUS=%s\nMAINPID=%d", status, (int)getpid());
	/* A first ping right away: the interval runs from READY. */
	if (wd_active)
		sd_notify(0, "WATCHDOG=1");
}

void dnotify_status(const char *fmt, ...)
{
	char buf[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	sd_notifyf(0, "STATUS=%s", buf);
}

void dnotify_reloading(void)
{
	sd_notify(0, "RELOADING=1");
}

void dnotify_stopping(void)
{
	sd_notify(0, "STOPPING=1\nSTATUS=shutting down");
}

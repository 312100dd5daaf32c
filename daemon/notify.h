/* daemon/notify.h — systemd service notifications (Type=notify).
 *
 * READY=1 once the control socket is bound, STATUS= lines as state
 * changes, WATCHDOG=1 at half the WATCHDOG_USEC interval, STOPPING=1 on the
 * way out.  Without NOTIFY_SOCKET every call is a cheap no-op.
 */
#ifndef DTED_NOTIFY_H
#define DTED_NOTIFY_H

#include <uv.h>

/* Starts the watchdog timer on `loop` when systemd asked for one. */
int dnotify_init(uv_loop_t *loop);
void dnotify_fini(void);

void dnotify_ready(const char *status);
void dnotify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void dnotify_reloading(void);
void dnotify_stopping(void);

#endif

/* daemon/daemonize.h — detach from the terminal, chronyd style.
 *
 * Logs go to syslog once detached.  The parent stays until the child says it is ready (socket bound) or
 * dies, so `dted` without --foreground still exits non-zero when startup
 * fails.
 */
#ifndef DTED_DAEMONIZE_H
#define DTED_DAEMONIZE_H

/* Fork; returns in the child only (the parent exits with 0 once the child
 * called ddaemon_ready, 1 if it exited first).  -1 if fork failed. */
int ddaemon_detach(void);

/* Tell the waiting parent startup succeeded (no-op when not detached). */
void ddaemon_ready(void);

#endif

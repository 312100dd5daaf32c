/* daemon/wake.h — wake the loop from a worker thread, with no spin.
 *
 * libuv's uv_async_send (1.44, Debian 12) marks the handle busy, writes
 * its eventfd, then marks it done; the loop, woken by that write, spins
 * and then sched_yield()s until the sender has marked it done
 * (uv__async_spin in src/unix/async.c).  The write's wakeup often puts
 * the loop on the sender's core and preempts the sender between the two,
 * so on a busy machine the loop gave its core away for a whole time slice
 * per wakeup: with a capture framing a part every few hundred
 * microseconds, loop_latency.py measured 38 such yields per run, each
 * 8-9 ms of a status poll's answer.  Here a sender writes an eventfd only
 * when no wakeup is pending already, and the loop never waits for a
 * sender: it drains the eventfd, clears the flag, then runs the callback,
 * which takes whatever the senders queued.  Anything queued after the
 * callback took its queue sees the flag clear and writes again. */
#ifndef DTE_WAKE_H
#define DTE_WAKE_H

#include <uv.h>

struct dwake;
typedef void (*dwake_cb)(struct dwake *w);

struct dwake {
	uv_poll_t poll;
	int fd;
	int pending;      /* a wakeup is on its way (atomic) */
	int init;
	int closing;      /* closed, its close callback not run yet */
	dwake_cb cb;
};

/* On the loop's thread.  A negative errno when no eventfd or poll handle
 * could be had (w is left unused). */
int dwake_init(uv_loop_t *loop, struct dwake *w, dwake_cb cb);

/* From any thread, once w is initialised: cb runs on the loop soon, once
 * for any number of sends before it. */
void dwake_send(struct dwake *w);

/* On the loop's thread, once nobody sends any more: the handle and the
 * eventfd are closed (the eventfd once libuv has let go of it). */
void dwake_close(struct dwake *w);

/* Nonzero from dwake_close (or a dwake_init that failed after making the
 * handle) until libuv has let go of w: its memory must live until then. */
int dwake_closing(const struct dwake *w);

#endif

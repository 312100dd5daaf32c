/* daemon/engine_io.h — everything the sync engine does to the world
 * (issue 31): its clock, its timers, its worker pool, its wake-up from a
 * worker, the storage reader's directory watch, and the peer transport
 * (records to and from other engines).
 *
 * The engine (daemon/job*.c, coord_sm/pair_sm/sink_sm.c) calls nothing of
 * libuv or of the router (daemon/route.h) itself: it is handed a struct
 * dte_engine_io at dte_engine_new_io and goes through it.  The default
 * implementation (daemon/engine_io_uv.c: libuv and route.c) is what dted
 * and the unit tests that run a loop use; a test may give a deterministic
 * one instead (a fake clock it advances, timers it fires, workers it runs
 * inline, a transport that queues records between engines), so that
 * several engines live in one process and a run is a function of its
 * seed.  tests/system/engine_api.sh checks that no engine object calls
 * uv_* or route_* (io_calls_outside_interface).
 *
 * Every member is called on the engine's thread (the loop), except
 * now_ns and wake_send (any thread: a worker's).  ctx is the
 * implementation's, passed back to every call.  A NULL member is a thing
 * the implementation does not have: no timer_new (no timers: waits only
 * end when checked, storage readers never tick), no work_queue (work runs
 * inline, on the caller's thread), no wake_new (parts are taken when the
 * capture's completion runs), no watch_new (the storage reader polls on
 * its timer only), no run (nothing to wait for: shutdown does not wait).
 */
#ifndef DTED_ENGINE_IO_H
#define DTED_ENGINE_IO_H

#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>
#include "proto/peer.pb-c.h"
#include "proto/peer_auth.h"

struct dte_timer;	/* the implementation's */
struct dte_wake;	/* the implementation's */
struct dte_watch;	/* the implementation's */

/* A unit of work for the worker pool; embedded in the engine's own
 * structures (a capture, a task, a commit).  run() on a worker touches
 * only what the work owns; after() on the loop, once: cancelled nonzero
 * when run() never ran (work_cancel). */
struct dte_work {
	void (*run)(struct dte_work *w);
	void (*after)(struct dte_work *w, int cancelled);
	void *io_priv;		/* the implementation's, while queued */
};

/* The engine's callbacks, registered with the transport at
 * dte_engine_new_io (the same contracts as route.h's route_recv_fn,
 * route_down_fn and route_seal_fn; ctx is the engine). */
typedef void (*dte_io_recv_fn)(void *ctx, const char *from_node, Dtep__PeerMsgType type,
			       const uint8_t *hdr, size_t hdrlen, const void *data, size_t len);
typedef void (*dte_io_down_fn)(void *ctx, const char *node);
typedef int (*dte_io_seal_fn)(void *ctx, Dtep__PeerMsgType type, const ProtobufCMessage *msg,
			      const void *data, size_t len, uint8_t mac[PEER_AUTH_MACBYTES]);

struct dte_engine_io {
	void *ctx;

	/* ---- clock: monotonic nanoseconds (any thread). */
	uint64_t (*now_ns)(void *ctx);

	/* ---- timers: made, started (timeout, then every repeat_ms; 0: once),
	 * stopped, freed.  cb(arg) runs on the loop; never after timer_free,
	 * which releases the timer (its memory is the implementation's). */
	struct dte_timer *(*timer_new)(void *ctx, void (*cb)(void *arg), void *arg);
	void (*timer_start)(void *ctx, struct dte_timer *t, uint64_t timeout_ms,
			    uint64_t repeat_ms);
	void (*timer_stop)(void *ctx, struct dte_timer *t);
	void (*timer_free)(void *ctx, struct dte_timer *t);

	/* ---- worker pool.  work_queue: 0, or a negative errno when the work
	 * cannot go to a worker (the caller then runs it inline).
	 * work_cancel: 0 when w had not started (its after() comes with
	 * cancelled set), else a negative errno (it runs to its end). */
	int (*work_queue)(void *ctx, struct dte_work *w);
	int (*work_cancel)(void *ctx, struct dte_work *w);
	/* Wait for something to happen (a worker's end, a timer, a record)
	 * and run its callbacks: block nonzero waits for one, 0 runs what is
	 * ready.  Shutdown's drain (job_tasks_drain).  < 0: nothing can
	 * happen any more. */
	int (*run)(void *ctx, int block);

	/* ---- wake-up from a worker (daemon/wake.h's semantics): cb(arg)
	 * runs on the loop soon after any number of wake_send. */
	struct dte_wake *(*wake_new)(void *ctx, void (*cb)(void *arg), void *arg);
	void (*wake_send)(void *ctx, struct dte_wake *w);
	void (*wake_free)(void *ctx, struct dte_wake *w);

	/* ---- a directory watch (storage readers, daemon/storage/watch.h):
	 * mode is enum dts_watch_mode; cb(arg) runs on the loop on a change
	 * or every interval_ms.  0 and *out, or a negative errno. */
	int (*watch_new)(void *ctx, const char *dir, int mode, uint64_t interval_ms,
			 void (*cb)(void *arg), void *arg, struct dte_watch **out);
	void (*watch_free)(void *ctx, struct dte_watch *w);

	/* ---- peer transport (daemon/route.h's contracts). */
	int (*send)(void *ctx, const char *node, const char *address, Dtep__PeerMsgType type,
		    const ProtobufCMessage *msg, const void *data, size_t len);
	int (*send_given)(void *ctx, const char *node, const char *address,
			  Dtep__PeerMsgType type, const ProtobufCMessage *msg, void *data,
			  size_t len, void (*release)(void *data, void *rarg), void *rarg);
	void *(*take_data)(void *ctx, const void *data);
	const char *(*self_node)(void *ctx);
	const char *(*self_address)(void *ctx);
	int (*is_self)(void *ctx, const char *node, const char *address);
	int (*node_is_at)(void *ctx, const char *node, const char *address);
	unsigned long long (*record_key)(void *ctx, const uint8_t *hdr, size_t hdrlen);
	/* The engine's receiver, node-down and sealer (engine: their ctx);
	 * detach takes those of engine off again. */
	void (*attach)(void *ctx, dte_io_recv_fn recv, dte_io_down_fn down, dte_io_seal_fn seal,
		       void *engine);
	void (*detach)(void *ctx, void *engine);

	/* ---- the end: called last by dte_engine_free (the engine's timers,
	 * wake and watches are freed already); the implementation lets go
	 * of what it still holds.  NULL: nothing to do. */
	void (*fini)(void *ctx);
};

#endif

/* tests/unit/fixture.h — N sync engines in one process on deterministic
 * I/O (issue 31; in the style of raft's raft_fixture).
 *
 * Each node is a struct dte_engine made with dte_engine_new_io and a stub
 * struct dte_engine_io (daemon/engine_io.h) that the fixture drives:
 *  - the clock is the fixture's (fx.now, nanoseconds); every step moves
 *    it on by a seeded amount, and when nothing else is ready, to the
 *    next timer;
 *  - timers fire in time order (due <= now), as steps;
 *  - work queued on "workers" waits until a step runs it inline (run,
 *    then after), in a seeded order among everything ready;
 *  - wakes are steps too;
 *  - the transport queues each record between nodes (by node name, or
 *    address for a first JOIN), sealed as route.c seals a record leaving
 *    a daemon (the engine's sealer), and delivers one per step: with
 *    seeded drop, duplicate and reorder (a record picked at random among
 *    those queued instead of the oldest).
 * A run is a function of its seed: the same seed, the same schedule.
 *
 * Timed links (fix_set_links) replace the seeded schedule with a model of
 * the network, for benchmarks: each node's NIC sends and takes its
 * records one after another at its rate, a hop costs a latency, a record
 * with data is checked by its receiver's loop at a cost per byte, and
 * records are delivered at the time that gives (work and wakes run at
 * once, in queue order; the clock moves to the next record or timer).
 *
 * Not thread-safe: everything runs on the caller's thread. */
#ifndef DTE_TEST_FIXTURE_H
#define DTE_TEST_FIXTURE_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/engine_io.h"

#define FX_MAX_NODES 4096

struct fx;

struct fx_faults {
	unsigned drop_pct;	/* % of records lost (each record: one draw) */
	unsigned dup_pct;	/* % of records delivered twice */
	unsigned reorder_pct;	/* % of deliveries that pick a random record, not the oldest */
	uint64_t max_tick_ns;	/* the clock moves 0..max_tick_ns per step (0: 100 µs) */
};

struct fix_stats {
	uint64_t steps, records, delivered, dropped, duplicated, reordered;
	uint64_t works, wakes, timers;
	uint64_t cut;		/* records lost to a partition or a node's restart */
	uint64_t data_bytes;	/* records' data sent (headers aside, not scaled) */
};

/* A fixture of n nodes (named node0..node<n-1>, at "fx:<i>") with seed
 * and faults (NULL: none).  The nodes' engines are made with
 * fx_engine_new. */
struct fx *fix_new(unsigned n, uint64_t seed, const struct fx_faults *faults);
/* Timed links (see above): every node's NIC rates in bytes per second
 * (fix_set_node_link: one node's own), one latency, and a scale: each
 * byte of a record's data stands for byte_scale bytes on the links and
 * in the receiver's check (a small model's parts standing for a large
 * one's); headers count as they are. */
struct fx_links {
	double up_Bps, down_Bps;
	uint64_t latency_ns;
	double byte_scale;
	double check_ns_per_byte;	/* the receiver's loop, per (scaled) data byte */
	/* How many of a record's len data bytes are scaled (NULL: all of
	 * them), e.g. a payload's and not a control record's. */
	size_t (*scaled)(Dtep__PeerMsgType type, const ProtobufCMessage *msg, size_t len);
};
/* 0, or -EINVAL (a rate or scale not positive, records already queued). */
int fix_set_links(struct fx *fx, const struct fx_links *links);
/* Node i's own NIC rates (0: the fixture's). */
void fix_set_node_link(struct fx *fx, unsigned i, double up_Bps, double down_Bps);
/* Wall time this process spent in node i's callbacks (records received,
 * timers, work, wakes): what its engine's code cost. */
uint64_t fix_node_busy_ns(const struct fx *fx, unsigned i);

/* Frees the fixture's queues (the engines must be freed first). */
void fix_free(struct fx *fx);

/* The stub I/O of node i, for dte_engine_new_io. */
void fix_io(struct fx *fx, unsigned i, struct dte_engine_io *io);
const char *fix_node_name(struct fx *fx, unsigned i);
const char *fix_node_address(struct fx *fx, unsigned i);

/* One step: one thing that is ready (a record, a work, a wake, a due
 * timer) chosen by the seed; the clock moves on.  0 when something ran,
 * -1 when nothing is ready and no timer is armed (nothing can happen). */
int fix_step(struct fx *fx);
/* Steps until pred(arg) is true (checked before every step): 0, or -1
 * when max_steps ran out or nothing could happen. */
int fix_run_until(struct fx *fx, int (*pred)(void *arg), void *arg, uint64_t max_steps);
/* Steps until no record, work or wake is left (timers aside): 0, or -1
 * after max_steps. */
int fix_settle(struct fx *fx, uint64_t max_steps);

uint64_t fix_now(const struct fx *fx);
void fix_stats(const struct fx *fx, struct fix_stats *st);
/* Faults from here on (e.g. none, to let a run converge). */
void fix_set_faults(struct fx *fx, const struct fx_faults *faults);

/* Node i cut off (on) or reachable again (off): while it is cut off,
 * every record to or from it is lost, those queued included (at their
 * delivery).  Nobody is told; fix_node_down tells them. */
void fix_partition(struct fx *fx, unsigned i, int on);
/* The connections between node i and every other node broke, as a
 * transport sees it: the records queued on them are lost (route_ucx.c
 * drops a node's pending records before it reports it down), each other
 * node's engine hears node i go down, and node i's hears each of them go
 * down (the engines' node-down, engine_io.h). */
void fix_node_down(struct fx *fx, unsigned i);
/* Node i's process ended (its engine is freed, or about to be): the
 * records queued to or from it are lost, and the others hear it go down.
 * A new engine may attach to the same I/O (fix_io) afterwards. */
void fix_node_gone(struct fx *fx, unsigned i);

#endif

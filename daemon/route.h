/* daemon/route.h — how peer.proto records travel between job engines.
 *
 * The sync engine (daemon/job*.c) speaks only in peer.proto records:
 * (type, protobuf header, optional data).  It hands every record to its
 * I/O's transport (daemon/engine_io.h; in dted daemon/engine_io_uv.c,
 * which calls route_send() here) with the destination daemon's node name,
 * and receives every record through job_peer_recv(), whether it came from
 * this daemon or from another one.  So the coordinator, source and sink logic is the same code
 * for one daemon and for a cluster.
 *
 * Local records (destination is this daemon) go into a queue drained from
 * the loop, never by a direct call: a handler that sends never re-enters
 * another handler.  Remote records go to the remote transport
 * (route_ucx_engine.c) through struct route_transport; with none
 * installed, a send to another node fails with -EHOSTUNREACH and a logged
 * reason.  A test build may wrap the remote transport in a decorator
 * (struct route_decorator, fault injection); production has none.
 *
 * Module state is per process (one dted, one loop), chrony style.
 */
#ifndef DTED_ROUTE_H
#define DTED_ROUTE_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>
#include <protobuf-c/protobuf-c.h>
#include "proto/peer.pb-c.h"
#include "proto/peer_auth.h"

/* A transport: one way records leave this daemon.  route.c dispatches
 * every send to one of two: the local queue (records for this daemon,
 * delivered from the loop without a second copy: the receiver may take the
 * queued record's own data, route_take_data) and the remote transport
 * (route_ucx_engine.c over UCX, once installed with route_set_remote).
 * All calls run on the loop thread. */
struct route_transport {
	const char *name;	/* "local", "ucx": for log lines */
	/* Send one record to daemon `node` (its HELLO name); `address`
	 * ("host:port", may be NULL when the transport already knows the
	 * node) is where to connect if there is no connection yet.  `node`
	 * may be NULL when only the address is known (the first JOIN to a
	 * coordinator).  hdr is the packed record (any size: a PLAN can be
	 * far larger than one AM header; carry it whole), data follows it
	 * (PAYLOAD only).  Both are borrowed: copy what must outlive the
	 * call.  Returns 0 or a negative errno; failures later (peer died)
	 * are reported with route_node_down(). */
	int (*send)(void *arg, const char *node, const char *address, Dtep__PeerMsgType type,
		    const uint8_t *hdr, size_t hdrlen, const void *data, size_t len);
	/* Optional: send without copying data.  data is given: the transport
	 * calls release(data, rarg) exactly once when it is done with it
	 * (sent, dropped, or at once on failure); the local queue holds it
	 * as it is and calls release(NULL, rarg) when a receiver took it. */
	int (*send_given)(void *arg, const char *node, const char *address,
			  Dtep__PeerMsgType type, const uint8_t *hdr, size_t hdrlen, void *data,
			  size_t len, void (*release)(void *data, void *rarg), void *rarg);
	/* Optional: the data of the record being delivered, as a malloc'ed
	 * buffer the caller now owns, or NULL (see route_take_data). */
	void *(*take)(void *arg, const void *data);
	/* Optional: true when this daemon connected to `address` and the
	 * daemon there greeted as `node` (route_node_is_at). */
	int (*node_is_at)(void *arg, const char *node, const char *address);
	void *arg;
};

/* A decorator of the remote transport, both ways.  The production dted
 * installs none and has none linked in; a test build installs one before
 * route_init (tests/faults: tests/faults/testhook.c, fault injection).  Every
 * member is optional. */
struct route_decorator {
	/* From route_init: < 0 makes route_init fail (the daemon does not
	 * start). */
	int  (*init)(uv_loop_t *loop);
	/* From route_fini. */
	void (*fini)(void);
	/* Make *outer the decorated `inner` (the remote transport given to
	 * route_set_remote; route.c keeps it valid until the next
	 * route_set_remote): route.c sends through outer. */
	void (*wrap)(const struct route_transport *inner, struct route_transport *outer);
	/* A record the remote transport received, before the engine sees
	 * it: returns 1 when the decorator took it over (it hands it to the
	 * receiver itself through route_receive(), altered, twice or later;
	 * the receiver cannot take its data then), 0 to have it delivered as
	 * usual. */
	int  (*deliver)(const char *from_node, Dtep__PeerMsgType type, const uint8_t *hdr,
			size_t hdrlen, const void *data, size_t len);
};

/* Install (or, with NULL, remove) the decorator; before route_init.  The
 * struct is borrowed and must outlive the daemon's routing. */
void route_set_decorator(const struct route_decorator *dec);

/* self_node: this daemon's node name; self_address: its peer listener
 * ("host:port"), "" when it has none. */
int  route_init(uv_loop_t *loop, const char *self_node, const char *self_address);
/* Drops queued records; their data is freed. */
void route_fini(void);

/* Install (or, with NULL, remove) the remote transport; the struct is
 * copied (and wrapped by the decorator, if one is installed). */
void route_set_remote(const struct route_transport *remote);

const char *route_self_node(void);
const char *route_self_address(void);
/* The peer listener came up after route_init (main.c's bind retry). */
void route_set_self_address(const char *address);

/* True when (node, address) names this daemon: node equal to our name, or
 * no node and an address that is "local", "" or our own. */
int route_is_self(const char *node, const char *address);

/* True when `node` is the daemon at `address`: this daemon itself for a
 * self address, else a remote daemon this one connected to at that
 * address and that greeted as `node`, or that advertised it first
 * (droute_ucx_node_is_at).  How a member knows a PLAN came from its
 * job's coordinator. */
int route_node_is_at(const char *node, const char *address);

/* Send one record.  msg is packed here; data (len bytes, PAYLOAD only, may
 * be NULL) is copied for local delivery.  Returns 0 or a negative errno. */
int route_send(const char *node, const char *address, Dtep__PeerMsgType type,
	       const ProtobufCMessage *msg, const void *data, size_t len);

/* route_send for a PAYLOAD's part without copying it: data (len > 0
 * bytes, malloc'ed) is given to the transport, which calls release(data,
 * rarg) exactly once when it is done with it -- after the send completed,
 * when the record is dropped or delivered, or when the send fails.  A
 * local record is queued as it is, not copied; when its receiver takes
 * the data (route_take_data: it then owns it and frees it with free()),
 * release(NULL, rarg) is called instead.  Returns as route_send. */
int route_send_given(const char *node, const char *address, Dtep__PeerMsgType type,
		     const ProtobufCMessage *msg, void *data, size_t len,
		     void (*release)(void *data, void *rarg), void *rarg);

/* A record's identity for the debug log: a hash of its header (version,
 * pair, part ... all live there).  route_deliver logs each remote record
 * as it comes off the wire, before any decorator, and job_peer_recv logs
 * what the job layer takes, under the same key, so a test can tell what
 * the receiver's protocol code got from what the wire carried (a
 * duplicate, a reorder).  Both lines are debug level only. */
unsigned long long route_record_key(const uint8_t *hdr, size_t hdrlen);

/* The remote transport hands every received record here (from_node is
 * the sender's HELLO name); it is delivered to job_peer_recv() at once
 * (through the decorator, if one is installed). */
void route_deliver(const char *from_node, Dtep__PeerMsgType type, const uint8_t *hdr,
		   size_t hdrlen, const void *data, size_t len);

/* A decorator's delivery (struct route_decorator, deliver): hands the
 * record to the receiver now, past the decorator; the receiver cannot
 * take its data (route_take_data). */
void route_receive(const char *from_node, Dtep__PeerMsgType type, const uint8_t *hdr,
		   size_t hdrlen, const void *data, size_t len);

/* The remote transport saw daemon `node` go away. */
void route_node_down(const char *node);

/* From inside job_peer_recv(): take the record's data (len bytes) instead
 * of copying it.  Returns it as a malloc'ed buffer the caller must free(),
 * or NULL when it cannot be handed over (data in UCX's or the staging
 * region's memory, a decorator's delivery, taken already): copy then. */
void *route_take_data(const void *data);

/* Records queued for local delivery (tests). */
size_t route_pending(void);

/* The receiver of every record, and of a node gone away: the sync
 * engine (daemon/job.c: job_peer_recv, job_peer_down) registers itself at
 * dte_engine_new_io through its I/O (engine_io_uv.c's attach), so the
 * router below it never names it; ctx (the engine)
 * is passed back to both.  hdr/data are borrowed for the call.  Malformed
 * or refused records are logged and counted, never trusted.  Kept across
 * route_init; before a receiver is set a record is dropped.
 *
 * The router itself is process-level (one per daemon: its node name, its
 * transports, its local queue): one receiver at a time.  Engines that
 * share a process would each need a router of their own; that is a later
 * step (issue 31). */
typedef void (*route_recv_fn)(void *ctx, const char *from_node, Dtep__PeerMsgType type,
			      const uint8_t *hdr, size_t hdrlen, const void *data, size_t len);
typedef void (*route_down_fn)(void *ctx, const char *node);
void route_set_receiver(route_recv_fn recv, route_down_fn down, void *ctx);

/* The sealer of every record leaving for another daemon: the sync engine
 * (daemon/job_auth.c) computes the record's MAC (peer protocol 5,
 * proto/peer_auth.h) into mac and returns 1; route.c packs the record
 * with it in its JobRef (the caller's record is left as it was).  0: the
 * record goes without one (no JobRef, auth off for its job); < 0 fails
 * the send with it.  Records for this daemon are not sealed: they never
 * leave the process.  data is the PAYLOAD's. */
typedef int (*route_seal_fn)(void *ctx, Dtep__PeerMsgType type, const ProtobufCMessage *msg,
			     const void *data, size_t len, uint8_t mac[PEER_AUTH_MACBYTES]);
void route_set_sealer(route_seal_fn seal, void *ctx);

/* The receiver and the sealer registered with ctx go (an engine being
 * freed); those of another ctx stay. */
void route_unset(void *ctx);

#endif

/* daemon/route.h — how peer.proto records travel between job engines.
 *
 * The sync engine (daemon/job*.c) speaks only in peer.proto records:
 * (type, protobuf header, optional data).  It hands every record to
 * route_send() with the destination daemon's node name, and receives every
 * record through job_peer_recv(), whether it came from this daemon or from
 * another one.  So the coordinator, source and sink logic is the same code
 * for one daemon and for a cluster.
 *
 * Local records (destination is this daemon) go into a queue drained from
 * the loop, never by a direct call: a handler that sends never re-enters
 * another handler.  Remote records go to the remote router (route_ucx.c)
 * through struct route_remote; with none installed, a send to another node
 * fails with -EHOSTUNREACH and a logged reason.
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

/* What a remote router provides.  All calls run on the loop thread. */
struct route_remote {
	/* Send one record to daemon `node` (its HELLO name); `address`
	 * ("host:port", may be NULL when the router already knows the node)
	 * is where to connect if there is no connection yet.  `node` may be
	 * NULL when only the address is known (the first JOIN to a
	 * coordinator).  hdr is the packed record (any size: a PLAN can be
	 * far larger than one AM header; carry it whole), data follows it
	 * (PAYLOAD only).  Both are borrowed: copy what must outlive the call.
	 * Returns 0 or a negative errno; failures later (peer died) are
	 * reported with route_node_down(). */
	int (*send)(void *arg, const char *node, const char *address, Dtep__PeerMsgType type,
		    const uint8_t *hdr, size_t hdrlen, const void *data, size_t len);
	/* Optional: send without copying data.  data is given: the router
	 * calls release(data, rarg) exactly once when it is done with it
	 * (sent, dropped, or at once on failure). */
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

/* self_node: this daemon's node name; self_address: its peer listener
 * ("host:port"), "" when it has none. */
int  route_init(uv_loop_t *loop, const char *self_node, const char *self_address);
/* Drops queued records; their data is freed. */
void route_fini(void);

/* Install (or, with NULL, remove) the remote router; the struct is copied. */
void route_set_remote(const struct route_remote *remote);

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
 * bytes) is given to the router, which calls release(data, rarg) exactly
 * once when it is done with it -- after the send completed, when the
 * record is dropped, at once for a local delivery (the queue copies) or
 * when the send fails.  Returns as route_send. */
int route_send_given(const char *node, const char *address, Dtep__PeerMsgType type,
		     const ProtobufCMessage *msg, void *data, size_t len,
		     void (*release)(void *data, void *rarg), void *rarg);

/* The remote router hands every received record here (from_node is the
 * sender's HELLO name); it is delivered to job_peer_recv() at once. */
void route_deliver(const char *from_node, Dtep__PeerMsgType type, const uint8_t *hdr,
		   size_t hdrlen, const void *data, size_t len);

/* The remote router saw daemon `node` go away. */
void route_node_down(const char *node);

/* From inside job_peer_recv(): take the record's data (len bytes) instead
 * of copying it.  Returns it as a malloc'ed buffer the caller must free(),
 * or NULL when it cannot be handed over (data in UCX's or the staging
 * region's memory, a test hook's delivery, taken already): copy then. */
void *route_take_data(const void *data);

/* Records queued for local delivery (tests). */
size_t route_pending(void);

/* Implemented by the sync engine (daemon/job.c).  hdr/data are borrowed
 * for the call.  Malformed or refused records are logged and counted,
 * never trusted. */
void job_peer_recv(const char *from_node, Dtep__PeerMsgType type, const uint8_t *hdr,
		   size_t hdrlen, const void *data, size_t len);
void job_peer_down(const char *node);

#endif

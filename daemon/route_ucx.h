/* daemon/route_ucx.h — job records between daemons, over the UCX peer layer.
 *
 * The router owns this daemon's one dte_peer context (listener included)
 * and turns "send this peer.proto record to node N" into active messages:
 *   AM msg id = Dtep__PeerMsgType;
 *   AM header = the packed record, when it fits DTE_PEER_HEADER_MAX;
 *               otherwise the header is empty and the packed record travels
 *               as the AM data (a PLAN for a large model);
 *   PAYLOAD   = the packed Payload record in the header, the encoded entries
 *               as the data (rendezvous into a staging region registered
 *               with UCX once, when they fit it).
 * Nodes are known by name (the peer HELLO carries it, with an incarnation
 * id that changes at every daemon start).  An address book maps names to
 * host:port; a connection is opened on the first record for a node and
 * records queue until it is up.  Either side's connection carries traffic
 * both ways.
 *
 * Ordering: none.  The peer layer keeps none (a rendezvous PAYLOAD
 * completes after later small records) and the router adds none: every
 * record is handed to the engine as it lands, which takes payload parts
 * before their COUNTS (peer protocol 2; docs/SYNC.md).  The router does
 * not decode the records it carries.
 *
 * Everything runs on the loop thread.  Errors are negative errno values.
 */
#ifndef DTED_ROUTE_UCX_H
#define DTED_ROUTE_UCX_H

#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>
#include <uv.h>
#include "daemon/peer/peer.h"

#define DROUTE_NODE_MAX   DTE_PEER_NAME_MAX   /* node name, NUL included */
#define DROUTE_ADDR_MAX   96                  /* "host:port", NUL included */
/* Internal record: the sender's advertised address, sent once a link is
 * up so either side can reconnect by name. */
#define DROUTE_MSG_ADDR   200

struct droute_ucx;

/* A record arrived.  msg/msglen: the packed peer.proto record of `type`;
 * data/len: a PAYLOAD's encoded entries (else NULL/0).  Both are valid only
 * during the call. */
typedef void (*droute_recv_fn)(void *arg, const char *from_node, unsigned type,
			       const uint8_t *msg, size_t msglen,
			       const void *data, size_t len);
/* Every connection to `node` is gone, or the node restarted (a new
 * incarnation greeted us): records to it may have been lost. */
typedef void (*droute_down_fn)(void *arg, const char *node, const char *reason);

struct droute_ucx_params {
	const char *node;             /* this daemon's node name (required) */
	const char *listen_address;   /* NULL or "": no listener */
	uint16_t listen_port;         /* 0: pick one */
	const char *advertise;        /* "host:port"; NULL/"": derived */
	size_t staging_bytes;         /* 0: no staging region */
	/* Per node while connecting; 0: 1 GiB. */
	size_t queue_max_bytes;
	droute_recv_fn recv;
	droute_down_fn down;
	void *arg;
};

/* One remote node, as `dtectl peers` shows it. */
struct droute_peer_info {
	char node[DROUTE_NODE_MAX];   /* "" while a connect by address is pending */
	char address[DROUTE_ADDR_MAX];/* host:port known for it, "" if none */
	const char *state;            /* connecting | up | down */
	unsigned links;               /* live connections (0..2 normally) */
	uint64_t msgs_in, bytes_in, msgs_out, bytes_out;
	uint64_t queued;              /* records waiting for a connection */
	uint64_t dropped;             /* records lost: down, refused, expired */
	uint64_t since_ns;            /* uv_hrtime() of the last state change */
	uint64_t incarnation;
};

struct droute_ucx_stats {
	uint64_t staged;              /* payloads received into staging */
	uint64_t direct;              /* large payloads received into their own
				       * buffer (the engine may take it) */
	uint64_t handed;              /* of those, taken by the engine */
	uint64_t bad;                 /* undecodable/unknown records dropped */
	uint64_t restarts;            /* nodes seen with a new incarnation */
};

/* Create the context, listen, register staging.  *out on success. */
int  droute_ucx_init(struct droute_ucx **out, uv_loop_t *loop,
		     const struct droute_ucx_params *p);
/* Close every link and the context; cb(arg) runs once the loop holds
 * nothing of the router's (then it is freed). */
/* Start the peer listener of a router made without one (init's listen
 * failed: main.c retries); sets its advertised address.  0, -EALREADY
 * when it listens already, or a negative errno (logged). */
int  droute_ucx_listen(struct droute_ucx *r, const char *listen_address, uint16_t listen_port,
		       const char *advertise);
/* Why the configured listener is not bound ("" when it is, or none was
 * configured) and how many binds were retried (main.c). */
const char *droute_ucx_listen_error(const struct droute_ucx *r, uint64_t *tries);
void droute_ucx_listen_failed(struct droute_ucx *r, const char *why, uint64_t tries);
void droute_ucx_close(struct droute_ucx *r, void (*cb)(void *arg), void *arg);

const char *droute_ucx_node(const struct droute_ucx *r);
/* The advertised host:port (with the bound port when 0 was asked). */
const char *droute_ucx_address(const struct droute_ucx *r);

/* Address book: node -> host:port (from PLAN maps and JOINs).  A changed
 * address takes effect at the next connect. */
/* True when the daemon greeting as `node` is at hostport: this router
 * connected there and it greeted so, or it advertised that address (an
 * advertisement of an address another live node holds is ignored, first
 * come).  The engine's test of "this record came from the daemon at the
 * address I was given", e.g. a job's coordinator. */
int  droute_ucx_node_is_at(const struct droute_ucx *r, const char *node, const char *hostport);
int  droute_ucx_learn(struct droute_ucx *r, const char *node, const char *hostport);

/* Send a record to a node by name (needs a live link or a known address),
 * or to an address whose node name is not yet known (a job's coordinator).
 * msg is packed now and data copied, so both may go once this returns. */
int  droute_ucx_send(struct droute_ucx *r, const char *node, unsigned type,
		     const ProtobufCMessage *msg, const void *data, size_t len);
int  droute_ucx_send_addr(struct droute_ucx *r, const char *hostport, unsigned type,
			  const ProtobufCMessage *msg, const void *data, size_t len);
/* Same with an already packed record (route.h's remote hook; tests and the
 * forge tool craft bytes the encoder would never produce).  node, hostport
 * or both: with both, hostport is learnt for node first. */
int  droute_ucx_send_packed(struct droute_ucx *r, const char *node, const char *hostport,
			    unsigned type, const uint8_t *msg, size_t msglen,
			    const void *data, size_t len);

/* droute_ucx_send_packed without the copy of data (a PAYLOAD's part):
 * data is given to the router, which sends from it and calls
 * release(data, rarg) exactly once, on the loop, when UCX is done with it,
 * when the record is dropped or at once when it cannot go (the return
 * code says so).  Never from inside this call unless it fails. */
typedef void (*droute_release_fn)(void *data, void *rarg);
int  droute_ucx_send_given(struct droute_ucx *r, const char *node, const char *hostport,
			   unsigned type, const uint8_t *msg, size_t msglen, void *data,
			   size_t len, droute_release_fn release, void *rarg);

/* Up to max nodes into out; returns how many nodes there are. */
size_t droute_ucx_peers(const struct droute_ucx *r, struct droute_peer_info *out, size_t max);
unsigned droute_ucx_peers_up(const struct droute_ucx *r);
void droute_ucx_stats(const struct droute_ucx *r, struct droute_ucx_stats *out);
const dte_peer_ctx_t *droute_ucx_ctx(const struct droute_ucx *r);

/* From inside the recv handler: the record's data as a malloc'ed buffer
 * the caller owns from now on, when it landed in a buffer of its own (a
 * PAYLOAD of at least DROUTE_DIRECT_MIN bytes); NULL otherwise (staging,
 * UCX's memory, a parked record): copy it then. */
void *droute_ucx_take(struct droute_ucx *r, const void *data);

/* PAYLOADs this large skip the staging region: they land in memory of
 * their own that the engine keeps as the part (no copy out of staging). */
#define DROUTE_DIRECT_MIN ((size_t)8 << 20)

/* Replace where received records and down reports go. */
void droute_ucx_set_handlers(struct droute_ucx *r, droute_recv_fn recv, droute_down_fn down,
			     void *arg);

/* (route_ucx_engine.c) Make r the remote side of daemon/route.h: records the engine sends to
 * other nodes go out here, records received go to route_deliver(), lost
 * nodes to route_node_down().  NULL uninstalls (before closing r). */
void droute_ucx_attach_engine(struct droute_ucx *r);

/* The daemon's router (set by main.c; NULL when peers are off). */
struct droute_ucx *droute_ucx_daemon(void);
void droute_ucx_set_daemon(struct droute_ucx *r);

/* Name of a record type for log lines ("COUNTS"), "?" when unknown. */
const char *droute_ucx_type_name(unsigned type);

#endif

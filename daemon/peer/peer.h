/* daemon/peer — daemon-to-daemon transport over UCX active messages.
 *
 * One context per daemon: a UCP context + worker (thread mode single) driven
 * by a libuv loop (uv_poll on the worker's event fd, uv_prepare that drains
 * progress and re-arms before the loop sleeps).  Peers come from a listener
 * (accepted) or from dte_peer_connect; both sides exchange a HELLO (node id
 * and name) as the first message, and only then is the peer "up" and may
 * carry user messages.
 *
 * Ownership (libuv style): the caller owns the dte_peer_ctx_t storage and may
 * free it only after the close callback of dte_peer_ctx_close.  Peers are
 * owned by the layer: a peer pointer is valid from the up callback (or from
 * dte_peer_connect) until the down callback returns; down is the last
 * callback that names it, it runs once every operation on it has finished.
 *
 * Errors are negative errno values (libuv style); outputs are written only
 * on success.
 *
 * Ordering: messages on one peer are handed to UCX in call order and small
 * (eager) messages arrive in order over one TCP lane, but a rendezvous
 * message is delivered only once its data has been pulled, so a later small
 * message may be delivered before an earlier large one.  The layer promises
 * no ordering between messages; the sync protocol above keys every message
 * on (job, version, entry).
 */
#ifndef DTE_PEER_H
#define DTE_PEER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include <uv.h>
#include <ucp/api/ucp.h>

/* User message ids are 0 .. DTE_PEER_MSG_ID_MAX-1. */
#define DTE_PEER_MSG_ID_MAX      256
/* Hard cap on a user header (the part delivered before the payload). */
#define DTE_PEER_HEADER_MAX      1024
#define DTE_PEER_NAME_MAX        64     /* node name, NUL included */
#define DTE_PEER_IOV_MAX         64

typedef struct dte_peer_ctx dte_peer_ctx_t;
typedef struct dte_peer     dte_peer_t;
typedef struct dte_peer_mem dte_peer_mem_t;

/* A peer finished its handshake; dte_peer_name/id are now known. */
typedef void (*dte_peer_up_cb)(dte_peer_ctx_t *ctx, dte_peer_t *peer);

/* A peer is gone: remote failure, refused connect, or local close (status
 * 0).  reason is a human-readable string valid during the call.  The peer is
 * freed when this returns. */
typedef void (*dte_peer_down_cb)(dte_peer_ctx_t *ctx, dte_peer_t *peer,
                                 int status, const char *reason);

/* A whole message arrived.  data is valid only during the call unless it is
 * a buffer the alloc callback supplied (then the caller owns it) or the
 * callback takes it with dte_peer_take(). */
typedef void (*dte_peer_recv_cb)(dte_peer_t *peer, unsigned msg_id,
                                 const void *header, size_t header_len,
                                 void *data, size_t len, void *arg);

/* Destination for the payload of a message (eager or rendezvous) of len
 * bytes, e.g. a slot in a staging buffer registered with dte_peer_mem_map.
 * NULL means "no preference": the layer uses its own memory. */
typedef void *(*dte_peer_alloc_cb)(dte_peer_t *peer, unsigned msg_id,
                                   const void *header, size_t header_len,
                                   size_t len, void *arg);

/* A send finished: 0 when UCX is done with the data (the caller may reuse
 * it), negative when it was cancelled or failed. */
typedef void (*dte_peer_send_cb)(dte_peer_t *peer, int status, void *arg);

typedef void (*dte_peer_ctx_close_cb)(dte_peer_ctx_t *ctx);

enum {
	DTE_PEER_PARAM_FIELD_NODE_ID       = 1u << 0,
	DTE_PEER_PARAM_FIELD_NODE_NAME     = 1u << 1,
	DTE_PEER_PARAM_FIELD_UP_CB         = 1u << 2,
	DTE_PEER_PARAM_FIELD_DOWN_CB       = 1u << 3,
	DTE_PEER_PARAM_FIELD_USER_DATA     = 1u << 4,
	DTE_PEER_PARAM_FIELD_LOG_CB        = 1u << 5,
	DTE_PEER_PARAM_FIELD_MAX_RECV      = 1u << 6,
};

/* level is a syslog priority (LOG_ERR .. LOG_DEBUG); default: stderr. */
typedef void (*dte_peer_log_cb)(int level, const char *msg, void *user_data);

typedef struct {
	uint32_t         field_mask;
	uint64_t         node_id;
	const char      *node_name;        /* < DTE_PEER_NAME_MAX bytes */
	dte_peer_up_cb   up_cb;
	dte_peer_down_cb down_cb;
	void            *user_data;
	dte_peer_log_cb  log_cb;
	/* Largest payload the layer allocates itself for a rendezvous message
	 * (caller-supplied buffers are not capped); default 1 GiB. */
	size_t           max_recv;
} dte_peer_params_t;

typedef struct {
	uint64_t msgs_sent, bytes_sent;
	uint64_t msgs_recv, bytes_recv;
	uint64_t rndv_recv;          /* messages that came by rendezvous */
	uint64_t staged_recv;        /* payloads placed in caller memory */
	uint64_t dropped_unknown;    /* no handler for the message id */
	uint64_t dropped_bad;        /* malformed header, unknown sender, ... */
	uint64_t recv_failed;        /* rendezvous fetch failed */
	uint64_t send_failed;
	uint64_t peers_up, peers_down;
} dte_peer_stats_t;

struct dte_peer_op;

/* Private: callers allocate the storage and read it only through functions. */
struct dte_peer_handler {
	dte_peer_recv_cb  recv_cb;
	dte_peer_alloc_cb alloc_cb;
	void             *arg;
};

struct dte_peer_ctx {
	uv_loop_t             *loop;
	ucp_context_h          ucp;
	ucp_worker_h           worker;
	ucp_listener_h         listener;
	uv_poll_t              poll;
	uv_prepare_t           prepare;
	int                    efd;
	int                    closing;
	int                    handles_open;
	dte_peer_ctx_close_cb  close_cb;
	dte_peer_params_t      params;
	char                   node_name[DTE_PEER_NAME_MAX];
	size_t                 max_am_header;
	dte_peer_t            *peers;      /* every live peer */
	dte_peer_t            *reap;       /* peers waiting to be reported down */
	struct dte_peer_op    *done;       /* sends done at once, cb not yet run */
	dte_peer_mem_t        *mems;
	struct dte_peer_handler handlers[DTE_PEER_MSG_ID_MAX];
	dte_peer_stats_t       stats;
	void                  *data;       /* for the caller */
	void                  *lend;       /* malloc'ed payload being delivered */
};

/* Context. */
int  dte_peer_ctx_init(dte_peer_ctx_t *ctx, uv_loop_t *loop,
                       const dte_peer_params_t *params);
/* Stop listening, flush-close every peer, tear down UCX and close the uv
 * handles; cb runs when the loop holds nothing of ours any more.  A peer that
 * never answers the flush is bounded by UCX's keepalive. */
int  dte_peer_ctx_close(dte_peer_ctx_t *ctx, dte_peer_ctx_close_cb cb);
void dte_peer_ctx_stats(const dte_peer_ctx_t *ctx, dte_peer_stats_t *out);

/* Listen on addr:port (IPv4 or IPv6 literal; port 0 picks one). */
int  dte_peer_listen(dte_peer_ctx_t *ctx, const char *addr, uint16_t port,
                     uint16_t *bound_port);

/* Start connecting; up_cb or down_cb tells how it went. */
int  dte_peer_connect(dte_peer_ctx_t *ctx, const char *addr, uint16_t port,
                      dte_peer_t **peer_out);

/* Flush then close; down_cb(status 0, "closed") follows. */
int  dte_peer_close(dte_peer_t *peer);

/* Messages. */
int  dte_peer_handler_set(dte_peer_ctx_t *ctx, unsigned msg_id,
                          dte_peer_recv_cb recv_cb,
                          dte_peer_alloc_cb alloc_cb, void *arg);
/* header is copied; iov[].iov_base must stay valid until cb runs (cb is
 * never called from inside dte_peer_send). */
int  dte_peer_send(dte_peer_t *peer, unsigned msg_id,
                   const void *header, size_t header_len,
                   const struct iovec *iov, int iovcnt,
                   dte_peer_send_cb cb, void *arg);

/* From inside a recv callback: the message's data when this layer
 * malloc'ed it for a rendezvous (no alloc callback buffer), now the
 * caller's to free() -- a payload kept past the call needs no copy.  NULL
 * when data is not such a buffer (eager data lives in UCX's memory, an
 * alloc-callback buffer is the caller's already) or was taken. */
void *dte_peer_take(dte_peer_ctx_t *ctx, const void *data);

/* Staging memory registered once with UCX; payloads received into (or sent
 * from) it skip per-message registration. */
int  dte_peer_mem_map(dte_peer_ctx_t *ctx, void *addr, size_t len,
                      dte_peer_mem_t **mem_out);
int  dte_peer_mem_unmap(dte_peer_ctx_t *ctx, dte_peer_mem_t *mem);

/* Peer accessors. */
const char     *dte_peer_name(const dte_peer_t *peer);
uint64_t        dte_peer_id(const dte_peer_t *peer);
int             dte_peer_is_up(const dte_peer_t *peer);
dte_peer_ctx_t *dte_peer_ctx(const dte_peer_t *peer);
void           *dte_peer_get_data(const dte_peer_t *peer);
void            dte_peer_set_data(dte_peer_t *peer, void *data);

#endif

/* daemon/peer — internals shared by the peer_*.c files; not for users. */
#ifndef DTE_PEER_INT_H
#define DTE_PEER_INT_H

#include "daemon/peer/peer.h"

#include <syslog.h>

/* UCX active message ids: the handshake and user messages are kept apart so
 * a user message can never be mistaken for a HELLO. */
enum {
	DTE_PEER_AM_HELLO = 1,
	DTE_PEER_AM_MSG   = 2,
};

#define DTE_PEER_MAGIC        0x44544550u   /* "DTEP" */
#define DTE_PEER_VERSION      1
#define DTE_PEER_HELLO_REPLY  0x1

/* Every user message carries this before the user header, all inside the
 * UCX AM header; little-endian hosts only (x86-64, aarch64). */
struct dte_peer_wire_hdr {
	uint32_t magic;
	uint16_t msg_id;
	uint16_t hdr_len;
};

struct dte_peer_hello {
	uint32_t magic;
	uint16_t version;
	uint16_t flags;
	uint64_t node_id;
	char     name[DTE_PEER_NAME_MAX];
};

enum dte_peer_state {
	DTE_PEER_CONNECTING,   /* ep created, HELLO not yet exchanged */
	DTE_PEER_UP,
	DTE_PEER_CLOSING,      /* close requested or failed; ep going away */
};

struct dte_peer {
	dte_peer_ctx_t     *ctx;
	dte_peer_t         *next;
	ucp_ep_h            ep;
	enum dte_peer_state state;
	int                 refs;        /* the ep + every operation in flight */
	int                 announced;   /* the caller knows this peer */
	int                 failed;      /* ep error seen; force close pending */
	int                 ep_closing;  /* ucp_ep_close_nbx issued */
	int                 down_status;
	char                reason[128];
	uint64_t            remote_id;
	char                remote_name[DTE_PEER_NAME_MAX];
	char                addr[64];    /* for log lines */
	void               *data;
};

struct dte_peer_mem {
	dte_peer_mem_t *next;
	ucp_mem_h       memh;
	char           *addr;
	size_t          len;
};

/* The files call downward only: peer_ctx.c -> peer_conn.c -> peer_msg.c
 * -> peer_mem.c -> peer_base.c. */

/* peer_base.c */
void dte_peer__log(dte_peer_ctx_t *ctx, int level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
int  dte_peer__errno(ucs_status_t status);
dte_peer_t *dte_peer__new(dte_peer_ctx_t *ctx, const char *addr);
dte_peer_t *dte_peer__find(dte_peer_ctx_t *ctx, ucp_ep_h ep);
void dte_peer__ref(dte_peer_t *peer);
void dte_peer__unref(dte_peer_t *peer);
void dte_peer__fail(dte_peer_t *peer, int status, const char *reason);

/* peer_conn.c */
void dte_peer__reap(dte_peer_ctx_t *ctx);
int  dte_peer__close_ep(dte_peer_t *peer, int force);
ucs_status_t dte_peer__hello_cb(void *arg, const void *header,
                                size_t header_len, void *data, size_t len,
                                const ucp_am_recv_param_t *param);

/* peer_msg.c */
/* One send in flight: the UCX AM header (h1 then h2) and the iov array
 * live here until UCX completes it. */
struct dte_peer_op {
	struct dte_peer_op *next;        /* ctx->done */
	dte_peer_t         *peer;
	dte_peer_send_cb    cb;
	void               *arg;
	size_t              hdr_len;
	ucp_dt_iov_t       *iov;
	uint8_t            *hdr;
};

int  dte_peer__send(dte_peer_t *peer, unsigned am_id,
                    const void *h1, size_t l1, const void *h2, size_t l2,
                    const struct iovec *iov, int iovcnt,
                    dte_peer_send_cb cb, void *arg);
void dte_peer__ops_complete_deferred(dte_peer_ctx_t *ctx);
ucs_status_t dte_peer__msg_cb(void *arg, const void *header,
                              size_t header_len, void *data, size_t len,
                              const ucp_am_recv_param_t *param);

/* peer_mem.c */
ucp_mem_h dte_peer__mem_find(dte_peer_ctx_t *ctx, const void *addr,
                             size_t len);

#endif

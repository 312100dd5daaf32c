/* client/dte.h — libdte: talk to the local dted over its control socket.
 *
 * One handle is one connection.  Every call on a handle is one request and
 * its reply, serialized by a per-handle mutex, so a handle may be shared by
 * threads.  Functions return DTE_OK (0) or a negative enum dte_err and write
 * their outputs only on success; dte_errmsg() tells what went wrong.
 *
 * Structs filled by the library start with `size` (the caller sets it to
 * sizeof the struct it was compiled with) and `field_mask` (the library
 * sets a bit for every field it filled), so fields can be appended without
 * breaking callers built against an older header.
 */
#ifndef DTE_H
#define DTE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DTE_DEFAULT_SOCKET "/run/dted/dted.sock"
#define DTE_SOCKET_ENV     "DTE_SOCKET"

typedef struct dte dte_t;

enum dte_err {
	DTE_OK = 0,
	DTE_ERR_INVAL = -1,            /* bad argument to a libdte call */
	DTE_ERR_NOMEM = -2,
	DTE_ERR_UNREACHABLE = -3,      /* no daemon listening at the path */
	DTE_ERR_IO = -4,               /* connection broke or was closed */
	DTE_ERR_TIMEOUT = -5,
	DTE_ERR_PROTOCOL = -6,         /* malformed frame or reply */
	DTE_ERR_VERSION = -7,          /* no protocol version in common */
	DTE_ERR_DENIED = -8,           /* not allowed to use this daemon */
	DTE_ERR_UNKNOWN_COMMAND = -9,  /* daemon does not know the request */
	DTE_ERR_BAD_REQUEST = -10,     /* daemon refused the arguments */
	DTE_ERR_NOT_FOUND = -11,
	DTE_ERR_BUSY = -12,
	DTE_ERR_UNIMPLEMENTED = -13,
	DTE_ERR_INTERNAL = -14,        /* daemon-side failure */
};

/* Static text for an error code. */
const char *dte_strerror(int err);

/* Connect to dted and negotiate the protocol (hello).  `path` NULL means
 * $DTE_SOCKET, else DTE_DEFAULT_SOCKET.  On failure *out is untouched and
 * dte_errmsg(NULL) describes the failure (per thread). */
int dte_connect(const char *path, dte_t **out);
void dte_close(dte_t *h);

/* Last error on this handle (NULL: this thread's last dte_connect failure).
 * Valid until the next call on the handle. */
const char *dte_errmsg(const dte_t *h);

/* Send/receive timeout per request, in ms (default 30000; 0 = none). */
int dte_set_timeout(dte_t *h, unsigned ms);

enum dte_hello_field {
	DTE_HELLO_VERSION = 1u << 0,
	DTE_HELLO_DAEMON_RANGE = 1u << 1,
	DTE_HELLO_DAEMON_VERSION = 1u << 2,
	DTE_HELLO_NODE_NAME = 1u << 3,
};

struct dte_hello_info {
	size_t   size;                 /* in: sizeof(struct dte_hello_info) */
	uint64_t field_mask;           /* out: DTE_HELLO_* filled */
	uint32_t version;              /* negotiated protocol version */
	uint32_t daemon_min, daemon_max;
	char     daemon_version[32];
	char     node_name[64];
};

/* Negotiate again (dte_connect already did once); `out` may be NULL. */
int dte_hello(dte_t *h, struct dte_hello_info *out);

/* One round trip; *rtt_ns (may be NULL) gets its duration. */
int dte_ping(dte_t *h, uint64_t *rtt_ns);

enum dte_status_field {
	DTE_STATUS_VERSION = 1u << 0,
	DTE_STATUS_PROTOCOL = 1u << 1,
	DTE_STATUS_PID = 1u << 2,
	DTE_STATUS_UPTIME = 1u << 3,
	DTE_STATUS_NODE_NAME = 1u << 4,
	DTE_STATUS_BACKEND = 1u << 5,
	DTE_STATUS_JOBS = 1u << 6,
	DTE_STATUS_PEERS = 1u << 7,
	DTE_STATUS_CLIENTS = 1u << 8,
	DTE_STATUS_REFUSED = 1u << 9,
	DTE_STATUS_LOG_LEVEL = 1u << 10,
	DTE_STATUS_REQUESTS = 1u << 11,
	DTE_STATUS_BAD_FRAMES = 1u << 12,
};

struct dte_status {
	size_t   size;                 /* in: sizeof(struct dte_status) */
	uint64_t field_mask;           /* out: DTE_STATUS_* filled */
	char     version[32];          /* dted's version */
	uint32_t protocol;             /* protocol version of this connection */
	int32_t  pid;
	uint64_t uptime_s;
	char     node_name[64];
	char     backend[16];          /* cpu | cuda */
	uint32_t jobs;
	uint32_t peers;
	uint32_t clients;              /* control connections, this one too */
	uint64_t refused;              /* connections refused by credentials */
	char     log_level[16];
	uint64_t requests;
	uint64_t bad_frames;
	/* New fields go here, with a new DTE_STATUS_* bit. */
};

int dte_status(dte_t *h, struct dte_status *out);

#ifdef __cplusplus
}
#endif

#endif

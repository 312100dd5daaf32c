/* daemon/dreply.h — what a control handler is handed and builds: the
 * daemon's facts (dsrv), the session (dsess) and the reply (dreply).
 * Below dispatch.h, which runs the handlers and packs their replies
 * (daemon/dreply.c says why the two are apart). */
#ifndef DTED_DREPLY_H
#define DTED_DREPLY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct dconf;
struct dte_engine;
struct Dte__Response;

/* Daemon-wide facts and counters the handlers report (owned by ctl.c). */
struct dsrv {
	const struct dconf *conf;
	const char *backend;       /* compute backend name */
	uint64_t start_ns;         /* uv_hrtime() at start */
	uint32_t clients;          /* open control connections */
	uint64_t requests;         /* requests answered */
	uint64_t refused;          /* connections refused by credentials */
	uint64_t bad_frames;       /* connections closed for protocol errors */
	/* The metrics HTTP listener as bound ("host:port", "" when off) and
	 * why it is not listening when metrics_listen asked for it. */
	char metrics_address[80];
	char metrics_error[160];
	/* The sync engine the job handlers act on (main.c makes it; NULL in
	 * tests of the protocol alone). */
	struct dte_engine *eng;
	/* A control connection went away (its buffers and participants go
	 * with it), told to eng; NULL when no layer cares. */
	void (*conn_gone)(struct dte_engine *eng, uint64_t conn_id);
	/* Sends an answer a handler deferred on connection conn_id: ctl.c's
	 * dctl_reply, which main.c installs (the handlers below ctl.c reach
	 * it through here, not by name); NULL: such answers are dropped. */
	int (*answer)(uint64_t conn_id, struct Dte__Response *resp);
};

#define DSESS_MAX_FDS 4

/* A handler answers later (daemon/job_*.c) instead of in its reply. */

/* One control connection as the protocol sees it. */
struct dsess {
	uint32_t version;          /* negotiated; 0 until hello */
	int denied;                /* credentials refused: answer ERR_DENIED */
	int close_after;           /* set by the ladder or a handler */
	uid_t uid;
	gid_t gid;
	pid_t pid;
	uint64_t conn_id;          /* unique per connection, never reused; 0 in tests */
	int deferred;              /* a request waits for a deferred reply */
	/* Descriptors received with SCM_RIGHTS, oldest first; a handler that
	 * takes one owns it (dsess_take_fd). ctl.c closes what is left. */
	int fds[DSESS_MAX_FDS];
	unsigned nfds;
};

/* The oldest received descriptor, or -1 when none arrived. */
int dsess_take_fd(struct dsess *s);

/* Memory a handler allocates for its reply; freed after packing.  Strings
 * may also point at static or long-lived storage. */
/* Fields for dispatch.c and dreply.c only. */
struct dreply_block {
	struct dreply_block *next;
	max_align_t data[];
};

struct dreply {
	struct dreply_block *blocks;
	int deferred;
	char msg[512];
};

void *dreply_alloc(struct dreply *r, size_t size);
char *dreply_strdup(struct dreply *r, const char *s);
/* The reply's human-readable message (errors should always set one). */
void dreply_msg(struct dreply *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The handler will answer later with dctl_reply(); ddispatch() then
 * produces no frame (*out NULL) and the session refuses further requests
 * until that reply went out. */
void dreply_defer(struct dreply *r);
/* dispatch.c, once the reply is packed: frees what dreply_alloc gave. */
void dreply_release(struct dreply *r);

#endif

/* proto/cmdtab.h — the one table of control commands.
 *
 * dted dispatches on it, dtectl builds its help and command line from it,
 * so the two cannot drift (redis's command table).  Adding a command:
 *   1. its Request/Response messages in proto/dte.proto, with one oneof
 *      field number shared by Request.cmd and Response.body;
 *   2. one row in DTE_CMD_LIST below;
 *   3. its handler row in daemon/dispatch.c (daemon commands), or its entry
 *      point in dtectl (local commands).
 * dtectl prints any reply it has no special printer for field by field
 * (text and --json), so most commands need nothing on the client side.
 */
#ifndef DTE_CMDTAB_H
#define DTE_CMDTAB_H

#include <stddef.h>

/* Protocol versions this build speaks; history in proto/dte.proto. */
#define DTE_PROTO_VERSION     2u
#define DTE_PROTO_MIN_VERSION 1u

enum dte_cmd_flags {
	DTE_CMD_DAEMON = 1u << 0,  /* sent to dted (else run locally by dtectl) */
	DTE_CMD_NOHELLO = 1u << 1, /* allowed before hello (hello itself) */
	DTE_CMD_HIDDEN = 1u << 2,  /* not listed by `dtectl help` */
};

/* X(ident, name, oneof field number (0 = local), flags, usage, summary) */
#define DTE_CMD_LIST(X)                                                        \
	X(HELLO, "hello", 10, DTE_CMD_DAEMON | DTE_CMD_NOHELLO, "hello",       \
	  "negotiate the protocol version and show the daemon's identity")     \
	X(PING, "ping", 11, DTE_CMD_DAEMON, "ping",                            \
	  "round trip to the daemon")                                          \
	X(STATUS, "status", 12, DTE_CMD_DAEMON, "status",                      \
	  "daemon version, protocol, uptime, backend, jobs, peers, clients")   \
	X(REGISTER_BUFFER, "register_buffer", 13, DTE_CMD_DAEMON | DTE_CMD_HIDDEN,\
	  "register_buffer (libdte only: passes a file descriptor)",           \
	  "register a shared-memory buffer (fd with SCM_RIGHTS)")              \
	X(UNREGISTER_BUFFER, "unregister_buffer", 14,                          \
	  DTE_CMD_DAEMON | DTE_CMD_HIDDEN, "unregister_buffer BUFFER",         \
	  "release a buffer this connection registered")                       \
	X(JOB_CREATE, "job_create", 15, DTE_CMD_DAEMON | DTE_CMD_HIDDEN,       \
	  "job_create name=NAME model_config=JSON coordinator=local token=T",  \
	  "create (or join) a job")                                            \
	X(ATTACH, "attach", 16, DTE_CMD_DAEMON | DTE_CMD_HIDDEN,               \
	  "attach (libdte)", "attach a source or sink participant")            \
	X(DETACH, "detach", 17, DTE_CMD_DAEMON | DTE_CMD_HIDDEN,               \
	  "detach JOB PARTICIPANT", "detach a participant")                    \
	X(PUBLISH, "publish", 18, DTE_CMD_DAEMON | DTE_CMD_HIDDEN,             \
	  "publish (libdte)", "capture and send a version")                    \
	X(MARK, "mark", 19, DTE_CMD_DAEMON | DTE_CMD_HIDDEN,                   \
	  "mark (libdte)", "record one optimizer step's changes (K > 1)")      \
	X(WAIT, "wait", 20, DTE_CMD_DAEMON,                                    \
	  "wait JOB VERSION [TIMEOUT_MS]",                                     \
	  "wait until every sink applied a version")                           \
	X(WAIT_STAGED, "wait_staged", 21, DTE_CMD_DAEMON | DTE_CMD_HIDDEN,     \
	  "wait_staged (libdte)", "wait for a staged version (sink)")          \
	X(APPLY, "apply", 22, DTE_CMD_DAEMON | DTE_CMD_HIDDEN,                 \
	  "apply (libdte)", "apply staged versions (sink)")                    \
	X(QUERY_VERSION, "query_version", 23, DTE_CMD_DAEMON | DTE_CMD_HIDDEN, \
	  "query_version (libdte)", "a sink's applied and staged versions")    \
	X(JOBS, "jobs", 24, DTE_CMD_DAEMON, "jobs",                            \
	  "jobs on this daemon: epoch, participants, newest version")          \
	X(JOB, "job", 25, DTE_CMD_DAEMON, "job NAME",                          \
	  "one job: members, participants, plan epoch, versions")              \
	X(HISTORY, "history", 26, DTE_CMD_DAEMON, "history NAME [LIMIT]",      \
	  "per version: mode, changed %, bytes, capture/transfer/apply ms")    \
	X(WAIT_CAPTURED, "wait_captured", 27, DTE_CMD_DAEMON | DTE_CMD_HIDDEN, \
	  "wait_captured (libdte)",                                            \
	  "wait until an async publish's capture no longer reads the trainer")\
	X(PEERS, "peers", 30, DTE_CMD_DAEMON, "peers",                         \
	  "other daemons: node, address, state, messages/bytes in/out, since") \
	X(PLAN, "plan", 0, 0, "plan [options] (see `dtectl plan --help`)",     \
	  "dry-run a layout plan: coverage, bytes per link (no daemon)")        \
	X(VERIFY, "verify", 40, DTE_CMD_DAEMON, "verify JOB",                  \
	  "recompute local sinks' checksums now: ok, or mismatch (dense repair)")\
	X(RESYNC, "resync", 41, DTE_CMD_DAEMON, "resync JOB [SINK]",           \
	  "send the next version dense to every sink of a job, or to one")     \
	X(STORAGE, "storage", 0, 0,                                            \
	  "storage SUBCOMMAND [options] (see `dtectl storage --help`)",        \
	  "shared-storage versions: write, ls, gc, verify, read (no daemon)")   \
	X(METRICS, "metrics", 42, DTE_CMD_DAEMON, "metrics",                   \
	  "counters, gauges and histograms in Prometheus text format")         \
	X(CONFIG, "config", 43, DTE_CMD_DAEMON, "config",                      \
	  "effective configuration: every key, its value and its source")      \
	X(LOG_LEVEL, "log-level", 44, DTE_CMD_DAEMON,                          \
	  "log-level [error|warn|notice|info|debug]",                          \
	  "show the daemon's log level, or set it until restart or SIGHUP")

enum dte_cmd_id {
#define DTE_CMD_ENUM(id, name, field, flags, usage, summary) DTE_CMD_##id,
	DTE_CMD_LIST(DTE_CMD_ENUM)
#undef DTE_CMD_ENUM
	DTE_CMD__COUNT
};

struct dte_cmd {
	enum dte_cmd_id id;
	const char *name;
	unsigned field;       /* Request.cmd / Response.body oneof number */
	unsigned flags;
	const char *usage;
	const char *summary;
};

extern const struct dte_cmd dte_cmdtab[DTE_CMD__COUNT];

/* NULL when unknown. */
const struct dte_cmd *dte_cmd_by_name(const char *name);
const struct dte_cmd *dte_cmd_by_field(unsigned field);

#endif

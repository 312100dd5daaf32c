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
#define DTE_PROTO_VERSION     1u
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
	X(PEERS, "peers", 30, DTE_CMD_DAEMON, "peers",                         \
	  "other daemons: node, address, state, messages/bytes in/out, since") \
	X(PLAN, "plan", 0, 0, "plan [options] (see `dtectl plan --help`)",     \
	  "dry-run a layout plan: coverage, bytes per link (no daemon)")

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

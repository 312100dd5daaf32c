/* daemon/derr.h — the daemon's one error convention.
 *
 * Inside the daemon (the sync engine daemon/job*.c, daemon/buf.c,
 * daemon/registry.c, ...) a function returns 0, or a non-negative value,
 * on success and a negative errno on failure, with a human reason written
 * into its (char *err, size_t errlen) arguments.  The errno says what kind
 * of failure it is; the reason says which one, and is what the user sees.
 *
 * The control protocol's wire status (Dte__Status, proto/dte.proto) is
 * chosen from that errno only at the edges: the control handlers
 * (daemon/cmd_*.c, daemon/dispatch.c, daemon/ctl.c) call derr_status(),
 * for the answers the engine defers too (it hands them, errno and reason,
 * to the request's completion: daemon/job_api.h).  The engine names no
 * DTE__STATUS__ constant (tests/system/errconv_grep.sh checks it).
 *
 * Which errno to return (and the status it becomes):
 *
 *   errno              meaning                                   wire status
 *   -EINVAL            bad arguments, malformed request          ERR_INVALID
 *   -EEXIST            already there (a replica, a buffer twice) ERR_INVALID
 *   -ENOENT            unknown job, participant, version, buffer ERR_NOT_FOUND
 *   -EBUSY, -EAGAIN    busy or shutting down; retry later        ERR_BUSY
 *   -ETIMEDOUT         a wait or attach deadline passed          ERR_TIMEOUT
 *   -EACCES, -EPERM    denied (wrong token, credentials)         ERR_DENIED
 *   -EPROTO            protocol violation (bad frame, no hello)  ERR_PROTOCOL
 *   -EPROTONOSUPPORT   no protocol version in common             ERR_VERSION
 *   -ENOSYS            command this daemon does not know         ERR_UNKNOWN_COMMAND
 *   -EOPNOTSUPP        known, not served by this build/backend   ERR_UNIMPLEMENTED
 *   -ENOMEM, -EIO,     daemon-side failure                       ERR_INTERNAL
 *   any other
 */
#ifndef DTED_DERR_H
#define DTED_DERR_H

#include <errno.h>
#include <stddef.h>
#include "proto/dte.pb-c.h"

/* The wire status for rc: STATUS_OK for rc >= 0, otherwise the table above;
 * an errno not in the table is ERR_INTERNAL. */
Dte__Status derr_status(int rc);

/* Writes the reason into err (when errlen > 0) and returns rc, so a
 * failure reads `return derr_fail(err, errlen, -ENOENT, "unknown job");`. */
int derr_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#endif

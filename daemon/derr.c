/* daemon/derr.c — negative errno to wire status, in one place (derr.h). */
#include <stdarg.h>
#include <stdio.h>
#include "daemon/derr.h"

Dte__Status derr_status(int rc)
{
	if (rc >= 0)
		return DTE__STATUS__STATUS_OK;
	switch (-rc) {
	case EINVAL:
	case EEXIST:
		return DTE__STATUS__STATUS_ERR_INVALID;
	case ENOENT:
		return DTE__STATUS__STATUS_ERR_NOT_FOUND;
	case EBUSY:
	case EAGAIN:
		return DTE__STATUS__STATUS_ERR_BUSY;
	case ETIMEDOUT:
		return DTE__STATUS__STATUS_ERR_TIMEOUT;
	case EACCES:
	case EPERM:
		return DTE__STATUS__STATUS_ERR_DENIED;
	case EPROTO:
		return DTE__STATUS__STATUS_ERR_PROTOCOL;
	case EPROTONOSUPPORT:
		return DTE__STATUS__STATUS_ERR_VERSION;
	case ENOSYS:
		return DTE__STATUS__STATUS_ERR_UNKNOWN_COMMAND;
	case EOPNOTSUPP:
		return DTE__STATUS__STATUS_ERR_UNIMPLEMENTED;
	default:
		return DTE__STATUS__STATUS_ERR_INTERNAL;
	}
}

int derr_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return rc;
}

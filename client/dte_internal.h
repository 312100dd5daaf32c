/* client/dte_internal.h — libdte internals shared with dtectl (which links
 * libdte.a).  Not installed; not part of the ABI. */
#ifndef DTE_INTERNAL_H
#define DTE_INTERNAL_H

#include "client/dte.h"
#include "proto/dte.pb-c.h"

/* Client-side cap on reply frames. */
#define DTE_CLIENT_MAX_FRAME (256u * 1024u * 1024u)

/* One round trip.  Sets req->id.  On DTE_OK *resp holds the reply (free
 * with dte__response__free_unpacked(resp, NULL)); a daemon-side error is
 * returned as its dte_err with the daemon's message in dte_errmsg(). */
int dte__call(dte_t *h, Dte__Request *req, Dte__Response **resp);

/* The same, passing descriptor fd (>= 0) with SCM_RIGHTS alongside the
 * request, and allowing wait_ms more than the handle's timeout for the
 * reply (requests the daemon answers when a condition holds). */
int dte__call_ex(dte_t *h, Dte__Request *req, int fd, unsigned wait_ms, Dte__Response **resp);

/* The protocol version negotiated on this handle (0 before hello). */
uint32_t dte__version(const dte_t *h);

/* Map a daemon status code to an enum dte_err. */
int dte__status_to_err(Dte__Status code);

#endif

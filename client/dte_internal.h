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

/* An async publish sent on a handle (dte_publish_ex with
 * DTE_PUBLISH_ASYNC, pipelined): its accept reply is read by the handle's
 * next call (any call drains them, oldest first, before its own request)
 * and kept until dte_wait_captured takes it. */
#define DTE_PENDING_MAX 64
enum { DTE_PEND_SENT = 1, DTE_PEND_READ = 2 };
struct dte_pending {
	uint32_t id;                /* the request's id */
	int state;                  /* DTE_PEND_* */
	int rc;                     /* DTE_PEND_READ: the daemon's answer */
	char *job;
	uint64_t participant, version;
	char err[256];              /* rc < 0: the daemon's reason */
	uint8_t cuda_event[64];     /* rc == 0: PublishReply.cuda_capture_event */
	uint32_t cuda_event_len;
};

/* Sends req (a PublishRequest with async set) and returns without its
 * reply, which stays pending on the handle. */
int dte__send_async(dte_t *h, Dte__Request *req);

/* Reads every pending reply, then takes the entry of (job, participant,
 * version; 0: that participant's newest) out of the handle into *out
 * (out->job is NULL on return).  Returns 1 if there was one (DTE_OK
 * answer), 0 if none, the publish's refusal (with its reason in
 * dte_errmsg) or a broken stream's error. */
int dte__take_pending(dte_t *h, const char *job, uint64_t participant, uint64_t version,
		      struct dte_pending *out);

/* The protocol version negotiated on this handle (0 before hello). */
uint32_t dte__version(const dte_t *h);

/* Map a daemon status code to an enum dte_err. */
int dte__status_to_err(Dte__Status code);

#endif

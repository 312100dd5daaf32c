/* daemon/dispatch.h — one request frame in, one reply frame out.
 *
 * The chrony-style ladder of checks (decodes, known command, daemon-side
 * command, hello done, handler exists) lives here, apart from the socket
 * code in ctl.c, so it can be driven by unit tests with raw bytes.
 */
#ifndef DTED_DISPATCH_H
#define DTED_DISPATCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include "daemon/dreply.h"
#include "daemon/job_api.h"
#include "proto/cmdtab.h"
#include "proto/dte.pb-c.h"

typedef Dte__Status (*dcmd_fn)(struct dsrv *srv, struct dsess *s, const Dte__Request *req,
			       Dte__Response *resp, struct dreply *r);

/* Handle one request body.  Always produces a reply frame in *out
 * (malloc()ed) unless memory runs out (-1).  s->close_after says whether
 * the connection must be closed once the reply is written. */
int ddispatch(struct dsrv *srv, struct dsess *s, const uint8_t *body, size_t len,
	      uint8_t **out, size_t *outlen);

/* Pack a reply built outside ddispatch (deferred answers). */
int ddispatch_pack(Dte__Response *resp, uint32_t max, uint8_t **out, size_t *outlen);

/* A reply frame carrying only an error (for framing errors that never
 * reach ddispatch).  -1 on allocation failure. */
int ddispatch_error(Dte__Status code, const char *msg, uint8_t **out, size_t *outlen);

/* Handler for a command, NULL when none (local or not yet implemented). */
dcmd_fn ddispatch_handler(enum dte_cmd_id id);

/* Handlers (daemon/cmd_*.c). */
Dte__Status dcmd_hello(struct dsrv *, struct dsess *, const Dte__Request *, Dte__Response *,
		       struct dreply *);
Dte__Status dcmd_ping(struct dsrv *, struct dsess *, const Dte__Request *, Dte__Response *,
		      struct dreply *);
Dte__Status dcmd_status(struct dsrv *, struct dsess *, const Dte__Request *, Dte__Response *,
			struct dreply *);
/* daemon/cmd_peer.c */
Dte__Status dcmd_peers(struct dsrv *, struct dsess *, const Dte__Request *, Dte__Response *,
		       struct dreply *);

/* Operator commands (daemon/cmd_ops.c); init registers the gauges the
 * metrics read from srv. */
void dcmd_ops_init(struct dsrv *srv);
Dte__Status dcmd_verify(struct dsrv *, struct dsess *, const Dte__Request *, Dte__Response *,
			struct dreply *);
Dte__Status dcmd_resync(struct dsrv *, struct dsess *, const Dte__Request *, Dte__Response *,
			struct dreply *);
Dte__Status dcmd_metrics(struct dsrv *, struct dsess *, const Dte__Request *, Dte__Response *,
			 struct dreply *);
Dte__Status dcmd_config(struct dsrv *, struct dsess *, const Dte__Request *, Dte__Response *,
			struct dreply *);
Dte__Status dcmd_log_level(struct dsrv *, struct dsess *, const Dte__Request *, Dte__Response *,
			   struct dreply *);

/* Sync engine handlers (daemon/cmd_job.c). */
#define DCMD_DECL(n) Dte__Status dcmd_##n(struct dsrv *, struct dsess *, const Dte__Request *, \
					  Dte__Response *, struct dreply *);
DCMD_DECL(register_buffer)
DCMD_DECL(unregister_buffer)
DCMD_DECL(job_create)
DCMD_DECL(attach)
DCMD_DECL(detach)
DCMD_DECL(publish)
DCMD_DECL(mark)
DCMD_DECL(wait_captured)
DCMD_DECL(wait)
DCMD_DECL(wait_staged)
DCMD_DECL(apply)
DCMD_DECL(query_version)
DCMD_DECL(jobs)
DCMD_DECL(job)
DCMD_DECL(history)
#undef DCMD_DECL

/* The sync engine's request for req on s (daemon/job_api.h): its deferred
 * answer is packed and sent on s's connection (cmd_job.c). */
struct jreq dcmd_jreq(struct dsrv *srv, const struct dsess *s, const Dte__Request *req);
/* A verify's result as the wire's VerifyReply (sv, svp: room for
 * r->n_results each; strings borrowed from r). */
void dcmd_verify_out(Dte__VerifyReply *o, const struct jverify_res *r, Dte__SinkVerify *sv,
		     Dte__SinkVerify **svp);

#endif

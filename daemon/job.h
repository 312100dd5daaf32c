/* daemon/job.h — the same-cluster sync engine (docs/SYNC.md).
 *
 * Jobs, participants, the coordinator's plans, the source side (capture,
 * COUNTS/PAYLOAD) and the sink side (staging, apply, verify).  Everything
 * between daemons, including this daemon talking to itself, is a
 * peer.proto record through the engine's transport (daemon/engine_io.h;
 * by default daemon/route.h).  Control handlers live in
 * daemon/cmd_job.c; they call the functions below and answer from the
 * Dte__ messages these fill.  One loop thread owns all state (chrony
 * style); only captures and heavy steps run on the I/O's workers
 * (job_capture.c, job_task.c).
 */
#ifndef DTED_JOB_H
#define DTED_JOB_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>
#include "daemon/derr.h"
#include "daemon/engine_io.h"
#include "proto/dte.pb-c.h"
#include "proto/peer.pb-c.h"

/* PEER_PROTO_VERSION, its supported range and the control records'
 * rules: proto/peer_protocol.h. */
#include "proto/peer_protocol.h"

/* The operations a role's file implements: publish, mark (job_src.h);
 * apply (job_sink.h).  Declared there, part of this API, with the
 * conventions of the control operations below. */
#include "daemon/job_sink.h"
#include "daemon/job_src.h"

struct dtc_backend;
struct dreply;

/* The engine: an instance, opaque here (its state: daemon/job_state.h).
 * Every operation below takes the engine it acts on; nothing of it is
 * global, so two engines can live in one process. */
struct dte_engine;

/* A new engine with its I/O (daemon/engine_io.h; *io is copied and the
 * engine owns it from here, even when this fails: io->fini is called by
 * dte_engine_free): its timers and wake-up made, its events registered,
 * and its receiver, node-down and sealer attached to the transport.
 * NULL when it cannot be made (logged).  backend_name is borrowed and
 * must outlive it. */
struct dte_engine *dte_engine_new_io(const struct dte_engine_io *io,
				     const struct dtc_backend *be, const char *backend_name);
/* dte_engine_new_io with the default I/O (daemon/engine_io_uv.c): libuv
 * on loop and the process's router (route.c, which delivers to the
 * engine made last).  loop NULL: no timers and no workers (work runs
 * inline; unit tests). */
struct dte_engine *dte_engine_new(uv_loop_t *loop, const struct dtc_backend *be,
				  const char *backend_name);
/* The default I/O itself (daemon/engine_io_uv.c), for a caller that
 * wants to wrap it: 0, or -ENOMEM. */
int dte_engine_io_uv(uv_loop_t *loop, struct dte_engine_io *io);
/* Shutdown: waits for its work on workers, frees every job and wait,
 * detaches from the transport, frees its timers and wake, ends its I/O
 * (io.fini: the default runs the loop until libuv has let go of the
 * handles), drops what resync remembered, and ends the process-level
 * device scratch and buffers it set up (jcuda_fini, dbuf_fini: one
 * engine per process today).  NULL is fine. */
void dte_engine_free(struct dte_engine *e);
/* Where deferred answers go (waits, attaches, captures and applies that
 * finish later): the control server's dctl_reply, which main.c installs
 * after dte_engine_new, so the engine calls nothing of the server above
 * it.  None installed: such an answer is logged and dropped. */
void job_set_reply(struct dte_engine *e, int (*reply)(uint64_t conn, Dte__Response *resp));
/* How many versions a sink may hold staged and unapplied (config
 * max_staged_versions); past it its staging is dropped and its next
 * version is dense (daemon/job_sink_stage.c). */
void job_set_max_staged(struct dte_engine *e, uint32_t n);

/* Called after every job the engine creates (not an idempotent repeat),
 * with the request: main.c registers job_persist.c's save here, so a
 * restart creates the job again; the engine knows nothing of
 * persistence.  NULL: none. */
void job_set_created_hook(struct dte_engine *e,
			  void (*created)(struct dte_engine *e, const Dte__JobCreateRequest *rq));

/* Records from other daemons (and this one), attached to the transport
 * at dte_engine_new_io (engine_io.h; route_set_receiver by default).  hdr/data are
 * borrowed for the call.  Malformed or refused records are logged and
 * counted, never trusted. */
void job_peer_recv(struct dte_engine *e, const char *from_node, Dtep__PeerMsgType type,
		   const uint8_t *hdr, size_t hdrlen, const void *data, size_t len);
void job_peer_down(struct dte_engine *e, const char *node);

/* A control connection closed: its participants detach, its waits end,
 * its buffers are released. */
void job_conn_gone(struct dte_engine *e, uint64_t conn_id);

/* Control operations.  Each returns 0 or, on error, a negative errno and a
 * reason in err (daemon/derr.h; the control handlers map it to the wire
 * status).  `conn` is the caller's connection id, `req_id` its request id
 * (for deferred answers). */
int job_create(struct dte_engine *e, const Dte__JobCreateRequest *rq, Dte__JobCreateReply *rep,
	       char *err, size_t errlen);
/* 0 with *deferred = 1: the answer comes later. */
int job_attach(struct dte_engine *e, uint64_t conn, uint32_t req_id,
	       const Dte__AttachRequest *rq, int *deferred, char *err, size_t errlen);
int job_detach(struct dte_engine *e, uint64_t conn, const Dte__DetachRequest *rq, char *err,
	       size_t errlen);
int job_wait(struct dte_engine *e, uint64_t conn, uint32_t req_id, const Dte__WaitRequest *rq,
	     Dte__WaitReply *rep, int *deferred, char *err, size_t errlen);
/* The capture of an async publish no longer reads the source's buffers
 * (pub: storage for the answer's counts, rep->publish points at it). */
int job_wait_captured(struct dte_engine *e, uint64_t conn, uint32_t req_id,
		      const Dte__WaitCapturedRequest *rq, Dte__WaitCapturedReply *rep,
		      Dte__PublishReply *pub, int *deferred, char *err, size_t errlen);
int job_wait_staged(struct dte_engine *e, uint64_t conn, uint32_t req_id,
		    const Dte__WaitStagedRequest *rq, Dte__WaitStagedReply *rep, int *deferred,
		    char *err, size_t errlen);
int job_query_version(struct dte_engine *e, uint64_t conn, const Dte__QueryVersionRequest *rq,
		      Dte__QueryVersionReply *rep, char *err, size_t errlen);

/* Introspection; strings and arrays are allocated from r. */
int job_list(struct dte_engine *e, Dte__JobsReply *rep, struct dreply *r);
int job_info(struct dte_engine *e, const char *name, Dte__JobReply *rep, struct dreply *r,
	     char *err, size_t errlen);
int job_history(struct dte_engine *e, const char *name, uint32_t limit, Dte__HistoryReply *rep,
		struct dreply *r, char *err, size_t errlen);

#endif

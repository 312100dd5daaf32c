/* daemon/job.h — the same-cluster sync engine (docs/SYNC.md).
 *
 * Jobs, participants, the coordinator's plans, the source side (capture,
 * COUNTS/PAYLOAD) and the sink side (staging, apply, verify).  Everything
 * between daemons, including this daemon talking to itself, is a
 * peer.proto record through the engine's transport (daemon/engine_io.h;
 * by default daemon/route.h).  Control handlers live in
 * daemon/cmd_job.c; they call the functions below with the plain requests
 * of daemon/job_api.h and build the control protocol's replies from the
 * results (no wire type in the engine's API).  One loop thread owns all state (chrony
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
#include "daemon/job_api.h"
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
/* How many versions a sink may hold staged and unapplied (config
 * max_staged_versions); past it its staging is dropped and its next
 * version is dense (daemon/job_sink_stage.c). */
void job_set_max_staged(struct dte_engine *e, uint32_t n);
/* As the jobs' coordinator: relay trees over each sink rank's replicas,
 * each replica feeding `fanout` others, `roots` of them fed by the
 * sources (config [peer] relay_fanout, relay_roots; docs/SYNC.md,
 * "Relay between sink daemons").  fanout 0: off, every replica fed by
 * the sources.  Takes effect at the next re-plan. */
void job_set_relay(struct dte_engine *e, uint32_t fanout, uint32_t roots, uint32_t lag_ms);
/* [peer] relay_shape: measured (1): the coordinator orders each tree by
 * the members' measured send rates (a node under a third of its tree's median
 * is a leaf) and, with rates of the sources and the relays, picks roots
 * and fanout (at most relay_fanout) by relay_plan_build's model; fixed
 * (0, the engine's default): relay_roots and relay_fanout in replica
 * order (job_coord.c, relay_assign; docs/SYNC.md).  rate_age_ms ([peer]
 * relay_rate_max_age_ms; 0: 300000): a rate not measured again for this
 * long is not used (a leaf sends nothing: its old rate expires, and it
 * is planned in its place again to be measured anew). */
void job_set_relay_shape(struct dte_engine *e, int measured, uint32_t rate_age_ms);

/* Called after every job the engine creates (not an idempotent repeat),
 * with the request: main.c registers job_persist.c's save here, so a
 * restart creates the job again; the engine knows nothing of
 * persistence.  NULL: none. */
void job_set_created_hook(struct dte_engine *e,
			  void (*created)(struct dte_engine *e, const struct jcreate_args *a));

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
 * status).  `conn` is the caller's connection id; rq (daemon/job_api.h)
 * its connection, request id and completion.  An operation that may answer
 * later sets *deferred: 0, and the result is in *res now; 1, and
 * rq->done gets the answer once it is known (struct jres, its op named
 * below).  Results are filled on success only; the caller zeroes them. */
int job_create(struct dte_engine *e, const struct jcreate_args *a, struct jcreate_res *res,
	       char *err, size_t errlen);
/* Always *deferred = 1 on success (JOP_ATTACH): the answer comes with the plan. */
int job_attach(struct dte_engine *e, const struct jreq *rq, const struct jattach_args *a,
	       int *deferred, char *err, size_t errlen);
int job_detach(struct dte_engine *e, uint64_t conn, const char *job, uint64_t participant,
	       char *err, size_t errlen);
/* JOP_WAIT */
int job_wait(struct dte_engine *e, const struct jreq *rq, const struct jwait_args *a,
	     struct jwait_res *res, int *deferred, char *err, size_t errlen);
/* The capture of an async publish no longer reads the source's buffers
 * (JOP_WAIT_CAPTURED: the capture's counts). */
int job_wait_captured(struct dte_engine *e, const struct jreq *rq, const struct jwait_args *a,
		      struct jpublish_res *res, int *deferred, char *err, size_t errlen);
/* JOP_WAIT_STAGED */
int job_wait_staged(struct dte_engine *e, const struct jreq *rq, const struct jwait_args *a,
		    struct jstaged_res *res, int *deferred, char *err, size_t errlen);
int job_query_version(struct dte_engine *e, uint64_t conn, const char *job,
		      uint64_t participant, struct jquery_res *res, char *err, size_t errlen);

/* Introspection; the arrays are allocated from r (the strings point
 * into the engine). */
int job_list(struct dte_engine *e, struct jjob_summary **jobs, size_t *n, struct dreply *r);
int job_info(struct dte_engine *e, const char *name, struct jjob_info *res, struct dreply *r,
	     char *err, size_t errlen);
int job_history(struct dte_engine *e, const char *name, uint32_t limit,
		struct jhist_entry **entries, size_t *n, struct dreply *r, char *err,
		size_t errlen);

#endif

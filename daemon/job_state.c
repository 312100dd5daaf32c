/* daemon/job_state.c — the sync engine's bottom layer (docs/SYNC.md,
 * "Layers"): lookups over an engine's jobs, participants, plan parts and
 * pairs, sending a record to a node, deferred control answers and the
 * table of control requests answered later (struct jwait), history and
 * the layouts a participant is built from.  It calls nothing of the
 * engine above it: a file above that must hear of something gives a
 * completion with its request (a wait's try, the storage writer's
 * canonical sink), which runs from here or from the file it was given to.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/job_ext.h"
#include "daemon/job_state.h"
#include "daemon/job_snapshot.h"
#include "daemon/log.h"
#include "daemon/side_table.h"


double job_ms_since(const struct dte_engine *e, uint64_t t0)
{
	return (double)(jio_now(e) - t0) / 1e6;
}

/* ------------------------------------------------------------------ I/O */

int jio_queue(struct dte_engine *e, struct dte_work *w, void (*run)(struct dte_work *w),
	      void (*after)(struct dte_work *w, int cancelled))
{
	w->run = run;
	w->after = after;
	w->io_priv = NULL;
	if (!e->io.work_queue)
		return -ENOSYS;
	return e->io.work_queue(e->io.ctx, w);
}

void jio_timer_start(struct dte_engine *e, struct dte_timer *t, uint64_t timeout_ms,
		     uint64_t repeat_ms)
{
	if (t)
		e->io.timer_start(e->io.ctx, t, timeout_ms, repeat_ms);
}

void jio_timer_stop(struct dte_engine *e, struct dte_timer *t)
{
	if (t)
		e->io.timer_stop(e->io.ctx, t);
}

/* ---------------------------------------------------------------- lookups */

struct job *job_find(struct dte_engine *e, const char *name)
{
	for (struct job *j = e->jobs; j; j = j->next)
		if (name && !strcmp(j->name, name))
			return j;
	return NULL;
}

struct jlocal *job_local(struct job *j, uint64_t id)
{
	for (struct jlocal *l = j->locals; l; l = l->next)
		if (l->info.id == id)
			return l;
	return NULL;
}

struct jlocal *job_local_owned(struct job *j, uint64_t id, uint64_t conn)
{
	struct jlocal *l = job_local(j, id);

	return l && l->owner == conn ? l : NULL;
}

int job_source_owned(struct dte_engine *e, const char *name, uint64_t id, uint64_t conn,
		     struct job **jp, struct jlocal **lp, char *err, size_t errlen)
{
	struct job *j = job_find(e, name);
	struct jlocal *l;

	if (!j)
		return derr_fail(err, errlen, -ENOENT, "unknown job \"%s\"", name ? name : "");
	l = job_local_owned(j, id, conn);
	if (!l || l->info.role != JROLE_SOURCE)
		return derr_fail(err, errlen, -ENOENT,
				 "job %s: no source participant %llx on this connection", j->name,
				 (unsigned long long)id);
	*jp = j;
	*lp = l;
	return 0;
}

const struct jpinfo *job_part(const struct job *j, uint64_t id)
{
	for (size_t i = 0; i < j->nparts; i++)
		if (j->parts[i].id == id)
			return &j->parts[i];
	return NULL;
}

const char *job_node_address(const struct job *j, const char *node)
{
	for (size_t i = 0; i < j->naddr; i++)
		if (!strcmp(j->addr_node[i], node))
			return j->addr_addr[i];
	return NULL;
}

struct jpair *job_pair(struct job *j, uint64_t src, uint64_t dst)
{
	for (size_t i = 0; i < j->npairs; i++)
		if (j->pairs[i].src == src && j->pairs[i].dst == dst)
			return &j->pairs[i];
	return NULL;
}

struct dbuf *jlocal_buf(const struct jlocal *l, uint32_t layout_id, size_t *slot)
{
	for (size_t i = 0; i < l->nbufs; i++) {
		if (l->buf_ids[i] == layout_id) {
			if (slot)
				*slot = i;
			return l->bufs[i];
		}
	}
	return NULL;
}

void job_fill_ref(const struct job *j, Dtep__JobRef *ref)
{
	dtep__job_ref__init(ref);
	ref->job = (char *)j->name;
	/* With peer auth the token stays here: the record carries a MAC of
	 * the key derived from it instead (job_auth.h). */
	ref->token = j->auth ? (char *)protobuf_c_empty_string : (char *)j->token;
}

int job_send_to_node(struct job *j, const char *node, Dtep__PeerMsgType type,
		     const ProtobufCMessage *msg, const void *data, size_t len)
{
	int rc;

	rc = jio_send(j->eng, node, job_node_address(j, node), type, msg, data, len);

	if (rc < 0)
		DLOG_W("job %s: cannot send record %d to %s: %s", j->name, (int)type, node,
		       strerror(-rc));
	return rc;
}

/* job_send_to_node for a part: data is given, released once the
 * transport is done with it (engine_io.h's send_given). */
int job_send_to_node_given(struct job *j, const char *node, Dtep__PeerMsgType type,
			   const ProtobufCMessage *msg, void *data, size_t len,
			   void (*release)(void *data, void *rarg), void *rarg)
{
	int rc;

	rc = j->eng->io.send_given(j->eng->io.ctx, node, job_node_address(j, node), type, msg,
				   data, len, release, rarg);
	if (rc < 0)
		DLOG_W("job %s: cannot send record %d to %s: %s", j->name, (int)type, node,
		       strerror(-rc));
	return rc;
}

/* Send rates toward nodes (struct jlink; RATES, the relay shape). */
static struct jlink *jlink_get(struct job *j, const char *node, int add)
{
	struct jlink *k;

	for (size_t i = 0; i < j->nlinks; i++)
		if (!strcmp(j->links[i].node, node))
			return &j->links[i];
	if (!add || !(k = realloc(j->links, (j->nlinks + 1) * sizeof(*k))))
		return NULL;
	j->links = k;
	k = &j->links[j->nlinks++];
	memset(k, 0, sizeof(*k));
	snprintf(k->node, sizeof(k->node), "%s", node);
	return k;
}

void jlink_out(struct job *j, const char *node)
{
	struct jlink *k = node ? jlink_get(j, node, 1) : NULL;

	if (k)
		rate_meter_out(&k->m, jio_now(j->eng));
}

void jlink_done(struct dte_engine *e, const char *job, const char *node, uint64_t bytes)
{
	struct job *j = job_find(e, job);
	struct jlink *k = j ? jlink_get(j, node, 0) : NULL;

	if (k && rate_meter_done(&k->m, jio_now(e), bytes))
		j->rates_gen++;
}

int jlinks_busy(const struct job *j)
{
	for (size_t i = 0; i < j->nlinks; i++)
		if (j->links[i].m.inflight)
			return 1;
	return 0;
}

void jpair_free_state(struct jpair *p)
{
	if (p->dirty) {
		for (size_t i = 0; i < p->n; i++)
			free(p->dirty[i]);
		free(p->dirty);
		p->dirty = NULL;
	}
	side_free(p->side);
	p->side = NULL;
	jsnap_free_all(p->snap, p->n);
	p->snap = NULL;
}

struct jhist *jhist_find(struct job *j, uint64_t version)
{
	size_t have = j->nhist < JOB_HISTORY ? j->nhist : JOB_HISTORY;

	for (size_t i = 0; i < have; i++) {
		struct jhist *h = &j->hist[(j->nhist - 1 - i) % JOB_HISTORY];

		if (h->version == version)
			return h;
		if (h->version < version)
			break;
	}
	return NULL;
}

/* ----------------------------------------------------------- participants */

void jlocal_role_misuse(const struct jlocal *l, int want, const char *func)
{
	const char *w = want == JROLE_SOURCE ? "source" : "sink";

	if (!l)
		DLOG_E("%s: NULL participant, not a %s (a bug)", func, w);
	else
		DLOG_E("%s: participant %llx is a %s, not a %s (a bug)", func,
		       (unsigned long long)l->info.id, l->info.role == JROLE_SOURCE ? "source" :
		       l->info.role == JROLE_SINK ? "sink" : "participant of no role", w);
	abort();
}

uint64_t job_participant_id_new(struct dte_engine *e)
{
	return ((uint64_t)e->node_hash << 32) | ++e->next_local;
}

/* ---------------------------------------------------------------- layouts */

int jlayout_build(const struct job *j, int role, const char *desc, uint32_t rank,
		  const char *shards, struct dte_layout *l, char *err, size_t errlen)
{
	int rc;

	if (!strncmp(desc, "json:", 5))
		/* The daemon would read a file a client names. */
		return derr_fail(err, errlen, -EINVAL, "json: layouts are not accepted from "
				 "clients; use a generator (megatron:, fsdp:, sglang:, vllm:)");
	if (!strcmp(desc, JSTORE_CANON_LAYOUT)) {
		/* The storage writer's sink, a relay reader's source
		 * (job_storage.c). */
		if ((rc = jstore_canonical_layout(&j->spec, role, l, err, errlen)) < 0)
			return rc;
	} else if (dte_layout_from_desc_shards(l, &j->spec, desc,
					       role == JROLE_SOURCE ? DTE_LAYOUT_SOURCE : DTE_LAYOUT_SINK,
					       shards, err, errlen)) {
		/* The layout library says why; what it refuses is the request. */
		return -EINVAL;
	}
	if (rank >= l->nranks) {
		uint32_t top = l->nranks ? l->nranks - 1 : 0;

		dte_layout_fini(l);
		return derr_fail(err, errlen, -EINVAL, "%s has ranks 0..%u; rank %u does not exist",
				 desc, top, rank);
	}
	return 0;
}

int jstore_canonical_layout(const struct dte_spec *spec, int role, struct dte_layout *l,
			    char *err, size_t errlen)
{
	int src = role == JROLE_SOURCE;
	int64_t off = 0;

	dte_layout_init(l, src ? DTE_LAYOUT_SOURCE : DTE_LAYOUT_SINK, spec->hash);
	snprintf(l->desc, sizeof(l->desc), "%s", JSTORE_CANON_LAYOUT);
	for (uint32_t t = 0; t < spec->n; t++) {
		const struct dte_spec_tensor *st = &spec->t[t];
		/* A source's FP32 tensor is 16-bit units of its FP32 buffer
		 * (dte_piece_units): its halves, two units to an element. */
		int64_t units = src && dte_spec_is_halves(spec, t) ? 2 : 1;
		struct dte_piece p;
		int64_t s = 1;

		memset(&p, 0, sizeof(p));
		p.tensor = t;
		p.ndim = st->ndim;
		p.offset = off * units;	/* off counts buffer elements */
		for (int d = (int)st->ndim - 1; d >= 0; d--) {
			p.hi[d] = st->shape[d];
			p.stride[d] = s;
			s *= st->shape[d];
		}
		if (dte_layout_add_piece(l, &p) < 0)
			goto oom;
		/* The sink's buffer is BF16, one unit an element; the
		 * source's is FP32, one element a BF16 tensor's element or
		 * an FP32 tensor's two halves.  No optimizer state: the
		 * exp_avg and exp_avg_sq ids name θ's buffer (buf_m = buf_v
		 * = 0), read by no detect (the relay reader's job is detect
		 * = snapshot). */
		off += st->numel / units;
	}
	if (dte_layout_add_buffer(l, 0, 0, off, "canonical") < 0)
		goto oom;
	l->nranks = 1;
	dte_layout_sort_buffers(l);
	return 0;
oom:
	dte_layout_fini(l);
	return derr_fail(err, errlen, -ENOMEM, "out of memory");
}

/* ---------------------------------------------------------------- answers */

void job_done(const struct jreq *rq, int rc, const char *msg, const struct jres *res)
{
	if (rc < 0) {
		DLOG_I("control: connection %llu: %s", (unsigned long long)rq->conn, msg);
		res = NULL;
	}
	if (rq->done)
		rq->done(rq, rc, msg ? msg : "", res);
	else
		DLOG_E("control: connection %llu: an answer with nowhere to go (no completion)",
		       (unsigned long long)rq->conn);
}

/* ------------------------------------------------------------------ waits */

/* The waits' tick runs while any wait is kept: it asks them again, for
 * their deadlines (its callback, made with the engine, calls
 * jwait_check). */
static void wait_tick_update(struct dte_engine *e)
{
	if (!e->timer)
		return;
	if (e->waits && !e->timer_on) {
		jio_timer_start(e, e->timer, JOB_WAIT_TICK_MS, JOB_WAIT_TICK_MS);
		e->timer_on = 1;
	} else if (!e->waits && e->timer_on) {
		jio_timer_stop(e, e->timer);
		e->timer_on = 0;
	}
}

int jwait_add(struct dte_engine *e, const struct jwait *w, uint32_t timeout_ms)
{
	struct jwait *n = malloc(sizeof(*n));

	if (!n)
		return -ENOMEM;
	*n = *w;
	n->deadline = jio_now(e) + (uint64_t)timeout_ms * 1000000u;
	n->next = e->waits;
	e->waits = n;
	wait_tick_update(e);
	return 0;
}

static void wait_leave(struct dte_engine *e, struct jwait **pp)
{
	struct jwait *w = *pp;

	*pp = w->next;
	if (w->gone)
		w->gone(e, w);
	free(w);
}

/* A completion may make progress that asks again (an undo started by a
 * park that ends, say): that ask is a pass more of the loop here, never
 * a pass inside a pass (which could free the wait being asked). */
void jwait_check(struct dte_engine *e)
{
	if (e->waits_checking) {
		e->waits_again = 1;
		return;
	}
	e->waits_checking = 1;
	do {
		uint64_t now = jio_now(e);
		struct jwait **pp = &e->waits;

		e->waits_again = 0;
		while (*pp) {
			struct jwait *w = *pp;

			if (w->try(e, w, now >= w->deadline)) {
				struct jwait **q = &e->waits;

				/* Where it is now: a completion may have added one. */
				while (*q != w)
					q = &(*q)->next;
				wait_leave(e, q);
			} else {
				pp = &w->next;
			}
		}
	} while (e->waits_again);
	e->waits_checking = 0;
	wait_tick_update(e);
}

void jwait_drop_conn(struct dte_engine *e, uint64_t conn)
{
	struct jwait **pp = &e->waits;

	while (*pp) {
		if ((*pp)->rq.conn == conn)
			wait_leave(e, pp);
		else
			pp = &(*pp)->next;
	}
	wait_tick_update(e);
}

void jwait_fini(struct dte_engine *e)
{
	while (e->waits) {
		struct jwait *w = e->waits;

		e->waits = w->next;
		free(w);
	}
}

/* daemon/job_src.c — the source side: mark, capture, COUNTS + PAYLOAD,
 * and what sinks acknowledge.
 *
 * A pair goes sparse only when the sink is known to build on the version
 * this source sent last (no refusal or checksum failure since, same
 * entries) and every optimizer step since then is in the dirty bitmaps:
 * by marks (K > 1) and the publish's own scan of its step.  Anything else
 * is dense (DESIGN §2.5, §2.6).  The sink checks the base itself, so a
 * sparse version built on a version the sink later refused is refused in
 * turn, never applied.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/buf.h"
#include "daemon/job_src.h"
#include "daemon/job_state.h"
#include "daemon/job_src_engine.h"
#include "daemon/job_capture.h"
#include "daemon/job_snapshot.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "gpu/backend.h"
#include "gpu/codec.h"
#include "gpu/compute.h"

#define FAIL(rc, ...) derr_fail(err, errlen, rc, __VA_ARGS__)

/* Per group constants from the request into *out (malloc'd, the caller
 * frees): 0, or -EINVAL / -ENOMEM with the reason.  A group carries its own step count when its
 * tensors keep one (registered shards: a tensor whose grad was None did
 * not step).  One that did not step since the last publish or mark is
 * unchanged: the inverse with lr = 0 and no decay is the identity
 * (θ_{t-1} = θ_t), so its elements are found unchanged and nothing of it
 * is sent, whatever its moments hold (eps = 1 keeps m/D finite). */
static int derive_groups(const struct jhparams *g, size_t n, int64_t step,
			 struct dtc_consts **out, char *err, size_t errlen)
{
	struct dtc_consts *k;

	*out = NULL;
	if (n > JOB_MAX_GROUPS)
		return FAIL(-EINVAL, "%zu optimizer groups; at most %d", n, JOB_MAX_GROUPS);
	if (!(k = calloc(n ? n : 1, sizeof(*k))))
		return FAIL(-ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		struct dtc_hparams hp = {
			.lr = g[i].lr, .beta1 = g[i].beta1, .beta2 = g[i].beta2, .eps = g[i].eps,
			.weight_decay = g[i].weight_decay, .step = g[i].step ? g[i].step : step,
		};
		char why[128];

		if (g[i].step < 0) {
			free(k);
			return FAIL(-EINVAL, "group %zu: step %lld < 0", i, (long long)g[i].step);
		}
		if (g[i].unchanged) {
			hp.lr = 0;
			hp.weight_decay = 0;
			hp.eps = 1;
			if (hp.step < 1)
				hp.step = 1;
		}

		if (!g[i].variant || !*g[i].variant || !strcmp(g[i].variant, "torch"))
			hp.variant = DTC_VARIANT_TORCH;
		else if (!strcmp(g[i].variant, "fused"))
			hp.variant = DTC_VARIANT_FUSED;
		else {
			free(k);
			return FAIL(-EINVAL, "group %zu: variant \"%s\" unknown (torch, fused)", i,
				    g[i].variant);
		}
		if (dtc_hparams_derive(&hp, &k[i], why, sizeof(why)) < 0) {
			free(k);
			return FAIL(-EINVAL, "group %zu: %s", i, why);
		}
	}
	*out = k;
	return 0;
}

/* ------------------------------------------------------------- captures */

static void cap_work(struct dte_work *w)
{
	struct jcap *c = (struct jcap *)w;

	c->rc = jcap_run(c);
}

static void cap_after(struct dte_work *w, int cancelled);

/* A task over l's pairs (all of them, or only `scanned` ones for a mark);
 * dirty bitmaps move into it. */
static struct jcap *cap_new(struct job *j, struct jlocal *l, int kind, const struct jreq *rq,
			    int64_t step, const struct dtc_consts *k, size_t ngroups)
{
	struct jcap *c = calloc(1, sizeof(*c));
	size_t n = 0;

	if (!c)
		return NULL;
	if (pthread_mutex_init(&c->mu, NULL)) {
		free(c);
		return NULL;
	}
	c->mu_init = 1;
	c->q_tail = &c->q;
	c->eng = j->eng;
	c->part_bytes = j->eng->part_bytes;
	c->kind = kind;
	c->detect = j->detect;
	c->zstd_level = j->zstd_level;
	snprintf(c->job, sizeof(c->job), "%s", j->name);
	c->participant = l->info.id;
	if (rq)
		c->rq = *rq;
	c->epoch = j->epoch;
	c->step = step;
	c->k = malloc((ngroups ? ngroups : 1) * sizeof(*k));
	if (!c->k)
		goto fail;
	memcpy(c->k, k, ngroups * sizeof(*k));
	c->ngroups = ngroups;
	c->t0 = jio_now(j->eng);
	c->buf_ids = calloc(l->nbufs ? l->nbufs : 1, sizeof(*c->buf_ids));
	c->bufs = calloc(l->nbufs ? l->nbufs : 1, sizeof(*c->bufs));
	for (size_t i = 0; i < j->npairs; i++)
		n += j->pairs[i].src == l->info.id;
	c->p = calloc(n ? n : 1, sizeof(*c->p));
	if (!c->buf_ids || !c->bufs || !c->p)
		goto fail;
	for (size_t i = 0; i < j->npairs; i++) {
		const struct jpair *p = &j->pairs[i];
		struct jcap_pair *cp = &c->p[c->np];

		if (p->src != l->info.id)
			continue;
		cp->dst = p->dst;
		cp->hash = p->hash;
		cp->n = p->n;
		cp->e = malloc((p->n ? p->n : 1) * sizeof(*cp->e));
		if (!cp->e)
			goto fail;
		memcpy(cp->e, p->e, p->n * sizeof(*cp->e));
		c->np++;
	}
	for (size_t i = 0; i < l->nbufs; i++) {
		c->buf_ids[i] = l->buf_ids[i];
		c->bufs[i] = l->bufs[i];
		if (c->bufs[i])
			dbuf_ref(c->bufs[i]);
		c->nbufs++;
	}
	return c;
fail:
	jcap_free(c);
	return NULL;
}

static void cap_take_dirty(struct job *j, struct jcap *c, struct jcap_pair *cp)
{
	struct jpair *p = job_pair(j, c->participant, cp->dst);

	cp->dirty = p->dirty;
	p->dirty = NULL;
	cp->side = p->side;	/* goes with dirty (side_table.h) */
	p->side = NULL;
	cp->snap = p->snap;
	p->snap = NULL;
}

/* What the task took from the pair goes back if it is still the same
 * pair and has none meanwhile; freed otherwise (by jcap_free).  Dirty
 * bitmaps go back only from a mark: a publish consumes them, so a job that
 * publishes every step holds no per-element state between versions. */
static void cap_return_dirty(struct job *j, struct jcap *c, struct jcap_pair *cp, int keep)
{
	struct jpair *p = j ? job_pair(j, c->participant, cp->dst) : NULL;

	/* Kept values follow the same rule, publish or mark. */
	if (cp->snap && p && p->hash == cp->hash && !p->snap && p->n == cp->n) {
		p->snap = cp->snap;
		cp->snap = NULL;
	}
	if (cp->dirty && keep && p && p->hash == cp->hash && !p->dirty && p->n == cp->n) {
		p->dirty = cp->dirty;
		cp->dirty = NULL;
		p->side = cp->side;
		cp->side = NULL;
	}
}

static void cap_start(struct jlocal *l, struct jcap *c)
{
	struct dte_engine *e = c->eng;

	jsource_of(l)->busy = 1;
	c->next = e->inflight;
	e->inflight = c;
	c->notify = e->parts_wake != NULL;
	if (jio_queue(e, &c->work, cap_work, cap_after) < 0) {
		/* No workers (or none to be had): capture here, answer the
		 * same way. */
		cap_work(&c->work);
		cap_after(&c->work, 0);
	}
}

static void cap_unlink(struct jcap *c)
{
	for (struct jcap **pp = &c->eng->inflight; *pp; pp = &(*pp)->next) {
		if (*pp == c) {
			*pp = c->next;
			return;
		}
	}
}

/* ------------------------------------------------------------------ mark */

int job_mark(struct dte_engine *e, const struct jreq *req, const struct jmark_args *rq,
	     struct jmark_res *rep, int *deferred, char *err, size_t errlen)
{
	struct job *j;
	struct dtc_consts *k;
	struct jlocal *l;
	int rc;

	*deferred = 0;
	if ((rc = job_source_owned(e, rq->job, rq->participant, req->conn, &j, &l, err,
				   errlen)) < 0)
		return rc;
	if (jsource_of(l)->busy)
		return FAIL(-EBUSY, "job %s: a capture is still running", j->name);
	if (rq->step < 1)
		return FAIL(-EINVAL, "job %s: step must be >= 1", j->name);
	if ((rc = derive_groups(rq->groups, rq->n_groups, rq->step, &k, err, errlen)) < 0)
		return rc;
	if (jsource_of(l)->last_version && rq->step == jsource_of(l)->covered + 1 &&
	    !jsource_of(l)->gap) {
		struct jcap *c = cap_new(j, l, JCAP_MARK, req, rq->step, k, rq->n_groups);

		free(k);
		if (!c)
			return FAIL(-ENOMEM, "out of memory");
		c->scan = 1;
		for (size_t i = 0; i < c->np; i++) {
			struct jpair *p = job_pair(j, l->info.id, c->p[i].dst);

			c->p[i].want_dirty = !p->sm.need_dense;
			cap_take_dirty(j, c, &c->p[i]);
		}
		*deferred = 1;
		cap_start(l, c);
		return 0;
	}
	free(k);
	if (rq->step > jsource_of(l)->covered) {
		/* Before the first publish nothing builds on marks (it is dense);
		 * after it, a missed step means the next publish is dense. */
		if (jsource_of(l)->last_version && !jsource_of(l)->gap) {
			jsource_of(l)->gap = 1;
			DLOG_I("job %s: mark of step %lld after step %lld: steps missed, next publish "
			       "dense", j->name, (long long)rq->step, (long long)jsource_of(l)->covered);
		}
		jsource_of(l)->covered = rq->step;
	}
	rep->dirty = 0;
	for (size_t i = 0; i < j->npairs; i++) {
		struct jpair *p = &j->pairs[i];

		if (p->src != l->info.id || !p->dirty)
			continue;
		for (size_t q = 0; q < p->n; q++) {
			uint64_t w = dtc_bitmap_words(&p->e[q].map);

			for (uint64_t x = 0; x < w; x++)
				rep->dirty += (uint64_t)__builtin_popcountll(p->dirty[q][x]);
		}
	}
	rep->gap = jsource_of(l)->gap;
	return 0;
}

static void mark_done(struct job *j, struct jlocal *l, struct jcap *c)
{
	struct jres res = { .op = JOP_MARK };

	for (size_t i = 0; i < c->np; i++)
		cap_return_dirty(j, c, &c->p[i], 1);
	if (c->rc < 0) {
		char msg[512];

		jsource_of(l)->gap = 1;
		snprintf(msg, sizeof(msg), "job %s: mark of step %lld: %s", j->name, (long long)c->step,
			 c->err);
		job_done(&c->rq, -EINVAL, msg, NULL);
		return;
	}
	jsource_of(l)->covered = c->step;
	jsource_of(l)->marked = 1;
	res.mark.dirty = c->dirty;
	res.mark.gap = jsource_of(l)->gap;
	job_done(&c->rq, 0, "", &res);
}

/* --------------------------------------------------------------- publish */

static struct jhist *hist_get(struct job *j, uint64_t version, int64_t step)
{
	struct jhist *h = jhist_find(j, version);

	if (h)
		return h;
	h = &j->hist[j->nhist % JOB_HISTORY];
	memset(h, 0, sizeof(*h));
	h->version = version;
	h->step = step;
	j->nhist++;
	j->published++;
	return h;
}

/* A remote pair's part, timed for the pair's link estimate
 * (pair_cost_part_out / _done) from the hand-over to the transport until
 * the transport gives the chunk back (sent, or dropped). */
struct part_ticket {
	struct jcap_pool *pool;   /* its engine's (which may be gone: pool->eng NULL) */
	int remote;               /* timed for the pair's link estimate */
	size_t cap;
	char job[JOB_NAME_MAX];
	char node[JOB_NODE_MAX];  /* the sink's, for the node's send rate (jlink) */
	uint64_t src, dst, len;
};

static void part_released(void *chunk, void *arg)
{
	struct part_ticket *t = arg;
	struct job *j = t->remote && t->pool->eng ? job_find(t->pool->eng, t->job) : NULL;
	struct jpair *p = j ? job_pair(j, t->src, t->dst) : NULL;

	jcap_chunk_release(t->pool, chunk, t->cap);
	if (p)
		pair_cost_part_done(&p->sm, jio_now(j->eng), t->len);
	if (j)
		jlink_done(j->eng, t->job, t->node, t->len);
	free(t);
}

/* Parts go as the worker frames them, COUNTS last (publish_done), once
 * the capture knows every count and checksum.  A part that cannot go
 * (re-plan, unknown sink, send error) loses the pair this version: no
 * COUNTS follows, so the sink never stages it, and the next is dense. */
static void send_part(struct job *j, const struct jcap *c, struct jcap_pair *cp,
		      struct jcap_part *q)
{
	Dtep__Payload pl = DTEP__PAYLOAD__INIT;
	Dtep__JobRef ref;
	const struct jpair *p = j ? job_pair(j, c->participant, cp->dst) : NULL;
	const struct jpinfo *dst = j ? job_part(j, cp->dst) : NULL;
	struct part_ticket *t;
	int rc;

	if (cp->parts_lost)
		return;
	if (!p || p->hash != cp->hash || j->epoch != c->epoch || !dst) {
		cp->parts_lost = 1;
		return;
	}
	job_fill_ref(j, &ref);
	pl.job = &ref;
	pl.epoch = j->epoch;
	pl.version = c->version;
	pl.src = c->participant;
	pl.dst = cp->dst;
	pl.encoding = q->chunk[4];
	pl.xxh3 = dtc_chunk_xxh3(q->chunk);
	pl.part = q->part;
	pl.first_entry = q->first;
	pl.entries = q->entries;
	if (q->counts) {
		pl.mode = cp->sparse ? DTEP__MODE__MODE_SPARSE : DTEP__MODE__MODE_DENSE;
		pl.base_version = cp->sparse ? c->base : 0;
		pl.n_counts = q->entries;
		pl.counts = q->counts;
	}
	pl.n_relay_direct = cp->ndirect;
	pl.relay_direct = cp->direct;
	/* The chunk itself goes out (no copy in the router): it comes back
	 * to the engine's pool once sent (part_released, jcap_chunk_release);
	 * its ticket says which engine, and times a remote pair's part. */
	if (!(t = malloc(sizeof(*t)))) {
		cp->parts_lost = 1;
		return;
	}
	jcap_chunk_given(j->eng->cpool);
	t->pool = j->eng->cpool;
	t->remote = cp->remote;
	t->cap = q->cap;
	snprintf(t->job, sizeof(t->job), "%s", j->name);
	t->src = c->participant;
	t->dst = cp->dst;
	t->len = q->len;
	snprintf(t->node, sizeof(t->node), "%s", dst->node);
	if (cp->remote) {
		pair_cost_part_out(&job_pair(j, c->participant, cp->dst)->sm, jio_now(j->eng));
		jlink_out(j, dst->node);
	}
	rc = job_send_to_node_given(j, dst->node, DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD, &pl.base,
				    q->chunk, q->len, part_released, t);
	q->chunk = NULL;
	q->cap = 0;
	if (rc < 0)
		cp->parts_lost = 1;
	else
		cp->parts_sent++;
}

/* Send whatever parts c's worker framed so far, in order. */
static void send_parts(struct jcap *c)
{
	struct jcap_part *q = jcap_take_parts(c), *next;
	struct job *j = q ? job_find(c->eng, c->job) : NULL;

	for (; q; q = next) {
		next = q->next;
		if (c->kind == JCAP_PUBLISH && q->pair < c->np)
			send_part(j, c, &c->p[q->pair], q);
		jcap_part_free(c->eng, q);
	}
}

/* A new plan: the pairs of a local source whose next version is dense
 * (a sink new to them, entries changed, a repair pending) get their part
 * buffers populated ahead while the trainer has not published yet. */
void jsrc_replanned(struct job *j)
{
	for (size_t k = 0; k < j->npairs; k++) {
		const struct jpair *p = &j->pairs[k];
		struct jlocal *l = job_local(j, p->src);

		if (l && l->info.role == JROLE_SOURCE && (!p->sm.last_sent || p->sm.need_dense))
			jcap_prefill_dense(j->eng, p->e, p->n, j->eng->part_bytes);
	}
}

void job_set_part_bytes(struct dte_engine *e, size_t n)
{
	e->part_bytes = n;
}

void job_set_mode_policy(struct dte_engine *e, int policy)
{
	e->mode_policy = policy;
}

void jsrc_parts_ready(void *engine)
{
	struct dte_engine *e = engine;

	for (struct jcap *c = e->inflight; c; c = c->next)
		send_parts(c);
}

/* COUNTS of a captured pair, after all its parts; -1 when it could not go
 * (that sink misses this version). */
static int send_pair(struct job *j, const struct jcap *c, const struct jcap_pair *cp)
{
	Dtep__Counts m = DTEP__COUNTS__INIT;
	Dtep__JobRef ref;
	const struct jpinfo *dst = job_part(j, cp->dst);
	Dtep__Checksum *ck = calloc(cp->nck ? cp->nck : 1, sizeof(*ck));
	Dtep__Checksum **ckp = calloc(cp->nck ? cp->nck : 1, sizeof(*ckp));
	int rc = -1;

	if (!dst || !ck || !ckp || cp->parts_lost || cp->parts_sent != cp->nparts ||
	    j->epoch != c->epoch)
		goto out;
	for (size_t i = 0; i < cp->nck; i++) {
		dtep__checksum__init(&ck[i]);
		ck[i].dst_buffer = cp->cbuf[i];
		ck[i].partial = cp->csum[i];
		ckp[i] = &ck[i];
	}
	job_fill_ref(j, &ref);
	m.job = &ref;
	m.epoch = j->epoch;
	m.version = c->version;
	m.base_version = cp->sparse ? c->base : 0;
	m.mode = cp->sparse ? DTEP__MODE__MODE_SPARSE : DTEP__MODE__MODE_DENSE;
	m.src = c->participant;
	m.dst = cp->dst;
	m.n_counts = cp->n;
	m.counts = cp->counts;
	m.n_checksums = cp->nck;
	m.checksums = ckp;
	m.payload_bytes = cp->chunk_len;
	m.parts = cp->nparts;
	m.n_relay_direct = cp->ndirect;
	m.relay_direct = cp->direct;
	if (job_send_to_node(j, dst->node, DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS, &m.base, NULL, 0) < 0)
		goto out;
	rc = 0;
out:
	free(ck);
	free(ckp);
	return rc;
}

static void cap_event_make(struct job *j, struct jlocal *l);
static void cap_event_fill(struct jlocal *l, struct jpublish_res *rep);

/* The capture's pair into cp's relay tree root (cp itself for a root),
 * NULL when its sink is in no tree or the root is not fed by this source. */
static struct jcap_pair *relay_root_of(const struct job *j, struct jcap *c,
				       const struct jcap_pair *cp)
{
	const struct jpinfo *d = job_part(j, cp->dst);

	for (size_t k = 0; d && k < c->np; k++)
		if (c->p[k].dst == d->relay_root)
			return &c->p[k];
	return NULL;
}

/* Relay (docs/SYNC.md, "Relay between sink daemons"): a sink whose PLAN
 * names a relay parent gets this source's version through its tree's
 * root when its pair's version is the root pair's (both sparse on the
 * same base, or both dense): the root's records are forwarded to it
 * unchanged.  Otherwise (a repair, a new replica, the cost model chose
 * otherwise) this source sends to it directly and names it in the root's
 * records (relay_direct), so it takes none of what is forwarded; it
 * still forwards it to its own children. */
static int relay_decide(struct job *j, struct jcap *c)
{
	for (size_t i = 0; i < c->np; i++) {
		struct jcap_pair *cp = &c->p[i], *root;
		const struct jpinfo *d = job_part(j, cp->dst);
		uint64_t *nd;

		if (!d || !d->relay_parent || !(root = relay_root_of(j, c, cp)))
			continue;	/* no tree, or its root not fed by this source */
		if (root->sparse == cp->sparse) {
			cp->relayed = 1;
			continue;
		}
		if (!(nd = realloc(root->direct, (root->ndirect + 1) * sizeof(*nd))))
			return -ENOMEM;
		root->direct = nd;
		root->direct[root->ndirect++] = cp->dst;
	}
	return 0;
}

/* A publish again (jpublish_args.again): only the pairs that were never
 * sent `version` stay in the capture (their first version, dense); the
 * others leave it before anything of theirs was taken.  How many stay. */
static size_t keep_unsent(struct job *j, struct jlocal *l, struct jcap *c, uint64_t version)
{
	size_t w = 0;

	for (size_t i = 0; i < c->np; i++) {
		const struct jpair *p = job_pair(j, l->info.id, c->p[i].dst);

		if (p && p->sm.last_sent < version)
			c->p[w++] = c->p[i];
		else
			free(c->p[i].e);	/* cap_new's only allocation in it */
	}
	c->np = w;
	return w;
}

int job_publish(struct dte_engine *e, const struct jreq *req, const struct jpublish_args *rq,
		struct jpublish_res *rep, int *deferred, char *err, size_t errlen)
{
	struct job *j;
	struct dtc_consts *k;
	struct jlocal *l;
	struct jcap *c;
	int stepped, first, dev = 0, rc;
	struct pair_choice ch;

	*deferred = 0;
	if ((rc = job_source_owned(e, rq->job, rq->participant, req->conn, &j, &l, err,
				   errlen)) < 0)
		return rc;
	if (jsource_of(l)->busy)
		return FAIL(-EBUSY, "job %s: a capture is still running", j->name);
	if (!l->announced)
		return FAIL(-EINVAL, "job %s: not planned yet", j->name);
	if (!j->complete)
		return FAIL(-EINVAL,
			    "job %s is incomplete: not every source rank is attached", j->name);
	if (rq->version <= jsource_of(l)->last_version &&
	    !(rq->again && rq->version == jsource_of(l)->last_version))
		return FAIL(-EINVAL,
			    "job %s: version %llu is not after the last published %llu", j->name,
			    (unsigned long long)rq->version,
			    (unsigned long long)jsource_of(l)->last_version);
	if (rq->step < 1)
		return FAIL(-EINVAL, "job %s: step must be >= 1", j->name);
	if ((rc = derive_groups(rq->groups, rq->n_groups, rq->step, &k, err, errlen)) < 0)
		return rc;
	first = jsource_of(l)->last_version == 0;
	/* The dirty bitmaps hold steps (last publish, covered]; this step
	 * joins them unless a mark already put it there. */
	stepped = !first && !jsource_of(l)->gap &&
		  (rq->step == jsource_of(l)->covered || rq->step == jsource_of(l)->covered + 1);
	/* An async publish is answered now: its task answers no one (conn 0;
	 * connection ids start at 1), whatever becomes of it. */
	c = cap_new(j, l, JCAP_PUBLISH, rq->async ? NULL : req, rq->step, k, rq->n_groups);
	free(k);
	if (!c)
		return FAIL(-ENOMEM, "out of memory");
	if (rq->again && !keep_unsent(j, l, c, rq->version)) {
		jcap_free(c);
		return FAIL(-EEXIST, "job %s: every sink was sent version %llu", j->name,
			    (unsigned long long)rq->version);
	}
	c->version = rq->version;
	c->base = jsource_of(l)->last_version;
	c->scan = stepped && rq->step == jsource_of(l)->covered + 1;
	for (size_t i = 0; i < l->nbufs; i++)
		dev |= l->bufs[i] && l->bufs[i]->cuda;
	for (size_t i = 0; i < c->np; i++) {
		struct jcap_pair *cp = &c->p[i];
		struct jpair *p = job_pair(j, l->info.id, cp->dst);
		const struct jpinfo *dst = job_part(j, cp->dst);

		/* Steps marked since the last publish are in the pair's dirty
		 * bitmap; this one is scanned by the capture (host: inside
		 * dtc_detect; device and snapshot: into a bitmap for this
		 * version only). */
		cp->remote = dst && !jio_is_self(j->eng, dst->node, NULL);
		/* Where sparse is allowed, the cheaper of sparse and dense by
		 * the running estimates (pair_sm_choose). */
		{
			struct pair_cost_in in = { .scan_Bps = j->scan_Bps, .dense_Bps = j->dense_Bps,
						   .local = !cp->remote,
						   .policy = (enum pair_mode_policy)j->eng->mode_policy };

			for (size_t q = 0; q < cp->n; q++)
				in.elements += cp->e[q].box;
			pair_sm_choose(&p->sm, jsource_of(l)->last_version, j->epoch, stepped,
				       jsource_of(l)->marked && !p->dirty, &in, &ch);
		}
		cp->why = ch.why;
		snprintf(cp->reason, sizeof(cp->reason), "%s", ch.reason);
		cp->sparse = ch.why == PAIR_WHY_NONE;
		cp->want_dirty = cp->sparse && (dev || j->detect == JDETECT_SNAPSHOT);
		if (!cp->sparse)
			dmetrics_add(DM_DENSE_FALLBACKS, pair_sm_why_name(ch.why), 1);
		cap_take_dirty(j, c, cp);
	}
	if (relay_decide(j, c) < 0) {
		for (size_t i = 0; i < c->np; i++)
			cap_return_dirty(j, c, &c->p[i], 1);
		jcap_free(c);
		return FAIL(-ENOMEM, "out of memory");
	}
	if (dev)
		cap_event_make(j, l);
	jsource_of(l)->accepted = rq->version;
	jsource_of(l)->cap_pending = 1;
	jsource_of(l)->cap_rc = 0;
	jsource_of(l)->cap_err[0] = 0;
	cap_start(l, c);
	if (rq->async) {
		/* Accepted: the buffers are pinned (referenced by c), the
		 * capture is queued; the trainer runs its next forward and
		 * backward while it reads, and waits (wait_captured) only
		 * before writing θ, m, v again. */
		rep->version = rq->version;
		rep->captured = 0;
		cap_event_fill(l, rep);
		return 0;
	}
	*deferred = 1;
	return 0;
}

/* The capture of source l ended (rc 0, rep its counts; or the reason):
 * wait_captured answers from here on. */
static void captured(struct jlocal *l, int rc, const char *msg, const struct jpublish_res *rep)
{
	struct jsource *s = jsource_of(l);

	s->cap_pending = 0;
	s->cap_rc = rc;
	s->cap_err[0] = 0;
	if (rc < 0) {
		size_t n = strnlen(msg, sizeof(s->cap_err) - 1);

		memcpy(s->cap_err, msg, n);
		s->cap_err[n] = 0;
	}
	memset(&s->cap_rep, 0, sizeof(s->cap_rep));
	if (rep) {
		s->cap_rep = *rep;
		s->cap_rep.captured = 1;
	}
}

void jsrc_free(struct dte_engine *e, struct jlocal *l)
{
	struct jsource *s = jsource_of(l);

	free(s->shards);
	if (s->cap_ev)
		dtc_dev_event_destroy(e->be, s->cap_ev);
}

/* A device source's capture event, created at its first publish; a
 * source whose backend cannot export one goes on without it (the host
 * wait_captured still orders the trainer's step after the capture). */
static void cap_event_make(struct job *j, struct jlocal *l)
{
	struct jsource *s = jsource_of(l);
	int rc;

	if (s->cap_ev)
		return;
	rc = dtc_dev_event_export(j->eng->be, &s->cap_ev, s->cap_ev_handle, sizeof(s->cap_ev_handle));
	if (rc != DTC_OK) {
		s->cap_ev = NULL;
		DLOG_W("job %s: source %llx: no interprocess capture event (%s); its trainer waits "
		       "on the host only", j->name, (unsigned long long)l->info.id, dtc_strerror(rc));
	}
}

static void cap_event_fill(struct jlocal *l, struct jpublish_res *rep)
{
	struct jsource *s = jsource_of(l);

	if (s->cap_ev) {
		rep->cuda_event = s->cap_ev_handle;
		rep->cuda_event_len = sizeof(s->cap_ev_handle);
	}
}

int jsrc_captured(struct job *j, struct jlocal *l, uint64_t version, struct jpublish_res *rep,
		  char *err, size_t errlen)
{
	struct jsource *s = jsource_of(l);

	if (!s)
		return FAIL(-ENOENT, "job %s: not a source participant", j->name);
	if (!version)
		version = s->accepted;
	if (!version || version > s->accepted)
		return FAIL(-ENOENT, "job %s: version %llu was not published by participant %llx",
			    j->name, (unsigned long long)version, (unsigned long long)l->info.id);
	if (version < s->accepted) {
		/* An older capture ended before this one was accepted. */
		rep->version = version;
		rep->captured = 1;
		return 1;
	}
	if (s->cap_pending)
		return 0;
	if (s->cap_rc < 0) {
		snprintf(err, errlen, "%s", s->cap_err);
		return s->cap_rc;
	}
	*rep = s->cap_rep;
	return 1;
}

/* The capture's reads, for the job's running estimates: a capture that
 * was all sparse times the detect (12 B/element), one all dense the dense
 * read (4 B/element); a mixed one cannot tell them apart. */
static void cost_captured(struct job *j, const struct jcap *c, uint32_t dense, uint32_t pairs)
{
	double s = c->read_ms / 1e3;

	if (s <= 0 || !pairs)
		return;
	/* A first version is cold (the daemon maps and first touches the
	 * trainer's pages): not a rate to plan by. */
	for (size_t i = 0; i < c->np; i++)
		if (c->p[i].why == PAIR_WHY_INITIAL)
			return;
	if (!dense && c->scan_elements)
		j->scan_Bps = pair_cost_ewma(j->scan_Bps, 12.0 * (double)c->scan_elements / s);
	else if (dense == pairs && c->dense_elements)
		j->dense_Bps = pair_cost_ewma(j->dense_Bps, 4.0 * (double)c->dense_elements / s);
}

/* The version's reason in the history: one for all pairs when they agree,
 * else one per sink ("<sink>: reason; ..."), cut at the record's size. */
static void hist_reason(struct jhist *h, const struct jcap_pair *cp)
{
	char one[160];
	size_t n;

	if (!h->reason[0]) {
		snprintf(h->reason, sizeof(h->reason), "%s", cp->reason);
		h->reason_dst = cp->dst;
		return;
	}
	if (!h->reason_multi) {
		if (!strcmp(h->reason, cp->reason))
			return;
		snprintf(one, sizeof(one), "%.127s", h->reason);
		snprintf(h->reason, sizeof(h->reason), "%llx: %.127s",
			 (unsigned long long)h->reason_dst, one);
		h->reason_multi = 1;
	}
	snprintf(one, sizeof(one), "; %llx: %.127s", (unsigned long long)cp->dst, cp->reason);
	n = strlen(h->reason);
	if (n + strlen(one) < sizeof(h->reason))
		memcpy(h->reason + n, one, strlen(one) + 1);
}

static void publish_done(struct job *j, struct jlocal *l, struct jcap *c)
{
	struct jres res = { .op = JOP_PUBLISH };
	struct jpublish_res rep = { 0 };
	uint32_t sinks = 0;
	struct jhist *h;

	/* Parts framed since the last wake-up go before anything else. */
	send_parts(c);
	if (c->rc < 0) {
		char msg[512];

		DLOG_E("job %s: capture of version %llu failed: %s", j->name,
		       (unsigned long long)c->version, c->err);
		for (size_t i = 0; i < c->np; i++) {
			struct jpair *p = job_pair(j, l->info.id, c->p[i].dst);

			if (p)
				pair_sm_event(&p->sm, PAIR_EV_CAPTURE_FAILED, c->version, j->epoch);
		}
		jsource_of(l)->gap = 1;
		snprintf(msg, sizeof(msg), "job %s: capture of version %llu failed: %s", j->name,
			 (unsigned long long)c->version, c->err);
		captured(l, -EIO, msg, NULL);
		if (c->rq.conn)
			job_done(&c->rq, -EIO, msg, NULL);
		return;
	}
	/* The trainer's buffers are no longer read: answer first (it may
	 * step again), then send.  The answer counts what was captured; a
	 * pair whose COUNTS cannot go after it misses this version and goes
	 * dense next (need_dense), which `wait` reports as for any sink. */
	for (size_t i = 0; i < c->np; i++) {
		struct jcap_pair *cp = &c->p[i];
		struct jpair *p = job_pair(j, l->info.id, cp->dst);

		const struct jcap_pair *r = cp->relayed ? relay_root_of(j, c, cp) : cp;

		if (!p || p->hash != cp->hash || !r)
			continue;
		rep.sinks++;
		rep.dense += !cp->sparse;
		rep.changed += r->changed;
		rep.elements += r->elements;
		rep.bytes += cp->chunk_len;	/* 0 relayed: this source sent none of it */
	}
	jsource_of(l)->last_version = c->version;
	jsource_of(l)->covered = c->step;
	jsource_of(l)->gap = 0;
	jsource_of(l)->marked = 0;
	rep.version = c->version;
	rep.capture_ms = job_ms_since(j->eng, c->t0);
	rep.captured = 1;
	/* The worker's kernels that read θ, m, v ran on the legacy default
	 * stream: the event recorded there now follows them. */
	if (jsource_of(l)->cap_ev && dtc_dev_event_record(j->eng->be, jsource_of(l)->cap_ev) != DTC_OK)
		DLOG_W("job %s: recording the capture event of version %llu failed", j->name,
		       (unsigned long long)c->version);
	cap_event_fill(l, &rep);
	captured(l, 0, "", &rep);
	if (c->rq.conn) {
		res.publish = rep;
		job_done(&c->rq, 0, "", &res);
	}

	h = hist_get(j, c->version, c->step);
	h->capture_ms += rep.capture_ms;
	cost_captured(j, c, rep.dense, rep.sinks);
	/* Relayed pairs after the others: one went out when its root's did. */
	for (size_t n = 0; n < 2 * c->np; n++) {
		struct jcap_pair *cp = &c->p[n % c->np];
		struct jpair *p = job_pair(j, l->info.id, cp->dst);
		const struct jcap_pair *r = cp;
		int rc;

		if ((n < c->np) == cp->relayed)
			continue;
		if (cp->relayed) {
			const struct jpair *rp;

			r = relay_root_of(j, c, cp);
			rp = r ? job_pair(j, l->info.id, r->dst) : NULL;
			if (p && p->hash == cp->hash && !(rp && rp->sm.last_sent == c->version)) {
				pair_sm_event(&p->sm, PAIR_EV_SEND_FAILED, c->version, j->epoch);
				continue;
			}
		}
		if (!p || p->hash != cp->hash) {
			/* Re-planned while capturing: these entries are not the
			 * pair's any more; its next version is dense. */
			if (p)
				pair_sm_event(&p->sm, PAIR_EV_REPAIR, c->version, j->epoch);
			continue;
		}
		rc = cp->relayed ? 0 : send_pair(j, c, cp);
		if (rc < 0) {
			/* that sink misses this version; the rest proceed */
			pair_sm_event(&p->sm, PAIR_EV_SEND_FAILED, c->version, j->epoch);
			continue;
		}
		dmetrics_add(DM_WIRE_BYTES, cp->sparse ? "sparse" : "dense", (double)cp->chunk_len);
		/* A pair-version's bytes, for the relay shape's model (RATES) */
		if (cp->chunk_len)
			j->pair_bytes = pair_cost_ewma(j->pair_bytes, (double)cp->chunk_len);
		h->bytes += cp->chunk_len;
		h->changed += r->changed;
		h->elements += r->elements;
		h->pairs++;
		if (cp->sparse)
			h->sparse++;
		else
			h->dense++;
		pair_sm_event(&p->sm, PAIR_EV_SENT, c->version, j->epoch);
		pair_cost_sent(&p->sm, c->version, !cp->sparse, cp->why, r->changed, r->elements,
			       r->chunk_len);
		hist_reason(h, cp);
		sinks++;
	}
	for (size_t i = 0; i < c->np; i++)
		cap_return_dirty(j, c, &c->p[i], 0);
	h->t_captured = jio_now(j->eng);
	h->sinks = 0;
	for (size_t i = 0; i < j->npairs; i++) {
		const struct jpair *p = &j->pairs[i];
		int once = p->sm.last_sent == c->version && job_local(j, p->src);

		for (size_t q = 0; once && q < i; q++)
			if (j->pairs[q].dst == p->dst && j->pairs[q].sm.last_sent == c->version &&
			    job_local(j, j->pairs[q].src))
				once = 0;
		h->sinks += once;
	}
	dmetrics_add(DM_VERSIONS_PUBLISHED, NULL, 1);
	dmetrics_add(DM_ELEMENTS_CHANGED, NULL, (double)rep.changed);
	dmetrics_add(DM_ELEMENTS_COVERED, NULL, (double)rep.elements);
	if (rep.elements && !rep.dense)
		dmetrics_set(DM_CHANGED_RATIO, NULL, (double)rep.changed / (double)rep.elements);
	dmetrics_observe(DM_PHASE_SECONDS, "capture", rep.capture_ms / 1e3);
	DLOG_D("job %s: version %llu step %lld captured: %u sinks (%u dense, %u sent), %llu of %llu "
	       "elements, %llu bytes, answered at %.2f ms, sent at %.2f ms (worker %.2f ms, "
	       "reading the source %.2f ms; %llu detections, %llu scans for %llu entries)",
	       j->name, (unsigned long long)c->version, (long long)c->step, rep.sinks, rep.dense,
	       sinks, (unsigned long long)rep.changed, (unsigned long long)rep.elements,
	       (unsigned long long)rep.bytes, rep.capture_ms, job_ms_since(j->eng, c->t0), c->work_ms,
	       c->read_ms, (unsigned long long)c->detections, (unsigned long long)c->scans,
	       (unsigned long long)c->scan_entries);
}

/* Loop thread, the worker is done: bookkeeping, sends, the answer. */
static void cap_after(struct dte_work *w, int cancelled)
{
	struct jcap *c = (struct jcap *)w;
	struct dte_engine *e = c->eng;
	struct job *j;
	struct jlocal *l;

	/* Shutdown waits for this callback (job_tasks_drain) before it frees
	 * anything, so the job and the buffers are still there. */
	cap_unlink(c);
	if (cancelled && c->rc == 0) {
		c->rc = -ECANCELED;
		snprintf(c->err, sizeof(c->err), "capture cancelled");
	}
	j = job_find(e, c->job);
	l = j ? job_local(j, c->participant) : NULL;
	if (!l) {
		for (size_t i = 0; j && i < c->np; i++)
			cap_return_dirty(j, c, &c->p[i], c->kind == JCAP_MARK);
		if (c->rq.conn)
			job_done(&c->rq, -ENOENT, "the participant went away during the capture",
				 NULL);
	} else {
		jsource_of(l)->busy = 0;
		if (c->kind == JCAP_MARK)
			mark_done(j, l, c);
		else
			publish_done(j, l, c);
	}
	if (c->rc == 0) {
		e->scans += c->scans;
		e->scan_entries += c->scan_entries;
	}
	for (size_t i = 0; i < c->nbufs; i++)
		if (c->bufs[i])
			dbuf_unref(c->bufs[i]);
	jcap_free(c);
	jwait_check(e);
}

/* ------------------------------------------------------------------ acks */

void jsrc_staged(struct job *j, const Dtep__Staged *m)
{
	struct jpair *p = job_pair(j, m->src, m->dst);
	struct jhist *h;

	if (!p || !job_local(j, m->src))
		return;
	pair_sm_event(&p->sm, PAIR_EV_STAGED, m->version, 0);
	h = jhist_find(j, m->version);
	if (h && ++h->staged_acks == h->pairs) {
		h->transfer_ms = job_ms_since(j->eng, h->t_captured);
		dmetrics_observe(DM_PHASE_SECONDS, "transfer", h->transfer_ms / 1e3);
	}
}

void jsrc_applied(struct job *j, const Dtep__Applied *m)
{
	int ok = m->result == DTEP__APPLY_RESULT__APPLY_OK;
	uint64_t prev = 0;
	int seen = 0;

	for (size_t i = 0; i < j->npairs; i++) {
		struct jpair *p = &j->pairs[i];

		if (p->dst != m->dst || !job_local(j, p->src))
			continue;
		if (!seen) {
			prev = p->sm.applied;
			seen = 1;
		}
		pair_sm_event(&p->sm, ok ? PAIR_EV_APPLIED : PAIR_EV_APPLY_FAILED, m->version, 0);
		if (ok)
			pair_cost_applied(&p->sm, m->version, m->apply_ms / 1e3);
	}
	if (!seen)
		return;
	if (!ok)
		DLOG_W("job %s: sink %llx reports version %llu %s: %s", j->name,
		       (unsigned long long)m->dst, (unsigned long long)m->version,
		       m->result == DTEP__APPLY_RESULT__APPLY_CHECKSUM_FAILED ? "checksum failed" :
		       m->result == DTEP__APPLY_RESULT__APPLY_BASE_MISMATCH ? "base mismatch" : "refused",
		       m->message ? m->message : "");
	/* Every version this apply covered gets the sink's verdict once. */
	for (size_t i = 0; i < (j->nhist < JOB_HISTORY ? j->nhist : JOB_HISTORY); i++) {
		struct jhist *h = &j->hist[i];

		if (h->version > m->version || (ok && h->version <= prev))
			continue;
		if (!ok && h->version != m->version)
			continue;
		if (ok)
			h->ok++;
		else
			h->failed++;
		if (m->apply_ms > h->apply_ms)
			h->apply_ms = m->apply_ms;
	}
}

/* wait(version): 1 once every sink applied it; -EIO once every sink
 * settled it (applied or failed) and one failed; 0 while a sink has not
 * answered, with err naming a failure already seen ("" when none), so that
 * a deadline reports the failure rather than a timeout (job.c).  A failure
 * never answers early: until every sink settled, a sink that will apply
 * the version may still hold the one before, and the answer would say
 * nothing about it (docs/SYNC.md, WAIT; issue 30). */
int jsrc_wait_done(struct job *j, uint64_t version, uint32_t *sinks, char *err, size_t errlen)
{
	uint32_t n = 0;
	int pending = 0, failed = 0;

	if (errlen)
		err[0] = 0;
	for (size_t i = 0; i < j->npairs; i++) {
		const struct jpair *p = &j->pairs[i];
		int first = 1, has;

		if (!job_local(j, p->src))
			continue;
		for (size_t q = 0; q < i; q++)
			if (j->pairs[q].dst == p->dst && job_local(j, j->pairs[q].src))
				first = 0;
		n += first;
		has = pair_sm_has(&p->sm, version);
		if (has > 0)
			continue;
		if (has < 0) {
			if (!failed++)
				snprintf(err, errlen, "sink %llx did not apply version %llu cleanly "
					 "(checksum or refusal, see the daemon log); the next version "
					 "repairs it densely", (unsigned long long)p->dst,
					 (unsigned long long)p->sm.failed);
			continue;
		}
		pending = 1;
	}
	*sinks = n;
	if (pending)
		return 0;
	return failed ? -EIO : 1;
}

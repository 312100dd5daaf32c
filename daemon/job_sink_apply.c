/* daemon/job_sink_apply.c — apply and verify at a sink: the staged
 * versions up to v written on a worker, the sums checked (incremental
 * from the verified state, or a full pass), a failed check undone, and
 * the result committed on the loop (APPLIED, the answer).  Its sums and
 * the test build's skipped write serve apply on arrival too.
 *
 * Calls: job_sink_version.c, job_ops.c (what an apply leaves for
 * verify), job_task.c, job_state.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/job_cuda.h"
#include "daemon/job_ext.h"
#include "daemon/job_sink_int.h"
#include "daemon/job_state.h"
#include "daemon/job_sink_engine.h"
#include "daemon/job_task.h"
#include "daemon/job_ops.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "daemon/recvpool.h"
#include "daemon/sink_sm.h"
#include "gpu/codec.h"
#include "gpu/compute.h"
#include "gpu/elem.h"

/* What applying st needs, once applied: its writes' payload bytes and
 * decoded arrays (maps, partials and sources stay). */
static void staged_drop_data(struct jstaged *st)
{
	for (size_t i = 0; i < st->n; i++) {
		free(st->w[i].pos);
		free(st->w[i].val);
		st->w[i].pos = NULL;
		st->w[i].val = NULL;
		st->w[i].enc = NULL;
		st->w[i].enc_len = 0;
	}
	for (size_t i = 0; i < st->nheld; i++)
		recvpool_free(st->held[i]);
	st->nheld = 0;
}

/* The boxes and buffers a verified sum is over: same key, same sum
 * domain.  Never 0 (0 means "not verified"). */
uint64_t jsink_verify_key(struct dbuf *const *bufs, const struct jstaged *st)
{
	uint64_t h = dtc_mix64(st->n + 1);

	for (size_t i = 0; i < st->n; i++) {
		const struct jwrite *w = &st->w[i];
		const struct dbuf *b = bufs[w->dst_slot];
		const int64_t *m = (const int64_t *)&w->map;

		h = dtc_mix64(h ^ w->dst_slot) + (uint64_t)(uintptr_t)b->ptr + b->length;
		h = dtc_mix64(h ^ w->map.ndim);
		for (size_t k = 1; k < sizeof(w->map) / sizeof(*m); k++)
			h = dtc_mix64(h ^ (uint64_t)m[k]);
	}
	return h ? h : 1;
}

/* Dense values straight from the payload when they can be read in place
 * (little-endian, 2-byte aligned), else through a decoded copy. */
static int apply_dense_enc(const struct jwrite *w, struct dbuf *b)
{
	uint16_t *tmp = NULL;
	int r;

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	if (!((uintptr_t)w->enc & 1))
		return jdev_dense_apply(&w->map, (const uint16_t *)(const void *)w->enc, b->ptr,
					b->length);
#endif
	if (!(tmp = malloc(w->n * sizeof(*tmp))))
		return DTC_ENOMEM;
	r = dtc_dense_decode(w->enc, w->enc_len, w->n, tmp);
	if (r == DTC_OK)
		r = jdev_dense_apply(&w->map, tmp, b->ptr, b->length);
	free(tmp);
	return r;
}

/* The element of box position pos (row-major over the box). */
static uint16_t *box_elem(const struct dte_box_map *m, uint16_t *base, uint64_t pos)
{
	int64_t at = m->dst_offset;

	for (uint32_t d = m->ndim; d-- > 0;) {
		at += (int64_t)(pos % (uint64_t)m->extent[d]) * m->dst_stride[d];
		pos /= (uint64_t)m->extent[d];
	}
	return base + at;
}

/* The test build's skipped write (job_ext.h): the first element the
 * entry's swap wrote gets back the value it held, which the swapped
 * payload holds now. */
int jsink_skip_one(void (*skip)(uint16_t *elem, uint16_t old), const struct dte_box_map *m,
		   const uint8_t *enc, size_t len, uint64_t n, uint16_t *dst)
{
	uint64_t *pos = malloc((n ? n : 1) * sizeof(*pos)), got = 0;
	int done = 0;
	uint16_t *old = malloc((n ? n : 1) * sizeof(*old));

	/* The first position the write changed: a detection reports some
	 * elements near a BF16 boundary whose value stays (the guard band),
	 * and leaving one of those "unwritten" would change nothing. */
	if (pos && old && dtc_sparse_decode(enc, len, dtc_box_size(m), pos, old, n, &got) ==
	    DTC_OK)
		for (uint64_t i = 0; i < got; i++)
			if (*box_elem(m, dst, pos[i]) != old[i]) {
				skip(box_elem(m, dst, pos[i]), old[i]);
				done = 1;
				break;
			}
	free(pos);
	free(old);
	return done;
}

/* Write one staged version.  Host entries from their payload are
 * swapped in (the payload keeps the old values: w->swapped, undone by
 * undo_writes), and a sparse one is then read back: delta[slot] gets
 * Σ mix(i, memory) − mix(i, old) over its positions, the change of the
 * buffer's sum as the memory holds it, not as the apply meant to write
 * it.  *undoable is cleared by a write that cannot be undone (device
 * memory, decoded writes, a map that may alias).  Returns 1 when every
 * write it made is in delta (so the version can be verified
 * incrementally), 0 when not, -EIO with why on a failed write. */
static int apply_version(struct dbuf *const *bufs, struct jstaged *st, uint64_t *delta,
			 int *undoable, void (*skip)(uint16_t *elem, uint16_t old), char *why,
			 size_t whylen)
{
	int tracked = !st->all_dense;

	for (size_t i = 0; i < st->n; i++) {
		struct jwrite *w = &st->w[i];
		struct dbuf *b = bufs[w->dst_slot];
		uint64_t got = 0, sn = 0;
		int r;

		if (!w->n)
			continue;
		if (w->enc && !w->dense && dtc_map_injective(&w->map)) {
			r = jdev_sparse_swap_payload(&w->map,
						    (uint8_t *)(uintptr_t)w->enc, w->enc_len, b->ptr,
						    b->length, &got, NULL);
			if (r == DTC_OK) {
				w->swapped = 1;
				if (skip &&
				    jsink_skip_one(skip, &w->map, w->enc, w->enc_len, w->n, b->ptr))
					skip = NULL;	/* else the next entry's */
				r = jdev_sparse_readback_payload(&w->map, w->enc,
								w->enc_len, b->ptr, b->length, &got,
								&delta[w->dst_slot]);
			}
		} else if (w->enc && w->dense && !((uintptr_t)w->enc & 1) &&
			   __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ && dtc_map_injective(&w->map)) {
			/* Dense: verified by the full pass, which reads the box. */
			tracked = 0;
			r = jdev_dense_swap_payload(&w->map,
						   (uint8_t *)(uintptr_t)w->enc, w->enc_len, b->ptr,
						   b->length, &sn);
			w->swapped = r == DTC_OK;
		} else {
			uint64_t unused = 0;

			tracked = 0;
			*undoable = 0;
			r = w->enc && !w->dense ?
			    jdev_sparse_apply_payload(&w->map, w->enc, w->enc_len,
						     b->ptr, b->length, &got, &unused)
			    : w->enc ? apply_dense_enc(w, b)
			    : w->dense ? jdev_dense_apply(&w->map, w->val, b->ptr, b->length)
			    : jdev_scatter_apply(&w->map, w->pos, w->val, w->n, b->ptr, b->length);
		}
		if (r != DTC_OK) {
			snprintf(why, whylen, "apply of version %llu: %s",
				 (unsigned long long)st->version, dtc_strerror(r));
			return -EIO;
		}
	}
	return tracked;
}

/* Every swap of the versions from st on undone, last first (versions,
 * then entries; maps are injective, so each swap undoes exactly): the
 * buffers hold what they held before the first write, bit for bit.  The
 * recursion is as deep as the versions of one apply (max_staged_versions
 * at most). */
static void undo_writes(struct dbuf *const *bufs, struct jstaged *st)
{
	if (!st)
		return;
	undo_writes(bufs, st->next);
	for (size_t i = st->n; i-- > 0;) {
		struct jwrite *w = &st->w[i];
		struct dbuf *b = bufs[w->dst_slot];
		uint64_t got = 0, sn = 0;

		if (!w->swapped)
			continue;
		if (w->dense)
			(void)jdev_dense_swap_payload(&w->map,
						     (uint8_t *)(uintptr_t)w->enc, w->enc_len,
						     b->ptr, b->length, &sn);
		else
			(void)jdev_sparse_swap_payload(&w->map,
						      (uint8_t *)(uintptr_t)w->enc, w->enc_len,
						      b->ptr, b->length, &got, NULL);
		w->swapped = 0;
	}
}

/* Σ mix over the boxes of st, per covered slot, into sum[]. */
int jsink_full_sums(size_t nbufs, struct dbuf *const *bufs, const struct jstaged *st,
		    uint64_t *sum)
{
	memset(sum, 0, nbufs * sizeof(*sum));
	for (size_t i = 0; i < st->n; i++) {
		const struct jwrite *w = &st->w[i];
		uint64_t part = 0;

		/* Host or device: the backend's (vectorized, threaded) box sum. */
		if (jdev_checksum_box(&w->map, bufs[w->dst_slot]->ptr, bufs[w->dst_slot]->length,
				      &part) != DTC_OK)
			return -EIO;	/* unreadable is not verified */
		sum[w->dst_slot] += part;
	}
	return 0;
}

uint32_t jsink_full_every(const struct dte_engine *e)
{
	return e->verify_full_every ? e->verify_full_every : JOB_VERIFY_FULL_EVERY_DEFAULT;
}

/* ----------------------------------------------------------------- apply
 * An apply runs on a worker (job_task.c).  The loop takes the staged
 * versions <= v off the sink (they belong to the task from then on),
 * references the sink's buffers and copies its verified state; the
 * worker writes and sums; the loop, back in apply_done, looks the sink up
 * again and commits the result (applied version, verified state,
 * APPLIED, the answer) or, when the sink went away meanwhile, drops it.
 * While it runs the sink keeps staging (l->applying is the version it
 * will hold); a second apply of the same sink is refused. */
struct japply {
	struct jtask t;
	char job[JOB_NAME_MAX];
	uint64_t participant;
	struct jreq rq;           /* answered here (JOP_APPLY) */
	jsink_applied_fn then;    /* internal caller instead of an answer */
	void (*prep)(void *arg, const struct jstaged *first);	/* on the worker, first */
	void *arg;
	struct jstaged *list;     /* the versions, in order */
	struct jstaged *last;
	size_t nbufs;
	struct dbuf **bufs;       /* referenced until the task ends */
	uint64_t *vsum;           /* in: verified sums; out: the new ones */
	uint64_t vkey;
	uint32_t since_full, full_every;
	uint64_t t0;
	uint64_t skip;            /* job_ext: the version whose first write apply_skip sees */
	uint64_t in_place;        /* worker: the version staged in place it began with; 0: none */
	/* worker results */
	struct jsink_apply_result r;
	uint64_t *sum, *delta;
	int incremental;
};

static void japply_free(struct japply *a)
{
	while (a->list) {
		struct jstaged *s = a->list;

		a->list = s->next;
		jsink_staged_free(s);
	}
	for (size_t i = 0; i < a->nbufs; i++)
		if (a->bufs[i])
			dbuf_unref(a->bufs[i]);
	free(a->bufs);
	free(a->vsum);
	free(a->sum);
	free(a->delta);
	free(a);
}

/* Worker: everything it touches is the task's. */
static void apply_run(struct jtask *t)
{
	struct japply *a = (struct japply *)t;
	struct jsink_apply_result *r = &a->r;
	int incremental = a->vkey != 0, undoable = 1;
	struct jstaged *written = NULL;	/* the first version this task writes */
	uint64_t t0 = jio_now(t->eng);

	r->ok = 1;
	if (a->prep)
		a->prep(a->arg, a->list);
	for (struct jstaged *st = a->list; st; st = st->next) {
		if (st->in_place) {
			/* Applied on arrival and verified (it is always the
			 * first): its sums are the verified state from here. */
			memcpy(a->vsum, st->isum, a->nbufs * sizeof(*a->vsum));
			a->vkey = st->ikey;
			a->in_place = st->version;
			r->key = st->ikey;
			incremental = 1;
		} else if (!r->failed_apply) {
			int tr = apply_version(a->bufs, st, a->delta, &undoable,
					       st->version == a->skip ? a->t.eng->ext.apply_skip : NULL,
					       r->why, sizeof(r->why));

			if (!written)
				written = st;

			if (tr < 0)
				r->failed_apply = 1;
			r->key = jsink_verify_key(a->bufs, st);
			incremental &= tr == 1 && r->key == a->vkey;
		}
		a->last = st;
		r->n++;
	}
	incremental &= a->since_full + r->n < a->full_every;
	/* The content must now be exactly what the sources computed. */
	if (!r->failed_apply && incremental) {
		for (size_t s = 0; s < a->nbufs; s++)
			a->sum[s] = a->vsum[s] + a->delta[s];
	} else if (!r->failed_apply && jsink_full_sums(a->nbufs, a->bufs, a->last, a->sum) < 0) {
		r->failed_apply = 1;
		snprintf(r->why, sizeof(r->why), "checksum failed: a box outside its buffer");
	}
	for (size_t s = 0; s < a->nbufs && !r->failed_apply; s++) {
		if (!a->last->covered[s] || a->sum[s] == a->last->expect[s])
			continue;
		r->ok = 0;
		snprintf(r->why, sizeof(r->why), "buffer %s: checksum %016llx, expected %016llx (%s)",
			 a->bufs[s]->name, (unsigned long long)a->sum[s],
			 (unsigned long long)a->last->expect[s], incremental ? "incremental" : "full pass");
		break;
	}
	if (r->failed_apply)
		r->ok = 0;
	if (!r->ok && undoable) {
		/* A failed check never leaves the sink on what failed: every
		 * write of this apply is swapped back, and the buffers are what
		 * they were (the version before, or the one staged in place
		 * ahead of them, whose sums a->vsum holds), bit for bit. */
		undo_writes(a->bufs, written);
		r->undone = 1;
	}
	r->incremental = incremental;
	r->version = a->last->version;
	/* The payloads (a dense version holds the model's size) are
	 * unmapped here, not on the loop: the loop needs only the newest
	 * version's maps, partials and sources (and, undone, those of the
	 * version staged in place it began with: the sink stays on it). */
	{
		struct jstaged *keep = r->undone && a->in_place && a->list != a->last ?
				       a->list : NULL;
		struct jstaged **pp = keep ? &keep->next : &a->list;

		while (*pp != a->last) {
			struct jstaged *st = *pp;

			*pp = st->next;
			jsink_staged_free(st);
		}
		if (keep)
			staged_drop_data(keep);
	}
	staged_drop_data(a->last);
	r->work_ms = job_ms_since(t->eng, t0);
}

/* Loop: an apply failed its check and was undone, so the sink holds the
 * version it held before (applied).  Staged versions that build on the
 * failed one (sparse, up to the first dense one) go, refused: nothing with
 * a hole under it is applied; held falls back to what is left. */
static void fail_fallback(struct job *j, struct jlocal *l)
{
	struct jsink *k = jsink_of(l);
	char why[160];

	while (k->staged && !k->staged->all_dense && !k->staged->in_place) {
		struct jstaged *s = k->staged;

		k->staged = s->next;
		(void)sink_decide(l, s->version, &s->state, SINK_EV_CAP);
		snprintf(why, sizeof(why), "staged on version %llu, whose check failed and was undone",
			 (unsigned long long)k->failed);
		jsink_send_applied(j, l, s->version, s->srcs, s->nsrcs,
				   DTEP__APPLY_RESULT__APPLY_REFUSED, why, 0);
		jsink_staged_free(s);
	}
	k->held = k->applied;
	for (const struct jstaged *s = k->staged; s; s = s->next)
		k->held = s->version;
	if (k->staging > k->held)
		k->held = k->staging;
}

/* Loop: commit what the worker did to the sink, if it is still there. */
static void apply_done(struct jtask *t, int cancelled)
{
	struct japply *a = (struct japply *)t;
	struct jsink_apply_result *r = &a->r;
	struct dte_engine *e = t->eng;
	struct job *j = job_find(e, a->job);
	struct jlocal *l = j ? job_local(j, a->participant) : NULL;
	struct jres res = { .op = JOP_APPLY };
	struct sink_step d;

	r->ms = job_ms_since(t->eng, a->t0);
	if (l && l->info.role != JROLE_SINK)
		l = NULL;
	if (l)
		jsink_of(l)->applying = 0;
	if (e->stopping && !cancelled)
		DLOG_N("shutdown: the apply of version %llu of sink %llx (job %s) came back from "
		       "its worker after %.1f ms", (unsigned long long)r->version,
		       (unsigned long long)a->participant, a->job, r->work_ms);
	if (cancelled) {
		/* Shutdown drains an apply (applying × shutdown); one that
		 * never started wrote nothing: answered busy. */
		if (l)
			(void)sink_decide(l, r->version, &jsink_of(l)->applying_state,
					  SINK_EV_SHUTDOWN);
		if (a->then)
			a->then(NULL, NULL, r, a->arg);
		else
			job_done(&a->rq, -EBUSY, "the daemon is shutting down; nothing was applied",
				 NULL);
		japply_free(a);
		return;
	}
	if (!l) {
		/* applying × detached: went_away (no sink left to decide for) */
		DLOG_N("job %s: sink %llx went away while version %llu was applied; result dropped",
		       a->job, (unsigned long long)a->participant, (unsigned long long)r->version);
		if (a->then)
			a->then(NULL, NULL, r, a->arg);
		else
			job_done(&a->rq, -ENOENT, "the sink went away while its apply ran", NULL);
		japply_free(a);
		return;
	}
	d = sink_decide(l, a->last->version, &jsink_of(l)->applying_state,
			r->ok ? SINK_EV_WORKER_OK : SINK_EV_WORKER_FAILED);
	if (d.act == SINK_A_SEND_APPLIED) {
		memcpy(jsink_of(l)->vsum, a->sum, l->nbufs * sizeof(*jsink_of(l)->vsum));
		jsink_of(l)->vkey = r->key;
		jsink_of(l)->since_full = r->incremental ? jsink_of(l)->since_full + r->n : 0;
	} else if (r->undone) {
		/* The buffers are bit for bit what the verified state (or the
		 * version staged in place first) describes. */
		memcpy(jsink_of(l)->vsum, a->vsum, l->nbufs * sizeof(*jsink_of(l)->vsum));
		jsink_of(l)->vkey = a->vkey;
	} else {
		jsink_of(l)->vkey = 0;	/* the next apply recomputes everything */
	}
	if (!r->failed_apply) {
		if (r->incremental)
			jsink_of(l)->incremental_verifies++;
		else
			jsink_of(l)->full_verifies++;
		dmetrics_add(DM_APPLY_VERIFY, r->incremental ? "incremental" : "full", 1);
	}
	/* A dense version onto one the sink held (the source's cost choice,
	 * which it makes again from the same rates) or a failed check (a
	 * dense repair follows): the next is likely dense too. */
	jsink_arena_next(j, l, !r->ok || (jsink_of(l)->applied && a->last->all_dense));
	if (!r->ok)
		jsink_of(l)->failed = a->last->version;
	if (r->ok || !r->undone) {
		jsink_of(l)->applied = a->last->version;
		jops_applied(e, l, a->last);
	} else {
		/* Undone: the sink stays on what it held (or on the version
		 * staged in place that this apply began with) until the dense
		 * repair lands; what was staged on the failed version goes. */
		if (a->in_place) {
			jsink_of(l)->applied = a->in_place;
			jops_applied(e, l, a->list);
		}
		fail_fallback(j, l);
	}
	jsink_step_check(j, l, a->last->version, d);
	dmetrics_add(DM_VERSIONS_APPLIED, NULL, r->ok || !r->undone ? r->n : 0);
	if (!r->ok) {
		dmetrics_add(DM_CHECKSUM_FAILURES, NULL, 1);
		jsink_of(l)->checksum_failures++;
		jsink_of(l)->apply_undos += r->undone != 0;
		if (r->undone)
			DLOG_E("job %s: sink %llx version %llu: %s; dense repair requested; undone: "
			       "the sink holds version %llu until it lands", j->name,
			       (unsigned long long)l->info.id, (unsigned long long)a->last->version,
			       r->why, (unsigned long long)jsink_of(l)->applied);
		else
			DLOG_E("job %s: sink %llx version %llu: %s; dense repair requested; not undone "
			       "(device or decoded writes)", j->name, (unsigned long long)l->info.id,
			       (unsigned long long)a->last->version, r->why);
	} else {
		DLOG_D("job %s: sink %llx version %llu verified (%s) on a worker in %.2f ms", j->name,
		       (unsigned long long)l->info.id, (unsigned long long)a->last->version,
		       r->incremental ? "incremental" : "full pass", r->work_ms);
	}
	dmetrics_observe(DM_PHASE_SECONDS, "apply", r->ms / 1e3);
	jsink_applied_or_defer(j, l, a->last->version, a->last->srcs, a->last->nsrcs,
			       d.act == SINK_A_SEND_APPLIED ? DTEP__APPLY_RESULT__APPLY_OK :
			       DTEP__APPLY_RESULT__APPLY_CHECKSUM_FAILED, r->why, r->ms);
	r->checksum_failures = jsink_of(l)->checksum_failures;
	if (a->then) {
		a->then(j, l, r, a->arg);
	} else {
		/* The version the buffers hold now: an undone apply left
		 * them on the one before, and applied none. */
		res.apply.version = jsink_of(l)->applied;
		res.apply.applied = r->ok || !r->undone ? r->n : 0;
		res.apply.checksum_ok = r->ok;
		res.apply.checksum_failures = jsink_of(l)->checksum_failures;
		res.apply.apply_ms = r->work_ms;
		job_done(&a->rq, 0, "", &res);
	}
	japply_free(a);
	jwait_check(e);
}

static int apply_start(struct job *j, struct jlocal *l, uint64_t version, const struct jreq *rq,
		       void (*prep)(void *arg, const struct jstaged *first),
		       jsink_applied_fn then, void *arg, char *err, size_t errlen)
{
	struct japply *a;
	struct jstaged **tail;
	struct sink_step d;
	size_t nb = l->nbufs ? l->nbufs : 1;

	if (j->eng->stopping)
		return derr_fail(err, errlen, -EBUSY,
			     "job %s: the daemon is shutting down", j->name);
	if (jsink_of(l)->applying &&
	    sink_decide(l, version, &jsink_of(l)->applying_state, SINK_EV_APPLY).act ==
		    SINK_A_BUSY)
		return derr_fail(err, errlen, -EBUSY,
			     "job %s: sink %llx is applying version %llu already", j->name,
			     (unsigned long long)l->info.id, (unsigned long long)jsink_of(l)->applying);
	if (!jsink_of(l)->vsum)
		jsink_of(l)->vsum = calloc(nb, sizeof(*jsink_of(l)->vsum));
	a = calloc(1, sizeof(*a));
	if (!jsink_of(l)->vsum || !a || !(a->bufs = calloc(nb, sizeof(*a->bufs))) ||
	    !(a->vsum = malloc(nb * sizeof(*a->vsum))) || !(a->sum = calloc(nb, sizeof(*a->sum))) ||
	    !(a->delta = calloc(nb, sizeof(*a->delta)))) {
		if (a)
			japply_free(a);
		return derr_fail(err, errlen, -ENOMEM, "job %s: out of memory",
			     j->name);
	}
	snprintf(a->job, sizeof(a->job), "%s", j->name);
	a->participant = l->info.id;
	if (rq)
		a->rq = *rq;
	a->then = then;
	a->prep = prep;
	a->arg = arg;
	for (size_t i = 0; i < l->nbufs; i++) {
		a->bufs[i] = l->bufs[i];
		dbuf_ref(a->bufs[i]);
	}
	a->nbufs = l->nbufs;
	memcpy(a->vsum, jsink_of(l)->vsum, l->nbufs * sizeof(*a->vsum));
	a->vkey = jsink_of(l)->vkey;
	a->since_full = jsink_of(l)->since_full;
	a->full_every = jsink_full_every(j->eng);
	/* The versions move to the task, in order. */
	tail = &a->list;
	while (jsink_of(l)->staged && jsink_of(l)->staged->version <= version &&
	       (d = sink_decide(l, jsink_of(l)->staged->version, &jsink_of(l)->staged->state,
				SINK_EV_APPLY)).act == SINK_A_APPLY) {
		struct jstaged *st = jsink_of(l)->staged;

		jsink_of(l)->staged = st->next;
		st->next = NULL;
		*tail = st;
		tail = &st->next;
		jsink_of(l)->applying = st->version;
		jsink_of(l)->applying_state = st->state;	/* applying: it moves to the worker */
		jsink_step_check(j, l, st->version, d);
		/* On the loop (it may log), once per apply (job_ext.h). */
		if (!a->skip && !st->in_place && j->eng->ext.apply_select &&
		    j->eng->ext.apply_skip && j->eng->ext.apply_select(st->version))
			a->skip = st->version;
	}
	jsink_of(l)->apply_gen++;
	DLOG_I("job %s: sink %llx: apply up to version %llu handed to a worker", j->name,
	       (unsigned long long)l->info.id, (unsigned long long)jsink_of(l)->applying);
	a->t0 = jio_now(j->eng);
	a->t.run = apply_run;
	a->t.done = apply_done;
	jtask_start(j->eng, &a->t);
	return 0;
}

int jsink_apply_start(struct job *j, struct jlocal *l, uint64_t version, const struct jreq *rq,
		      jsink_applied_fn then, void *arg, char *err, size_t errlen)
{
	return apply_start(j, l, version, rq, NULL, then, arg, err, errlen);
}

int jsink_apply_start_prep(struct job *j, struct jlocal *l, uint64_t version,
			   void (*prep)(void *arg, const struct jstaged *first),
			   jsink_applied_fn then, void *arg, char *err, size_t errlen)
{
	return apply_start(j, l, version, NULL, prep, then, arg, err, errlen);
}
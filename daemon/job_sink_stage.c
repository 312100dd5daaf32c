/* daemon/job_sink_stage.c — staging at a sink: a complete version's
 * records decoded and checked on a worker (part order and ranges, chunk
 * xxh3, zstd unpack, every position), the staged chain (a dense version
 * supersedes the ones before it), STAGED to the sources, and the cap on
 * staged versions.
 *
 * Calls: job_sink_version.c, job_task.c, job_state.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/job_ext.h"
#include "daemon/job_sink_int.h"
#include "daemon/job_state.h"
#include "daemon/job_task.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "daemon/recvpool.h"
#include "daemon/sink_sm.h"
#include "gpu/codec.h"
#include "gpu/compute.h"

uint32_t jsink_staged_cap(const struct dte_engine *e)
{
	return e->max_staged ? e->max_staged : JOB_MAX_STAGED_DEFAULT;
}

/* A version being staged on a worker (jsink_try_stage starts it, stage_done
 * finishes it on the loop).  It owns the collected records (the jpend,
 * unlinked from the sink) and copies of what decoding reads of the sink
 * and the plan, so a detach or re-plan meanwhile cannot reach it. */
struct jstage {
	struct jtask t;
	char job[JOB_NAME_MAX];
	uint64_t participant;
	struct jpend *p;
	struct jentry **e;        /* per source: its pair's entries (NULL: no such pair) */
	size_t *ne;
	size_t ns;                /* sources (e, ne) */
	size_t nbufs;
	uint32_t *buf_ids;        /* the sink's layout buffer ids, ascending */
	uint8_t *enc;             /* per slot: jsink_keep_encoded */
	int alter;                /* extension point (job_ext.h): alter one value of the first sparse source */
	struct jstaged *st;       /* result, or NULL with err */
	char err[256];
	double ms;
};

/* Whether entries into this buffer are applied from their payload bytes
 * (host memory) or decoded at staging: device memory is scattered from
 * host arrays by the cuda backend, and the storage writer reads the
 * decoded writes of its mirror to find what changed. */
int jsink_keep_encoded(const struct job *j, const struct jlocal *l, const struct dbuf *b)
{
	if (b->cuda)
		return 0;
	return !(j->store && !strcmp(l->info.layout, JSTORE_CANON_LAYOUT));
}

/* jlocal_buf over the task's copy of the sink's buffer ids. */
static int stage_slot(const struct jstage *g, uint32_t id, size_t *slot)
{
	for (size_t i = 0; i < g->nbufs; i++) {
		if (g->buf_ids[i] == id) {
			*slot = i;
			return 1;
		}
	}
	return 0;
}

/* Check (or decode) one entry's bytes into w.  0 or a DTC_* code. */
static int stage_entry(struct jwrite *w, int enc, const struct jentry *e, uint64_t cnt,
		       const uint8_t *p, uint64_t len)
{
	uint64_t got = 0;
	int r;

	w->n = w->dense ? e->box : cnt;
	if (enc && w->dense) {
		if (len != 2 * e->box)
			return len < 2 * e->box ? DTC_ETRUNC : DTC_ECORRUPT;
	} else if (enc) {
		if ((r = dtc_sparse_payload_check(p, len, e->box, &got)) != DTC_OK)
			return r;
		if (got != cnt)
			return DTC_ECORRUPT;
	} else if (w->dense) {
		if (!(w->val = malloc(e->box * sizeof(*w->val))))
			return DTC_ENOMEM;
		return dtc_dense_decode(p, len, e->box, w->val);
	} else {
		w->pos = malloc(cnt * sizeof(*w->pos));
		w->val = malloc(cnt * sizeof(*w->val));
		if (!w->pos || !w->val)
			return DTC_ENOMEM;
		if ((r = dtc_sparse_decode(p, len, e->box, w->pos, w->val, cnt, &got)) != DTC_OK)
			return r;
		return got == cnt ? DTC_OK : DTC_ECORRUPT;
	}
	w->enc = p;
	w->enc_len = (size_t)len;
	return DTC_OK;
}

static int part_cmp(const void *a, const void *b)
{
	const struct jpart *x = a, *y = b;

	return x->part < y->part ? -1 : x->part > y->part;
}

/* Stage one source's part of a version: its parts in order (ranges in
 * entry order, no overlap, every entry with a count inside one), every
 * entry checked (positions against its box), kept encoded or decoded
 * (jsink_keep_encoded); the parts' bytes move into st, which owns them from
 * here on. */
static int decode_src(struct jstage *g, size_t si, struct jstaged *st, char *err, size_t errlen)
{
	struct jpend_src *s = &g->p->s[si];
	const struct jentry *pe = g->e[si];
	const Dtep__Counts *c = s->counts;
	int dense = c->mode == DTEP__MODE__MODE_DENSE;
	size_t w0 = st->n, covered = 0, pn = g->ne[si];
	int alter = 0;

	if (!pe || pn != c->n_counts) {
		snprintf(err, errlen, "source %llx: %zu counts for %zu entries",
			 (unsigned long long)s->src, c->n_counts, pe ? pn : 0);
		return -EBADMSG;
	}
	for (size_t i = 0; i < pn; i++) {
		const struct jentry *e = &pe[i];
		struct jwrite *w = &st->w[st->n];
		uint64_t cnt = c->counts[i];
		size_t slot;

		if (!stage_slot(g, e->dst_buf, &slot)) {
			snprintf(err, errlen, "entry %zu: sink buffer %u missing", i, e->dst_buf);
			return -EBADMSG;
		}
		memset(w, 0, sizeof(*w));
		w->dst_slot = (uint32_t)slot;
		w->dense = dense;
		w->map = e->map;
		st->covered[slot] = 1;
		st->n++;
		if (dense && cnt != e->box) {
			snprintf(err, errlen, "entry %zu: dense count %llu, box %llu", i,
				 (unsigned long long)cnt, (unsigned long long)e->box);
			return -EBADMSG;
		}
		if (cnt > e->box) {
			snprintf(err, errlen, "entry %zu: %llu positions in a box of %llu", i,
				 (unsigned long long)cnt, (unsigned long long)e->box);
			return -EBADMSG;
		}
	}
	if (s->nparts)
		qsort(s->parts, s->nparts, sizeof(*s->parts), part_cmp);
	for (size_t k = 0; k < s->nparts; k++) {
		struct jpart *pt = &s->parts[k];
		uint8_t *raw = NULL, *data;
		const uint8_t *view = NULL;
		size_t raw_len = 0, off = 0, bound = 0;
		uint64_t claimed;
		int codec, encoded = 0;

		if (pt->part != k || pt->first < covered || pt->entries == 0 ||
		    pt->entries > pn - pt->first) {
			snprintf(err, errlen, "source %llx: part %u (entries %u..+%u) missing, out of "
				 "order or overlapping", (unsigned long long)s->src, pt->part, pt->first,
				 pt->entries);
			return -EBADMSG;
		}
		for (size_t i = covered; i < pt->first; i++) {
			if (c->counts[i]) {
				snprintf(err, errlen, "entry %zu: count %llu but no part carries it", i,
					 (unsigned long long)c->counts[i]);
				return -EBADMSG;
			}
		}
		covered = (size_t)pt->first + pt->entries;
		for (size_t i = pt->first; i < covered; i++)
			if (c->counts[i])
				bound += 8 + (dense ? 2 * pe[i].box :
					      dtc_sparse_bound(c->counts[i]));
		if (dtc_chunk_info(pt->data, pt->len, &claimed, &codec) != DTC_OK || claimed > bound) {
			snprintf(err, errlen, "source %llx part %u: header invalid or larger than its "
				 "counts allow", (unsigned long long)s->src, pt->part);
			return -EBADMSG;
		}
		/* Stored raw (the same-cluster default), it is staged where it
		 * was received: no second copy of the payload. */
		if (dtc_chunk_view(pt->data, pt->len, &view, &raw_len) != DTC_OK ||
		    (!view && (!(raw = malloc(claimed ? claimed : 1)) ||
			       dtc_chunk_unpack(pt->data, pt->len, raw, claimed,
						&raw_len) != DTC_OK))) {
			snprintf(err, errlen, "source %llx: payload corrupt (checksum or framing) in "
				 "part %u", (unsigned long long)s->src, pt->part);
			free(raw);
			return -EBADMSG;
		}
		data = view ? pt->data + (view - pt->data) : raw;
		if (!k && !dense && g->alter) {
			alter = 1;	/* the first sparse source only */
			g->alter = 0;
		}
		for (size_t i = pt->first; i < covered; i++) {
			const struct jentry *e = &pe[i];
			struct jwrite *w = &st->w[w0 + i];
			uint64_t cnt = c->counts[i], len;
			int r;

			if (!cnt)
				continue;
			if (raw_len - off < 8 ||
			    (len = jsink_get64(data + off)) > raw_len - off - 8) {
				snprintf(err, errlen, "entry %zu: payload truncated", i);
				free(raw);
				return -EBADMSG;
			}
			off += 8;
			r = stage_entry(w, g->enc[w->dst_slot], e, cnt, data + off, len);
			encoded |= w->enc != NULL;
			if (r != DTC_OK) {
				snprintf(err, errlen, "entry %zu: %s", i, dtc_strerror(r));
				free(raw);
				return -EBADMSG;
			}
			if (alter) {
				/* After every check. */
				if (w->enc)
					g->t.eng->ext.sink_alter(data + off + len - 1, 1);
				else
					g->t.eng->ext.sink_alter(&w->val[w->n - 1],
								 sizeof(w->val[0]));
				alter = 0;
			}
			off += len;
		}
		if (off != raw_len) {
			snprintf(err, errlen, "source %llx part %u: %zu bytes after the last entry",
				 (unsigned long long)s->src, pt->part, raw_len - off);
			free(raw);
			return -EBADMSG;
		}
		/* The bytes the writes point into (none when all were decoded). */
		if (encoded) {
			st->held[st->nheld++] = raw ? raw : pt->data;
			if (raw)
				recvpool_free(pt->data);
			pt->data = NULL;
		} else {
			free(raw);
		}
	}
	for (size_t i = covered; i < pn; i++) {
		if (c->counts[i]) {
			snprintf(err, errlen, "entry %zu: count %llu but no part carries it", i,
				 (unsigned long long)c->counts[i]);
			return -EBADMSG;
		}
	}
	for (size_t i = 0; i < c->n_checksums; i++) {
		size_t slot;

		if (!stage_slot(g, c->checksums[i]->dst_buffer, &slot)) {
			snprintf(err, errlen, "checksum names buffer %u this sink does not have",
				 c->checksums[i]->dst_buffer);
			return -EBADMSG;
		}
		st->expect[slot] += c->checksums[i]->partial;
	}
	return 0;
}

/* Worker: the version's every record checked, kept encoded or decoded. */
static struct jstaged *decode(struct jstage *g, char *err, size_t errlen)
{
	struct jpend *p = g->p;
	struct jstaged *st = calloc(1, sizeof(*st));
	size_t nw = 0, nparts = 0, nb = g->nbufs ? g->nbufs : 1;

	for (size_t i = 0; i < p->n; i++) {
		nw += p->s[i].counts->n_counts;
		nparts += p->s[i].nparts;
	}
	if (!st || !(st->w = calloc(nw ? nw : 1, sizeof(*st->w))) ||
	    !(st->expect = calloc(nb, sizeof(*st->expect))) || !(st->covered = calloc(nb, 1)) ||
	    !(st->srcs = calloc(p->n ? p->n : 1, sizeof(*st->srcs))) ||
	    !(st->held = calloc(nparts ? nparts : 1, sizeof(*st->held)))) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	st->version = p->version;
	st->all_dense = 1;
	for (size_t i = 0; i < p->n; i++) {
		st->srcs[st->nsrcs++] = p->s[i].src;
		st->all_dense &= p->s[i].counts->mode == DTEP__MODE__MODE_DENSE;
		if (decode_src(g, i, st, err, errlen) < 0)
			goto fail;
	}
	return st;
fail:
	if (st)
		jsink_staged_free(st);
	return NULL;
}

void jsink_send_staged(struct job *j, struct jlocal *l, const struct jstaged *st)
{
	for (size_t i = 0; i < st->nsrcs; i++) {
		Dtep__Staged m = DTEP__STAGED__INIT;
		Dtep__JobRef ref;
		const struct jpinfo *p = job_part(j, st->srcs[i]);

		if (!p)
			continue;
		job_fill_ref(j, &ref);
		m.job = &ref;
		m.version = st->version;
		m.src = st->srcs[i];
		m.dst = l->info.id;
		job_send_to_node(j, p->node, DTEP__PEER_MSG_TYPE__PEER_MSG_STAGED, &m.base, NULL, 0);
	}
}

/* A sink that never applies must not stage without bound.  Past
 * max_staged_versions the staged chain goes: every version in it builds on
 * the one before (a dense one starts a new chain, see jsink_try_stage), so
 * dropping the oldest would leave a hole under all the rest; the sink
 * falls back to what it applied and its sources are told (APPLIED
 * refused), so their next version is dense.  Sparse versions in flight on
 * the dropped ones are refused by the base check. */
static void staging_cap(struct job *j, struct jlocal *l, const struct jstaged *newest)
{
	uint32_t cap = jsink_staged_cap(j->eng);
	uint64_t *srcs, version = newest->version;
	size_t n = 0, nsrcs = newest->nsrcs;
	char why[160];

	for (const struct jstaged *s = jsink_of(l)->staged; s; s = s->next)
		n++;
	if (n <= cap)
		return;
	srcs = malloc((nsrcs ? nsrcs : 1) * sizeof(*srcs));
	if (srcs)
		memcpy(srcs, newest->srcs, nsrcs * sizeof(*srcs));
	{
		/* A version staged in place is in the buffers already: it
		 * stays, the rest of the chain goes. */
		struct jstaged *keep = jsink_of(l)->staged && jsink_of(l)->staged->in_place ?
				       jsink_of(l)->staged : NULL;
		struct jstaged **pp = keep ? &keep->next : &jsink_of(l)->staged;

		while (*pp) {
			struct jstaged *s = *pp;

			*pp = s->next;
			/* cap_refuse: the chain goes, one APPLIED refused below */
			(void)sink_decide(l, s->version, &s->state, SINK_EV_CAP);
			jsink_staged_free(s);
		}
		/* An apply on a worker still brings the sink to its version. */
		jsink_of(l)->held = keep ? keep->version : jsink_of(l)->applying ?
				    jsink_of(l)->applying : jsink_of(l)->applied;
	}
	jsink_of(l)->staging_drops++;
	snprintf(why, sizeof(why), "%zu versions staged and none applied (max_staged_versions %u): "
		 "staging dropped, next version dense", n, cap);
	DLOG_W("job %s: sink %llx: %s", j->name, (unsigned long long)l->info.id, why);
	if (srcs)
		jsink_send_applied(j, l, version, srcs, nsrcs, DTEP__APPLY_RESULT__APPLY_REFUSED,
				   why, 0);
	free(srcs);
}

static void stage_free(struct jstage *g)
{
	if (!g)
		return;
	if (g->st)
		jsink_staged_free(g->st);
	if (g->p)
		jsink_pend_free(g->p);
	for (size_t i = 0; g->e && i < g->ns; i++)
		free(g->e[i]);
	free(g->e);
	free(g->ne);
	free(g->buf_ids);
	free(g->enc);
	free(g);
}

/* Worker: check and keep (or decode) the version; what it does not keep
 * of the records (a refused version's parts: up to the model's size) is
 * freed here, not on the loop. */
static void stage_run(struct jtask *t)
{
	struct jstage *g = (struct jstage *)t;
	uint64_t t0 = jio_now(t->eng);

	g->st = decode(g, g->err, sizeof(g->err));
	for (size_t i = 0; i < g->p->n; i++)
		jsink_pend_src_clear(&g->p->s[i]);
	g->ms = job_ms_since(t->eng, t0);
}


/* Loop: the staged version joins the sink's chain (or is refused), then
 * the next one may go. */
static void stage_done(struct jtask *t, int cancelled)
{
	struct jstage *g = (struct jstage *)t;
	struct job *j = job_find(g->t.eng, g->job);
	struct jlocal *l = j ? job_local(j, g->participant) : NULL;
	struct jstaged *st = g->st;
	uint64_t v = g->p->version;
	struct sink_step d;

	if (l && l->info.role != JROLE_SINK)
		l = NULL;
	if (l)
		jsink_of(l)->staging = 0;
	dmetrics_observe(DM_PHASE_SECONDS, "stage", g->ms / 1e3);
	if (cancelled || !l) {
		/* Never started (shutdown), or the sink went away: the result
		 * is dropped (there is no sink to decide for when it is gone). */
		if (!cancelled)
			DLOG_I("job %s: sink %llx went away while version %llu was staged (dropped)",
			       g->job, (unsigned long long)g->participant,
			       (unsigned long long)g->p->version);
		stage_free(g);
		return;
	}
	d = sink_decide(l, v, &jsink_of(l)->staging_state,
			v <= jsink_of(l)->held ? SINK_EV_SUPERSEDED :
			st ? SINK_EV_WORKER_OK : SINK_EV_WORKER_FAILED);
	if (d.act == SINK_A_REFUSE) {
		jsink_refuse_version(j, l, g->p, DTEP__APPLY_RESULT__APPLY_REFUSED, g->err);
	} else if (d.act == SINK_A_SEND_STAGED) {
		g->st = NULL;
		st->state = jsink_of(l)->staging_state;	/* staged: it moves to the chain */
		if (st->all_dense) {
			/* Everything before it is overwritten anyway (but a
			 * version staged in place is in the buffers: it stays). */
			struct jstaged **op = &jsink_of(l)->staged;

			if (*op && (*op)->in_place)
				op = &(*op)->next;
			while (*op) {
				struct jstaged *o = *op;

				*op = o->next;
				if (sink_decide(l, o->version, &o->state, SINK_EV_SUPERSEDED).act ==
				    SINK_A_FREE)
					jsink_staged_free(o);
			}
		}
		{
			struct jstaged **pp = &jsink_of(l)->staged;

			while (*pp)
				pp = &(*pp)->next;
			*pp = st;
		}
		jsink_of(l)->held = st->version;
		jsink_send_staged(j, l, st);
		DLOG_D("job %s: sink %llx staged version %llu (%s) on a worker in %.2f ms", j->name,
		       (unsigned long long)l->info.id, (unsigned long long)st->version,
		       st->all_dense ? "dense" : "sparse", g->ms);
		jsink_step_check(j, l, v, d);
		staging_cap(j, l, st);	/* the cap's own transitions */
	} else {
		stage_free(g);	/* drop_result: superseded meanwhile */
		jsink_step_check(j, l, v, d);
		return;
	}
	stage_free(g);
	if (d.act == SINK_A_REFUSE)
		jsink_step_check(j, l, v, d);
	jsink_try_stage(j, l);
	sink_staged_tell(j, l);
	jwait_check(j->eng);
}

/* Hand version p (complete, its base checked) to a worker: p leaves the
 * sink's pending list for the task.  0, or -1 (out of memory: p stays). */
static int stage_start(struct job *j, struct jlocal *l, struct jpend *p)
{
	struct jstage *g = calloc(1, sizeof(*g));
	size_t n = p->n ? p->n : 1, nb = l->nbufs ? l->nbufs : 1;
	int sparse = 0;

	if (!g || !(g->e = calloc(n, sizeof(*g->e))) || !(g->ne = calloc(n, sizeof(*g->ne))) ||
	    !(g->buf_ids = malloc(nb * sizeof(*g->buf_ids))) || !(g->enc = malloc(nb)))
		goto fail;
	g->ns = p->n;
	for (size_t i = 0; i < p->n; i++) {
		const struct jpair *pair = job_pair(j, p->s[i].src, l->info.id);

		sparse |= p->s[i].counts->mode != DTEP__MODE__MODE_DENSE;
		if (!pair)
			continue;	/* decode refuses it */
		if (!(g->e[i] = malloc((pair->n ? pair->n : 1) * sizeof(*pair->e))))
			goto fail;
		memcpy(g->e[i], pair->e, pair->n * sizeof(*pair->e));
		g->ne[i] = pair->n;
	}
	for (size_t s = 0; s < l->nbufs; s++) {
		g->buf_ids[s] = l->buf_ids[s];
		g->enc[s] = (uint8_t)jsink_keep_encoded(j, l, l->bufs[s]);
	}
	g->nbufs = l->nbufs;
	snprintf(g->job, sizeof(g->job), "%s", j->name);
	g->participant = l->info.id;
	/* On the loop: sink_select may log, and it fires once per version
	 * (job_ext.h; NULL in production). */
	g->alter = sparse && j->eng->ext.sink_select && j->eng->ext.sink_alter &&
		   j->eng->ext.sink_select(p->version);
	for (struct jpend **pp = &jsink_of(l)->pend; *pp; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	}
	p->next = NULL;
	g->p = p;
	jsink_of(l)->staging = p->version;
	jsink_of(l)->staging_state = p->state;	/* staging: it moves to the worker */
	g->t.run = stage_run;
	g->t.done = stage_done;
	jtask_start(j->eng, &g->t);
	return 0;
fail:
	stage_free(g);
	return -ENOMEM;
}

/* Stage whatever can be staged now, in version order. */
void jsink_try_stage(struct job *j, struct jlocal *l)
{
	char err[256];

	for (;;) {
		struct jpend *p, *best = NULL;
		struct sink_step d;
		uint64_t v;
		int wait = 0;

		if (jsink_of(l)->staging)
			return;	/* a version is being staged: its base for what follows */
		if (jsink_of(l)->arrive)
			return;	/* one is in the buffers (apply on arrival): nothing else stages */

		/* Versions the sink holds already (or older) go. */
		while ((p = jsink_of(l)->pend) && p->version <= jsink_of(l)->held &&
		       sink_decide(l, p->version, &p->state, SINK_EV_SUPERSEDED).act == SINK_A_FREE)
			jsink_pend_drop(l, p);
		for (struct jpend *next; p && p->next; p = next) {
			next = p->next;
			if (next->version <= jsink_of(l)->held &&
			    sink_decide(l, next->version, &next->state, SINK_EV_SUPERSEDED).act ==
				    SINK_A_FREE) {
				jsink_pend_drop(l, next);
				next = p;
			}
		}
		for (p = jsink_of(l)->pend; p; p = p->next)
			if (jsink_pend_complete(p) && (!best || p->version < best->version))
				best = p;
		if (!best)
			return;
		for (size_t i = 0; i < best->n; i++) {
			const Dtep__Counts *c = best->s[i].counts;
			int have_base = 0;

			if (c->mode != DTEP__MODE__MODE_SPARSE || c->base_version == jsink_of(l)->held)
				continue;
			for (p = jsink_of(l)->pend; p; p = p->next)
				have_base |= p->version == c->base_version &&
					     c->base_version > jsink_of(l)->held;
			if (have_base) {
				wait = 1;	/* its base is still on the way */
				continue;
			}
			v = best->version;
			d = sink_decide(l, v, &best->state, SINK_EV_COMPLETE_NO_BASE);
			if (d.act != SINK_A_BASE_MISMATCH)
				return;
			snprintf(err, sizeof(err), "sparse from %llx builds on version %llu; sink holds %llu",
				 (unsigned long long)best->s[i].src, (unsigned long long)c->base_version,
				 (unsigned long long)jsink_of(l)->held);
			jsink_refuse_version(j, l, best, DTEP__APPLY_RESULT__APPLY_BASE_MISMATCH,
					     err);
			jsink_pend_drop(l, best);
			jsink_step_check(j, l, v, d);
			best = NULL;
			break;
		}
		if (!best)
			continue;
		if (wait) {
			/* A version dense from every source needs no base: it
			 * goes ahead of sparse ones waiting on a base that may
			 * never complete (a part lost with its sender). */
			struct jpend *dense = NULL;

			for (p = jsink_of(l)->pend; p; p = p->next)
				if (p->version > best->version && jsink_pend_complete(p) &&
				    jsink_pend_all_dense(p) &&
				    (!dense || p->version < dense->version))
					dense = p;
			if (!dense)
				return;
			best = dense;
		}
		if (j->eng->stopping)
			return;	/* shutting down: it stays pending, nothing more is staged */
		v = best->version;
		d = sink_decide(l, v, &best->state, SINK_EV_COMPLETE);
		if (d.act != SINK_A_STAGE)
			return;
		if (stage_start(j, l, best) < 0) {
			/* No worker could take it: staging failed. */
			d = sink_decide(l, v, &best->state, SINK_EV_WORKER_FAILED);
			if (d.act == SINK_A_REFUSE)
				jsink_refuse_version(j, l, best, DTEP__APPLY_RESULT__APPLY_REFUSED,
						     "out of memory");
			jsink_pend_drop(l, best);
			jsink_step_check(j, l, v, d);
			continue;
		}
		jsink_step_check(j, l, v, d);
		return;	/* one at a time: stage_done comes back here */
	}
}
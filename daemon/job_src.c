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
#include "daemon/job_int.h"
#include "daemon/job_ops.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "daemon/route.h"
#include "gpu/codec.h"
#include "gpu/compute.h"

#define FAIL(code, ...) jfail(err, errlen, code, __VA_ARGS__)

void jpair_free_state(struct jpair *p)
{
	if (p->dirty) {
		for (size_t i = 0; i < p->n; i++)
			free(p->dirty[i]);
		free(p->dirty);
		p->dirty = NULL;
	}
}

static int pair_dirty_alloc(struct jpair *p)
{
	if (p->dirty)
		return 0;
	p->dirty = calloc(p->n ? p->n : 1, sizeof(*p->dirty));
	if (!p->dirty)
		return -1;
	for (size_t i = 0; i < p->n; i++) {
		p->dirty[i] = calloc(dtc_bitmap_words(&p->e[i].map), sizeof(uint64_t));
		if (!p->dirty[i]) {
			jpair_free_state(p);
			return -1;
		}
	}
	return 0;
}

static void pair_dirty_clear(struct jpair *p)
{
	if (!p->dirty)
		return;
	for (size_t i = 0; i < p->n; i++)
		memset(p->dirty[i], 0, dtc_bitmap_words(&p->e[i].map) * sizeof(uint64_t));
}

/* Per group constants from the request; -1 with the reason. */
static int derive_groups(Dte__HParams *const *g, size_t n, int64_t step, struct dtc_consts *k,
			 char *err, size_t errlen)
{
	if (n > JOB_MAX_GROUPS)
		return snprintf(err, errlen, "%zu optimizer groups; at most %d", n, JOB_MAX_GROUPS), -1;
	for (size_t i = 0; i < n; i++) {
		struct dtc_hparams hp = {
			.lr = g[i]->lr, .beta1 = g[i]->beta1, .beta2 = g[i]->beta2, .eps = g[i]->eps,
			.weight_decay = g[i]->weight_decay, .step = step,
		};
		char why[128];

		if (!g[i]->variant || !*g[i]->variant || !strcmp(g[i]->variant, "torch"))
			hp.variant = DTC_VARIANT_TORCH;
		else if (!strcmp(g[i]->variant, "fused"))
			hp.variant = DTC_VARIANT_FUSED;
		else
			return snprintf(err, errlen, "group %zu: variant \"%s\" unknown (torch, fused)", i,
					g[i]->variant), -1;
		if (dtc_hparams_derive(&hp, &k[i], why, sizeof(why)) < 0)
			return snprintf(err, errlen, "group %zu: %s", i, why), -1;
	}
	return 0;
}

static int src_view(const struct jlocal *l, const struct jentry *e, struct dtc_src *s)
{
	struct dbuf *p = jlocal_buf(l, e->src_buf, NULL);
	struct dbuf *m = jlocal_buf(l, e->src_buf_m, NULL);
	struct dbuf *v = jlocal_buf(l, e->src_buf_v, NULL);

	if (!p || !m || !v || !p->ptr || !m->ptr || !v->ptr)
		return -1;
	s->param = p->ptr;
	s->exp_avg = m->ptr;
	s->exp_avg_sq = v->ptr;
	s->len = p->length < m->length ? p->length : m->length;
	s->len = s->len < v->length ? s->len : v->length;
	return 0;
}

/* OR step's changed set into every sparse-capable pair of l. */
static int scan_or(struct job *j, struct jlocal *l, const struct dtc_consts *k, size_t ngroups,
		   char *err, size_t errlen)
{
	for (size_t i = 0; i < j->npairs; i++) {
		struct jpair *p = &j->pairs[i];

		if (p->src != l->info.id || p->need_dense)
			continue;
		if (pair_dirty_alloc(p) < 0)
			return snprintf(err, errlen, "out of memory"), -1;
		for (size_t q = 0; q < p->n; q++) {
			const struct jentry *e = &p->e[q];
			struct dtc_src s;
			uint64_t cnt;
			int rc;

			if (e->group >= ngroups)
				return snprintf(err, errlen, "optimizer group %u has no hyper-parameters "
						"(%zu given)", e->group, ngroups), -1;
			if (src_view(l, e, &s) < 0)
				return snprintf(err, errlen, "source buffers missing"), -1;
			rc = dtc_scan(jeng.be, &e->map, &k[e->group], &s, p->dirty[q],
				      dtc_bitmap_words(&e->map), DTC_SCAN_OR, &cnt);
			if (rc != DTC_OK)
				return snprintf(err, errlen, "scan: %s", dtc_strerror(rc)), -1;
		}
	}
	return 0;
}

Dte__Status job_mark(uint64_t conn, const Dte__MarkRequest *rq, Dte__MarkReply *rep, char *err,
		     size_t errlen)
{
	struct job *j = job_find(rq->job);
	struct dtc_consts k[JOB_MAX_GROUPS];
	struct jlocal *l;

	if (!j)
		return FAIL(DTE__STATUS__STATUS_ERR_NOT_FOUND, "unknown job \"%s\"", rq->job ? rq->job : "");
	l = job_local_owned(j, rq->participant, conn);
	if (!l || l->info.role != JROLE_SOURCE)
		return FAIL(DTE__STATUS__STATUS_ERR_NOT_FOUND,
			    "job %s: no source participant %llx on this connection", j->name,
			    (unsigned long long)rq->participant);
	if (rq->step < 1)
		return FAIL(DTE__STATUS__STATUS_ERR_INVALID, "job %s: step must be >= 1", j->name);
	if (derive_groups(rq->groups, rq->n_groups, rq->step, k, err, errlen) < 0)
		return DTE__STATUS__STATUS_ERR_INVALID;
	if (l->last_version && rq->step == l->covered + 1 && !l->gap) {
		if (scan_or(j, l, k, rq->n_groups, err, errlen) < 0) {
			l->gap = 1;
			return DTE__STATUS__STATUS_ERR_INVALID;
		}
		l->covered = rq->step;
	} else if (rq->step > l->covered) {
		/* Before the first publish nothing builds on marks (it is dense);
		 * after it, a missed step means the next publish is dense. */
		if (l->last_version && !l->gap) {
			l->gap = 1;
			DLOG_I("job %s: mark of step %lld after step %lld: steps missed, next publish "
			       "dense", j->name, (long long)rq->step, (long long)l->covered);
		}
		l->covered = rq->step;
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
	rep->gap = l->gap;
	return DTE__STATUS__STATUS_OK;
}

/* Growable byte buffer for one pair's raw payload. */
struct bytes {
	uint8_t *p;
	size_t n, cap;
};

static int bytes_reserve(struct bytes *b, size_t more)
{
	if (b->n + more <= b->cap)
		return 0;
	size_t nc = b->cap ? b->cap : 4096;
	while (nc < b->n + more)
		nc *= 2;
	void *np = realloc(b->p, nc);
	if (!np)
		return -1;
	b->p = np;
	b->cap = nc;
	return 0;
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

/* Capture one pair into COUNTS + PAYLOAD and send them. */
static int capture_pair(struct job *j, struct jlocal *l, struct jpair *p, uint64_t version,
			int sparse, struct jhist *h, char *err, size_t errlen)
{
	Dtep__Counts c = DTEP__COUNTS__INIT;
	Dtep__Payload pl = DTEP__PAYLOAD__INIT;
	Dtep__JobRef ref;
	const struct jpinfo *dst = job_part(j, p->dst);
	uint64_t *counts = calloc(p->n ? p->n : 1, sizeof(*counts));
	uint32_t *cbuf = calloc(p->n ? p->n : 1, sizeof(*cbuf));
	uint64_t *csum = calloc(p->n ? p->n : 1, sizeof(*csum));
	Dtep__Checksum *ck = NULL, **ckp = NULL;
	size_t nck = 0, i;
	struct bytes raw = { 0 };
	uint8_t *chunk = NULL;
	size_t chunk_len = 0;
	int rc = -1, remote;

	if (!dst || !counts || !cbuf || !csum) {
		snprintf(err, errlen, dst ? "out of memory" : "sink participant not in the plan");
		goto out;
	}
	remote = !route_is_self(dst->node, NULL);
	for (i = 0; i < p->n; i++) {
		const struct jentry *e = &p->e[i];
		struct dtc_src s;
		uint64_t sum = 0, cnt = 0;
		size_t k, len = 0;
		int r;

		if (src_view(l, e, &s) < 0) {
			snprintf(err, errlen, "source buffers missing");
			goto out;
		}
		if ((r = dtc_checksum_entry(jeng.be, &e->map, s.param, s.len, &sum)) != DTC_OK) {
			snprintf(err, errlen, "checksum: %s", dtc_strerror(r));
			goto out;
		}
		for (k = 0; k < nck && cbuf[k] != e->dst_buf; k++)
			;
		if (k == nck) {
			cbuf[nck] = e->dst_buf;
			csum[nck++] = 0;
		}
		csum[k] += sum;
		if (sparse) {
			uint64_t words = dtc_bitmap_words(&e->map), n = 0;
			uint64_t *pos;
			uint16_t *val;

			for (uint64_t x = 0; x < words; x++)
				cnt += (uint64_t)__builtin_popcountll(p->dirty[i][x]);
			counts[i] = cnt;
			h->elements += e->box;
			if (!cnt)
				continue;
			pos = malloc(cnt * sizeof(*pos));
			val = malloc(cnt * sizeof(*val));
			if (!pos || !val || bytes_reserve(&raw, 8 + dtc_sparse_bound(cnt)) < 0) {
				free(pos);
				free(val);
				snprintf(err, errlen, "out of memory");
				goto out;
			}
			r = dtc_sparse_from_bitmap(jeng.be, &e->map, p->dirty[i], words, s.param, s.len,
						   pos, val, cnt, &n);
			if (r == DTC_OK && n != cnt)
				r = DTC_ECORRUPT;
			if (r == DTC_OK)
				r = dtc_sparse_encode(pos, val, n, e->box, raw.p + raw.n + 8,
						      raw.cap - raw.n - 8, &len);
			free(pos);
			free(val);
			if (r != DTC_OK) {
				snprintf(err, errlen, "sparse capture: %s", dtc_strerror(r));
				goto out;
			}
		} else {
			uint16_t *vals = malloc(e->box * sizeof(*vals));

			counts[i] = cnt = e->box;
			h->elements += e->box;
			if (!vals || bytes_reserve(&raw, 8 + 2 * e->box) < 0) {
				free(vals);
				snprintf(err, errlen, "out of memory");
				goto out;
			}
			r = dtc_dense_extract(jeng.be, &e->map, s.param, s.len, vals);
			if (r == DTC_OK)
				r = dtc_dense_encode(vals, e->box, raw.p + raw.n + 8, raw.cap - raw.n - 8, &len);
			free(vals);
			if (r != DTC_OK) {
				snprintf(err, errlen, "dense capture: %s", dtc_strerror(r));
				goto out;
			}
		}
		for (int b = 0; b < 8; b++)
			raw.p[raw.n + b] = (uint8_t)((uint64_t)len >> (8 * b));
		raw.n += 8 + len;
		h->changed += cnt;
	}
	if (raw.n) {
		chunk = malloc(dtc_chunk_bound(raw.n));
		if (!chunk) {
			snprintf(err, errlen, "out of memory");
			goto out;
		}
		/* Memory is faster than zstd; a link usually is not. */
		if (dtc_chunk_pack(raw.p, raw.n, remote ? 1 : 0, chunk, dtc_chunk_bound(raw.n),
				   &chunk_len) != DTC_OK) {
			snprintf(err, errlen, "payload framing failed");
			goto out;
		}
	}
	ck = calloc(nck ? nck : 1, sizeof(*ck));
	ckp = calloc(nck ? nck : 1, sizeof(*ckp));
	if (!ck || !ckp) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	for (i = 0; i < nck; i++) {
		dtep__checksum__init(&ck[i]);
		ck[i].dst_buffer = cbuf[i];
		ck[i].partial = csum[i];
		ckp[i] = &ck[i];
	}
	job_fill_ref(j, &ref);
	c.job = &ref;
	c.epoch = j->epoch;
	c.version = version;
	c.base_version = sparse ? p->last_sent : 0;
	c.mode = sparse ? DTEP__MODE__MODE_SPARSE : DTEP__MODE__MODE_DENSE;
	c.src = p->src;
	c.dst = p->dst;
	c.n_counts = p->n;
	c.counts = counts;
	c.n_checksums = nck;
	c.checksums = ckp;
	c.payload_bytes = chunk_len;
	if (job_send_to_node(j, dst->node, DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS, &c.base, NULL, 0) < 0) {
		p->need_dense = 1;
		rc = 0;		/* that sink misses this version; the rest proceed */
		goto out;
	}
	if (chunk_len) {
		uint64_t x = 0;

		for (int b = 0; b < 8; b++)
			x |= (uint64_t)chunk[24 + b] << (8 * b);
		pl.job = &ref;
		pl.epoch = j->epoch;
		pl.version = version;
		pl.src = p->src;
		pl.dst = p->dst;
		pl.encoding = chunk[4];
		pl.xxh3 = x;
		if (job_send_to_node(j, dst->node, DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD, &pl.base,
				     chunk, chunk_len) < 0)
			p->need_dense = 1;
	}
	h->bytes += chunk_len;
	h->pairs++;
	if (sparse)
		h->sparse++;
	else
		h->dense++;
	p->last_sent = version;
	rc = 0;
out:
	free(counts);
	free(cbuf);
	free(csum);
	free(ck);
	free(ckp);
	free(raw.p);
	free(chunk);
	return rc;
}

Dte__Status job_publish(uint64_t conn, const Dte__PublishRequest *rq, Dte__PublishReply *rep,
			char *err, size_t errlen)
{
	struct job *j = job_find(rq->job);
	struct dtc_consts k[JOB_MAX_GROUPS];
	uint64_t t0 = uv_hrtime(), changed0, elems0, bytes0;
	struct jlocal *l;
	struct jhist *h;
	int stepped, first;
	uint32_t sinks = 0, dense = 0;

	if (!j)
		return FAIL(DTE__STATUS__STATUS_ERR_NOT_FOUND, "unknown job \"%s\"", rq->job ? rq->job : "");
	l = job_local_owned(j, rq->participant, conn);
	if (!l || l->info.role != JROLE_SOURCE)
		return FAIL(DTE__STATUS__STATUS_ERR_NOT_FOUND,
			    "job %s: no source participant %llx on this connection", j->name,
			    (unsigned long long)rq->participant);
	if (!l->announced)
		return FAIL(DTE__STATUS__STATUS_ERR_INVALID, "job %s: not planned yet", j->name);
	if (!j->complete)
		return FAIL(DTE__STATUS__STATUS_ERR_INVALID,
			    "job %s is incomplete: not every source rank is attached", j->name);
	if (rq->version <= l->last_version)
		return FAIL(DTE__STATUS__STATUS_ERR_INVALID,
			    "job %s: version %llu is not after the last published %llu", j->name,
			    (unsigned long long)rq->version, (unsigned long long)l->last_version);
	if (rq->step < 1)
		return FAIL(DTE__STATUS__STATUS_ERR_INVALID, "job %s: step must be >= 1", j->name);
	if (derive_groups(rq->groups, rq->n_groups, rq->step, k, err, errlen) < 0)
		return DTE__STATUS__STATUS_ERR_INVALID;
	first = l->last_version == 0;
	/* The dirty bitmaps hold steps (last publish, covered]; this step
	 * joins them unless a mark already put it there. */
	stepped = !first && !l->gap && (rq->step == l->covered || rq->step == l->covered + 1);
	if (stepped && rq->step == l->covered + 1 &&
	    scan_or(j, l, k, rq->n_groups, err, errlen) < 0)
		return DTE__STATUS__STATUS_ERR_INVALID;
	h = hist_get(j, rq->version, rq->step);
	changed0 = h->changed;
	elems0 = h->elements;
	bytes0 = h->bytes;
	for (size_t i = 0; i < j->npairs; i++) {
		struct jpair *p = &j->pairs[i];
		uint64_t pair_bytes0;
		int sparse;

		if (p->src != l->info.id)
			continue;
		sparse = stepped && !p->need_dense && p->dirty && p->last_sent &&
			 p->last_sent == l->last_version;
		if (!sparse)
			dmetrics_add(DM_DENSE_FALLBACKS, jops_dense_reason(j, l, p, stepped), 1);
		pair_bytes0 = h->bytes;
		if (capture_pair(j, l, p, rq->version, sparse, h, err, errlen) < 0) {
			DLOG_E("job %s: capture of version %llu for %llx failed: %s", j->name,
			       (unsigned long long)rq->version, (unsigned long long)p->dst, err);
			p->need_dense = 1;
			l->gap = 1;
			return DTE__STATUS__STATUS_ERR_INTERNAL;
		}
		dmetrics_add(DM_WIRE_BYTES, sparse ? "sparse" : "dense", (double)(h->bytes - pair_bytes0));
		if (p->last_sent == rq->version) {
			p->need_dense = 0;
			sinks++;
			dense += !sparse;
		}
		pair_dirty_clear(p);
	}
	l->last_version = rq->version;
	l->covered = rq->step;
	l->gap = 0;
	h->capture_ms += job_ms_since(t0);
	h->t_captured = uv_hrtime();
	h->sinks = 0;
	for (size_t i = 0; i < j->npairs; i++) {
		const struct jpair *p = &j->pairs[i];
		int once = p->last_sent == rq->version && job_local(j, p->src);

		for (size_t q = 0; once && q < i; q++)
			if (j->pairs[q].dst == p->dst && j->pairs[q].last_sent == rq->version &&
			    job_local(j, j->pairs[q].src))
				once = 0;
		h->sinks += once;
	}
	rep->version = rq->version;
	rep->sinks = sinks;
	rep->dense = dense;
	rep->changed = h->changed - changed0;
	rep->elements = h->elements - elems0;
	rep->bytes = h->bytes - bytes0;
	rep->capture_ms = job_ms_since(t0);
	dmetrics_add(DM_VERSIONS_PUBLISHED, NULL, 1);
	dmetrics_add(DM_ELEMENTS_CHANGED, NULL, (double)rep->changed);
	dmetrics_add(DM_ELEMENTS_COVERED, NULL, (double)rep->elements);
	if (rep->elements && !dense)
		dmetrics_set(DM_CHANGED_RATIO, NULL, (double)rep->changed / (double)rep->elements);
	dmetrics_observe(DM_PHASE_SECONDS, "capture", rep->capture_ms / 1e3);
	DLOG_D("job %s: version %llu step %lld captured: %u sinks (%u dense), %llu of %llu elements, "
	       "%llu bytes, %.2f ms", j->name, (unsigned long long)rq->version, (long long)rq->step,
	       sinks, dense, (unsigned long long)rep->changed, (unsigned long long)rep->elements,
	       (unsigned long long)rep->bytes, rep->capture_ms);
	return DTE__STATUS__STATUS_OK;
}

/* ------------------------------------------------------------------ acks */

void jsrc_staged(struct job *j, const Dtep__Staged *m)
{
	struct jpair *p = job_pair(j, m->src, m->dst);
	struct jhist *h;

	if (!p || !job_local(j, m->src))
		return;
	if (m->version > p->staged)
		p->staged = m->version;
	h = jhist_find(j, m->version);
	if (h && ++h->staged_acks == h->pairs) {
		h->transfer_ms = job_ms_since(h->t_captured);
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
			prev = p->applied;
			seen = 1;
		}
		if (ok && m->version > p->applied)
			p->applied = m->version;
		if (!ok) {	/* whatever the sink holds now, the next version repairs it */
			p->need_dense = 1;
			if (m->version > p->failed)
				p->failed = m->version;
		}
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

int jsrc_wait_done(struct job *j, uint64_t version, uint32_t *sinks, char *err, size_t errlen)
{
	uint32_t n = 0;
	int done = 1;

	for (size_t i = 0; i < j->npairs; i++) {
		const struct jpair *p = &j->pairs[i];
		int first = 1;

		if (!job_local(j, p->src))
			continue;
		for (size_t q = 0; q < i; q++)
			if (j->pairs[q].dst == p->dst && job_local(j, j->pairs[q].src))
				first = 0;
		n += first;
		if (p->applied >= version)
			continue;
		if (p->failed >= version) {
			snprintf(err, errlen, "sink %llx did not apply version %llu cleanly (checksum or "
				 "refusal, see the daemon log); the next version repairs it densely",
				 (unsigned long long)p->dst, (unsigned long long)p->failed);
			*sinks = n;
			return -1;
		}
		done = 0;
	}
	*sinks = n;
	return done;
}

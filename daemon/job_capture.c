/* daemon/job_capture.c — the expensive half of mark and publish, run off
 * the loop thread (uv_queue_work): scan, sparse/dense extract, checksums,
 * encode.  A task owns everything it touches: copies of the pairs'
 * entries, the dirty bitmaps (taken from the pairs while it runs), and a
 * reference on every source buffer (so a client that goes away cannot
 * unmap them under the worker).  The loop only decides (job_src.c) and
 * sends (job_src.c, after the worker is done).
 *
 * One detection per source box: entries of different pairs that read the
 * same source elements (same buffers, group and source map: replicated
 * norms and KV heads, sink replicas) are scanned once per version and every
 * destination's bitmap gets the result; dense values and encodings are
 * shared the same way, checksums whenever the destination map is the same
 * too (replicas).  The plan names these detections (dte_plan_entry.detect);
 * the daemon derives them again from the entries it holds, so a peer's
 * PLAN cannot make it skip a scan it needs.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include "daemon/job_cuda.h"
#include "daemon/job_int.h"
#include "daemon/job_snapshot.h"
#include "daemon/testhook.h"
#include "gpu/backend.h"
#include "gpu/codec.h"
#include "gpu/compute.h"

/* What makes two entries read the same source elements. */
struct det_key {
	uint32_t src_buf, src_buf_m, src_buf_v, group, ndim;
	int64_t extent[DTE_MAX_DIMS];
	int64_t src_offset;
	int64_t src_stride[DTE_MAX_DIMS];
};

struct det_ref {
	uint64_t hash;
	struct det_key key;
	uint32_t pair, entry;
};

/* Results shared between the members of one detection. */
struct det_csum {
	uint32_t dst_buf;
	int64_t dst_offset, dst_stride[DTE_MAX_DIMS];
	uint64_t sum;
};

struct det_sparse {
	const uint64_t *bitmap;   /* a member's dirty bitmap (alive for the task) */
	uint8_t *enc;
	size_t len;
	uint64_t count;
};

struct det {
	size_t first, members;    /* its entries: refs[first .. first + members) */
	uint32_t left;            /* members not captured yet */
	uint8_t *dense;           /* encoded dense values */
	size_t dense_len;
	struct det_csum *cs;
	size_t ncs;
	struct det_sparse *sp;
	size_t nsp;
};

static void key_of(const struct jentry *e, struct det_key *k)
{
	memset(k, 0, sizeof(*k));
	k->src_buf = e->src_buf;
	k->src_buf_m = e->src_buf_m;
	k->src_buf_v = e->src_buf_v;
	k->group = e->group;
	k->ndim = e->map.ndim;
	k->src_offset = e->map.src_offset;
	for (uint32_t d = 0; d < e->map.ndim && d < DTE_MAX_DIMS; d++) {
		k->extent[d] = e->map.extent[d];
		k->src_stride[d] = e->map.src_stride[d];
	}
}

static int ref_cmp(const void *a, const void *b)
{
	const struct det_ref *x = a, *y = b;
	int c;

	if (x->hash != y->hash)
		return x->hash < y->hash ? -1 : 1;
	c = memcmp(&x->key, &y->key, sizeof(x->key));
	if (c)
		return c;
	/* Members in (pair, entry) order: deterministic output. */
	if (x->pair != y->pair)
		return x->pair < y->pair ? -1 : 1;
	return x->entry < y->entry ? -1 : x->entry > y->entry;
}

static struct dbuf *cap_buf(const struct jcap *c, uint32_t layout_id)
{
	for (size_t i = 0; i < c->nbufs; i++)
		if (c->buf_ids[i] == layout_id)
			return c->bufs[i];
	return NULL;
}

static int cap_src(const struct jcap *c, const struct jentry *e, struct dtc_src *s)
{
	struct dbuf *p = cap_buf(c, e->src_buf), *m = cap_buf(c, e->src_buf_m);
	struct dbuf *v = cap_buf(c, e->src_buf_v);

	if (!p || !m || !v || !p->ptr || !m->ptr || !v->ptr)
		return -1;
	/* GPU sources: device reads wait for the trainer's optimizer step. */
	if (jcuda_wait(p) < 0 || jcuda_wait(m) < 0 || jcuda_wait(v) < 0)
		return -1;
	s->param = p->ptr;
	s->exp_avg = m->ptr;
	s->exp_avg_sq = v->ptr;
	s->len = p->length < m->length ? p->length : m->length;
	s->len = s->len < v->length ? s->len : v->length;
	return 0;
}

static int capfail(struct jcap *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int capfail(struct jcap *c, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
	return -1;
}

#define CAPFAIL(...) capfail(c, __VA_ARGS__)

/* Groups every entry of the task by detection: c->p[i].det[q]. */
static int group_detections(struct jcap *c, struct det_ref **refs, struct det **dets,
			    size_t *ndets)
{
	size_t n = 0, k = 0, g = 0;
	struct det_ref *r;

	for (size_t i = 0; i < c->np; i++)
		n += c->p[i].n;
	*refs = r = calloc(n ? n : 1, sizeof(*r));
	*dets = calloc(n ? n : 1, sizeof(**dets));
	if (!r || !*dets)
		return CAPFAIL("out of memory");
	for (size_t i = 0; i < c->np; i++) {
		c->p[i].det = calloc(c->p[i].n ? c->p[i].n : 1, sizeof(*c->p[i].det));
		if (!c->p[i].det)
			return CAPFAIL("out of memory");
		for (size_t q = 0; q < c->p[i].n; q++, k++) {
			key_of(&c->p[i].e[q], &r[k].key);
			r[k].hash = XXH3_64bits(&r[k].key, sizeof(r[k].key));
			r[k].pair = (uint32_t)i;
			r[k].entry = (uint32_t)q;
		}
	}
	qsort(r, n, sizeof(*r), ref_cmp);
	for (k = 0; k < n; k++) {
		if (k && (r[k].hash != r[k - 1].hash || memcmp(&r[k].key, &r[k - 1].key, sizeof(r[k].key))))
			(*dets)[++g].first = k;
		c->p[r[k].pair].det[r[k].entry] = (uint32_t)g;
		(*dets)[g].left++;
		(*dets)[g].members++;
	}
	*ndets = n ? g + 1 : 0;
	return 0;
}

/* Pass 1: this step's changed set, once per detection, ORed into every
 * member pair's dirty bitmap (pairs without one are captured dense). */
static int scan_all(struct jcap *c, const struct det_ref *refs, const struct det *dets,
		    size_t ndets)
{
	uint64_t *tmp = NULL;
	size_t tmp_words = 0;
	int rc = -1;

	for (size_t i = 0; i < c->np; i++) {
		struct jcap_pair *p = &c->p[i];

		if (!p->want_dirty || p->dirty)
			continue;
		p->dirty = calloc(p->n ? p->n : 1, sizeof(*p->dirty));
		if (!p->dirty)
			return CAPFAIL("out of memory");
		for (size_t q = 0; q < p->n; q++)
			if (!(p->dirty[q] = calloc(dtc_bitmap_words(&p->e[q].map), sizeof(uint64_t))))
				return CAPFAIL("out of memory");
	}
	if (!c->scan || c->detect != JDETECT_ADAMW)
		return 0;
	for (size_t g = 0; g < ndets; g++) {
		const struct jentry *e = NULL;
		uint64_t *one = NULL;
		size_t members = 0;

		/* Members that keep a dirty state; the first gives the map. */
		for (size_t m = dets[g].first; m < dets[g].first + dets[g].members; m++) {
			const struct jcap_pair *p = &c->p[refs[m].pair];

			if (p->dirty && !members++) {
				e = &p->e[refs[m].entry];
				one = p->dirty[refs[m].entry];
			}
		}
		if (!members)
			continue;
		{
			uint64_t words = dtc_bitmap_words(&e->map), cnt;
			struct dtc_src s;
			int r;

			if (e->group >= c->ngroups) {
				CAPFAIL("optimizer group %u has no hyper-parameters (%zu given)", e->group,
					c->ngroups);
				goto out;
			}
			if (cap_src(c, e, &s) < 0) {
				CAPFAIL("source buffers missing");
				goto out;
			}
			if (members == 1) {
				r = jdev_scan(&e->map, &c->k[e->group], &s, one, words, DTC_SCAN_OR,
					     &cnt);
			} else {
				if (words > tmp_words) {
					free(tmp);
					tmp = malloc(words * sizeof(*tmp));
					tmp_words = tmp ? words : 0;
					if (!tmp) {
						CAPFAIL("out of memory");
						goto out;
					}
				}
				r = jdev_scan(&e->map, &c->k[e->group], &s, tmp, words, DTC_SCAN_SET,
					     &cnt);
				for (size_t m = dets[g].first; r == DTC_OK &&
				     m < dets[g].first + dets[g].members; m++) {
					struct jcap_pair *p = &c->p[refs[m].pair];
					uint64_t *dst = p->dirty ? p->dirty[refs[m].entry] : NULL;

					for (uint64_t x = 0; dst && x < words; x++)
						dst[x] |= tmp[x];
				}
			}
			if (r != DTC_OK) {
				CAPFAIL("scan: %s", dtc_strerror(r));
				goto out;
			}
			c->scans++;
			c->scan_elements += e->box;
			c->scan_entries += members;
		}
	}
	rc = 0;
out:
	free(tmp);
	return rc;
}

/* detect = snapshot: every entry of every pair compares the current BF16
 * values with those kept from the pair's previous capture, ORs the
 * difference into its dirty bitmap (when it keeps one) and keeps the
 * current values.  It runs on every capture, dense ones included, so the
 * kept values are always those of the version last captured for the pair:
 * the base the next sparse version is checked against.  No sharing between
 * pairs (each keeps its own copy): the baseline costs what it costs. */
static int snapshot_all(struct jcap *c)
{
	uint64_t *tmp = NULL;
	size_t tmp_words = 0;
	int rc = -1;

	for (size_t i = 0; i < c->np; i++) {
		struct jcap_pair *p = &c->p[i];

		if (!p->snap && !(p->snap = calloc(p->n ? p->n : 1, sizeof(*p->snap)))) {
			CAPFAIL("out of memory");
			goto out;
		}
		for (size_t q = 0; q < p->n; q++) {
			const struct jentry *e = &p->e[q];
			const struct dbuf *b = cap_buf(c, e->src_buf);
			uint64_t words = dtc_bitmap_words(&e->map), cnt = 0;
			uint64_t *bm = p->dirty ? p->dirty[q] : NULL;
			struct dtc_src s;
			int r;

			if (cap_src(c, e, &s) < 0) {
				CAPFAIL("source buffers missing");
				goto out;
			}
			if (b->cuda) {
				CAPFAIL("detect = snapshot needs host source buffers");
				goto out;
			}
			if (!bm) {
				/* Dense for this pair: only the kept values move on. */
				if (words > tmp_words) {
					free(tmp);
					tmp_words = 0;
					if (!(tmp = malloc(words * sizeof(*tmp)))) {
						CAPFAIL("out of memory");
						goto out;
					}
					tmp_words = words;
				}
				memset(tmp, 0, words * sizeof(*tmp));
				bm = tmp;
			}
			r = jsnap_scan(&p->snap[q], dtc_backend_cpu(), &e->map, s.param, s.len, bm,
				       words, &cnt);
			if (r != DTC_OK) {
				CAPFAIL("snapshot scan: %s", dtc_strerror(r));
				goto out;
			}
			c->scans++;
			c->scan_elements += e->box;
			c->scan_entries++;
		}
	}
	rc = 0;
out:
	free(tmp);
	return rc;
}

/* Growable byte buffer for one pair's framed payload: DTC_CHUNK_HDR bytes
 * kept free at the front, then length-prefixed entry payloads encoded in
 * place, so the buffer becomes the chunk without another copy. */
struct bytes {
	uint8_t *p;
	size_t n, cap;
};

/* Room for `len` more bytes (pages past what is written stay untouched, so
 * a generous bound costs address space, not memory). */
static int bytes_reserve(struct bytes *b, size_t len)
{
	if (!b->n)
		b->n = DTC_CHUNK_HDR;
	if (b->n + len > b->cap) {
		size_t nc = b->cap ? b->cap : 4096;
		void *np;

		while (nc < b->n + len)
			nc *= 2;
		if (!(np = realloc(b->p, nc)))
			return -1;
		b->p = np;
		b->cap = nc;
	}
	return 0;
}

static void bytes_len(struct bytes *b, size_t at, size_t len)
{
	for (int i = 0; i < 8; i++)
		b->p[at + i] = (uint8_t)((uint64_t)len >> (8 * i));
}

static int bytes_put(struct bytes *b, const uint8_t *data, size_t len)
{
	if (bytes_reserve(b, 8 + len) < 0)
		return -1;
	bytes_len(b, b->n, len);
	if (len)
		memcpy(b->p + b->n + 8, data, len);
	b->n += 8 + len;
	return 0;
}

static void det_release(struct det *d)
{
	free(d->dense);
	d->dense = NULL;
	free(d->cs);
	d->cs = NULL;
	d->ncs = 0;
	for (size_t i = 0; i < d->nsp; i++)
		free(d->sp[i].enc);
	free(d->sp);
	d->sp = NULL;
	d->nsp = 0;
}

/* The entry's checksum contribution, computed once per destination map. */
static int entry_checksum(struct jcap *c, struct det *d, const struct jentry *e,
			  const struct dtc_src *s, uint64_t *sum)
{
	struct det_csum k;
	void *np;
	int r;

	memset(&k, 0, sizeof(k));
	k.dst_buf = e->dst_buf;
	k.dst_offset = e->map.dst_offset;
	memcpy(k.dst_stride, e->map.dst_stride, e->map.ndim * sizeof(k.dst_stride[0]));
	for (size_t i = 0; i < d->ncs; i++) {
		if (d->cs[i].dst_buf == k.dst_buf && d->cs[i].dst_offset == k.dst_offset &&
		    !memcmp(d->cs[i].dst_stride, k.dst_stride, sizeof(k.dst_stride))) {
			*sum = d->cs[i].sum;
			return 0;
		}
	}
	if ((r = jdev_checksum_entry(&e->map, s->param, s->len, &k.sum)) != DTC_OK)
		return CAPFAIL("checksum: %s", dtc_strerror(r));
	*sum = k.sum;
	if (d->left > 1 && (np = realloc(d->cs, (d->ncs + 1) * sizeof(*d->cs)))) {
		d->cs = np;
		d->cs[d->ncs++] = k;
	}
	return 0;
}

static int entry_dense(struct jcap *c, struct det *d, const struct jentry *e,
		       const struct dtc_src *s, struct bytes *raw)
{
	uint16_t *vals;
	uint8_t *enc;
	size_t len = 0;
	int r;

	if (d->dense)
		return bytes_put(raw, d->dense, d->dense_len) < 0 ? CAPFAIL("out of memory") : 0;
	vals = malloc(e->box * sizeof(*vals));
	enc = malloc(2 * e->box + 64);
	if (!vals || !enc) {
		free(vals);
		free(enc);
		return CAPFAIL("out of memory");
	}
	r = jdev_dense_extract(&e->map, s->param, s->len, vals);
	if (r == DTC_OK)
		r = dtc_dense_encode(vals, e->box, enc, 2 * e->box + 64, &len);
	free(vals);
	if (r != DTC_OK) {
		free(enc);
		return CAPFAIL("dense capture: %s", dtc_strerror(r));
	}
	if (bytes_put(raw, enc, len) < 0) {
		free(enc);
		return CAPFAIL("out of memory");
	}
	if (d->left > 1) {
		d->dense = enc;
		d->dense_len = len;
	} else {
		free(enc);
	}
	return 0;
}

static int entry_sparse(struct jcap *c, struct det *d, const struct jentry *e,
			const struct dtc_src *s, const uint64_t *bitmap, struct bytes *raw,
			uint64_t *count)
{
	uint64_t words = dtc_bitmap_words(&e->map), cnt = 0, n = 0;
	uint64_t *pos;
	uint16_t *val;
	uint8_t *enc;
	size_t len = 0;
	void *np;
	int r;

	for (size_t i = 0; i < d->nsp; i++) {
		if (!memcmp(d->sp[i].bitmap, bitmap, words * sizeof(*bitmap))) {
			*count = d->sp[i].count;
			if (!d->sp[i].count)
				return 0;
			return bytes_put(raw, d->sp[i].enc, d->sp[i].len) < 0 ? CAPFAIL("out of memory") : 0;
		}
	}
	for (uint64_t x = 0; x < words; x++)
		cnt += (uint64_t)__builtin_popcountll(bitmap[x]);
	*count = cnt;
	enc = NULL;
	if (cnt) {
		size_t at, bound = dtc_sparse_bound(cnt);

		/* Encoded straight into the pair's payload: no per-entry copy. */
		pos = malloc(cnt * sizeof(*pos));
		val = malloc(cnt * sizeof(*val));
		if (!pos || !val || bytes_reserve(raw, 8 + bound) < 0) {
			free(pos);
			free(val);
			return CAPFAIL("out of memory");
		}
		at = raw->n;
		r = jdev_sparse_from_bitmap(&e->map, bitmap, words, s->param, s->len, pos, val,
					   cnt, &n);
		if (r == DTC_OK && n != cnt)
			r = DTC_ECORRUPT;
		if (r == DTC_OK)
			r = dtc_sparse_encode(pos, val, n, e->box, raw->p + at + 8, bound, &len);
		free(pos);
		free(val);
		if (r != DTC_OK)
			return CAPFAIL("sparse capture: %s", dtc_strerror(r));
		bytes_len(raw, at, len);
		raw->n += 8 + len;
		/* Other members with the same bitmap reuse it: keep an exact copy. */
		if (d->left > 1 && (enc = malloc(len)))
			memcpy(enc, raw->p + at + 8, len);
	}
	if (d->left > 1 && (!cnt || enc) && (np = realloc(d->sp, (d->nsp + 1) * sizeof(*d->sp)))) {
		d->sp = np;
		d->sp[d->nsp].bitmap = bitmap;
		d->sp[d->nsp].enc = enc;
		d->sp[d->nsp].len = len;
		d->sp[d->nsp].count = cnt;
		d->nsp++;
	} else {
		free(enc);
	}
	return 0;
}

/* Pass 2: one pair's counts, partial checksums and framed payload. */
static int capture_pair(struct jcap *c, struct jcap_pair *p, struct det *dets)
{
	struct bytes raw = { 0 };
	int rc = -1;

	p->counts = calloc(p->n ? p->n : 1, sizeof(*p->counts));
	p->cbuf = calloc(p->n ? p->n : 1, sizeof(*p->cbuf));
	p->csum = calloc(p->n ? p->n : 1, sizeof(*p->csum));
	if (!p->counts || !p->cbuf || !p->csum)
		return CAPFAIL("out of memory");
	for (size_t i = 0; i < p->n; i++) {
		const struct jentry *e = &p->e[i];
		struct det *d = &dets[p->det[i]];
		struct dtc_src s;
		uint64_t sum = 0, cnt = 0;
		size_t k;

		if (cap_src(c, e, &s) < 0) {
			CAPFAIL("source buffers missing");
			goto out;
		}
		if (entry_checksum(c, d, e, &s, &sum) < 0)
			goto out;
		for (k = 0; k < p->nck && p->cbuf[k] != e->dst_buf; k++)
			;
		if (k == p->nck) {
			p->cbuf[p->nck] = e->dst_buf;
			p->csum[p->nck++] = 0;
		}
		p->csum[k] += sum;
		p->elements += e->box;
		if (p->sparse) {
			if (entry_sparse(c, d, e, &s, p->dirty[i], &raw, &cnt) < 0)
				goto out;
		} else {
			cnt = e->box;
			if (entry_dense(c, d, e, &s, &raw) < 0)
				goto out;
		}
		p->counts[i] = cnt;
		p->changed += cnt;
		if (--d->left == 0)
			det_release(d);
	}
	if (raw.n > DTC_CHUNK_HDR) {
		size_t len = raw.n - DTC_CHUNK_HDR, bound = dtc_chunk_bound(len);
		int zl = p->remote ? (int)c->zstd_level : 0;

		/* Memory is faster than zstd, and a same-cluster link usually
		 * is too: zstd only where the job asks for it (zstd_level).
		 * Stored raw, the payload buffer is framed in place and handed
		 * over as the chunk. */
		if (!zl) {
			dtc_chunk_seal_raw(raw.p, len);
			p->chunk = raw.p;
			p->chunk_len = raw.n;
			raw.p = NULL;
		} else if (!(p->chunk = malloc(bound)) ||
			   dtc_chunk_pack(raw.p + DTC_CHUNK_HDR, len, zl, p->chunk, bound,
					  &p->chunk_len) != DTC_OK) {
			CAPFAIL("payload framing failed");
			goto out;
		}
	}
	rc = 0;
out:
	free(raw.p);
	return rc;
}

int jcap_run(struct jcap *c)
{
	struct det_ref *refs = NULL;
	struct det *dets = NULL;
	size_t ndets = 0;
	uint64_t t0 = uv_hrtime();
	int rc = -1;

	testhook_capture(c->version);
	if (group_detections(c, &refs, &dets, &ndets) < 0)
		goto out;
	c->detections = ndets;
	if (scan_all(c, refs, dets, ndets) < 0)
		goto out;
	if (c->detect == JDETECT_SNAPSHOT && snapshot_all(c) < 0)
		goto out;
	if (c->kind == JCAP_MARK) {
		c->dirty = 0;
		for (size_t i = 0; i < c->np; i++)
			for (size_t q = 0; c->p[i].dirty && q < c->p[i].n; q++)
				for (uint64_t x = 0; x < dtc_bitmap_words(&c->p[i].e[q].map); x++)
					c->dirty += (uint64_t)__builtin_popcountll(c->p[i].dirty[q][x]);
		rc = 0;
		goto out;
	}
	for (size_t i = 0; i < c->np; i++)
		if (capture_pair(c, &c->p[i], dets) < 0)
			goto out;
	rc = 0;
out:
	for (size_t g = 0; dets && g < ndets; g++)
		det_release(&dets[g]);
	free(dets);
	free(refs);
	c->work_ms = (double)(uv_hrtime() - t0) / 1e6;
	return rc;
}

void jcap_free(struct jcap *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->np; i++) {
		struct jcap_pair *p = &c->p[i];

		if (p->dirty) {
			for (size_t q = 0; q < p->n; q++)
				free(p->dirty[q]);
			free(p->dirty);
		}
		jsnap_free_all(p->snap, p->n);
		free(p->e);
		free(p->det);
		free(p->counts);
		free(p->cbuf);
		free(p->csum);
		free(p->chunk);
	}
	free(c->p);
	free(c->buf_ids);
	free(c->bufs);
	free(c);
}

/* daemon/job_capture.c — the expensive half of mark and publish, run off
 * the loop on the I/O's workers (engine_io.h): detect, dense extract,
 * checksums, framing.  A
 * task owns everything it touches: copies of the pairs' entries, the dirty
 * bitmaps of marks (taken from the pairs while it runs), and a reference
 * on every source buffer (so a client that goes away cannot unmap them
 * under the worker).  The loop only decides and sends (job_src.c).
 *
 * A publish of host buffers reads θ, m, v once per detection: dtc_detect()
 * scans the step, ORs in the pair's marks (K > 1), appends the encoded
 * payload to the pair's buffer and returns the entry's checksum from the
 * same read.  No per-element state is kept between versions for K = 1: the
 * dirty bitmap exists only from a version's first mark to its publish.
 * Device buffers (jdev_*) and detect = snapshot scan into a bitmap first
 * and extract from it.
 *
 * One detection per source box: entries of different pairs that read the
 * same source elements (same buffers, group and source map: replicated
 * norms and KV heads, sink replicas) are detected once per version; the
 * other members copy the encoded bytes when their marks are the same, and
 * the checksum when their destination map is the same (replicas).  The
 * plan names these detections (dte_plan_entry.detect); the daemon derives
 * them again from the entries it holds, so a peer's PLAN cannot make it
 * skip a scan it needs.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/bufpool.h"
#include "daemon/job_ext.h"
#include "daemon/job_cuda.h"
#include "daemon/job_state.h"
#include "daemon/job_capture.h"
#include "daemon/job_snapshot.h"
#include "daemon/metrics.h"
#include "daemon/side_table.h"
#include "gpu/codec.h"
#include "gpu/compute.h"
#include "gpu/fp8.h"
#include "gpu/xxh.h"

/* What makes two entries read the same source elements. */
struct det_key {
	uint32_t src_buf, src_buf_m, src_buf_v, group, ndim, fp8;
	int64_t extent[DTE_MAX_DIMS];
	int64_t src_offset;
	int64_t src_stride[DTE_MAX_DIMS];
};

struct det_ref {
	uint64_t hash;
	struct det_key key;
	uint32_t pair, entry;
};

/* Results shared between the members of one detection: a destination
 * map's checksum (the sink buffer id does not enter the sum), and encoded
 * bytes already in some pair's payload (pair, offset, length), looked up
 * by the bitmap they were built from (detect: the mark, NULL for none). */
struct det_csum {
	int64_t dst_offset, dst_stride[DTE_MAX_DIMS];
	uint64_t sum;
};

struct det_sparse {
	const uint64_t *bitmap;   /* a member's bitmap (alive for the task), or NULL */
	size_t pair, at, len;
	uint64_t count;
	uint8_t *own;             /* a copy, once the pair's part holding them went out */
};

struct det {
	size_t first, members;    /* its entries: refs[first .. first + members) */
	uint32_t left;            /* members not captured yet */
	int have_dense;           /* dense bytes at dense.pair/at/len */
	struct det_sparse dense;
	struct det_csum *cs;
	size_t ncs;
	struct det_sparse *sp;
	size_t nsp;
};

/* The units of an FP8 sink's element box (gpu/fp8.h dtc_fp8_box_units)
 * with what the FP8 detect flags, kept for the entry after (a box's codes
 * entry is followed by its scales entry, dte_plan_fp8_split): computed
 * once for both. */
struct jfp8_box {
	uint32_t src_buf, group, flags;
	int64_t src_offset, src_stride[2], fbox[2];
	int detect;
	uint16_t *codes, *scales;
	uint64_t *code_changed, *scale_changed;
};

static void key_of(const struct jentry *e, struct det_key *k)
{
	memset(k, 0, sizeof(*k));
	k->src_buf = e->src_buf;
	k->src_buf_m = e->src_buf_m;
	k->src_buf_v = e->src_buf_v;
	k->group = e->group;
	k->ndim = e->map.ndim;
	k->fp8 = e->fp8;
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
		return -EIO;
	/* GPU sources: device reads wait for the trainer's optimizer step. */
	if (jcuda_wait(p) < 0 || jcuda_wait(m) < 0 || jcuda_wait(v) < 0)
		return -EIO;
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
	return -EIO;
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

/* Host sources: their publish reads θ, m, v once in dtc_detect(), which
 * scans the step itself; a separate scan is for marks, device sources and
 * the snapshot baseline. */
static int entry_host(const struct jcap *c, const struct jentry *e)
{
	const struct dbuf *p = cap_buf(c, e->src_buf), *m = cap_buf(c, e->src_buf_m);
	const struct dbuf *v = cap_buf(c, e->src_buf_v);

	return p && m && v && !p->cuda && !m->cuda && !v->cuda;
}

/* A mark of host sources with side tables on (daemon/side_table.h): this
 * step's changed set into tmp, the certain previous values of its
 * elements, and for every member pair the ones its dirty bitmap did not
 * hold yet (first flagged since the publish: their previous value is the
 * published one) kept in its table, before the set is ORed in. */
static int scan_side(struct jcap *c, const struct det_ref *refs, const struct det *d,
		     const struct jentry *e, const struct dtc_src *s, uint64_t **tmp,
		     size_t *tmp_words)
{
	uint64_t words = dtc_bitmap_words(&e->map), cnt, *skip = NULL, *and = NULL;
	struct side_cand cand = { 0 };
	size_t with = 0;
	int r;

	if (words > *tmp_words) {
		free(*tmp);
		*tmp_words = 0;
		if (!(*tmp = malloc(words * sizeof(**tmp))))
			return DTC_ENOMEM;
		*tmp_words = words;
	}
	r = jdev_scan(&e->map, &c->k[e->group], s, *tmp, words, DTC_SCAN_SET, &cnt);
	if (r != DTC_OK)
		return r;
	/* Only first flags matter: bits every member holds already are
	 * skipped (one member: its own dirty bitmap). */
	for (size_t m = d->first; m < d->first + d->members; m++) {
		const struct jcap_pair *p = &c->p[refs[m].pair];
		uint64_t *dst = p->dirty ? p->dirty[refs[m].entry] : NULL;

		if (!dst)
			continue;
		if (!with++) {
			skip = dst;
			continue;
		}
		if (!skip)
			break;		/* no memory for the AND: none skipped */
		if (!and && (and = malloc(words * sizeof(*and))))
			memcpy(and, skip, words * sizeof(*and));
		for (uint64_t x = 0; and && x < words; x++)
			and[x] &= dst[x];
		skip = and;
	}
	r = side_prev_scan(&e->map, &c->k[e->group], s, *tmp, skip, words, &cand);
	free(and);
	if (r != DTC_OK) {
		/* no candidates (out of memory): the union, as without tables */
		c->side_left_out += cand.n;
		side_cand_free(&cand);
	}
	c->side_uncertain += cand.uncertain;
	for (size_t m = d->first; m < d->first + d->members; m++) {
		struct jcap_pair *p = &c->p[refs[m].pair];
		uint64_t *dst = p->dirty ? p->dirty[refs[m].entry] : NULL, kept = 0;

		if (!dst)
			continue;
		if (!p->side && cand.n)
			p->side = side_new(p->n);	/* NULL at the cap: the union */
		side_add(p->side, refs[m].entry, p->e[refs[m].entry].box, &cand, dst, &kept,
			 &c->side_left_out);
		c->side_kept += kept;
		for (uint64_t x = 0; x < words; x++)
			dst[x] |= (*tmp)[x];
	}
	side_cand_free(&cand);
	return DTC_OK;
}

static int scan_fp8(struct jcap *c, const struct det_ref *refs, const struct det *d,
		    const struct jentry *e);

/* Pass 1 of a mark (and of a publish of device sources): this step's
 * changed set, once per detection, ORed into every member pair's dirty
 * bitmap (pairs without one are captured dense). */
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
		if (!members || e->raw || (c->kind == JCAP_PUBLISH && entry_host(c, e)))
			continue;	/* raw: sent whole every version, nothing to mark */
		if (e->fp8) {
			if (scan_fp8(c, refs, &dets[g], e) < 0)
				goto out;
			continue;
		}
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
			if (c->kind == JCAP_MARK && side_cap() && entry_host(c, e)) {
				r = scan_side(c, refs, &dets[g], e, &s, &tmp, &tmp_words);
				if (r == DTC_ENOMEM) {
					CAPFAIL("out of memory");
					goto out;
				}
			} else if (members == 1) {
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

static int fp8_box_get(struct jcap *c, const struct jentry *e, const struct dtc_src *s,
		       int detect);

/* detect = snapshot of an FP8 entry: OR into bm every unit that differs
 * from the kept one (all of them with none kept), then keep u. */
static int snap_units(struct jsnap *sn, const uint16_t *u, uint64_t n, uint64_t *bm,
		      uint64_t *cnt)
{
	uint64_t c0 = 0;

	for (uint64_t i = 0; i < n; i++)
		if (!sn->vals || sn->n != n || sn->vals[i] != u[i])
			bm[i / 64] |= UINT64_C(1) << (i % 64);
	for (uint64_t w = 0; w < (n + 63) / 64; w++)
		c0 += (uint64_t)__builtin_popcountll(bm[w]);
	*cnt = c0;
	return jsnap_keep(sn, u, n);
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

			if (e->raw)
				continue;	/* sent whole every version (entry_raw) */
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
			if (e->fp8) {
				/* The units themselves are what the sink holds. */
				if (fp8_box_get(c, e, &s, 0) < 0)
					goto out;
				r = snap_units(&p->snap[q], e->fp8 == JFP8_CODES ? c->f8->codes :
					       c->f8->scales, e->box, bm, &cnt);
			} else {
				r = jsnap_scan(&p->snap[q], jdev_host(), &e->map, s.param, s.len, bm,
					       words, &cnt);
			}
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

/* One pair's payload (struct dtc_bytes, p->raw) is framed in place:
 * DTC_CHUNK_HDR bytes kept free at the front, then length-prefixed entry
 * payloads appended straight into it, so the buffer becomes the chunk
 * without another copy.  Its growth is dtc_detect()'s: doubling, and pages
 * past what is written stay untouched (large buffers are mmap'd), so a
 * generous bound costs address space, not memory. */
/* The engine's cap_pool: payload buffers of parts that went out, taken
 * again by the next parts (daemon/bufpool.h: a fresh 32 MiB part costs ten
 * times its write in page faults); emptied when no capture is left
 * running. */
static int bytes_reserve(struct bpool *pool, struct dtc_bytes *b, size_t len)
{
	if (!b->n)
		b->n = DTC_CHUNK_HDR;
	if (b->n + len > b->cap) {
		size_t need = b->n + len, nc = b->cap ? b->cap : 4096;
		void *np;

		if (need >= BPOOL_MIN && nc < BPOOL_MIN) {
			/* A large part (a dense entry's payload, whose size is
			 * known whole): a buffer of that size from the pool,
			 * which may hold it populated (jcap_prefill_dense), not
			 * a doubling that would miss the pool's buffers. */
			if (!(np = bpool_get(pool, need, &nc)))
				return -ENOMEM;
			if (b->p) {
				memcpy(np, b->p, b->n);
				free(b->p);
			}
		} else {
			while (nc < need)
				nc *= 2;
			if (!(np = realloc(b->p, nc)))
				return -ENOMEM;
		}
		b->p = np;
		b->cap = nc;
	}
	return 0;
}

/* The buffers of a dense version's parts, populated ahead on a worker
 * (bufpool.h): a fresh 32 MiB part costs ten times its write in page
 * faults, on the core that also runs the source's sends (in the bench's
 * dense version at 10 Gbit/s, 49000 faults and 0.1 s of the source's CPU
 * on a saturated core). */
struct prefill_req {
	struct dte_work w;	/* first: the work is the request */
	struct dte_engine *eng;
	size_t need;
	unsigned count;
};

static void prefill_work(struct dte_work *w)
{
	struct prefill_req *r = (struct prefill_req *)w;

	bpool_prefill(&r->eng->cpool->bp, r->need, r->count);
}

static void prefill_after(struct dte_work *w, int cancelled)
{
	struct prefill_req *r = (struct prefill_req *)w;

	(void)cancelled;
	r->eng->prefills--;
	free(r);
}

void jcap_prefill_dense(struct dte_engine *eng, const struct jentry *e, size_t n,
			size_t part_bytes)
{
	uint64_t max_box = 0, total = 0;
	struct prefill_req *r;

	for (size_t i = 0; i < n; i++) {
		max_box = e[i].box > max_box ? e[i].box : max_box;
		total += e[i].box;
	}
	if (!part_bytes)
		part_bytes = JOB_PART_BYTES_DEFAULT;
	/* a part: entries up to part_bytes, then one more (capture_pair) */
	if (!max_box || !jio_workers(eng) || !(r = calloc(1, sizeof(*r))))
		return;
	r->eng = eng;
	r->need = DTC_CHUNK_HDR + part_bytes + 8 + 2 * (size_t)max_box;
	r->count = (unsigned)((total + max_box - 1) / max_box);
	if (r->need < BPOOL_MIN || jio_queue(eng, &r->w, prefill_work, prefill_after) < 0)
		free(r);
	else
		eng->prefills++;
}

static void bytes_len(struct dtc_bytes *b, size_t at, size_t len)
{
	for (int i = 0; i < 8; i++)
		b->p[at + i] = (uint8_t)((uint64_t)len >> (8 * i));
}

static const uint8_t *shared_bytes(const struct jcap *c, const struct det_sparse *s)
{
	return s->own ? s->own : c->p[s->pair].raw.p + s->at;
}

/* Append a copy of bytes another member already encoded (in any pair's
 * payload, this one's included: its address is taken after the reserve). */
static int bytes_put_shared(struct jcap *c, struct dtc_bytes *b, const struct det_sparse *s)
{
	if (bytes_reserve(&c->eng->cpool->bp, b, 8 + s->len) < 0)
		return CAPFAIL("out of memory");
	bytes_len(b, b->n, s->len);
	memcpy(b->p + b->n + 8, shared_bytes(c, s), s->len);
	b->n += 8 + s->len;
	return 0;
}

static void det_release(struct det *d)
{
	free(d->cs);
	d->cs = NULL;
	d->ncs = 0;
	for (size_t i = 0; i < d->nsp; i++)
		free(d->sp[i].own);
	free(d->dense.own);
	d->dense.own = NULL;
	free(d->sp);
	d->sp = NULL;
	d->nsp = 0;
	d->have_dense = 0;
}

static int csum_find(const struct det *d, const struct jentry *e, uint64_t *sum)
{
	for (size_t i = 0; i < d->ncs; i++) {
		if (d->cs[i].dst_offset == e->map.dst_offset &&
		    !memcmp(d->cs[i].dst_stride, e->map.dst_stride,
			    e->map.ndim * sizeof(e->map.dst_stride[0]))) {
			*sum = d->cs[i].sum;
			return 1;
		}
	}
	return 0;
}

/* Kept only while other members may want it (a failed realloc just means
 * they compute it again). */
static void csum_keep(struct det *d, const struct jentry *e, uint64_t sum)
{
	void *np;

	if (d->left <= 1 || !(np = realloc(d->cs, (d->ncs + 1) * sizeof(*d->cs))))
		return;
	d->cs = np;
	memset(&d->cs[d->ncs], 0, sizeof(d->cs[d->ncs]));
	d->cs[d->ncs].dst_offset = e->map.dst_offset;
	memcpy(d->cs[d->ncs].dst_stride, e->map.dst_stride,
	       e->map.ndim * sizeof(e->map.dst_stride[0]));
	d->cs[d->ncs].sum = sum;
	d->ncs++;
}

/* The entry's checksum contribution, computed once per destination map. */
static int entry_checksum(struct jcap *c, struct det *d, const struct jentry *e,
			  const struct dtc_src *s, uint64_t *sum)
{
	int r;

	if (csum_find(d, e, sum))
		return 0;
	if ((r = jdev_checksum_entry(&e->map, s->param, s->len, sum)) != DTC_OK)
		return CAPFAIL("checksum: %s", dtc_strerror(r));
	csum_keep(d, e, *sum);
	return 0;
}

static const struct det_sparse *sp_find(const struct det *d, const uint64_t *bitmap,
					uint64_t words)
{
	for (size_t i = 0; i < d->nsp; i++) {
		const uint64_t *o = d->sp[i].bitmap;

		if (o == bitmap || (o && bitmap && !memcmp(o, bitmap, words * sizeof(*o))))
			return &d->sp[i];
	}
	return NULL;
}

static void sp_keep(struct det *d, const uint64_t *bitmap, size_t pair, size_t at, size_t len,
		    uint64_t count)
{
	void *np;

	if (d->left <= 1 || !(np = realloc(d->sp, (d->nsp + 1) * sizeof(*d->sp))))
		return;
	d->sp = np;
	d->sp[d->nsp].bitmap = bitmap;
	d->sp[d->nsp].pair = pair;
	d->sp[d->nsp].at = at;
	d->sp[d->nsp].len = len;
	d->sp[d->nsp].count = count;
	d->sp[d->nsp].own = NULL;
	d->nsp++;
}

/* The zstd level a pair's parts are framed at: 0, raw, unless the pair
 * is remote and the job asks for zstd. */
static int part_zlevel(const struct jcap *c, const struct jcap_pair *p)
{
	return p->remote ? (int)c->zstd_level : 0;
}

/* A raw part's chunk hash, fed while the dense extract writes it (a run
 * of values still in cache: dtc_dense_extract_csum_each), instead of a
 * pass over the whole part from memory when it is framed: in the bench's
 * dense version at 10 Gbit/s (perf) the source's xxh3 took 0.026 s
 * streamed against 0.045-0.049 s as a pass, on its one busy core.
 * Starts the part's stream if it has none and brings it up to
 * raw[upto); 0 when the part is hashed whole at framing instead (zstd
 * packs it, or no state could be had). */
static int hash_start(const struct jcap *c, struct jcap_pair *p, size_t upto)
{
	if (part_zlevel(c, p))
		return 0;
	if (!p->hashed) {
		if (!p->hs && !(p->hs = XXH3_createState()))
			return 0;
		XXH3_64bits_reset(p->hs);
		p->hashed = DTC_CHUNK_HDR;
	}
	if (upto > p->hashed) {
		XXH3_64bits_update(p->hs, p->raw.p + p->hashed, upto - p->hashed);
		p->hashed = upto;
	}
	return 1;
}

static void hash_run(void *arg, const uint16_t *v, uint64_t n)
{
	struct jcap_pair *p = arg;

	XXH3_64bits_update(p->hs, v, 2 * n);
	p->hashed += 2 * n;
}

/* The entry's BF16 values into the pair's payload, and its checksum into
 * *sum.  A host θ whose values are extracted straight into the payload
 * gives both from one read (dtc_dense_extract_csum: issue #16, the dense
 * part read θ twice); otherwise the checksum pass, then the extract. */
static int entry_dense(struct jcap *c, struct det *d, size_t pi, const struct jentry *e,
		       const struct dtc_src *s, uint64_t *sum)
{
	struct dtc_bytes *raw = &c->p[pi].raw;
	const struct dbuf *pb = cap_buf(c, e->src_buf);
	uint16_t *vals;
	uint8_t *out;
	size_t at, len = 0;
	int r, fuse = !d->have_dense && pb && !pb->cuda && !csum_find(d, e, sum);

	if (!fuse && (r = entry_checksum(c, d, e, s, sum)) < 0)
		return r;	/* the reason is in c->err */
	if (d->have_dense)
		return bytes_put_shared(c, raw, &d->dense);
	if (bytes_reserve(&c->eng->cpool->bp, raw, 8 + 2 * e->box) < 0)
		return CAPFAIL("out of memory");
	at = raw->n;
	out = raw->p + at + 8;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	/* The dense encoding is the BF16 values, little-endian: on such a host
	 * they are extracted straight into the payload (always 2-aligned in a
	 * dense pair's buffer: a 32-byte header, then 8 + 2·box per entry),
	 * with no intermediate array to fault in and copy. */
	if (((uintptr_t)out & 1) == 0) {
		if (fuse) {
			int stream;

			bytes_len(raw, at, 2 * e->box);
			stream = hash_start(c, &c->p[pi], at + 8);
			r = dtc_dense_extract_csum_each(jdev_host(), &e->map, s->param, s->len,
							(uint16_t *)(void *)out, sum,
							stream ? hash_run : NULL, &c->p[pi]);
			if (r == DTC_OK)
				csum_keep(d, e, *sum);
		} else {
			r = jdev_dense_extract(&e->map, s->param, s->len, (uint16_t *)(void *)out);
		}
		len = 2 * e->box;
		fuse = 0;
	} else
#endif
	{
		if (fuse && (r = entry_checksum(c, d, e, s, sum)) < 0)
			return r;
		if (!(vals = malloc(e->box * sizeof(*vals))))
			return CAPFAIL("out of memory");
		r = jdev_dense_extract(&e->map, s->param, s->len, vals);
		if (r == DTC_OK)
			r = dtc_dense_encode(vals, e->box, out, raw->cap - at - 8, &len);
		free(vals);
	}
	if (r != DTC_OK)
		return CAPFAIL("dense capture: %s", dtc_strerror(r));
	c->dense_elements += e->box;
	bytes_len(raw, at, len);
	raw->n += 8 + len;
	if (d->left > 1) {
		d->have_dense = 1;
		d->dense = (struct det_sparse){ .pair = pi, .at = at + 8, .len = len };
	}
	return 0;
}

/* An FP32 tensor's halves (jentry.raw): the source's 16-bit units as
 * they are, every one every version (the AdamW inversion says nothing of
 * bits below BF16; these tensors are small: E floats a layer, GLM-4.5's
 * router E x H), with their checksum from the same read.  In a dense pair
 * the dense encoding; in a sparse one every position of the box, so the
 * sink applies, verifies and undoes it as any sparse entry. */
static int entry_raw(struct jcap *c, size_t pi, const struct jentry *e, const struct dtc_src *s,
		     uint64_t *count, uint64_t *sum)
{
	struct dtc_bytes *raw = &c->p[pi].raw;
	const struct dbuf *pb = cap_buf(c, e->src_buf);
	int sparse = c->p[pi].sparse;
	uint64_t *pos = NULL;
	uint16_t *vals;
	size_t at, len = 0, bound = sparse ? dtc_sparse_bound(e->box) : 2 * e->box;
	int r;

	if (!pb || pb->cuda)
		return CAPFAIL("tensor %u is FP32: its halves are read from host sources only",
			       e->tensor);
	if (s->len > UINT64_MAX / 2)
		return CAPFAIL("source buffer too long");
	vals = malloc(e->box * sizeof(*vals));
	if (sparse && vals && (pos = malloc(e->box * sizeof(*pos))))
		for (uint64_t i = 0; i < e->box; i++)
			pos[i] = i;
	if (!vals || (sparse && !pos) || bytes_reserve(&c->eng->cpool->bp, raw, 8 + bound) < 0) {
		free(vals);
		free(pos);
		return CAPFAIL("out of memory");
	}
	at = raw->n;
	r = dtc_raw16_extract_csum(&e->map, (const uint16_t *)(const void *)s->param, 2 * s->len,
				   vals, sum);
	if (r == DTC_OK && sparse)
		r = dtc_sparse_encode(pos, vals, e->box, e->box, raw->p + at + 8, bound, &len);
	else if (r == DTC_OK)
		r = dtc_dense_encode(vals, e->box, raw->p + at + 8, bound, &len);
	free(vals);
	free(pos);
	if (r != DTC_OK)
		return CAPFAIL("FP32 tensor %u: %s", e->tensor, dtc_strerror(r));
	bytes_len(raw, at, len);
	raw->n += 8 + len;
	*count = e->box;
	if (!sparse)
		c->dense_elements += e->box;
	return 0;
}

static void fp8_box_free(struct jfp8_box *b)
{
	if (b) {
		free(b->codes);
		free(b->scales);
		free(b->code_changed);
		free(b->scale_changed);
		free(b);
	}
}

static int fp8_box_same(const struct jfp8_box *b, const struct jentry *e, int detect)
{
	return b && b->src_buf == e->src_buf && b->group == e->group &&
	       b->flags == e->fp8_flags && b->src_offset == e->map.src_offset &&
	       b->src_stride[0] == e->map.src_stride[0] && b->src_stride[1] == e->map.src_stride[1] &&
	       b->fbox[0] == e->fbox[0] && b->fbox[1] == e->fbox[1] && b->detect == detect;
}

/* The 16-bit checksum of units u (row-major over e's extent) at e's
 * destination indices, as dtc_checksum_box() of a sink holding them. */
static uint64_t units_csum(const struct jentry *e, const uint16_t *u)
{
	int64_t idx[DTE_MAX_DIMS] = { 0 };
	uint64_t s = 0;

	for (uint64_t i = 0; i < e->box; i++) {
		int64_t at = e->map.dst_offset;

		for (uint32_t d = 0; d < e->map.ndim; d++)
			at += idx[d] * e->map.dst_stride[d];
		s += dtc_csum_term((uint64_t)at, u[i]);
		for (uint32_t d = e->map.ndim; d-- > 0;) {
			if (++idx[d] < e->map.extent[d])
				break;
			idx[d] = 0;
		}
	}
	return s;
}

/* c->f8 for e's element box: computed (with the FP8 detect when asked)
 * unless the last one computed is that box. */
static int fp8_box_get(struct jcap *c, const struct jentry *e, const struct dtc_src *s,
		       int detect)
{
	uint64_t R = (uint64_t)e->fbox[0], C = (uint64_t)e->fbox[1], nb;
	struct dtc_fp8_detect det = { 0 };
	struct jfp8_box *b;
	int r;

	if (!entry_host(c, e))
		return CAPFAIL("tensor %u goes to an FP8 sink: its codes and scales are computed "
			       "from host sources only", e->tensor);
	if (detect && e->group >= c->ngroups)
		return CAPFAIL("optimizer group %u has no hyper-parameters (%zu given)", e->group,
			       c->ngroups);
	if (fp8_box_same(c->f8, e, detect))
		return 0;
	fp8_box_free(c->f8);
	c->f8 = b = calloc(1, sizeof(*b));
	nb = ((R + DTC_FP8_BLOCK - 1) / DTC_FP8_BLOCK) * ((C + DTC_FP8_BLOCK - 1) / DTC_FP8_BLOCK);
	if (!b || !(b->codes = malloc(R * C / 2 * sizeof(*b->codes))) ||
	    !(b->scales = malloc(2 * nb * sizeof(*b->scales))) ||
	    (detect && (!(b->code_changed = malloc((R * C / 2 + 63) / 64 * 8)) ||
			!(b->scale_changed = malloc((2 * nb + 63) / 64 * 8)))))
		return CAPFAIL("out of memory");
	r = dtc_fp8_box_units(detect ? &c->k[e->group] : NULL, s->param, s->exp_avg,
			      s->exp_avg_sq, s->len, e->map.src_offset, e->map.src_stride, R, C,
			      e->fp8_flags, b->codes, b->scales, b->code_changed,
			      b->scale_changed, &det);
	if (r != DTC_OK) {
		fp8_box_free(b);
		c->f8 = NULL;
		return CAPFAIL("FP8 tensor %u: %s", e->tensor, dtc_strerror(r));
	}
	b->src_buf = e->src_buf;
	b->group = e->group;
	b->flags = e->fp8_flags;
	b->src_offset = e->map.src_offset;
	b->src_stride[0] = e->map.src_stride[0];
	b->src_stride[1] = e->map.src_stride[1];
	b->fbox[0] = e->fbox[0];
	b->fbox[1] = e->fbox[1];
	b->detect = detect;
	if (detect) {
		c->scans++;
		c->scan_elements += R * C;
	}
	return 0;
}

/* The FP8 detect's flags of e's units (its codes or its scales). */
static const uint64_t *fp8_changed(const struct jcap *c, const struct jentry *e)
{
	return e->fp8 == JFP8_CODES ? c->f8->code_changed : c->f8->scale_changed;
}

/* A mark (K > 1) of an FP8 entry's detection: this step's flagged units
 * ORed into every member pair's dirty bitmap (over the entry's units),
 * as scan_all does for BF16 elements.  A unit that differs between the
 * sink's version and the published one changed at some step between. */
static int scan_fp8(struct jcap *c, const struct det_ref *refs, const struct det *d,
		    const struct jentry *e)
{
	struct dtc_src s;
	const uint64_t *chg;
	int rc;

	if (cap_src(c, e, &s) < 0)
		return CAPFAIL("source buffers missing");
	if ((rc = fp8_box_get(c, e, &s, 1)) < 0)
		return rc;
	chg = fp8_changed(c, e);
	for (size_t m = d->first; m < d->first + d->members; m++) {
		const struct jcap_pair *p = &c->p[refs[m].pair];
		uint64_t *dst = p->dirty ? p->dirty[refs[m].entry] : NULL;

		for (uint64_t w = 0; dst && w < (e->box + 63) / 64; w++)
			dst[w] |= chg[w];
	}
	c->scan_entries += d->members;
	return 0;
}

/* An FP8 sink's entry (jentry.fp8): the units the source computes from
 * θ's element box with the engine's quantizer.  A dense pair gets all of
 * them; a sparse one those the FP8 detect flags this step ORed with the
 * pair's marks (K > 1: earlier steps' flags, scan_fp8) when it can run
 * (host sources, detect = adamw), or, with detect = snapshot, those
 * that differ from what the pair last sent (snapshot_all, snap_units).
 * *sum: the checksum of every unit of the box. */
static int entry_fp8(struct jcap *c, size_t pi, const struct jentry *e, const struct dtc_src *s,
		     const uint64_t *mark, uint64_t *count, uint64_t *sum)
{
	struct jcap_pair *p = &c->p[pi];
	struct dtc_bytes *raw = &p->raw;
	int sparse = p->sparse;
	int detect = sparse && c->detect == JDETECT_ADAMW;
	/* detect = snapshot: snapshot_all flagged the units that differ from
	 * those the pair last sent, in the pair's bitmap */
	int snap = sparse && c->detect == JDETECT_SNAPSHOT && mark;
	const uint16_t *u;
	const uint64_t *chg = NULL;
	uint64_t *pos = NULL, n = 0;
	uint16_t *vals = NULL;
	size_t at, len = 0, bound;
	int r;

	if ((r = fp8_box_get(c, e, s, detect)) < 0)
		return r;
	u = e->fp8 == JFP8_CODES ? c->f8->codes : c->f8->scales;
	if (detect)
		chg = fp8_changed(c, e);
	*sum = units_csum(e, u);
	c->fp8_units += e->box;
	if (detect || snap)
		for (uint64_t w = 0; w < (e->box + 63) / 64; w++)
			n += (uint64_t)__builtin_popcountll((chg ? chg[w] : 0) | (mark ? mark[w] : 0));
	else
		n = e->box;
	*count = sparse ? n : e->box;
	if (!*count)
		return 0;	/* nothing flagged: COUNTS says 0 */
	bound = sparse ? dtc_sparse_bound(*count) : 2 * e->box;
	if (sparse && (!(pos = malloc(*count * sizeof(*pos))) ||
		       !(vals = malloc(*count * sizeof(*vals))))) {
		free(pos);
		return CAPFAIL("out of memory");
	}
	if (bytes_reserve(&c->eng->cpool->bp, raw, 8 + bound) < 0) {
		free(pos);
		free(vals);
		return CAPFAIL("out of memory");
	}
	at = raw->n;
	if (sparse) {
		uint64_t k = 0;

		for (uint64_t i = 0; i < e->box; i++) {
			if ((detect || snap) &&
			    !(((chg ? chg[i / 64] : 0) | (mark ? mark[i / 64] : 0)) >> (i % 64) & 1))
				continue;
			pos[k] = i;
			vals[k++] = u[i];
		}
		r = dtc_sparse_encode(pos, vals, k, e->box, raw->p + at + 8, bound, &len);
	} else {
		r = dtc_dense_encode(u, e->box, raw->p + at + 8, bound, &len);
		c->dense_elements += e->box;
	}
	free(pos);
	free(vals);
	if (r != DTC_OK)
		return CAPFAIL("FP8 tensor %u: %s", e->tensor, dtc_strerror(r));
	bytes_len(raw, at, len);
	raw->n += 8 + len;
	c->fp8_sent += *count;
	return 0;
}

/* Sparse from a bitmap (device sources, detect = snapshot): extract, then
 * encode straight into the pair's payload. */
static int entry_sparse(struct jcap *c, struct det *d, size_t pi, const struct jentry *e,
			const struct dtc_src *s, const uint64_t *bitmap, uint64_t *count)
{
	struct dtc_bytes *raw = &c->p[pi].raw;
	uint64_t words = dtc_bitmap_words(&e->map), cnt = 0, n = 0;
	const struct det_sparse *sh = sp_find(d, bitmap, words);
	uint64_t *pos;
	uint16_t *val;
	size_t at = 0, len = 0, bound;
	int r;

	if (sh) {
		*count = sh->count;
		return sh->count ? bytes_put_shared(c, raw, sh) : 0;
	}
	for (uint64_t x = 0; x < words; x++)
		cnt += (uint64_t)__builtin_popcountll(bitmap[x]);
	*count = cnt;
	if (cnt) {
		bound = dtc_sparse_bound(cnt);
		pos = malloc(cnt * sizeof(*pos));
		val = malloc(cnt * sizeof(*val));
		if (!pos || !val || bytes_reserve(&c->eng->cpool->bp, raw, 8 + bound) < 0) {
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
	}
	sp_keep(d, bitmap, pi, at + 8, len, cnt);
	return 0;
}

/* Host sources, detect = adamw: one dtc_detect() per detection reads θ,
 * m, v once, appends the payload (this step's changed set ORed with the
 * pair's marks, if any) to the pair's buffer and gives the checksum from
 * the same read.  Members with the same marks copy the bytes; one with
 * another destination map then needs its own checksum pass over θ. */
static int entry_detect(struct jcap *c, struct det *d, size_t pi, const struct jentry *e,
			const struct dtc_src *s, const uint64_t *mark, uint64_t *count,
			uint64_t *sum, const struct side_tab *side, size_t q)
{
	struct dtc_bytes *raw = &c->p[pi].raw;
	uint64_t words = dtc_bitmap_words(&e->map), cnt = 0;
	const struct det_sparse *sh = sp_find(d, mark, words);
	int have_sum = csum_find(d, e, sum), r;
	size_t at;

	c->scan_entries++;
	if (sh) {
		*count = sh->count;
		if (sh->count && (r = bytes_put_shared(c, raw, sh)) < 0)
			return r;
		return have_sum ? 0 : entry_checksum(c, d, e, s, sum);
	}
	if (e->group >= c->ngroups)
		return CAPFAIL("optimizer group %u has no hyper-parameters (%zu given)", e->group,
			       c->ngroups);
	if (bytes_reserve(&c->eng->cpool->bp, raw, 8) < 0)
		return CAPFAIL("out of memory");
	at = raw->n;
	raw->n += 8;
	r = dtc_detect(jdev_host(), &e->map, &c->k[e->group], s, mark, mark ? words : 0,
		       raw, &cnt, have_sum ? NULL : sum);
	if (r != DTC_OK) {
		raw->n = at;
		return CAPFAIL("detect: %s", dtc_strerror(r));
	}
	c->scans++;
	c->scan_elements += e->box;
	if (cnt && side && mark) {
		/* K > 1: marked elements back at the value the sink holds are
		 * not sent (daemon/side_table.h); the checksum is unchanged. */
		size_t len = raw->n - at - 8;

		if (side_filter(side, q, e->box, raw->p + at + 8, &len, &cnt, &c->side_dropped,
				c->side_wrong ? &c->side_wrong : NULL) == DTC_OK)
			raw->n = at + 8 + len;
	}
	if (!cnt)
		raw->n = at;	/* an empty entry sends nothing (COUNTS says 0) */
	else
		bytes_len(raw, at, raw->n - at - 8);
	*count = cnt;
	sp_keep(d, mark, pi, at + 8, cnt ? raw->n - at - 8 : 0, cnt);
	if (!have_sum)
		csum_keep(d, e, *sum);
	return 0;
}

/* Bytes other members of a detection still want to copy must outlive the
 * part that holds them: copied out before it goes. */
static int keep_shared(struct jcap *c, struct det *dets, size_t ndets, size_t pi)
{
	for (size_t g = 0; g < ndets; g++) {
		struct det *d = &dets[g];
		struct det_sparse *one[1] = { d->have_dense ? &d->dense : NULL };

		if (!d->left)
			continue;
		for (size_t i = 0; i <= d->nsp; i++) {
			struct det_sparse *x = i < d->nsp ? &d->sp[i] : one[0];

			if (!x || x->own || x->pair != pi || !x->len)
				continue;
			if (!(x->own = malloc(x->len)))
				return CAPFAIL("out of memory");
			memcpy(x->own, c->p[pi].raw.p + x->at, x->len);
		}
	}
	return 0;
}

static int frame_part(struct jcap *c, struct jcap_pair *p, uint8_t **chunk, size_t *chunk_len,
		      size_t *chunk_cap);

/* The entries [part_first, end) built so far go to the loop as one framed
 * part (sent while the worker goes on); the next part starts empty. */
static int flush_part(struct jcap *c, struct det *dets, size_t ndets, size_t pi, uint32_t end)
{
	struct jcap_pair *p = &c->p[pi];
	struct jcap_part *q;
	int rc;

	if (p->raw.n <= DTC_CHUNK_HDR)
		return 0;
	if (p->nparts >= JOB_MAX_PARTS)
		return CAPFAIL("more than %d payload parts", JOB_MAX_PARTS);
	if ((rc = keep_shared(c, dets, ndets, pi)) < 0)
		return rc;
	if (!(q = calloc(1, sizeof(*q))))
		return CAPFAIL("out of memory");
	if ((rc = frame_part(c, p, &q->chunk, &q->len, &q->cap)) < 0) {
		free(q);
		return rc;
	}
	q->pair = pi;
	q->part = p->nparts++;
	q->first = p->part_first;
	q->entries = end - p->part_first;
	/* A part carries its entries' counts (known by now), so a parked
	 * sink can swap it in before COUNTS (proto/peer.proto). */
	if (q->entries) {
		if (!(q->counts = malloc(q->entries * sizeof(*q->counts)))) {
			jcap_part_free(c->eng, q);
			return CAPFAIL("out of memory");
		}
		memcpy(q->counts, p->counts + q->first, q->entries * sizeof(*q->counts));
	}
	p->part_first = end;
	p->chunk_len += q->len;
	pthread_mutex_lock(&c->mu);
	*c->q_tail = q;
	c->q_tail = &q->next;
	pthread_mutex_unlock(&c->mu);
	if (c->notify)
		c->eng->io.wake_send(c->eng->io.ctx, c->eng->parts_wake);
	return 0;
}

struct jcap_part *jcap_take_parts(struct jcap *c)
{
	struct jcap_part *q;

	pthread_mutex_lock(&c->mu);
	q = c->q;
	c->q = NULL;
	c->q_tail = &c->q;
	pthread_mutex_unlock(&c->mu);
	return q;
}

void jcap_part_free(struct dte_engine *e, struct jcap_part *p)
{
	if (p) {
		bpool_put(&e->cpool->bp, p->chunk, p->cap);
		free(p->counts);
		free(p);
	}
}

struct jcap_pool *jcap_pool_new(struct dte_engine *e)
{
	struct jcap_pool *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	p->bp = (struct bpool)BPOOL_INIT((size_t)256 << 20);
	p->eng = e;
	return p;
}

static void pool_free(struct jcap_pool *p)
{
	bpool_trim(&p->bp);
	pthread_mutex_destroy(&p->bp.mu);
	free(p);
}

void jcap_pool_release(struct jcap_pool *p)
{
	if (!p)
		return;
	p->eng = NULL;
	if (!p->chunks_out)
		pool_free(p);
}

/* chunks_out: chunks the router still sends from (loop thread only). */
void jcap_chunk_given(struct jcap_pool *p)
{
	p->chunks_out++;
}

/* chunk NULL: a same-node receiver took it (send_given): it is
 * theirs, only the count comes back. */
void jcap_chunk_release(struct jcap_pool *p, void *chunk, size_t cap)
{
	bpool_put(&p->bp, chunk, cap);
	if (p->chunks_out)
		p->chunks_out--;
	if (!p->eng) {
		if (!p->chunks_out)
			pool_free(p);	/* the engine went first */
		return;
	}
	/* The last one of the last capture: an idle engine keeps none. */
	if (!p->chunks_out && !p->eng->inflight)
		bpool_trim(&p->bp);
}

/* When a pair's part goes: at part_bytes, doubled each time the pair's
 * part count doubles past 4096, so even a terabyte payload stays well
 * inside JOB_MAX_PARTS (about 45000 parts at the 256 KiB default). */
static size_t part_threshold(const struct jcap *c, const struct jcap_pair *p)
{
	size_t t = c->part_bytes;

	for (uint32_t n = p->nparts; n >= 4096 && t < ((size_t)1 << 30); n >>= 1)
		t <<= 1;
	return t;
}

/* One pair's counts, partial checksums and payload: everything that reads
 * the source buffers.  Its payload goes in parts of about part_bytes, each
 * as soon as it is complete. */
static int capture_pair(struct jcap *c, size_t pi, struct det *dets, size_t ndets)
{
	struct jcap_pair *p = &c->p[pi];
	int rc;

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

		if (cap_src(c, e, &s) < 0)
			return CAPFAIL("source buffers missing");
		if (e->raw) {
			if ((rc = entry_raw(c, pi, e, &s, &cnt, &sum)) < 0)
				return rc;
		} else if (e->fp8) {
			if ((rc = entry_fp8(c, pi, e, &s, p->dirty ? p->dirty[i] : NULL, &cnt,
					    &sum)) < 0)
				return rc;
		} else if (!p->sparse) {
			cnt = e->box;
			if ((rc = entry_dense(c, d, pi, e, &s, &sum)) < 0)
				return rc;
		} else if (c->detect == JDETECT_ADAMW && entry_host(c, e)) {
			if ((rc = entry_detect(c, d, pi, e, &s, p->dirty ? p->dirty[i] : NULL,
					       &cnt, &sum, p->side, i)) < 0)
				return rc;
		} else {
			if (!p->dirty)
				return CAPFAIL("sparse capture without a changed set");
			if ((rc = entry_checksum(c, d, e, &s, &sum)) < 0 ||
			    (rc = entry_sparse(c, d, pi, e, &s, p->dirty[i], &cnt)) < 0)
				return rc;
		}
		for (k = 0; k < p->nck && p->cbuf[k] != e->dst_buf; k++)
			;
		if (k == p->nck) {
			p->cbuf[p->nck] = e->dst_buf;
			p->csum[p->nck++] = 0;
		}
		p->csum[k] += sum;
		p->elements += e->box;
		p->counts[i] = cnt;
		p->changed += cnt;
		if (--d->left == 0)
			det_release(d);
		if (p->raw.n > DTC_CHUNK_HDR && p->raw.n - DTC_CHUNK_HDR >= part_threshold(c, p) &&
		    (rc = flush_part(c, dets, ndets, pi, (uint32_t)(i + 1))) < 0)
			return rc;
	}
	return flush_part(c, dets, ndets, pi, (uint32_t)p->n);
}

/* The part's bytes become its chunk: framed in place when raw, or packed;
 * either way the pair's buffer starts over empty. */
static int frame_part(struct jcap *c, struct jcap_pair *p, uint8_t **chunk, size_t *chunk_len,
		      size_t *chunk_cap)
{
	size_t len = p->raw.n - DTC_CHUNK_HDR, bound;
	int zl = part_zlevel(c, p);

	/* Memory is faster than zstd, and a same-cluster link usually is
	 * too: zstd only where the job asks for it (zstd_level). */
	if (!zl) {
		if (p->hashed) {
			hash_start(c, p, p->raw.n);	/* what was appended otherwise */
			dtc_chunk_seal_raw_hashed(p->raw.p, len, XXH3_64bits_digest(p->hs));
		} else {
			dtc_chunk_seal_raw(p->raw.p, len);
		}
		p->hashed = 0;
		*chunk = p->raw.p;
		*chunk_len = p->raw.n;
		*chunk_cap = p->raw.cap;
		p->raw = (struct dtc_bytes){ 0 };
		return 0;
	}
	bound = dtc_chunk_bound(len);
	if (!(*chunk = bpool_get(&c->eng->cpool->bp, bound, chunk_cap)) ||
	    dtc_chunk_pack(p->raw.p + DTC_CHUNK_HDR, len, zl, *chunk, bound,
			   chunk_len) != DTC_OK) {
		bpool_put(&c->eng->cpool->bp, *chunk, *chunk_cap);
		*chunk = NULL;
		return CAPFAIL("payload framing failed");
	}
	bpool_put(&c->eng->cpool->bp, p->raw.p, p->raw.cap);
	p->raw = (struct dtc_bytes){ 0 };
	return 0;
}

/* The side tables' and the FP8 entries' counts (metrics may be updated
 * from a worker). */
static void capture_metrics(const struct jcap *c)
{
	dmetrics_add(DM_MARK_TABLE_ELEMENTS, "kept", (double)c->side_kept);
	dmetrics_add(DM_MARK_TABLE_ELEMENTS, "uncertain", (double)c->side_uncertain);
	dmetrics_add(DM_MARK_TABLE_ELEMENTS, "over_cap", (double)c->side_left_out);
	dmetrics_add(DM_MARK_TABLE_ELEMENTS, "not_sent", (double)c->side_dropped);
	if (c->fp8_units) {
		dmetrics_add(DM_FP8_UNITS, "covered", (double)c->fp8_units);
		dmetrics_add(DM_FP8_UNITS, "sent", (double)c->fp8_sent);
	}
	dmetrics_set(DM_MARK_TABLE_BYTES, NULL, (double)side_held());
	dmetrics_set(DM_MARK_TABLE_PEAK, NULL, (double)side_peak());
}

int jcap_run(struct jcap *c)
{
	struct det_ref *refs = NULL;
	struct det *dets = NULL;
	size_t ndets = 0;
	uint64_t t0 = jio_now(c->eng);
	int rc = -EIO;	/* the reason is in c->err */

	if (c->eng->ext.capture_start)
		c->eng->ext.capture_start(c->version);
	if (c->kind == JCAP_PUBLISH && c->eng->ext.capture_wrong_drop)
		c->side_wrong = c->eng->ext.capture_wrong_drop(c->version);
	if (group_detections(c, &refs, &dets, &ndets) < 0)
		goto out;
	c->detections = ndets;
	/* A relayed pair is not framed (its tree's root pair carries the
	 * version): its entries keep no detection's results waiting. */
	for (size_t i = 0; i < c->np; i++)
		for (size_t q = 0; c->p[i].relayed && q < c->p[i].n; q++)
			dets[c->p[i].det[q]].left--;
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
	if (!c->part_bytes)
		c->part_bytes = JOB_PART_BYTES_DEFAULT;
	for (size_t i = 0; i < c->np; i++)
		if (!c->p[i].relayed && capture_pair(c, i, dets, ndets) < 0)
			goto out;
	c->read_ms = (double)(jio_now(c->eng) - t0) / 1e6;
	rc = 0;
out:
	for (size_t g = 0; dets && g < ndets; g++)
		det_release(&dets[g]);
	free(dets);
	free(refs);
	c->work_ms = (double)(jio_now(c->eng) - t0) / 1e6;
	capture_metrics(c);
	return rc;
}

void jcap_free(struct jcap *c)
{
	struct dte_engine *e;

	if (!c)
		return;
	e = c->eng;
	for (size_t i = 0; i < c->np; i++) {
		struct jcap_pair *p = &c->p[i];

		if (p->dirty) {
			for (size_t q = 0; q < p->n; q++)
				free(p->dirty[q]);
			free(p->dirty);
		}
		side_free(p->side);
		jsnap_free_all(p->snap, p->n);
		free(p->e);
		free(p->det);
		free(p->direct);
		free(p->counts);
		free(p->cbuf);
		free(p->csum);
		bpool_put(&e->cpool->bp, p->raw.p, p->raw.cap);
		XXH3_freeState(p->hs);
	}
	if (c->mu_init) {
		struct jcap_part *q = jcap_take_parts(c), *next;

		for (; q; q = next) {
			next = q->next;
			jcap_part_free(e, q);
		}
		pthread_mutex_destroy(&c->mu);
	}
	free(c->p);
	free(c->buf_ids);
	free(c->bufs);
	free(c->k);
	fp8_box_free(c->f8);
	free(c);
	dmetrics_set(DM_MARK_TABLE_BYTES, NULL, (double)side_held());
	/* No capture left running and no part still going out: the kept
	 * part buffers go too (jcap_chunk_release trims after the last). */
	if (!e->inflight && !e->cpool->chunks_out)
		bpool_trim(&e->cpool->bp);
}

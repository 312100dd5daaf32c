/* The cpu backend: plain C over host memory, the reference for cuda.
 *
 * Large boxes are split into word-aligned position ranges, one per core, so
 * threads never share a bitmap word.  The scan decides 64 elements (one
 * bitmap word) at a time through a fixed-length loop the compiler
 * vectorizes; target_clones picks AVX-512/AVX2 at load time.  Strict IEEE
 * semantics come from the build flags (-ffp-contract=off), which vector
 * code keeps: per-lane sqrt/div/mul/add round exactly like scalar ones. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "gpu/backend_ops.h"
#include "gpu/box.h"
#include "gpu/codec.h"
#include "gpu/compute.h"
#include "gpu/cpu.h"
#include "gpu/detect.h"

#define PAR_MIN_ELEMS	(1u << 20)	/* below this one thread is faster */
#define MAX_THREADS	16

int dtc_cpu_threads(void)
{
	static int n;
	int t = __atomic_load_n(&n, __ATOMIC_RELAXED);

	if (t == 0) {
		const char *s = getenv("DTC_CPU_THREADS");
		long c = s ? strtol(s, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);

		t = c < 1 ? 1 : c > MAX_THREADS ? MAX_THREADS : (int)c;
		__atomic_store_n(&n, t, __ATOMIC_RELAXED);
	}
	return t;
}

/* Work over [lo, hi) of some index space, as part number `part` of a
 * split; returns a sum to reduce. */
typedef uint64_t (*range_fn)(void *ctx, uint64_t lo, uint64_t hi, int part);

struct part {
	range_fn fn;
	void *ctx;
	uint64_t lo, hi, out;
	int index;
	pthread_t tid;
	int started;
};

static void *part_main(void *arg)
{
	struct part *p = arg;

	p->out = p->fn(p->ctx, p->lo, p->hi, p->index);
	return NULL;
}

/* Split [0, n) into per-thread ranges whose bounds are multiples of
 * `align` (one range when `elems` is too small to pay for threads);
 * returns the number of parts. */
static int split_plan(struct part *parts, uint64_t n, uint64_t align, uint64_t elems)
{
	int nt = elems >= PAR_MIN_ELEMS ? dtc_cpu_threads() : 1;
	uint64_t chunk;

	if (nt == 1 || n < (uint64_t)nt * align) {
		parts[0].lo = 0;
		parts[0].hi = n;
		parts[0].index = 0;
		return 1;
	}
	chunk = (n / (uint64_t)nt + align - 1) / align * align;
	for (int i = 0; i < nt; i++) {
		parts[i].lo = chunk * (uint64_t)i < n ? chunk * (uint64_t)i : n;
		parts[i].hi = i == nt - 1 || chunk * (uint64_t)(i + 1) > n ? n : chunk * (uint64_t)(i + 1);
		parts[i].index = i;
	}
	return nt;
}

/* Run fn over every part (the caller's thread takes part 0); each part's
 * result lands in its `out`. */
static void split_run(struct part *parts, int nt, range_fn fn, void *ctx)
{
	for (int i = 0; i < nt; i++) {
		parts[i].fn = fn;
		parts[i].ctx = ctx;
		parts[i].started = 0;
	}
	for (int i = 1; i < nt; i++)
		parts[i].started = pthread_create(&parts[i].tid, NULL, part_main, &parts[i]) == 0;
	part_main(&parts[0]);
	for (int i = 1; i < nt; i++) {
		if (parts[i].started)
			pthread_join(parts[i].tid, NULL);
		else
			part_main(&parts[i]);
	}
}

/* Split, run, and return the sum of the parts' results. */
static uint64_t run_split(range_fn fn, void *ctx, uint64_t n, uint64_t align, uint64_t elems)
{
	struct part parts[MAX_THREADS];
	int nt = split_plan(parts, n, align, elems);
	uint64_t sum = 0;

	split_run(parts, nt, fn, ctx);
	for (int i = 0; i < nt; i++)
		sum += parts[i].out;
	return sum;
}

/* Move a walker (at position *cur) forward or anywhere to position p. */
static void walk_to(struct box_walk *w, uint64_t *cur, uint64_t p)
{
	if (p >= *cur && p - *cur < (uint64_t)(w->row_len - w->col))
		w->col += (int64_t)(p - *cur);
	else
		box_walk_seek(w, w->e, p);
	*cur = p;
}

/* ---- scan ------------------------------------------------------------ */

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__clang__)
#define DTC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
/* The checksum mix multiplies 64-bit lanes: vpmullq is AVX-512DQ. */
#define DTC_CSUM_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#define DTC_POPCNT_CLONES __attribute__((target_clones("popcnt", "default")))
#else
#define DTC_CLONES
#define DTC_CSUM_CLONES
#define DTC_POPCNT_CLONES
#endif

/* Pack 64 flags (bytes of 0/1) into a word: one multiply gathers the low
 * bits of 8 bytes into the top byte (no carries: each lands on its own bit). */
static inline uint64_t pack64(const uint8_t *f)
{
	uint64_t w = 0;

	for (int i = 0; i < 8; i++) {
		uint64_t x;

		memcpy(&x, f + 8 * i, 8);
		w |= ((x * 0x0102040810204080ull) >> 56) << (8 * i);
	}
	return w;
}

#define BLOCK_WORDS DTC_CPU_BLOCK_WORDS

/* Verdicts for nw (<= BLOCK_WORDS) bitmap words of consecutive elements:
 * bit i of out[j] set when element 64j+i may have changed
 * (dtc_adamw_flag).  The cheap test runs over fixed 64-lane loops
 * (vectorized); the few elements it cannot clear are gathered and run
 * through the full inverse together, also vectorized. */
DTC_CLONES
void dtc_cpu_flags(const struct dtc_consts *kp, const float *p, const float *m, const float *v,
		   int nw, uint64_t *out)
{
	struct dtc_consts k = *kp;
	float cp[64 * BLOCK_WORDS], cm[64 * BLOCK_WORDS], cv[64 * BLOCK_WORDS];
	uint16_t idx[64 * BLOCK_WORDS];
	uint8_t q[64], f[64 * BLOCK_WORDS];
	int nn = 0;

	for (int j = 0; j < nw; j++) {
		const float *pj = p + 64 * j, *mj = m + 64 * j, *vj = v + 64 * j;
		uint64_t need;

		for (int i = 0; i < 64; i++)
			q[i] = (uint8_t)!dtc_adamw_quiet(&k, pj[i], mj[i], vj[i]);
		need = pack64(q);
		out[j] = 0;
		while (need) {
			int i = __builtin_ctzll(need);

			need &= need - 1;
			idx[nn] = (uint16_t)(64 * j + i);
			cp[nn] = pj[i];
			cm[nn] = mj[i];
			cv[nn] = vj[i];
			nn++;
		}
	}
	if (k.variant == DTC_VARIANT_FUSED) {
		for (int i = 0; i < nn; i++)
			f[i] = (uint8_t)dtc_adamw_changed_u(&k, cp[i], dtc_adamw_u_fused(&k, cm[i], cv[i]));
	} else {
		for (int i = 0; i < nn; i++)
			f[i] = (uint8_t)dtc_adamw_changed_u(&k, cp[i], dtc_adamw_u_torch(&k, cm[i], cv[i]));
	}
	for (int i = 0; i < nn; i++)
		out[idx[i] / 64] |= (uint64_t)f[i] << (idx[i] % 64);
}

/* Whether the SIMD kernels may be used: DTC_CPU_SIMD=generic says no
 * (the portable ones, the reference, everywhere). */
static int simd_allowed(void)
{
	const char *s = getenv("DTC_CPU_SIMD");

	return !(s && strcmp(s, "generic") == 0);
}

dtc_cpu_flags_fn dtc_cpu_flags_best(void)
{
	static dtc_cpu_flags_fn best;
	dtc_cpu_flags_fn f = __atomic_load_n(&best, __ATOMIC_ACQUIRE);

	if (!f) {
		f = simd_allowed() ? dtc_cpu_flags_avx512() : NULL;
		if (!f)
			f = dtc_cpu_flags;
		__atomic_store_n(&best, f, __ATOMIC_RELEASE);
	}
	return f;
}

struct scan_ctx {
	dtc_cpu_flags_fn flags;
	struct dte_box_map e;
	struct dtc_consts k;
	const float *p, *m, *v;
	uint64_t *bitmap;
	uint64_t size;
	int mode;
};

DTC_POPCNT_CLONES
static uint64_t scan_range(void *arg, uint64_t w0, uint64_t w1, int part)
{
	struct scan_ctx *c = arg;
	int64_t s1 = c->e.src_stride[c->e.ndim - 1];
	struct box_walk w;
	uint64_t count = 0;

	if (w0 >= w1)
		return 0;
	box_walk_seek(&w, &c->e, w0 * 64);
	for (uint64_t wi = w0; wi < w1; wi++) {
		uint64_t n = c->size - wi * 64 < 64 ? c->size - wi * 64 : 64;
		uint64_t bits, blk[BLOCK_WORDS];

		if (n == 64 && s1 == 1 && w.col + 64 <= w.row_len) {
			/* as many whole words as this row and range still hold */
			int64_t s = box_src_index(&w);
			uint64_t nw = (uint64_t)(w.row_len - w.col) / 64, full = (c->size - wi * 64) / 64;

			nw = nw < full ? nw : full;
			nw = nw < w1 - wi ? nw : w1 - wi;
			nw = nw < BLOCK_WORDS ? nw : BLOCK_WORDS;
			c->flags(&c->k, c->p + s, c->m + s, c->v + s, (int)nw, blk);
			w.col += (int64_t)(64 * nw);
			if (w.col == w.row_len)
				box_walk_next_row(&w);
			for (uint64_t j = 0; j + 1 < nw; j++, wi++) {
				bits = blk[j];
				if (c->mode == DTC_SCAN_OR)
					bits |= c->bitmap[wi];
				c->bitmap[wi] = bits;
				count += (uint64_t)__builtin_popcountll(bits);
			}
			bits = blk[nw - 1];
		} else {
			float tp[64], tm[64], tv[64];

			for (uint64_t i = 0; i < 64; i++) {
				if (i < n) {
					int64_t s = box_src_index(&w);

					tp[i] = c->p[s];
					tm[i] = c->m[s];
					tv[i] = c->v[s];
					box_walk_step(&w);
				} else {
					tp[i] = tm[i] = tv[i] = 0;
				}
			}
			c->flags(&c->k, tp, tm, tv, 1, blk);
			bits = blk[0];
		}
		if (c->mode == DTC_SCAN_OR)
			bits |= c->bitmap[wi];
		if (n < 64)	/* bits past the box end stay zero */
			bits &= ((uint64_t)1 << n) - 1;
		c->bitmap[wi] = bits;
		count += (uint64_t)__builtin_popcountll(bits);
	}
	return count;
}

static int cpu_scan(const struct dte_box_map *e, const struct dtc_consts *k,
		    const float *param, const float *m, const float *v,
		    uint64_t *bitmap, int mode, uint64_t *count)
{
	struct scan_ctx c;

	c.flags = dtc_cpu_flags_best();
	c.e = *e;
	c.k = *k;
	c.p = param;
	c.m = m;
	c.v = v;
	c.bitmap = bitmap;
	c.size = dtc_box_size(e);
	c.mode = mode;
	*count = run_split(scan_range, &c, (c.size + 63) / 64, 64, c.size);
	return DTC_OK;
}

/* ---- sparse from bitmap ---------------------------------------------- */

/* Both cores: each part of the bitmap counts its bits, a prefix sum gives
 * every part the place of its first output, and the parts fill in
 * parallel, so the output is the same sorted list one thread would write. */
struct sparse_ctx {
	struct dte_box_map e;
	const uint64_t *bitmap;
	const float *param;
	uint64_t *pos;
	uint16_t *val;
	uint64_t size, words;
	uint64_t base[MAX_THREADS];
};

/* Word i of the bitmap without the bits past the box end. */
static inline uint64_t bm_word(const struct sparse_ctx *c, uint64_t i)
{
	uint64_t b = c->bitmap[i];

	if (i + 1 == c->words && c->size % 64)
		b &= ((uint64_t)1 << (c->size % 64)) - 1;
	return b;
}

DTC_POPCNT_CLONES
static uint64_t sparse_count(void *arg, uint64_t lo, uint64_t hi, int part)
{
	const struct sparse_ctx *c = arg;
	uint64_t n = 0;

	for (uint64_t i = lo; i < hi; i++)
		n += (uint64_t)__builtin_popcountll(bm_word(c, i));
	return n;
}

#define SPARSE_PREFETCH 16	/* words ahead: enough to cover a DRAM miss */

static uint64_t sparse_fill(void *arg, uint64_t lo, uint64_t hi, int part)
{
	const struct sparse_ctx *c = arg;
	int64_t s1 = c->e.src_stride[c->e.ndim - 1];
	uint64_t out = c->base[part], cur = lo * 64;
	uint64_t *pos = c->pos;
	uint16_t *val = c->val;
	struct box_walk w;

	if (lo >= hi)
		return 0;
	box_walk_seek(&w, &c->e, cur);
	for (uint64_t i = lo; i < hi; i++) {
		uint64_t bits = bm_word(c, i);

		/* θ is read only where bits are set: prefetch the lines of a word
		 * ahead when it is in this contiguous row (the hardware does not
		 * follow a sparse pattern). */
		if (s1 == 1) {
			uint64_t d = 64 * (i + SPARSE_PREFETCH) - cur;

			if (d + 64 <= (uint64_t)(w.row_len - w.col)) {
				const float *a = c->param + box_src_index(&w) + d;

				for (int l = 0; l < 4; l++)
					__builtin_prefetch(a + 16 * l);
			}
		}
		while (bits) {
			uint64_t p = i * 64 + (uint64_t)__builtin_ctzll(bits);

			bits &= bits - 1;
			walk_to(&w, &cur, p);
			pos[out] = p;
			val[out] = dtc_bf16_rne(c->param[box_src_index(&w)]);
			out++;
		}
	}
	return 0;
}

static int cpu_sparse(const struct dte_box_map *e, const uint64_t *bitmap, const float *param,
		      uint64_t *pos, uint16_t *val, uint64_t cap, uint64_t *n)
{
	struct part parts[MAX_THREADS];
	struct sparse_ctx c = { .bitmap = bitmap, .param = param, .pos = pos, .val = val };
	uint64_t total = 0;
	int nt;

	c.e = *e;
	c.size = dtc_box_size(e);
	c.words = (c.size + 63) / 64;
	nt = split_plan(parts, c.words, 8, c.size);
	split_run(parts, nt, sparse_count, &c);
	for (int i = 0; i < nt; i++) {
		c.base[i] = total;
		total += parts[i].out;
	}
	if (total > cap)
		return DTC_ENOSPC;
	split_run(parts, nt, sparse_fill, &c);
	*n = total;
	return DTC_OK;
}

/* ---- one-pass detect ------------------------------------------------- */

/* Each thread walks its word range in blocks of up to BLOCK_WORDS words
 * (θ, m, v of a block fit in L1): the block kernel decides the verdicts,
 * writes the gap codes and values of the set bits while θ is still in L1,
 * and sums the checksum terms from the same loads.  The parts' streams are
 * then joined: count, the gaps of part 0, 1, ... (each part's first gap
 * re-encoded from the previous part's last position), the values. */
struct detect_ctx {
	dtc_cpu_flags_fn flags;
	dtc_cpu_detect_fn block;
	struct dte_box_map e;
	struct dtc_consts k;
	const float *p, *m, *v;
	const uint64_t *mark;
	uint64_t size;
	int csum;
	struct dtc_cpu_emit part[MAX_THREADS];
	int failed[MAX_THREADS];
};

/* The streams of the last call are kept for the next one (up to
 * POOL_KEEP bytes each): fresh pages cost a fault and a clear each, which
 * was a fifth of the op at a few percent changed.  A call that finds the
 * pool taken (concurrent detects) allocates its own. */
#define POOL_KEEP ((size_t)64 << 20)

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static struct dtc_cpu_emit pool[MAX_THREADS];
static int pool_taken;

static int pool_take(struct dtc_cpu_emit *parts)
{
	int got = 0;

	pthread_mutex_lock(&pool_lock);
	if (!pool_taken) {
		pool_taken = got = 1;
		memcpy(parts, pool, sizeof(pool));
	}
	pthread_mutex_unlock(&pool_lock);
	return got;
}

static void pool_give(struct dtc_cpu_emit *parts, int taken)
{
	for (int i = 0; i < MAX_THREADS; i++) {
		if (!taken || parts[i].gcap > POOL_KEEP || parts[i].vcap * 2 > POOL_KEEP) {
			free(parts[i].gap);
			free(parts[i].val);
			parts[i] = (struct dtc_cpu_emit){ 0 };
		}
	}
	if (!taken)
		return;
	pthread_mutex_lock(&pool_lock);
	memcpy(pool, parts, sizeof(pool));
	pool_taken = 0;
	pthread_mutex_unlock(&pool_lock);
}

static int emit_grow(void **buf, size_t *cap, size_t used, size_t more, size_t elem)
{
	size_t nc = *cap;
	void *np;

	if (*cap - used >= more)
		return 0;
	while (nc - used < more)
		nc = nc < 4096 ? 4096 : 2 * nc;
	if (!(np = realloc(*buf, nc * elem)))
		return -1;
	*buf = np;
	*cap = nc;
	return 0;
}

/* Room for one more block of BLOCK_WORDS words. */
static int emit_reserve(struct dtc_cpu_emit *s)
{
	return emit_grow((void **)&s->gap, &s->gcap, s->ngap, DTC_CPU_GAP_ROOM(BLOCK_WORDS), 1) ||
	       emit_grow((void **)&s->val, &s->vcap, s->nval, DTC_CPU_VAL_ROOM(BLOCK_WORDS), 2);
}

static uint64_t detect_range(void *arg, uint64_t w0, uint64_t w1, int part)
{
	struct detect_ctx *c = arg;
	struct dtc_cpu_emit *s = &c->part[part];
	int64_t s1 = c->e.src_stride[c->e.ndim - 1], d1 = c->e.dst_stride[c->e.ndim - 1];
	struct box_walk w;
	uint64_t sum = 0;

	s->ngap = s->nval = 0;
	s->start = s->next = w0 * 64;
	if (w0 >= w1)
		return 0;
	box_walk_seek(&w, &c->e, w0 * 64);
	for (uint64_t wi = w0; wi < w1;) {
		uint64_t n = c->size - wi * 64 < 64 ? c->size - wi * 64 : 64;

		if (emit_reserve(s)) {
			c->failed[part] = 1;
			return 0;
		}
		if (n == 64 && s1 == 1 && w.col + 64 <= w.row_len) {
			/* as many whole words as this row and range still hold */
			int64_t si = box_src_index(&w);
			uint64_t nw = (uint64_t)(w.row_len - w.col) / 64, full = (c->size - wi * 64) / 64;

			nw = nw < full ? nw : full;
			nw = nw < w1 - wi ? nw : w1 - wi;
			nw = nw < BLOCK_WORDS ? nw : BLOCK_WORDS;
			sum += c->block(&c->k, c->p + si, c->m + si, c->v + si, (int)nw,
					c->mark ? c->mark + wi : NULL, wi * 64, box_dst_index(&w), d1,
					c->csum, s);
			w.col += (int64_t)(64 * nw);
			if (w.col == w.row_len)
				box_walk_next_row(&w);
			wi += nw;
		} else {
			/* a word across rows, strided, or the box's last: gathered */
			float tp[64], tm[64], tv[64];
			int64_t di[64];
			uint64_t bits;

			for (uint64_t i = 0; i < 64; i++) {
				if (i < n) {
					int64_t si = box_src_index(&w);

					tp[i] = c->p[si];
					tm[i] = c->m[si];
					tv[i] = c->v[si];
					di[i] = box_dst_index(&w);
					box_walk_step(&w);
				} else {
					tp[i] = tm[i] = tv[i] = 0;
				}
			}
			c->flags(&c->k, tp, tm, tv, 1, &bits);
			if (c->mark)
				bits |= c->mark[wi];
			if (n < 64)	/* bits past the box end are not positions */
				bits &= ((uint64_t)1 << n) - 1;
			dtc_cpu_emit_word(s, bits, wi * 64, tp);
			if (c->csum)
				for (uint64_t i = 0; i < n; i++)
					sum += dtc_csum_term((uint64_t)di[i], dtc_bf16_rne(tp[i]));
			wi++;
		}
	}
	return sum;
}

/* Read one gap code (written by dtc_cpu_put_gap, so well formed). */
static size_t get_gap(const uint8_t *g, uint64_t *gap)
{
	size_t n = 1;
	unsigned shift = 0;

	if (g[0] < 0x80) {
		*gap = g[0];
		return 1;
	}
	if (g[0] < 0xC0) {
		*gap = 128 + ((uint64_t)(g[0] & 0x3f) << 8) + g[1];
		return 2;
	}
	*gap = 0;
	do {
		*gap |= (uint64_t)(g[n] & 0x7f) << shift;
		shift += 7;
	} while (g[n++] & 0x80);
	return n;
}

static void put_values(uint8_t *o, const uint16_t *val, size_t n)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	memcpy(o, val, n * sizeof(*val));
#else
	for (size_t i = 0; i < n; i++) {
		o[2 * i] = (uint8_t)val[i];
		o[2 * i + 1] = (uint8_t)(val[i] >> 8);
	}
#endif
}

/* Where each part's bytes go in the payload. */
struct join_ctx {
	const struct dtc_cpu_emit *s;
	uint8_t first[MAX_THREADS][1 + DTC_VARINT_MAX];
	size_t flen[MAX_THREADS], skip[MAX_THREADS];
	uint8_t *gap_at[MAX_THREADS], *val_at[MAX_THREADS];
};

/* Copy part `part`'s gaps (its first re-encoded) and values into place;
 * the parts copy in parallel (a payload is tens of MB at 2^27 elements). */
static uint64_t join_copy(void *arg, uint64_t lo, uint64_t hi, int part)
{
	struct join_ctx *j = arg;
	const struct dtc_cpu_emit *s = &j->s[part];

	if (s->nval) {
		memcpy(j->gap_at[part], j->first[part], j->flen[part]);
		memcpy(j->gap_at[part] + j->flen[part], s->gap + j->skip[part],
		       s->ngap - j->skip[part]);
		put_values(j->val_at[part], s->val, s->nval);
	}
	return 0;
}

/* Append the parts' streams to out as one payload. */
static int detect_join(struct part *parts, const struct dtc_cpu_emit *s, int nt,
		       struct dtc_bytes *out, uint64_t *count)
{
	struct join_ctx j = { .s = s };
	uint64_t cnt = 0, next = 0;
	uint8_t *o, *vo;
	size_t total;
	int rc;

	for (int i = 0; i < nt; i++)
		cnt += s[i].nval;
	total = dtc_varint_put(j.first[0], cnt) + 2 * cnt;
	for (int i = 0; i < nt; i++) {
		uint64_t gap;

		j.flen[i] = j.skip[i] = 0;
		if (!s[i].nval)
			continue;
		j.skip[i] = get_gap(s[i].gap, &gap);
		j.flen[i] = dtc_cpu_put_gap(j.first[i], s[i].start + gap - next);
		next = s[i].next;
		total += j.flen[i] + s[i].ngap - j.skip[i];
	}
	if ((rc = dtc_bytes_reserve(out, total)) != DTC_OK)
		return rc;
	o = out->p + out->n;
	o += dtc_varint_put(o, cnt);
	vo = out->p + out->n + total - 2 * cnt;
	for (int i = 0; i < nt; i++) {
		j.gap_at[i] = o;
		j.val_at[i] = vo;
		if (s[i].nval)
			o += j.flen[i] + s[i].ngap - j.skip[i];
		vo += 2 * s[i].nval;
	}
	split_run(parts, nt, join_copy, &j);
	out->n += total;
	*count = cnt;
	return DTC_OK;
}

static int cpu_detect(const struct dte_box_map *e, const struct dtc_consts *k, const float *param,
		      const float *m, const float *v, const uint64_t *mark,
		      struct dtc_bytes *out, uint64_t *count, uint64_t *csum)
{
	struct part parts[MAX_THREADS];
	struct detect_ctx *c;
	uint64_t sum = 0;
	int nt, pooled, rc = DTC_OK;

	if (!(c = calloc(1, sizeof(*c))))
		return DTC_ENOMEM;
	pooled = pool_take(c->part);
	c->flags = dtc_cpu_flags_best();
	c->block = dtc_cpu_detect_best();
	c->e = *e;
	c->k = *k;
	c->p = param;
	c->m = m;
	c->v = v;
	c->mark = mark;
	c->size = dtc_box_size(e);
	c->csum = csum != NULL;
	nt = split_plan(parts, (c->size + 63) / 64, 64, c->size);
	split_run(parts, nt, detect_range, c);
	for (int i = 0; i < nt; i++) {
		sum += parts[i].out;
		if (c->failed[i])
			rc = DTC_ENOMEM;
	}
	if (rc == DTC_OK)
		rc = detect_join(parts, c->part, nt, out, count);
	if (rc == DTC_OK && csum)
		*csum = sum;
	pool_give(c->part, pooled);
	free(c);
	return rc;
}

/* ---- dense extract / apply ------------------------------------------- */

struct dense_ctx {
	struct dte_box_map e;
	const float *param;
	uint16_t *out;		/* extract: canonical order */
	const uint16_t *vals;	/* apply: canonical order */
	uint16_t *dst;
	uint64_t size;
};

DTC_CLONES
static uint64_t extract_range(void *arg, uint64_t lo, uint64_t hi, int part)
{
	struct dense_ctx *c = arg;
	int64_t s1 = c->e.src_stride[c->e.ndim - 1];
	struct box_rows r;

	for (box_rows_init(&r, &c->e, lo, hi); box_rows_next(&r);) {
		const float *src = c->param + r.src;
		uint16_t *o = c->out + r.p;

		if (s1 == 1) {
			for (uint64_t i = 0; i < r.n; i++)
				o[i] = dtc_bf16_rne(src[i]);
		} else {
			for (uint64_t i = 0; i < r.n; i++)
				o[i] = dtc_bf16_rne(src[(int64_t)i * s1]);
		}
	}
	return 0;
}

static int cpu_extract(const struct dte_box_map *e, const float *param, uint16_t *out)
{
	struct dense_ctx c = { .param = param, .out = out, .size = dtc_box_size(e) };

	c.e = *e;
	run_split(extract_range, &c, c.size, 64, c.size);
	return DTC_OK;
}

static uint64_t apply_range(void *arg, uint64_t lo, uint64_t hi, int part)
{
	struct dense_ctx *c = arg;
	int64_t d1 = c->e.dst_stride[c->e.ndim - 1];
	struct box_rows r;

	for (box_rows_init(&r, &c->e, lo, hi); box_rows_next(&r);) {
		uint16_t *dst = c->dst + r.dst;

		if (d1 == 1)
			memcpy(dst, c->vals + r.p, r.n * sizeof(uint16_t));
		else
			for (uint64_t i = 0; i < r.n; i++)
				dst[(int64_t)i * d1] = c->vals[r.p + i];
	}
	return 0;
}

static int cpu_dense_apply(const struct dte_box_map *e, const uint16_t *vals, uint16_t *dst)
{
	struct dense_ctx c = { .vals = vals, .dst = dst, .size = dtc_box_size(e) };

	c.e = *e;
	run_split(apply_range, &c, c.size, 64, c.size);
	return DTC_OK;
}

/* ---- scatter ---------------------------------------------------------- */

static int cpu_scatter(const struct dte_box_map *e, const uint64_t *pos, const uint16_t *val,
		       uint64_t n, uint16_t *dst)
{
	uint64_t size = dtc_box_size(e), cur = 0;
	struct box_walk w;

	/* The entry was checked against dst's length, so a position inside
	 * the box is a destination inside the buffer. */
	for (uint64_t i = 0; i < n; i++)
		if (pos[i] >= size)
			return DTC_ERANGE;
	box_walk_seek(&w, e, 0);
	for (uint64_t i = 0; i < n; i++) {
		walk_to(&w, &cur, pos[i]);
		dst[box_dst_index(&w)] = val[i];
	}
	return DTC_OK;
}

/* ---- checksums -------------------------------------------------------- */

struct csum_ctx {
	struct dte_box_map e;
	const uint16_t *buf;
	const float *param;
	uint16_t *in, *out;	/* dense swap: the payload, the destination */
};

/* Σ mix over a run of destination indices base + i·dstride, values from
 * BF16 bits (bits != NULL) or rounded FP32 at stride sstride.  The unit
 * stride loops have no carried dependency but the sum, so they vectorize
 * (8 lanes of 64-bit multiplies on AVX-512): the checksum was a scalar
 * walk costing several times the scan it verifies. */
DTC_CSUM_CLONES
static uint64_t csum_run_bits(const uint16_t *bits, int64_t base, int64_t dstride, uint64_t n)
{
	uint64_t s = 0;

	if (dstride == 1) {
		for (uint64_t i = 0; i < n; i++)
			s += dtc_csum_term((uint64_t)base + i, bits[(int64_t)i]);
	} else {
		for (uint64_t i = 0; i < n; i++)
			s += dtc_csum_term((uint64_t)(base + (int64_t)i * dstride),
					   bits[(int64_t)i * dstride]);
	}
	return s;
}

DTC_CSUM_CLONES
static uint64_t csum_run_fp32(const float *src, int64_t sstride, int64_t base, int64_t dstride,
			      uint64_t n)
{
	uint64_t s = 0;

	if (sstride == 1 && dstride == 1) {
		for (uint64_t i = 0; i < n; i++)
			s += dtc_csum_term((uint64_t)base + i, dtc_bf16_rne(src[i]));
	} else {
		for (uint64_t i = 0; i < n; i++)
			s += dtc_csum_term((uint64_t)(base + (int64_t)i * dstride),
					   dtc_bf16_rne(src[(int64_t)i * sstride]));
	}
	return s;
}

/* The portable row kernels of struct dtc_cpu_runs. */
static uint64_t csum_run_out(const uint16_t *out, int64_t base, int64_t dstride, uint64_t n);

static uint64_t gen_csum_fp32(const float *src, int64_t base, int64_t dstride, uint64_t n)
{
	return csum_run_fp32(src, 1, base, dstride, n);
}

static uint64_t gen_extract_csum(const float *src, uint16_t *out, int64_t base, int64_t dstride,
				 uint64_t n);
static uint64_t swap_run(uint16_t *restrict v, uint16_t *restrict d, int64_t base, int64_t d1,
			 uint64_t n);

static uint64_t gen_swap_csum(uint16_t *v, uint16_t *d, int64_t base, uint64_t n)
{
	return swap_run(v, d, base, 1, n);
}

const struct dtc_cpu_runs dtc_cpu_runs_generic = {
	.csum_bits = csum_run_out,	/* contiguous values, keys at any stride */
	.csum_fp32 = gen_csum_fp32,
	.extract_csum = gen_extract_csum,
	.swap_csum = gen_swap_csum,
};

const struct dtc_cpu_runs *dtc_cpu_runs_best(void)
{
	static const struct dtc_cpu_runs *best;
	const struct dtc_cpu_runs *r = __atomic_load_n(&best, __ATOMIC_ACQUIRE);

	if (!r) {
		r = simd_allowed() ? dtc_cpu_runs_avx512() : NULL;
		if (!r)
			r = &dtc_cpu_runs_generic;
		__atomic_store_n(&best, r, __ATOMIC_RELEASE);
	}
	return r;
}

static uint64_t csum_buf_range(void *arg, uint64_t lo, uint64_t hi, int part)
{
	const uint16_t *b = ((struct csum_ctx *)arg)->buf;

	return lo < hi ? dtc_cpu_runs_best()->csum_bits(b + lo, (int64_t)lo, 1, hi - lo) : 0;
}

static int cpu_checksum_buffer(const uint16_t *buf, uint64_t len, uint64_t *sum)
{
	struct csum_ctx c = { .buf = buf };

	*sum = run_split(csum_buf_range, &c, len, 64, len);
	return DTC_OK;
}

static uint64_t csum_entry_range(void *arg, uint64_t lo, uint64_t hi, int part)
{
	const struct dtc_cpu_runs *k = dtc_cpu_runs_best();
	struct csum_ctx *c = arg;
	int64_t s1 = c->e.src_stride[c->e.ndim - 1], d1 = c->e.dst_stride[c->e.ndim - 1];
	struct box_rows r;
	uint64_t s = 0;

	for (box_rows_init(&r, &c->e, lo, hi); box_rows_next(&r);)
		s += s1 == 1 ? k->csum_fp32(c->param + r.src, r.dst, d1, r.n)
			     : csum_run_fp32(c->param + r.src, s1, r.dst, d1, r.n);
	return s;
}

static int cpu_checksum_entry(const struct dte_box_map *e, const float *param, uint64_t *sum)
{
	struct csum_ctx c = { .param = param };
	uint64_t size = dtc_box_size(e);

	c.e = *e;
	*sum = run_split(csum_entry_range, &c, size, 64, size);
	return DTC_OK;
}

/* Trade n payload values v[i] with the destination run d[i·d1] and return
 * Σ mix(base + i·d1, new value), summed while the value is in a register:
 * the swap and the sum of what it wrote in one pass (the generic swap in
 * gpu/apply.c summed the box again afterwards, a second read of every
 * destination value).  v and d never overlap: a payload is a buffer of its
 * own. */
DTC_CSUM_CLONES
static uint64_t swap_run(uint16_t *restrict v, uint16_t *restrict d, int64_t base, int64_t d1,
			 uint64_t n)
{
	uint64_t s = 0;

	if (d1 == 1) {
		for (uint64_t i = 0; i < n; i++) {
			uint16_t x = v[i];

			v[i] = d[i];
			d[i] = x;
			s += dtc_csum_term((uint64_t)base + i, x);
		}
	} else {
		for (uint64_t i = 0; i < n; i++) {
			int64_t k = (int64_t)i * d1;
			uint16_t x = v[i];

			v[i] = d[k];
			d[k] = x;
			s += dtc_csum_term((uint64_t)(base + k), x);
		}
	}
	return s;
}

/* Σ mix over a destination box (the sink's verification): rows of the
 * last dim through the vectorized run, rows split over the cores.  With
 * c->in set, each row is first swapped with the payload (cpu_dense_swap)
 * and the sum is of what the swap wrote. */
static uint64_t csum_box_range(void *arg, uint64_t lo, uint64_t hi, int part)
{
	const struct dtc_cpu_runs *k = dtc_cpu_runs_best();
	struct csum_ctx *c = arg;
	int64_t d1 = c->e.dst_stride[c->e.ndim - 1];
	struct box_rows r;
	uint64_t s = 0;

	for (box_rows_init(&r, &c->e, lo, hi); box_rows_next(&r);) {
		if (c->in)
			s += d1 == 1 ? k->swap_csum(c->in + r.p, c->out + r.dst, r.dst, r.n)
				     : swap_run(c->in + r.p, c->out + r.dst, r.dst, d1, r.n);
		else
			s += d1 == 1 ? k->csum_bits(c->buf + r.dst, r.dst, 1, r.n)
				     : csum_run_bits(c->buf + r.dst, r.dst, d1, r.n);
	}
	return s;
}

static int cpu_checksum_box(const struct dte_box_map *e, const uint16_t *dst, uint64_t *sum)
{
	struct csum_ctx c = { .buf = dst };
	uint64_t size = dtc_box_size(e);

	c.e = *e;
	*sum = run_split(csum_box_range, &c, size, 64, size);
	return DTC_OK;
}

/* ---- dense swap fused with its checksum (a parked sink's dense part) -- */

/* The payload is in box order (element p of the box at in[p]); the map is
 * injective (checked by the caller), so the rows the threads take write
 * disjoint elements. */
static int cpu_dense_swap(const struct dte_box_map *e, uint16_t *in, uint16_t *dst,
			  uint64_t *sum)
{
	struct csum_ctx c = { .in = in, .out = dst };
	uint64_t size = dtc_box_size(e);

	c.e = *e;
	*sum = run_split(csum_box_range, &c, size, 64, size);
	return DTC_OK;
}

/* ---- dense extract fused with its checksum ---------------------------- */

/* Σ mix(base + i·dstride, out[i]): the terms of BF16 values just written
 * contiguously (canonical order), whatever the destination stride. */
DTC_CSUM_CLONES
static uint64_t csum_run_out(const uint16_t *out, int64_t base, int64_t dstride, uint64_t n)
{
	uint64_t s = 0;

	if (dstride == 1) {
		for (uint64_t i = 0; i < n; i++)
			s += dtc_csum_term((uint64_t)base + i, out[i]);
	} else {
		for (uint64_t i = 0; i < n; i++)
			s += dtc_csum_term((uint64_t)(base + (int64_t)i * dstride), out[i]);
	}
	return s;
}

/* Rows cut into slices of this many elements: a slice's BF16 values are
 * summed right after they are written, while still in L1, so θ is read
 * once for both (the separate passes read it twice: issue #16). */
#define EXTRACT_CSUM_SLICE	2048

/* Round a run of n values at source stride s1 into out[0..n) and sum
 * their terms at destination indices base + i·dstride, slice by slice. */
DTC_CLONES
static uint64_t extract_slices(const float *src, int64_t s1, uint16_t *o, int64_t base,
			       int64_t d1, uint64_t n)
{
	uint64_t sum = 0;

	for (uint64_t at = 0; at < n; at += EXTRACT_CSUM_SLICE) {
		uint64_t k = n - at < EXTRACT_CSUM_SLICE ? n - at : EXTRACT_CSUM_SLICE;

		if (s1 == 1) {
			for (uint64_t i = 0; i < k; i++)
				o[at + i] = dtc_bf16_rne(src[at + i]);
		} else {
			for (uint64_t i = 0; i < k; i++)
				o[at + i] = dtc_bf16_rne(src[(int64_t)(at + i) * s1]);
		}
		sum += csum_run_out(o + at, base + (int64_t)at * d1, d1, k);
	}
	return sum;
}

static uint64_t gen_extract_csum(const float *src, uint16_t *out, int64_t base, int64_t dstride,
				 uint64_t n)
{
	return extract_slices(src, 1, out, base, dstride, n);
}

static uint64_t extract_csum_range(void *arg, uint64_t lo, uint64_t hi, int part)
{
	const struct dtc_cpu_runs *k = dtc_cpu_runs_best();
	struct dense_ctx *c = arg;
	int64_t s1 = c->e.src_stride[c->e.ndim - 1], d1 = c->e.dst_stride[c->e.ndim - 1];
	struct box_rows r;
	uint64_t sum = 0;

	(void)part;
	for (box_rows_init(&r, &c->e, lo, hi); box_rows_next(&r);)
		sum += s1 == 1 ? k->extract_csum(c->param + r.src, c->out + r.p, r.dst, d1, r.n)
			       : extract_slices(c->param + r.src, s1, c->out + r.p, r.dst, d1, r.n);
	return sum;
}

static int cpu_extract_csum(const struct dte_box_map *e, const float *param, uint16_t *out,
			    uint64_t *sum, void (*done)(void *arg, const uint16_t *p, uint64_t n),
			    void *arg)
{
	struct dense_ctx c = { .param = param, .out = out, .size = dtc_box_size(e) };
	struct part probe[MAX_THREADS];
	uint64_t s = 0;

	c.e = *e;
	if (!done || split_plan(probe, c.size, 64, c.size) > 1) {
		*sum = run_split(extract_csum_range, &c, c.size, 64, c.size);
		if (done && c.size)
			done(arg, out, c.size);
		return DTC_OK;
	}
	/* one thread: each run handed over while it is in cache */
	for (uint64_t lo = 0; lo < c.size; lo += DTC_EXTRACT_RUN) {
		uint64_t hi = c.size - lo < DTC_EXTRACT_RUN ? c.size : lo + DTC_EXTRACT_RUN;

		s += extract_csum_range(&c, lo, hi, 0);
		done(arg, out + lo, hi - lo);
	}
	*sum = s;
	return DTC_OK;
}

/* The portable detect block: the generic verdicts, the scalar emitter,
 * the vectorized checksum run (θ is in L1 by then). */
uint64_t dtc_cpu_detect_block(const struct dtc_consts *k, const float *p, const float *m,
			      const float *v, int nw, const uint64_t *mark, uint64_t pos,
			      int64_t dbase, int64_t dstride, int csum, struct dtc_cpu_emit *s)
{
	uint64_t blk[BLOCK_WORDS];

	dtc_cpu_flags(k, p, m, v, nw, blk);
	for (int j = 0; j < nw; j++)
		dtc_cpu_emit_word(s, blk[j] | (mark ? mark[j] : 0), pos + 64 * (uint64_t)j,
				  p + 64 * j);
	return csum ? csum_run_fp32(p, 1, dbase, dstride, 64 * (uint64_t)nw) : 0;
}

dtc_cpu_detect_fn dtc_cpu_detect_best(void)
{
	static dtc_cpu_detect_fn best;
	dtc_cpu_detect_fn f = __atomic_load_n(&best, __ATOMIC_ACQUIRE);

	if (!f) {
		f = simd_allowed() ? dtc_cpu_detect_avx512() : NULL;
		if (!f)
			f = dtc_cpu_detect_block;
		__atomic_store_n(&best, f, __ATOMIC_RELEASE);
	}
	return f;
}

const struct dtc_backend_ops dtc_cpu_ops = {
	.scan = cpu_scan,
	.sparse_from_bitmap = cpu_sparse,
	.dense_extract = cpu_extract,
	.scatter = cpu_scatter,
	.dense_apply = cpu_dense_apply,
	.checksum_buffer = cpu_checksum_buffer,
	.checksum_entry = cpu_checksum_entry,
	.checksum_box = cpu_checksum_box,
	.detect = cpu_detect,
	.dense_swap = cpu_dense_swap,
	.dense_extract_csum = cpu_extract_csum,
};

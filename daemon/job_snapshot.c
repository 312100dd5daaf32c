/* daemon/job_snapshot.c — snapshot-diff detection, the honest baseline.
 *
 * What PULSE- and slime-style systems do: keep the BF16 version the sink
 * holds and compare the new one against it.  It needs no optimizer state
 * (any optimizer, post-step weight edits, AMSGrad all work) and flags
 * exactly the elements whose rounding changed, at the price of 2 bytes per
 * element of daemon memory, held for the job's life (DESIGN §8 compares
 * it with AdamW inversion, which keeps nothing).
 *
 * Built as well as the baseline can be, so the comparison is with the
 * method and not with a strawman: the kept values are one persistent array
 * per entry, updated in place (no per-scan allocation); one pass reads θ
 * (4 B/element) and the kept BF16 (2 B), rounds θ to BF16, compares, sets
 * the bitmap and stores back only the values that changed; the box is
 * walked in rows of its innermost dimension, split over the cores like the
 * AdamW detect (word-aligned position ranges, so threads never share a
 * bitmap word), and contiguous rows go through an AVX-512 kernel chosen at
 * run time (16 lanes: RNE in integer ops, vpmovdw, one 16-bit compare into
 * a mask) or the portable loop the compiler vectorizes elsewhere.
 *
 * Correct only while the kept values are what the sink holds: the caller
 * scans every version it sends sparse and calls jsnap_keep() after a dense
 * one; anything that may break that (re-plan, refusal) must jsnap_fini(),
 * after which the next scan flags every element.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/job_snapshot.h"
#include "gpu/box.h"
#include "gpu/detect.h"
#include "gpu/elem.h"

#define SNAP_PAR_MIN	(1u << 20)	/* below this one thread is faster */
#define SNAP_MAX_THREADS 16

/* n contiguous source values p[0..n) at box positions pos.. pos+n:
 * compare, flag, keep.  Returns the number of lanes done (the kernels may
 * leave a tail to the caller). */
typedef uint64_t (*snap_row_fn)(const float *p, uint16_t *kept, uint64_t pos, uint64_t n,
				uint64_t *bitmap);

static inline void flag_bits(uint64_t *bitmap, uint64_t pos, uint64_t bits, unsigned width)
{
	unsigned sh = (unsigned)(pos & 63);

	if (!bits)
		return;
	bitmap[pos >> 6] |= bits << sh;
	if (sh + width > 64)
		bitmap[(pos >> 6) + 1] |= bits >> (64 - sh);
}

/* The portable kernel: 64 lanes at a time through a fixed-length loop
 * (vectorized by the compiler at -O3), the tail one by one. */
static uint64_t row_generic(const float *p, uint16_t *kept, uint64_t pos, uint64_t n,
			    uint64_t *bitmap)
{
	uint64_t i = 0;

	for (; i + 64 <= n; i += 64) {
		uint64_t d = 0;

		for (unsigned q = 0; q < 64; q++) {
			uint16_t b = dtc_bf16_rne(p[i + q]);

			d |= (uint64_t)(b != kept[i + q]) << q;
			kept[i + q] = b;
		}
		flag_bits(bitmap, pos + i, d, 64);
	}
	for (; i < n; i++) {
		uint16_t b = dtc_bf16_rne(p[i]);

		if (b != kept[i]) {
			bitmap[(pos + i) >> 6] |= 1ull << ((pos + i) & 63);
			kept[i] = b;
		}
	}
	return n;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SNAP_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

/* dtc_bf16_rne() on 16 lanes, operation for operation. */
SNAP_AVX512 static inline __m256i rne16(__m512i u)
{
	const __m512i one = _mm512_set1_epi32(1);
	__m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
				     _mm512_and_si512(_mm512_srli_epi32(u, 16), one));
	__mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
						_mm512_set1_epi32(0x7f800000));

	r = _mm512_srli_epi32(r, 16);
	r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
	return _mm512_cvtepi32_epi16(r);
}

SNAP_AVX512 static uint64_t row_avx512(const float *p, uint16_t *kept, uint64_t pos, uint64_t n,
				       uint64_t *bitmap)
{
	uint64_t i = 0;

	for (; i + 64 <= n; i += 64) {
		uint64_t d = 0;

		for (unsigned q = 0; q < 64; q += 16) {
			__m256i b = rne16(_mm512_loadu_si512((const void *)(p + i + q)));
			__m256i k = _mm256_loadu_si256((const __m256i *)(const void *)(kept + i + q));
			__mmask16 ne = _mm256_cmpneq_epu16_mask(b, k);

			_mm256_mask_storeu_epi16((void *)(kept + i + q), ne, b);
			d |= (uint64_t)ne << q;
		}
		flag_bits(bitmap, pos + i, d, 64);
	}
	return i;
}

static snap_row_fn row_best(void)
{
	/* Process-level: the CPU's best row function, chosen once (not
	 * engine state; tests/system/engine_api.sh does not read this file). */
	static snap_row_fn f;
	snap_row_fn r = __atomic_load_n(&f, __ATOMIC_RELAXED);
	const char *s;

	if (r)
		return r;
	r = row_generic;
	s = getenv("DTC_CPU_SIMD");
	if (!(s && !strcmp(s, "generic")) && __builtin_cpu_supports("avx512f") &&
	    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
		r = row_avx512;
	__atomic_store_n(&f, r, __ATOMIC_RELAXED);
	return r;
}
#else
static snap_row_fn row_best(void)
{
	return row_generic;
}
#endif

struct snap_part {
	const struct dte_box_map *e;	/* coalesced on the source side */
	const float *param;
	uint16_t *kept;
	uint64_t *bitmap;
	uint64_t lo, hi;
	snap_row_fn fn;
	pthread_t tid;
	int started;
};

/* Positions [lo, hi) of the box, row by row. */
static void *snap_range(void *arg)
{
	struct snap_part *t = arg;
	const struct dte_box_map *e = t->e;
	int64_t inner = e->src_stride[e->ndim - 1];
	struct box_walk w;
	uint64_t pos = t->lo;

	if (t->lo >= t->hi)
		return NULL;
	box_walk_seek(&w, e, pos);
	while (pos < t->hi) {
		uint64_t len = (uint64_t)(w.row_len - w.col), done = 0;
		const float *row = t->param + box_src_index(&w);

		if (len > t->hi - pos)
			len = t->hi - pos;
		if (inner == 1)
			done = t->fn(row, t->kept + pos, pos, len, t->bitmap);
		if (done < len && inner == 1)
			done += row_generic(row + done, t->kept + pos + done, pos + done, len - done,
					    t->bitmap);
		for (; done < len; done++) {
			uint16_t b = dtc_bf16_rne(row[(int64_t)done * inner]);

			if (b != t->kept[pos + done]) {
				t->bitmap[(pos + done) >> 6] |= 1ull << ((pos + done) & 63);
				t->kept[pos + done] = b;
			}
		}
		pos += len;
		if (pos < t->hi)
			box_walk_next_row(&w);
	}
	return NULL;
}

static void snap_compare(const struct dte_box_map *e, const float *param, uint16_t *kept,
			 uint64_t n, uint64_t *bitmap)
{
	struct snap_part parts[SNAP_MAX_THREADS];
	struct dte_box_map c;
	int nt = n >= SNAP_PAR_MIN ? dtc_cpu_threads() : 1;
	uint64_t chunk;

	box_coalesce(e, BOX_SRC, &c);
	if (nt > SNAP_MAX_THREADS)
		nt = SNAP_MAX_THREADS;
	chunk = (n / (uint64_t)nt + 63) / 64 * 64;
	for (int i = 0; i < nt; i++) {
		uint64_t lo = chunk * (uint64_t)i, hi = lo + chunk;

		parts[i] = (struct snap_part){ &c, param, kept, bitmap, lo < n ? lo : n,
					       i == nt - 1 || hi > n ? n : hi, row_best(), 0, 0 };
	}
	for (int i = 1; i < nt; i++)
		parts[i].started = pthread_create(&parts[i].tid, NULL, snap_range, &parts[i]) == 0;
	snap_range(&parts[0]);
	for (int i = 1; i < nt; i++) {
		if (parts[i].started)
			pthread_join(parts[i].tid, NULL);
		else
			snap_range(&parts[i]);
	}
}

int jsnap_scan(struct jsnap *s, const struct dtc_backend *be, const struct dte_box_map *e,
	       const float *param, uint64_t param_len, uint64_t *bitmap, uint64_t words,
	       uint64_t *count)
{
	uint64_t n = dtc_box_size(e), pop = 0;
	uint16_t *cur;
	int rc;

	if (!s || !bitmap || !n || words < dtc_bitmap_words(e))
		return DTC_EINVAL;
	if ((rc = dtc_entry_check(e, param_len, UINT64_MAX)) != DTC_OK)
		return rc;
	if (s->vals && s->n == n && dtc_host_backend(be)) {
		/* The kept values are updated in place. */
		snap_compare(e, param, s->vals, n, bitmap);
	} else {
		/* Nothing to compare with (or device memory): everything may
		 * have changed; the current values become the kept ones. */
		if (!(cur = malloc(n * sizeof(*cur))))
			return DTC_ENOMEM;
		if ((rc = dtc_dense_extract(be, e, param, param_len, cur)) != DTC_OK) {
			free(cur);
			return rc;
		}
		if (s->vals && s->n == n) {
			for (uint64_t i = 0; i < n; i++)
				if (cur[i] != s->vals[i])
					bitmap[i >> 6] |= 1ull << (i & 63);
		} else {
			for (uint64_t i = 0; i < n / 64; i++)
				bitmap[i] = ~0ull;
			if (n % 64)
				bitmap[n / 64] |= (1ull << (n % 64)) - 1;
		}
		free(s->vals);
		s->vals = cur;
		s->n = n;
	}
	for (uint64_t i = 0; i < dtc_bitmap_words(e); i++)
		pop += (uint64_t)__builtin_popcountll(bitmap[i]);
	if (count)
		*count = pop;
	return DTC_OK;
}

int jsnap_keep(struct jsnap *s, const uint16_t *vals, uint64_t n)
{
	uint16_t *p;

	if (!s || !vals || !n)
		return DTC_EINVAL;
	if (s->vals && s->n == n) {
		memcpy(s->vals, vals, n * sizeof(*vals));
		return DTC_OK;
	}
	if (!(p = malloc(n * sizeof(*p))))
		return DTC_ENOMEM;
	memcpy(p, vals, n * sizeof(*p));
	free(s->vals);
	s->vals = p;
	s->n = n;
	return DTC_OK;
}

void jsnap_fini(struct jsnap *s)
{
	if (!s)
		return;
	free(s->vals);
	s->vals = NULL;
	s->n = 0;
}

void jsnap_free_all(struct jsnap *s, size_t n)
{
	for (size_t i = 0; s && i < n; i++)
		jsnap_fini(&s[i]);
	free(s);
}

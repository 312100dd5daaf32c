/* The scan's AVX-512 kernel: same verdicts as dtc_cpu_flags(), at memory
 * speed.
 *
 * The compiler's vectorization of the generic loop spends ~1 ns per
 * element in cache (byte flags, packing, spills) and far more per element
 * the cheap test cannot clear (a scalar gather).  Here the cheap test
 * (dtc_adamw_quiet) runs 16 lanes at a time straight into mask registers,
 * the lanes it cannot clear are compressed into a short list in registers
 * (vcompressps; its store-to-memory form is microcoded on some cores, so
 * the full vector is stored and the tail overwritten), the full inverse
 * decides that list with elem.h's own code, and pdep deposits those
 * verdicts back at the lanes they came from.
 *
 * quiet16() mirrors dtc_adamw_quiet() operation for operation: the same
 * FP32 multiplies, subtractions and ordered comparisons in the same order,
 * the same 32-bit integer wrap-arounds, so the bitmap is bit-identical to
 * the reference (tests/unit/test_cpu_simd.c checks random and edge-case
 * inputs against it). */
#include <string.h>
#include "gpu/cpu_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,bmi2,popcnt")))

struct quiet_consts {
	__m512 c_up, q_s, q_q2, e2;
};

AVX512 static inline __mmask16 quiet16(const struct quiet_consts *c, __m512 th, __m512 m,
				       __m512 v)
{
	const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
	const __m512i half = _mm512_set1_epi32(0x8000);
	__m512i b = _mm512_castps_si512(th);
	__m512i ab = _mm512_and_si512(b, absmask);
	__m512i base = _mm512_and_si512(_mm512_add_epi32(ab, half), _mm512_set1_epi32((int)0xffff0000u));
	__m512 x = _mm512_castsi512_ps(ab);
	__m512 r_up = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_add_epi32(base, half)),
				    _mm512_mul_ps(x, c->c_up));
	__m512 r_dn = _mm512_sub_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.9999989867210388f)),
				    _mm512_castsi512_ps(_mm512_sub_epi32(base, half)));
	__m512 r_min = _mm512_min_ps(r_up, r_dn);
	/* sign of θ equals sign of m: u grows |θ_{t-1}| */
	__mmask16 up = _mm512_cmpge_epi32_mask(_mm512_xor_si512(b, _mm512_castps_si512(m)),
					       _mm512_setzero_si512());
	__m512 r = _mm512_mask_blend_ps(up, r_dn, r_up);
	__m512 a = _mm512_mul_ps(c->q_s, _mm512_castsi512_ps(
		_mm512_and_si512(_mm512_castps_si512(m), absmask)));
	__m512 rr = _mm512_mul_ps(_mm512_mul_ps(r, r),
				  _mm512_max_ps(_mm512_mul_ps(v, c->q_q2), c->e2));
	__mmask16 ok;

	ok = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(base, _mm512_set1_epi32(0x00800000)),
				     _mm512_set1_epi32(0x47000000));
	ok = _mm512_mask_cmp_ps_mask(ok, r_min, _mm512_set1_ps(1.1102230246251565e-16f),
				     _CMP_GT_OQ);
	ok = _mm512_mask_cmplt_epu32_mask(ok, _mm512_sub_epi32(_mm512_castps_si512(rr),
							       _mm512_set1_epi32(0x0d800000)),
					  _mm512_set1_epi32(0x72000000));
	return _mm512_mask_cmp_ps_mask(ok, _mm512_mul_ps(a, a), rr, _CMP_LT_OQ);
}

#define LIST (64 * DTC_CPU_BLOCK_WORDS)

/* How far ahead the block pass asks for θ, m and v, into L2.  The
 * hardware prefetchers stop at each 4 KiB page, and a block is exactly a
 * page of each array, so every block began with three demand misses (and,
 * in a VM, three nested page walks) while the core sat idle.  One prefetch
 * per array per 16 lanes, 3 KiB ahead, starts the next pages' walks and
 * fills during this block's arithmetic.  Measured in one process against
 * no prefetch (bench_scan's setup, 2^27 elements, 2 threads, four runs):
 * detect 0.072-0.078 s against 0.107-0.121 s; 1.5 and 4 KiB ahead, or into
 * L1, were slower than 2-3 KiB into L2.  Prefetches never fault, so
 * asking past the end of an array is harmless (the address is formed as
 * an integer, not as a pointer past the array). */
#define PREFETCH_AHEAD 3072

/* The full inverse over 16 gathered elements as a lane mask.  elem.h's
 * code as written, in a fixed-length loop the compiler turns into one
 * pass of vector code (a loop of unknown length would leave short lists
 * to its scalar epilogue). */
AVX512 static inline __mmask16 decide16(const struct dtc_consts *k, const float *p,
					const float *m, const float *v)
{
	int32_t f[16];

	if (k->variant == DTC_VARIANT_FUSED) {
		for (int i = 0; i < 16; i++)
			f[i] = dtc_adamw_changed_u(k, p[i], dtc_adamw_u_fused(k, m[i], v[i]));
	} else {
		for (int i = 0; i < 16; i++)
			f[i] = dtc_adamw_changed_u(k, p[i], dtc_adamw_u_torch(k, m[i], v[i]));
	}
	return _mm512_test_epi32_mask(_mm512_loadu_si512(f), _mm512_set1_epi32(1));
}

/* ---- the checksum, 16 lanes at a time ----------------------------------
 * Σ dtc_csum_term(dbase + i·dstride, bf16(p[i])).  The key of element i is
 * carried as its Weyl state (dbase + i·dstride)·W in 64-bit lanes, even
 * elements in one vector and odd ones in another, each advanced by
 * 16·dstride·W per 16 lanes; folded and made odd it multiplies the BF16
 * (vpmuludq takes the low 32 bits of both operands), and the 48-bit
 * products add into 64-bit lanes.  csum16() runs inside the block's
 * cheap-test pass on the θ vector that pass has just loaded: there its
 * 18 integer ops per 16 lanes mostly fill the cycles the pass spends waiting on
 * memory, where a second pass over the block (in L1) added them to the
 * detect's time.  (vcvtneps2bf16 for the conversion, where the CPU has
 * AVX512-BF16, flushes denormals and measured no faster: not used.) */
struct csum_state {
	__m512i ke, ko, acc0, acc1;
};

#define CSUM_W 0x9e3779b97f4a7c15ull

AVX512 static inline void csum_init(struct csum_state *cs, int64_t dbase, int64_t dstride)
{
	uint64_t d = (uint64_t)dstride * CSUM_W, e[8], o[8];

	for (int i = 0; i < 8; i++) {
		e[i] = ((uint64_t)dbase + 2 * (uint64_t)i * (uint64_t)dstride) * CSUM_W;
		o[i] = e[i] + d;
	}
	memcpy(&cs->ke, e, sizeof(e));
	memcpy(&cs->ko, o, sizeof(o));
	cs->acc0 = cs->acc1 = _mm512_setzero_si512();
}

AVX512 static inline void csum16(struct csum_state *cs, __m512i step, __m512 x)
{
	const __m512i one = _mm512_set1_epi64(1);
	__m512i u = _mm512_castps_si512(x);
	/* dtc_bf16_rne() before its final shift: t >> 16 is the BF16 (a NaN:
	 * u with the quiet bit, so that t >> 16 = (u >> 16) | 0x40) */
	__m512i t = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
				     _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
	__mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
	__m512i re, ro;

	t = _mm512_mask_or_epi32(t, nan, u, _mm512_set1_epi32(0x00400000));
	/* (k ^ k >> 32) | 1 in one ternary-logic op: 0xbe = (A ^ B) | C */
	re = _mm512_ternarylogic_epi64(cs->ke, _mm512_srli_epi64(cs->ke, 32), one, 0xbe);
	ro = _mm512_ternarylogic_epi64(cs->ko, _mm512_srli_epi64(cs->ko, 32), one, 0xbe);
	/* even lanes' BF16 into the low 32 bits by a 32-bit shift (vpmuludq
	 * ignores the high ones), odd lanes' by a 64-bit shift by 48 */
	cs->acc0 = _mm512_add_epi64(cs->acc0, _mm512_mul_epu32(_mm512_srli_epi32(t, 16), re));
	cs->acc1 = _mm512_add_epi64(cs->acc1, _mm512_mul_epu32(_mm512_srli_epi64(t, 48), ro));
	cs->ke = _mm512_add_epi64(cs->ke, step);
	cs->ko = _mm512_add_epi64(cs->ko, step);
}

AVX512 static inline uint64_t csum_sum(const struct csum_state *cs)
{
	uint64_t lane[8], sum = 0;

	/* not _mm512_reduce_add_epi64: GCC's adds signed lanes (UBSan) */
	_mm512_storeu_si512(lane, _mm512_add_epi64(cs->acc0, cs->acc1));
	for (int i = 0; i < 8; i++)
		sum += lane[i];
	return sum;
}

/* ---- checksum runs outside the detect ----------------------------------
 * The dense extract, a parked sink's dense swap and the checksum of a
 * BF16 run: the same Weyl-carried keys and vpmuludq products as csum16(),
 * over a whole row.  The compiler's vectorization of the portable loops
 * (gpu/cpu.c) multiplies the index by W and the key by the value with
 * vpmullq, three per 8 lanes: 0.26 ns per element in L1 against 0.12 here,
 * and in the dense extract the sum of a slice cost half of its rounding. */

/* The terms of 16 BF16 values zero-extended into 32-bit lanes. */
AVX512 static inline void csum16_bits(struct csum_state *cs, __m512i step, __m512i x)
{
	const __m512i one = _mm512_set1_epi64(1);
	__m512i re = _mm512_ternarylogic_epi64(cs->ke, _mm512_srli_epi64(cs->ke, 32), one, 0xbe);
	__m512i ro = _mm512_ternarylogic_epi64(cs->ko, _mm512_srli_epi64(cs->ko, 32), one, 0xbe);

	cs->acc0 = _mm512_add_epi64(cs->acc0, _mm512_mul_epu32(x, re));
	cs->acc1 = _mm512_add_epi64(cs->acc1, _mm512_mul_epu32(_mm512_srli_epi64(x, 32), ro));
	cs->ke = _mm512_add_epi64(cs->ke, step);
	cs->ko = _mm512_add_epi64(cs->ko, step);
}

/* dtc_bf16_rne() of 16 FP32 bit patterns, in 32-bit lanes. */
AVX512 static inline __m512i bf16x16(__m512i u)
{
	__m512i hi = _mm512_srli_epi32(u, 16);
	__mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
						_mm512_set1_epi32(0x7f800000));
	__m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
						       _mm512_and_si512(hi, _mm512_set1_epi32(1))), 16);

	return _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
}

static inline __mmask16 tail16(uint64_t left)
{
	return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
}

AVX512 static uint64_t csum_bits_avx512(const uint16_t *b, int64_t base, int64_t dstride,
					uint64_t n)
{
	struct csum_state cs;
	__m512i step = _mm512_set1_epi64((long long)(16 * (uint64_t)dstride * CSUM_W));

	csum_init(&cs, base, dstride);
	for (uint64_t i = 0; i < n; i += 16) {
		__mmask16 k = tail16(n - i);

		csum16_bits(&cs, step, _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, b + i)));
	}
	return csum_sum(&cs);
}

AVX512 static uint64_t csum_fp32_avx512(const float *src, int64_t base, int64_t dstride,
					uint64_t n)
{
	struct csum_state cs;
	__m512i step = _mm512_set1_epi64((long long)(16 * (uint64_t)dstride * CSUM_W));

	csum_init(&cs, base, dstride);
	/* a lane past the end loads 0.0f, whose BF16 is 0: no term */
	for (uint64_t i = 0; i < n; i += 16)
		csum16_bits(&cs, step, bf16x16(_mm512_maskz_loadu_epi32(tail16(n - i), src + i)));
	return csum_sum(&cs);
}

AVX512 static uint64_t extract_csum_avx512(const float *src, uint16_t *out, int64_t base,
					   int64_t dstride, uint64_t n)
{
	struct csum_state cs;
	__m512i step = _mm512_set1_epi64((long long)(16 * (uint64_t)dstride * CSUM_W));

	csum_init(&cs, base, dstride);
	for (uint64_t i = 0; i < n; i += 16) {
		__mmask16 k = tail16(n - i);
		__m512i b = bf16x16(_mm512_maskz_loadu_epi32(k, src + i));

		_mm256_mask_storeu_epi16(out + i, k, _mm512_cvtepi32_epi16(b));
		csum16_bits(&cs, step, b);
	}
	return csum_sum(&cs);
}

AVX512 static uint64_t swap_csum_avx512(uint16_t *v, uint16_t *d, int64_t base, uint64_t n)
{
	struct csum_state cs;
	__m512i step = _mm512_set1_epi64((long long)(16 * CSUM_W));

	csum_init(&cs, base, 1);
	for (uint64_t i = 0; i < n; i += 16) {
		__mmask16 k = tail16(n - i);
		__m256i x = _mm256_maskz_loadu_epi16(k, v + i);

		_mm256_mask_storeu_epi16(v + i, k, _mm256_maskz_loadu_epi16(k, d + i));
		_mm256_mask_storeu_epi16(d + i, k, x);
		csum16_bits(&cs, step, _mm512_cvtepu16_epi32(x));
	}
	return csum_sum(&cs);
}

static const struct dtc_cpu_runs runs_avx512 = {
	.csum_bits = csum_bits_avx512,
	.csum_fp32 = csum_fp32_avx512,
	.extract_csum = extract_csum_avx512,
	.swap_csum = swap_csum_avx512,
};

const struct dtc_cpu_runs *dtc_cpu_runs_avx512(void)
{
	return dtc_cpu_flags_avx512() ? &runs_avx512 : NULL;
}

/* The cheap test over a block, then the full inverse over the lanes it
 * could not clear.  Leaves the block-relative indices of those lanes in
 * idx[0..*nn), their verdicts in vb (bit i % 16 of vb[i / 16]; none set
 * past *nn) and which lanes of word j they came from in need[j].  With
 * cs, adds the block's checksum terms to it (the callers pass NULL or not
 * as a constant, so the compiler leaves no test in the loop). */
AVX512 static inline __attribute__((always_inline)) void
flags_list(const struct dtc_consts *kp, const float *p, const float *m, const float *v, int nw,
	   int32_t *idx, uint16_t *vb, uint64_t *need, int *nn_out, struct csum_state *cs,
	   int64_t dstride)
{
	const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
	struct dtc_consts k = *kp;
	struct quiet_consts c = { _mm512_set1_ps((1.0f + k.q_k2) + 1.1920928955078125e-07f),
				  _mm512_set1_ps(k.q_s),
				  _mm512_set1_ps(k.q_q2), _mm512_set1_ps(k.q_eps * k.q_eps) };
	float cp[LIST], cm[LIST], cv[LIST];
	int nn = 0, padded;
	__m512i step = _mm512_set1_epi64((long long)(16 * (uint64_t)dstride * CSUM_W));

	/* Pass over the block: the cheap test; only the indices of the lanes
	 * it cannot clear are kept (compressing θ, m, v themselves costs
	 * three times as much and the list is short). */
	for (int j = 0; j < nw; j++) {
		uint64_t w = 0;

		for (int q = 0; q < 4; q++) {
			int o = 64 * j + 16 * q;
			__m512 th = _mm512_loadu_ps(p + o);
			__mmask16 nq;

			_mm_prefetch((const char *)((uintptr_t)(p + o) + PREFETCH_AHEAD), _MM_HINT_T1);
			_mm_prefetch((const char *)((uintptr_t)(m + o) + PREFETCH_AHEAD), _MM_HINT_T1);
			_mm_prefetch((const char *)((uintptr_t)(v + o) + PREFETCH_AHEAD), _MM_HINT_T1);
			nq = (__mmask16)~quiet16(&c, th, _mm512_loadu_ps(m + o),
						 _mm512_loadu_ps(v + o));
			if (cs)
				csum16(cs, step, th);
			_mm512_storeu_si512(idx + nn, _mm512_maskz_compress_epi32(
				nq, _mm512_add_epi32(iota, _mm512_set1_epi32(o))));
			nn += _mm_popcnt_u32(nq);
			w |= (uint64_t)nq << (16 * q);
		}
		need[j] = w;
	}
	/* Gather the list (still in L1), padded with zeros to whole vectors;
	 * the padding's verdicts are cleared. */
	padded = (nn + 15) & ~15;
	for (int i = 0; i < nn; i++) {
		cp[i] = p[idx[i]];
		cm[i] = m[idx[i]];
		cv[i] = v[idx[i]];
	}
	for (int i = nn; i < padded; i++)
		cp[i] = cm[i] = cv[i] = 0.0f;
	for (int i = 0; i < padded / 16; i++)
		vb[i] = decide16(&k, cp + 16 * i, cm + 16 * i, cv + 16 * i);
	if (nn % 16)
		vb[nn / 16] &= (uint16_t)((1u << (nn % 16)) - 1);
	memset(vb + padded / 16, 0, 8 * sizeof(vb[0]));
	*nn_out = nn;
}

/* Deposit: word j's verdicts are the next popcount(need[j]) bits of the
 * list, in order; pdep puts them on the lanes they came from. */
AVX512 static inline void deposit(const uint16_t *vb, const uint64_t *need, int nw, uint64_t *out)
{
	uint64_t off = 0;

	for (int j = 0; j < nw; j++) {
		uint64_t lo, hi, s = off % 16;

		memcpy(&lo, vb + off / 16, sizeof(lo));
		memcpy(&hi, vb + off / 16 + 4, sizeof(hi));
		out[j] = _pdep_u64(s ? lo >> s | hi << (64 - s) : lo, need[j]);
		off += (uint64_t)_mm_popcnt_u64(need[j]);
	}
}

AVX512 static void flags_avx512(const struct dtc_consts *k, const float *p, const float *m,
				const float *v, int nw, uint64_t *out)
{
	/* +16: each compress stores a whole vector past the list's end */
	int32_t idx[LIST + 16];
	uint16_t vb[LIST / 16 + 8];	/* verdict bits, read 64 at a time */
	uint64_t need[DTC_CPU_BLOCK_WORDS];
	int nn;

	flags_list(k, p, m, v, nw, idx, vb, need, &nn, NULL, 0);
	deposit(vb, need, nw, out);
}

/* ---- one-pass detect block ---------------------------------------------
 * After the verdicts, while the block is in L1: the changed lanes' gap
 * codes and values, taken from the verdict list 16 at a time (emit_list;
 * with marks ORed in, set bit by set bit: an emitter that visits every
 * lane measured slower than either), then, when asked, the checksum
 * terms of every lane, 16 at a time: BF16 by dtc_bf16_rne()'s integer
 * steps, then each times its index's key (csum_avx512). */
#define AVX512DQ __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,bmi2,popcnt")))

/* Append the changed lanes of a block, given as a sorted list of
 * block-relative indices, to s: values by gather, gaps 16 at a time as
 * single bytes where all 16 fit one (gaps of a few percent of lanes mostly
 * do), else one by one.  The first gap is from s->next, a box position. */
AVX512 static void emit_list(struct dtc_cpu_emit *s, const int32_t *cpos, int c, uint64_t pos,
			     const float *p)
{
	uint8_t *g = s->gap + s->ngap;
	uint16_t *val = s->val + s->nval;

	if (c == 0)
		return;
	for (int i = 0; i < c; i += 16) {
		__mmask16 live = c - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (c - i)) - 1);
		__m512i ix = _mm512_maskz_loadu_epi32(live, cpos + i);
		__m512i th = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, ix, p, 4);

		/* whole 32-byte store: the tail is overwritten or past nval */
		_mm256_storeu_si256((__m256i *)(val + i), _mm512_cvtepi32_epi16(bf16x16(th)));
	}
	g += dtc_cpu_put_gap(g, pos + (uint64_t)cpos[0] - s->next);
	for (int i = 1; i < c; i += 16) {
		int n = c - i >= 16 ? 16 : c - i;
		__mmask16 live = (__mmask16)((1u << n) - 1);
		__m512i gap = _mm512_sub_epi32(_mm512_sub_epi32(_mm512_maskz_loadu_epi32(live, cpos + i),
								_mm512_maskz_loadu_epi32(live, cpos + i - 1)),
					       _mm512_set1_epi32(1));

		if (!_mm512_mask_cmpge_epu32_mask(live, gap, _mm512_set1_epi32(128))) {
			_mm_storeu_si128((__m128i *)g, _mm512_cvtepi32_epi8(gap));
			g += n;
		} else {
			for (int t = i; t < i + n; t++)
				g += dtc_cpu_put_gap(g, (uint64_t)(cpos[t] - cpos[t - 1] - 1));
		}
	}
	s->ngap = (size_t)(g - s->gap);
	s->nval += (size_t)c;
	s->next = pos + (uint64_t)cpos[c - 1] + 1;
}

AVX512DQ static uint64_t detect_avx512(const struct dtc_consts *k, const float *p, const float *m,
				       const float *v, int nw, const uint64_t *mark, uint64_t pos,
				       int64_t dbase, int64_t dstride, int csum,
				       struct dtc_cpu_emit *s)
{
	int32_t idx[LIST + 16], cpos[LIST + 16];
	uint16_t vb[LIST / 16 + 8];
	uint64_t need[DTC_CPU_BLOCK_WORDS];
	struct csum_state cs;
	uint64_t sum = 0;
	int nn, c = 0;

	if (csum) {
		csum_init(&cs, dbase, dstride);
		flags_list(k, p, m, v, nw, idx, vb, need, &nn, &cs, dstride);
		sum = csum_sum(&cs);
	} else {
		flags_list(k, p, m, v, nw, idx, vb, need, &nn, NULL, 0);
	}
	if (mark) {
		uint64_t blk[DTC_CPU_BLOCK_WORDS];

		deposit(vb, need, nw, blk);
		for (int j = 0; j < nw; j++)
			dtc_cpu_emit_word(s, blk[j] | mark[j], pos + 64 * (uint64_t)j, p + 64 * j);
	} else {
		/* the changed lanes: the list compressed by its verdicts */
		for (int i = 0; i < nn; i += 16) {
			__mmask16 f = vb[i / 16];

			_mm512_storeu_si512(cpos + c, _mm512_maskz_compress_epi32(
				f, _mm512_loadu_si512(idx + i)));
			c += _mm_popcnt_u32(f);
		}
		emit_list(s, cpos, c, pos, p);
	}
	return sum;
}

dtc_cpu_detect_fn dtc_cpu_detect_avx512(void)
{
	__builtin_cpu_init();
	if (dtc_cpu_flags_avx512() && __builtin_cpu_supports("avx512dq"))
		return detect_avx512;
	return NULL;
}

dtc_cpu_flags_fn dtc_cpu_flags_avx512(void)
{
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("bmi2") &&
	    __builtin_cpu_supports("popcnt"))
		return flags_avx512;
	return NULL;
}

#else

dtc_cpu_flags_fn dtc_cpu_flags_avx512(void)
{
	return NULL;
}

dtc_cpu_detect_fn dtc_cpu_detect_avx512(void)
{
	return NULL;
}

const struct dtc_cpu_runs *dtc_cpu_runs_avx512(void)
{
	return NULL;
}

#endif

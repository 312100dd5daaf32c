/* gpu/cpu_kernels.h — the contract between the cpu backend (gpu/cpu.c)
 * and its instruction-set kernels (gpu/cpu_avx512.c): the kernels'
 * signatures, the detect's output state and its inline emitters, and the
 * AVX-512 entry points.  The kernels see this and nothing of gpu/cpu.c;
 * the backend picks among them (gpu/cpu.h). */
#ifndef DTC_CPU_KERNELS_H
#define DTC_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include "gpu/elem.h"

/* Bitmap words one call of a flags kernel decides at most. */
#define DTC_CPU_BLOCK_WORDS 16

/* Verdicts (dtc_adamw_flag) for nw <= DTC_CPU_BLOCK_WORDS words of 64
 * consecutive elements, one bitmap word each. */
typedef void (*dtc_cpu_flags_fn)(const struct dtc_consts *k, const float *p, const float *m,
				 const float *v, int nw, uint64_t *out);

/* The AVX-512 kernel (gpu/cpu_avx512.c), or NULL where this build or this
 * CPU cannot run it. */
dtc_cpu_flags_fn dtc_cpu_flags_avx512(void);

/* ---- one-pass detect (dtc_detect) ---------------------------------------
 * A thread's output: the gap codes (gpu/codec.h) and BF16 values of the
 * positions it emits, kept apart, each gap taken from `next` (the last
 * position + 1; `start` before the first, so the first code is re-encoded
 * from the previous part's last position when the parts are joined). */
struct dtc_cpu_emit {
	uint8_t *gap;
	uint16_t *val;
	size_t ngap, gcap;	/* bytes */
	size_t nval, vcap;	/* values: the part's count */
	uint64_t start;		/* the part's first box position */
	uint64_t next;
};

/* Room a block of nw words may use past ngap / nval: one gap code of any
 * size, the others under 64·nw (2 bytes), and a whole vector store. */
#define DTC_CPU_GAP_ROOM(nw)	(2 * 64 * (size_t)(nw) + 11 + 64)
#define DTC_CPU_VAL_ROOM(nw)	(64 * (size_t)(nw) + 32)

/* Detect nw <= DTC_CPU_BLOCK_WORDS words of 64 consecutive elements at box
 * position pos (a multiple of 64): the verdicts of the flags kernels, ORed
 * with mark[0..nw) when mark is not NULL, appended to s as gap codes and
 * values (the caller reserved DTC_CPU_*_ROOM(nw)).  With csum set, returns
 * Σ dtc_csum_term(dbase + i·dstride, bf16(p[i])) over the 64·nw elements
 * (mod 2^64), else 0. */
typedef uint64_t (*dtc_cpu_detect_fn)(const struct dtc_consts *k, const float *p, const float *m,
				      const float *v, int nw, const uint64_t *mark, uint64_t pos,
				      int64_t dbase, int64_t dstride, int csum,
				      struct dtc_cpu_emit *s);

/* The AVX-512 detect block (gpu/cpu_avx512.c), or NULL as above. */
dtc_cpu_detect_fn dtc_cpu_detect_avx512(void);

/* Row kernels of the checksum outside the detect, each returning
 * Σ dtc_csum_term(base + i·dstride, value i) over n values (mod 2^64):
 *   csum_bits     values b[i] (BF16 bits, unit stride)
 *   csum_fp32     values dtc_bf16_rne(src[i])
 *   extract_csum  the same, also writing them to out[i]
 *   swap_csum     values v[i], traded with d[i] (dstride 1: d[i] gets
 *                 v[i], v[i] gets the old d[i]); v and d never overlap */
struct dtc_cpu_runs {
	uint64_t (*csum_bits)(const uint16_t *b, int64_t base, int64_t dstride, uint64_t n);
	uint64_t (*csum_fp32)(const float *src, int64_t base, int64_t dstride, uint64_t n);
	uint64_t (*extract_csum)(const float *src, uint16_t *out, int64_t base, int64_t dstride,
				 uint64_t n);
	uint64_t (*swap_csum)(uint16_t *v, uint16_t *d, int64_t base, uint64_t n);
};

/* The AVX-512 row kernels (gpu/cpu_avx512.c), or NULL where this build
 * or this CPU cannot run them. */
const struct dtc_cpu_runs *dtc_cpu_runs_avx512(void);


/* The gap code of gpu/codec.h (tests hold it to dtc_sparse_encode()). */
static inline size_t dtc_cpu_put_gap(uint8_t *g, uint64_t gap)
{
	size_t n = 1;

	if (gap < 128) {
		g[0] = (uint8_t)gap;
		return 1;
	}
	if (gap < 128 + 16384) {
		gap -= 128;
		g[0] = (uint8_t)(0x80 | (gap >> 8));
		g[1] = (uint8_t)gap;
		return 2;
	}
	g[0] = 0xC0;
	while (gap >= 0x80) {
		g[n++] = (uint8_t)(gap | 0x80);
		gap >>= 7;
	}
	g[n++] = (uint8_t)gap;
	return n;
}

/* Append the set bits of one word at box position pos, values from p. */
static inline void dtc_cpu_emit_word(struct dtc_cpu_emit *s, uint64_t bits, uint64_t pos,
				     const float *p)
{
	uint8_t *g = s->gap + s->ngap;
	uint16_t *val = s->val + s->nval;
	uint64_t next = s->next;

	while (bits) {
		int i = __builtin_ctzll(bits);

		bits &= bits - 1;
		g += dtc_cpu_put_gap(g, pos + (uint64_t)i - next);
		*val++ = dtc_bf16_rne(p[i]);
		next = pos + (uint64_t)i + 1;
	}
	s->ngap = (size_t)(g - s->gap);
	s->nval = (size_t)(val - s->val);
	s->next = next;
}

#endif

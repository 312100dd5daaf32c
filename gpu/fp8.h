/* gpu/fp8.h — FP8 (E4M3FN) block quantization as the engines do it.
 *
 * An FP8 sink holds a weight as float8_e4m3fn codes plus one FP32 scale per
 * block (`weight_scale_inv`, dequant = code * scale), and its content is
 * defined by the engine: the codes and scales must be bit for bit what the
 * engine's own quantizer makes of the BF16 weight.  Those quantizers
 * (docs/INTEGRATION.md, "FP8 block-scaled weights") all compute, per block
 * of block_rows x block_cols elements (edge blocks partial; the engines pad
 * with zeros, which cannot change a block's amax):
 *
 *     amax  = max |x| over the block, as FP32, clamped below at
 *             1e-4 (FP32), NaN propagating           (torch amax + clamp)
 *     scale = amax / 448                             (FP32 division)
 *           | amax * RN32(1/448)          DTC_FP8_SCALE_RECIP
 *     scale = ceil_to_ue8m0(scale)                   DTC_FP8_UE8M0
 *           | pow(2, ceil(log2(scale)))              DTC_FP8_UE8M0_LOG2
 *     code  = e4m3fn(RN32(x * RN32(1 / scale)))      (torch's FP32 cast)
 *
 * with e4m3fn() PyTorch's conversion (dtc_fp8_e4m3fn_rne below).  The
 * element math is inline and host/device like gpu/elem.h, so a CUDA
 * quantizer can share it; compile with -ffp-contract=off / --fmad=false.
 *
 * Matrices are row-major [rows, cols] (an engine weight is [N, K]: output
 * rows, input columns); scales are row-major
 * [ceil(rows/block_rows), ceil(cols/block_cols)], the layout both engines
 * hold `weight_scale_inv` in before any DeepGEMM re-layout.
 */
#ifndef DTC_FP8_H
#define DTC_FP8_H

#include <stdint.h>
#include "gpu/elem.h"

/* Largest finite E4M3FN value and the engines' amax floor (the FP32
 * nearest to 1e-4, as torch's clamp converts its scalar). */
#define DTC_FP8_MAX		448.0f
#define DTC_FP8_AMAX_MIN	1e-4f
#define DTC_FP8_BLOCK		128u	/* weight_block_size [128, 128] */

/* Where the engines differ (docs/INTEGRATION.md says which sets which). */
enum dtc_fp8_flags {
	/* Power-of-two scales: DeepGEMM's ceil_to_ue8m0 (round the scale up
	 * to 2^e, e clamped to [-126, 127]).  SGLang's per_block_cast_to_fp8
	 * always (vLLM's use_ue8m0=True is DTC_FP8_UE8M0_LOG2). */
	DTC_FP8_UE8M0 = 1u << 0,
	/* scale = amax * RN32(1/448) instead of amax / 448: vLLM's compiled
	 * per_block_cast_to_fp8 on a non-CPU device, where inductor replaces a
	 * division by a constant with a multiplication by its reciprocal. */
	DTC_FP8_SCALE_RECIP = 1u << 1,
	/* Power-of-two scales as vLLM's use_ue8m0=True computes them,
	 * torch.pow(2, ceil(log2(scale))) (vllm/utils/deep_gemm.py
	 * _ceil_to_ue8m0): the same as DTC_FP8_UE8M0 for every block of finite
	 * BF16 (amax/448 is then a normal FP32 well inside [2^-126, 2^127]),
	 * but a NaN or Inf scale stays NaN / Inf.  Not with DTC_FP8_UE8M0. */
	DTC_FP8_UE8M0_LOG2 = 1u << 2,
	/* dtc_fp8_requant() only: round each dequantized value to BF16 before
	 * quantizing again, as SGLang's requant_weight_ue8m0 does
	 * (block_quant_dequant(..., torch.bfloat16)); vLLM's
	 * requant_weight_ue8m0_inplace keeps FP32. */
	DTC_FP8_DEQUANT_BF16 = 1u << 3,
};
#define DTC_FP8_FLAGS_ALL	(DTC_FP8_UE8M0 | DTC_FP8_SCALE_RECIP | DTC_FP8_UE8M0_LOG2)

/* FP32 -> float8_e4m3fn exactly as torch 2.13 casts it
 * (torch/headeronly/util/Float8_e4m3fn.h, fp8e4m3fn_from_fp32_value):
 * round to nearest, ties to even; finite values at or above 480 and ±Inf
 * saturate to ±448 (0x7e), as do values that round up to 480 ([464, 480):
 * 464 itself ties to the even 448); NaN -> 0x7f with its sign; below 2^-6
 * the subnormal step 2^-9 is reached by one FP32 addition of 2^14, which
 * rounds to nearest even; -0 -> 0x80. */
DTC_HD static inline uint8_t dtc_fp8_e4m3fn_rne(float f)
{
	const uint32_t fp8_max = UINT32_C(1087) << 20;		/* 480.0f */
	const uint32_t denorm_mask = UINT32_C(141) << 23;	/* 2^14 */
	uint32_t u = dtc_f32_bits(f);
	uint32_t sign = u & UINT32_C(0x80000000);
	uint8_t r;

	u ^= sign;
	if (u >= fp8_max) {
		r = u > UINT32_C(0x7f800000) ? 0x7f : 0x7e;
	} else if (u < (UINT32_C(121) << 23)) {
		u = dtc_f32_bits(dtc_bits_f32(u) + dtc_bits_f32(denorm_mask));
		r = (uint8_t)(u - denorm_mask);
	} else {
		uint32_t mant_odd = (u >> 20) & 1u;

		u += ((uint32_t)(7 - 127) << 23) + UINT32_C(0x7ffff);
		u += mant_odd;
		r = (uint8_t)(u >> 20);
		if (r == 0x7f)
			r = 0x7e;
	}
	return (uint8_t)(r | (sign >> 24));
}

/* float8_e4m3fn -> FP32 (exact; 0x7f/0xff are NaN). */
DTC_HD static inline float dtc_fp8_e4m3fn_f32(uint8_t c)
{
	uint32_t sign = (uint32_t)(c & 0x80u) << 24;
	uint32_t e = (c >> 3) & 0xfu, m = c & 7u;

	if (e == 0xfu && m == 7u)
		return dtc_bits_f32(sign | UINT32_C(0x7fc00000));
	if (e == 0)	/* m * 2^-9, exact in FP32 */
		return dtc_bits_f32(dtc_f32_bits((float)m * 0.001953125f) | sign);
	return dtc_bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

/* DeepGEMM's ceil_to_ue8m0 (deep_gemm/utils/math.py; SGLang's copy in
 * fp8_utils.py): 2^(biased exponent of |x|, plus one if any mantissa bit
 * is set), the exponent clamped to [1, 254].  On bits, so NaN -> 2^127. */
DTC_HD static inline float dtc_fp8_ceil_ue8m0(float x)
{
	uint32_t b = dtc_f32_bits(x) & UINT32_C(0x7fffffff);
	uint32_t e = ((b >> 23) & 0xffu) + ((b & UINT32_C(0x7fffff)) != 0);

	e = e < 1 ? 1 : e > 254 ? 254 : e;
	return dtc_bits_f32(e << 23);
}

/* 2^ceil(log2 |x|) with IEEE log2/pow semantics: NaN and Inf pass
 * (as |x|), 0 -> 0, no exponent clamp (2^128 overflows to Inf). */
DTC_HD static inline float dtc_fp8_ceil_pow2(float x)
{
	uint32_t b = dtc_f32_bits(x) & UINT32_C(0x7fffffff);
	float p;

	if (b >= UINT32_C(0x7f800000) || b == 0)
		return dtc_bits_f32(b);
	if (b >= UINT32_C(0x00800000)) {	/* normal: as ceil_ue8m0, unclamped */
		uint32_t e = (b >> 23) + ((b & UINT32_C(0x7fffff)) != 0);

		return e > 254 ? dtc_bits_f32(UINT32_C(0x7f800000)) : dtc_bits_f32(e << 23);
	}
	for (p = 0x1p-149f; dtc_f32_bits(p) < b; p *= 2.0f)	/* subnormal */
		;
	return p;
}

/* A block's scale from the max |x| of its elements (NaN if any was NaN). */
DTC_HD static inline float dtc_fp8_block_scale(float amax, unsigned flags)
{
	float sf;

	if (amax < DTC_FP8_AMAX_MIN)	/* clamp(1e-4): NaN stays NaN */
		amax = DTC_FP8_AMAX_MIN;
	if (flags & DTC_FP8_SCALE_RECIP)
		sf = amax * (float)(1.0 / 448.0);
	else
		sf = amax / DTC_FP8_MAX;
	if (flags & DTC_FP8_UE8M0_LOG2)
		return dtc_fp8_ceil_pow2(sf);
	return flags & DTC_FP8_UE8M0 ? dtc_fp8_ceil_ue8m0(sf) : sf;
}

/* torch's max over |x| propagates NaN (the first one seen is kept). */
DTC_HD static inline float dtc_fp8_amax_step(float amax, float x)
{
	float a = dtc_fabsf(x);

	return (a > amax || a != a) && amax == amax ? a : amax;
}

/* One element's code given its block's reciprocal scale (1.0f / scale). */
DTC_HD static inline uint8_t dtc_fp8_code(uint16_t bf16, float rscale)
{
	return dtc_fp8_e4m3fn_rne(dtc_bf16_f32(bf16) * rscale);
}

/* Out-of-line copies for callers without the header (ctypes). */
uint8_t dtc_fp8_e4m3fn_from_f32(float f);
float dtc_fp8_e4m3fn_to_f32(uint8_t code);

/* Quantize a row-major BF16 matrix w [rows, cols] (leading dimension ld
 * >= cols, in elements) into codes [rows, cols] (dense, row-major) and
 * scales [ceil(rows/block_rows), ceil(cols/block_cols)].  DTC_EINVAL for
 * NULL pointers, zero block sizes, ld < cols, unknown flags or sizes whose
 * product overflows; nothing is written then. */
int dtc_fp8_quantize_bf16(const uint16_t *w, uint64_t rows, uint64_t cols, uint64_t ld,
			  uint32_t block_rows, uint32_t block_cols, unsigned flags,
			  uint8_t *codes, float *scales);

/* Quantize again what codes [rows, cols] x scales (as above) dequantize
 * to, FP32 code * scale (rounded to BF16 with DTC_FP8_DEQUANT_BF16), with
 * the scale rule in flags: what the engines do to block-FP8 weights
 * after loading for DeepGEMM's UE8M0 kernels (vLLM
 * requant_weight_ue8m0_inplace: DTC_FP8_UE8M0_LOG2; SGLang
 * requant_weight_ue8m0: DTC_FP8_UE8M0 | DTC_FP8_DEQUANT_BF16).  The
 * outputs may be the inputs (in place).  Errors as dtc_fp8_quantize_bf16. */
int dtc_fp8_requant(const uint8_t *codes, const float *scales, uint64_t rows, uint64_t cols,
		    uint32_t block_rows, uint32_t block_cols, unsigned flags,
		    uint8_t *codes_out, float *scales_out);

/* What one BF16 update does to the FP8 form of a matrix. */
struct dtc_fp8_diff {
	uint64_t bf16_changed;		/* elements whose BF16 bits differ */
	uint64_t codes_changed;		/* elements whose FP8 code differs */
	uint64_t blocks;		/* blocks in the matrix */
	uint64_t scales_changed;	/* blocks whose scale bits differ */
	uint64_t blocks_changed;	/* blocks with a changed code or scale */
};

/* Compare the FP8 forms of old_w and new_w (same shape, both leading
 * dimension ld) without materializing either: a block whose amax is the
 * same keeps its scale, so only its elements whose BF16 bits changed are
 * re-quantized; a block whose scale changed is re-quantized whole.  If
 * `changed` is not NULL it receives a bitmap over the rows x cols codes
 * (bit p of word p/64, p = row * cols + col; (rows*cols+63)/64 words,
 * fully written); if `scale_changed` is not NULL, one byte per block
 * (row-major, 1 = the scale changed).  Errors as dtc_fp8_quantize_bf16. */
int dtc_fp8_diff_bf16(const uint16_t *old_w, const uint16_t *new_w, uint64_t rows,
		      uint64_t cols, uint64_t ld, uint32_t block_rows, uint32_t block_cols,
		      unsigned flags, uint64_t *changed, uint8_t *scale_changed,
		      struct dtc_fp8_diff *out);

/* Snapshot-free FP8 detect: which FP8 codes and block scales of a matrix
 * may differ between θ_{t-1} and θ_t, from θ_t and the optimizer's new
 * moments alone (the AdamW inversion of gpu/elem.h), without ever missing
 * one.
 *
 * The guard.  For every element the BF16 detect's interval [θ̂−e, θ̂+e]
 * holds θ_{t-1} (dtc_guard_bound; dtc_adamw_quiet and dtc_adamw_still
 * prove it exactly where they answer), so its old BF16 lies in
 * [RNE(θ̂−e), RNE(θ̂+e)] = [lo, hi]: RNE is monotone.  Everything after is
 * monotone too: |x| bounds the old block amax in [max lo_abs, max hi_abs];
 * the block scale (clamp, division or product, power-of-two ceilings) is a
 * non-decreasing function of the amax, so if both ends give the same scale
 * bits, that is the old scale; and with one scale, code(x) =
 * e4m3fn(RN32(x * RN32(1/s))) is non-decreasing in x, so if code(lo) ==
 * code(hi) every old value in between had that code.  The one place
 * monotonicity says nothing is the sign of zero (0x00 and 0x80 are one
 * value): an interval that reaches zero from both sides is always flagged.
 * A block is sent whole (`whole`) when its new scale differs from the old
 * or the old one is not pinned to one value, or an element of it is not
 * finite (NaN/Inf in θ_t or in the reconstruction); otherwise only its
 * codes that may differ are flagged.  Flags as dtc_fp8_quantize_bf16's;
 * the second quantization (dtc_fp8_requant) is not covered.
 */
struct dtc_consts;

struct dtc_fp8_detect {
	uint64_t blocks;	/* blocks in the matrix */
	uint64_t whole;		/* blocks to send whole */
	uint64_t codes;		/* codes flagged outside whole blocks */
	uint64_t bf16;		/* elements the BF16 detect flags (dtc_adamw_flag) */
};

/* theta, m, v: row-major [rows, cols] FP32 with leading dimension ld.
 * `changed` (may be NULL): bitmap over rows x cols as dtc_fp8_diff_bf16's,
 * bits only outside whole blocks; `whole` (may be NULL): one byte per
 * block, row-major.  DTC_EINVAL as dtc_fp8_quantize_bf16, or for
 * DTC_FP8_DEQUANT_BF16; DTC_ENOMEM. */
int dtc_fp8_detect_adamw(const struct dtc_consts *k, const float *theta, const float *m,
			 const float *v, uint64_t rows, uint64_t cols, uint64_t ld,
			 uint32_t block_rows, uint32_t block_cols, unsigned flags,
			 uint64_t *changed, uint8_t *whole, struct dtc_fp8_detect *out);

/* What a source sends an FP8 sink (daemon/layout/plan.h, dte_fp8_split):
 * the 16-bit units of one element box [rows, cols] of θ (host FP32 at
 * src_offset with strides src_stride[0..1] in theta[0 .. src_len)),
 * quantized by flags as dtc_fp8_quantize_bf16 does RNE-BF16(θ):
 *     codes   rows x cols/2 units, row-major: codes 2j and 2j+1 of a row,
 *             the first in the low byte (cols even);
 *     scales  ceil(rows/128) x ceil(cols/128) x 2 units: each 128 x 128
 *             block's FP32 scale, its low half first.
 * With k (a sparse version; m and v at the same map), code_changed and
 * scale_changed (bitmaps over those units, fully written) flag every unit
 * that may differ from what the same quantizer made of θ_{t-1}
 * (dtc_fp8_detect_adamw: a code that may change flags its unit; a block
 * whose scale may change flags all of its units and its scale's two), and
 * *det adds up that detect's counts; k NULL: neither is read or written.
 * Works in strips of 128 rows (a few MB whatever the box).  DTC_EINVAL,
 * DTC_EBOX (the map leaves theta), DTC_ENOMEM. */
int dtc_fp8_box_units(const struct dtc_consts *k, const float *theta, const float *m,
		      const float *v, uint64_t src_len, int64_t src_offset,
		      const int64_t src_stride[2], uint64_t rows, uint64_t cols, unsigned flags,
		      uint16_t *codes, uint16_t *scales, uint64_t *code_changed,
		      uint64_t *scale_changed, struct dtc_fp8_detect *det);

/* FP8 delta payload of one matrix [rows, cols] with blocks
 * block_rows x block_cols (the FP8 twin of gpu/codec.h's sparse payload):
 *     nwhole      LEB128 varint
 *     blocks      nwhole gap codes over the block grid (row-major index)
 *     count       LEB128 varint
 *     positions   count gap codes over rows x cols (row-major), none in a
 *                 whole block
 *     scales      nwhole FP32 scales, little-endian
 *     block codes each whole block's codes, row-major within the block
 *                 (edge blocks partial)
 *     codes       count FP8 codes, one byte each
 * A whole block carries its new scale and every code; a flagged code
 * elsewhere keeps its block's scale.  Gap codes as gpu/codec.h. */
size_t dtc_fp8_delta_bound(uint64_t rows, uint64_t cols, uint32_t block_rows,
			   uint32_t block_cols, uint64_t nwhole, uint64_t count);

/* Encode from the new BF16 matrix w (leading dimension ld), `changed`
 * and `whole` as dtc_fp8_detect_adamw writes them (bits inside whole
 * blocks are ignored); codes and scales computed as
 * dtc_fp8_quantize_bf16 with `flags`.  When that payload would be no
 * smaller than every block whole (a dense version: 1 + 4 bytes a block
 * besides its codes, plus the two counts), that is what it writes. */
int dtc_fp8_delta_encode(const uint16_t *w, uint64_t rows, uint64_t cols, uint64_t ld,
			 uint32_t block_rows, uint32_t block_cols, unsigned flags,
			 const uint64_t *changed, const uint8_t *whole, uint8_t *out,
			 size_t cap, size_t *outlen);

/* Check the whole payload first (hostile input: DTC_ETRUNC, DTC_ECORRUPT,
 * DTC_ERANGE, as gpu/codec.h; nothing written then), then write it into
 * codes [rows, cols] (leading dimension ld) and scales
 * [ceil(rows/br), ceil(cols/bc)] row-major.  *ncodes / *nwhole (may be
 * NULL) receive what it wrote. */
int dtc_fp8_delta_apply(const uint8_t *in, size_t len, uint64_t rows, uint64_t cols,
			uint64_t ld, uint32_t block_rows, uint32_t block_cols, uint8_t *codes,
			float *scales, uint64_t *ncodes, uint64_t *nwhole);

/* The undo of a payload, before it is applied: `out` (cap >= len bytes)
 * receives the same payload with every value replaced by what codes and
 * scales hold there now, so applying `out` afterwards restores them bit
 * for bit.  Checks as dtc_fp8_delta_apply; codes and scales are only read. */
int dtc_fp8_delta_invert(const uint8_t *in, size_t len, uint64_t rows, uint64_t cols,
			 uint64_t ld, uint32_t block_rows, uint32_t block_cols,
			 const uint8_t *codes, const float *scales, uint8_t *out, size_t cap);

/* The verify that reads memory: over the places the payload writes, the
 * element checksum (gpu/elem.h) of what codes and scales hold
 * (*sum_memory) and of the payload's own values (*sum_payload); after an
 * apply they are equal unless a write went missing or astray.  A code's
 * key is its row-major position in the rows x cols matrix, a scale's two
 * 16-bit halves take keys of their own (2^62 + 2·block, + 1). */
int dtc_fp8_delta_csum(const uint8_t *in, size_t len, uint64_t rows, uint64_t cols,
		       uint64_t ld, uint32_t block_rows, uint32_t block_cols,
		       const uint8_t *codes, const float *scales, uint64_t *sum_memory,
		       uint64_t *sum_payload);

#endif

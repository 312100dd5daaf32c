/* gpu/elem.h — the element math, shared by the C backends and nvcc.
 *
 * Everything that decides a bit of output lives here, once: BF16 rounding,
 * the AdamW inverse for both forward variants, the guard that turns an
 * inexact inverse into a "provably unchanged / maybe changed" verdict, and
 * the checksum mix.  The CPU backend is the reference for the CUDA one, so
 * both must evaluate exactly these FP32 operations in exactly this order:
 * compile with -ffp-contract=off (cc) and --fmad=false (nvcc); a fused
 * multiply-add would round differently from torch's CPU arithmetic.
 */
#ifndef DTC_ELEM_H
#define DTC_ELEM_H

#include <stdint.h>

#ifdef __CUDACC__
#define DTC_HD __host__ __device__
#else
#define DTC_HD
#endif

/* Which forward the trainer ran; the inverse mirrors its FP32 op order. */
enum dtc_variant {
	DTC_VARIANT_TORCH = 0,	/* torch.optim.AdamW: single-tensor, foreach */
	DTC_VARIANT_FUSED = 1,	/* Apex / TransformerEngine FusedAdam, adam_w_mode */
};

/* Per-step FP32 constants, derived on the host from the group's
 * hyper-parameters exactly as the forward derives them (hparams.c), so
 * the per-element code below does no double arithmetic. */
struct dtc_consts {
	int32_t variant;	/* enum dtc_variant */
	float decay;		/* torch: 1 - lr*wd, the multiplier applied to θ first */
	float inv_decay;	/* 1 / decay, for the inverse */
	float neg_step;		/* torch: -(lr / (1 - β1^t)) */
	float bc2_sqrt;		/* torch: sqrt(1 - β2^t) */
	float bc1;		/* fused: 1 - β1^t */
	float bc2;		/* fused: 1 - β2^t */
	float eps;
	float lr;		/* fused: lr as the kernel sees it */
	float wd;		/* fused: weight decay as the kernel sees it */
	/* dtc_adamw_quiet(): |u| <= q_s·|m| / max(sqrt(v)/sqrt(1/q_q2), q_eps),
	 * step bound |Δθ| <= q_k1·|u| + q_k2·|θ_t|, all rounded to the safe side. */
	float q_s;		/* S·k1, padded up */
	float q_q2;		/* Q², padded down */
	float q_eps;		/* eps, or 0 when too small to use safely */
	float q_k2;
	/* dtc_adamw_still(): exact verdicts where the step is exactly ±0. */
	int32_t still_pos0;	/* θ_t = +0 with u = −0 proves θ_{t-1} = +0 */
	int32_t still_nodecay;	/* weight decay 0: u = ±0 leaves a normal θ as it was */
};

DTC_HD static inline uint32_t dtc_f32_bits(float x)
{
	union { float f; uint32_t u; } c;

	c.f = x;
	return c.u;
}

DTC_HD static inline float dtc_bits_f32(uint32_t u)
{
	union { float f; uint32_t u; } c;

	c.u = u;
	return c.f;
}

/* FP32 -> BF16, round to nearest, ties to even.  Adding 0x7fff plus the
 * lowest kept bit carries into the kept half exactly when the dropped half
 * is above the midpoint (or at it with an odd kept bit); the carry moves
 * the largest finite values to Inf, as RNE must.  NaN is kept a NaN with
 * its sign and forced quiet (the carry could otherwise make it Inf). */
DTC_HD static inline uint16_t dtc_bf16_rne(float x)
{
	uint32_t u = dtc_f32_bits(x);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x0040u);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

DTC_HD static inline float dtc_bf16_f32(uint16_t b)
{
	return dtc_bits_f32((uint32_t)b << 16);
}

DTC_HD static inline float dtc_fabsf(float x)
{
	return dtc_bits_f32(dtc_f32_bits(x) & 0x7fffffffu);
}

DTC_HD static inline int dtc_f32_finite(float x)
{
	return (dtc_f32_bits(x) & 0x7f800000u) != 0x7f800000u;
}

/* Correctly rounded sqrt on both sides (IEEE, like torch's vsqrtps). */
#ifdef __CUDA_ARCH__
#define DTC_SQRTF(x) __fsqrt_rn(x)
#else
#define DTC_SQRTF(x) __builtin_sqrtf(x)
#endif

/* The θ-independent part of the step, as the forward computed it, signed
 * so that θ_t = decay(θ_{t-1}) + u.
 *   torch:  D = sqrt(v)/sqrt(bc2) + eps;  u = (-step_size * m) / D
 *   fused:  D = sqrt(v/bc2) + eps;        u = -(lr * ((m/bc1) / D))
 * (torch's addcdiv evaluates value*t1/t2 left to right; FusedAdam's
 * decay*θ_old term is folded back in by the inverse's 1/decay.) */
DTC_HD static inline float dtc_adamw_u_torch(const struct dtc_consts *k, float m, float v)
{
	float d = DTC_SQRTF(v) / k->bc2_sqrt + k->eps;

	return (k->neg_step * m) / d;
}

DTC_HD static inline float dtc_adamw_u_fused(const struct dtc_consts *k, float m, float v)
{
	float mhat = m / k->bc1;
	float vhat = v / k->bc2;
	float d = DTC_SQRTF(vhat) + k->eps;

	return -(k->lr * (mhat / d));
}

DTC_HD static inline float dtc_adamw_u(const struct dtc_consts *k, float m, float v)
{
	return k->variant == DTC_VARIANT_FUSED ? dtc_adamw_u_fused(k, m, v)
					       : dtc_adamw_u_torch(k, m, v);
}

/* Forward parameter update from θ_{t-1} and the new moments, mirroring
 * the trainer's FP32 order (used by tests and fixtures, not by detect). */
DTC_HD static inline float dtc_adamw_forward(const struct dtc_consts *k, float theta_prev,
					     float m, float v)
{
	if (k->variant == DTC_VARIANT_FUSED) {
		float mhat = m / k->bc1;
		float vhat = v / k->bc2;
		float d = DTC_SQRTF(vhat) + k->eps;
		float update = mhat / d + k->wd * theta_prev;

		return theta_prev - k->lr * update;
	}
	return theta_prev * k->decay + dtc_adamw_u(k, m, v);
}

/* The reconstruction θ̂ of θ_{t-1}, its error bound, and the verdict.
 *
 * Bound (torch; fused is the same shape).  The forward rounds twice,
 * θd = θ_{t-1}·c (1+δ1) and θ_t = (θd + u)(1+δ2), and u is reproduced
 * exactly, so θ_{t-1} = (θ_t − u − r2 − r1)/c with |r1| ≤ ulp(θd)/2,
 * |r2| ≤ ulp(θ_t)/2.  Our θ̂ = fl(fl(θ_t − u)·fl(1/c)) adds ulp(a)/2 and
 * about ulp(θ̂) more.  With ulp(x) ≤ 2^-23|x| (+2^-149 for subnormals),
 * c ≥ 1/2 and |a|, |θd| ≈ c|θ̂| this is ≤ 2^-24 (4|θ̂| + 2|θ_t|) plus a few
 * subnormal ulps.  For fused, lr·upd adds roundings of the size of u,
 * ≤ 2^-24·3|u| (u itself may then differ from the forward's by a rounding
 * or two, also ∝ |u|), and the decay term θ·lr·wd one more, ≤ 2^-24·lr·wd
 * |θ|: not ∝ |u|, so at large lr·wd it is the θ terms' slack (the factor
 * two below) that covers it, not the u term.  The worst seen over
 * adamw_fixtures' planted cases, large lr·wd included, is 0.53 e.  We take
 * twice the sum:
 *     e = 2^-23 (4|θ̂| + 2|θ_t| + 4|u|) + 2^-146,
 * and the computation of e and θ̂ ± e (relative 2^-23) fits in the slack.
 * An element is reported unchanged only when every value in [θ̂−e, θ̂+e]
 * rounds to θ_t's BF16 (RNE is monotone, so checking both ends is enough).
 * Non-finite θ_t is always reported. */
#define DTC_GUARD_ULP	1.1920928955078125e-07f	/* 2^-23 */
#define DTC_GUARD_TINY	1.1210387714598537e-44f	/* 2^-146 */

DTC_HD static inline float dtc_adamw_prev(const struct dtc_consts *k, float theta, float u)
{
	return (theta - u) * k->inv_decay;
}

DTC_HD static inline float dtc_guard_bound(float theta_hat, float theta, float u)
{
	return DTC_GUARD_ULP * (4.0f * dtc_fabsf(theta_hat) + 2.0f * dtc_fabsf(theta) +
				4.0f * dtc_fabsf(u)) + DTC_GUARD_TINY;
}

/* A sufficient test for "unchanged" without sqrt or division, so the scan
 * runs at memory speed and only elements near a BF16 boundary pay for the
 * full inverse.
 *
 * In magnitude, |θ_{t-1}| - |θ_t| = |θ_t|(1/c - 1) ± k1|u| ± ε with
 * ε <= 2^-21|θ_t| + (k1 - 1/c)|u| (the rounding analysis of the bound below,
 * c >= 1/2): decay only ever grows the previous magnitude, and the u term
 * grows it exactly when m has θ's sign (u = -(step)·m/D with D > 0, both
 * variants).  |u| <= S|m| / max(sqrt(v)·Q, eps) since D is the sum of
 * those two terms (torch: S = |step|, Q = 1/sqrt(bc2); fused: S = lr/bc1,
 * Q = 1/sqrt(bc2)).
 *
 * Interval.  base = (|θ_t| + 0x8000) & 0xffff0000 is |θ_t| rounded to BF16
 * with ties away; L = base - 0x8000 and U = base + 0x8000 are the FP32
 * midpoints around it (exact bit patterns, also across a binade edge), so
 * x - L and U - x (x = |θ_t|) are exact.  Off a tie this is RNE's BF16, and
 * every value strictly inside (L, U) rounds to it; at a tie x = L, so
 * r_dn < 0 and the test below fails: no need to know the tie's direction.
 *
 * Rooms.  The true room on the side |θ| may grow to is U - x - x·k2, on
 * the other x - L - x·2^-20 (k2 from hparams.c bounds the decay and ε
 * terms, 2^-20 is twice ε's 2^-21).  They are computed as
 *     r_up = U - fl(x·c_up),  c_up = fl(1 + q_k2) + 2^-23,
 *     r_dn = fl(x·c_dn) - L,  c_dn = 1 - 17·2^-24 = 1 - 2^-20 - 2^-24,
 * and both subtractions are exact (Sterbenz: the product is within a
 * factor 2 of U or L, or the room is negative anyway).  fl(x·c) is off by
 * at most 2^-24·x·c: on the down side the spare 2^-24 covers it; on the
 * up side the 2^-23 covers c_up's own rounding (<= 2^-24) and q_k2's
 * 2^-10 padding of k2 (k2 >= 2^-21) the product's.  So each computed room
 * is at most the true one.  If the step bound stays strictly inside on the
 * side it can move to (r) and the error alone stays inside on the other
 * (both r_up, r_dn > 0), the BF16 did not change.
 * The step test is k1|u| < r, i.e. a < r·max(sqrt(v)·Q, eps) with
 * a = k1·S|m|, decided squared and without sqrt:
 *     a² < rr = r²·w,  w = max(v·Q², eps²).
 * q_s, q_q2, q_eps carry a 2^-10 margin (hparams.c) that covers the
 * relative 2^-24 of each of the few FP32 products here, provided none of
 * them is subnormal or overflows.  Guards make that so, with one unsigned
 * range check each on the bit patterns:
 *   base in [2^-126, 2^16): x normal, and since r < U - L < 2^-6·x,
 *       r² < 2^20;
 *   min(r_up, r_dn) > 2^-53: both rooms positive, and r² > 2^-106 normal;
 *   rr in [2^-100, Inf): no overflow, rr normal, and w >= rr/r² > 2^-121
 *       normal too (a subnormal w, say an underflowed v·Q² with eps = 0,
 *       could be rounded up by far more than the margin).
 * Weights of 2^16 or more, or so small that r <= 2^-53, simply take the
 * full inverse.
 * a² needs no guard: if it overflows the test fails; if it underflows,
 * true a² <= fl(a²) + 2^-150, far below rr's 2^-100.  A NaN in m or v
 * fails the comparisons (max picks eps² over a NaN v·Q², as maxps does). */
DTC_HD static inline int dtc_adamw_quiet(const struct dtc_consts *k, float theta, float m, float v)
{
	uint32_t b = dtc_f32_bits(theta), ab = b & 0x7fffffffu;
	uint32_t base = (ab + 0x8000u) & 0xffff0000u;
	float x = dtc_bits_f32(ab);
	float c_up = (1.0f + k->q_k2) + 1.1920928955078125e-07f;		/* 2^-23 */
	float r_up = dtc_bits_f32(base + 0x8000u) - x * c_up;
	float r_dn = x * 0.9999989867210388f - dtc_bits_f32(base - 0x8000u);	/* 1 - 17·2^-24 */
	float r_min = r_up < r_dn ? r_up : r_dn;
	int up = ((b ^ dtc_f32_bits(m)) >> 31) == 0;	/* u grows |θ_{t-1}| */
	float r = up ? r_up : r_dn;
	float a = k->q_s * dtc_fabsf(m);
	float vq = v * k->q_q2, e2 = k->q_eps * k->q_eps;
	float rr = r * r * (vq > e2 ? vq : e2);
	int ok = (base - 0x00800000u < 0x47000000u) &			/* [2^-126, 2^16) */
		 (r_min > 1.1102230246251565e-16f) &			/* 2^-53 */
		 (dtc_f32_bits(rr) - 0x0d800000u < 0x72000000u);	/* [2^-100, Inf) */

	return ok & (a * a < rr);
}

/* Exact verdicts where the step is exactly zero (u = ±0, e.g. m = 0: a
 * parameter without gradient), which the guard band below would flag for
 * nothing.  1 when θ_{t-1}'s BF16 provably equals θ_t's, else 0 (then the
 * guard decides).  IEEE facts used: a product with a positive factor keeps
 * its sign, also when it rounds to zero; x + (±0) = x and x − (±0) = x for
 * x ≠ 0; a sum of zeros is −0 only as (−0) + (−0) (x − y as x + (−y)); a
 * nonzero x − y is never −0.
 *
 * (a) θ_t = ±0, u = −0 (m = +0: torch's -step·(+0) and FusedAdam's
 *     −(lr·(+0)) are −0).  torch: θ_t = θd + u with θd = θ_{t-1}·c, c > 0;
 *     θd ≠ 0 would give θ_t = θd ≠ 0, so θd = ±0, which has θ_{t-1}'s sign
 *     (and θ_{t-1} is a zero or so tiny its BF16 is that signed zero);
 *     θd + (−0) is θd itself, so θ_{t-1}'s BF16 is θ_t's.  FusedAdam:
 *     θ_t = θ_{t-1} − y, y = lr·(m̂/d + wd·θ_{t-1}) = lr·q (m̂/d = +0, so
 *     the sum is q = wd·θ_{t-1} rounded, or +0).  θ_t = −0 needs
 *     θ_{t-1} = −0.  θ_t = +0 comes from θ_{t-1} = +0, or from an exact
 *     cancellation y = θ_{t-1} ≠ 0 (a BF16 change when θ_{t-1} < 0): in
 *     units of 2^-149, |θ_{t-1}| = k, |q| <= wd·k(1 + 2^-24) + 1/2 and y
 *     rounds to k only if lr·|q| > k − 1/2 − 2^-23·k; with lr·wd <= 1/2
 *     (hparams.c) that needs k < 2 when lr < 1/2, and for k = 1
 *     lr·(wd + 1/2) > 1/2.  So still_pos0 = torch, or lr·(wd + 1) < 1/2
 *     (and wd <= 2^24, where the relative rounding of q stays below a
 *     unit), computed in hparams.c; the same holds when the forward
 *     contracts into FMAs (one rounding fewer).
 * (b) No weight decay (still_nodecay): torch skips the decay (or c = 1),
 *     FusedAdam's wd·θ is ±0, so θ_t = θ_{t-1} − (±0) = θ_{t-1} for
 *     θ_{t-1} ≠ 0.  Only normal |θ_t| >= 2^-125 takes this: a forward with
 *     an FMA subtracts lr·m̂/d unrounded, and an exact product as small as
 *     2^-150 (which rounds to our u = ±0) can move a θ below 2^-125 by a
 *     unit; at or above it that is under half a unit, so θ_t = θ_{t-1}.
 * Non-finite θ_t never takes either (it is always reported). */
DTC_HD static inline int dtc_adamw_still(const struct dtc_consts *k, float theta, float u)
{
	uint32_t bt = dtc_f32_bits(theta), bu = dtc_f32_bits(u);
	uint32_t at = bt & 0x7fffffffu;
	/* all 32-bit unsigned, branch-free: the scan kernels vectorize it */
	uint32_t a = (uint32_t)(bu == 0x80000000u) & (uint32_t)(at == 0) &
		     ((bt >> 31) | (uint32_t)k->still_pos0);
	uint32_t b = (uint32_t)((bu & 0x7fffffffu) == 0) &
		     (uint32_t)(at - 0x01000000u < 0x7f800000u - 0x01000000u) &
		     (uint32_t)k->still_nodecay;

	return (int)(a | b);
}

/* 1 when θ's BF16 may differ from θ_{t-1}'s, 0 when it provably does not;
 * u from dtc_adamw_u*() (kernels call the variant's own to keep the
 * variant branch out of their loops). */
DTC_HD static inline int dtc_adamw_changed_u(const struct dtc_consts *k, float theta, float u)
{
	float th = dtc_adamw_prev(k, theta, u);
	float e = dtc_guard_bound(th, theta, u);
	uint16_t b = dtc_bf16_rne(theta);
	uint16_t blo = dtc_bf16_rne(th - e);
	uint16_t bhi = dtc_bf16_rne(th + e);

	int ch = (blo != b) | (bhi != b) | !dtc_f32_finite(theta);

	/* a select, not `& !still`: GCC vectorizes no _Bool of it */
	return dtc_adamw_still(k, theta, u) ? 0 : ch;
}

DTC_HD static inline int dtc_adamw_changed(const struct dtc_consts *k, float theta,
					   float m, float v)
{
	return dtc_adamw_changed_u(k, theta, dtc_adamw_u(k, m, v));
}

/* The verdict every backend reports: the cheap test first, the full
 * inverse only where it cannot decide. */
DTC_HD static inline int dtc_adamw_flag(const struct dtc_consts *k, float theta, float m, float v)
{
	return !dtc_adamw_quiet(k, theta, m, v) && dtc_adamw_changed(k, theta, m, v);
}

/* splitmix64's finalizer: a 64-bit mix for hashing (plan digests, test
 * data); the element checksum below no longer uses it. */
DTC_HD static inline uint64_t dtc_mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* The element checksum (DESIGN §2.3): Σ over a buffer's elements of
 * key(index) · bits, mod 2^64, where bits is the element's BF16 and
 * key(index) an odd 32-bit number drawn from the index: a Weyl step
 * k = index · 0x9e3779b97f4a7c15 folded as (k ^ k >> 32) | 1, low 32 bits.
 * Sums are order-independent, so partial sums from several senders add up
 * to the receiver's recomputation, and a change of an element from old to
 * new moves the sum by key(index) · (new − old).
 *
 * What it catches (docs/SYNC.md, "The checksum"): each term is below 2^48
 * and a difference below 2^48 in size, so for fewer than 2^15 wrong
 * elements the sum of their differences is taken exactly, without
 * wrapping.  One wrong element always changes the sum (key odd, new ≠ old).
 * For k ≥ 2 wrong elements with differences Δ_1..Δ_k, the sum is unchanged
 * only if key_k · Δ_k = −Σ_{i<k} key_i · Δ_i, which at most one of the 2^31
 * odd keys satisfies: with keys that behave as independent of the errors,
 * a probability of at most 2^-31 per corrupted version.  Misplaced values
 * (a shift or a swap of rows) are such k-element errors too; the fold makes
 * the keys non-linear in the index, so no fixed pattern of small
 * differences at nearby or periodic positions (Δ, −Δ at i, i + 2^16;
 * Δ, −2Δ, Δ at i, i+1, i+2) cancels for every index, as it would with a
 * plain Weyl or a periodic key.  (splitmix64 per element gave about 2^-64,
 * at two 64-bit multiplies and six shifts and xors per element; this
 * costs one 32×32-bit multiply, which AVX-512's vpmuludq does for 8 lanes
 * in one cheap instruction.  gpu/cpu_avx512.c sums it inside the detect's
 * cheap-test pass, 4-10 % of the detect on 2 idle EPYC cores:
 * bench_scan's csum_ratio.) */
DTC_HD static inline uint64_t dtc_csum_key(uint64_t index)
{
	uint64_t k = index * 0x9e3779b97f4a7c15ull;

	return ((k ^ (k >> 32)) | 1u) & 0xffffffffull;
}

DTC_HD static inline uint64_t dtc_csum_term(uint64_t index, uint16_t bits)
{
	return dtc_csum_key(index) * bits;
}

#endif

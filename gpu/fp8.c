/* FP8 E4M3FN block quantization of BF16 weights, bit-exact with the
 * engines' own quantizers (gpu/fp8.h; docs/INTEGRATION.md "FP8
 * block-scaled weights").  Pure functions of their inputs; one thread. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "gpu/codec.h"
#include "gpu/compute.h"
#include "gpu/fp8.h"

uint8_t dtc_fp8_e4m3fn_from_f32(float f)
{
	return dtc_fp8_e4m3fn_rne(f);
}

float dtc_fp8_e4m3fn_to_f32(uint8_t code)
{
	return dtc_fp8_e4m3fn_f32(code);
}

static int check_shape(const void *a, const void *b, uint64_t rows, uint64_t cols,
		       uint64_t ld, uint32_t block_rows, uint32_t block_cols, unsigned flags,
		       unsigned allowed)
{
	if (!a || !b || !block_rows || !block_cols || ld < cols || (flags & ~allowed))
		return DTC_EINVAL;
	if ((flags & DTC_FP8_UE8M0) && (flags & DTC_FP8_UE8M0_LOG2))
		return DTC_EINVAL;
	/* rows*ld indexes the input; rows*cols bits index a diff bitmap. */
	if (rows && ld > UINT64_MAX / 8 / rows)
		return DTC_EINVAL;
	return DTC_OK;
}

static uint64_t ceil_div(uint64_t a, uint64_t b)
{
	return a / b + (a % b != 0);
}

/* max |x| over rows [r0, r1) x cols [c0, c1) of w. */
static float block_amax(const uint16_t *w, uint64_t ld, uint64_t r0, uint64_t r1,
			uint64_t c0, uint64_t c1)
{
	float amax = 0.0f;

	for (uint64_t r = r0; r < r1; r++)
		for (uint64_t c = c0; c < c1; c++)
			amax = dtc_fp8_amax_step(amax, dtc_bf16_f32(w[r * ld + c]));
	return amax;
}

int dtc_fp8_quantize_bf16(const uint16_t *w, uint64_t rows, uint64_t cols, uint64_t ld,
			  uint32_t block_rows, uint32_t block_cols, unsigned flags,
			  uint8_t *codes, float *scales)
{
	int rc = check_shape(w, codes, rows, cols, ld, block_rows, block_cols, flags,
			     DTC_FP8_FLAGS_ALL);

	if (rc)
		return rc;
	if (!scales)
		return DTC_EINVAL;
	uint64_t bcols = ceil_div(cols, block_cols);

	for (uint64_t r0 = 0, br = 0; r0 < rows; r0 += block_rows, br++) {
		uint64_t r1 = rows - r0 < block_rows ? rows : r0 + block_rows;

		for (uint64_t c0 = 0, bc = 0; c0 < cols; c0 += block_cols, bc++) {
			uint64_t c1 = cols - c0 < block_cols ? cols : c0 + block_cols;
			float sf = dtc_fp8_block_scale(block_amax(w, ld, r0, r1, c0, c1), flags);
			float rs = 1.0f / sf;

			scales[br * bcols + bc] = sf;
			for (uint64_t r = r0; r < r1; r++)
				for (uint64_t c = c0; c < c1; c++)
					codes[r * cols + c] = dtc_fp8_code(w[r * ld + c], rs);
		}
	}
	return DTC_OK;
}

/* torch's dequantization: FP32 code * FP32 scale (and .to(bfloat16)). */
static float dequant(uint8_t code, float sf, unsigned flags)
{
	float x = dtc_fp8_e4m3fn_f32(code) * sf;

	return flags & DTC_FP8_DEQUANT_BF16 ? dtc_bf16_f32(dtc_bf16_rne(x)) : x;
}

int dtc_fp8_requant(const uint8_t *codes, const float *scales, uint64_t rows, uint64_t cols,
		    uint32_t block_rows, uint32_t block_cols, unsigned flags,
		    uint8_t *codes_out, float *scales_out)
{
	int rc = check_shape(codes, scales, rows, cols, cols, block_rows, block_cols, flags,
			     DTC_FP8_FLAGS_ALL | DTC_FP8_DEQUANT_BF16);

	if (rc)
		return rc;
	if (!codes_out || !scales_out)
		return DTC_EINVAL;
	uint64_t bcols = ceil_div(cols, block_cols);

	for (uint64_t r0 = 0, br = 0; r0 < rows; r0 += block_rows, br++) {
		uint64_t r1 = rows - r0 < block_rows ? rows : r0 + block_rows;

		for (uint64_t c0 = 0, bc = 0; c0 < cols; c0 += block_cols, bc++) {
			uint64_t c1 = cols - c0 < block_cols ? cols : c0 + block_cols;
			float old = scales[br * bcols + bc], amax = 0.0f;

			for (uint64_t r = r0; r < r1; r++)
				for (uint64_t c = c0; c < c1; c++)
					amax = dtc_fp8_amax_step(amax,
								 dequant(codes[r * cols + c], old, flags));
			float sf = dtc_fp8_block_scale(amax, flags), rs = 1.0f / sf;

			/* Each element is read before it is written: in place is fine. */
			for (uint64_t r = r0; r < r1; r++)
				for (uint64_t c = c0; c < c1; c++)
					codes_out[r * cols + c] = dtc_fp8_e4m3fn_rne(
						dequant(codes[r * cols + c], old, flags) * rs);
			scales_out[br * bcols + bc] = sf;
		}
	}
	return DTC_OK;
}

int dtc_fp8_diff_bf16(const uint16_t *old_w, const uint16_t *new_w, uint64_t rows,
		      uint64_t cols, uint64_t ld, uint32_t block_rows, uint32_t block_cols,
		      unsigned flags, uint64_t *changed, uint8_t *scale_changed,
		      struct dtc_fp8_diff *out)
{
	int rc = check_shape(old_w, new_w, rows, cols, ld, block_rows, block_cols, flags,
			     DTC_FP8_FLAGS_ALL);
	struct dtc_fp8_diff d = { 0 };

	if (rc)
		return rc;
	if (!out)
		return DTC_EINVAL;
	if (changed)
		memset(changed, 0, ceil_div(rows * cols, 64) * sizeof(*changed));
	uint64_t bcols = ceil_div(cols, block_cols);

	for (uint64_t r0 = 0, br = 0; r0 < rows; r0 += block_rows, br++) {
		uint64_t r1 = rows - r0 < block_rows ? rows : r0 + block_rows;

		for (uint64_t c0 = 0, bc = 0; c0 < cols; c0 += block_cols, bc++) {
			uint64_t c1 = cols - c0 < block_cols ? cols : c0 + block_cols;
			float so = dtc_fp8_block_scale(block_amax(old_w, ld, r0, r1, c0, c1), flags);
			float sn = dtc_fp8_block_scale(block_amax(new_w, ld, r0, r1, c0, c1), flags);
			int sc = dtc_f32_bits(so) != dtc_f32_bits(sn);
			float ro = 1.0f / so, rn = 1.0f / sn;
			uint64_t before = d.codes_changed;

			for (uint64_t r = r0; r < r1; r++) {
				for (uint64_t c = c0; c < c1; c++) {
					uint16_t a = old_w[r * ld + c], b = new_w[r * ld + c];
					uint64_t p = r * cols + c;

					d.bf16_changed += a != b;
					/* Same scale, same bits: same code. */
					if ((!sc && a == b) || dtc_fp8_code(a, ro) == dtc_fp8_code(b, rn))
						continue;
					d.codes_changed++;
					if (changed)
						changed[p / 64] |= UINT64_C(1) << (p % 64);
				}
			}
			if (scale_changed)
				scale_changed[br * bcols + bc] = (uint8_t)sc;
			d.blocks++;
			d.scales_changed += sc;
			d.blocks_changed += sc || d.codes_changed != before;
		}
	}
	*out = d;
	return DTC_OK;
}

/* ---- snapshot-free detect (gpu/fp8.h) ---- */

/* θ_{t-1}'s BF16 lies in [*lo, *hi] (bit patterns of BF16 values, lo's
 * value <= hi's); 0 when θ_t or an end is not finite.  *bf16 is what
 * dtc_adamw_flag says of the element. */
static int old_bf16(const struct dtc_consts *k, float th, float m, float v, uint16_t *lo,
		    uint16_t *hi, int *bf16)
{
	uint16_t b = dtc_bf16_rne(th);
	float u, p, e;

	*lo = *hi = b;
	*bf16 = 1;
	if (!dtc_f32_finite(th))
		return 0;
	*bf16 = 0;
	if (dtc_adamw_quiet(k, th, m, v))
		return 1;
	u = dtc_adamw_u(k, m, v);
	if (dtc_adamw_still(k, th, u))
		return 1;
	p = dtc_adamw_prev(k, th, u);
	e = dtc_guard_bound(p, th, u);
	*lo = dtc_bf16_rne(p - e);
	*hi = dtc_bf16_rne(p + e);
	*bf16 = *lo != b || *hi != b;
	return dtc_f32_finite(dtc_bf16_f32(*lo)) && dtc_f32_finite(dtc_bf16_f32(*hi));
}

/* Whether an element's code may differ, its block's scale being known
 * and unchanged (rs = RN32(1 / scale)). */
static int code_may_differ(uint16_t b, uint16_t lo, uint16_t hi, float rs)
{
	float lv = dtc_bf16_f32(lo), hv = dtc_bf16_f32(hi);
	uint8_t q = dtc_fp8_code(b, rs);

	if (lo == b && hi == b)
		return 0;
	if (lv <= 0.0f && hv >= 0.0f)
		return 1;	/* ±0 in reach: monotonicity cannot tell 0x00 from 0x80 */
	return dtc_fp8_code(lo, rs) != q || dtc_fp8_code(hi, rs) != q;
}

int dtc_fp8_detect_adamw(const struct dtc_consts *k, const float *theta, const float *m,
			 const float *v, uint64_t rows, uint64_t cols, uint64_t ld,
			 uint32_t block_rows, uint32_t block_cols, unsigned flags,
			 uint64_t *changed, uint8_t *whole, struct dtc_fp8_detect *out)
{
	int rc = check_shape(theta, m, rows, cols, ld, block_rows, block_cols, flags,
			     DTC_FP8_FLAGS_ALL);
	struct dtc_fp8_detect d = { 0 };
	uint16_t *lo, *hi;

	if (rc)
		return rc;
	if (!k || !v || !out || (uint64_t)block_rows * block_cols > UINT32_MAX)
		return DTC_EINVAL;
	lo = malloc((size_t)block_rows * block_cols * sizeof(*lo));
	hi = malloc((size_t)block_rows * block_cols * sizeof(*hi));
	if (!lo || !hi) {
		free(lo);
		free(hi);
		return DTC_ENOMEM;
	}
	if (changed)
		memset(changed, 0, ceil_div(rows * cols, 64) * sizeof(*changed));
	uint64_t bcols = ceil_div(cols, block_cols);

	for (uint64_t r0 = 0, br = 0; r0 < rows; r0 += block_rows, br++) {
		uint64_t r1 = rows - r0 < block_rows ? rows : r0 + block_rows;

		for (uint64_t c0 = 0, bc = 0; c0 < cols; c0 += block_cols, bc++) {
			uint64_t c1 = cols - c0 < block_cols ? cols : c0 + block_cols;
			float amax = 0.0f, alo = 0.0f, ahi = 0.0f;
			int finite = 1;
			size_t i = 0;

			/* Pass 1: the new amax exactly, the old one's bounds. */
			for (uint64_t r = r0; r < r1; r++) {
				for (uint64_t c = c0; c < c1; c++, i++) {
					uint64_t x = r * ld + c;
					int f;
					float lv, hv, al, ah;

					finite &= old_bf16(k, theta[x], m[x], v[x], &lo[i], &hi[i], &f);
					d.bf16 += (uint64_t)f;
					amax = dtc_fp8_amax_step(amax, dtc_bf16_f32(dtc_bf16_rne(theta[x])));
					lv = dtc_bf16_f32(lo[i]);
					hv = dtc_bf16_f32(hi[i]);
					al = lv > 0.0f ? lv : hv < 0.0f ? -hv : 0.0f;
					ah = -lv > hv ? -lv : hv;
					alo = al > alo ? al : alo;
					ahi = ah > ahi ? ah : ahi;
				}
			}
			float sn = dtc_fp8_block_scale(amax, flags);
			uint32_t so_lo = dtc_f32_bits(dtc_fp8_block_scale(alo, flags));
			uint32_t so_hi = dtc_f32_bits(dtc_fp8_block_scale(ahi, flags));
			int w = !finite || so_lo != so_hi || so_lo != dtc_f32_bits(sn);

			d.blocks++;
			if (whole)
				whole[br * bcols + bc] = (uint8_t)w;
			if (w) {
				d.whole++;
				continue;
			}
			/* Pass 2: one known scale, old and new; the codes. */
			float rs = 1.0f / sn;

			i = 0;
			for (uint64_t r = r0; r < r1; r++) {
				for (uint64_t c = c0; c < c1; c++, i++) {
					uint64_t p = r * cols + c;

					if (!code_may_differ(dtc_bf16_rne(theta[r * ld + c]), lo[i],
							     hi[i], rs))
						continue;
					d.codes++;
					if (changed)
						changed[p / 64] |= UINT64_C(1) << (p % 64);
				}
			}
		}
	}
	free(lo);
	free(hi);
	*out = d;
	return DTC_OK;
}

/* ---- FP8 delta payload (gpu/fp8.h) ---- */

static int bit(const uint64_t *bm, uint64_t p)
{
	return (int)((bm[p / 64] >> (p % 64)) & 1u);
}

static void put_f32(uint8_t *p, float f)
{
	uint32_t u = dtc_f32_bits(f);

	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(u >> (8 * i));
}

static float get_f32(const uint8_t *p)
{
	return dtc_bits_f32((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
			    (uint32_t)p[3] << 24);
}

size_t dtc_fp8_delta_bound(uint64_t rows, uint64_t cols, uint32_t block_rows,
			   uint32_t block_cols, uint64_t nwhole, uint64_t count)
{
	uint64_t per_block = (uint64_t)block_rows * block_cols + 4 + DTC_GAP_MAX;
	uint64_t b;

	(void)rows;
	(void)cols;
	if (nwhole > (SIZE_MAX / 2) / (per_block ? per_block : 1) ||
	    count > (SIZE_MAX / 2) / (DTC_GAP_MAX + 1))
		return SIZE_MAX;
	b = 2 * DTC_VARINT_MAX + nwhole * per_block + count * (DTC_GAP_MAX + 1);
	return (size_t)b;
}

/* Block grid geometry of one matrix. */
struct grid {
	uint64_t rows, cols, bcols, nblocks;
	uint32_t br, bc;
};

static struct grid grid_of(uint64_t rows, uint64_t cols, uint32_t br, uint32_t bc)
{
	struct grid g = { rows, cols, ceil_div(cols, bc), 0, br, bc };

	g.nblocks = ceil_div(rows, br) * g.bcols;
	return g;
}

static uint64_t block_of(const struct grid *g, uint64_t p)
{
	return (p / g->cols / g->br) * g->bcols + (p % g->cols) / g->bc;
}

/* Rows [*r0, *r1) and cols [*c0, *c1) of block b. */
static void block_box(const struct grid *g, uint64_t b, uint64_t *r0, uint64_t *r1,
		      uint64_t *c0, uint64_t *c1)
{
	*r0 = b / g->bcols * g->br;
	*c0 = b % g->bcols * g->bc;
	*r1 = g->rows - *r0 < g->br ? g->rows : *r0 + g->br;
	*c1 = g->cols - *c0 < g->bc ? g->cols : *c0 + g->bc;
}

/* Bytes of the payload for `whole` (bits of `changed` outside whole
 * blocks as codes); *nwhole / *count receive the two list lengths. */
static uint64_t delta_size(const struct grid *g, const uint64_t *changed, const uint8_t *whole,
			   uint64_t *nwhole, uint64_t *count)
{
	uint8_t tmp[DTC_GAP_MAX];
	uint64_t size = 0, nw = 0, cnt = 0, next = 0;

	for (uint64_t b = 0; b < g->nblocks; b++) {
		uint64_t r0, r1, c0, c1;

		if (!whole[b])
			continue;
		block_box(g, b, &r0, &r1, &c0, &c1);
		size += dtc_gap_put(tmp, b - next) + 4 + (r1 - r0) * (c1 - c0);
		next = b + 1;
		nw++;
	}
	next = 0;
	for (uint64_t p = 0; p < g->rows * g->cols; p++) {
		if (!bit(changed, p) || whole[block_of(g, p)])
			continue;
		size += dtc_gap_put(tmp, p - next) + 1;
		next = p + 1;
		cnt++;
	}
	*nwhole = nw;
	*count = cnt;
	return size + dtc_varint_put(tmp, nw) + dtc_varint_put(tmp, cnt);
}

int dtc_fp8_delta_encode(const uint16_t *w, uint64_t rows, uint64_t cols, uint64_t ld,
			 uint32_t block_rows, uint32_t block_cols, unsigned flags,
			 const uint64_t *changed, const uint8_t *whole, uint8_t *out,
			 size_t cap, size_t *outlen)
{
	int rc = check_shape(w, out, rows, cols, ld, block_rows, block_cols, flags,
			     DTC_FP8_FLAGS_ALL);
	struct grid g = grid_of(rows, cols, block_rows, block_cols);
	uint64_t nwhole, count, next = 0, nw_all, zero;
	uint8_t tmp[DTC_GAP_MAX], *all = NULL;
	size_t o = 0, n;
	float *sf;

	if (rc)
		return rc;
	if (!changed || !whole || !outlen)
		return DTC_EINVAL;
	sf = malloc((g.nblocks ? g.nblocks : 1) * sizeof(*sf));
	all = malloc(g.nblocks ? g.nblocks : 1);
	rc = DTC_ENOMEM;
	if (!sf || !all)
		goto out;
	for (uint64_t b = 0; b < g.nblocks; b++) {
		uint64_t r0, r1, c0, c1;

		block_box(&g, b, &r0, &r1, &c0, &c1);
		sf[b] = dtc_fp8_block_scale(block_amax(w, ld, r0, r1, c0, c1), flags);
	}
	/* Where codes and their positions would outweigh the matrix, every
	 * block whole: the same update, dense. */
	memset(all, 1, g.nblocks);
	if (delta_size(&g, changed, all, &nw_all, &zero) <=
	    delta_size(&g, changed, whole, &nwhole, &count)) {
		whole = all;
		nwhole = nw_all;
		count = 0;
	}
	rc = DTC_ENOSPC;
#define EMIT(src, len) do { n = (len); if (cap - o < n) goto out; memcpy(out + o, (src), n); o += n; } while (0)
	EMIT(tmp, dtc_varint_put(tmp, nwhole));
	for (uint64_t b = 0; b < g.nblocks; b++) {
		if (!whole[b])
			continue;
		EMIT(tmp, dtc_gap_put(tmp, b - next));
		next = b + 1;
	}
	EMIT(tmp, dtc_varint_put(tmp, count));
	next = 0;
	for (uint64_t p = 0; count && p < rows * cols; p++) {
		if (!bit(changed, p) || whole[block_of(&g, p)])
			continue;
		EMIT(tmp, dtc_gap_put(tmp, p - next));
		next = p + 1;
	}
	for (uint64_t b = 0; b < g.nblocks; b++) {
		if (!whole[b])
			continue;
		put_f32(tmp, sf[b]);
		EMIT(tmp, 4);
	}
	for (uint64_t b = 0; b < g.nblocks; b++) {
		uint64_t r0, r1, c0, c1;
		float rs = 1.0f / sf[b];

		if (!whole[b])
			continue;
		block_box(&g, b, &r0, &r1, &c0, &c1);
		for (uint64_t r = r0; r < r1; r++)
			for (uint64_t c = c0; c < c1; c++) {
				tmp[0] = dtc_fp8_code(w[r * ld + c], rs);
				EMIT(tmp, 1);
			}
	}
	for (uint64_t p = 0; count && p < rows * cols; p++) {
		if (!bit(changed, p) || whole[block_of(&g, p)])
			continue;
		tmp[0] = dtc_fp8_code(w[p / cols * ld + p % cols], 1.0f / sf[block_of(&g, p)]);
		EMIT(tmp, 1);
	}
#undef EMIT
	*outlen = o;
	rc = DTC_OK;
out:
	free(sf);
	free(all);
	return rc;
}

/* What delta_walk does once the payload checked out. */
enum walk_mode { WALK_CHECK, WALK_APPLY, WALK_INVERT, WALK_CSUM };

/* The checksum key of a scale's two 16-bit halves: a domain apart from
 * the codes' positions. */
#define FP8_SCALE_KEYS	(UINT64_C(1) << 62)

static uint64_t scale_term(uint64_t b, uint32_t bits)
{
	return dtc_csum_term(FP8_SCALE_KEYS + 2 * b, (uint16_t)bits) +
	       dtc_csum_term(FP8_SCALE_KEYS + 2 * b + 1, (uint16_t)(bits >> 16));
}

/* One value of the payload against one place in memory: APPLY writes
 * memory from the payload, INVERT the payload copy `inv` from memory,
 * CSUM adds both to their sums.  Codes: 1 byte; scales: 4. */
struct walk {
	int mode;
	const uint8_t *in;
	uint8_t *inv;			/* INVERT: the copy being rewritten */
	uint64_t sum_mem, sum_pay;	/* CSUM */
};

static void walk_code(struct walk *w, const uint8_t *at, uint8_t *mem, uint64_t pos)
{
	if (w->mode == WALK_APPLY)
		*mem = *at;
	else if (w->mode == WALK_INVERT)
		w->inv[at - w->in] = *mem;
	else {
		w->sum_mem += dtc_csum_term(pos, *mem);
		w->sum_pay += dtc_csum_term(pos, *at);
	}
}

static void walk_scale(struct walk *w, const uint8_t *at, float *mem, uint64_t b)
{
	if (w->mode == WALK_APPLY)
		*mem = get_f32(at);
	else if (w->mode == WALK_INVERT)
		put_f32(w->inv + (at - w->in), *mem);
	else {
		w->sum_mem += scale_term(b, dtc_f32_bits(*mem));
		w->sum_pay += scale_term(b, dtc_f32_bits(get_f32(at)));
	}
}

/* Parse (and check) the two position lists; past WALK_CHECK also visit
 * every value with its place.  `inwhole` is one byte per block, zeroed by
 * the caller.  A code's checksum position is its row-major index in the
 * rows x cols matrix (not in ld), a scale's its block. */
static int delta_walk(const uint8_t *in, size_t len, const struct grid *g, uint64_t ld,
		      uint8_t *inwhole, struct walk *w, uint8_t *codes, float *scales,
		      uint64_t *ncodes, uint64_t *nwhole)
{
	const uint8_t *p = in, *end = in + len, *pos_at, *data;
	uint64_t nw, cnt, next = 0, elems = 0, gap;
	int rc;

	if ((rc = dtc_varint_get(&p, end, &nw)) != DTC_OK)
		return rc;
	if (nw > g->nblocks)
		return DTC_ECORRUPT;
	for (uint64_t i = 0; i < nw; i++) {
		uint64_t r0, r1, c0, c1, b;

		if ((rc = dtc_gap_get(&p, end, &gap)) != DTC_OK)
			return rc;
		if (next >= g->nblocks || gap >= g->nblocks - next)
			return DTC_ERANGE;
		b = next + gap;
		next = b + 1;
		inwhole[b] = 1;
		block_box(g, b, &r0, &r1, &c0, &c1);
		elems += (r1 - r0) * (c1 - c0);
	}
	if ((rc = dtc_varint_get(&p, end, &cnt)) != DTC_OK)
		return rc;
	if (cnt > g->rows * g->cols)
		return DTC_ECORRUPT;
	pos_at = p;
	next = 0;
	for (uint64_t i = 0; i < cnt; i++) {
		if ((rc = dtc_gap_get(&p, end, &gap)) != DTC_OK)
			return rc;
		if (next >= g->rows * g->cols || gap >= g->rows * g->cols - next)
			return DTC_ERANGE;
		next += gap;
		if (inwhole[block_of(g, next)])
			return DTC_ECORRUPT;	/* a code inside a whole block */
		next++;
	}
	/* scales, whole blocks' codes, codes: exactly that many bytes */
	if ((uint64_t)(end - p) / 4 < nw || (uint64_t)(end - p) - 4 * nw < elems ||
	    (uint64_t)(end - p) - 4 * nw - elems < cnt)
		return DTC_ETRUNC;
	if ((uint64_t)(end - p) != 4 * nw + elems + cnt)
		return DTC_ECORRUPT;
	if (ncodes)
		*ncodes = cnt;
	if (nwhole)
		*nwhole = nw;
	if (w->mode == WALK_CHECK)
		return DTC_OK;
	data = p;
	for (uint64_t b = 0; b < g->nblocks; b++)
		if (inwhole[b]) {
			walk_scale(w, data, &scales[b], b);
			data += 4;
		}
	for (uint64_t b = 0; b < g->nblocks; b++) {
		uint64_t r0, r1, c0, c1;

		if (!inwhole[b])
			continue;
		block_box(g, b, &r0, &r1, &c0, &c1);
		for (uint64_t r = r0; r < r1; r++)
			for (uint64_t c = c0; c < c1; c++)
				walk_code(w, data++, codes + r * ld + c, r * g->cols + c);
	}
	p = pos_at;
	next = 0;
	for (uint64_t i = 0; i < cnt; i++) {
		(void)dtc_gap_get(&p, end, &gap);	/* checked above */
		next += gap;
		walk_code(w, data++, codes + next / g->cols * ld + next % g->cols, next);
		next++;
	}
	return DTC_OK;
}

/* Check the payload, then walk it in `mode`. */
static int delta_run(const uint8_t *in, size_t len, uint64_t rows, uint64_t cols, uint64_t ld,
		     uint32_t block_rows, uint32_t block_cols, struct walk *w, uint8_t *codes,
		     float *scales, uint64_t *ncodes, uint64_t *nwhole)
{
	int rc = check_shape(in, codes, rows, cols, ld, block_rows, block_cols, 0, 0);
	struct grid g = grid_of(rows, cols, block_rows, block_cols);
	struct walk check = { WALK_CHECK, in, NULL, 0, 0 };
	uint8_t *inwhole;

	if (rc)
		return rc;
	if (!scales)
		return DTC_EINVAL;
	inwhole = calloc(g.nblocks ? g.nblocks : 1, 1);
	if (!inwhole)
		return DTC_ENOMEM;
	rc = delta_walk(in, len, &g, ld, inwhole, &check, codes, scales, ncodes, nwhole);
	if (rc == DTC_OK) {
		memset(inwhole, 0, g.nblocks);
		rc = delta_walk(in, len, &g, ld, inwhole, w, codes, scales, NULL, NULL);
	}
	free(inwhole);
	return rc;
}

int dtc_fp8_delta_apply(const uint8_t *in, size_t len, uint64_t rows, uint64_t cols,
			uint64_t ld, uint32_t block_rows, uint32_t block_cols, uint8_t *codes,
			float *scales, uint64_t *ncodes, uint64_t *nwhole)
{
	struct walk w = { WALK_APPLY, in, NULL, 0, 0 };

	return delta_run(in, len, rows, cols, ld, block_rows, block_cols, &w, codes, scales,
			 ncodes, nwhole);
}

int dtc_fp8_delta_invert(const uint8_t *in, size_t len, uint64_t rows, uint64_t cols,
			 uint64_t ld, uint32_t block_rows, uint32_t block_cols,
			 const uint8_t *codes, const float *scales, uint8_t *out, size_t cap)
{
	struct walk w = { WALK_INVERT, in, out, 0, 0 };

	if (!out || !in || cap < len)
		return !out || !in ? DTC_EINVAL : DTC_ENOSPC;
	memcpy(out, in, len);
	/* the walk only reads memory in this mode */
	return delta_run(in, len, rows, cols, ld, block_rows, block_cols, &w, (uint8_t *)codes,
			 (float *)scales, NULL, NULL);
}

int dtc_fp8_delta_csum(const uint8_t *in, size_t len, uint64_t rows, uint64_t cols,
		       uint64_t ld, uint32_t block_rows, uint32_t block_cols,
		       const uint8_t *codes, const float *scales, uint64_t *sum_memory,
		       uint64_t *sum_payload)
{
	struct walk w = { WALK_CSUM, in, NULL, 0, 0 };
	int rc;

	if (!sum_memory || !sum_payload)
		return DTC_EINVAL;
	rc = delta_run(in, len, rows, cols, ld, block_rows, block_cols, &w, (uint8_t *)codes,
		       (float *)scales, NULL, NULL);
	if (rc == DTC_OK) {
		*sum_memory = w.sum_mem;
		*sum_payload = w.sum_pay;
	}
	return rc;
}

/* One strip's θ (and m, v) as row-major [rows, cols] with leading
 * dimension *ld: the source itself when its rows are contiguous, else
 * gathered into g (3 x rows x cols floats). */
static void strip_view(const float *const src[3], int n, int64_t at, const int64_t st[2],
		       uint64_t rows, uint64_t cols, float *g, const float *out[3], uint64_t *ld)
{
	if (st[1] == 1 && st[0] >= (int64_t)cols) {
		for (int q = 0; q < n; q++)
			out[q] = src[q] + at;
		*ld = (uint64_t)st[0];
		return;
	}
	for (int q = 0; q < n; q++) {
		float *o = g + (size_t)q * rows * cols;

		for (uint64_t r = 0; r < rows; r++)
			for (uint64_t c = 0; c < cols; c++)
				o[r * cols + c] = src[q][at + (int64_t)r * st[0] + (int64_t)c * st[1]];
		out[q] = o;
	}
	*ld = cols;
}

int dtc_fp8_box_units(const struct dtc_consts *k, const float *theta, const float *m,
		      const float *v, uint64_t src_len, int64_t src_offset,
		      const int64_t src_stride[2], uint64_t rows, uint64_t cols, unsigned flags,
		      uint16_t *codes, uint16_t *scales, uint64_t *code_changed,
		      uint64_t *scale_changed, struct dtc_fp8_detect *det)
{
	const uint64_t B = DTC_FP8_BLOCK;
	const float *src[3] = { theta, m, v }, *sv[3];
	struct dte_box_map map;
	uint64_t bc, strip, ld;
	uint16_t *w = NULL;
	uint8_t *c8 = NULL, *wh = NULL;
	float *sf = NULL, *g = NULL;
	uint64_t *chg = NULL;
	int n = k ? 3 : 1, rc;

	if (!theta || !codes || !scales || !src_stride || !rows || !cols || cols % 2 ||
	    (flags & ~(unsigned)DTC_FP8_FLAGS_ALL) ||
	    ((flags & DTC_FP8_UE8M0) && (flags & DTC_FP8_UE8M0_LOG2)) ||
	    (k && (!m || !v || !code_changed || !scale_changed || !det)) ||
	    rows > (UINT64_C(1) << 31) || cols > (UINT64_C(1) << 31))
		return DTC_EINVAL;
	memset(&map, 0, sizeof(map));
	map.ndim = 2;
	map.extent[0] = (int64_t)rows;
	map.extent[1] = (int64_t)cols;
	map.src_offset = src_offset;
	map.src_stride[0] = src_stride[0];
	map.src_stride[1] = src_stride[1];
	if ((rc = dtc_entry_check(&map, src_len, UINT64_MAX)) != DTC_OK)
		return rc;
	bc = ceil_div(cols, B);
	strip = B * cols;
	w = malloc(strip * sizeof(*w));
	c8 = malloc(strip);
	sf = malloc(bc * sizeof(*sf));
	g = malloc((size_t)n * strip * sizeof(*g));
	if (k) {
		chg = malloc(ceil_div(strip, 64) * sizeof(*chg));
		wh = malloc(bc);
	}
	if (!w || !c8 || !sf || !g || (k && (!chg || !wh))) {
		rc = DTC_ENOMEM;
		goto out;
	}
	if (k) {
		memset(code_changed, 0, ceil_div(rows * cols / 2, 64) * sizeof(*code_changed));
		memset(scale_changed, 0, ceil_div(ceil_div(rows, B) * bc * 2, 64) *
		       sizeof(*scale_changed));
	}
	for (uint64_t r0 = 0, br = 0; r0 < rows; r0 += B, br++) {
		uint64_t sr = rows - r0 < B ? rows - r0 : B;

		strip_view(src, n, src_offset + (int64_t)r0 * src_stride[0], src_stride, sr, cols, g,
			   sv, &ld);
		for (uint64_t r = 0; r < sr; r++)
			for (uint64_t c = 0; c < cols; c++)
				w[r * cols + c] = dtc_bf16_rne(sv[0][r * ld + c]);
		if ((rc = dtc_fp8_quantize_bf16(w, sr, cols, cols, B, B, flags, c8, sf)) != DTC_OK)
			goto out;
		for (uint64_t r = 0; r < sr; r++)
			for (uint64_t j = 0; j < cols / 2; j++)
				codes[(r0 + r) * (cols / 2) + j] =
					(uint16_t)(c8[r * cols + 2 * j] |
						   (unsigned)c8[r * cols + 2 * j + 1] << 8);
		for (uint64_t b = 0; b < bc; b++) {
			uint32_t bits = dtc_f32_bits(sf[b]);

			scales[2 * (br * bc + b)] = (uint16_t)(bits & 0xffffu);
			scales[2 * (br * bc + b) + 1] = (uint16_t)(bits >> 16);
		}
		if (!k)
			continue;
		struct dtc_fp8_detect d;

		if ((rc = dtc_fp8_detect_adamw(k, sv[0], sv[1], sv[2], sr, cols, ld, B, B, flags,
					       chg, wh, &d)) != DTC_OK)
			goto out;
		det->blocks += d.blocks;
		det->whole += d.whole;
		det->codes += d.codes;
		det->bf16 += d.bf16;
		for (uint64_t r = 0; r < sr; r++) {
			for (uint64_t j = 0; j < cols / 2; j++) {
				uint64_t p = r * cols + 2 * j, u = (r0 + r) * (cols / 2) + j;
				int hit = wh[2 * j / B] || (chg[p / 64] >> (p % 64) & 1) ||
					  (chg[(p + 1) / 64] >> ((p + 1) % 64) & 1);

				if (hit)
					code_changed[u / 64] |= UINT64_C(1) << (u % 64);
			}
		}
		for (uint64_t b = 0; b < bc; b++) {
			uint64_t u = 2 * (br * bc + b);

			if (!wh[b])
				continue;
			scale_changed[u / 64] |= UINT64_C(1) << (u % 64);
			scale_changed[(u + 1) / 64] |= UINT64_C(1) << ((u + 1) % 64);
		}
	}
	rc = DTC_OK;
out:
	free(w);
	free(c8);
	free(sf);
	free(g);
	free(chg);
	free(wh);
	return rc;
}

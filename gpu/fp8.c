/* FP8 E4M3FN block quantization of BF16 weights, bit-exact with the
 * engines' own quantizers (gpu/fp8.h; docs/INTEGRATION.md "FP8
 * block-scaled weights").  Pure functions of their inputs; one thread. */
#include <string.h>
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

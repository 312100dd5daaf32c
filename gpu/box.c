/* Plan-entry geometry: size, validation against buffer lengths, and the
 * host-side row walker the cpu kernels share. */
#include "gpu/box.h"
#include "gpu/compute.h"

/* ndim 0 is a scalar tensor: one element at the offsets. */
uint64_t dtc_box_size(const struct dte_box_map *e)
{
	uint64_t n = 1;

	if (!e || e->ndim > DTE_MAX_DIMS)
		return 0;
	for (uint32_t d = 0; d < e->ndim; d++) {
		if (e->extent[d] < 1 || __builtin_mul_overflow(n, (uint64_t)e->extent[d], &n))
			return 0;
	}
	return n < ((uint64_t)1 << 62) ? n : 0;
}

uint64_t dtc_bitmap_words(const struct dte_box_map *e)
{
	return (dtc_box_size(e) + 63) / 64;
}

/* Lowest and highest index the mapping reaches, overflow-checked. */
static int index_range(const struct dte_box_map *e, int64_t off, const int64_t *stride,
		       int64_t *lo, int64_t *hi)
{
	int64_t a = off, b = off;

	for (uint32_t d = 0; d < e->ndim; d++) {
		int64_t span;

		if (__builtin_mul_overflow(e->extent[d] - 1, stride[d], &span))
			return DTC_EBOX;
		if (span < 0) {
			if (__builtin_add_overflow(a, span, &a))
				return DTC_EBOX;
		} else if (__builtin_add_overflow(b, span, &b)) {
			return DTC_EBOX;
		}
	}
	*lo = a;
	*hi = b;
	return DTC_OK;
}

int dtc_entry_check(const struct dte_box_map *e, uint64_t src_len, uint64_t dst_len)
{
	int64_t lo, hi;

	if (!e || dtc_box_size(e) == 0)
		return DTC_EBOX;
	if (src_len != UINT64_MAX) {
		if (index_range(e, e->src_offset, e->src_stride, &lo, &hi) ||
		    lo < 0 || (uint64_t)hi >= src_len)
			return DTC_EBOX;
	}
	if (dst_len != UINT64_MAX) {
		if (index_range(e, e->dst_offset, e->dst_stride, &lo, &hi) ||
		    lo < 0 || (uint64_t)hi >= dst_len)
			return DTC_EBOX;
	}
	return DTC_OK;
}

static int composes(const int64_t *stride, const int64_t *extent, uint32_t d)
{
	return stride[d - 1] == extent[d] * stride[d];
}

void box_coalesce(const struct dte_box_map *in, int sides, struct dte_box_map *out)
{
	struct dte_box_map r = *in;
	uint32_t n = 0;

	if (in->ndim == 0) {
		/* A scalar walks as one row of one element. */
		r.ndim = 1;
		r.extent[0] = 1;
		r.src_stride[0] = 0;
		r.dst_stride[0] = 0;
		*out = r;
		return;
	}
	/* Extent-1 dims carry no positions: drop them (keep at least one). */
	for (uint32_t d = 0; d < in->ndim; d++) {
		if (in->extent[d] == 1 && !(d == in->ndim - 1 && n == 0))
			continue;
		r.extent[n] = in->extent[d];
		r.src_stride[n] = in->src_stride[d];
		r.dst_stride[n] = in->dst_stride[d];
		n++;
	}
	r.ndim = n;
	/* Merge d-1 into d from the inside out when the strides compose. */
	for (uint32_t d = r.ndim - 1; d >= 1; d--) {
		if ((!(sides & BOX_SRC) || composes(r.src_stride, r.extent, d)) &&
		    (!(sides & BOX_DST) || composes(r.dst_stride, r.extent, d))) {
			r.extent[d - 1] *= r.extent[d];
			r.src_stride[d - 1] = r.src_stride[d];
			r.dst_stride[d - 1] = r.dst_stride[d];
			for (uint32_t j = d; j + 1 < r.ndim; j++) {
				r.extent[j] = r.extent[j + 1];
				r.src_stride[j] = r.src_stride[j + 1];
				r.dst_stride[j] = r.dst_stride[j + 1];
			}
			r.ndim--;
		}
	}
	*out = r;
}

void box_walk_seek(struct box_walk *w, const struct dte_box_map *e, uint64_t pos)
{
	uint32_t last = e->ndim - 1;
	uint64_t row;

	w->e = e;
	w->row_len = e->extent[last];
	w->col = (int64_t)(pos % (uint64_t)w->row_len);
	row = pos / (uint64_t)w->row_len;
	w->src_row = e->src_offset;
	w->dst_row = e->dst_offset;
	for (uint32_t d = last; d-- > 0;) {
		w->idx[d] = (int64_t)(row % (uint64_t)e->extent[d]);
		row /= (uint64_t)e->extent[d];
		w->src_row += w->idx[d] * e->src_stride[d];
		w->dst_row += w->idx[d] * e->dst_stride[d];
	}
}

void box_walk_next_row(struct box_walk *w)
{
	const struct dte_box_map *e = w->e;

	w->col = 0;
	for (uint32_t d = e->ndim - 1; d-- > 0;) {
		if (++w->idx[d] < e->extent[d]) {
			w->src_row += e->src_stride[d];
			w->dst_row += e->dst_stride[d];
			return;
		}
		w->idx[d] = 0;
		w->src_row -= (e->extent[d] - 1) * e->src_stride[d];
		w->dst_row -= (e->extent[d] - 1) * e->dst_stride[d];
	}
	/* Past the last row: the caller stops by position count. */
}

int64_t box_dst_of(const struct dte_box_map *e, uint64_t pos)
{
	int64_t idx = e->dst_offset;

	for (uint32_t d = e->ndim; d-- > 0;) {
		idx += (int64_t)(pos % (uint64_t)e->extent[d]) * e->dst_stride[d];
		pos /= (uint64_t)e->extent[d];
	}
	return idx;
}

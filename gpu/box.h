/* gpu/box.h — walking a plan entry's box on the host (internal).
 *
 * A box is visited as rows of its innermost dimension, in canonical
 * (row-major) order.  Before walking, dims that are contiguous on every
 * side in use are merged, so a sub-box of full-width rows becomes one long
 * row and the inner loops see long runs. */
#ifndef DTC_BOX_H
#define DTC_BOX_H

#include <stdint.h>
#include "gpu/entry.h"

enum { BOX_SRC = 1, BOX_DST = 2 };

/* Merge adjacent dims whose strides compose on the sides in `sides`. */
void box_coalesce(const struct dte_box_map *in, int sides, struct dte_box_map *out);

/* A cursor at a position: the current row's base indices and the column. */
struct box_walk {
	const struct dte_box_map *e;
	int64_t idx[DTE_MAX_DIMS];	/* outer dims; idx[ndim-1] unused */
	int64_t src_row;		/* src index of column 0 of this row */
	int64_t dst_row;
	int64_t col;			/* column within the row */
	int64_t row_len;
};

void box_walk_seek(struct box_walk *w, const struct dte_box_map *e, uint64_t pos);
/* Move to column 0 of the next row. */
void box_walk_next_row(struct box_walk *w);

static inline int64_t box_src_index(const struct box_walk *w)
{
	return w->src_row + w->col * w->e->src_stride[w->e->ndim - 1];
}

static inline int64_t box_dst_index(const struct box_walk *w)
{
	return w->dst_row + w->col * w->e->dst_stride[w->e->ndim - 1];
}

/* Advance one element. */
static inline void box_walk_step(struct box_walk *w)
{
	if (++w->col == w->row_len)
		box_walk_next_row(w);
}

/* The rows of box positions [lo, hi), a piece at a time: each call of
 * box_rows_next() gives the next piece [p, p + n) of one row, its first
 * element at src index `src` and dst index `dst` (the last dim's strides
 * step within it).  The walk never moves past hi:
 *
 *	struct box_rows r;
 *
 *	for (box_rows_init(&r, e, lo, hi); box_rows_next(&r); )
 *		do_run(r.src, r.dst, r.p, r.n);
 *
 * Inline, so a loop over a piece stays in the caller's own (cloned,
 * vectorized) body. */
struct box_rows {
	struct box_walk w;
	uint64_t p, n, hi;
	int64_t src, dst;
};

static inline void box_rows_init(struct box_rows *r, const struct dte_box_map *e, uint64_t lo,
				 uint64_t hi)
{
	r->p = lo;
	r->n = 0;
	r->hi = hi;
	if (lo < hi)
		box_walk_seek(&r->w, e, lo);
}

static inline int box_rows_next(struct box_rows *r)
{
	if (r->n) {
		r->p += r->n;
		if (r->p >= r->hi)
			return 0;
		box_walk_next_row(&r->w);
	} else if (r->p >= r->hi) {
		return 0;
	}
	r->n = (uint64_t)(r->w.row_len - r->w.col);
	if (r->n > r->hi - r->p)
		r->n = r->hi - r->p;
	r->src = box_src_index(&r->w);
	r->dst = box_dst_index(&r->w);
	return 1;
}

/* dst index of an arbitrary position (no walk). */
int64_t box_dst_of(const struct dte_box_map *e, uint64_t pos);

#endif

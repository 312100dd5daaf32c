/* daemon/layout/plan.c — intersect, validate, group per link.
 *
 * Coverage is checked by counting, never per element: sources of a tensor
 * must be pairwise disjoint, and for every sink piece the volumes of its
 * intersections with the sources must add up to its own volume.  Together
 * that is "every mapped sink element has exactly one source", in time
 * proportional to the piece pairs, whatever the tensor sizes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/layout/gen.h"
#include "daemon/layout/plan.h"

#define PLAN_GAP_BOXES 4096

struct plan_ctx {
	struct dte_plan          *plan;
	const struct dte_spec    *spec;
	const struct dte_layout  *src, *sink;
	size_t                   *src_idx, *sink_idx;   /* pieces sorted by tensor */
	size_t                   *src_start, *sink_start;
	size_t                    cap;
	char                     *err;
	size_t                    errlen;
};

/* Counting sort of piece indices by tensor: start[t]..start[t+1]. */
static int plan_bucket(const struct dte_layout *l, uint32_t ntensors, size_t **idx, size_t **start)
{
	size_t i, *pos;

	*idx = malloc((l->npieces + 1) * sizeof(size_t));
	*start = calloc((size_t)ntensors + 2, sizeof(size_t));
	pos = calloc((size_t)ntensors + 1, sizeof(size_t));
	if (!*idx || !*start || !pos) {
		free(pos);
		return -1;
	}
	for (i = 0; i < l->npieces; i++)
		(*start)[l->pieces[i].tensor + 1]++;
	for (i = 1; i <= ntensors; i++)
		(*start)[i] += (*start)[i - 1];
	for (i = 0; i < l->npieces; i++) {
		uint32_t t = l->pieces[i].tensor;
		(*idx)[(*start)[t] + pos[t]++] = i;
	}
	free(pos);
	return 0;
}

/* a \ b as up to 2*ndim boxes appended to out; returns the new count. */
static size_t box_subtract(uint32_t ndim, const int64_t *alo, const int64_t *ahi,
			   const int64_t *blo, const int64_t *bhi,
			   int64_t (*olo)[DTE_MAX_DIMS], int64_t (*ohi)[DTE_MAX_DIMS], size_t n)
{
	int64_t lo[DTE_MAX_DIMS], hi[DTE_MAX_DIMS];
	uint32_t d;

	if (!dte_box_intersect(ndim, alo, ahi, blo, bhi, NULL, NULL)) {
		memcpy(olo[n], alo, ndim * sizeof(int64_t));
		memcpy(ohi[n], ahi, ndim * sizeof(int64_t));
		return n + 1;
	}
	memcpy(lo, alo, ndim * sizeof(int64_t));
	memcpy(hi, ahi, ndim * sizeof(int64_t));
	/* Peel slabs off a, one dim at a time, outside b. */
	for (d = 0; d < ndim; d++) {
		if (lo[d] < blo[d]) {
			memcpy(olo[n], lo, ndim * sizeof(int64_t));
			memcpy(ohi[n], hi, ndim * sizeof(int64_t));
			ohi[n][d] = blo[d];
			n++;
			lo[d] = blo[d];
		}
		if (hi[d] > bhi[d]) {
			memcpy(olo[n], lo, ndim * sizeof(int64_t));
			memcpy(ohi[n], hi, ndim * sizeof(int64_t));
			olo[n][d] = bhi[d];
			n++;
			hi[d] = bhi[d];
		}
	}
	return n;
}

/* A sink piece is not fully covered: find and name one uncovered box. */
static int plan_gap(struct plan_ctx *x, const struct dte_piece *k, size_t s0, size_t s1,
		    int64_t covered)
{
	static const size_t cap = PLAN_GAP_BOXES;
	int64_t (*alo)[DTE_MAX_DIMS] = malloc(cap * sizeof(*alo)), (*ahi)[DTE_MAX_DIMS] = malloc(cap * sizeof(*ahi));
	int64_t (*blo)[DTE_MAX_DIMS] = malloc(cap * sizeof(*blo)), (*bhi)[DTE_MAX_DIMS] = malloc(cap * sizeof(*bhi));
	const struct dte_layout_buffer *b = dte_layout_buffer_find(x->sink, k->rank, k->buf);
	char box[256];
	size_t na = 1, nb, i, j;

	if (!alo || !ahi || !blo || !bhi) {
		dte_layout_err(x->err, x->errlen, "gap in tensor %s: sink box %s has %lld of %lld elements without a source",
			       x->spec->t[k->tensor].name, dte_layout_box_str(box, sizeof(box), k->ndim, k->lo, k->hi),
			       (long long)(dte_piece_volume(k) - covered), (long long)dte_piece_volume(k));
		goto out;
	}
	memcpy(alo[0], k->lo, sizeof(alo[0]));
	memcpy(ahi[0], k->hi, sizeof(ahi[0]));
	for (i = s0; i < s1 && na; i++) {
		const struct dte_piece *s = &x->src->pieces[x->src_idx[i]];
		for (j = 0, nb = 0; j < na && nb + 2 * DTE_MAX_DIMS < cap; j++)
			nb = box_subtract(k->ndim, alo[j], ahi[j], s->lo, s->hi, blo, bhi, nb);
		memcpy(alo, blo, nb * sizeof(alo[0]));
		memcpy(ahi, bhi, nb * sizeof(ahi[0]));
		na = nb;
	}
	if (na)
		dte_layout_err(x->err, x->errlen, "gap in tensor %s: box %s has no source (sink rank %u buffer %s needs it; %lld of %lld elements of that sink piece uncovered)",
			       x->spec->t[k->tensor].name, dte_layout_box_str(box, sizeof(box), k->ndim, alo[0], ahi[0]),
			       k->rank, b ? b->name : "?", (long long)(dte_piece_volume(k) - covered),
			       (long long)dte_piece_volume(k));
	else
		dte_layout_err(x->err, x->errlen, "gap in tensor %s: sink box %s has %lld of %lld elements without a source",
			       x->spec->t[k->tensor].name, dte_layout_box_str(box, sizeof(box), k->ndim, k->lo, k->hi),
			       (long long)(dte_piece_volume(k) - covered), (long long)dte_piece_volume(k));
out:
	free(alo);
	free(ahi);
	free(blo);
	free(bhi);
	return -1;
}

static int plan_src_disjoint(struct plan_ctx *x, uint32_t t, size_t s0, size_t s1)
{
	int64_t lo[DTE_MAX_DIMS], hi[DTE_MAX_DIMS];
	char box[256];
	size_t i, j;

	for (i = s0; i < s1; i++) {
		const struct dte_piece *a = &x->src->pieces[x->src_idx[i]];
		for (j = i + 1; j < s1; j++) {
			const struct dte_piece *b = &x->src->pieces[x->src_idx[j]];
			if (dte_box_intersect(a->ndim, a->lo, a->hi, b->lo, b->hi, lo, hi))
				return dte_layout_err(x->err, x->errlen,
						      "overlap in tensor %s: box %s has two sources (rank %u buffer %u and rank %u buffer %u)",
						      x->spec->t[t].name, dte_layout_box_str(box, sizeof(box), a->ndim, lo, hi),
						      a->rank, a->buf, b->rank, b->buf);
		}
	}
	return 0;
}

static int plan_add(struct plan_ctx *x, size_t si, size_t ki, const int64_t *lo, const int64_t *hi)
{
	const struct dte_piece *s = &x->src->pieces[si], *k = &x->sink->pieces[ki];
	struct dte_plan *p = x->plan;
	struct dte_plan_entry *e;
	uint32_t d;

	if (p->n == x->cap) {
		size_t ncap = x->cap ? x->cap * 2 : 1024;
		void *np = realloc(p->e, ncap * sizeof(*p->e));
		if (!np)
			return dte_layout_err(x->err, x->errlen, "out of memory");
		p->e = np;
		x->cap = ncap;
	}
	e = &p->e[p->n++];
	memset(e, 0, sizeof(*e));
	e->tensor = s->tensor;
	e->src_piece = (uint32_t)si;
	e->src_rank = s->rank;
	e->src_buf = s->buf;
	e->src_buf_m = s->buf_m;
	e->src_buf_v = s->buf_v;
	e->group = s->group;
	e->sink_piece = (uint32_t)ki;
	e->sink_rank = k->rank;
	e->sink_buf = k->buf;
	e->map.ndim = s->ndim;
	e->map.src_offset = s->offset;
	e->map.dst_offset = k->offset;
	for (d = 0; d < s->ndim; d++) {
		e->lo[d] = lo[d];
		e->map.extent[d] = hi[d] - lo[d];
		e->map.src_stride[d] = s->stride[d];
		e->map.dst_stride[d] = k->stride[d];
		e->map.src_offset += (lo[d] - s->lo[d]) * s->stride[d];
		e->map.dst_offset += (lo[d] - k->lo[d]) * k->stride[d];
	}
	p->elements += dte_box_intersect(s->ndim, lo, hi, lo, hi, NULL, NULL);
	return 0;
}

/* plan_add() for the box [lo, hi), cut into entries of at most
 * DTE_PLAN_ENTRY_MAX elements: slabs along dimension d holding as many
 * whole sub-boxes of the inner dimensions as fit, or, when one sub-box is
 * already too big, one index of d at a time, cut further inside. */
static int plan_add_split(struct plan_ctx *x, size_t si, size_t ki, int64_t *lo, int64_t *hi,
			  uint32_t d)
{
	uint32_t ndim = x->src->pieces[si].ndim;
	int64_t inner = 1, step, l0 = lo[d], h0 = hi[d];
	int rc = 0;

	for (uint32_t i = d + 1; i < ndim; i++)
		inner *= hi[i] - lo[i];
	if (d >= ndim || inner * (h0 - l0) <= DTE_PLAN_ENTRY_MAX)
		return plan_add(x, si, ki, lo, hi);
	step = inner >= DTE_PLAN_ENTRY_MAX ? 1 : DTE_PLAN_ENTRY_MAX / inner;
	for (int64_t a = l0; a < h0 && !rc; a += step) {
		lo[d] = a;
		hi[d] = a + step < h0 ? a + step : h0;
		rc = inner > DTE_PLAN_ENTRY_MAX && d + 1 < ndim ? plan_add_split(x, si, ki, lo, hi, d + 1)
								: plan_add(x, si, ki, lo, hi);
	}
	lo[d] = l0;
	hi[d] = h0;
	return rc;
}

static int plan_tensor(struct plan_ctx *x, uint32_t t)
{
	size_t s0 = x->src_start[t], s1 = x->src_start[t + 1];
	size_t k0 = x->sink_start[t], k1 = x->sink_start[t + 1], i, j;
	int64_t lo[DTE_MAX_DIMS], hi[DTE_MAX_DIMS];

	if (k0 == k1)
		return 0;
	if (plan_src_disjoint(x, t, s0, s1))
		return -1;
	for (j = k0; j < k1; j++) {
		const struct dte_piece *k = &x->sink->pieces[x->sink_idx[j]];
		int64_t covered = 0;
		for (i = s0; i < s1; i++) {
			const struct dte_piece *s = &x->src->pieces[x->src_idx[i]];
			int64_t v = dte_box_intersect(k->ndim, s->lo, s->hi, k->lo, k->hi, lo, hi);
			if (!v)
				continue;
			if (plan_add_split(x, x->src_idx[i], x->sink_idx[j], lo, hi, 0))
				return -1;
			covered += v;
		}
		if (covered != dte_piece_volume(k))
			return plan_gap(x, k, s0, s1, covered);
	}
	return 0;
}

static int entry_detect_cmp(const void *a, const void *b, void *arg)
{
	const struct dte_plan_entry *e = arg;
	const struct dte_plan_entry *x = &e[*(const size_t *)a], *y = &e[*(const size_t *)b];
	uint32_t d;

	if (x->src_piece != y->src_piece)
		return x->src_piece < y->src_piece ? -1 : 1;
	for (d = 0; d < x->map.ndim; d++) {
		if (x->lo[d] != y->lo[d])
			return x->lo[d] < y->lo[d] ? -1 : 1;
		if (x->map.extent[d] != y->map.extent[d])
			return x->map.extent[d] < y->map.extent[d] ? -1 : 1;
	}
	return 0;
}

static int plan_detections(struct dte_plan *p)
{
	size_t *ord = malloc((p->n + 1) * sizeof(size_t)), i, run = 0;

	if (!ord)
		return -1;
	for (i = 0; i < p->n; i++)
		ord[i] = i;
	qsort_r(ord, p->n, sizeof(size_t), entry_detect_cmp, p->e);
	p->ndetect = 0;
	for (i = 0; i < p->n; i++) {
		struct dte_plan_entry *e = &p->e[ord[i]];
		if (i == 0 || entry_detect_cmp(&ord[i - 1], &ord[i], p->e)) {
			int64_t v = 1;
			uint32_t d;
			p->ndetect++;
			for (d = 0; d < e->map.ndim; d++)
				v *= e->map.extent[d];
			p->detect_elements += v;
			run = 0;
		}
		e->detect = (uint32_t)(p->ndetect - 1);
		run++;
		/* A run of two or more: all of them share. */
		if (run == 2)
			p->shared_entries += 2;
		else if (run > 2)
			p->shared_entries++;
	}
	free(ord);
	return 0;
}

static int link_cmp(const void *a, const void *b)
{
	const struct dte_plan_link *x = a, *y = b;

	if (x->src_node != y->src_node)
		return x->src_node < y->src_node ? -1 : 1;
	return x->sink_node < y->sink_node ? -1 : x->sink_node > y->sink_node;
}

static int plan_links(struct dte_plan *p, const struct dte_layout *src, const struct dte_layout *sink)
{
	uint32_t rpn = p->ranks_per_node, r;
	struct dte_plan_link *one;
	size_t i, n = 0;

	p->src_nodes = (src->nranks + rpn - 1) / rpn;
	p->sink_nodes = (sink->nranks + rpn - 1) / rpn;
	one = calloc(p->n + 1, sizeof(*one));
	if (!one)
		return -1;
	for (i = 0; i < p->n; i++) {
		one[i].src_node = p->e[i].src_rank / rpn;
		one[i].sink_node = p->src_nodes + p->e[i].sink_rank / rpn;
	}
	qsort(one, p->n, sizeof(*one), link_cmp);
	for (i = 0; i < p->n; i++)
		if (n == 0 || link_cmp(&one[n - 1], &one[i]))
			one[n++] = one[i];
	p->nlinks = n;
	p->links = calloc(n * p->sink_replicas + 1, sizeof(*p->links));
	if (!p->links) {
		free(one);
		return -1;
	}
	for (i = 0; i < p->n; i++) {
		struct dte_plan_link key, *l;
		int64_t v = 1;
		uint32_t d;
		key.src_node = p->e[i].src_rank / rpn;
		key.sink_node = p->src_nodes + p->e[i].sink_rank / rpn;
		l = bsearch(&key, one, n, sizeof(*one), link_cmp);
		p->e[i].link = (uint32_t)(l - one);
		for (d = 0; d < p->e[i].map.ndim; d++)
			v *= p->e[i].map.extent[d];
		l->entries++;
		l->elements += (uint64_t)v;
	}
	for (r = 0; r < p->sink_replicas; r++)
		for (i = 0; i < n; i++) {
			p->links[r * n + i] = one[i];
			p->links[r * n + i].sink_node += r * p->sink_nodes;
		}
	free(one);
	return 0;
}

int dte_plan_build(struct dte_plan *plan, const struct dte_spec *spec,
		   const struct dte_layout *src, const struct dte_layout *sink,
		   const struct dte_plan_opts *opts, char *err, size_t errlen)
{
	struct plan_ctx x;
	uint32_t t;
	int rc = -1;

	memset(plan, 0, sizeof(*plan));
	memset(&x, 0, sizeof(x));
	if (src->role != DTE_LAYOUT_SOURCE || sink->role != DTE_LAYOUT_SINK)
		return dte_layout_err(err, errlen, "plan: needs a source layout and a sink layout");
	if (dte_layout_validate(src, spec, err, errlen) || dte_layout_validate(sink, spec, err, errlen))
		return -1;
	plan->sink_replicas = opts && opts->sink_replicas ? opts->sink_replicas : 1;
	plan->ranks_per_node = opts && opts->ranks_per_node ? opts->ranks_per_node : DTE_PLAN_DEFAULT_RANKS_PER_NODE;
	x.plan = plan;
	x.spec = spec;
	x.src = src;
	x.sink = sink;
	x.err = err;
	x.errlen = errlen;
	if (plan_bucket(src, spec->n, &x.src_idx, &x.src_start) ||
	    plan_bucket(sink, spec->n, &x.sink_idx, &x.sink_start)) {
		dte_layout_err(err, errlen, "out of memory");
		goto out;
	}
	for (t = 0; t < spec->n; t++)
		if (plan_tensor(&x, t))
			goto out;
	if (plan_detections(plan) || plan_links(plan, src, sink)) {
		dte_layout_err(err, errlen, "out of memory");
		goto out;
	}
	rc = 0;
out:
	free(x.src_idx);
	free(x.src_start);
	free(x.sink_idx);
	free(x.sink_start);
	if (rc)
		dte_plan_fini(plan);
	return rc;
}

void dte_plan_fini(struct dte_plan *plan)
{
	free(plan->e);
	free(plan->links);
	memset(plan, 0, sizeof(*plan));
}

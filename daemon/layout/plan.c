/* daemon/layout/plan.c — intersect, validate, group per link.
 *
 * Coverage is checked by counting, never per element: sources of a tensor
 * must be pairwise disjoint, and for every sink piece the volumes of its
 * intersections with the sources must add up to its own volume.  Together
 * that is "every mapped sink element has exactly one source", in time
 * proportional to the piece pairs, whatever the tensor sizes.
 *
 * At real size (Qwen3-235B over fsdp:dp=64: 2.4 M source pieces, 8 M
 * entries) the plan is built tensor by tensor in one pass: an entry is
 * kept as its two pieces and a detection (16 bytes; dte_plan_entry()
 * writes it out), its detection is numbered within its tensor and then
 * offset by the detections of every earlier source piece, and the link
 * statistics add up in a (source node x sink node) table as entries come;
 * nothing sorts all entries.  dte_plan_count keeps no entry: a tensor's
 * are dropped once its detections are numbered.  A tensor's pieces are
 * taken once as pointers (plan_pieces): into a layout's array, or
 * computed from its rule (layout.h).  docs/BENCHMARKS.md, "Plan at real
 * size".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/layout/gen.h"
#include "daemon/layout/plan.h"

#define PLAN_GAP_BOXES 4096
/* Links are counted in a (source node x sink node) table up to this many
 * cells, else by sorting the entries' node pairs. */
#ifndef PLAN_LINK_TABLE_MAX
#define PLAN_LINK_TABLE_MAX ((size_t)1 << 20)
#endif

/* Entries whose pages are faulted in at once (4 MiB). */
#define PLAN_PREFAULT_ITEMS ((size_t)1 << 18)

/* An entry's detection key while its tensor's detections are numbered. */
struct plan_dkey {
	uint32_t src_piece, item;
	int64_t  lo[DTE_MAX_DIMS], ext[DTE_MAX_DIMS];
};

struct plan_ctx {
	struct dte_plan          *plan;
	const struct dte_spec    *spec;
	const struct dte_layout  *src, *sink;
	uint32_t                 *src_idx, *sink_idx;   /* pieces sorted by tensor */
	size_t                   *src_start, *sink_start;
	size_t                    cap, cap_cuts;
	uint32_t                  ndim;                 /* of the tensor being planned */
	const struct dte_piece  **sp, **kp;             /* its sources and sinks, bucket order */
	struct dte_piece         *spbuf, *kpbuf;        /* computed ones (a layout's rule) */
	size_t                    cap_sp, cap_kp, cap_spbuf, cap_kpbuf;
	size_t                    e0;                   /* its first entry */
	uint32_t                  cur_src;              /* the source of the entries added: sp[cur_src] */
	struct plan_dkey         *keys;                 /* one tensor's entries */
	uint32_t                 *epos, *order, *gcount; /* their source's place in the bucket */
	int64_t                  *hmax;                 /* max hi[0] of the sources so far */
	uint32_t                 *snode;                /* the sources' nodes */
	size_t                    cell;                 /* the node table's cell of the entry added */
	size_t                    cap_keys, cap_epos, cap_order, cap_hmax, cap_gcount, cap_snode;
	int                       lo0_sorted;           /* the tensor's sources in order of lo[0] */
	uint32_t                 *dcount;               /* per source piece: its detections */
	uint64_t                 *link_entries, *link_elements;  /* the node table, or NULL */
	int                       drop;                 /* dte_plan_count: a tensor's entries dropped once counted */
	size_t                    dropped;              /* the entries so dropped */
	char                     *err;
	size_t                    errlen;
};

/* Counting sort of piece indices by tensor: start[t]..start[t+1]. */
static int plan_bucket(const struct dte_layout *l, uint32_t ntensors, uint32_t **idx, size_t **start)
{
	size_t i, *pos;
	uint32_t *tid;

	if (l->npieces >= UINT32_MAX)
		return -1;
	*idx = malloc((l->npieces + 1) * sizeof(**idx));
	*start = calloc((size_t)ntensors + 2, sizeof(size_t));
	pos = calloc((size_t)ntensors + 1, sizeof(size_t));
	tid = malloc((l->npieces + 1) * sizeof(*tid));	/* one pass over the pieces */
	if (!*idx || !*start || !pos || !tid) {
		free(pos);
		free(tid);
		return -1;
	}
	for (i = 0; i < l->npieces; i++)
		(*start)[(tid[i] = dte_layout_piece_tensor(l, i)) + 1]++;
	for (i = 1; i <= ntensors; i++)
		(*start)[i] += (*start)[i - 1];
	for (i = 0; i < l->npieces; i++)
		(*idx)[(*start)[tid[i]] + pos[tid[i]]++] = (uint32_t)i;
	free(pos);
	free(tid);
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
static int plan_gap(struct plan_ctx *x, const struct dte_piece *k, size_t ns, int64_t covered)
{
	static const size_t cap = PLAN_GAP_BOXES;
	int64_t (*alo)[DTE_MAX_DIMS] = malloc(cap * sizeof(*alo)), (*ahi)[DTE_MAX_DIMS] = malloc(cap * sizeof(*ahi));
	int64_t (*blo)[DTE_MAX_DIMS] = malloc(cap * sizeof(*blo)), (*bhi)[DTE_MAX_DIMS] = malloc(cap * sizeof(*bhi));
	struct dte_layout_buffer btmp;
	const struct dte_layout_buffer *b = dte_layout_buffer_get(x->sink, k->rank, k->buf, &btmp);
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
	for (i = 0; i < ns && na; i++) {
		const struct dte_piece *s = x->sp[i];
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

static int plan_src_disjoint_all(struct plan_ctx *x, uint32_t t, size_t ns)
{
	int64_t lo[DTE_MAX_DIMS], hi[DTE_MAX_DIMS];
	char box[256];
	size_t i, j;

	for (i = 0; i < ns; i++) {
		const struct dte_piece *a = x->sp[i];
		for (j = i + 1; j < ns; j++) {
			const struct dte_piece *b = x->sp[j];
			if (dte_box_intersect(a->ndim, a->lo, a->hi, b->lo, b->hi, lo, hi))
				return dte_layout_err(x->err, x->errlen,
						      "overlap in tensor %s: box %s has two sources (rank %u buffer %u and rank %u buffer %u)",
						      x->spec->t[t].name, dte_layout_box_str(box, sizeof(box), a->ndim, lo, hi),
						      a->rank, a->buf, b->rank, b->buf);
		}
	}
	return 0;
}

static int piece_lo0_cmp(const void *a, const void *b, void *arg)
{
	const struct dte_piece *const *sp = arg;
	int64_t x = sp[*(const uint32_t *)a]->lo[0], y = sp[*(const uint32_t *)b]->lo[0];

	return x < y ? -1 : x > y;
}

/* The tensor's sources are pairwise disjoint.  Only pairs whose first
 * dims overlap can meet: in order of lo[0], a piece is checked against
 * the ones after it that start before it ends.  An overlap is named by the
 * pairwise scan, so the message is the one it always was. */
static int plan_src_disjoint(struct plan_ctx *x, uint32_t t, size_t n)
{
	const struct dte_piece **sp = x->sp;
	uint32_t *ord = NULL;
	size_t i, j;

	for (i = 1; i < n && sp[i - 1]->lo[0] <= sp[i]->lo[0]; i++)
		;
	x->lo0_sorted = i >= n;
	if (i < n) {
		if (!(ord = malloc(n * sizeof(*ord))))
			return dte_layout_err(x->err, x->errlen, "out of memory");
		for (i = 0; i < n; i++)
			ord[i] = (uint32_t)i;
		qsort_r(ord, n, sizeof(*ord), piece_lo0_cmp, (void *)sp);
	}
	for (i = 0; i < n; i++) {
		const struct dte_piece *a = sp[ord ? ord[i] : i];
		for (j = i + 1; j < n && sp[ord ? ord[j] : j]->lo[0] < a->hi[0]; j++) {
			const struct dte_piece *b = sp[ord ? ord[j] : j];
			if (dte_box_intersect(a->ndim, a->lo, a->hi, b->lo, b->hi, NULL, NULL)) {
				free(ord);
				return plan_src_disjoint_all(x, t, n);
			}
		}
	}
	free(ord);
	return 0;
}

/* The box of an item: its pieces' (s, k) intersection, or its cut. */
static void plan_item_box(const struct dte_plan *p, const struct dte_plan_item *it,
			  const struct dte_piece *s, const struct dte_piece *k, int64_t *lo, int64_t *hi)
{
	if (it->cut) {
		memcpy(lo, p->cuts[it->cut - 1].lo, s->ndim * sizeof(*lo));
		memcpy(hi, p->cuts[it->cut - 1].hi, s->ndim * sizeof(*hi));
	} else {
		dte_box_intersect(s->ndim, s->lo, s->hi, k->lo, k->hi, lo, hi);
	}
}

static int plan_grow(void **arr, size_t *cap, size_t n, size_t elem);

/* An entry of the tensor being planned, from its source sp[x->cur_src]:
 * its item, and its detection key and place for plan_tensor_detect. */
static int plan_add(struct plan_ctx *x, uint32_t si, uint32_t ki, const int64_t *lo, const int64_t *hi,
		    int whole)
{
	struct dte_plan *p = x->plan;
	struct dte_plan_item *it;
	struct plan_dkey *key;
	uint32_t ndim = x->ndim, d;
	int64_t v = 1;

	if (p->n == x->cap) {
		size_t ncap = x->cap ? x->cap * 2 : 4096;
		void *np = realloc(p->items, ncap * sizeof(*p->items));
		if (!np)
			return dte_layout_err(x->err, x->errlen, "out of memory");
		p->items = np;
		x->cap = ncap;
	}
	/* Fault the next pages of the array in a few MiB at a time. */
	if (p->n % PLAN_PREFAULT_ITEMS == 0)
		dte_layout_prefault(&p->items[p->n], (p->n + PLAN_PREFAULT_ITEMS <= x->cap ? PLAN_PREFAULT_ITEMS
							 : x->cap - p->n) * sizeof(*p->items));
	if (plan_grow((void **)&x->keys, &x->cap_keys, p->n - x->e0 + 1, sizeof(*x->keys)) ||
	    plan_grow((void **)&x->epos, &x->cap_epos, p->n - x->e0 + 1, sizeof(*x->epos)))
		return dte_layout_err(x->err, x->errlen, "out of memory");
	key = &x->keys[p->n - x->e0];
	key->src_piece = si;
	key->item = (uint32_t)p->n;
	for (d = 0; d < ndim; d++) {
		key->lo[d] = lo[d];
		key->ext[d] = hi[d] - lo[d];
	}
	x->epos[p->n - x->e0] = x->cur_src;
	it = &p->items[p->n];
	it->src_piece = si;
	it->sink_piece = ki;
	it->detect = 0;
	it->cut = 0;
	if (!whole) {
		struct dte_plan_cut *c;
		if (p->ncuts == x->cap_cuts) {
			size_t ncap = x->cap_cuts ? x->cap_cuts * 2 : 64;
			void *np = realloc(p->cuts, ncap * sizeof(*p->cuts));
			if (!np)
				return dte_layout_err(x->err, x->errlen, "out of memory");
			p->cuts = np;
			x->cap_cuts = ncap;
		}
		if (p->ncuts >= UINT32_MAX - 1)
			return dte_layout_err(x->err, x->errlen, "plan: too many entries");
		c = &p->cuts[p->ncuts++];
		memset(c, 0, sizeof(*c));
		memcpy(c->lo, lo, ndim * sizeof(*lo));
		memcpy(c->hi, hi, ndim * sizeof(*hi));
		it->cut = (uint32_t)p->ncuts;
	}
	p->n++;
	for (d = 0; d < ndim; d++)
		v *= hi[d] - lo[d];
	p->elements += v;
	if (x->link_entries) {
		x->link_entries[x->cell]++;
		x->link_elements[x->cell] += (uint64_t)v;
	}
	return 0;
}

int64_t dte_plan_entry_max = DTE_PLAN_ENTRY_MAX;

/* plan_add() for the box [lo, hi), cut into entries of at most
 * dte_plan_entry_max elements: slabs along dimension d holding as many
 * whole sub-boxes of the inner dimensions as fit, or, when one sub-box is
 * already too big, one index of d at a time, cut further inside. */
static int plan_add_split(struct plan_ctx *x, uint32_t si, uint32_t ki, int64_t *lo, int64_t *hi,
			  uint32_t d, int whole)
{
	uint32_t ndim = x->ndim;
	int64_t inner = 1, step, l0 = lo[d], h0 = hi[d];
	int rc = 0;

	for (uint32_t i = d + 1; i < ndim; i++)
		inner *= hi[i] - lo[i];
	if (d >= ndim || inner * (h0 - l0) <= dte_plan_entry_max)
		return plan_add(x, si, ki, lo, hi, whole);
	step = inner >= dte_plan_entry_max ? 1 : dte_plan_entry_max / inner;
	/* Slabs of whole 128-row blocks: an FP8 sink's entry must hold its
	 * blocks whole (dte_plan_fp8_split); slab starts stay on the grid of
	 * a box that starts on it. */
	if (step > DTE_FP8_BLOCK)
		step -= step % DTE_FP8_BLOCK;
	for (int64_t a = l0; a < h0 && !rc; a += step) {
		lo[d] = a;
		hi[d] = a + step < h0 ? a + step : h0;
		rc = inner > dte_plan_entry_max && d + 1 < ndim ? plan_add_split(x, si, ki, lo, hi, d + 1, 0)
								: plan_add(x, si, ki, lo, hi, 0);
	}
	lo[d] = l0;
	hi[d] = h0;
	return rc;
}

/* Entries with the same source piece and box share a detection.  They are
 * numbered as one sort of every entry by (source piece, box) would number
 * them; a source piece's entries are all of one tensor, so each tensor
 * numbers its own within their source piece, and dte_plan_build adds the
 * count of every earlier piece's detections. */
static int dkey_cmp(const void *a, const void *b, void *arg)
{
	const struct plan_dkey *x = a, *y = b;
	uint32_t ndim = *(const uint32_t *)arg, d;

	if (x->src_piece != y->src_piece)
		return x->src_piece < y->src_piece ? -1 : 1;
	for (d = 0; d < ndim; d++) {
		if (x->lo[d] != y->lo[d])
			return x->lo[d] < y->lo[d] ? -1 : 1;
		if (x->ext[d] != y->ext[d])
			return x->ext[d] < y->ext[d] ? -1 : 1;
	}
	return 0;
}

static int plan_grow(void **arr, size_t *cap, size_t n, size_t elem)
{
	size_t ncap;
	void *np;

	if (n <= *cap)
		return 0;
	ncap = n > 2 * *cap ? n : 2 * *cap;
	if (!(np = realloc(*arr, ncap * elem)))
		return -1;
	*arr = np;
	*cap = ncap;
	return 0;
}

static int plan_tensor_detect(struct plan_ctx *x, size_t e0, size_t e1, size_t nsrc)
{
	struct dte_plan *p = x->plan;
	size_t n = e1 - e0, i, g, run = 0;
	uint32_t ndim = x->ndim, local, d;

	/* plan_add wrote the entries' keys.  By source piece: the bucket
	 * holds them in index order, so a counting sort on the place in it;
	 * then by box within each. */
	memset(x->gcount, 0, (nsrc + 1) * sizeof(*x->gcount));
	for (i = 0; i < n; i++)
		x->gcount[x->epos[i] + 1]++;
	for (g = 1; g <= nsrc; g++)
		x->gcount[g] += x->gcount[g - 1];
	for (i = 0; i < n; i++)
		x->order[x->gcount[x->epos[i]]++] = (uint32_t)i;
	/* gcount[g] is now the end of group g. */
	for (g = 0, i = 0; g < nsrc; g++) {
		size_t a = i, b = x->gcount[g], q;

		for (q = a + 1; q < b; q++) {
			uint32_t v = x->order[q];
			size_t r = q;
			while (r > a && dkey_cmp(&x->keys[x->order[r - 1]], &x->keys[v], &ndim) > 0) {
				x->order[r] = x->order[r - 1];
				r--;
			}
			x->order[r] = v;
		}
		local = 0;
		for (q = a; q < b; q++) {
			const struct plan_dkey *k = &x->keys[x->order[q]];
			if (q == a || dkey_cmp(&x->keys[x->order[q - 1]], k, &ndim)) {
				int64_t v = 1;
				for (d = 0; d < ndim; d++)
					v *= k->ext[d];
				p->detect_elements += v;
				local++;
				run = 0;
			}
			p->items[k->item].detect = local - 1;
			run++;
			/* A run of two or more: all of them share. */
			if (run == 2)
				p->shared_entries += 2;
			else if (run > 2)
				p->shared_entries++;
		}
		if (b > a)
			x->dcount[x->keys[x->order[a]].src_piece] = local;
		i = b;
	}
	return 0;
}

/* First place in [a, b) whose value (vals, else the pieces' lo[0]) is
 * above v (values nondecreasing). */
static size_t upper_i64(const int64_t *vals, const struct dte_piece *const *sp,
			size_t a, size_t b, int64_t v)
{
	while (a < b) {
		size_t m = a + (b - a) / 2;
		if ((sp ? sp[m]->lo[0] : vals[m]) > v)
			b = m;
		else
			a = m + 1;
	}
	return a;
}

/* The pieces idx[0..n) of a layout as pointers: into its array, or
 * computed into *buf (a layout that keeps a rule). */
static int plan_pieces(const struct dte_layout *l, const uint32_t *idx, size_t n,
		       const struct dte_piece ***ptr, size_t *cap, struct dte_piece **buf, size_t *cap_buf)
{
	size_t i;

	if (plan_grow((void **)ptr, cap, n + 1, sizeof(**ptr)) ||
	    (l->rule && plan_grow((void **)buf, cap_buf, n + 1, sizeof(**buf))))
		return -1;
	for (i = 0; i < n; i++)
		(*ptr)[i] = dte_layout_piece(l, idx[i], l->rule ? &(*buf)[i] : NULL);
	return 0;
}

static int plan_tensor(struct plan_ctx *x, uint32_t t)
{
	size_t s0 = x->src_start[t], s1 = x->src_start[t + 1], ns = s1 - s0;
	size_t k0 = x->sink_start[t], k1 = x->sink_start[t + 1], nk = k1 - k0, i, j, e0 = x->plan->n;
	const struct dte_piece **sp;
	int64_t lo[DTE_MAX_DIMS], hi[DTE_MAX_DIMS];

	if (k0 == k1)
		return 0;
	if (plan_pieces(x->src, &x->src_idx[s0], ns, &x->sp, &x->cap_sp, &x->spbuf, &x->cap_spbuf) ||
	    plan_pieces(x->sink, &x->sink_idx[k0], nk, &x->kp, &x->cap_kp, &x->kpbuf, &x->cap_kpbuf))
		return dte_layout_err(x->err, x->errlen, "out of memory");
	sp = x->sp;
	x->e0 = e0;
	if (plan_src_disjoint(x, t, ns))
		return -1;
	x->ndim = x->kp[0]->ndim;
	if (plan_grow((void **)&x->hmax, &x->cap_hmax, ns + 1, sizeof(*x->hmax)) ||
	    plan_grow((void **)&x->gcount, &x->cap_gcount, ns + 1, sizeof(*x->gcount)) ||
	    plan_grow((void **)&x->snode, &x->cap_snode, ns + 1, sizeof(*x->snode)))
		return dte_layout_err(x->err, x->errlen, "out of memory");
	for (i = 0; i < ns; i++)
		x->snode[i] = sp[i]->rank / x->plan->ranks_per_node;
	/* Sources in order of lo[0]: only those from the first that may reach
	 * the sink piece (hi[0] so far above its lo[0]) to the last that
	 * starts before its end can meet it, in the same order. */
	for (i = 0; x->lo0_sorted && i < ns; i++)
		x->hmax[i] = i && x->hmax[i - 1] > sp[i]->hi[0] ? x->hmax[i - 1] : sp[i]->hi[0];
	for (j = 0; j < nk; j++) {
		const struct dte_piece *k = x->kp[j];
		size_t a = 0, b = ns, knode = k->rank / x->plan->ranks_per_node;
		int64_t covered = 0;

		if (x->lo0_sorted) {
			a = upper_i64(x->hmax, NULL, 0, ns, k->lo[0]);
			b = upper_i64(NULL, sp, 0, ns, k->hi[0] - 1);
		}
		for (i = a; i < b; i++) {
			const struct dte_piece *s = sp[i];
			int64_t v = dte_box_intersect(k->ndim, s->lo, s->hi, k->lo, k->hi, lo, hi);
			if (!v)
				continue;
			x->cell = (size_t)x->snode[i] * x->plan->sink_nodes + knode;
			x->cur_src = (uint32_t)i;
			if (plan_add_split(x, x->src_idx[s0 + i], x->sink_idx[k0 + j], lo, hi, 0, 1))
				return -1;
			covered += v;
		}
		if (covered != dte_piece_volume(k))
			return plan_gap(x, k, ns, covered);
	}
	if (plan_grow((void **)&x->order, &x->cap_order, x->plan->n - e0, sizeof(*x->order)))
		return dte_layout_err(x->err, x->errlen, "out of memory");
	return plan_tensor_detect(x, e0, x->plan->n, ns);
}

/* A tensor's pieces lie far apart (a source's ranks one after the
 * other): ask for the next tensor's while this one is planned (a rule's
 * pieces are computed, not read). */
static void plan_prefetch(const struct plan_ctx *x, uint32_t t)
{
	size_t i;

	if (t >= x->spec->n)
		return;
	for (i = x->src_start[t]; !x->src->rule && i < x->src_start[t + 1]; i++) {
		const char *pc = (const char *)&x->src->pieces[x->src_idx[i]];
		__builtin_prefetch(pc);
		__builtin_prefetch(pc + 64);
		__builtin_prefetch(pc + 128);
	}
	for (i = x->sink_start[t]; !x->sink->rule && i < x->sink_start[t + 1]; i++) {
		const char *pc = (const char *)&x->sink->pieces[x->sink_idx[i]];
		__builtin_prefetch(pc);
		__builtin_prefetch(pc + 64);
		__builtin_prefetch(pc + 128);
	}
}

static int link_cmp(const void *a, const void *b)
{
	const struct dte_plan_link *x = a, *y = b;

	if (x->src_node != y->src_node)
		return x->src_node < y->src_node ? -1 : 1;
	return x->sink_node < y->sink_node ? -1 : x->sink_node > y->sink_node;
}

/* Detection ids from per-piece ones: every earlier source piece's count
 * added. */
static void plan_detections(struct plan_ctx *x)
{
	struct dte_plan *p = x->plan;
	uint64_t base = 0;
	size_t i;

	for (i = 0; i < x->src->npieces; i++) {
		uint32_t c = x->dcount[i];
		x->dcount[i] = (uint32_t)base;
		base += c;
	}
	for (i = 0; p->items && i < p->n; i++)
		p->items[i].detect += x->dcount[p->items[i].src_piece];
	p->ndetect = (size_t)base;
}

struct plan_lkey {
	uint64_t key, elements;
};

static int lkey_cmp(const void *a, const void *b)
{
	uint64_t x = ((const struct plan_lkey *)a)->key, y = ((const struct plan_lkey *)b)->key;

	return x < y ? -1 : x > y;
}

/* One replica's links in (source node, sink node) order, from the node
 * table, or (too many nodes for one) from the entries' node pairs sorted;
 * then every replica's. */
static int plan_links(struct plan_ctx *x)
{
	struct dte_plan *p = x->plan;
	struct dte_plan_link *one = NULL;
	uint32_t rpn = p->ranks_per_node, r;
	size_t i, n = 0, cells = (size_t)p->src_nodes * p->sink_nodes;

	if (x->link_entries) {
		for (i = 0; i < cells; i++)
			n += x->link_entries[i] != 0;
		if (!(one = calloc(n + 1, sizeof(*one))))
			return -1;
		for (i = 0, n = 0; i < cells; i++)
			if (x->link_entries[i]) {
				one[n].src_node = (uint32_t)(i / p->sink_nodes);
				one[n].sink_node = p->src_nodes + (uint32_t)(i % p->sink_nodes);
				one[n].entries = x->link_entries[i];
				one[n].elements = x->link_elements[i];
				n++;
			}
	} else {
		struct plan_lkey *k = malloc((p->n + 1) * sizeof(*k));
		int64_t lo[DTE_MAX_DIMS], hi[DTE_MAX_DIMS];

		if (!k || !(one = calloc(p->n + 1, sizeof(*one)))) {
			free(k);
			return -1;
		}
		for (i = 0; i < p->n; i++) {
			const struct dte_plan_item *it = &p->items[i];
			struct dte_piece st, kt;
			const struct dte_piece *s = dte_layout_piece(x->src, it->src_piece, &st);
			const struct dte_piece *kp = dte_layout_piece(x->sink, it->sink_piece, &kt);
			uint32_t nd = s->ndim, d;
			int64_t v = 1;
			plan_item_box(p, it, s, kp, lo, hi);
			for (d = 0; d < nd; d++)
				v *= hi[d] - lo[d];
			k[i].key = (uint64_t)(s->rank / rpn) << 32 | (p->src_nodes + kp->rank / rpn);
			k[i].elements = (uint64_t)v;
		}
		qsort(k, p->n, sizeof(*k), lkey_cmp);
		for (i = 0; i < p->n; i++) {
			if (n == 0 || k[i].key != k[i - 1].key) {
				one[n].src_node = (uint32_t)(k[i].key >> 32);
				one[n].sink_node = (uint32_t)k[i].key;
				n++;
			}
			one[n - 1].entries++;
			one[n - 1].elements += k[i].elements;
		}
		free(k);
	}
	p->nlinks = n;
	p->links = calloc(n * p->sink_replicas + 1, sizeof(*p->links));
	if (!p->links) {
		free(one);
		return -1;
	}
	for (r = 0; r < p->sink_replicas; r++)
		for (i = 0; i < n; i++) {
			p->links[r * n + i] = one[i];
			p->links[r * n + i].sink_node += r * p->sink_nodes;
		}
	free(one);
	return 0;
}

void dte_plan_entry(const struct dte_plan *p, size_t i, struct dte_plan_entry *e)
{
	const struct dte_plan_item *it = &p->items[i];
	struct dte_piece st, kt;
	const struct dte_piece *s = dte_layout_piece(p->src, it->src_piece, &st);
	const struct dte_piece *k = dte_layout_piece(p->sink, it->sink_piece, &kt);
	int64_t lo[DTE_MAX_DIMS], hi[DTE_MAX_DIMS];
	struct dte_plan_link key;
	const struct dte_plan_link *l;
	uint32_t d;

	plan_item_box(p, it, s, k, lo, hi);
	memset(e, 0, sizeof(*e));
	e->tensor = s->tensor;
	e->src_piece = it->src_piece;
	e->src_rank = s->rank;
	e->src_buf = s->buf;
	e->src_buf_m = s->buf_m;
	e->src_buf_v = s->buf_v;
	e->group = s->group;
	e->sink_piece = it->sink_piece;
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
	e->detect = it->detect;
	key.src_node = s->rank / p->ranks_per_node;
	key.sink_node = p->src_nodes + k->rank / p->ranks_per_node;
	l = bsearch(&key, p->links, p->nlinks, sizeof(*l), link_cmp);
	e->link = l ? (uint32_t)(l - p->links) : 0;
}

static int plan_build(struct dte_plan *plan, const struct dte_spec *spec,
		      const struct dte_layout *src, const struct dte_layout *sink,
		      const struct dte_plan_opts *opts, int counts_only, char *err, size_t errlen);

int dte_plan_build(struct dte_plan *plan, const struct dte_spec *spec,
		   const struct dte_layout *src, const struct dte_layout *sink,
		   const struct dte_plan_opts *opts, char *err, size_t errlen)
{
	return plan_build(plan, spec, src, sink, opts, 0, err, errlen);
}

int dte_plan_count(struct dte_plan *plan, const struct dte_spec *spec,
		   const struct dte_layout *src, const struct dte_layout *sink,
		   const struct dte_plan_opts *opts, char *err, size_t errlen)
{
	return plan_build(plan, spec, src, sink, opts, 1, err, errlen);
}

static int plan_build(struct dte_plan *plan, const struct dte_spec *spec,
		      const struct dte_layout *src, const struct dte_layout *sink,
		      const struct dte_plan_opts *opts, int counts_only, char *err, size_t errlen)
{
	struct plan_ctx x;
	uint32_t t, rpn;
	size_t cells;
	int rc = -1;

	memset(plan, 0, sizeof(*plan));
	memset(&x, 0, sizeof(x));
	if (src->role != DTE_LAYOUT_SOURCE || sink->role != DTE_LAYOUT_SINK)
		return dte_layout_err(err, errlen, "plan: needs a source layout and a sink layout");
	if (dte_layout_validate(src, spec, err, errlen) || dte_layout_validate(sink, spec, err, errlen))
		return -1;
	plan->sink_replicas = opts && opts->sink_replicas ? opts->sink_replicas : 1;
	plan->ranks_per_node = opts && opts->ranks_per_node ? opts->ranks_per_node : DTE_PLAN_DEFAULT_RANKS_PER_NODE;
	plan->src = src;
	plan->sink = sink;
	rpn = plan->ranks_per_node;
	plan->src_nodes = (src->nranks + rpn - 1) / rpn;
	plan->sink_nodes = (sink->nranks + rpn - 1) / rpn;
	x.plan = plan;
	x.spec = spec;
	x.src = src;
	x.sink = sink;
	x.err = err;
	x.errlen = errlen;
	cells = (size_t)plan->src_nodes * plan->sink_nodes;
	if (cells <= PLAN_LINK_TABLE_MAX) {
		x.link_entries = calloc(cells + 1, sizeof(*x.link_entries));
		x.link_elements = calloc(cells + 1, sizeof(*x.link_elements));
	}
	x.dcount = calloc(src->npieces + 1, sizeof(*x.dcount));
	/* Entries are counted per tensor and the links in the node table:
	 * once a tensor's detections are numbered, nothing reads its items. */
	x.drop = counts_only && x.link_entries;
	if (plan_bucket(src, spec->n, &x.src_idx, &x.src_start) ||
	    plan_bucket(sink, spec->n, &x.sink_idx, &x.sink_start) || !x.dcount ||
	    (cells <= PLAN_LINK_TABLE_MAX && (!x.link_entries || !x.link_elements))) {
		dte_layout_err(err, errlen, "out of memory");
		goto out;
	}
	for (t = 0; t < spec->n; t++) {
		plan_prefetch(&x, t + 1);
		if (plan_tensor(&x, t))
			goto out;
		if (x.drop) {
			x.dropped += plan->n;
			plan->n = 0;
		}
	}
	if (x.drop) {
		plan->n = x.dropped;
		free(plan->items);
		plan->items = NULL;
	}
	if (plan->n >= UINT32_MAX) {
		dte_layout_err(err, errlen, "plan: %zu entries, too many", plan->n);
		goto out;
	}
	/* Give back what growing left over. */
	if (plan->items && plan->n && plan->n < x.cap) {
		void *np = realloc(plan->items, plan->n * sizeof(*plan->items));
		if (np)
			plan->items = np;
	}
	plan_detections(&x);
	if (plan_links(&x)) {
		dte_layout_err(err, errlen, "out of memory");
		goto out;
	}
	rc = 0;
out:
	free(x.src_idx);
	free(x.src_start);
	free(x.sink_idx);
	free(x.sink_start);
	free(x.sp);
	free(x.kp);
	free(x.spbuf);
	free(x.kpbuf);
	free(x.keys);
	free(x.epos);
	free(x.order);
	free(x.gcount);
	free(x.hmax);
	free(x.snode);
	free(x.dcount);
	free(x.link_entries);
	free(x.link_elements);
	if (rc)
		dte_plan_fini(plan);
	return rc;
}

void dte_plan_fini(struct dte_plan *plan)
{
	free(plan->items);
	free(plan->cuts);
	free(plan->links);
	memset(plan, 0, sizeof(*plan));
}

int dte_plan_fp8_split(const struct dte_layout_fp8 *f, const struct dte_plan_entry *pe,
		       const char *tensor, struct dte_fp8_split *out, char *err, size_t errlen)
{
	const int64_t B = DTE_FP8_BLOCK;
	int64_t R = pe->map.extent[0], C = pe->map.extent[1], off = pe->map.dst_offset;
	int64_t mat, in, row, col, sr, sc, at;

	memset(out, 0, sizeof(*out));
	if (f->rows <= 0 || f->cols <= 0 || f->mats <= 0)
		return dte_layout_err(err, errlen, "fp8: %s: empty matrix", tensor);
	if (pe->map.ndim != 2 || pe->map.dst_stride[0] != f->cols || pe->map.dst_stride[1] != 1 ||
	    R <= 0 || C <= 0 || off < 0 || off >= f->mats * f->rows * f->cols)
		return dte_layout_err(err, errlen, "fp8: %s: an entry is not a box of rows of the "
				      "rank's [%lld, %lld] matrix", tensor, (long long)f->rows,
				      (long long)f->cols);
	mat = off / (f->rows * f->cols);
	in = off % (f->rows * f->cols);
	row = in / f->cols;
	col = in % f->cols;
	if (row % B || col % B || (R % B && row + R != f->rows) || (C % B && col + C != f->cols) ||
	    row + R > f->rows || col + C > f->cols)
		return dte_layout_err(err, errlen, "fp8: %s: rows [%lld, %lld) cols [%lld, %lld) of "
				      "the rank's matrix are not whole %lld x %lld blocks: a source "
				      "piece (or a %lld-element plan slab) splits a block, so no source "
				      "holds it whole to compute its scale (docs/SYNC.md, \"FP8 "
				      "sinks\")", tensor, (long long)row, (long long)(row + R),
				      (long long)col, (long long)(col + C), (long long)B, (long long)B,
				      (long long)dte_plan_entry_max);
	if (f->cols % 2)
		return dte_layout_err(err, errlen, "fp8: %s: %lld codes a row: dted moves FP8 codes "
				      "two to a 16-bit unit, so a row needs an even count", tensor,
				      (long long)f->cols);
	sr = (f->rows + B - 1) / B;
	sc = (f->cols + B - 1) / B;
	at = mat * sr * sc + (row / B) * sc + col / B;
	out->src_extent[0] = R;
	out->src_extent[1] = C;
	out->codes.ndim = 2;
	out->codes.extent[0] = R;
	out->codes.extent[1] = C / 2;
	out->codes.dst_offset = off / 2;
	out->codes.dst_stride[0] = f->cols / 2;
	out->codes.dst_stride[1] = 1;
	out->scales.ndim = 3;
	out->scales.extent[0] = (R + B - 1) / B;
	out->scales.extent[1] = (C + B - 1) / B;
	out->scales.extent[2] = 2;
	out->scales.dst_offset = 2 * at;
	out->scales.dst_stride[0] = 2 * sc;
	out->scales.dst_stride[1] = 2;
	out->scales.dst_stride[2] = 1;
	for (int m = 0; m < 2; m++) {
		struct dte_box_map *x = m ? &out->scales : &out->codes;

		x->src_offset = pe->map.src_offset;
		x->src_stride[0] = pe->map.src_stride[0];
		x->src_stride[1] = pe->map.src_stride[1];
	}
	return 0;
}

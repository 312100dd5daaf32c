/* daemon/layout/gen_fsdp.c — FSDP2 trainer as a source.
 *
 * FSDP2 shards every parameter (HF names, HF shapes) on dim 0 over the dp
 * ranks with torch.chunk semantics: chunk = ceil(d0 / dp) rows, rank r holds
 * rows [r*chunk, min((r+1)*chunk, d0)); trailing ranks may hold a short or
 * empty shard.  Each rank registers, per parameter it holds rows of, its
 * local shard and the optimizer states as three fp32 buffers with ids
 * 3*tensor_id + {0, 1, 2} (param, exp_avg, exp_avg_sq), row-major.
 *
 * A piece is all of one rank's shard of one tensor, and so are its three
 * buffers, so both follow from (tensor, rank): a layout for a plan only
 * keeps those 8 bytes a piece (the rule) instead of the 184-byte piece
 * and three 24-byte buffers, which at dp=64 over Qwen3-235B's 36,945
 * tensors are 2.4 M pieces (435 MB) and 7.1 M buffers (170 MB).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/layout/gen.h"

#define FSDP_MAX_DP 65536

struct fsdp_ref {
	uint32_t tensor, rank;
};

/* Per tensor: rank 0's piece, whose rows [0, chunk) every rank's shifts
 * (no division per piece), and the tensor's rows and row length. */
struct fsdp_tensor {
	struct dte_piece p0;
	int64_t          rows, inner;
};

struct dte_layout_rule {
	const struct dte_spec *spec;
	int64_t                dp;
	struct fsdp_tensor    *t;           /* per tensor */
	struct fsdp_ref       *ref;         /* per piece, in the layout's order */
	size_t                *rank_start;  /* dp + 1: rank r's pieces from ref[rank_start[r]] */
	const char           **names;       /* 3 per tensor: buffer 3t + k's name */
};

/* Rows [*lo, *hi) of tensor t's dim 0 that rank r holds (empty: hi <= lo). */
static void fsdp_rows(const struct dte_spec_tensor *t, int64_t dp, int64_t r, int64_t *lo, int64_t *hi)
{
	int64_t chunk = (t->shape[0] + dp - 1) / dp;

	*lo = r * chunk;
	*hi = *lo + chunk < t->shape[0] ? *lo + chunk : t->shape[0];
}

/* Rank r's piece of tensor i (its rows not empty). */
static void fsdp_piece(const struct dte_spec *spec, int64_t dp, uint32_t i, int64_t r,
		       struct dte_piece *p)
{
	const struct dte_spec_tensor *t = &spec->t[i];
	int64_t lo, hi, id = 3 * (int64_t)i;
	uint32_t d;

	fsdp_rows(t, dp, r, &lo, &hi);
	memset(p, 0, sizeof(*p));
	p->tensor = i;
	p->ndim = t->ndim;
	p->rank = (uint32_t)r;
	p->buf = (uint32_t)id;
	p->buf_m = (uint32_t)id + 1;
	p->buf_v = (uint32_t)id + 2;
	p->group = t->group;
	for (d = 0; d < t->ndim; d++) {
		p->lo[d] = d ? 0 : lo;
		p->hi[d] = d ? t->shape[d] : hi;
	}
	for (d = t->ndim; d > 0; d--)
		p->stride[d - 1] = d == t->ndim ? 1 : p->stride[d] * t->shape[d];
}

/* The rows of rank r from its tensor's rank 0 piece: as fsdp_rows. */
static void fsdp_rule_rows(const struct fsdp_tensor *ft, uint32_t r, int64_t *lo, int64_t *hi)
{
	int64_t chunk = ft->p0.hi[0];

	*lo = r * chunk;
	*hi = *lo + chunk < ft->rows ? *lo + chunk : ft->rows;
}

static const struct dte_piece *rule_piece(const struct dte_layout *l, size_t i,
					      struct dte_piece *tmp)
{
	const struct fsdp_ref *r = &l->rule->ref[i];

	*tmp = l->rule->t[r->tensor].p0;
	tmp->rank = r->rank;
	fsdp_rule_rows(&l->rule->t[r->tensor], r->rank, &tmp->lo[0], &tmp->hi[0]);
	return tmp;
}

static uint32_t rule_tensor(const struct dte_layout *l, size_t i)
{
	return l->rule->ref[i].tensor;
}

/* Buffers come three a piece, in the pieces' order: param, exp_avg,
 * exp_avg_sq of one rank's shard of one tensor. */
static const struct dte_layout_buffer *rule_buffer(const struct dte_layout *l, size_t i,
						       struct dte_layout_buffer *tmp)
{
	const struct dte_layout_rule *u = l->rule;
	const struct fsdp_ref *r = &u->ref[i / 3];
	const struct fsdp_tensor *ft = &u->t[r->tensor];
	int64_t lo, hi;

	fsdp_rule_rows(ft, r->rank, &lo, &hi);
	tmp->rank = r->rank;
	tmp->id = 3 * r->tensor + (uint32_t)(i % 3);
	tmp->length = (hi - lo) * ft->inner;
	tmp->name = u->names[tmp->id];
	return tmp;
}

static size_t rule_buffer_index(const struct dte_layout *l, uint32_t rank, uint32_t id)
{
	const struct dte_layout_rule *u = l->rule;
	size_t a, b;

	if (rank >= u->dp || id / 3 >= u->spec->n)
		return SIZE_MAX;
	/* A rank's pieces are in tensor order. */
	for (a = u->rank_start[rank], b = u->rank_start[rank + 1]; a < b;) {
		size_t m = a + (b - a) / 2;
		if (u->ref[m].tensor < id / 3)
			a = m + 1;
		else
			b = m;
	}
	if (a == u->rank_start[rank + 1] || u->ref[a].tensor != id / 3)
		return SIZE_MAX;
	return 3 * a + id % 3;
}

static void rule_free(struct dte_layout_rule *rule)
{
	if (rule) {
		free(rule->t);
		free(rule->ref);
		free(rule->rank_start);
		free(rule->names);
	}
	free(rule);
}

static const struct dte_layout_rule_ops fsdp_rule_ops = {
	.piece = rule_piece,
	.tensor = rule_tensor,
	.buffer = rule_buffer,
	.buffer_index = rule_buffer_index,
	.free = rule_free,
};

int dte_layout_fsdp(struct dte_layout *l, const struct dte_spec *spec,
		    const struct dte_fsdp_cfg *cfg, char *err, size_t errlen)
{
	int64_t r, lo, hi, inner;
	const char **names;
	size_t npieces = 0;
	uint32_t i, d;
	int rc = -1;

	if (cfg->dp < 1 || cfg->dp > FSDP_MAX_DP)
		return dte_layout_err(err, errlen, "fsdp: dp must be in [1, %d]", FSDP_MAX_DP);
	snprintf(l->desc, sizeof(l->desc), "fsdp:dp=%lld", (long long)cfg->dp);
	/* Every rank names a tensor's buffers alike: three names a tensor, and
	 * exactly the room the pieces, buffers and tensors take. */
	if (!(names = calloc((size_t)spec->n * 3 + 1, sizeof(*names))))
		return dte_layout_err(err, errlen, "fsdp: out of memory");
	for (i = 0; i < spec->n; i++) {
		const struct dte_spec_tensor *t = &spec->t[i];
		int64_t chunk = (t->shape[0] + cfg->dp - 1) / cfg->dp;
		npieces += (size_t)((t->shape[0] + chunk - 1) / chunk);
		if (!(names[3 * i] = dte_layout_name(l, "%s", t->name)) ||
		    !(names[3 * i + 1] = dte_layout_name(l, "%s exp_avg", t->name)) ||
		    !(names[3 * i + 2] = dte_layout_name(l, "%s exp_avg_sq", t->name)))
			goto oom;
	}
	if (cfg->rule) {
		l->rule_ops = &fsdp_rule_ops;	/* dte_layout_fini frees the rule through it */
		if (!(l->rule = calloc(1, sizeof(*l->rule))) ||
		    !(l->rule->t = malloc(((size_t)spec->n + 1) * sizeof(*l->rule->t))) ||
		    !(l->rule->ref = malloc((npieces + 1) * sizeof(*l->rule->ref))) ||
		    !(l->rule->rank_start = calloc((size_t)cfg->dp + 1, sizeof(*l->rule->rank_start))))
			goto oom;
		l->rule->spec = spec;
		l->rule->dp = cfg->dp;
		l->rule->names = names;		/* the rule's now */
		names = NULL;
		dte_layout_prefault(l->rule->ref, npieces * sizeof(*l->rule->ref));
		for (i = 0; i < spec->n; i++) {
			fsdp_piece(spec, cfg->dp, i, 0, &l->rule->t[i].p0);
			l->rule->t[i].rows = spec->t[i].shape[0];
			l->rule->t[i].inner = spec->t[i].numel / spec->t[i].shape[0];
		}
		for (r = 0; r < cfg->dp; r++) {
			l->rule->rank_start[r] = l->npieces;
			for (i = 0; i < spec->n; i++) {
				fsdp_rows(&spec->t[i], cfg->dp, r, &lo, &hi);
				if (hi <= lo)
					continue;
				l->rule->ref[l->npieces].tensor = i;
				l->rule->ref[l->npieces].rank = (uint32_t)r;
				l->npieces++;
				l->nranks = (uint32_t)r + 1;
			}
		}
		l->rule->rank_start[cfg->dp] = l->npieces;
		l->nbufs = 3 * l->npieces;
		return 0;
	}
	if (dte_layout_reserve(l, npieces, 3 * npieces, npieces))
		goto oom;
	for (r = 0; r < cfg->dp; r++) {
		for (i = 0; i < spec->n; i++) {
			const struct dte_spec_tensor *t = &spec->t[i];
			int64_t id = 3 * (int64_t)i, shape[DTE_MAX_DIMS];
			struct dte_piece p;

			fsdp_rows(t, cfg->dp, r, &lo, &hi);
			if (hi <= lo)
				continue;
			inner = t->numel / t->shape[0];
			if (dte_layout_add_buffer_named(l, (uint32_t)r, id, (hi - lo) * inner, names[3 * i]) < 0 ||
			    dte_layout_add_buffer_named(l, (uint32_t)r, id + 1, (hi - lo) * inner, names[3 * i + 1]) < 0 ||
			    dte_layout_add_buffer_named(l, (uint32_t)r, id + 2, (hi - lo) * inner, names[3 * i + 2]) < 0)
				goto oom;
			fsdp_piece(spec, cfg->dp, i, r, &p);
			if (dte_layout_add_piece(l, &p))
				goto oom;
			shape[0] = hi - lo;
			for (d = 1; d < t->ndim; d++)
				shape[d] = t->shape[d];
			if (dte_layout_add_tensor_named(l, (uint32_t)r, (uint32_t)id, 0, t->ndim, shape, names[3 * i]))
				goto oom;
		}
	}
	dte_layout_sort_buffers(l);
	rc = 0;
oom:
	free(names);
	return rc ? dte_layout_err(err, errlen, "fsdp: out of memory") : 0;
}

/* daemon/layout/gen_shards.c — sources that register what their optimizer
 * holds: one (parameter, flat range) per shard.
 *
 * Real trainers do not keep FP32 masters or Adam moments in flat buffers:
 * Megatron-Core's DistributedOptimizer allocates one FP32 master per
 * parameter shard (megatron/core/optimizer/distrib_optimizer.py,
 * DistributedOptimizer._build_model_and_main_param_groups:
 * `shard_main_param = shard_model_param.clone().float()`) and the inner
 * optimizer creates exp_avg / exp_avg_sq per such shard; the shard is the
 * contiguous range param_range_map[param]["param"] of the flattened
 * TP-local parameter (_build_model_gbuf_range).  FSDP2 (torch
 * distributed/fsdp/_fully_shard) gives every rank a dim-0 torch.chunk of
 * each parameter, again a contiguous flat range, and optimizer states of
 * the same local shape.  So the trainer says per buffer which parameter
 * and which range it holds, and dted maps the range through the
 * parameter's TP conversion into canonical space.  Bucket sizes, padding
 * and which buffer a parameter sat in never matter here.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/layout/gen.h"

#define SHARD_MAX_RANK  (1 << 20)
#define SHARD_MAX_LINES (1 << 22)

static int parse_i64(const char *s, int64_t *v)
{
	char *end;
	long long x;

	errno = 0;
	x = strtoll(s, &end, 10);
	if (errno || end == s || *end)
		return -1;
	*v = x;
	return 0;
}

static int shard_line(char *line, struct dte_shard *s, char *err, size_t errlen, size_t ln)
{
	char *f[6], *save = NULL, *tok, *dsave = NULL;
	int nf = 0;
	int64_t v, numel = 1;

	for (tok = strtok_r(line, " \t\r", &save); tok; tok = strtok_r(NULL, " \t\r", &save)) {
		if (nf == 6)
			return dte_layout_err(err, errlen, "shards line %zu: more than 6 fields", ln);
		f[nf++] = tok;
	}
	if (nf != 6)
		return dte_layout_err(err, errlen, "shards line %zu: want \"rank group lo hi name "
				      "shape\", got %d fields", ln, nf);
	memset(s, 0, sizeof(*s));
	if (parse_i64(f[0], &v) || v < 0 || v >= SHARD_MAX_RANK)
		return dte_layout_err(err, errlen, "shards line %zu: rank \"%s\" is not in [0, %d)",
				      ln, f[0], SHARD_MAX_RANK);
	s->rank = (uint32_t)v;
	if (parse_i64(f[1], &v) || v < 0 || v >= DTE_SHARD_MAX_GROUPS)
		return dte_layout_err(err, errlen, "shards line %zu: group \"%s\" is not in [0, %d)",
				      ln, f[1], DTE_SHARD_MAX_GROUPS);
	s->group = (uint32_t)v;
	if (parse_i64(f[2], &s->lo) || parse_i64(f[3], &s->hi))
		return dte_layout_err(err, errlen, "shards line %zu: range \"%s %s\" is not two "
				      "integers", ln, f[2], f[3]);
	if (strlen(f[4]) >= DTE_LAYOUT_NAME_MAX)
		return dte_layout_err(err, errlen, "shards line %zu: name longer than %d", ln,
				      DTE_LAYOUT_NAME_MAX - 1);
	strcpy(s->name, f[4]);
	for (tok = strtok_r(f[5], ",", &dsave); tok; tok = strtok_r(NULL, ",", &dsave)) {
		if (s->ndim == DTE_MAX_DIMS)
			return dte_layout_err(err, errlen, "shards line %zu: %s has more than %d dims",
					      ln, s->name, DTE_MAX_DIMS);
		if (parse_i64(tok, &v) || v < 1 || v > (INT64_C(1) << 40))
			return dte_layout_err(err, errlen, "shards line %zu: %s: dim \"%s\" is not a "
					      "positive integer", ln, s->name, tok);
		s->shape[s->ndim++] = v;
		if (numel > (INT64_C(1) << 48) / v)
			return dte_layout_err(err, errlen, "shards line %zu: %s is too large", ln,
					      s->name);
		numel *= v;
	}
	if (!s->ndim)
		return dte_layout_err(err, errlen, "shards line %zu: %s has no shape", ln, s->name);
	if (s->lo < 0 || s->hi <= s->lo || s->hi > numel)
		return dte_layout_err(err, errlen, "shards line %zu: %s: range [%lld, %lld) is not a "
				      "non-empty part of its %lld elements", ln, s->name,
				      (long long)s->lo, (long long)s->hi, (long long)numel);
	return 0;
}

int dte_shards_parse(const char *text, struct dte_shard **out, size_t *n, char *err,
		     size_t errlen)
{
	struct dte_shard *a = NULL;
	size_t na = 0, cap = 0, ln = 0;
	const char *p = text ? text : "";

	*out = NULL;
	*n = 0;
	while (*p) {
		const char *e = strchr(p, '\n');
		size_t len = e ? (size_t)(e - p) : strlen(p);
		const char *q = p, *end = p + len;
		char line[512];

		ln++;
		p = e ? e + 1 : end;
		while (q < end && (*q == ' ' || *q == '\t' || *q == '\r'))
			q++;
		if (q == end || *q == '#')
			continue;
		if ((size_t)(end - q) >= sizeof(line)) {
			free(a);
			return dte_layout_err(err, errlen, "shards line %zu: longer than %zu", ln,
					      sizeof(line) - 1);
		}
		memcpy(line, q, (size_t)(end - q));
		line[end - q] = 0;
		if (na == cap) {
			size_t nc = cap ? cap * 2 : 64;
			void *np;

			if (nc > SHARD_MAX_LINES) {
				free(a);
				return dte_layout_err(err, errlen, "shards: more than %d lines",
						      SHARD_MAX_LINES);
			}
			np = realloc(a, nc * sizeof(*a));
			if (!np) {
				free(a);
				return dte_layout_err(err, errlen, "shards: out of memory");
			}
			a = np;
			cap = nc;
		}
		if (shard_line(line, &a[na], err, errlen, ln)) {
			free(a);
			return -1;
		}
		na++;
	}
	*out = a;
	*n = na;
	return 0;
}

/* HF names (FSDP2): the parameter is the canonical tensor itself. */
static int hf_shard_pieces(struct dte_layout *l, const struct dte_spec *spec, uint32_t rank,
			   const struct dte_shard *s, uint32_t bufid, char *err, size_t errlen)
{
	int64_t blo[2 * DTE_MAX_DIMS - 1][DTE_MAX_DIMS], bhi[2 * DTE_MAX_DIMS - 1][DTE_MAX_DIMS];
	int32_t id = dte_spec_find(spec, s->name);
	const struct dte_spec_tensor *t;
	uint32_t d;
	int nb, b;

	if (id < 0)
		return dte_layout_err(err, errlen, "fsdp2: rank %u: the model has no tensor %s", rank,
				      s->name);
	t = &spec->t[id];
	if (t->ndim != s->ndim || memcmp(t->shape, s->shape, t->ndim * sizeof(*t->shape)))
		return dte_layout_err(err, errlen, "fsdp2: rank %u: %s is registered with %u dims "
				      "[%lld, ...], the model's is %u dims [%lld, ...]", rank, s->name,
				      s->ndim, (long long)s->shape[0], t->ndim, (long long)t->shape[0]);
	nb = dte_layout_flat_boxes(t->ndim, t->shape, s->lo, s->hi, blo, bhi);
	for (b = 0; b < nb; b++) {
		struct dte_piece pc;

		memset(&pc, 0, sizeof(pc));
		pc.tensor = (uint32_t)id;
		pc.ndim = t->ndim;
		pc.rank = rank;
		pc.buf = bufid;
		pc.buf_m = bufid + 1;
		pc.buf_v = bufid + 2;
		pc.group = s->group;
		pc.offset = -s->lo;
		for (d = t->ndim; d > 0; d--)
			pc.stride[d - 1] = d == t->ndim ? 1 : pc.stride[d] * t->shape[d];
		for (d = 0; d < t->ndim; d++) {
			pc.lo[d] = blo[b][d];
			pc.hi[d] = bhi[b][d];
			pc.offset += blo[b][d] * pc.stride[d];
		}
		if (dte_layout_add_piece(l, &pc))
			return dte_layout_err(err, errlen, "fsdp2: out of memory");
	}
	return 0;
}

int dte_layout_shards(struct dte_layout *l, const struct dte_spec *spec,
		      const struct dte_shards_cfg *cfg, const struct dte_shard *s, size_t n,
		      char *err, size_t errlen)
{
	const struct dte_shard **byrank = NULL;
	uint32_t *bufid = NULL;
	size_t *cnt = NULL, i;
	int64_t r;
	int rc = -1;

	if (cfg->ranks < 1 || cfg->ranks > SHARD_MAX_RANK)
		return dte_layout_err(err, errlen, "%s: %lld ranks", cfg->megatron ? "mcore" : "fsdp2",
				      (long long)cfg->ranks);
	if (cfg->megatron && dte_megatron_check(spec, &cfg->mg, err, errlen))
		return -1;
	for (i = 0; i < n; i++)
		if ((int64_t)s[i].rank >= cfg->ranks)
			return dte_layout_err(err, errlen, "%s: shard %s on rank %u; the trainer has "
					      "ranks 0..%lld", cfg->megatron ? "mcore" : "fsdp2",
					      s[i].name, s[i].rank, (long long)cfg->ranks - 1);
	cnt = calloc((size_t)cfg->ranks + 1, sizeof(*cnt));
	byrank = calloc(n ? n : 1, sizeof(*byrank));
	bufid = calloc(n ? n : 1, sizeof(*bufid));
	if (!cnt || !byrank || !bufid) {
		dte_layout_err(err, errlen, "shards: out of memory");
		goto out;
	}
	/* Stable bucket sort by rank: a rank's shards keep their table order. */
	for (i = 0; i < n; i++)
		cnt[s[i].rank + 1]++;
	for (r = 0; r < cfg->ranks; r++)
		cnt[r + 1] += cnt[r];
	for (i = 0; i < n; i++)
		byrank[cnt[s[i].rank]++] = &s[i];
	/* cnt[r] is now the end of rank r's run. */
	for (r = 0, i = 0; r < cfg->ranks; r++) {
		size_t a = i, k;
		struct dte_shard *run;

		for (; i < cnt[r]; i++) {
			const struct dte_shard *x = byrank[i];
			uint32_t id = (uint32_t)(3 * (i - a));
			int64_t len = x->hi - x->lo;

			bufid[i] = id;
			if (dte_layout_add_buffer(l, (uint32_t)r, id, len, "%s [%lld, %lld)", x->name,
						  (long long)x->lo, (long long)x->hi) < 0 ||
			    dte_layout_add_buffer(l, (uint32_t)r, id + 1, len, "%s exp_avg", x->name) < 0 ||
			    dte_layout_add_buffer(l, (uint32_t)r, id + 2, len, "%s exp_avg_sq", x->name) < 0 ||
			    dte_layout_add_tensor(l, (uint32_t)r, id, -x->lo, x->ndim, x->shape, x->name)) {
				dte_layout_err(err, errlen, "shards: out of memory");
				goto out;
			}
		}
		if (i == a)
			continue;
		if (!cfg->megatron) {
			for (k = a; k < i; k++)
				if (hf_shard_pieces(l, spec, (uint32_t)r, byrank[k], bufid[k], err, errlen))
					goto out;
			continue;
		}
		run = malloc((i - a) * sizeof(*run));
		if (!run) {
			dte_layout_err(err, errlen, "shards: out of memory");
			goto out;
		}
		for (k = a; k < i; k++)
			run[k - a] = *byrank[k];
		k = (size_t)dte_megatron_shard_pieces(l, spec, &cfg->mg, (uint32_t)r, run, i - a,
						      bufid + a, err, errlen);
		free(run);
		if (k)
			goto out;
	}
	/* Every rank exists, with or without shards. */
	if (l->nranks < (uint32_t)cfg->ranks)
		l->nranks = (uint32_t)cfg->ranks;
	dte_layout_sort_buffers(l);
	rc = 0;
out:
	free(cnt);
	free(byrank);
	free(bufid);
	return rc;
}

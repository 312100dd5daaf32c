/* tests/unit/test_plan.c — plans: coverage over the real model matrix,
 * element accounting, gaps and overlaps named, replicas and links. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include "daemon/layout/gen.h"
#include "daemon/layout/plan.h"
#include "tests/unit/slurp.h"

#define DATA "tests/data/layout/"

static void spec_load(struct dte_spec *s, const char *path)
{
	char err[256];

	if (dte_spec_load_file(s, path, err, sizeof(err)))
		fail_msg("%s", err);
}

/* Sink elements an SGLang replica holds, computed from the config alone:
 * norms and the router on every rank, KV rows replicated when tp > kv. */
static int64_t sglang_elements(const struct dte_spec *s, int64_t tp)
{
	const struct dte_spec_cfg *c = &s->cfg;
	int64_t kvrep = tp > c->kv_heads ? tp / c->kv_heads : 1, n = 0;
	uint32_t i;

	for (i = 0; i < s->n; i++) {
		const struct dte_spec_tensor *t = &s->t[i];
		switch (t->kind) {
		case DTE_SPEC_K: case DTE_SPEC_V: case DTE_SPEC_K_BIAS: case DTE_SPEC_V_BIAS:
			n += t->numel * kvrep;
			break;
		case DTE_SPEC_IN_NORM: case DTE_SPEC_POST_NORM: case DTE_SPEC_FINAL_NORM:
		case DTE_SPEC_Q_NORM: case DTE_SPEC_K_NORM: case DTE_SPEC_ROUTER:
			n += t->numel * tp;
			break;
		default:
			n += t->numel;
		}
	}
	return n;
}

struct matrix {
	int plans, refused;
	int64_t cut_entries;       /* entries of tensors over DTE_PLAN_ENTRY_MAX */
};

static void run_matrix(const char *model, const char *const *srcs, size_t nsrc,
		       const char *const *sinks, size_t nsink, struct matrix *m)
{
	struct dte_layout *sl = calloc(nsrc, sizeof(*sl)), *kl = calloc(nsink, sizeof(*kl));
	int *sok = calloc(nsrc, sizeof(int)), *kok = calloc(nsink, sizeof(int));
	struct dte_spec s;
	char err[512];
	size_t i, j;

	spec_load(&s, model);
	for (i = 0; i < nsrc; i++) {
		sok[i] = !dte_layout_from_desc(&sl[i], &s, srcs[i], DTE_LAYOUT_SOURCE, err, sizeof(err));
		/* The only acceptable refusal: a clear divisibility reason. */
		if (!sok[i] && !strstr(err, "does not divide"))
			fail_msg("%s %s: unexpected error: %s", model, srcs[i], err);
		m->refused += !sok[i];
	}
	for (j = 0; j < nsink; j++) {
		kok[j] = !dte_layout_from_desc(&kl[j], &s, sinks[j], DTE_LAYOUT_SINK, err, sizeof(err));
		if (!kok[j] && !strstr(err, "does not divide") && !strstr(err, "neither divides"))
			fail_msg("%s %s: unexpected error: %s", model, sinks[j], err);
		m->refused += !kok[j];
	}
	for (i = 0; i < nsrc; i++) {
		for (j = 0; j < nsink; j++) {
			struct dte_plan p;
			struct dte_plan_opts o = { 1, 8 };
			int64_t tp;
			if (!sok[i] || !kok[j])
				continue;
			if (dte_plan_build(&p, &s, &sl[i], &kl[j], &o, err, sizeof(err)))
				fail_msg("%s %s -> %s: %s", model, srcs[i], sinks[j], err);
			tp = kl[j].nranks;
			if (p.elements != sglang_elements(&s, tp))
				fail_msg("%s %s -> %s: %lld sink elements, expected %lld", model, srcs[i], sinks[j],
					 (long long)p.elements, (long long)sglang_elements(&s, tp));
			/* Each source element is scanned once, whatever the fan-out. */
			assert_int_equal(p.detect_elements, s.total_elems);
			/* No entry over the cap; big tensors come in slabs. */
			for (size_t q = 0; q < p.n; q++) {
				struct dte_plan_entry e;
				int64_t vol = 1;

				dte_plan_entry(&p, q, &e);
				for (uint32_t d = 0; d < e.map.ndim; d++)
					vol *= e.map.extent[d];
				if (vol > DTE_PLAN_ENTRY_MAX)
					fail_msg("%s %s -> %s: entry %zu has %lld elements", model, srcs[i],
						 sinks[j], q, (long long)vol);
				m->cut_entries += s.t[e.tensor].numel > DTE_PLAN_ENTRY_MAX;
			}
			m->plans++;
			dte_plan_fini(&p);
		}
	}
	for (i = 0; i < nsrc; i++)
		if (sok[i])
			dte_layout_fini(&sl[i]);
	for (j = 0; j < nsink; j++)
		if (kok[j])
			dte_layout_fini(&kl[j]);
	free(sl);
	free(kl);
	free(sok);
	free(kok);
	dte_spec_fini(&s);
}

static void test_matrix_dense(void **state)
{
	static const char *const models[] = { DATA "models/qwen3-0.6b.json", DATA "models/qwen3-8b.json",
					      DATA "models/llama-3.1-8b.json" };
	static const char *const srcs[] = {
		"megatron:tp=1,dp=1", "megatron:tp=1,dp=2", "megatron:tp=1,dp=4",
		"megatron:tp=2,dp=1", "megatron:tp=2,dp=2", "megatron:tp=2,dp=4",
		"megatron:tp=4,dp=1", "megatron:tp=4,dp=2", "megatron:tp=4,dp=4",
		"megatron:tp=8,dp=1", "megatron:tp=8,dp=2", "megatron:tp=8,dp=4",
		"megatron:tp=2,dp=4,dopt=0", "fsdp:dp=2", "fsdp:dp=4",
	};
	static const char *const sinks[] = { "sglang:tp=1", "sglang:tp=2", "sglang:tp=4", "sglang:tp=8",
					     "vllm:tp=8" };
	struct matrix m = { 0, 0, 0 };
	size_t i;

	for (i = 0; i < 3; i++)
		run_matrix(models[i], srcs, 15, sinks, 5, &m);
	assert_int_equal(m.plans, 3 * 15 * 5);
	/* qwen3-8b / llama-3.1-8b embeddings (> 2^24 elements) were cut */
	assert_true(m.cut_entries > 0);
	print_message("dense matrix: %d plans exact\n", m.plans);
}

static void test_matrix_moe(void **state)
{
	static const char *const srcs[] = {
		"megatron:tp=1,dp=4,ep=4,etp=1", "megatron:tp=2,dp=1", "megatron:tp=2,dp=2,ep=2,etp=1",
		"megatron:tp=2,dp=4,ep=8,etp=1", "megatron:tp=4,dp=1", "megatron:tp=4,dp=2,ep=2",
		"megatron:tp=4,dp=4,ep=16,etp=1", "megatron:tp=8,dp=1", "megatron:tp=1,dp=2",
		"megatron:tp=2,dp=2,ep=3",
	};
	static const char *const sinks[] = { "sglang:tp=1", "sglang:tp=2,ep=2", "sglang:tp=4",
					     "sglang:tp=8,ep=8", "sglang:tp=8,ep=2", "vllm:tp=4,ep=4" };
	struct matrix m = { 0, 0, 0 };

	run_matrix(DATA "models/qwen3-30b-a3b.json", srcs, 10, sinks, 6, &m);
	/* ep=3 (128 experts) is refused with a reason; tp=8 over 4 KV groups
	 * plans exactly (ranks share a group's linear_qkv rows). */
	assert_int_equal(m.refused, 1);
	assert_int_equal(m.plans, 9 * 6);
	print_message("moe matrix: %d plans exact, %d configs refused\n", m.plans, m.refused);
}

static char tmp[64];

static void json_layout(struct dte_layout *l, const struct dte_spec *s, int role, const char *text)
{
	char desc[96], err[512];
	int fd;

	snprintf(tmp, sizeof(tmp), "/tmp/dte-plan-XXXXXX");
	fd = mkstemp(tmp);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	snprintf(desc, sizeof(desc), "json:%s", tmp);
	if (dte_layout_from_desc(l, s, desc, role, err, sizeof(err)))
		fail_msg("%s", err);
	unlink(tmp);
}

/* A source missing part of one tensor: the gap is named with its box. */
static void test_gap_and_overlap_named(void **state)
{
	struct dte_spec s;
	struct dte_layout src, sink;
	struct dte_plan p;
	struct dte_plan_entry e1;
	char err[512] = "";

	spec_load(&s, DATA "tiny-llama-gqa.json");   /* norm [64] */
	json_layout(&sink, &s, DTE_LAYOUT_SINK,
		    "{\"pieces\":[{\"tensor\":\"model.norm.weight\",\"lo\":[0],\"hi\":[64],\"rank\":0,\"buffer\":0,\"strides\":[1]},"
		    "{\"tensor\":\"model.layers.0.self_attn.o_proj.weight\",\"lo\":[0,0],\"hi\":[64,64],\"rank\":1,\"buffer\":0,\"strides\":[64,1]}]}");
	json_layout(&src, &s, DTE_LAYOUT_SOURCE,
		    "{\"pieces\":[{\"tensor\":\"model.norm.weight\",\"lo\":[0],\"hi\":[64],\"rank\":0,\"buffer\":0,\"exp_avg\":1,\"exp_avg_sq\":2,\"strides\":[1]},"
		    "{\"tensor\":\"model.layers.0.self_attn.o_proj.weight\",\"lo\":[0,0],\"hi\":[64,40],\"rank\":0,\"buffer\":3,\"exp_avg\":4,\"exp_avg_sq\":5,\"strides\":[40,1]},"
		    "{\"tensor\":\"model.layers.0.self_attn.o_proj.weight\",\"lo\":[0,40],\"hi\":[30,64],\"rank\":1,\"buffer\":0,\"exp_avg\":1,\"exp_avg_sq\":2,\"strides\":[24,1]}]}");
	assert_int_equal(dte_plan_build(&p, &s, &src, &sink, NULL, err, sizeof(err)), -1);
	if (!strstr(err, "gap in tensor model.layers.0.self_attn.o_proj.weight: box [30:64, 40:64]"))
		fail_msg("gap error: %s", err);
	dte_layout_fini(&src);

	json_layout(&src, &s, DTE_LAYOUT_SOURCE,
		    "{\"pieces\":[{\"tensor\":\"model.norm.weight\",\"lo\":[0],\"hi\":[64],\"rank\":0,\"buffer\":0,\"exp_avg\":1,\"exp_avg_sq\":2,\"strides\":[1]},"
		    "{\"tensor\":\"model.layers.0.self_attn.o_proj.weight\",\"lo\":[0,0],\"hi\":[64,40],\"rank\":0,\"buffer\":3,\"exp_avg\":4,\"exp_avg_sq\":5,\"strides\":[40,1]},"
		    "{\"tensor\":\"model.layers.0.self_attn.o_proj.weight\",\"lo\":[0,32],\"hi\":[64,64],\"rank\":1,\"buffer\":0,\"exp_avg\":1,\"exp_avg_sq\":2,\"strides\":[32,1]}]}");
	assert_int_equal(dte_plan_build(&p, &s, &src, &sink, NULL, err, sizeof(err)), -1);
	if (!strstr(err, "overlap in tensor model.layers.0.self_attn.o_proj.weight: box [0:64, 32:40]"))
		fail_msg("overlap error: %s", err);
	dte_layout_fini(&src);

	/* Fixed: exact, 2 sink pieces, 3 entries; box maps land in bounds. */
	json_layout(&src, &s, DTE_LAYOUT_SOURCE,
		    "{\"pieces\":[{\"tensor\":\"model.norm.weight\",\"lo\":[0],\"hi\":[64],\"rank\":0,\"buffer\":0,\"exp_avg\":1,\"exp_avg_sq\":2,\"strides\":[1]},"
		    "{\"tensor\":\"model.layers.0.self_attn.o_proj.weight\",\"lo\":[0,0],\"hi\":[64,40],\"rank\":0,\"buffer\":3,\"exp_avg\":4,\"exp_avg_sq\":5,\"strides\":[40,1]},"
		    "{\"tensor\":\"model.layers.0.self_attn.o_proj.weight\",\"lo\":[0,40],\"hi\":[64,64],\"rank\":9,\"buffer\":0,\"exp_avg\":1,\"exp_avg_sq\":2,\"strides\":[24,1]}]}");
	assert_int_equal(dte_plan_build(&p, &s, &src, &sink, NULL, err, sizeof(err)), 0);
	assert_int_equal(p.n, 3);
	assert_int_equal(p.elements, 64 + 64 * 64);
	/* rank 9 lives on node 1 (8 ranks a node); sinks on node 2. */
	assert_int_equal(p.src_nodes, 2);
	assert_int_equal(p.nlinks, 2);
	assert_int_equal(p.links[1].src_node, 1);
	assert_int_equal(p.links[1].sink_node, 2);
	assert_int_equal(p.links[1].elements, 64 * 24);
	/* Entries go tensor by tensor: o_proj (rank 0, then rank 9), norm. */
	dte_plan_entry(&p, 1, &e1);
	assert_int_equal(e1.src_rank, 9);
	assert_int_equal(e1.map.dst_offset, 40);
	assert_int_equal(e1.map.src_offset, 0);
	assert_int_equal(e1.map.extent[1], 24);
	assert_int_equal(e1.map.src_stride[0], 24);
	assert_int_equal(e1.map.dst_stride[0], 64);
	dte_plan_fini(&p);
	/* Swapped roles are refused. */
	assert_int_equal(dte_plan_build(&p, &s, &sink, &src, NULL, err, sizeof(err)), -1);
	dte_layout_fini(&src);
	dte_layout_fini(&sink);
	dte_spec_fini(&s);
}

static void test_replicas_share_detection(void **state)
{
	struct dte_spec s;
	struct dte_layout src, sink;
	struct dte_plan p1, p3;
	struct dte_plan_opts o1 = { 1, 8 }, o3 = { 3, 4 };
	char err[512];
	size_t i;

	spec_load(&s, DATA "tiny-qwen3-mqa-tied.json");   /* 1 KV head: sink tp 8 replicates it 8x */
	assert_int_equal(dte_layout_from_desc(&src, &s, "megatron:tp=1,dp=2", DTE_LAYOUT_SOURCE, err, sizeof(err)), 0);
	assert_int_equal(dte_layout_from_desc(&sink, &s, "sglang:tp=8", DTE_LAYOUT_SINK, err, sizeof(err)), 0);
	assert_int_equal(dte_plan_build(&p1, &s, &src, &sink, &o1, err, sizeof(err)), 0);
	assert_int_equal(dte_plan_build(&p3, &s, &src, &sink, &o3, err, sizeof(err)), 0);
	/* KV heads and norms go to 8 ranks from one detection each. */
	assert_true(p1.ndetect < p1.n);
	assert_true(p1.shared_entries > 0);
	assert_int_equal(p1.detect_elements, s.total_elems);
	/* Replicas reuse the same entries and detections. */
	assert_int_equal(p3.n, p1.n);
	assert_int_equal(p3.ndetect, p1.ndetect);
	/* 4 ranks a node: source 1 node, each replica 2 sink nodes. */
	assert_int_equal(p3.src_nodes, 1);
	assert_int_equal(p3.sink_nodes, 2);
	assert_int_equal(p3.nlinks, 2);
	for (i = 0; i < 3; i++) {
		assert_int_equal(p3.links[i * 2].sink_node, 1 + 2 * i);
		assert_int_equal(p3.links[i * 2 + 1].sink_node, 2 + 2 * i);
		assert_int_equal(p3.links[i * 2].elements + p3.links[i * 2 + 1].elements, p3.elements);
	}
	for (i = 0; i < p1.n; i++) {
		struct dte_plan_entry e;

		dte_plan_entry(&p1, i, &e);
		assert_true(e.detect < p1.ndetect);
	}
	dte_plan_fini(&p1);
	dte_plan_fini(&p3);
	dte_layout_fini(&src);
	dte_layout_fini(&sink);
	dte_spec_fini(&s);
}

/* The plan as it was first written, kept as the reference: every entry
 * written out in full, detections numbered by one sort of all entries by
 * (source piece, box), links by one sort of their node pairs.  The plan's
 * compact entries must come out the same, field for field. */
struct ref {
	struct dte_plan_entry *e;
	size_t n, cap, ndetect, shared;
	int64_t elements, detect_elements;
	struct dte_plan_link *links;
	size_t nlinks;
};

static void ref_add(struct ref *r, const struct dte_layout *src, const struct dte_layout *sink,
		    size_t si, size_t ki, const int64_t *lo, const int64_t *hi)
{
	const struct dte_piece *s = &src->pieces[si], *k = &sink->pieces[ki];
	struct dte_plan_entry *e;

	if (r->n == r->cap) {
		r->cap = r->cap ? 2 * r->cap : 256;
		r->e = realloc(r->e, r->cap * sizeof(*r->e));
		assert_non_null(r->e);
	}
	e = &r->e[r->n++];
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
	for (uint32_t d = 0; d < s->ndim; d++) {
		e->lo[d] = lo[d];
		e->map.extent[d] = hi[d] - lo[d];
		e->map.src_stride[d] = s->stride[d];
		e->map.dst_stride[d] = k->stride[d];
		e->map.src_offset += (lo[d] - s->lo[d]) * s->stride[d];
		e->map.dst_offset += (lo[d] - k->lo[d]) * k->stride[d];
	}
	r->elements += dte_box_intersect(s->ndim, lo, hi, lo, hi, NULL, NULL);
}

static void ref_split(struct ref *r, const struct dte_layout *src, const struct dte_layout *sink,
		      size_t si, size_t ki, int64_t *lo, int64_t *hi, uint32_t d)
{
	uint32_t ndim = src->pieces[si].ndim;
	int64_t inner = 1, step, l0 = lo[d], h0 = hi[d];

	for (uint32_t i = d + 1; i < ndim; i++)
		inner *= hi[i] - lo[i];
	if (d >= ndim || inner * (h0 - l0) <= DTE_PLAN_ENTRY_MAX) {
		ref_add(r, src, sink, si, ki, lo, hi);
		return;
	}
	step = inner >= DTE_PLAN_ENTRY_MAX ? 1 : DTE_PLAN_ENTRY_MAX / inner;
	if (step > DTE_FP8_BLOCK)
		step -= step % DTE_FP8_BLOCK;	/* plan.c: whole FP8 blocks */
	for (int64_t a = l0; a < h0; a += step) {
		lo[d] = a;
		hi[d] = a + step < h0 ? a + step : h0;
		if (inner > DTE_PLAN_ENTRY_MAX && d + 1 < ndim)
			ref_split(r, src, sink, si, ki, lo, hi, d + 1);
		else
			ref_add(r, src, sink, si, ki, lo, hi);
	}
	lo[d] = l0;
	hi[d] = h0;
}

static int ref_detect_cmp(const void *a, const void *b, void *arg)
{
	const struct dte_plan_entry *e = arg;
	const struct dte_plan_entry *x = &e[*(const size_t *)a], *y = &e[*(const size_t *)b];

	if (x->src_piece != y->src_piece)
		return x->src_piece < y->src_piece ? -1 : 1;
	for (uint32_t d = 0; d < x->map.ndim; d++) {
		if (x->lo[d] != y->lo[d])
			return x->lo[d] < y->lo[d] ? -1 : 1;
		if (x->map.extent[d] != y->map.extent[d])
			return x->map.extent[d] < y->map.extent[d] ? -1 : 1;
	}
	return 0;
}

static int ref_link_cmp(const void *a, const void *b)
{
	const struct dte_plan_link *x = a, *y = b;

	if (x->src_node != y->src_node)
		return x->src_node < y->src_node ? -1 : 1;
	return x->sink_node < y->sink_node ? -1 : x->sink_node > y->sink_node;
}

static void ref_build(struct ref *r, const struct dte_spec *spec, const struct dte_layout *src,
		      const struct dte_layout *sink, uint32_t rpn)
{
	int64_t lo[DTE_MAX_DIMS], hi[DTE_MAX_DIMS];
	uint32_t src_nodes = (src->nranks + rpn - 1) / rpn;
	size_t *ord, i, run = 0, n = 0;
	struct dte_plan_link *one;

	memset(r, 0, sizeof(*r));
	for (uint32_t t = 0; t < spec->n; t++)
		for (size_t k = 0; k < sink->npieces; k++) {
			if (sink->pieces[k].tensor != t)
				continue;
			for (size_t s = 0; s < src->npieces; s++)
				if (src->pieces[s].tensor == t &&
				    dte_box_intersect(src->pieces[s].ndim, src->pieces[s].lo, src->pieces[s].hi,
						      sink->pieces[k].lo, sink->pieces[k].hi, lo, hi))
					ref_split(r, src, sink, s, k, lo, hi, 0);
		}
	ord = malloc((r->n + 1) * sizeof(*ord));
	one = calloc(r->n + 1, sizeof(*one));
	assert_non_null(ord);
	assert_non_null(one);
	for (i = 0; i < r->n; i++)
		ord[i] = i;
	qsort_r(ord, r->n, sizeof(*ord), ref_detect_cmp, r->e);
	for (i = 0; i < r->n; i++) {
		struct dte_plan_entry *e = &r->e[ord[i]];
		if (i == 0 || ref_detect_cmp(&ord[i - 1], &ord[i], r->e)) {
			int64_t v = 1;
			for (uint32_t d = 0; d < e->map.ndim; d++)
				v *= e->map.extent[d];
			r->ndetect++;
			r->detect_elements += v;
			run = 0;
		}
		e->detect = (uint32_t)(r->ndetect - 1);
		if (++run == 2)
			r->shared += 2;
		else if (run > 2)
			r->shared++;
	}
	for (i = 0; i < r->n; i++) {
		one[i].src_node = r->e[i].src_rank / rpn;
		one[i].sink_node = src_nodes + r->e[i].sink_rank / rpn;
	}
	qsort(one, r->n, sizeof(*one), ref_link_cmp);
	for (i = 0; i < r->n; i++)
		if (n == 0 || ref_link_cmp(&one[n - 1], &one[i]))
			one[n++] = one[i];
	for (i = 0; i < r->n; i++) {
		struct dte_plan_link key, *l;
		int64_t v = 1;
		key.src_node = r->e[i].src_rank / rpn;
		key.sink_node = src_nodes + r->e[i].sink_rank / rpn;
		l = bsearch(&key, one, n, sizeof(*one), ref_link_cmp);
		assert_non_null(l);
		r->e[i].link = (uint32_t)(l - one);
		for (uint32_t d = 0; d < r->e[i].map.ndim; d++)
			v *= r->e[i].map.extent[d];
		l->entries++;
		l->elements += (uint64_t)v;
	}
	r->links = one;
	r->nlinks = n;
	free(ord);
}

/* Reverses a layout's pieces: the plan must not lean on their order. */
static void reverse_pieces(struct dte_layout *l)
{
	for (size_t i = 0, j = l->npieces; i + 1 < j; i++, j--) {
		struct dte_piece t = l->pieces[i];
		l->pieces[i] = l->pieces[j - 1];
		l->pieces[j - 1] = t;
	}
}

/* The same plan from the layouts `dtectl plan` builds (a rule for
 * fsdp: pieces, no runtime tensors): every entry as the reference's; and
 * counted without its entries (dte_plan_count), the same counts. */
static void check_plan_only(const struct dte_spec *s, const char *srcd, const char *sinkd,
			    const struct dte_plan_opts *o, const struct ref *r)
{
	struct dte_layout src, sink;
	struct dte_plan p, c;
	char err[512];
	size_t i;

	if (dte_layout_from_desc_plan(&src, s, srcd, DTE_LAYOUT_SOURCE, NULL, err, sizeof(err)) ||
	    dte_layout_from_desc_plan(&sink, s, sinkd, DTE_LAYOUT_SINK, NULL, err, sizeof(err)))
		fail_msg("%s -> %s (plan only): %s", srcd, sinkd, err);
	assert_int_equal(!!src.rule, !strncmp(srcd, "fsdp:", 5));
	if (dte_plan_build(&p, s, &src, &sink, o, err, sizeof(err)))
		fail_msg("%s -> %s (plan only): %s", srcd, sinkd, err);
	assert_int_equal(p.n, r->n);
	assert_int_equal(p.ndetect, r->ndetect);
	assert_int_equal(p.detect_elements, r->detect_elements);
	assert_int_equal(p.shared_entries, r->shared);
	assert_int_equal(p.nlinks, r->nlinks);
	for (i = 0; i < r->n; i++) {
		struct dte_plan_entry e;

		dte_plan_entry(&p, i, &e);
		if (memcmp(&e, &r->e[i], sizeof(e)))
			fail_msg("%s -> %s (plan only): entry %zu differs", srcd, sinkd, i);
	}
	/* Counted, not kept: the same counts and links, no items. */
	if (dte_plan_count(&c, s, &src, &sink, o, err, sizeof(err)))
		fail_msg("%s -> %s (counts only): %s", srcd, sinkd, err);
	assert_null(c.items);
	assert_int_equal(c.n, p.n);
	assert_int_equal(c.elements, p.elements);
	assert_int_equal(c.ndetect, p.ndetect);
	assert_int_equal(c.detect_elements, p.detect_elements);
	assert_int_equal(c.shared_entries, p.shared_entries);
	assert_int_equal(c.nlinks, p.nlinks);
	assert_memory_equal(c.links, p.links, p.nlinks * p.sink_replicas * sizeof(*p.links));
	dte_plan_fini(&c);
	dte_plan_fini(&p);
	dte_layout_fini(&src);
	dte_layout_fini(&sink);
}

static void check_against_ref(const char *model, const char *srcd, const char *sinkd, int reverse,
			      uint32_t replicas, uint32_t rpn)
{
	struct dte_spec s;
	struct dte_layout src, sink;
	struct dte_plan p;
	struct dte_plan_opts o = { replicas, rpn };
	struct ref r;
	char err[512];
	size_t i, cuts = 0;

	spec_load(&s, model);
	if (dte_layout_from_desc(&src, &s, srcd, DTE_LAYOUT_SOURCE, err, sizeof(err)) ||
	    dte_layout_from_desc(&sink, &s, sinkd, DTE_LAYOUT_SINK, err, sizeof(err)))
		fail_msg("%s %s -> %s: %s", model, srcd, sinkd, err);
	if (reverse & 1)
		reverse_pieces(&src);
	if (reverse & 2)
		reverse_pieces(&sink);
	if (dte_plan_build(&p, &s, &src, &sink, &o, err, sizeof(err)))
		fail_msg("%s %s -> %s: %s", model, srcd, sinkd, err);
	ref_build(&r, &s, &src, &sink, rpn);
	assert_int_equal(p.n, r.n);
	assert_int_equal(p.elements, r.elements);
	assert_int_equal(p.ndetect, r.ndetect);
	assert_int_equal(p.detect_elements, r.detect_elements);
	assert_int_equal(p.shared_entries, r.shared);
	assert_int_equal(p.nlinks, r.nlinks);
	for (i = 0; i < r.nlinks; i++) {
		assert_int_equal(p.links[i].src_node, r.links[i].src_node);
		assert_int_equal(p.links[i].sink_node, r.links[i].sink_node);
		assert_int_equal(p.links[i].entries, r.links[i].entries);
		assert_int_equal(p.links[i].elements, r.links[i].elements);
	}
	for (i = 0; i < r.nlinks * replicas; i++)
		assert_int_equal(p.links[i].sink_node,
				 r.links[i % r.nlinks].sink_node + (i / r.nlinks) * p.sink_nodes);
	for (i = 0; i < r.n; i++) {
		struct dte_plan_entry e;

		dte_plan_entry(&p, i, &e);
		if (memcmp(&e, &r.e[i], sizeof(e)))
			fail_msg("%s %s -> %s: entry %zu differs (tensor %u/%u src piece %u/%u sink piece %u/%u "
				 "detect %u/%u link %u/%u)", model, srcd, sinkd, i, e.tensor, r.e[i].tensor,
				 e.src_piece, r.e[i].src_piece, e.sink_piece, r.e[i].sink_piece, e.detect,
				 r.e[i].detect, e.link, r.e[i].link);
	}
	cuts = p.ncuts;
	print_message("%s %s -> %s%s: %zu entries, %zu detections, %zu cut, %zu links: as the reference\n",
		      model, srcd, sinkd, reverse ? " (pieces reversed)" : "", p.n, p.ndetect, cuts, p.nlinks);
	if (!reverse)
		check_plan_only(&s, srcd, sinkd, &o, &r);
	free(r.e);
	free(r.links);
	dte_plan_fini(&p);
	dte_layout_fini(&src);
	dte_layout_fini(&sink);
	dte_spec_fini(&s);
}

static void test_compact_matches_reference(void **state)
{
	check_against_ref(DATA "tiny-qwen3-moe.json", "megatron:tp=2,dp=2,ep=2", "sglang:tp=4,ep=2", 0, 1, 8);
	check_against_ref(DATA "tiny-qwen3-moe.json", "megatron:tp=2,dp=4,dopt=1", "vllm:tp=4,ep=4", 0, 2, 2);
	check_against_ref(DATA "tiny-qwen3-mqa-tied.json", "megatron:tp=1,dp=2", "sglang:tp=8", 0, 3, 4);
	check_against_ref(DATA "tiny-qwen2-bias.json", "fsdp:dp=3", "vllm:tp=2", 0, 1, 1);
	check_against_ref(DATA "tiny-llama-gqa.json", "fsdp:dp=4", "sglang:tp=2", 3, 2, 2);
	check_against_ref(DATA "tiny-llama-gqa.json", "fsdp:dp=8", "sglang:tp=4", 0, 2, 2);
	check_against_ref(DATA "tiny-qwen3-moe.json", "fsdp:dp=64", "sglang:tp=4,ep=2", 0, 1, 8);
	check_against_ref(DATA "tiny-qwen3-moe.json", "megatron:tp=2,dp=2,ep=2", "sglang:tp=4,ep=2", 1, 1, 1);
	/* Tensors over DTE_PLAN_ENTRY_MAX: entries cut into slabs. */
	check_against_ref(DATA "models/qwen3-0.6b.json", "fsdp:dp=2", "sglang:tp=2", 0, 1, 8);
	check_against_ref(DATA "models/qwen3-0.6b.json", "megatron:tp=2,dp=2,dopt=1", "sglang:tp=4", 2, 1, 2);
}

/* GLM-4.5's structure at small dims (the published config's fields,
 * tests/data/layout/tiny-glm4-moe.json): its router weight and
 * e_score_correction_bias are FP32 in the engines. */
static int load_glm_small(struct dte_spec *s, char *err, size_t errlen)
{
	char *text = slurp(DATA "tiny-glm4-moe.json");
	int rc = dte_spec_load_string(s, text, err, errlen);

	free(text);
	return rc;
}

static const char qwen_fp8[] =
	"{\"architectures\":[\"Qwen3ForCausalLM\"],\"model_type\":\"qwen3\",\"hidden_size\":256,"
	"\"intermediate_size\":512,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
	"\"num_key_value_heads\":2,\"head_dim\":128,\"vocab_size\":256,"
	"\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\"}";

/* Adds 1 at every destination index of m into cnt[0 .. n). */
static void count_dst(const struct dte_box_map *m, uint32_t *cnt, int64_t n)
{
	int64_t idx[DTE_MAX_DIMS] = { 0 };
	uint64_t total = 1;

	for (uint32_t d = 0; d < m->ndim; d++)
		total *= (uint64_t)m->extent[d];
	for (uint64_t i = 0; i < total; i++) {
		int64_t at = m->dst_offset;

		for (uint32_t d = 0; d < m->ndim; d++)
			at += idx[d] * m->dst_stride[d];
		assert_true(at >= 0 && at < n);
		cnt[at]++;
		for (uint32_t d = m->ndim; d-- > 0;) {
			if (++idx[d] < m->extent[d])
				break;
			idx[d] = 0;
		}
	}
}

/* The plan srcd -> sinkd of spec s, each entry into an FP8 buffer split
 * (dte_plan_fp8_split) until one is refused: how many there were, how
 * many were slabs of a bigger matrix (more than 8192 rows), and the
 * first refusal's reason. */
struct fp8_walk {
	size_t entries, slabs;
	int refused;
	char err[512];
};

static void fp8_walk(const struct dte_spec *s, const char *srcd, const char *sinkd,
		     struct fp8_walk *w)
{
	struct dte_layout src, sink;
	struct dte_plan plan;

	memset(w, 0, sizeof(*w));
	assert_int_equal(dte_layout_from_desc(&src, s, srcd, DTE_LAYOUT_SOURCE, w->err,
					      sizeof(w->err)), 0);
	assert_int_equal(dte_layout_from_desc(&sink, s, sinkd, DTE_LAYOUT_SINK, w->err,
					      sizeof(w->err)), 0);
	assert_int_equal(dte_plan_build(&plan, s, &src, &sink, NULL, w->err, sizeof(w->err)), 0);
	for (size_t q = 0; q < plan.n && !w->refused; q++) {
		struct dte_plan_entry pe;
		struct dte_fp8_split sp;
		const struct dte_layout_fp8 *x;

		dte_plan_entry(&plan, q, &pe);
		if (!(x = dte_layout_fp8_find(&sink, pe.sink_rank, pe.sink_buf)))
			continue;
		w->entries++;
		w->slabs += pe.map.extent[0] * pe.map.extent[1] < x->rows * x->cols &&
			    pe.map.extent[0] > 8192;
		w->refused = dte_plan_fp8_split(x, &pe, s->t[pe.tensor].name, &sp, w->err,
						sizeof(w->err)) < 0;
	}
	dte_plan_fini(&plan);
	dte_layout_fini(&sink);
	dte_layout_fini(&src);
}

/* FP8 sinks (issue 33): every plan entry into an FP8 buffer splits into
 * its codes (two to a 16-bit unit) and its blocks' scales (two units a
 * scale), which together cover every unit a client registers for those
 * buffers (dte_layout_units) exactly once; a source whose pieces split a
 * 128 x 128 block is refused, naming the block's rows. */
static void test_fp8_split(void **state)
{
	static const char *const srcs[] = { "fsdp:dp=1", "megatron:tp=2", "megatron:tp=1,dp=2" };
	static const char *const sinks[] = { "sglang:tp=2,fp8=1", "vllm:tp=1,fp8=1" };
	struct dte_spec s;
	char err[512];
	size_t checked = 0;

	(void)state;
	assert_int_equal(dte_spec_load_string(&s, qwen_fp8, err, sizeof(err)), 0);
	for (size_t i = 0; i < sizeof(srcs) / sizeof(*srcs); i++) {
		for (size_t j = 0; j < sizeof(sinks) / sizeof(*sinks); j++) {
			struct dte_layout src, sink;
			struct dte_plan plan;
			uint32_t **cnt;

			assert_int_equal(dte_layout_from_desc(&src, &s, srcs[i], DTE_LAYOUT_SOURCE, err,
							      sizeof(err)), 0);
			assert_int_equal(dte_layout_from_desc(&sink, &s, sinks[j], DTE_LAYOUT_SINK, err,
							      sizeof(err)), 0);
			assert_true(sink.nfp8 > 0);
			assert_int_equal(dte_plan_build(&plan, &s, &src, &sink, NULL, err,
							sizeof(err)), 0);
			cnt = calloc(2 * sink.nfp8, sizeof(*cnt));
			assert_non_null(cnt);
			for (size_t f = 0; f < sink.nfp8; f++) {
				const struct dte_layout_fp8 *x = &sink.fp8[f];
				const struct dte_layout_buffer *cb =
					dte_layout_buffer_find(&sink, x->rank, x->buf);
				const struct dte_layout_buffer *sb =
					dte_layout_buffer_find(&sink, x->rank, x->scale_buf);

				assert_int_equal(dte_layout_units(&sink, x->rank, x->buf, cb->length),
						 cb->length / 2);
				assert_int_equal(dte_layout_units(&sink, x->rank, x->scale_buf,
								  sb->length), 2 * sb->length);
				assert_int_equal(cb->length, x->mats * x->rows * x->cols);
				cnt[2 * f] = calloc((size_t)cb->length / 2, sizeof(**cnt));
				cnt[2 * f + 1] = calloc(2 * (size_t)sb->length, sizeof(**cnt));
				assert_true(cnt[2 * f] && cnt[2 * f + 1]);
			}
			for (size_t q = 0; q < plan.n; q++) {
				struct dte_plan_entry pe;
				struct dte_fp8_split sp;
				const struct dte_layout_fp8 *x;
				size_t f;

				dte_plan_entry(&plan, q, &pe);
				if (!(x = dte_layout_fp8_find(&sink, pe.sink_rank, pe.sink_buf)))
					continue;
				f = (size_t)(x - sink.fp8);
				if (dte_plan_fp8_split(x, &pe, s.t[pe.tensor].name, &sp, err,
						       sizeof(err)) < 0)
					fail_msg("%s -> %s: %s", srcs[i], sinks[j], err);
				assert_int_equal(sp.src_extent[0], pe.map.extent[0]);
				assert_int_equal(sp.src_extent[1], pe.map.extent[1]);
				assert_int_equal(sp.codes.src_offset, pe.map.src_offset);
				count_dst(&sp.codes, cnt[2 * f], x->mats * x->rows * x->cols / 2);
				count_dst(&sp.scales, cnt[2 * f + 1], 2 * x->mats *
					  ((x->rows + 127) / 128) * ((x->cols + 127) / 128));
				checked++;
			}
			for (size_t f = 0; f < sink.nfp8; f++) {
				const struct dte_layout_fp8 *x = &sink.fp8[f];
				int64_t nc = x->mats * x->rows * x->cols / 2;
				int64_t ns = 2 * x->mats * ((x->rows + 127) / 128) * ((x->cols + 127) / 128);

				for (int64_t u = 0; u < nc; u++)
					if (cnt[2 * f][u] != 1)
						fail_msg("%s -> %s: FP8 buffer %u code unit %lld written %u times",
							 srcs[i], sinks[j], x->buf, (long long)u, cnt[2 * f][u]);
				for (int64_t u = 0; u < ns; u++)
					if (cnt[2 * f + 1][u] != 1)
						fail_msg("%s -> %s: FP8 buffer %u scale unit %lld written %u times",
							 srcs[i], sinks[j], x->buf, (long long)u,
							 cnt[2 * f + 1][u]);
				free(cnt[2 * f]);
				free(cnt[2 * f + 1]);
			}
			free(cnt);
			dte_plan_fini(&plan);
			dte_layout_fini(&sink);
			dte_layout_fini(&src);
		}
	}
	assert_true(checked > 0);
	/* A matrix past DTE_PLAN_ENTRY_MAX is cut into slabs of whole blocks
	 * (gate_proj 12288 x 1536: 16 M / 1536 is 10922 rows, 10880 cut). */
	{
		static const char big[] =
			"{\"architectures\":[\"Qwen3ForCausalLM\"],\"model_type\":\"qwen3\","
			"\"hidden_size\":1536,\"intermediate_size\":12288,\"num_hidden_layers\":1,"
			"\"num_attention_heads\":12,\"num_key_value_heads\":4,\"head_dim\":128,"
			"\"vocab_size\":256,\"tie_word_embeddings\":false}";
		struct dte_spec bs;
		struct fp8_walk w;

		assert_int_equal(dte_spec_load_string(&bs, big, err, sizeof(err)), 0);
		fp8_walk(&bs, "fsdp:dp=1", "sglang:tp=1,fp8=1", &w);
		if (w.refused)
			fail_msg("slab: %s", w.err);
		assert_true(w.entries > 0 && w.slabs > 0);
		dte_spec_fini(&bs);
	}
	/* The real DeepSeek-V3 and Kimi-K2 from Megatron without the
	 * distributed optimizer: every FP8 entry the coordinator would send
	 * splits (its slabs included: q_b_proj is 24576 x 1536 at TP 1). */
	{
		static const char *const models[] = { "deepseek-v3.json", "kimi-k2.json" };

		for (size_t mi = 0; mi < sizeof(models) / sizeof(*models); mi++) {
			struct dte_spec ms;
			struct fp8_walk w;
			char path[128];

			snprintf(path, sizeof(path), "tests/data/layout/models/%s", models[mi]);
			spec_load(&ms, path);
			fp8_walk(&ms, "megatron:tp=8,dp=2,ep=8,etp=1,dopt=0", "sglang:tp=8,ep=8,fp8=1", &w);
			if (w.refused)
				fail_msg("%s: %s", models[mi], w.err);
			assert_true(w.entries > 0);
			print_message("fp8-split: %s entries=%zu split=0\n", models[mi], w.entries);
			dte_spec_fini(&ms);
		}
	}
	/* fsdp:dp=4 shards k_proj's 256 rows 64 to a rank: no source holds a
	 * block of it whole. */
	{
		struct fp8_walk w;

		fp8_walk(&s, "fsdp:dp=4", "sglang:tp=1,fp8=1", &w);
		assert_true(w.refused);
		assert_non_null(strstr(w.err, "not whole 128 x 128 blocks"));
	}
	dte_spec_fini(&s);
}

/* Piece k of a layout made on the canonical spec against piece k of the
 * same description on the runtime view: the same, and for an FP32 tensor
 * its halves (trailing [0, 2) at stride 1, the rest doubled). */
static void check_halves_piece(const struct dte_spec *s, const struct dte_piece *c,
			       const struct dte_piece *r, int *halves)
{
	uint32_t d;

	assert_int_equal(c->tensor, r->tensor);
	assert_int_equal(c->rank, r->rank);
	assert_int_equal(c->buf, r->buf);
	if (!dte_spec_is_halves(s, c->tensor)) {
		assert_memory_equal(c, r, sizeof(*c));
		return;
	}
	(*halves)++;
	assert_int_equal(c->ndim, r->ndim + 1);
	assert_int_equal(c->offset, 2 * r->offset);
	for (d = 0; d < r->ndim; d++) {
		assert_int_equal(c->lo[d], r->lo[d]);
		assert_int_equal(c->hi[d], r->hi[d]);
		assert_int_equal(c->stride[d], 2 * r->stride[d]);
	}
	assert_int_equal(c->lo[d], 0);
	assert_int_equal(c->hi[d], 2);
	assert_int_equal(c->stride[d], 1);
}

/* FP32 tensors carried as halves (spec.h): every generator's layout is its
 * runtime layout with the FP32 pieces carried over, a sink's FP32 buffers
 * count 16-bit units, and the plans between them cover every 16-bit unit
 * of every sink, each source unit detected once. */
static void test_fp32_halves(void **state)
{
	static const char *const srcs[] = { "megatron:tp=2,dp=2,ep=2,etp=1", "megatron:tp=1,dp=4",
					    "fsdp:dp=3" };
	static const char *const sinks[] = { "sglang:tp=2", "sglang:tp=2,ep=2", "vllm:tp=2,ep=2",
					     "vllm:tp=1" };
	struct dte_spec s, rt;
	struct dte_layout c, r, kl;
	char err[512];
	size_t i, j, k;
	int halves = 0;

	(void)state;
	assert_int_equal(load_glm_small(&s, err, sizeof(err)), 0);
	assert_int_equal(s.halves, 2);       /* layers 1, 2: e_score_correction_bias */
	assert_int_equal(dte_spec_runtime(&s, &rt), 0);
	for (i = 0; i < 4 + 3; i++) {
		int role = i < 4 ? DTE_LAYOUT_SINK : DTE_LAYOUT_SOURCE;
		const char *d = i < 4 ? sinks[i] : srcs[i - 4];
		if (dte_layout_from_desc(&c, &s, d, role, err, sizeof(err)) ||
		    dte_layout_from_desc(&r, &rt, d, role, err, sizeof(err)))
			fail_msg("%s: %s", d, err);
		assert_int_equal(c.npieces, r.npieces);
		assert_int_equal(c.nbufs, r.nbufs);
		for (k = 0; k < c.npieces; k++)
			check_halves_piece(&s, &c.pieces[k], &r.pieces[k], &halves);
		for (k = 0; k < c.nbufs; k++) {
			/* A sink's FP32 buffers are 16-bit units, a source's stay FP32. */
			int fp32 = 0;
			for (j = 0; j < c.npieces; j++)
				fp32 |= c.pieces[j].rank == c.bufs[k].rank && c.pieces[j].buf == c.bufs[k].id &&
					dte_spec_is_halves(&s, c.pieces[j].tensor);
			assert_int_equal(c.bufs[k].length,
					 (fp32 && role == DTE_LAYOUT_SINK ? 2 : 1) * r.bufs[k].length);
		}
		if (dte_layout_validate(&c, &s, err, sizeof(err)))
			fail_msg("%s: %s", d, err);
		dte_layout_fini(&c);
		dte_layout_fini(&r);
	}
	assert_true(halves > 0);
	for (i = 0; i < 3; i++) {
		struct dte_layout sl;
		if (dte_layout_from_desc(&sl, &s, srcs[i], DTE_LAYOUT_SOURCE, err, sizeof(err)))
			fail_msg("%s", err);
		for (j = 0; j < 4; j++) {
			struct dte_plan p;
			struct dte_plan_opts o = { 1, 8 };
			int64_t want = 0;
			if (dte_layout_from_desc(&kl, &s, sinks[j], DTE_LAYOUT_SINK, err, sizeof(err)))
				fail_msg("%s", err);
			if (dte_plan_build(&p, &s, &sl, &kl, &o, err, sizeof(err)))
				fail_msg("%s -> %s: %s", srcs[i], sinks[j], err);
			for (k = 0; k < kl.npieces; k++)
				want += dte_piece_volume(&kl.pieces[k]);
			assert_int_equal(p.elements, want);
			assert_int_equal(p.detect_elements, s.total_elems);
			for (k = 0; k < p.n; k++) {
				struct dte_plan_entry e;
				dte_plan_entry(&p, k, &e);
				if (!dte_spec_is_halves(&s, e.tensor))
					continue;
				/* Both halves of an element always travel together. */
				assert_int_equal(e.map.extent[e.map.ndim - 1], 2);
				assert_int_equal(e.map.src_stride[e.map.ndim - 1], 1);
				assert_int_equal(e.map.dst_stride[e.map.ndim - 1], 1);
				assert_int_equal(e.map.src_offset % 2, 0);
				assert_int_equal(e.map.dst_offset % 2, 0);
			}
			dte_plan_fini(&p);
			dte_layout_fini(&kl);
		}
		dte_layout_fini(&sl);
	}
	dte_spec_runtime_fini(&rt);
	dte_spec_fini(&s);
}

/* Adds a layer norm's whole piece at offset 0 of buffer 0 (left in *p). */
static void norm_piece(struct dte_layout *l, struct dte_piece *p, int32_t norm)
{
	memset(p, 0, sizeof(*p));
	p->tensor = (uint32_t)norm;
	p->ndim = 1;
	p->hi[0] = 64;
	p->stride[0] = 1;
	assert_int_equal(dte_layout_add_piece(l, p), 0);
}

/* A source's FP32 pieces address 16-bit units of its FP32 buffers: the
 * validation finds them overlapping an FP32-element piece; a sink buffer
 * that would mix halves and 16-bit elements is refused. */
static void test_fp32_halves_checked(void **state)
{
	struct dte_spec s;
	struct dte_layout l;
	struct dte_piece p;
	int32_t norm, bias;
	char err[512];
	int at;

	(void)state;
	assert_int_equal(load_glm_small(&s, err, sizeof(err)), 0);
	norm = dte_spec_find(&s, "model.layers.1.input_layernorm.weight");
	bias = dte_spec_find(&s, "model.layers.1.mlp.gate.e_score_correction_bias");
	assert_true(norm >= 0 && bias >= 0);
	for (at = 60; at <= 64; at += 4) {
		dte_layout_init(&l, DTE_LAYOUT_SOURCE, s.hash);
		assert_int_equal(dte_layout_add_buffer(&l, 0, 0, 68, "theta"), 0);
		dte_layout_sort_buffers(&l);
		norm_piece(&l, &p, norm);
		p.tensor = (uint32_t)bias;
		p.ndim = 2;
		p.hi[0] = 4;
		p.hi[1] = 2;
		p.stride[0] = 2;
		p.stride[1] = 1;
		p.offset = 2 * at;    /* 16-bit units: FP32 elements at .. at + 3 */
		assert_int_equal(dte_layout_add_piece(&l, &p), 0);
		if (at == 60) {
			assert_int_equal(dte_layout_validate(&l, &s, err, sizeof(err)), -1);
			assert_non_null(strstr(err, "overlapping"));
		} else {
			assert_int_equal(dte_layout_validate(&l, &s, err, sizeof(err)), 0);
		}
		dte_layout_fini(&l);
	}
	/* One past the buffer's end, in FP32 elements. */
	dte_layout_init(&l, DTE_LAYOUT_SOURCE, s.hash);
	assert_int_equal(dte_layout_add_buffer(&l, 0, 0, 4, "theta"), 0);
	dte_layout_sort_buffers(&l);
	p.offset = 2;
	assert_int_equal(dte_layout_add_piece(&l, &p), 0);
	assert_int_equal(dte_layout_validate(&l, &s, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "outside"));
	dte_layout_fini(&l);
	/* A sink buffer with an FP32 tensor's runtime piece and a norm. */
	dte_layout_init(&l, DTE_LAYOUT_SINK, s.hash);
	assert_int_equal(dte_layout_add_buffer(&l, 0, 0, 68, "mixed"), 0);
	dte_layout_sort_buffers(&l);
	norm_piece(&l, &p, norm);
	p.tensor = (uint32_t)bias;
	p.hi[0] = 4;
	p.offset = 64;
	assert_int_equal(dte_layout_add_piece(&l, &p), 0);
	assert_int_equal(dte_layout_halves(&l, &s, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "need buffers of their own"));
	dte_layout_fini(&l);
	dte_spec_fini(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_matrix_dense),
		cmocka_unit_test(test_matrix_moe),
		cmocka_unit_test(test_gap_and_overlap_named),
		cmocka_unit_test(test_replicas_share_detection),
		cmocka_unit_test(test_compact_matches_reference),
		cmocka_unit_test(test_fp32_halves),
		cmocka_unit_test(test_fp32_halves_checked),
		cmocka_unit_test(test_fp8_split),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

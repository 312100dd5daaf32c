/* tests/unit/test_layout_tensors.c — the runtime tensors generators record
 * (dte_layout_add_tensor): each lies inside its buffer, none overlap, every
 * piece falls inside exactly one tensor of its buffer, and names and shapes
 * are the runtimes' own (Megatron-Core, SGLang, FSDP2). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "daemon/layout/layout.h"
#include "daemon/layout/spec.h"

#define DATA "tests/data/layout/"

static void spec_load(struct dte_spec *s, const char *path)
{
	char err[256];

	if (dte_spec_load_file(s, path, err, sizeof(err)))
		fail_msg("%s: %s", path, err);
}

static int64_t numel(const struct dte_layout_tensor *t)
{
	int64_t n = 1;

	for (uint32_t d = 0; d < t->ndim; d++)
		n *= t->shape[d];
	return n;
}

/* Index of the tensor of (rank, buf) holding buffer element x, -1 if none. */
static long tensor_at(const struct dte_layout *l, uint32_t rank, uint32_t buf, int64_t x)
{
	for (size_t i = 0; i < l->ntensors; i++) {
		const struct dte_layout_tensor *t = &l->tensors[i];

		if (t->rank == rank && t->buf == buf && x >= t->offset && x < t->offset + numel(t))
			return (long)i;
	}
	return -1;
}

/* The properties every generator's tensors must have; `whole`: no tensor
 * may straddle a buffer end (not Megatron's dist-opt shards). */
static void check_layout(const struct dte_spec *spec, const char *desc, int role, int whole)
{
	struct dte_layout l;
	char err[256];

	if (dte_layout_from_desc(&l, spec, desc, role, err, sizeof(err)))
		fail_msg("%s: %s", desc, err);
	assert_true(l.ntensors > 0);
	for (size_t i = 0; i < l.ntensors; i++) {
		const struct dte_layout_tensor *t = &l.tensors[i];
		const struct dte_layout_buffer *b = dte_layout_buffer_find(&l, t->rank, t->buf);

		if (!b)
			fail_msg("%s: tensor %s names buffer %u of rank %u, which does not exist", desc,
				 t->name, t->buf, t->rank);
		assert_true(t->ndim >= 1 && t->ndim <= DTE_MAX_DIMS);
		assert_true(numel(t) > 0);
		assert_true(t->offset + numel(t) > 0 && t->offset < b->length);
		if (whole && (t->offset < 0 || t->offset + numel(t) > b->length))
			fail_msg("%s: tensor %s [%lld, +%lld) outside buffer %s of %lld", desc, t->name,
				 (long long)t->offset, (long long)numel(t), b->name, (long long)b->length);
		for (size_t k = 0; k < i; k++) {
			const struct dte_layout_tensor *o = &l.tensors[k];

			if (o->rank == t->rank && o->buf == t->buf && o->offset < t->offset + numel(t) &&
			    t->offset < o->offset + numel(o))
				fail_msg("%s: tensors %s and %s overlap", desc, o->name, t->name);
			if (o->rank == t->rank && !strcmp(o->name, t->name))
				fail_msg("%s: rank %u has two tensors named %s", desc, t->rank, t->name);
		}
	}
	/* A piece's lowest and highest buffer index lie in one tensor. */
	for (size_t i = 0; i < l.npieces; i++) {
		const struct dte_piece *p = &l.pieces[i];
		int64_t lo = p->offset, hi = p->offset;
		long a, z;

		for (uint32_t d = 0; d < p->ndim; d++) {
			int64_t span = (p->hi[d] - p->lo[d] - 1) * p->stride[d];

			if (span < 0)
				lo += span;
			else
				hi += span;
		}
		a = tensor_at(&l, p->rank, p->buf, lo);
		z = tensor_at(&l, p->rank, p->buf, hi);
		if (a < 0 || a != z)
			fail_msg("%s: piece %zu (tensor %s) [%lld, %lld] not inside one runtime tensor",
				 desc, i, spec->t[p->tensor].name, (long long)lo, (long long)hi);
	}
	dte_layout_fini(&l);
}

static const struct dte_layout_tensor *find(const struct dte_layout *l, uint32_t rank,
					    const char *name)
{
	for (size_t i = 0; i < l->ntensors; i++)
		if (l->tensors[i].rank == rank && !strcmp(l->tensors[i].name, name))
			return &l->tensors[i];
	fail_msg("no tensor %s on rank %u", name, rank);
	return NULL;
}

static void test_properties(void **state)
{
	struct dte_spec s;

	spec_load(&s, DATA "tiny-llama-gqa.json");
	check_layout(&s, "megatron:tp=2", DTE_LAYOUT_SOURCE, 1);
	check_layout(&s, "megatron:tp=1", DTE_LAYOUT_SOURCE, 1);
	check_layout(&s, "megatron:tp=2,dp=2,dopt=1", DTE_LAYOUT_SOURCE, 0);
	check_layout(&s, "fsdp:dp=3", DTE_LAYOUT_SOURCE, 1);
	check_layout(&s, "sglang:tp=2", DTE_LAYOUT_SINK, 1);
	check_layout(&s, "sglang:tp=4", DTE_LAYOUT_SINK, 1);  /* KV heads replicated */
	check_layout(&s, "vllm:tp=8", DTE_LAYOUT_SINK, 1);
	dte_spec_fini(&s);
	spec_load(&s, DATA "tiny-qwen3-moe.json");
	check_layout(&s, "megatron:tp=2,ep=2,etp=1", DTE_LAYOUT_SOURCE, 1);
	check_layout(&s, "sglang:tp=2,ep=2", DTE_LAYOUT_SINK, 1);
	dte_spec_fini(&s);
	spec_load(&s, DATA "tiny-qwen2-bias.json");
	check_layout(&s, "megatron:tp=2", DTE_LAYOUT_SOURCE, 1);
	check_layout(&s, "sglang:tp=2", DTE_LAYOUT_SINK, 1);
	dte_spec_fini(&s);
}

/* Names and shapes as the runtimes spell them (tiny-llama-gqa: H=64,
 * I=96, 8 heads of 8, 2 KV heads, vocab 300, untied). */
static void test_names_and_shapes(void **state)
{
	struct dte_spec s;
	struct dte_layout l;
	const struct dte_layout_tensor *t, *u;
	char err[256];

	spec_load(&s, DATA "tiny-llama-gqa.json");
	assert_int_equal(dte_layout_from_desc(&l, &s, "megatron:tp=2", DTE_LAYOUT_SOURCE, err,
					      sizeof(err)), 0);
	t = find(&l, 1, "decoder.layers.1.self_attention.linear_qkv.weight");
	assert_int_equal(t->ndim, 2);
	assert_int_equal(t->shape[0], (8 / 2 + 2 * 2 / 2) * 8);  /* 1 group: 4 q + k + v heads */
	assert_int_equal(t->shape[1], 64);
	assert_int_equal(t->buf, 0);
	t = find(&l, 0, "embedding.word_embeddings.weight");
	assert_int_equal(t->shape[0], 512 / 2);                 /* vocab 300 padded to 128*tp */
	/* Reverse registration order: the embedding is last in the buffer,
	 * output_layer first, 64-element aligned starts. */
	u = find(&l, 0, "output_layer.weight");
	assert_int_equal(u->offset, 0);
	assert_true(t->offset > u->offset);
	for (size_t i = 0; i < l.ntensors; i++)
		assert_int_equal(l.tensors[i].offset % 64, 0);
	t = find(&l, 1, "decoder.layers.0.mlp.linear_fc1.weight");
	assert_int_equal(t->shape[0], 2 * 96 / 2);
	t = find(&l, 0, "decoder.final_layernorm.weight");
	assert_int_equal(t->ndim, 1);
	assert_int_equal(t->shape[0], 64);
	dte_layout_fini(&l);

	assert_int_equal(dte_layout_from_desc(&l, &s, "sglang:tp=2", DTE_LAYOUT_SINK, err,
					      sizeof(err)), 0);
	for (size_t i = 0; i < l.ntensors; i++) {
		const struct dte_layout_buffer *b = dte_layout_buffer_find(&l, l.tensors[i].rank,
									  l.tensors[i].buf);
		/* One buffer per tensor, named like it, filled by it. */
		assert_string_equal(b->name, l.tensors[i].name);
		assert_int_equal(l.tensors[i].offset, 0);
		assert_int_equal(numel(&l.tensors[i]), b->length);
	}
	t = find(&l, 1, "model.layers.0.self_attn.qkv_proj.weight");
	assert_int_equal(t->shape[0], (8 / 2 + 2 * 1) * 8);
	t = find(&l, 0, "model.layers.1.self_attn.o_proj.weight");
	assert_int_equal(t->shape[0], 64);
	assert_int_equal(t->shape[1], 8 * 8 / 2);
	t = find(&l, 1, "lm_head.weight");
	assert_int_equal(t->shape[0], 320 / 2);                 /* vocab padded to 64 */
	dte_layout_fini(&l);
	dte_spec_fini(&s);

	spec_load(&s, DATA "tiny-qwen3-moe.json");
	assert_int_equal(dte_layout_from_desc(&l, &s, "sglang:tp=2,ep=2", DTE_LAYOUT_SINK, err,
					      sizeof(err)), 0);
	for (size_t i = 0; i < l.ntensors; i++)
		if (strstr(l.tensors[i].name, "w13_weight"))
			assert_int_equal(l.tensors[i].ndim, 3);
	dte_layout_fini(&l);
	dte_spec_fini(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_properties),
		cmocka_unit_test(test_names_and_shapes),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

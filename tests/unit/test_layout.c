/* tests/unit/test_layout.c — boxes, flat-range decomposition, generators'
 * configuration checks, declarative pieces and per-layout validation. */
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
#include "daemon/layout/layout.h"

#define DATA "tests/data/layout/"

/* Every [a, b) of small shapes: boxes are disjoint, in row-major order,
 * cover exactly [a, b), and there are at most 2*ndim-1 of them. */
static void check_flat(uint32_t ndim, const int64_t *shape)
{
	int64_t lo[2 * DTE_MAX_DIMS][DTE_MAX_DIMS], hi[2 * DTE_MAX_DIMS][DTE_MAX_DIMS];
	int64_t numel = 1, a, b;
	uint32_t d;

	for (d = 0; d < ndim; d++)
		numel *= shape[d];
	for (a = 0; a <= numel; a++) {
		for (b = a; b <= numel; b++) {
			int n = dte_layout_flat_boxes(ndim, shape, a, b, lo, hi), i;
			int64_t next = a;
			assert_true(n >= 0 && n <= (int)(2 * ndim - 1));
			for (i = 0; i < n; i++) {
				/* Walk the box row-major: must continue exactly at `next`. */
				int64_t idx[DTE_MAX_DIMS];
				for (d = 0; d < ndim; d++) {
					assert_true(lo[i][d] >= 0 && lo[i][d] < hi[i][d] && hi[i][d] <= shape[d]);
					idx[d] = lo[i][d];
				}
				for (;;) {
					int64_t flat = 0;
					for (d = 0; d < ndim; d++)
						flat = flat * shape[d] + idx[d];
					assert_int_equal(flat, next);
					next++;
					for (d = ndim; d > 0; d--) {
						if (++idx[d - 1] < hi[i][d - 1])
							break;
						idx[d - 1] = lo[i][d - 1];
					}
					if (d == 0)
						break;
				}
			}
			assert_int_equal(next, b);
		}
	}
}

static void test_flat_boxes(void **state)
{
	static const int64_t s1[] = { 7 }, s2[] = { 4, 5 }, s3[] = { 3, 4, 5 }, s4[] = { 2, 3, 2, 3 };
	int64_t lo[11][DTE_MAX_DIMS], hi[11][DTE_MAX_DIMS];

	check_flat(1, s1);
	check_flat(2, s2);
	check_flat(3, s3);
	check_flat(4, s4);
	assert_int_equal(dte_layout_flat_boxes(2, s2, 3, 2, lo, hi), -1);
	assert_int_equal(dte_layout_flat_boxes(2, s2, 0, 21, lo, hi), -1);
	assert_int_equal(dte_layout_flat_boxes(0, s2, 0, 1, lo, hi), -1);
}

static void test_box_intersect(void **state)
{
	int64_t alo[2] = { 0, 0 }, ahi[2] = { 4, 4 }, blo[2] = { 2, 3 }, bhi[2] = { 6, 9 };
	int64_t olo[2], ohi[2];

	assert_int_equal(dte_box_intersect(2, alo, ahi, blo, bhi, olo, ohi), 2);
	assert_int_equal(olo[0], 2);
	assert_int_equal(ohi[1], 4);
	blo[1] = 4;
	assert_int_equal(dte_box_intersect(2, alo, ahi, blo, bhi, olo, ohi), 0);
}

static void spec_load(struct dte_spec *s, const char *path)
{
	char err[256];

	if (dte_spec_load_file(s, path, err, sizeof(err)))
		fail_msg("%s", err);
}

static int gen(const struct dte_spec *s, const char *desc, int role, char *err, size_t len)
{
	struct dte_layout l;
	int rc = dte_layout_from_desc(&l, s, desc, role, err, len);

	if (!rc) {
		rc = dte_layout_validate(&l, s, err, len);
		dte_layout_fini(&l);
	}
	return rc;
}

static void expect_gen_error(const struct dte_spec *s, const char *desc, int role, const char *needle)
{
	char err[512] = "";

	if (gen(s, desc, role, err, sizeof(err)) != -1)
		fail_msg("%s: accepted", desc);
	if (!strstr(err, needle))
		fail_msg("%s: error \"%s\" does not mention \"%s\"", desc, err, needle);
}

static void test_generator_config_errors(void **state)
{
	struct dte_spec s, moe;
	char err[512];

	spec_load(&s, DATA "models/qwen3-30b-a3b.json");  /* 32 heads, 4 KV, 128 experts */
	/* TP above the 4 query groups: two ranks share each group's rows
	 * (Megatron's num_query_groups < world_size branch). */
	assert_int_equal(gen(&s, "megatron:tp=8,dp=1", DTE_LAYOUT_SOURCE, err, sizeof(err)), 0);
	expect_gen_error(&s, "megatron:tp=3", DTE_LAYOUT_SOURCE, "num_attention_heads");
	expect_gen_error(&s, "megatron:tp=2,ep=3", DTE_LAYOUT_SOURCE, "num_experts");
	expect_gen_error(&s, "megatron:tp=2,dp=1,ep=4,etp=1", DTE_LAYOUT_SOURCE, "world size");
	expect_gen_error(&s, "megatron:tp=2,etp=5", DTE_LAYOUT_SOURCE, "moe_intermediate_size");
	expect_gen_error(&s, "megatron:tp=0", DTE_LAYOUT_SOURCE, "tp");
	expect_gen_error(&s, "megatron:tp=2,pp=2", DTE_LAYOUT_SOURCE, "unknown option");
	expect_gen_error(&s, "megatron:tp=x", DTE_LAYOUT_SOURCE, "not an integer");
	/* fuzz_layout: tp*dp overflowed int64 before the range check ran */
	expect_gen_error(&s, "megatron:tp=3333333330000000333,dp=7", DTE_LAYOUT_SOURCE, "out of range");
	expect_gen_error(&s, "sglang:tp=-2", DTE_LAYOUT_SINK, "out of range");
	expect_gen_error(&s, "sglang:tp=3", DTE_LAYOUT_SINK, "num_attention_heads");
	expect_gen_error(&s, "sglang:tp=8,ep=3", DTE_LAYOUT_SINK, "ep=3");
	expect_gen_error(&s, "vllm:tp=8,ep=2", DTE_LAYOUT_SINK, "ep must be 1 or tp");
	expect_gen_error(&s, "sglang:tp=2", DTE_LAYOUT_SOURCE, "unknown source layout");
	expect_gen_error(&s, "megatron:tp=2", DTE_LAYOUT_SINK, "unknown sink layout");
	expect_gen_error(&s, "deepspeed:zero=3", DTE_LAYOUT_SOURCE, "unknown source layout");
	expect_gen_error(&s, "fsdp:dp=0", DTE_LAYOUT_SOURCE, "dp");
	/* KV 4: TP 8 replicates KV heads on the sink (fine); TP 6 cannot. */
	assert_int_equal(gen(&s, "sglang:tp=8", DTE_LAYOUT_SINK, err, sizeof(err)), 0);
	spec_load(&moe, DATA "tiny-qwen3-mqa-tied.json");  /* 8 heads, 1 KV, vocab 130 */
	assert_int_equal(gen(&moe, "sglang:tp=8", DTE_LAYOUT_SINK, err, sizeof(err)), 0);
	/* MQA at TP 2: both ranks hold half of the one group's linear_qkv rows. */
	assert_int_equal(gen(&moe, "megatron:tp=2", DTE_LAYOUT_SOURCE, err, sizeof(err)), 0);
	dte_spec_fini(&moe);
	spec_load(&moe, DATA "tiny-llama-gqa.json");       /* 8 heads, 2 KV, I=96 */
	expect_gen_error(&moe, "sglang:tp=8,ep=2", DTE_LAYOUT_SINK, "no experts");
	dte_spec_fini(&moe);
	dte_spec_fini(&s);
}

static char tmpfile_path[64];

static const char *write_tmp(const char *text)
{
	int fd;

	snprintf(tmpfile_path, sizeof(tmpfile_path), "/tmp/dte-layout-XXXXXX");
	fd = mkstemp(tmpfile_path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	return tmpfile_path;
}

static int load_json(const struct dte_spec *s, const char *text, int role, char *err, size_t len)
{
	struct dte_layout l;
	char desc[128];
	int rc;

	snprintf(desc, sizeof(desc), "json:%s", write_tmp(text));
	rc = dte_layout_from_desc(&l, s, desc, role, err, len);
	unlink(tmpfile_path);
	if (!rc) {
		rc = dte_layout_validate(&l, s, err, len);
		dte_layout_fini(&l);
	}
	return rc;
}

static void expect_json_error(const struct dte_spec *s, const char *text, int role, const char *needle)
{
	char err[512] = "";

	if (load_json(s, text, role, err, sizeof(err)) != -1)
		fail_msg("accepted: %s", text);
	if (!strstr(err, needle))
		fail_msg("error \"%s\" does not mention \"%s\"", err, needle);
}

static void test_declarative_json(void **state)
{
	struct dte_spec s;
	char err[512] = "", good[1024];

	spec_load(&s, DATA "tiny-llama-gqa.json");  /* model.norm.weight [64] */
	/* Two halves of the norm, one column-strided pair sharing a buffer. */
	snprintf(good, sizeof(good),
		 "{\"spec_hash\":\"%016llx\",\"pieces\":["
		 "{\"tensor\":\"model.norm.weight\",\"lo\":[0],\"hi\":[32],\"rank\":0,\"buffer\":0,\"offset\":0,\"strides\":[2]},"
		 "{\"tensor\":\"model.norm.weight\",\"lo\":[32],\"hi\":[64],\"rank\":0,\"buffer\":0,\"offset\":1,\"strides\":[2]},"
		 "{\"tensor\":\"model.layers.0.input_layernorm.weight\",\"lo\":[0],\"hi\":[64],\"rank\":1,\"buffer\":5,\"offset\":63,\"strides\":[-1]}]}",
		 (unsigned long long)s.hash);
	assert_int_equal(load_json(&s, good, DTE_LAYOUT_SINK, err, sizeof(err)), 0);
	/* The interleaved halves made to collide on one element. */
	expect_json_error(&s, "{\"pieces\":["
		"{\"tensor\":\"model.norm.weight\",\"lo\":[0],\"hi\":[32],\"rank\":0,\"buffer\":0,\"offset\":0,\"strides\":[2]},"
		"{\"tensor\":\"model.norm.weight\",\"lo\":[32],\"hi\":[64],\"rank\":0,\"buffer\":0,\"offset\":2,\"strides\":[2]}]}",
		DTE_LAYOUT_SINK, "overlapping pieces");
	/* Dense overlap: names both pieces. */
	expect_json_error(&s, "{\"pieces\":["
		"{\"tensor\":\"model.norm.weight\",\"lo\":[0],\"hi\":[40],\"rank\":0,\"buffer\":0,\"offset\":0,\"strides\":[1]},"
		"{\"tensor\":\"model.layers.1.input_layernorm.weight\",\"lo\":[0],\"hi\":[10],\"rank\":0,\"buffer\":0,\"offset\":39,\"strides\":[1]}]}",
		DTE_LAYOUT_SINK, "model.layers.1.input_layernorm.weight [0:10]");
	expect_json_error(&s, "{\"spec_hash\":\"0000000000000001\",\"pieces\":["
		"{\"tensor\":\"model.norm.weight\",\"lo\":[0],\"hi\":[64],\"rank\":0,\"buffer\":0,\"strides\":[1]}]}",
		DTE_LAYOUT_SINK, "does not match the model spec hash");
	expect_json_error(&s, "{\"pieces\":[{\"tensor\":\"model.nope\",\"lo\":[0],\"hi\":[1],\"rank\":0,\"buffer\":0,\"strides\":[1]}]}",
		DTE_LAYOUT_SINK, "not in the model spec");
	expect_json_error(&s, "{\"pieces\":[{\"tensor\":\"model.norm.weight\",\"lo\":[0],\"hi\":[65],\"rank\":0,\"buffer\":0,\"strides\":[1]}]}",
		DTE_LAYOUT_SINK, "outside tensor");
	expect_json_error(&s, "{\"pieces\":[{\"tensor\":\"model.norm.weight\",\"lo\":[0,0],\"hi\":[64,1],\"rank\":0,\"buffer\":0,\"strides\":[1,1]}]}",
		DTE_LAYOUT_SINK, "array of 1 integers");
	expect_json_error(&s, "{\"pieces\":[{\"tensor\":\"model.norm.weight\",\"lo\":[0],\"hi\":[64],\"rank\":0,\"buffer\":0,\"strides\":[1]}]}",
		DTE_LAYOUT_SOURCE, "exp_avg");
	expect_json_error(&s, "{\"buffers\":[{\"rank\":0,\"id\":0,\"length\":63}],"
		"\"pieces\":[{\"tensor\":\"model.norm.weight\",\"lo\":[0],\"hi\":[64],\"rank\":0,\"buffer\":0,\"strides\":[1]}]}",
		DTE_LAYOUT_SINK, "outside rank 0 buffer 0");
	expect_json_error(&s, "{\"buffers\":[{\"rank\":0,\"id\":1,\"length\":64}],"
		"\"pieces\":[{\"tensor\":\"model.norm.weight\",\"lo\":[0],\"hi\":[64],\"rank\":0,\"buffer\":0,\"strides\":[1]}]}",
		DTE_LAYOUT_SINK, "has no buffer 0");
	expect_json_error(&s, "{\"pieces\":[{\"tensor\":\"model.norm.weight\",\"lo\":[0],\"hi\":[64],\"rank\":0,\"buffer\":0,\"strides\":[-1]}]}",
		DTE_LAYOUT_SINK, "outside");
	expect_json_error(&s, "{\"pieces\":[{\"tensor\":\"model.norm.weight\",\"lo\":[0],\"hi\":[64],\"rank\":0,\"buffer\":0,\"strides\":[281474976710656]}]}",
		DTE_LAYOUT_SINK, "reaches past");
	expect_json_error(&s, "{\"pieces\":[{\"tensor\":\"lm_head.weight\",\"lo\":[0,0],\"hi\":[300,64],\"rank\":0,\"buffer\":0,\"offset\":0,\"strides\":[-281474976710656,1]}]}",
		DTE_LAYOUT_SINK, "outside");
	expect_json_error(&s, "{\"pieces\":[]}", DTE_LAYOUT_SINK, "non-empty");
	expect_json_error(&s, "{\"pieces\":[1", DTE_LAYOUT_SINK, "malformed JSON");
	expect_json_error(&s, "{\"pieces\":[{\"tensor\":\"model.norm.weight\",\"lo\":[0],\"hi\":[64],\"rank\":-1,\"buffer\":0,\"strides\":[1]}]}",
		DTE_LAYOUT_SINK, "rank");
	dte_spec_fini(&s);
}

/* Generated layouts are self-consistent and have the expected shape. */
static void test_generated_layouts(void **state)
{
	struct dte_spec s;
	struct dte_layout l;
	char err[512];
	size_t i;
	int64_t src_elems = 0;

	spec_load(&s, DATA "models/llama-3.1-8b.json");
	assert_int_equal(dte_layout_from_desc(&l, &s, "megatron:tp=4,dp=2", DTE_LAYOUT_SOURCE, err, sizeof(err)), 0);
	assert_int_equal(dte_layout_validate(&l, &s, err, sizeof(err)), 0);
	assert_int_equal(l.nranks, 8);
	/* Every canonical element has exactly one source: volumes add up. */
	for (i = 0; i < l.npieces; i++)
		src_elems += dte_piece_volume(&l.pieces[i]);
	assert_int_equal(src_elems, s.total_elems);
	/* Shards of the padded flat buffer: equal on both DP ranks. */
	assert_int_equal(dte_layout_buffer_find(&l, 0, 0)->length, dte_layout_buffer_find(&l, 4, 0)->length);
	dte_layout_fini(&l);

	assert_int_equal(dte_layout_from_desc(&l, &s, "fsdp:dp=3", DTE_LAYOUT_SOURCE, err, sizeof(err)), 0);
	assert_int_equal(dte_layout_validate(&l, &s, err, sizeof(err)), 0);
	src_elems = 0;
	for (i = 0; i < l.npieces; i++)
		src_elems += dte_piece_volume(&l.pieces[i]);
	assert_int_equal(src_elems, s.total_elems);
	dte_layout_fini(&l);

	assert_int_equal(dte_layout_from_desc(&l, &s, "sglang:tp=8", DTE_LAYOUT_SINK, err, sizeof(err)), 0);
	assert_int_equal(dte_layout_validate(&l, &s, err, sizeof(err)), 0);
	/* Embedding: 128256 rows padded to 128256 (multiple of 64) / 8. */
	assert_string_equal(l.bufs[0].name, "model.embed_tokens.weight");
	assert_int_equal(l.bufs[0].length, 128256 / 8 * 4096);
	dte_layout_fini(&l);
	/* A layout made for another model is refused. */
	assert_int_equal(dte_layout_from_desc(&l, &s, "sglang:tp=2", DTE_LAYOUT_SINK, err, sizeof(err)), 0);
	l.spec_hash ^= 1;
	assert_int_equal(dte_layout_validate(&l, &s, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "spec hash"));
	dte_layout_fini(&l);
	dte_spec_fini(&s);
}

/* The layouts `dtectl plan` builds (dte_layout_from_desc_plan): fsdp:
 * keeps a rule whose pieces and buffers are the generator's, found as
 * dte_layout_buffer_find finds them; no runtime tensors. */
static void check_plan_only(const struct dte_spec *s, const char *desc, int role)
{
	struct dte_layout full, lean;
	char err[512];
	size_t i;

	assert_int_equal(dte_layout_from_desc(&full, s, desc, role, err, sizeof(err)), 0);
	assert_int_equal(dte_layout_from_desc_plan(&lean, s, desc, role, NULL, err, sizeof(err)), 0);
	assert_int_equal(dte_layout_validate(&lean, s, err, sizeof(err)), 0);
	assert_string_equal(lean.desc, full.desc);
	assert_int_equal(lean.nranks, full.nranks);
	assert_int_equal(lean.npieces, full.npieces);
	assert_int_equal(lean.nbufs, full.nbufs);
	assert_int_equal(!!lean.rule, !strncmp(desc, "fsdp:", 5));
	assert_int_equal(lean.ntensors, 0);
	for (i = 0; i < full.npieces; i++) {
		struct dte_piece tmp;
		assert_int_equal(dte_layout_piece_tensor(&lean, i), full.pieces[i].tensor);
		assert_memory_equal(dte_layout_piece(&lean, i, &tmp), &full.pieces[i], sizeof(tmp));
	}
	for (i = 0; i < full.nbufs; i++) {
		struct dte_layout_buffer tmp, tmp2;
		const struct dte_layout_buffer *b = dte_layout_buffer(&lean, i, &tmp), *f = &full.bufs[i];
		const struct dte_layout_buffer *g = dte_layout_buffer_get(&lean, f->rank, f->id, &tmp2);

		assert_int_equal(b->rank, f->rank);
		assert_int_equal(b->id, f->id);
		assert_int_equal(b->length, f->length);
		assert_string_equal(b->name, f->name);
		assert_non_null(g);
		assert_int_equal(g->rank, f->rank);
		assert_int_equal(g->id, f->id);
		assert_int_equal(g->length, f->length);
		assert_string_equal(g->name, f->name);
		/* The next id of the rank, and the next rank, as the array has them. */
		assert_int_equal(!dte_layout_buffer_get(&lean, f->rank, f->id + 1, &tmp2),
				 !dte_layout_buffer_find(&full, f->rank, f->id + 1));
		assert_int_equal(!dte_layout_buffer_get(&lean, f->rank + 1, f->id, &tmp2),
				 !dte_layout_buffer_find(&full, f->rank + 1, f->id));
	}
	assert_null(dte_layout_buffer_get(&lean, full.nranks, 0, &(struct dte_layout_buffer){ 0 }));
	dte_layout_fini(&lean);
	dte_layout_fini(&full);
}

static void test_plan_only_layouts(void **state)
{
	static const char *const models[] = { DATA "tiny-qwen3-moe.json", DATA "tiny-llama-gqa.json",
					      DATA "models/llama-3.1-8b.json" };
	static const char *const srcs[] = { "fsdp:dp=1", "fsdp:dp=3", "fsdp:dp=8", "fsdp:dp=64",
					    "megatron:tp=2,dp=2" };
	struct dte_spec s;

	for (size_t m = 0; m < sizeof(models) / sizeof(models[0]); m++) {
		spec_load(&s, models[m]);
		for (size_t i = 0; i < sizeof(srcs) / sizeof(srcs[0]); i++)
			check_plan_only(&s, srcs[i], DTE_LAYOUT_SOURCE);
		check_plan_only(&s, "sglang:tp=2", DTE_LAYOUT_SINK);
		dte_spec_fini(&s);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_flat_boxes),
		cmocka_unit_test(test_box_intersect),
		cmocka_unit_test(test_generator_config_errors),
		cmocka_unit_test(test_declarative_json),
		cmocka_unit_test(test_generated_layouts),
		cmocka_unit_test(test_plan_only_layouts),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

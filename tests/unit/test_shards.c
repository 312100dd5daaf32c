/* tests/unit/test_shards.c — sources that register shards (mcore:, fsdp2:):
 * the shard table parser, and layouts from tables whose ranges cut
 * parameters anywhere, planned against SGLang sinks with exact coverage;
 * every bad table is refused with its reason. */
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
#include "daemon/layout/plan_cli.h"

#define DATA "tests/data/layout/"

static void spec_load(struct dte_spec *s, const char *path)
{
	char err[256];

	if (dte_spec_load_file(s, path, err, sizeof(err)))
		fail_msg("%s", err);
}

struct text {
	char *s;
	size_t n, cap;
};

static void put(struct text *t, const char *fmt, ...)
{
	va_list ap;
	int need;

	va_start(ap, fmt);
	need = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (t->n + (size_t)need + 1 > t->cap) {
		t->cap = (t->n + (size_t)need + 1) * 2;
		t->s = realloc(t->s, t->cap);
		assert_non_null(t->s);
	}
	va_start(ap, fmt);
	vsnprintf(t->s + t->n, t->cap - t->n, fmt, ap);
	va_end(ap);
	t->n += (size_t)need;
}

/* Shards of every parameter of a Megatron TP layout (taken from the whole
 * tensors of megatron:tp=T,dopt=0), each cut into dp uneven flat ranges
 * owned by DP ranks in turn; `seq` gives the local spec's names
 * (get_gpt_layer_local_spec): grouped experts become SequentialMLP's
 * local_experts.{i}.linear_fcN.weight, the fused norms input_layernorm.weight
 * and pre_mlp_layernorm.weight. */
static char *mcore_table(const struct dte_spec *s, int64_t tp, int64_t dp, int seq)
{
	struct dte_layout l;
	struct text t = { 0 };
	char desc[64], err[256];
	size_t i;

	snprintf(desc, sizeof(desc), "megatron:tp=%lld,dopt=0", (long long)tp);
	if (dte_layout_from_desc(&l, s, desc, DTE_LAYOUT_SOURCE, err, sizeof(err)))
		fail_msg("%s", err);
	for (i = 0; i < l.ntensors; i++) {
		const struct dte_layout_tensor *x = &l.tensors[i];
		int64_t numel = x->shape[0] * (x->ndim > 1 ? x->shape[1] : 1), d, lo = 0;
		char name[DTE_LAYOUT_NAME_MAX];
		const char *w = strstr(x->name, ".mlp.experts.linear_fc");
		const char *qn = strstr(x->name, ".self_attention.linear_qkv.layer_norm_weight");
		const char *fn = strstr(x->name, ".mlp.linear_fc1.layer_norm_weight");

		snprintf(name, sizeof(name), "%s", x->name);
		if (seq && (qn || fn))
			snprintf(name, sizeof(name), "%.*s.%s", (int)((qn ? qn : fn) - x->name),
				 x->name, qn ? "input_layernorm.weight" : "pre_mlp_layernorm.weight");
		if (seq && w) {
			int fc = w[strlen(".mlp.experts.linear_fc")] - '0';
			long e = strtol(strstr(w, ".weight") + 7, NULL, 10);
			snprintf(name, sizeof(name), "%.*s.mlp.experts.local_experts.%ld.linear_fc%d.weight",
				 (int)(w - x->name), x->name, e, fc);
		}
		for (d = 0; d < dp; d++) {
			int64_t hi = d + 1 == dp ? numel : numel * (d + 1) / dp + (d % 2 ? 7 : -5);

			if (hi > numel)
				hi = numel;
			if (hi <= lo)
				continue;
			put(&t, "%lld %zu %lld %lld %s %lld", (long long)(d * tp + x->rank), i,
			    (long long)lo, (long long)hi, name, (long long)x->shape[0]);
			if (x->ndim > 1)
				put(&t, ",%lld", (long long)x->shape[1]);
			put(&t, "\n");
			lo = hi;
		}
	}
	dte_layout_fini(&l);
	return t.s ? t.s : strdup("");
}

static int plan_rc(const struct dte_spec *s, const char *src, const char *table, const char *sink,
		   char *err, size_t errlen, int64_t *elements)
{
	struct dte_layout sl, kl;
	struct dte_plan plan;
	struct dte_plan_opts o = { 1, 0 };
	int rc;

	if (dte_layout_from_desc_shards(&sl, s, src, DTE_LAYOUT_SOURCE, table, err, errlen))
		return -2;
	if (dte_layout_from_desc(&kl, s, sink, DTE_LAYOUT_SINK, err, errlen)) {
		dte_layout_fini(&sl);
		return -3;
	}
	rc = dte_plan_build(&plan, s, &sl, &kl, &o, err, errlen);
	if (!rc) {
		*elements = plan.elements;
		dte_plan_fini(&plan);
	}
	dte_layout_fini(&sl);
	dte_layout_fini(&kl);
	return rc;
}

static void test_mcore_exact(void **state)
{
	static const struct { const char *model; int64_t tp, dp; const char *sink; } cases[] = {
		{ DATA "tiny-qwen3-moe.json", 2, 2, "sglang:tp=2" },
		{ DATA "tiny-qwen3-moe.json", 1, 3, "sglang:tp=4,ep=2" },
		{ DATA "tiny-llama-gqa.json", 2, 4, "sglang:tp=8" },
		{ DATA "tiny-qwen2-bias.json", 2, 3, "vllm:tp=4" },
		{ DATA "tiny-qwen3-mqa-tied.json", 1, 2, "sglang:tp=2" },
	};
	(void)state;
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		for (int seq = 0; seq < 2; seq++) {
			struct dte_spec s;
			char src[64], err[512];
			char *tab;
			int64_t el = 0;

			spec_load(&s, cases[c].model);
			tab = mcore_table(&s, cases[c].tp, cases[c].dp, seq);
			snprintf(src, sizeof(src), "mcore:tp=%lld,dp=%lld", (long long)cases[c].tp,
				 (long long)cases[c].dp);
			if (plan_rc(&s, src, tab, cases[c].sink, err, sizeof(err), &el))
				fail_msg("%s %s -> %s: %s", cases[c].model, src, cases[c].sink, err);
			assert_true(el > 0);
			free(tab);
			dte_spec_fini(&s);
		}
	}
}

/* A shard left out is a gap the plan names; one registered twice an overlap. */
static void test_mcore_gap_overlap(void **state)
{
	struct dte_spec s;
	char err[512], *tab, *nl, *dup;
	int64_t el;
	size_t first;

	(void)state;
	spec_load(&s, DATA "tiny-llama-gqa.json");
	tab = mcore_table(&s, 2, 2, 0);
	nl = strchr(tab, '\n');
	first = (size_t)(nl - tab) + 1;
	assert_int_equal(plan_rc(&s, "mcore:tp=2,dp=2", tab + first, "sglang:tp=2", err, sizeof(err), &el), -1);
	assert_non_null(strstr(err, "gap"));
	dup = malloc(strlen(tab) + first + 1);
	memcpy(dup, tab, first);
	strcpy(dup + first, tab);
	/* The same range again, on the same rank: the plan sees two sources. */
	assert_int_equal(plan_rc(&s, "mcore:tp=2,dp=2", dup, "sglang:tp=2", err, sizeof(err), &el), -1);
	assert_non_null(strstr(err, "overlap"));
	free(dup);
	free(tab);
	dte_spec_fini(&s);
}

static void expect_refused(const struct dte_spec *s, const char *desc, const char *table,
			   const char *why)
{
	struct dte_layout l;
	char err[512] = "";

	if (!dte_layout_from_desc_shards(&l, s, desc, DTE_LAYOUT_SOURCE, table, err, sizeof(err))) {
		dte_layout_fini(&l);
		fail_msg("%s accepted: %s", desc, table);
	}
	if (!strstr(err, why))
		fail_msg("%s: \"%s\" does not say \"%s\"", desc, err, why);
}

static void test_bad_tables(void **state)
{
	struct dte_spec s;

	(void)state;
	spec_load(&s, DATA "tiny-qwen3-moe.json");
	expect_refused(&s, "mcore:tp=2,dp=1", "0 0 0 10 decoder.layers.0.nope.weight 4,4\n",
		       "not a parameter");
	expect_refused(&s, "mcore:tp=2,dp=1", "0 0 0 10 decoder.final_layernorm.weight 31\n",
		       "registered as");
	expect_refused(&s, "mcore:tp=2,dp=1", "0 0 0 40 decoder.final_layernorm.weight 32\n",
		       "range [0, 40)");
	expect_refused(&s, "mcore:tp=2,dp=1", "2 0 0 10 decoder.final_layernorm.weight 32\n",
		       "ranks 0..1");
	expect_refused(&s, "mcore:tp=2,dp=1", "0 0 5 5 decoder.final_layernorm.weight 32\n",
		       "non-empty");
	expect_refused(&s, "mcore:tp=2,dp=1", "0 0 0 10 decoder.final_layernorm.weight\n",
		       "got 5 fields");
	expect_refused(&s, "mcore:tp=2,dp=1", "0 70000 0 10 decoder.final_layernorm.weight 32\n",
		       "group");
	expect_refused(&s, "mcore:tp=2,dp=1", "0 0 0 10 decoder.final_layernorm.weight 0\n",
		       "positive");
	expect_refused(&s, "mcore:tp=2,dp=1", "x 0 0 10 decoder.final_layernorm.weight 32\n",
		       "rank");
	/* A vocab shard too small for the vocabulary at this TP. */
	expect_refused(&s, "mcore:tp=2,dp=1", "0 0 0 10 embedding.word_embeddings.weight 64,32\n",
		       "vocab rows");
	/* TP must divide the attention heads (tiny-qwen3-moe has 4). */
	expect_refused(&s, "mcore:tp=3,dp=1", "", "num_attention_heads");
	expect_refused(&s, "fsdp2:dp=2", "0 0 0 10 model.norm.weight 31\n", "the model's is");
	expect_refused(&s, "fsdp2:dp=2", "0 0 0 10 decoder.final_layernorm.weight 32\n",
		       "no tensor");
	dte_spec_fini(&s);
}

/* Padded vocab read from the tensor: 3 * 128 rows per TP rank, not 128. */
static void test_vocab_from_tensor(void **state)
{
	struct dte_spec s;
	struct dte_layout l;
	char err[256];
	int64_t rows = 0;

	(void)state;
	spec_load(&s, DATA "tiny-qwen3-moe.json");   /* vocab 200, H 32 */
	assert_int_equal(dte_layout_from_desc_shards(&l, &s, "mcore:tp=2,dp=1", DTE_LAYOUT_SOURCE,
		"0 0 0 12288 embedding.word_embeddings.weight 384,32\n"
		"1 0 100 12288 embedding.word_embeddings.weight 384,32\n", err, sizeof(err)), 0);
	for (size_t i = 0; i < l.npieces; i++)
		rows += l.pieces[i].hi[0] - l.pieces[i].lo[0];
	/* Rank 0 holds rows 0..199 (all of the vocab); rank 1's rows are padding. */
	assert_int_equal(l.npieces, 1);
	assert_int_equal(rows, 200);
	assert_int_equal(l.nbufs, 6);
	dte_layout_fini(&l);
	dte_spec_fini(&s);
}

/* fsdp2: dim-0 chunks as flat ranges give the same coverage as fsdp:. */
static void test_fsdp2(void **state)
{
	struct dte_spec s;
	struct text t = { 0 };
	char err[512];
	int64_t el = 0, dp = 3;

	(void)state;
	spec_load(&s, DATA "tiny-qwen2-bias.json");
	for (uint32_t i = 0; i < s.n; i++) {
		const struct dte_spec_tensor *x = &s.t[i];
		int64_t chunk = (x->shape[0] + dp - 1) / dp, inner = x->numel / x->shape[0];

		for (int64_t r = 0; r < dp; r++) {
			int64_t lo = r * chunk, hi = lo + chunk < x->shape[0] ? lo + chunk : x->shape[0];

			if (hi <= lo)
				continue;
			put(&t, "%lld %u %lld %lld %s %lld", (long long)r, i, (long long)(lo * inner),
			    (long long)(hi * inner), x->name, (long long)x->shape[0]);
			for (uint32_t d = 1; d < x->ndim; d++)
				put(&t, ",%lld", (long long)x->shape[d]);
			put(&t, "\n");
		}
	}
	if (plan_rc(&s, "fsdp2:dp=3", t.s, "sglang:tp=2", err, sizeof(err), &el))
		fail_msg("%s", err);
	assert_true(el > 0);
	free(t.s);
	dte_spec_fini(&s);
}

/* dtectl plan --shards: a table file checked without a daemon. */
static void test_plan_cli(void **state)
{
	struct dte_spec s;
	char path[] = "/tmp/dte-test-shards-XXXXXX", *tab;
	int fd;
	FILE *f;

	(void)state;
	spec_load(&s, DATA "tiny-qwen3-moe.json");
	tab = mcore_table(&s, 2, 2, 1);
	fd = mkstemp(path);
	assert_true(fd >= 0);
	f = fdopen(fd, "w");
	fputs(tab, f);
	fclose(f);
	{
		char *ok[] = { "plan", "--model", DATA "tiny-qwen3-moe.json", "--source",
			       "mcore:tp=2,dp=2", "--shards", path, "--sink", "sglang:tp=2", NULL };
		char *gap[] = { "plan", "--model", DATA "tiny-qwen3-moe.json", "--source",
				"mcore:tp=2,dp=1", "--shards", path, "--sink", "sglang:tp=2", NULL };
		char *nosh[] = { "plan", "--model", DATA "tiny-qwen3-moe.json", "--source",
				 "megatron:tp=2", "--shards", path, "--sink", "sglang:tp=2", NULL };

		assert_int_equal(dte_plan_cli(9, ok), 0);
		/* dp=1: the table names ranks 2 and 3, which do not exist. */
		assert_int_equal(dte_plan_cli(9, gap), 1);
		assert_int_equal(dte_plan_cli(9, nosh), 1);
	}
	unlink(path);
	free(tab);
	dte_spec_fini(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_mcore_exact),
		cmocka_unit_test(test_mcore_gap_overlap),
		cmocka_unit_test(test_bad_tables),
		cmocka_unit_test(test_vocab_from_tensor),
		cmocka_unit_test(test_fsdp2),
		cmocka_unit_test(test_plan_cli),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

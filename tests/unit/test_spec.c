/* tests/unit/test_spec.c — model spec from HF config.json. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include "daemon/layout/spec.h"

#define MODELS "tests/data/layout/models/"
#define DATA   "tests/data/layout/"

static void load(struct dte_spec *s, const char *path)
{
	char err[512] = "";
	int rc = dte_spec_load_file(s, path, err, sizeof(err));

	if (rc)
		fail_msg("%s: %s", path, err);
}

/* Parameter counts published for these checkpoints. */
static void test_real_models_param_counts(void **state)
{
	static const struct { const char *file; int64_t elems; uint32_t tensors; } m[] = {
		{ MODELS "qwen3-0.6b.json",    596049920LL,   1 + 28 * 11 + 1 },
		{ MODELS "qwen3-8b.json",      8190735360LL,  1 + 36 * 11 + 2 },
		{ MODELS "llama-3.1-8b.json",  8030261248LL,  1 + 32 * 9 + 2 },
		{ MODELS "qwen3-30b-a3b.json", 30532122624LL, 1 + 48 * (9 + 128 * 3) + 2 },
	};
	size_t i;

	for (i = 0; i < sizeof(m) / sizeof(m[0]); i++) {
		struct dte_spec s;
		load(&s, m[i].file);
		assert_int_equal(s.total_elems, m[i].elems);
		assert_int_equal(s.n, m[i].tensors);
		dte_spec_fini(&s);
	}
}

static void test_names_and_shapes(void **state)
{
	struct dte_spec s;
	int32_t id;

	load(&s, MODELS "qwen3-30b-a3b.json");
	id = dte_spec_find(&s, "model.layers.47.mlp.experts.127.down_proj.weight");
	assert_true(id >= 0);
	assert_int_equal(id, dte_spec_expert_tensor(&s, 47, 127, DTE_SPEC_EXP_DOWN));
	assert_int_equal(s.t[id].shape[0], 2048);
	assert_int_equal(s.t[id].shape[1], 768);
	id = dte_spec_layer_tensor(&s, 3, DTE_SPEC_ROUTER);
	assert_string_equal(s.t[id].name, "model.layers.3.mlp.gate.weight");
	assert_int_equal(s.t[id].shape[0], 128);
	id = dte_spec_layer_tensor(&s, 0, DTE_SPEC_K_NORM);
	assert_string_equal(s.t[id].name, "model.layers.0.self_attn.k_norm.weight");
	assert_int_equal(s.t[id].shape[0], 128);
	assert_int_equal(s.t[id].group, DTE_SPEC_GROUP_NO_DECAY);
	assert_int_equal(dte_spec_layer_tensor(&s, 0, DTE_SPEC_GATE), -1);
	assert_int_equal(dte_spec_expert_tensor(&s, 0, 128, DTE_SPEC_EXP_UP), -1);
	assert_true(s.lm_head >= 0);
	assert_string_equal(s.t[s.lm_head].name, "lm_head.weight");
	assert_int_equal(s.t[s.lm_head].group, DTE_SPEC_GROUP_DECAY);
	dte_spec_fini(&s);

	load(&s, MODELS "qwen3-0.6b.json");   /* tied */
	assert_int_equal(s.lm_head, -1);
	assert_int_equal(dte_spec_find(&s, "lm_head.weight"), -1);
	assert_string_equal(s.t[s.embed].name, "model.embed_tokens.weight");
	dte_spec_fini(&s);

	load(&s, DATA "tiny-qwen2-bias.json");  /* qwen2: q/k/v biases by default */
	id = dte_spec_find(&s, "model.layers.1.self_attn.k_proj.bias");
	assert_true(id >= 0);
	assert_int_equal(s.t[id].shape[0], 2 * 12);
	assert_int_equal(dte_spec_find(&s, "model.layers.0.self_attn.q_norm.weight"), -1);
	dte_spec_fini(&s);

	load(&s, DATA "tiny-qwen3-moe.json");   /* mlp_only_layers: [1] */
	assert_true(dte_spec_layer_tensor(&s, 1, DTE_SPEC_GATE) >= 0);
	assert_int_equal(dte_spec_layer_tensor(&s, 1, DTE_SPEC_ROUTER), -1);
	assert_true(dte_spec_layer_tensor(&s, 2, DTE_SPEC_ROUTER) >= 0);
	dte_spec_fini(&s);
}

static void test_hash_stable(void **state)
{
	static const char a[] = "{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":96,"
		"\"num_hidden_layers\":2,\"num_attention_heads\":8,\"num_key_value_heads\":2,"
		"\"vocab_size\":300}";
	static const char b[] = "{ \"vocab_size\": 300, \"num_key_value_heads\": 2,\n"
		"  \"num_attention_heads\": 8, \"num_hidden_layers\": 2, \"rms_norm_eps\": 1e-5,\n"
		"  \"intermediate_size\": 96, \"hidden_size\": 64, \"model_type\": \"llama\" }";
	static const char c[] = "{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":96,"
		"\"num_hidden_layers\":2,\"num_attention_heads\":8,\"num_key_value_heads\":2,"
		"\"vocab_size\":301}";
	struct dte_spec sa, sb, sc, sd;
	char err[256];

	assert_int_equal(dte_spec_load_string(&sa, a, err, sizeof(err)), 0);
	assert_int_equal(dte_spec_load_string(&sb, b, err, sizeof(err)), 0);
	assert_int_equal(dte_spec_load_string(&sc, c, err, sizeof(err)), 0);
	load(&sd, DATA "tiny-llama-gqa.json");
	assert_true(sa.hash != 0);
	/* Key order, spacing and fields that do not shape tensors don't matter. */
	assert_true(sa.hash == sb.hash);
	assert_true(sa.hash == sd.hash);
	/* One more vocab row does. */
	assert_true(sa.hash != sc.hash);
	dte_spec_fini(&sa);
	dte_spec_fini(&sb);
	dte_spec_fini(&sc);
	dte_spec_fini(&sd);
}

static void expect_error(const char *json, const char *needle)
{
	struct dte_spec s;
	char err[512] = "";

	assert_int_equal(dte_spec_load_string(&s, json, err, sizeof(err)), -1);
	if (!strstr(err, needle))
		fail_msg("error \"%s\" does not mention \"%s\"", err, needle);
	assert_null(s.t);
}

static void test_bad_configs(void **state)
{
	struct dte_spec s;
	char err[512] = "";

	assert_int_equal(dte_spec_load_file(&s, DATA "bad-malformed.json", err, sizeof(err)), -1);
	assert_non_null(strstr(err, "malformed JSON"));
	assert_int_equal(dte_spec_load_file(&s, DATA "bad-unknown-arch.json", err, sizeof(err)), -1);
	assert_non_null(strstr(err, "unknown architecture"));
	assert_non_null(strstr(err, "gpt2"));
	assert_int_equal(dte_spec_load_file(&s, DATA "bad-missing-field.json", err, sizeof(err)), -1);
	assert_non_null(strstr(err, "intermediate_size"));
	assert_int_equal(dte_spec_load_file(&s, DATA "no-such-file.json", err, sizeof(err)), -1);
	expect_error("[1, 2]", "not an object");
	expect_error("{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":96,"
		     "\"num_hidden_layers\":2,\"num_attention_heads\":8,\"num_key_value_heads\":3,"
		     "\"vocab_size\":300}", "num_key_value_heads");
	expect_error("{\"model_type\":\"llama\",\"hidden_size\":-64,\"intermediate_size\":96,"
		     "\"num_hidden_layers\":2,\"num_attention_heads\":8,\"vocab_size\":300}", "hidden_size");
	expect_error("{\"model_type\":\"llama\",\"hidden_size\":\"64\",\"intermediate_size\":96,"
		     "\"num_hidden_layers\":2,\"num_attention_heads\":8,\"vocab_size\":300}", "not an integer");
	expect_error("{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":96,"
		     "\"num_hidden_layers\":100000,\"num_attention_heads\":8,\"vocab_size\":300}", "num_hidden_layers");
	expect_error("{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":96,"
		     "\"num_hidden_layers\":2,\"num_attention_heads\":8,\"vocab_size\":300,"
		     "\"tie_word_embeddings\":1}", "tie_word_embeddings");
	expect_error("{\"model_type\":\"qwen3_moe\",\"hidden_size\":64,\"intermediate_size\":96,"
		     "\"num_hidden_layers\":2,\"num_attention_heads\":8,\"vocab_size\":300}", "num_experts");
	expect_error("{\"model_type\":\"qwen3_moe\",\"hidden_size\":64,\"intermediate_size\":96,"
		     "\"num_hidden_layers\":2,\"num_attention_heads\":8,\"vocab_size\":300,\"num_experts\":4,"
		     "\"moe_intermediate_size\":8,\"mlp_only_layers\":[7]}", "mlp_only_layers");
	expect_error("{\"model_type\":\"llama\",\"model_type\":\"qwen3\"}", "malformed");
}

/* transformers 5 writes the expert count as "num_local_experts"
 * (Qwen3MoeConfig.attribute_map); the spec reads either, the same model
 * either way, and refuses the two disagreeing. */
static void test_num_local_experts(void **state)
{
	static const char *head = "{\"model_type\":\"qwen3_moe\",\"hidden_size\":64,"
		"\"intermediate_size\":96,\"moe_intermediate_size\":32,\"num_hidden_layers\":2,"
		"\"num_attention_heads\":8,\"vocab_size\":300,";
	struct dte_spec a, b;
	char js[512], err[512] = "";

	snprintf(js, sizeof(js), "%s\"num_experts\":4}", head);
	assert_int_equal(dte_spec_load_string(&a, js, err, sizeof(err)), 0);
	snprintf(js, sizeof(js), "%s\"num_local_experts\":4,\"num_experts\":null}", head);
	assert_int_equal(dte_spec_load_string(&b, js, err, sizeof(err)), 0);
	assert_int_equal(a.n, b.n);
	assert_int_equal(dte_spec_find(&b, "model.layers.1.mlp.experts.3.down_proj.weight"),
			 dte_spec_find(&a, "model.layers.1.mlp.experts.3.down_proj.weight"));
	assert_int_equal(dte_spec_find(&b, "model.layers.1.mlp.experts.4.down_proj.weight"), -1);
	dte_spec_fini(&a);
	dte_spec_fini(&b);
	snprintf(js, sizeof(js), "%s\"num_local_experts\":4,\"num_experts\":8}", head);
	expect_error(js, "disagree");
	snprintf(js, sizeof(js), "%s\"num_local_experts\":0}", head);
	expect_error(js, "num_local_experts");
}

/* Found by tests/fuzz/fuzz_spec: every dim is capped, but their product
 * (q_proj: heads*head_dim x hidden) and the model's total overflowed int64
 * (UB), and 4096 layers x 4096 experts asked for ~10 GB of tensors. */
static void test_oversized_configs(void **state)
{
	expect_error("{\"model_type\":\"llama\",\"hidden_size\":2147483648,\"intermediate_size\":1,"
		     "\"num_hidden_layers\":1,\"num_attention_heads\":1,\"vocab_size\":2147483648}",
		     "more than 2^63 elements");
	expect_error("{\"model_type\":\"llama\",\"hidden_size\":2147483648,\"intermediate_size\":1,"
		     "\"num_hidden_layers\":1,\"num_attention_heads\":65536,\"head_dim\":65536,"
		     "\"vocab_size\":1}", "more than 2^63 elements");
	expect_error("{\"model_type\":\"qwen3_moe\",\"hidden_size\":8,\"intermediate_size\":8,"
		     "\"moe_intermediate_size\":8,\"num_hidden_layers\":4096,\"num_attention_heads\":1,"
		     "\"num_experts\":4096,\"vocab_size\":8}", "tensors");
}

/* DeepSeek-V3 / Kimi-K2 / GLM-4.5 at their real sizes (their published
 * config.json files, copied into tests/data/layout/models):
 * the published parameter counts without the MTP layer (DeepSeek-V3 671B,
 * Kimi-K2 1.03T), the FP32 router bias, MLA shapes; and the
 * q_lora_rank-null (V2-Lite style) variant. */
static void test_deepseek_glm(void **state)
{
	/* fp32: the elements the engines hold in FP32, which the spec carries
	 * as halves (two 16-bit units each): the e_score_correction_bias of
	 * DeepSeek-V3's 58 MoE layers x 256 experts, Kimi-K2's 60 x 384,
	 * GLM-4.5's 89 x 160 (its FP32 router weight is a BF16 canonical
	 * tensor: spec.c). */
	static const struct { const char *file; int64_t elems, fp32; uint32_t tensors; } m[] = {
		{ MODELS "deepseek-v3.json", 671026419200LL, 58 * 256, 45395 },
		{ MODELS "kimi-k2.json",     1026408232448LL, 60 * 384, 69975 },
		{ MODELS "glm-4.5.json",     352797805472LL, 89 * 160, 44005 },
	};
	struct dte_spec rt;
	const char *lite = "{\"model_type\": \"deepseek_v3\", \"hidden_size\": 64, "
		"\"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
		"\"vocab_size\": 100, \"q_lora_rank\": null, \"kv_lora_rank\": 16, "
		"\"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 8, "
		"\"n_routed_experts\": 4, \"moe_intermediate_size\": 8, \"first_k_dense_replace\": 1, "
		"\"topk_method\": \"noaux_tc\"}";
	struct dte_spec s;
	char err[256];
	int32_t id;
	size_t i;
	for (i = 0; i < sizeof(m) / sizeof(m[0]); i++) {
		load(&s, m[i].file);
		assert_int_equal(s.total_elems, m[i].elems + m[i].fp32);
		assert_int_equal(s.n, m[i].tensors);
		assert_int_equal(dte_spec_runtime(&s, &rt), 0);
		assert_int_equal(rt.total_elems, m[i].elems);
		assert_int_equal(rt.n, m[i].tensors);
		dte_spec_runtime_fini(&rt);
		dte_spec_fini(&s);
	}
	load(&s, m[0].file);
	assert_int_equal(dte_spec_layer_tensor(&s, 2, DTE_SPEC_ROUTER), -1);   /* first_k_dense_replace 3 */
	id = dte_spec_find(&s, "model.layers.3.mlp.gate.e_score_correction_bias");
	assert_true(id >= 0);
	assert_int_equal(s.t[id].dtype, DTE_SPEC_DTYPE_FP32);
	assert_true(dte_spec_is_halves(&s, (uint32_t)id));
	assert_int_equal(s.t[id].ndim, 2);
	assert_int_equal(s.t[id].shape[0], 256);
	assert_int_equal(s.t[id].shape[1], 2);
	assert_int_equal(s.t[id].numel, 512);
	assert_int_equal(s.halves, 58);
	assert_int_equal(dte_spec_runtime(&s, &rt), 0);
	assert_false(dte_spec_is_halves(&rt, (uint32_t)id));
	assert_int_equal(rt.t[id].ndim, 1);
	assert_int_equal(rt.t[id].numel, 256);
	assert_int_equal(rt.hash, s.hash);
	dte_spec_runtime_fini(&rt);
	id = dte_spec_find(&s, "model.layers.0.self_attn.kv_b_proj.weight");
	assert_int_equal(s.t[id].shape[0], 128 * 256);
	assert_int_equal(s.t[id].shape[1], 512);
	id = dte_spec_find(&s, "model.layers.3.mlp.shared_experts.down_proj.weight");
	assert_int_equal(s.t[id].shape[1], 2048);
	assert_int_equal(s.t[dte_spec_find(&s, "model.layers.3.mlp.gate.weight")].dtype, DTE_SPEC_DTYPE_BF16);
	dte_spec_fini(&s);
	load(&s, m[2].file);
	assert_int_equal(s.t[dte_spec_find(&s, "model.layers.3.mlp.gate.weight")].dtype, DTE_SPEC_DTYPE_BF16);
	assert_int_equal(s.t[dte_spec_find(&s, "model.layers.3.mlp.gate.e_score_correction_bias")].dtype,
			 DTE_SPEC_DTYPE_FP32);
	assert_true(dte_spec_find(&s, "model.layers.0.self_attn.q_proj.bias") >= 0);
	dte_spec_fini(&s);
	assert_int_equal(dte_spec_load_string(&s, lite, err, sizeof(err)), 0);
	assert_true(dte_spec_find(&s, "model.layers.0.self_attn.q_proj.weight") >= 0);
	assert_int_equal(dte_spec_find(&s, "model.layers.0.self_attn.q_a_proj.weight"), -1);
	assert_true(dte_spec_find(&s, "model.layers.1.mlp.shared_experts.gate_proj.weight") >= 0);
	dte_spec_fini(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_real_models_param_counts),
		cmocka_unit_test(test_names_and_shapes),
		cmocka_unit_test(test_hash_stable),
		cmocka_unit_test(test_bad_configs),
		cmocka_unit_test(test_num_local_experts),
		cmocka_unit_test(test_oversized_configs),
		cmocka_unit_test(test_deepseek_glm),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

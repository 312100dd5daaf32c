/* daemon/layout/spec.c — canonical tensors from an HF config.json. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include <xxhash.h>
#include "daemon/layout/spec.h"

/* Hard caps: config.json is input from outside. */
#define SPEC_MAX_LAYERS  4096
#define SPEC_MAX_EXPERTS 4096
#define SPEC_MAX_DIM     (INT64_C(1) << 31)
/* Well above any real model (Qwen3-235B ~38k tensors, DeepSeek-V3 ~48k),
 * far below what SPEC_MAX_LAYERS x SPEC_MAX_EXPERTS would allocate (~10 GB
 * of tensor records) and quick to build even at the cap. */
#define SPEC_MAX_TENSORS (1 << 18)

static int spec_err(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int spec_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return -1;
}

/* Integer field: required unless def >= 0. Bool true/false is not an int. */
static int spec_int(json_t *root, const char *key, int64_t def, int64_t min,
		    int64_t max, int64_t *out, char *err, size_t errlen)
{
	json_t *v = json_object_get(root, key);

	if (!v || json_is_null(v)) {
		if (def < 0)
			return spec_err(err, errlen, "config.json: missing \"%s\"", key);
		*out = def;
		return 0;
	}
	if (!json_is_integer(v))
		return spec_err(err, errlen, "config.json: \"%s\" is not an integer", key);
	*out = json_integer_value(v);
	if (*out < min || *out > max)
		return spec_err(err, errlen, "config.json: \"%s\" = %lld out of range [%lld, %lld]",
				key, (long long)*out, (long long)min, (long long)max);
	return 0;
}

/* The expert count.  transformers 5 writes it as "num_local_experts"
 * (transformers/models/qwen3_moe/configuration_qwen3_moe.py
 * Qwen3MoeConfig.attribute_map: num_experts -> num_local_experts), earlier
 * releases and the engines' own configs as "num_experts".  Either is taken;
 * both present must agree. */
static int spec_experts(json_t *root, int64_t *out, char *err, size_t errlen)
{
	int64_t a = 0, b = 0;
	int has_a = json_object_get(root, "num_experts") != NULL &&
		    !json_is_null(json_object_get(root, "num_experts"));
	int has_b = json_object_get(root, "num_local_experts") != NULL &&
		    !json_is_null(json_object_get(root, "num_local_experts"));

	if (!has_a && !has_b)
		return spec_err(err, errlen, "config.json: missing \"num_experts\" "
				"(or transformers 5's \"num_local_experts\")");
	if (has_a && spec_int(root, "num_experts", -1, 1, SPEC_MAX_EXPERTS, &a, err, errlen))
		return -1;
	if (has_b && spec_int(root, "num_local_experts", -1, 1, SPEC_MAX_EXPERTS, &b, err, errlen))
		return -1;
	if (has_a && has_b && a != b)
		return spec_err(err, errlen, "config.json: \"num_experts\" = %lld and "
				"\"num_local_experts\" = %lld disagree", (long long)a, (long long)b);
	*out = has_a ? a : b;
	return 0;
}

static int spec_bool(json_t *root, const char *key, int def, int *out,
		     char *err, size_t errlen)
{
	json_t *v = json_object_get(root, key);

	if (!v || json_is_null(v)) {
		*out = def;
		return 0;
	}
	if (!json_is_boolean(v))
		return spec_err(err, errlen, "config.json: \"%s\" is not a boolean", key);
	*out = json_is_true(v);
	return 0;
}

/* Families we know the tensor names of (spec.h). */
static const struct dte_spec_family spec_families[] = {
	{ "llama",     "LlamaForCausalLM",    0, 0, 0, DTE_SPEC_ARCH_GQA },
	{ "mistral",   "MistralForCausalLM",  0, 0, 0, DTE_SPEC_ARCH_GQA },
	{ "qwen2",     "Qwen2ForCausalLM",    1, 0, 0, DTE_SPEC_ARCH_GQA },
	{ "qwen3",     "Qwen3ForCausalLM",    0, 1, 0, DTE_SPEC_ARCH_GQA },
	{ "qwen3_moe", "Qwen3MoeForCausalLM", 0, 1, 1, DTE_SPEC_ARCH_GQA },
	/* DeepSeek-V3 (and R1); Kimi-K2 ships the same architecture under
	 * model_type "kimi_k2" (vllm/transformers_utils/config.py maps kimi_k2
	 * to DeepseekV3Config). */
	{ "deepseek_v3", "DeepseekV3ForCausalLM", 0, 0, 1, DTE_SPEC_ARCH_MLA },
	{ "kimi_k2",     "DeepseekV3ForCausalLM", 0, 0, 1, DTE_SPEC_ARCH_MLA },
	/* GLM-4.5 / 4.6 (Glm4MoeConfig: attention_bias and use_qk_norm default
	 * false; the published configs set attention_bias true). */
	{ "glm4_moe",    "Glm4MoeForCausalLM",    0, 0, 1, DTE_SPEC_ARCH_GLM4_MOE },
};
#define SPEC_NFAMILIES (sizeof(spec_families) / sizeof(spec_families[0]))

const struct dte_spec_family *dte_spec_families(size_t *n)
{
	*n = SPEC_NFAMILIES;
	return spec_families;
}

static const struct dte_spec_family *spec_family_of(json_t *root, char *err, size_t errlen)
{
	json_t *mt = json_object_get(root, "model_type");
	json_t *archs = json_object_get(root, "architectures");
	const char *arch = NULL;
	char names[256];
	size_t i, len = 0;

	if (json_is_array(archs) && json_array_size(archs) > 0 &&
	    json_is_string(json_array_get(archs, 0)))
		arch = json_string_value(json_array_get(archs, 0));
	for (i = 0; i < SPEC_NFAMILIES; i++) {
		if (json_is_string(mt) ? !strcmp(json_string_value(mt), spec_families[i].model_type)
				       : (arch && !strcmp(arch, spec_families[i].architecture)))
			return &spec_families[i];
	}
	names[0] = 0;
	for (i = 0; i < SPEC_NFAMILIES && len < sizeof(names); i++) {
		int w = snprintf(names + len, sizeof(names) - len, "%s%s", i ? ", " : "",
				 spec_families[i].model_type);
		if (w < 0)
			break;
		len += (size_t)w;
	}
	spec_err(err, errlen, "config.json: unknown architecture (model_type \"%s\", architectures[0] \"%s\"); "
		 "supported: %s",
		 json_is_string(mt) ? json_string_value(mt) : "?", arch ? arch : "?", names);
	return NULL;
}

/* DeepSeek-V3 / Kimi-K2 (MLA) and GLM-4.5 MoE fields, as the engines read
 * them:
 * - experts: "n_routed_experts"; shared experts "n_shared_experts" (null or
 *   absent: none), each of moe_intermediate_size, fused into one MLP of
 *   moe_intermediate_size * n_shared_experts rows (SGLang 0.5.23
 *   models/deepseek_v2.py DeepseekV2MoE.__init__, glm4_moe.py
 *   Glm4MoeSparseMoeBlock; vLLM 0.33 models/deepseek_v2.py DeepseekV2MoE,
 *   glm4_moe.py Glm4MoE);
 * - MoE layers: layer >= first_k_dense_replace and, for DeepSeek,
 *   layer % moe_layer_freq == 0 (vLLM deepseek_v2.py
 *   DeepseekV2DecoderLayer.__init__ is_moe_layer; GLM: glm4_moe.py
 *   Glm4MoeDecoderLayer, first_k_dense_replace alone);
 * - e_score_correction_bias [n_routed_experts] FP32: DeepSeek when
 *   topk_method == "noaux_tc" (SGLang MoEGate.__init__, vLLM
 *   DeepseekV2MoE: getattr(config, "topk_method", None)); GLM always
 *   (Glm4MoeGate / Glm4MoE), whose router weight is FP32 too;
 * - MLA: q_lora_rank (null: q_proj, DeepSeek-V2-Lite style),
 *   kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
 *   (DeepseekV2AttentionMLA.__init__ in both engines).  Present and
 *   explicit: a guessed default would give the wrong shapes.
 * Multi-token-prediction layers (num_nextn_predict_layers, checkpoint layer
 * ids >= num_hidden_layers) are skipped by both engines' main-model
 * load_weights and are not part of the spec. */
static int spec_parse_ds(struct dte_spec_cfg *c, json_t *root, char *err, size_t errlen)
{
	int mla = c->arch == DTE_SPEC_ARCH_MLA;
	int64_t freq = 1, alias = 0;
	json_t *v;
	size_t i;

	if (spec_int(root, "n_routed_experts", mla ? 256 : 128, 1, SPEC_MAX_EXPERTS, &c->experts, err, errlen) ||
	    spec_int(root, "moe_intermediate_size", mla ? 2048 : 1408, 1, SPEC_MAX_DIM, &c->moe_intermediate, err, errlen) ||
	    spec_int(root, "n_shared_experts", 1, 0, 64, &c->shared_experts, err, errlen) ||
	    spec_int(root, "first_k_dense_replace", mla ? 3 : 1, 0, SPEC_MAX_LAYERS, &c->first_dense, err, errlen))
		return -1;
	/* attribute_map: num_local_experts -> n_routed_experts. */
	v = json_object_get(root, "num_local_experts");
	if (v && !json_is_null(v)) {
		if (spec_int(root, "num_local_experts", -1, 1, SPEC_MAX_EXPERTS, &alias, err, errlen))
			return -1;
		if (json_object_get(root, "n_routed_experts") && alias != c->experts)
			return spec_err(err, errlen, "config.json: \"n_routed_experts\" = %lld and "
					"\"num_local_experts\" = %lld disagree", (long long)c->experts, (long long)alias);
		c->experts = alias;
	}
	if (json_is_null(json_object_get(root, "n_shared_experts")))
		c->shared_experts = 0;
	if (c->arch == DTE_SPEC_ARCH_MLA) {
		const char *tm = NULL;

		if (spec_int(root, "moe_layer_freq", 1, 1, SPEC_MAX_LAYERS, &freq, err, errlen) ||
		    spec_int(root, "kv_lora_rank", 512, 1, SPEC_MAX_DIM, &c->kv_lora_rank, err, errlen) ||
		    spec_int(root, "qk_nope_head_dim", 128, 0, 65536, &c->qk_nope_head_dim, err, errlen) ||
		    spec_int(root, "qk_rope_head_dim", 64, 1, 65536, &c->qk_rope_head_dim, err, errlen) ||
		    spec_int(root, "v_head_dim", 128, 1, 65536, &c->v_head_dim, err, errlen))
			return -1;
		v = json_object_get(root, "q_lora_rank");
		if (v && json_is_null(v))
			c->q_lora_rank = 0;
		else if (spec_int(root, "q_lora_rank", 1536, 1, SPEC_MAX_DIM, &c->q_lora_rank, err, errlen))
			return -1;
		v = json_object_get(root, "topk_method");
		if (v && !json_is_null(v) && !json_is_string(v))
			return spec_err(err, errlen, "config.json: \"topk_method\" is not a string");
		if (json_is_string(v))
			tm = json_string_value(v);
		c->router_bias = tm && !strcmp(tm, "noaux_tc");
		/* MLA has no GQA heads: num_key_value_heads is not read. */
		c->kv_heads = c->heads;
	} else {
		if (spec_bool(root, "use_qk_norm", 0, &c->qk_norm, err, errlen))
			return -1;
		c->router_bias = 1;
	}
	if (c->layers * (c->experts * 3 + 32) > SPEC_MAX_TENSORS)
		return spec_err(err, errlen, "config.json: %lld layers of %lld experts are over %d tensors",
				(long long)c->layers, (long long)c->experts, SPEC_MAX_TENSORS);
	for (i = 0; i < (size_t)c->layers; i++)
		c->moe_layer[i] = (int64_t)i >= c->first_dense && (int64_t)i % freq == 0;
	return 0;
}

static int spec_parse_cfg(struct dte_spec_cfg *c, json_t *root, char *err, size_t errlen)
{
	const struct dte_spec_family *fam;
	int64_t dflt_hd;
	json_t *only;
	size_t i;

	if (!json_is_object(root))
		return spec_err(err, errlen, "config.json: top level is not an object");
	fam = spec_family_of(root, err, errlen);
	if (!fam)
		return -1;
	snprintf(c->model_type, sizeof(c->model_type), "%s", fam->model_type);
	if (spec_int(root, "hidden_size", -1, 1, SPEC_MAX_DIM, &c->hidden, err, errlen) ||
	    spec_int(root, "num_hidden_layers", -1, 1, SPEC_MAX_LAYERS, &c->layers, err, errlen) ||
	    spec_int(root, "num_attention_heads", -1, 1, 65536, &c->heads, err, errlen) ||
	    spec_int(root, "num_key_value_heads", c->heads, 1, 65536, &c->kv_heads, err, errlen) ||
	    spec_int(root, "vocab_size", -1, 1, SPEC_MAX_DIM, &c->vocab, err, errlen) ||
	    spec_int(root, "intermediate_size", -1, 1, SPEC_MAX_DIM, &c->intermediate, err, errlen))
		return -1;
	if (c->hidden % c->heads && !json_object_get(root, "head_dim"))
		return spec_err(err, errlen, "config.json: hidden_size %lld not divisible by num_attention_heads %lld and no head_dim",
				(long long)c->hidden, (long long)c->heads);
	dflt_hd = c->hidden / c->heads;
	if (spec_int(root, "head_dim", dflt_hd, 1, 65536, &c->head_dim, err, errlen))
		return -1;
	if (c->heads % c->kv_heads)
		return spec_err(err, errlen, "config.json: num_attention_heads %lld not a multiple of num_key_value_heads %lld",
				(long long)c->heads, (long long)c->kv_heads);
	if (spec_bool(root, "tie_word_embeddings", 0, &c->tied, err, errlen) ||
	    spec_bool(root, "attention_bias", fam->attn_bias, &c->attn_bias, err, errlen))
		return -1;
	c->qk_norm = fam->qk_norm;
	c->arch = fam->arch;
	c->moe_layer = calloc((size_t)c->layers, 1);
	if (!c->moe_layer)
		return spec_err(err, errlen, "out of memory");
	if (!fam->moe)
		return 0;
	if (fam->arch != DTE_SPEC_ARCH_GQA)
		return spec_parse_ds(c, root, err, errlen);
	if (spec_experts(root, &c->experts, err, errlen) ||
	    spec_int(root, "moe_intermediate_size", -1, 1, SPEC_MAX_DIM, &c->moe_intermediate, err, errlen) ||
	    spec_int(root, "decoder_sparse_step", 1, 1, SPEC_MAX_LAYERS, &c->sparse_step, err, errlen))
		return -1;
	if (c->layers * (c->experts * 3 + 16) > SPEC_MAX_TENSORS)
		return spec_err(err, errlen, "config.json: %lld layers of %lld experts are over %d tensors",
				(long long)c->layers, (long long)c->experts, SPEC_MAX_TENSORS);
	for (i = 0; i < (size_t)c->layers; i++)
		c->moe_layer[i] = ((int64_t)(i + 1) % c->sparse_step) == 0;
	only = json_object_get(root, "mlp_only_layers");
	if (only && !json_is_array(only))
		return spec_err(err, errlen, "config.json: \"mlp_only_layers\" is not an array");
	for (i = 0; only && i < json_array_size(only); i++) {
		json_t *v = json_array_get(only, i);
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) >= c->layers)
			return spec_err(err, errlen, "config.json: mlp_only_layers[%zu] is not a layer index", i);
		c->moe_layer[json_integer_value(v)] = 0;
	}
	return 0;
}

struct spec_builder {
	struct dte_spec *s;
	uint32_t cap;
};

static int spec_add(struct spec_builder *b, enum dte_spec_kind kind, int32_t layer,
		    int32_t expert, uint32_t ndim, int64_t d0, int64_t d1, const char *fmt, ...)
	__attribute__((format(printf, 8, 9)));

static int spec_add(struct spec_builder *b, enum dte_spec_kind kind, int32_t layer,
		    int32_t expert, uint32_t ndim, int64_t d0, int64_t d1, const char *fmt, ...)
{
	struct dte_spec *s = b->s;
	struct dte_spec_tensor *t;
	va_list ap;

	if (s->n == b->cap) {
		uint32_t ncap = b->cap ? b->cap * 2 : 256;
		void *p = realloc(s->t, ncap * sizeof(*s->t));
		if (!p)
			return -1;
		s->t = p;
		b->cap = ncap;
	}
	t = &s->t[s->n];
	memset(t, 0, sizeof(*t));
	va_start(ap, fmt);
	vsnprintf(t->name, sizeof(t->name), fmt, ap);
	va_end(ap);
	t->ndim = ndim;
	t->shape[0] = d0;
	t->shape[1] = d1;
	/* Each dim is capped, their product and the model's sum are not. */
	t->numel = d0;
	if ((ndim == 2 && __builtin_mul_overflow(d0, d1, &t->numel)) ||
	    __builtin_add_overflow(s->total_elems, t->numel, &s->total_elems))
		return -2;
	t->kind = (uint8_t)kind;
	t->layer = layer;
	t->expert = expert;
	t->group = (ndim == 1) ? DTE_SPEC_GROUP_NO_DECAY : DTE_SPEC_GROUP_DECAY;
	if (layer >= 0 && expert < 0)
		s->layer_idx[layer * DTE_SPEC_NKINDS + kind] = (int32_t)s->n;
	s->n++;
	return 0;
}

/* Multi-head latent attention of one layer, in the Hugging Face DeepSeek-V3
 * checkpoint's names and shapes (the engines' load_weights read these:
 * SGLang 0.5.23 models/deepseek_common/deepseek_weight_loader.py
 * do_load_weights, vLLM 0.33 models/deepseek_v2.py
 * DeepseekV2ForCausalLM.load_weights). */
static int spec_mla_attention(struct spec_builder *b, int32_t l)
{
	const struct dte_spec_cfg *c = &b->s->cfg;
	int64_t H = c->hidden, nh = c->heads, qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
	const char *p = "model.layers";
	int rc = 0;

	if (c->q_lora_rank) {
		rc |= spec_add(b, DTE_SPEC_Q_A, l, -1, 2, c->q_lora_rank, H, "%s.%d.self_attn.q_a_proj.weight", p, l);
		rc |= spec_add(b, DTE_SPEC_Q_A_NORM, l, -1, 1, c->q_lora_rank, 0, "%s.%d.self_attn.q_a_layernorm.weight", p, l);
		rc |= spec_add(b, DTE_SPEC_Q_B, l, -1, 2, nh * qk, c->q_lora_rank, "%s.%d.self_attn.q_b_proj.weight", p, l);
	} else {
		rc |= spec_add(b, DTE_SPEC_Q, l, -1, 2, nh * qk, H, "%s.%d.self_attn.q_proj.weight", p, l);
	}
	rc |= spec_add(b, DTE_SPEC_KV_A, l, -1, 2, c->kv_lora_rank + c->qk_rope_head_dim, H,
		       "%s.%d.self_attn.kv_a_proj_with_mqa.weight", p, l);
	rc |= spec_add(b, DTE_SPEC_KV_A_NORM, l, -1, 1, c->kv_lora_rank, 0, "%s.%d.self_attn.kv_a_layernorm.weight", p, l);
	rc |= spec_add(b, DTE_SPEC_KV_B, l, -1, 2, nh * (c->qk_nope_head_dim + c->v_head_dim), c->kv_lora_rank,
		       "%s.%d.self_attn.kv_b_proj.weight", p, l);
	rc |= spec_add(b, DTE_SPEC_O, l, -1, 2, H, nh * c->v_head_dim, "%s.%d.self_attn.o_proj.weight", p, l);
	return rc;
}

static int spec_build_tensors(struct dte_spec *s)
{
	const struct dte_spec_cfg *c = &s->cfg;
	struct spec_builder b = { s, 0 };
	int64_t H = c->hidden, hd = c->head_dim;
	int32_t l, e;
	size_t i;
	int rc = 0;

	s->layer_idx = malloc((size_t)c->layers * DTE_SPEC_NKINDS * sizeof(int32_t));
	s->expert_base = malloc((size_t)c->layers * sizeof(int32_t));
	if (!s->layer_idx || !s->expert_base)
		return -1;
	for (i = 0; i < (size_t)c->layers * DTE_SPEC_NKINDS; i++)
		s->layer_idx[i] = -1;
	s->embed = (int32_t)s->n;
	rc |= spec_add(&b, DTE_SPEC_EMBED, -1, -1, 2, c->vocab, H, "model.embed_tokens.weight");
	for (l = 0; l < c->layers && !rc; l++) {
		const char *p = "model.layers";
		s->expert_base[l] = -1;
		rc |= spec_add(&b, DTE_SPEC_IN_NORM, l, -1, 1, H, 0, "%s.%d.input_layernorm.weight", p, l);
		if (c->arch == DTE_SPEC_ARCH_MLA) {
			rc |= spec_mla_attention(&b, l);
		} else {
			rc |= spec_add(&b, DTE_SPEC_Q, l, -1, 2, c->heads * hd, H, "%s.%d.self_attn.q_proj.weight", p, l);
			rc |= spec_add(&b, DTE_SPEC_K, l, -1, 2, c->kv_heads * hd, H, "%s.%d.self_attn.k_proj.weight", p, l);
			rc |= spec_add(&b, DTE_SPEC_V, l, -1, 2, c->kv_heads * hd, H, "%s.%d.self_attn.v_proj.weight", p, l);
			if (c->attn_bias) {
				rc |= spec_add(&b, DTE_SPEC_Q_BIAS, l, -1, 1, c->heads * hd, 0, "%s.%d.self_attn.q_proj.bias", p, l);
				rc |= spec_add(&b, DTE_SPEC_K_BIAS, l, -1, 1, c->kv_heads * hd, 0, "%s.%d.self_attn.k_proj.bias", p, l);
				rc |= spec_add(&b, DTE_SPEC_V_BIAS, l, -1, 1, c->kv_heads * hd, 0, "%s.%d.self_attn.v_proj.bias", p, l);
			}
			if (c->qk_norm) {
				rc |= spec_add(&b, DTE_SPEC_Q_NORM, l, -1, 1, hd, 0, "%s.%d.self_attn.q_norm.weight", p, l);
				rc |= spec_add(&b, DTE_SPEC_K_NORM, l, -1, 1, hd, 0, "%s.%d.self_attn.k_norm.weight", p, l);
			}
			rc |= spec_add(&b, DTE_SPEC_O, l, -1, 2, H, c->heads * hd, "%s.%d.self_attn.o_proj.weight", p, l);
		}
		rc |= spec_add(&b, DTE_SPEC_POST_NORM, l, -1, 1, H, 0, "%s.%d.post_attention_layernorm.weight", p, l);
		if (!c->moe_layer[l]) {
			int64_t I = c->intermediate;
			rc |= spec_add(&b, DTE_SPEC_GATE, l, -1, 2, I, H, "%s.%d.mlp.gate_proj.weight", p, l);
			rc |= spec_add(&b, DTE_SPEC_UP, l, -1, 2, I, H, "%s.%d.mlp.up_proj.weight", p, l);
			rc |= spec_add(&b, DTE_SPEC_DOWN, l, -1, 2, H, I, "%s.%d.mlp.down_proj.weight", p, l);
			continue;
		}
		/* GLM-4.5's router weight is FP32 in the engines
		 * but a trained parameter: a BF16 trainer's forward multiplies
		 * by RNE-BF16 of its master (Megatron-Core's Float16Module casts
		 * TopKRouter.weight like every parameter), so it is a BF16
		 * canonical tensor, widened into the engine's FP32 parameter by
		 * the sink (dte.integrations' FP32 shadow).  Only what has no
		 * optimizer and is used in FP32 as it is moves as FP32 bits. */
		rc |= spec_add(&b, DTE_SPEC_ROUTER, l, -1, 2, c->experts, H, "%s.%d.mlp.gate.weight", p, l);
		if (c->router_bias) {
			rc |= spec_add(&b, DTE_SPEC_ROUTER_BIAS, l, -1, 1, c->experts, 0,
				       "%s.%d.mlp.gate.e_score_correction_bias", p, l);
			if (!rc)
				s->t[s->n - 1].dtype = DTE_SPEC_DTYPE_FP32;
		}
		s->expert_base[l] = (int32_t)s->n;
		for (e = 0; e < c->experts && !rc; e++) {
			int64_t I = c->moe_intermediate;
			rc |= spec_add(&b, DTE_SPEC_EXP_GATE, l, e, 2, I, H, "%s.%d.mlp.experts.%d.gate_proj.weight", p, l, e);
			rc |= spec_add(&b, DTE_SPEC_EXP_UP, l, e, 2, I, H, "%s.%d.mlp.experts.%d.up_proj.weight", p, l, e);
			rc |= spec_add(&b, DTE_SPEC_EXP_DOWN, l, e, 2, H, I, "%s.%d.mlp.experts.%d.down_proj.weight", p, l, e);
		}
		if (c->shared_experts) {
			int64_t Is = c->moe_intermediate * c->shared_experts;
			rc |= spec_add(&b, DTE_SPEC_SH_GATE, l, -1, 2, Is, H, "%s.%d.mlp.shared_experts.gate_proj.weight", p, l);
			rc |= spec_add(&b, DTE_SPEC_SH_UP, l, -1, 2, Is, H, "%s.%d.mlp.shared_experts.up_proj.weight", p, l);
			rc |= spec_add(&b, DTE_SPEC_SH_DOWN, l, -1, 2, H, Is, "%s.%d.mlp.shared_experts.down_proj.weight", p, l);
		}
	}
	s->final_norm = (int32_t)s->n;
	rc |= spec_add(&b, DTE_SPEC_FINAL_NORM, -1, -1, 1, H, 0, "model.norm.weight");
	s->lm_head = -1;
	if (!c->tied) {
		s->lm_head = (int32_t)s->n;
		rc |= spec_add(&b, DTE_SPEC_LM_HEAD, -1, -1, 2, c->vocab, H, "lm_head.weight");
	}
	return rc;
}

/* Canonical serialization: per tensor name NUL ndim shape (LE int64), then
 * "bf16" or "fp32" (every tensor of the earlier families is "bf16", so
 * their hashes are unchanged). */
static uint64_t spec_hash(const struct dte_spec *s)
{
	XXH3_state_t *st = XXH3_createState();
	uint64_t h = 0;
	uint32_t i, d;

	if (!st)
		return 0;
	XXH3_64bits_reset(st);
	for (i = 0; i < s->n; i++) {
		const struct dte_spec_tensor *t = &s->t[i];
		uint8_t buf[8];
		XXH3_64bits_update(st, t->name, strlen(t->name) + 1);
		buf[0] = (uint8_t)t->ndim;
		XXH3_64bits_update(st, buf, 1);
		for (d = 0; d < t->ndim; d++) {
			uint64_t v = (uint64_t)t->shape[d];
			int k;
			for (k = 0; k < 8; k++)
				buf[k] = (uint8_t)(v >> (8 * k));
			XXH3_64bits_update(st, buf, 8);
		}
		XXH3_64bits_update(st, dte_spec_dtype_name(t->dtype), 4);
	}
	h = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	return h;
}

/* FP32 tensors become their halves (spec.h): one more dim of extent 2.
 * The hash is taken before, over the engines' shapes and dtypes. */
static int spec_halves(struct dte_spec *s)
{
	uint32_t i;

	for (i = 0; i < s->n; i++) {
		struct dte_spec_tensor *t = &s->t[i];
		if (t->dtype != DTE_SPEC_DTYPE_FP32)
			continue;
		if (t->ndim + 1 > DTE_MAX_DIMS ||
		    __builtin_add_overflow(s->total_elems, t->numel, &s->total_elems))
			return -2;
		t->shape[t->ndim++] = 2;
		t->numel *= 2;
		s->halves++;
	}
	return 0;
}

int dte_spec_runtime(const struct dte_spec *spec, struct dte_spec *rt)
{
	uint32_t i;

	*rt = *spec;
	rt->runtime = 1;
	rt->halves = 0;
	rt->t = malloc((spec->n ? spec->n : 1) * sizeof(*rt->t));
	if (!rt->t)
		return -1;
	memcpy(rt->t, spec->t, spec->n * sizeof(*rt->t));
	for (i = 0; i < rt->n && !spec->runtime; i++) {
		struct dte_spec_tensor *t = &rt->t[i];
		if (t->dtype != DTE_SPEC_DTYPE_FP32)
			continue;
		t->shape[--t->ndim] = 0;
		t->numel /= 2;
		rt->total_elems -= t->numel;
	}
	return 0;
}

void dte_spec_runtime_fini(struct dte_spec *rt)
{
	free(rt->t);
	memset(rt, 0, sizeof(*rt));
}

static int spec_from_json(struct dte_spec *spec, json_t *root, char *err, size_t errlen)
{
	int rc;

	memset(spec, 0, sizeof(*spec));
	if (spec_parse_cfg(&spec->cfg, root, err, errlen))
		goto fail;
	rc = spec_build_tensors(spec);
	if (rc) {
		spec_err(err, errlen, rc == -2 ? "config.json: model has more than 2^63 elements"
					      : "out of memory building the model spec");
		goto fail;
	}
	spec->hash = spec_hash(spec);
	if (spec_halves(spec)) {
		spec_err(err, errlen, "config.json: model has more than 2^63 elements");
		goto fail;
	}
	return 0;
fail:
	dte_spec_fini(spec);
	return -1;
}

int dte_spec_load_string(struct dte_spec *spec, const char *json,
			 char *err, size_t errlen)
{
	json_error_t jerr;
	json_t *root;
	int rc;

	memset(spec, 0, sizeof(*spec));
	root = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return spec_err(err, errlen, "config.json: malformed JSON at line %d: %s",
				jerr.line, jerr.text);
	rc = spec_from_json(spec, root, err, errlen);
	json_decref(root);
	return rc;
}

int dte_spec_load_file(struct dte_spec *spec, const char *path,
		       char *err, size_t errlen)
{
	json_error_t jerr;
	json_t *root;
	int rc;

	memset(spec, 0, sizeof(*spec));
	root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
	if (!root && json_error_code(&jerr) == json_error_cannot_open_file)
		return spec_err(err, errlen, "%s", jerr.text);   /* "unable to open PATH: OS error" */
	if (!root)
		return spec_err(err, errlen, "%s: malformed JSON at line %d: %s",
				path, jerr.line, jerr.text);
	rc = spec_from_json(spec, root, err, errlen);
	json_decref(root);
	return rc;
}

void dte_spec_fini(struct dte_spec *spec)
{
	free(spec->t);
	free(spec->layer_idx);
	free(spec->expert_base);
	free(spec->cfg.moe_layer);
	memset(spec, 0, sizeof(*spec));
}

int32_t dte_spec_find(const struct dte_spec *spec, const char *name)
{
	uint32_t i;

	for (i = 0; i < spec->n; i++)
		if (!strcmp(spec->t[i].name, name))
			return (int32_t)i;
	return -1;
}

int32_t dte_spec_layer_tensor(const struct dte_spec *spec, int64_t layer,
			      enum dte_spec_kind kind)
{
	if (layer < 0 || layer >= spec->cfg.layers || kind >= DTE_SPEC_NKINDS)
		return -1;
	return spec->layer_idx[layer * DTE_SPEC_NKINDS + kind];
}

int32_t dte_spec_expert_tensor(const struct dte_spec *spec, int64_t layer,
			       int64_t expert, enum dte_spec_kind kind)
{
	if (layer < 0 || layer >= spec->cfg.layers || spec->expert_base[layer] < 0 ||
	    expert < 0 || expert >= spec->cfg.experts ||
	    kind < DTE_SPEC_EXP_GATE || kind > DTE_SPEC_EXP_DOWN)
		return -1;
	return spec->expert_base[layer] + (int32_t)(expert * 3 + (kind - DTE_SPEC_EXP_GATE));
}

const char *dte_spec_dtype_name(int dtype)
{
	return dtype == DTE_SPEC_DTYPE_FP32 ? "fp32" : "bf16";
}

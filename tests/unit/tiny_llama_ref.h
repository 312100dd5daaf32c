/* tests/unit/tiny_llama_ref.h — expected sink contents for
 * tests/data/layout/tiny-llama-gqa.json at TP=1, computed without the
 * product's plan: test_job.c and test_fixture.c both check sinks with it.
 *
 * Expected sink contents, computed without the product's plan: every
 * element of every SGLang buffer is traced to its Hugging Face element and
 * from there to the Megatron parameter the trainer holds it in, from the
 * runtimes' own layout rules for tests/data/layout/tiny-llama-gqa.json at
 * TP=1:
 *  - SGLang (python/sglang/srt/models/llama.py stacked_params_mapping;
 *    layers/linear.py QKVParallelLinear.weight_loader puts q at row 0, k at
 *    nq*hd, v at (nq+nkv)*hd; MergedColumnParallelLinear puts gate_proj
 *    (shard 0) then up_proj (shard 1); layers/vocab_parallel_embedding.py
 *    pads the vocabulary to DEFAULT_VOCAB_PADDING_SIZE = 64, rows past it
 *    are never written).
 *  - Megatron-Core (megatron/core/transformer/attention.py
 *    SelfAttention.get_query_key_value_tensors views linear_qkv's output
 *    per query group as [q heads of the group; k; v]; transformer/mlp.py
 *    glu() chunks linear_fc1's output as [gate; up]; TE's LayerNormLinear
 *    carries the preceding RMSNorm as layer_norm_weight; the vocabulary is
 *    padded to make_vocab_size_divisible_by = 128).
 * Where each Megatron parameter sits in the trainer's buffer is what the
 * layout tells a client to allocate (its tensor table, checked against
 * Megatron's param_and_grad_buffer rules in mg_tensor_table_check()).
 */
#ifndef DTE_TINY_LLAMA_REF_H
#define DTE_TINY_LLAMA_REF_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "daemon/layout/layout.h"

enum { M_H = 64, M_I = 96, M_NQ = 8, M_NKV = 2, M_HD = 8, M_V = 300, M_L = 2 };

struct elref {
	char name[DTE_LAYOUT_NAME_MAX];
	int64_t r, c;
};

/* Rows and columns (1 for a vector) of an SGLang TP=1 parameter. */
static int sg_shape(const char *name, int64_t *rows, int64_t *cols)
{
	char rest[64];
	int layer;

	*cols = M_H;
	if (!strcmp(name, "model.embed_tokens.weight") || !strcmp(name, "lm_head.weight")) {
		*rows = (M_V + 63) / 64 * 64;
		return 0;
	}
	if (!strcmp(name, "model.norm.weight")) {
		*rows = M_H, *cols = 1;
		return 0;
	}
	if (sscanf(name, "model.layers.%d.%63s", &layer, rest) != 2 || layer < 0 || layer >= M_L)
		return -1;
	if (!strcmp(rest, "input_layernorm.weight") || !strcmp(rest, "post_attention_layernorm.weight"))
		*rows = M_H, *cols = 1;
	else if (!strcmp(rest, "self_attn.qkv_proj.weight"))
		*rows = (M_NQ + 2 * M_NKV) * M_HD;
	else if (!strcmp(rest, "self_attn.o_proj.weight"))
		*rows = M_H, *cols = M_NQ * M_HD;
	else if (!strcmp(rest, "mlp.gate_up_proj.weight"))
		*rows = 2 * M_I;
	else if (!strcmp(rest, "mlp.down_proj.weight"))
		*rows = M_H, *cols = M_I;
	else
		return -1;
	return 0;
}

/* SGLang element -> HF element; 0 for a padded row nothing maps to. */
static int sg_to_hf(const char *name, int64_t r, int64_t c, struct elref *hf)
{
	char rest[64];
	int layer;

	hf->r = r, hf->c = c;
	if (!strcmp(name, "model.embed_tokens.weight") || !strcmp(name, "lm_head.weight") ||
	    !strcmp(name, "model.norm.weight")) {
		snprintf(hf->name, sizeof(hf->name), "%s", name);
		return r < (strcmp(name, "model.norm.weight") ? M_V : M_H);
	}
	assert_int_equal(sscanf(name, "model.layers.%d.%63s", &layer, rest), 2);
#define HF(fmt) snprintf(hf->name, sizeof(hf->name), "model.layers.%d." fmt, layer)
	if (!strcmp(rest, "self_attn.qkv_proj.weight")) {
		if (r < M_NQ * M_HD) {
			HF("self_attn.q_proj.weight");
		} else if (r < (M_NQ + M_NKV) * M_HD) {
			HF("self_attn.k_proj.weight");
			hf->r = r - M_NQ * M_HD;
		} else {
			HF("self_attn.v_proj.weight");
			hf->r = r - (M_NQ + M_NKV) * M_HD;
		}
	} else if (!strcmp(rest, "mlp.gate_up_proj.weight")) {
		if (r < M_I) {
			HF("mlp.gate_proj.weight");
		} else {
			HF("mlp.up_proj.weight");
			hf->r = r - M_I;
		}
	} else {
		snprintf(hf->name, sizeof(hf->name), "model.layers.%d.%s", layer, rest);
	}
#undef HF
	return 1;
}

/* HF element -> the Megatron parameter element that holds it. */
static void hf_to_mg(const struct elref *hf, struct elref *mg)
{
	char rest[64];
	int layer;
	const int qpg = M_NQ / M_NKV, grows = (qpg + 2) * M_HD;

	mg->r = hf->r, mg->c = hf->c;
	if (!strcmp(hf->name, "model.embed_tokens.weight")) {
		snprintf(mg->name, sizeof(mg->name), "embedding.word_embeddings.weight");
		return;
	}
	if (!strcmp(hf->name, "lm_head.weight")) {
		snprintf(mg->name, sizeof(mg->name), "output_layer.weight");
		return;
	}
	if (!strcmp(hf->name, "model.norm.weight")) {
		snprintf(mg->name, sizeof(mg->name), "decoder.final_layernorm.weight");
		return;
	}
	assert_int_equal(sscanf(hf->name, "model.layers.%d.%63s", &layer, rest), 2);
#define MG(fmt) snprintf(mg->name, sizeof(mg->name), "decoder.layers.%d." fmt, layer)
	if (!strcmp(rest, "input_layernorm.weight")) {
		MG("self_attention.linear_qkv.layer_norm_weight");
	} else if (!strcmp(rest, "post_attention_layernorm.weight")) {
		MG("mlp.linear_fc1.layer_norm_weight");
	} else if (!strcmp(rest, "self_attn.q_proj.weight")) {
		int64_t head = hf->r / M_HD;

		MG("self_attention.linear_qkv.weight");
		mg->r = head / qpg * grows + head % qpg * M_HD + hf->r % M_HD;
	} else if (!strcmp(rest, "self_attn.k_proj.weight")) {
		MG("self_attention.linear_qkv.weight");
		mg->r = hf->r / M_HD * grows + qpg * M_HD + hf->r % M_HD;
	} else if (!strcmp(rest, "self_attn.v_proj.weight")) {
		MG("self_attention.linear_qkv.weight");
		mg->r = hf->r / M_HD * grows + (qpg + 1) * M_HD + hf->r % M_HD;
	} else if (!strcmp(rest, "self_attn.o_proj.weight")) {
		MG("self_attention.linear_proj.weight");
	} else if (!strcmp(rest, "mlp.gate_proj.weight")) {
		MG("mlp.linear_fc1.weight");
	} else if (!strcmp(rest, "mlp.up_proj.weight")) {
		MG("mlp.linear_fc1.weight");
		mg->r = M_I + hf->r;
	} else if (!strcmp(rest, "mlp.down_proj.weight")) {
		MG("mlp.linear_fc2.weight");
	} else {
		fail_msg("no Megatron parameter for %s", hf->name);
	}
#undef MG
}

#endif

/* daemon/layout/spec.h — the model spec: the canonical (Hugging Face) tensors
 * both sides of a job agree on, built from an HF config.json.
 *
 * Tensors are listed in a fixed order (embed, per layer: norms, attention,
 * MLP or MoE, then final norm and lm_head), so a tensor id is stable for a
 * given config; the spec hash covers names, shapes and the canonical dtype
 * (BF16) and is what daemons compare at join.
 */
#ifndef DTE_SPEC_H
#define DTE_SPEC_H

#include <stddef.h>
#include <stdint.h>
#include "gpu/entry.h"

#define DTE_SPEC_NAME_MAX 128

/* What a canonical tensor is, for the generators. */
enum dte_spec_kind {
	DTE_SPEC_EMBED = 0,
	DTE_SPEC_LM_HEAD,
	DTE_SPEC_FINAL_NORM,
	DTE_SPEC_IN_NORM,        /* per layer */
	DTE_SPEC_Q, DTE_SPEC_K, DTE_SPEC_V,
	DTE_SPEC_Q_BIAS, DTE_SPEC_K_BIAS, DTE_SPEC_V_BIAS,
	DTE_SPEC_Q_NORM, DTE_SPEC_K_NORM,
	DTE_SPEC_O,
	DTE_SPEC_POST_NORM,
	DTE_SPEC_GATE, DTE_SPEC_UP, DTE_SPEC_DOWN,   /* dense MLP */
	DTE_SPEC_ROUTER,
	DTE_SPEC_EXP_GATE, DTE_SPEC_EXP_UP, DTE_SPEC_EXP_DOWN, /* per expert */
	/* Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): q_a_proj,
	 * q_a_layernorm, q_b_proj (or DTE_SPEC_Q = q_proj without q_lora_rank),
	 * kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj; O is o_proj. */
	DTE_SPEC_Q_A, DTE_SPEC_Q_A_NORM, DTE_SPEC_Q_B,
	DTE_SPEC_KV_A, DTE_SPEC_KV_A_NORM, DTE_SPEC_KV_B,
	DTE_SPEC_ROUTER_BIAS,    /* mlp.gate.e_score_correction_bias (FP32) */
	DTE_SPEC_SH_GATE, DTE_SPEC_SH_UP, DTE_SPEC_SH_DOWN,   /* shared experts */
	DTE_SPEC_NKINDS
};

/* Optimizer groups the generators assign (Megatron/HF convention:
 * no weight decay on norms and biases). */
enum { DTE_SPEC_GROUP_DECAY = 0, DTE_SPEC_GROUP_NO_DECAY = 1 };

/* The dtype a canonical tensor moves in (and the spec hash covers): BF16,
 * the RNE of a trainer's master, unless the engines hold it FP32 and the
 * trainer uses it as FP32 bits with no optimizer (the MoE routers'
 * e_score_correction_bias of DeepSeek-V3 and GLM-4.5: an FP32 buffer the
 * aux-loss-free balancing moves).  The sync data path moves 16-bit sink elements, so an FP32
 * tensor T[..., n] is carried as its halves T'[..., n, 2]: element
 * (..., i, h) is half h of T[..., i]'s bits in memory order (h = 0 the
 * low half, little-endian), and the spec's shape, numel and total_elems
 * are T''s (docs/SYNC.md "FP32 tensors"). */
enum { DTE_SPEC_DTYPE_BF16 = 0, DTE_SPEC_DTYPE_FP32 = 1 };

/* Tensor-name families (struct dte_spec_family.arch). */
enum {
	DTE_SPEC_ARCH_GQA = 0,   /* llama/qwen-style q/k/v/o, SwiGLU MLP or MoE */
	DTE_SPEC_ARCH_MLA,       /* DeepSeek-V3 / Kimi-K2: MLA, shared experts */
	DTE_SPEC_ARCH_GLM4_MOE,  /* GLM-4.5: GQA (+bias), shared experts */
};

struct dte_spec_tensor {
	char     name[DTE_SPEC_NAME_MAX];
	uint32_t ndim;
	int64_t  shape[DTE_MAX_DIMS];
	int64_t  numel;
	uint8_t  kind;    /* enum dte_spec_kind */
	uint8_t  group;   /* optimizer group */
	int32_t  layer;   /* -1 for global tensors */
	int32_t  expert;  /* -1 unless an expert tensor */
	uint8_t  dtype;   /* DTE_SPEC_DTYPE_* */
};

struct dte_spec_cfg {
	char    model_type[32];
	int64_t hidden, intermediate, moe_intermediate;
	int64_t layers, heads, kv_heads, head_dim, vocab;
	int64_t experts;          /* 0: dense model */
	int64_t sparse_step;      /* decoder_sparse_step */
	int     tied;             /* tie_word_embeddings */
	int     attn_bias;        /* q/k/v biases (qwen2, attention_bias) */
	int     qk_norm;          /* q_norm/k_norm per layer (qwen3) */
	uint8_t *moe_layer;       /* [layers]: 1 when that layer has experts */
	int     arch;             /* DTE_SPEC_ARCH_* */
	/* MLA (arch MLA): q_lora_rank 0 when absent (q_proj instead of
	 * q_a_proj/q_a_layernorm/q_b_proj, DeepSeek-V2-Lite style). */
	int64_t q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
	int64_t shared_experts;   /* n_shared_experts (0: none) */
	int     router_bias;      /* mlp.gate.e_score_correction_bias per MoE layer */
	int64_t first_dense;      /* first_k_dense_replace */
};

struct dte_spec {
	struct dte_spec_cfg     cfg;
	struct dte_spec_tensor *t;
	uint32_t                n;
	uint64_t                hash;
	int64_t                 total_elems;
	/* Lookup: id of (layer, kind) or -1; experts: base + e*3 + {0,1,2}. */
	int32_t                *layer_idx;   /* [layers * DTE_SPEC_NKINDS] */
	int32_t                *expert_base; /* [layers], -1 for dense layers */
	int32_t                 embed, lm_head, final_norm;
	uint32_t                halves;      /* FP32 tensors carried as halves */
	/* A runtime view (dte_spec_runtime): FP32 tensors in the engines'
	 * own shape, for generators; never a plan's or a job's spec. */
	int                     runtime;
};

/* The model families whose tensor names the spec knows (model_type or
 * architectures[0] of config.json picks one), for `dtectl plan --supported`
 * and the error naming them.  attn_bias: attention_bias's default; qk_norm:
 * per-layer q_norm/k_norm; moe: experts (num_experts). */
struct dte_spec_family {
	const char *model_type;
	const char *architecture;
	int         attn_bias;
	int         qk_norm;
	int         moe;
	int         arch;        /* DTE_SPEC_ARCH_* */
};
const struct dte_spec_family *dte_spec_families(size_t *n);

/* Build from a config.json file / a JSON text. Returns 0 or -1 with a
 * message in err. On error *spec is left zeroed (nothing to free). */
int dte_spec_load_file(struct dte_spec *spec, const char *path,
		       char *err, size_t errlen);
int dte_spec_load_string(struct dte_spec *spec, const char *json,
			 char *err, size_t errlen);
void dte_spec_fini(struct dte_spec *spec);

/* Id of a tensor, -1 when the spec has none. */
int32_t dte_spec_find(const struct dte_spec *spec, const char *name);
int32_t dte_spec_layer_tensor(const struct dte_spec *spec, int64_t layer,
			      enum dte_spec_kind kind);
int32_t dte_spec_expert_tensor(const struct dte_spec *spec, int64_t layer,
			       int64_t expert, enum dte_spec_kind kind);
/* 1 when the tensor is an FP32 one carried as halves (its last dim is
 * the half, extent 2). */
static inline int dte_spec_is_halves(const struct dte_spec *spec, uint32_t id)
{
	return !spec->runtime && spec->t[id].dtype == DTE_SPEC_DTYPE_FP32;
}
/* The runtime view of a spec: the same tensors (ids, names, kinds) with
 * every FP32 one in its own shape [..., n] instead of its halves.  The
 * layout generators map runtime tensors and run on this view;
 * dte_layout_halves() then carries their FP32 pieces over to the halves.
 * It shares the spec's lookups: free it with dte_spec_runtime_fini, before
 * the spec.  -1 on no memory. */
int  dte_spec_runtime(const struct dte_spec *spec, struct dte_spec *rt);
void dte_spec_runtime_fini(struct dte_spec *rt);
/* "bf16" / "fp32". */
const char *dte_spec_dtype_name(int dtype);

#endif

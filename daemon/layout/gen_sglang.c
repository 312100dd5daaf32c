/* daemon/layout/gen_sglang.c — SGLang inference replica as a sink (the
 * fused HF-module layout vLLM shares; gen_vllm.c reuses it).
 *
 * TP rank t of T holds, as separate bf16 buffers (ids in this order):
 *   model.embed_tokens.weight [Vp/T, H], Vp = vocab padded to a multiple of
 *     64 (VocabParallelEmbedding); padded rows map to nothing;
 *   per layer: input_layernorm.weight [H] (replicated),
 *     self_attn.qkv_proj.weight [(nq/T + 2*kvl)*hd, H] = [q; k; v] where
 *     kvl = nkv/T, or 1 with KV head t / (T/nkv) when T > nkv (replicated
 *     KV heads: several ranks' rows come from one canonical element),
 *     self_attn.qkv_proj.bias likewise, q_norm/k_norm [hd] (replicated),
 *     self_attn.o_proj.weight [H, nq*hd/T] (row parallel, split on dim 1),
 *     post_attention_layernorm.weight [H],
 *     dense: mlp.gate_up_proj.weight [2*I/T, H] = [gate; up],
 *            mlp.down_proj.weight [H, I/T];
 *     MoE:   mlp.gate.weight [E, H] (replicated router),
 *            mlp.experts.w13_weight [E/ep, 2*Im/mtp, H] = [gate; up] per
 *            local expert, mlp.experts.w2_weight [E/ep, H, Im/mtp], where
 *            mtp = T/ep, ep rank = t / mtp, MoE-TP rank = t % mtp, and ep
 *            rank j holds experts [j*E/ep, (j+1)*E/ep);
 *   model.norm.weight [H]; lm_head.weight [Vp/T, H] unless tied (tied:
 *     SGLang's lm_head is the embedding, so nothing more to fill).
 */
#include <stdio.h>
#include <string.h>
#include "daemon/layout/gen.h"
#include "gpu/fp8.h"

#define INFER_MAX_TP 4096
#define INFER_VOCAB_PAD 64

struct infer_ctx {
	struct dte_layout      *l;
	const struct dte_spec  *spec;
	uint32_t                rank;
	int64_t                 buf;   /* current buffer id */
	int                     oom;
	int                     vllm;  /* vLLM's parameter names where they differ */
	int                     fp8;   /* linear weights held block-FP8 (fp8=1) */
	/* The experts' group: vLLM with data parallel shards routed experts
	 * over all tp*dp ranks of the engines (FusedMoEParallelConfig.make,
	 * flatten_tp_across_dp_and_pcp: rank dp_rank*tp + tp_rank); else the
	 * engine's TP group. */
	int64_t                 moe_size, moe_rank;
};

/* One runtime tensor of shape {d0[, d1[, d2]]} (0 ends the shape) in a
 * buffer of its own. */
static void infer_buffer(struct infer_ctx *x, const char *fmt, long long layer, int64_t d0,
			 int64_t d1, int64_t d2)
{
	char name[DTE_LAYOUT_NAME_MAX];
	int64_t shape[3] = { d0, d1, d2 };
	uint32_t nd = d1 ? d2 ? 3 : 2 : 1;

	snprintf(name, sizeof(name), fmt, layer);
	x->buf = dte_layout_add_buffer(x->l, x->rank, -1, d0 * (d1 ? d1 : 1) * (d2 ? d2 : 1), "%s",
				       name);
	if (x->buf < 0 || dte_layout_add_tensor(x->l, x->rank, (uint32_t)x->buf, 0, nd, shape, name))
		x->oom = 1;
}

/* A linear layer's weight: with fp8=1 held as float8_e4m3fn codes (the
 * same maps, one byte an element), its FP32 weight_scale_inv in the
 * buffer after it, [mats, ceil(rows/128), ceil(cols/128)] as the engines
 * create it: vLLM fp8_utils.create_fp8_scale_parameter and SGLang
 * Fp8LinearMethod.create_fp8_weight_ ("weight_scale_inv"), FusedMoE's
 * Fp8MoEMethod.create_weights ("w13_weight_scale_inv",
 * "w2_weight_scale_inv").  Which modules: every LinearBase and FusedMoE
 * the model builds with its quant_config (Fp8Config.get_quant_method);
 * the router gate (SGLang MoEGate, vLLM GateLinear: no quant_config),
 * embeddings, lm_head (a VocabParallelEmbedding) and norms stay BF16. */
static void infer_linear(struct infer_ctx *x, const char *fmt, long long layer, int64_t d0,
			 int64_t d1, int64_t d2)
{
	char name[DTE_LAYOUT_NAME_MAX + 16];
	int64_t mats = d2 ? d0 : 1, rows = d2 ? d1 : d0, cols = d2 ? d2 : d1;
	int64_t br = (rows + DTE_FP8_BLOCK - 1) / DTE_FP8_BLOCK;
	int64_t bc = (cols + DTE_FP8_BLOCK - 1) / DTE_FP8_BLOCK;
	int64_t shape[3] = { mats, br, bc }, sbuf;
	struct dte_layout_fp8 f;

	infer_buffer(x, fmt, layer, d0, d1, d2);
	if (!x->fp8 || x->oom)
		return;
	snprintf(name, sizeof(name), fmt, layer);
	snprintf(name + strlen(name), sizeof(name) - strlen(name), "_scale_inv");
	sbuf = dte_layout_add_buffer(x->l, x->rank, -1, mats * br * bc, "%s", name);
	f.rank = x->rank;
	f.buf = (uint32_t)x->buf;
	f.scale_buf = (uint32_t)sbuf;
	f.mats = mats;
	f.rows = rows;
	f.cols = cols;
	/* The quantizer each engine runs on BF16 weights it holds as block
	 * FP8 (docs/INTEGRATION.md, "FP8 block-scaled weights"): SGLang's
	 * quant_weight_ue8m0 (fp8_utils.per_block_cast_to_fp8, power-of-two
	 * scales); vLLM's Fp8PerBlockOnlineLinearMethod
	 * (deep_gemm.per_block_cast_to_fp8, use_ue8m0=False) as eager CPU
	 * torch divides by 448. */
	f.flags = x->vllm ? 0u : (uint32_t)DTC_FP8_UE8M0;
	if (sbuf < 0 || dte_layout_add_tensor(x->l, x->rank, (uint32_t)sbuf, 0, d2 ? 3 : 2,
					      d2 ? shape : shape + 1, name) ||
	    dte_layout_add_fp8(x->l, &f))
		x->oom = 1;
}

/* Canonical rows [r0, r0+rows) x cols [c0, c0+cols) (cols 0 = all, or a
 * 1-D tensor) at buffer offset off with row pitch `pitch`. */
static void infer_piece(struct infer_ctx *x, int32_t tensor, int64_t r0, int64_t rows,
			int64_t c0, int64_t cols, int64_t off, int64_t pitch)
{
	const struct dte_spec_tensor *t = &x->spec->t[tensor];
	struct dte_piece p;

	if (x->oom || rows <= 0)
		return;
	memset(&p, 0, sizeof(p));
	p.tensor = (uint32_t)tensor;
	p.ndim = t->ndim;
	p.rank = x->rank;
	p.buf = (uint32_t)x->buf;
	p.offset = off;
	p.lo[0] = r0;
	p.hi[0] = r0 + rows;
	if (t->ndim == 1) {
		p.stride[0] = 1;
	} else {
		p.lo[1] = c0;
		p.hi[1] = cols ? c0 + cols : t->shape[1];
		p.stride[0] = pitch;
		p.stride[1] = 1;
	}
	if (dte_layout_add_piece(x->l, &p))
		x->oom = 1;
}

static void infer_replicated(struct infer_ctx *x, int32_t tensor, const char *fmt, long long layer)
{
	const struct dte_spec_tensor *t = &x->spec->t[tensor];

	infer_buffer(x, fmt, layer, t->shape[0], t->ndim > 1 ? t->shape[1] : 0, 0);
	infer_piece(x, tensor, 0, t->shape[0], 0, 0, 0, t->ndim > 1 ? t->shape[1] : 1);
}

static void infer_vocab(struct infer_ctx *x, int32_t tensor, int64_t T, int64_t t, const char *name)
{
	int64_t V = x->spec->cfg.vocab, H = x->spec->cfg.hidden;
	int64_t per = (V + INFER_VOCAB_PAD - 1) / INFER_VOCAB_PAD * INFER_VOCAB_PAD / T;
	int64_t lo = t * per, hi = lo + per < V ? lo + per : V;

	infer_buffer(x, name, 0, per, H, 0);
	infer_piece(x, tensor, lo, hi - lo, 0, 0, 0, H);
}

/* Multi-head latent attention of one layer at TP rank t of T (attention TP
 * = TP, SGLang without DP attention), from DeepseekV2AttentionMLA.__init__
 * in both engines:
 *   q_lora_rank set: fused_qkv_a_proj_with_mqa (SGLang) / fused_qkv_a_proj
 *     (vLLM) [q_lora + kv_lora + rope, H] = [q_a_proj; kv_a_proj_with_mqa],
 *     replicated (SGLang ReplicatedLinear, loaded as torch.cat([q_a, kv_a])
 *     in deepseek_weight_loader.py do_load_weights; vLLM
 *     DeepSeekV2FusedQkvAProjLinear, a MergedColumnParallelLinear with
 *     disable_tp=True, shards 0/1 from load_weights' mla_params_mapping);
 *     q_a_layernorm [q_lora] replicated; q_b_proj [nh/T * (nope+rope),
 *     q_lora] (ColumnParallelLinear: rows of heads t*nh/T..);
 *   q_lora_rank absent: q_proj [nh/T * (nope+rope), H] (column parallel)
 *     and kv_a_proj_with_mqa [kv_lora + rope, H] (ReplicatedLinear);
 *   kv_a_layernorm [kv_lora]; kv_b_proj [nh/T * (nope+v), kv_lora] (column
 *   parallel); o_proj [H, nh/T * v] (row parallel: split on dim 1).
 * The engines also keep copies DERIVED from kv_b_proj after loading (SGLang
 * post_load_weights: self_attn.w_kc / w_vc; vLLM MLA
 * process_weights_after_loading: W_UK / W_UV): they are not parameters,
 * this layout does not write them, and the sink's desc says so. */
static void infer_mla(struct infer_ctx *x, int64_t l, int64_t T, int64_t t)
{
	const struct dte_spec *spec = x->spec;
	const struct dte_spec_cfg *c = &spec->cfg;
	int64_t H = c->hidden, nhl = c->heads / T, qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
	int64_t kva = c->kv_lora_rank + c->qk_rope_head_dim, kvb = c->qk_nope_head_dim + c->v_head_dim;
	int64_t qr = c->q_lora_rank, kr = c->kv_lora_rank, vd = c->v_head_dim;
	long long L = (long long)l;

#define LT(kind) dte_spec_layer_tensor(spec, l, kind)
	if (qr) {
		infer_linear(x, x->vllm ? "model.layers.%lld.self_attn.fused_qkv_a_proj.weight"
					: "model.layers.%lld.self_attn.fused_qkv_a_proj_with_mqa.weight",
			     L, qr + kva, H, 0);
		infer_piece(x, LT(DTE_SPEC_Q_A), 0, qr, 0, 0, 0, H);
		infer_piece(x, LT(DTE_SPEC_KV_A), 0, kva, 0, 0, qr * H, H);
		infer_replicated(x, LT(DTE_SPEC_Q_A_NORM), "model.layers.%lld.self_attn.q_a_layernorm.weight", L);
		infer_linear(x, "model.layers.%lld.self_attn.q_b_proj.weight", L, nhl * qk, qr, 0);
		infer_piece(x, LT(DTE_SPEC_Q_B), t * nhl * qk, nhl * qk, 0, 0, 0, qr);
	} else {
		infer_linear(x, "model.layers.%lld.self_attn.q_proj.weight", L, nhl * qk, H, 0);
		infer_piece(x, LT(DTE_SPEC_Q), t * nhl * qk, nhl * qk, 0, 0, 0, H);
		infer_linear(x, "model.layers.%lld.self_attn.kv_a_proj_with_mqa.weight", L,
			     kva, H, 0);	/* ReplicatedLinear */
		infer_piece(x, LT(DTE_SPEC_KV_A), 0, kva, 0, 0, 0, H);
	}
	infer_linear(x, "model.layers.%lld.self_attn.kv_b_proj.weight", L, nhl * kvb, kr, 0);
	infer_piece(x, LT(DTE_SPEC_KV_B), t * nhl * kvb, nhl * kvb, 0, 0, 0, kr);
	infer_linear(x, "model.layers.%lld.self_attn.o_proj.weight", L, H, nhl * vd, 0);
	infer_piece(x, LT(DTE_SPEC_O), 0, H, t * nhl * vd, nhl * vd, 0, nhl * vd);
	infer_replicated(x, LT(DTE_SPEC_KV_A_NORM), "model.layers.%lld.self_attn.kv_a_layernorm.weight", L);
#undef LT
}

static void infer_layer(struct infer_ctx *x, int64_t l, int64_t T, int64_t t, int64_t ep)
{
	const struct dte_spec *spec = x->spec;
	const struct dte_spec_cfg *c = &spec->cfg;
	int64_t H = c->hidden, hd = c->head_dim, nql = c->heads / T;
	int64_t kvl = T >= c->kv_heads ? 1 : c->kv_heads / T;
	int64_t kv0 = T >= c->kv_heads ? t / (T / c->kv_heads) : t * kvl;
	int64_t rows = (nql + 2 * kvl) * hd;
	long long L = (long long)l;

#define LT(kind) dte_spec_layer_tensor(spec, l, kind)
	infer_replicated(x, LT(DTE_SPEC_IN_NORM), "model.layers.%lld.input_layernorm.weight", L);
	if (c->arch == DTE_SPEC_ARCH_MLA) {
		infer_mla(x, l, T, t);
		goto mlp;
	}
	infer_linear(x, "model.layers.%lld.self_attn.qkv_proj.weight", L, rows, H, 0);
	infer_piece(x, LT(DTE_SPEC_Q), t * nql * hd, nql * hd, 0, 0, 0, H);
	infer_piece(x, LT(DTE_SPEC_K), kv0 * hd, kvl * hd, 0, 0, nql * hd * H, H);
	infer_piece(x, LT(DTE_SPEC_V), kv0 * hd, kvl * hd, 0, 0, (nql + kvl) * hd * H, H);
	if (c->attn_bias) {
		infer_buffer(x, "model.layers.%lld.self_attn.qkv_proj.bias", L, rows, 0, 0);
		infer_piece(x, LT(DTE_SPEC_Q_BIAS), t * nql * hd, nql * hd, 0, 0, 0, 1);
		infer_piece(x, LT(DTE_SPEC_K_BIAS), kv0 * hd, kvl * hd, 0, 0, nql * hd, 1);
		infer_piece(x, LT(DTE_SPEC_V_BIAS), kv0 * hd, kvl * hd, 0, 0, (nql + kvl) * hd, 1);
	}
	if (c->qk_norm) {
		infer_replicated(x, LT(DTE_SPEC_Q_NORM), "model.layers.%lld.self_attn.q_norm.weight", L);
		infer_replicated(x, LT(DTE_SPEC_K_NORM), "model.layers.%lld.self_attn.k_norm.weight", L);
	}
	infer_linear(x, "model.layers.%lld.self_attn.o_proj.weight", L, H, nql * hd, 0);
	infer_piece(x, LT(DTE_SPEC_O), 0, H, t * nql * hd, nql * hd, 0, nql * hd);
mlp:
	infer_replicated(x, LT(DTE_SPEC_POST_NORM), "model.layers.%lld.post_attention_layernorm.weight", L);
	if (!c->moe_layer[l]) {
		int64_t Il = c->intermediate / T;
		infer_linear(x, "model.layers.%lld.mlp.gate_up_proj.weight", L, 2 * Il, H, 0);
		infer_piece(x, LT(DTE_SPEC_GATE), t * Il, Il, 0, 0, 0, H);
		infer_piece(x, LT(DTE_SPEC_UP), t * Il, Il, 0, 0, Il * H, H);
		infer_linear(x, "model.layers.%lld.mlp.down_proj.weight", L, H, Il, 0);
		infer_piece(x, LT(DTE_SPEC_DOWN), 0, H, t * Il, Il, 0, Il);
	} else {
		int64_t mtp = x->moe_size / ep, ep_idx = x->moe_rank / mtp, mt = x->moe_rank % mtp;
		int64_t El = c->experts / ep, Ip = c->moe_intermediate / mtp, e;
		infer_replicated(x, LT(DTE_SPEC_ROUTER), "model.layers.%lld.mlp.gate.weight", L);
		if (c->router_bias)
			infer_replicated(x, LT(DTE_SPEC_ROUTER_BIAS),
					 "model.layers.%lld.mlp.gate.e_score_correction_bias", L);
		infer_linear(x, "model.layers.%lld.mlp.experts.w13_weight", L, El, 2 * Ip, H);
		for (e = 0; e < El; e++) {
			int64_t E = ep_idx * El + e;
			infer_piece(x, dte_spec_expert_tensor(spec, l, E, DTE_SPEC_EXP_GATE), mt * Ip, Ip, 0, 0,
				    e * 2 * Ip * H, H);
			infer_piece(x, dte_spec_expert_tensor(spec, l, E, DTE_SPEC_EXP_UP), mt * Ip, Ip, 0, 0,
				    e * 2 * Ip * H + Ip * H, H);
		}
		infer_linear(x, "model.layers.%lld.mlp.experts.w2_weight", L, El, H, Ip);
		for (e = 0; e < El; e++)
			infer_piece(x, dte_spec_expert_tensor(spec, l, ep_idx * El + e, DTE_SPEC_EXP_DOWN),
				    0, H, mt * Ip, Ip, e * H * Ip, Ip);
		if (c->shared_experts) {
			/* DeepseekV2MLP / Glm4MoeMLP over the whole TP group (the
			 * engines' default; SGLang's DeepEP-style a2a backends and
			 * SGLANG_SHARED_EXPERT_TP1 replicate it instead, vLLM's
			 * sequence-parallel MoE likewise: not modelled). */
			int64_t Is = c->moe_intermediate * c->shared_experts / T;
			infer_linear(x, "model.layers.%lld.mlp.shared_experts.gate_up_proj.weight", L, 2 * Is, H, 0);
			infer_piece(x, LT(DTE_SPEC_SH_GATE), t * Is, Is, 0, 0, 0, H);
			infer_piece(x, LT(DTE_SPEC_SH_UP), t * Is, Is, 0, 0, Is * H, H);
			infer_linear(x, "model.layers.%lld.mlp.shared_experts.down_proj.weight", L, H, Is, 0);
			infer_piece(x, LT(DTE_SPEC_SH_DOWN), 0, H, t * Is, Is, 0, Is);
		}
	}
#undef LT
}

static int infer_check(const struct dte_spec *spec, const struct dte_infer_cfg *cfg,
		       const char *who, char *err, size_t errlen)
{
	const struct dte_spec_cfg *c = &spec->cfg;
	int64_t T = cfg->tp, G = cfg->tp * cfg->dp, Vp, l;
	int dense = 0;

	if (T < 1 || T > INFER_MAX_TP || cfg->ep < 1 || cfg->ep > INFER_MAX_TP || cfg->dp < 1 ||
	    cfg->dp > INFER_MAX_TP || G > INFER_MAX_TP)
		return dte_layout_err(err, errlen, "%s: tp, dp, ep and tp*dp must be in [1, %d]", who,
				      INFER_MAX_TP);
	if (c->heads % T)
		return dte_layout_err(err, errlen, "%s: tp=%lld does not divide num_attention_heads=%lld",
				      who, (long long)T, (long long)c->heads);
	if (c->arch != DTE_SPEC_ARCH_MLA && T % c->kv_heads && c->kv_heads % T)
		return dte_layout_err(err, errlen, "%s: tp=%lld and num_key_value_heads=%lld: neither divides the other, KV heads cannot be split or replicated",
				      who, (long long)T, (long long)c->kv_heads);
	Vp = (c->vocab + INFER_VOCAB_PAD - 1) / INFER_VOCAB_PAD * INFER_VOCAB_PAD;
	if (Vp % T)
		return dte_layout_err(err, errlen, "%s: tp=%lld does not divide the padded vocab %lld",
				      who, (long long)T, (long long)Vp);
	for (l = 0; l < c->layers; l++)
		dense |= !c->moe_layer[l];
	if (dense && c->intermediate % T)
		return dte_layout_err(err, errlen, "%s: tp=%lld does not divide intermediate_size=%lld",
				      who, (long long)T, (long long)c->intermediate);
	if (!c->experts && cfg->dp > 1)
		return dte_layout_err(err, errlen, "%s: dp=%lld describes experts spread over the engines of a data-parallel group; a dense model's engines are replicas (dp=1 each)",
				      who, (long long)cfg->dp);
	if (!c->experts)
		return cfg->ep > 1 ? dte_layout_err(err, errlen, "%s: ep=%lld but the model has no experts",
						    who, (long long)cfg->ep) : 0;
	if (G % cfg->ep)
		return dte_layout_err(err, errlen, "%s: ep=%lld does not divide tp*dp=%lld",
				      who, (long long)cfg->ep, (long long)G);
	if (c->experts % cfg->ep)
		return dte_layout_err(err, errlen, "%s: ep=%lld does not divide num_experts=%lld",
				      who, (long long)cfg->ep, (long long)c->experts);
	if (c->shared_experts && (c->moe_intermediate * c->shared_experts) % T)
		return dte_layout_err(err, errlen, "%s: tp=%lld does not divide the shared experts' intermediate size %lld",
				      who, (long long)T, (long long)(c->moe_intermediate * c->shared_experts));
	if (c->moe_intermediate % (G / cfg->ep))
		return dte_layout_err(err, errlen, "%s: MoE tensor parallel size tp*dp/ep=%lld does not divide moe_intermediate_size=%lld",
				      who, (long long)(G / cfg->ep), (long long)c->moe_intermediate);
	return 0;
}

static int infer_generate(struct dte_layout *l, const struct dte_spec *spec,
			  const struct dte_infer_cfg *cfg, const char *who,
			  char *err, size_t errlen)
{
	char dp[32] = "";
	struct infer_ctx x;
	int64_t t, layer;

	if (infer_check(spec, cfg, who, err, errlen))
		return -1;
	/* An MLA sink: say that the engine's derived copies of kv_b_proj
	 * (infer_mla) are not written, wherever the layout is named. */
	if (cfg->fp8 != 0 && cfg->fp8 != 1)
		return dte_layout_err(err, errlen, "%s: fp8 is 0 or 1 (1: linear weights held as float8_e4m3fn with 128 x 128 FP32 block scales), not %lld",
				      who, (long long)cfg->fp8);
	if (cfg->dp > 1)
		snprintf(dp, sizeof(dp), ",dp=%lld", (long long)cfg->dp);
	snprintf(l->desc, sizeof(l->desc), "%s:tp=%lld%s,ep=%lld%s%s", who, (long long)cfg->tp, dp,
		 (long long)cfg->ep, cfg->fp8 ? ",fp8=1" : "", spec->cfg.arch != DTE_SPEC_ARCH_MLA ? "" : !strcmp(who, "vllm")
		 ? " [MLA: derived W_UK/W_UV from kv_b_proj NOT written]"
		 : " [MLA: derived w_kc/w_vc from kv_b_proj NOT written]");
	memset(&x, 0, sizeof(x));
	x.l = l;
	x.spec = spec;
	x.vllm = !strcmp(who, "vllm");
	x.fp8 = cfg->fp8 == 1;
	/* Rank g of a data-parallel group is engine g / tp's TP rank g % tp:
	 * every engine holds everything but the routed experts (dp = 1: the
	 * one engine). */
	x.moe_size = cfg->tp * cfg->dp;
	for (t = 0; t < cfg->tp * cfg->dp && !x.oom; t++) {
		int64_t tr = t % cfg->tp;

		x.rank = (uint32_t)t;
		x.moe_rank = t;
		infer_vocab(&x, spec->embed, cfg->tp, tr, "model.embed_tokens.weight");
		for (layer = 0; layer < spec->cfg.layers; layer++)
			infer_layer(&x, layer, cfg->tp, tr, cfg->ep);
		infer_replicated(&x, spec->final_norm, "model.norm.weight", 0);
		if (spec->lm_head >= 0)
			infer_vocab(&x, spec->lm_head, cfg->tp, tr, "lm_head.weight");
	}
	if (x.oom)
		return dte_layout_err(err, errlen, "%s: out of memory", who);
	dte_layout_sort_buffers(l);
	return x.fp8 ? dte_layout_fp8_check(l, spec, err, errlen) : 0;
}

int dte_layout_sglang(struct dte_layout *l, const struct dte_spec *spec,
		      const struct dte_infer_cfg *cfg, char *err, size_t errlen)
{
	if (cfg->dp != 1)
		return dte_layout_err(err, errlen, "sglang: dp=%lld: SGLang's data-parallel attention (attention TP = tp/dp inside one engine) is not modelled yet",
				      (long long)cfg->dp);
	return infer_generate(l, spec, cfg, "sglang", err, errlen);
}

/* vLLM: same module layout (QKVParallelLinear, MergedColumnParallelLinear,
 * VocabParallelEmbedding padded to 64, FusedMoE w13/w2 with [w1; w3]).
 * Difference: vLLM's expert parallelism (enable_expert_parallel) spans all
 * TP ranks with MoE tensor parallel 1, so ep must be 1 or tp. */
int dte_layout_vllm(struct dte_layout *l, const struct dte_spec *spec,
		    const struct dte_infer_cfg *cfg, char *err, size_t errlen)
{
	if (cfg->ep != 1 && cfg->ep != cfg->tp * cfg->dp)
		return dte_layout_err(err, errlen, "vllm: expert parallel spans all tp*dp ranks: ep must be 1 or tp*dp=%lld, not %lld",
				      (long long)(cfg->tp * cfg->dp), (long long)cfg->ep);
	return infer_generate(l, spec, cfg, "vllm", err, errlen);
}

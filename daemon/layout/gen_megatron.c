/* daemon/layout/gen_megatron.c — Megatron-Core trainer as a source.
 *
 * Ranks (no PP/CP): rank = dp_idx * tp + tp_idx for dense parameters; the
 * expert grid is tp-ep-dp ordered: rank = edp_idx * (ep*etp) + ep_idx * etp
 * + etp_idx, with edp = tp*dp / (ep*etp).
 *
 * Local tensors per TP rank t (T = tp):
 *   embedding.word_embeddings.weight [Vp/T, H], Vp = vocab padded to 128*T;
 *     padded rows exist in the buffer but map to nothing;
 *   linear_qkv.weight [(nq+2*nkv)/T * hd, H]: per query group g of the rank
 *     [q heads of g; k_g; v_g] rows (and linear_qkv.bias likewise); with T
 *     above the query groups, T/groups ranks split one group's rows
 *     (mg_qkv_rows);
 *   linear_proj.weight [H, nq*hd/T] (row parallel: split on dim 1);
 *   linear_fc1.weight [2*I/T, H] = [gate rows; up rows] of this rank;
 *   linear_fc2.weight [H, I/T];
 *   norms (fused layer_norm_weight, q/k_layernorm, final_layernorm) and the
 *     MoE router are replicated: only TP rank 0's copy is a source, so every
 *     canonical element has exactly one source;
 *   experts (TEGroupedMLP): per local expert linear_fc1.weight<e>
 *     [2*Im/etp, H] = [gate; up], linear_fc2.weight<e> [H, Im/etp].
 *
 * Buffer assumption (distributed optimizer): all dense parameters of a rank
 * live in one contiguous buffer, in reverse registration order (Megatron's
 * param-and-grad buffer is filled back to front so backward fills buckets
 * in order), one bucket, each parameter's start padded to a multiple of 64
 * elements and the end padded to a multiple of lcm(dp, 128); DP rank d owns
 * the flat range [d*L/dp, (d+1)*L/dp) and registers it as three fp32
 * buffers (param, exp_avg, exp_avg_sq: ids 0, 1, 2) indexed by flat
 * position minus the shard start.  Expert parameters have their own buffer,
 * laid out the same way and sharded over the expert-data-parallel group
 * (ids 3, 4, 5).  Registration order per layer: linear_proj.weight,
 * linear_qkv.layer_norm_weight, linear_qkv.weight, linear_qkv.bias,
 * q_layernorm.weight, k_layernorm.weight, then linear_fc1.layer_norm_weight,
 * linear_fc1.weight, linear_fc2.weight (dense) or pre_mlp_layernorm.weight,
 * router.weight, experts.linear_fc1.weight0.., experts.linear_fc2.weight0..
 * (MoE); before the layers embedding, after them final_layernorm.weight and
 * output_layer.weight (untied only).  Without the distributed optimizer
 * (dopt=0) nothing is padded and DP rank 0 is the source of the whole
 * buffer (the other DP ranks hold identical replicas).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/layout/gen.h"

#define MG_PARAM_ALIGN 64
#define MG_MAX_PARALLEL 4096

struct mg_sub {
	uint32_t tensor;
	int64_t  clo[2], chi[2];   /* canonical box */
	int64_t  llo[2];           /* where clo lands in the local tensor */
};

struct mg_param {
	char     name[DTE_LAYOUT_NAME_MAX];
	uint32_t ndim;
	int64_t  shape[2];
	int64_t  numel;
	uint32_t group;
	size_t   sub0, nsub;
	int64_t  offset;           /* in the flat buffer */
	int32_t  vocab;            /* canonical tensor of a vocab-parallel param, else -1 */
	int      buffer;           /* a registered buffer, not a parameter (mg_buffers) */
};

struct mg_list {
	struct mg_param *p;
	size_t n, cap;
	struct mg_sub *s;
	size_t ns, caps;
	int oom;
};

static void mg_list_fini(struct mg_list *m)
{
	free(m->p);
	free(m->s);
	memset(m, 0, sizeof(*m));
}

static void mg_param(struct mg_list *m, uint32_t ndim, int64_t d0, int64_t d1,
		     uint32_t group, const char *name)
{
	struct mg_param *p;

	if (m->oom)
		return;
	if (m->n == m->cap) {
		size_t ncap = m->cap ? m->cap * 2 : 256;
		void *np = realloc(m->p, ncap * sizeof(*m->p));
		if (!np) {
			m->oom = 1;
			return;
		}
		m->p = np;
		m->cap = ncap;
	}
	p = &m->p[m->n++];
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "%s", name);
	p->ndim = ndim;
	p->shape[0] = d0;
	p->shape[1] = ndim > 1 ? d1 : 1;
	p->numel = d0 * (ndim > 1 ? d1 : 1);
	p->group = group;
	p->sub0 = m->ns;
	p->vocab = -1;
}

/* Canonical rows [c0, c0+rows) (all columns, or cols [c1, c1+cols) when
 * cols > 0) of tensor land at local (l0, l1) of the current param. */
static void mg_sub(struct mg_list *m, int32_t tensor, int64_t c0, int64_t rows,
		   int64_t c1, int64_t cols, int64_t l0, int64_t l1, const struct dte_spec *spec)
{
	const struct dte_spec_tensor *t = &spec->t[tensor];
	struct mg_sub *s;

	if (m->oom || rows <= 0)
		return;
	if (m->ns == m->caps) {
		size_t ncap = m->caps ? m->caps * 2 : 256;
		void *np = realloc(m->s, ncap * sizeof(*m->s));
		if (!np) {
			m->oom = 1;
			return;
		}
		m->s = np;
		m->caps = ncap;
	}
	s = &m->s[m->ns++];
	s->tensor = (uint32_t)tensor;
	s->clo[0] = c0;
	s->chi[0] = c0 + rows;
	s->clo[1] = t->ndim > 1 ? c1 : 0;
	s->chi[1] = t->ndim > 1 ? (cols > 0 ? c1 + cols : t->shape[1]) : 1;
	s->llo[0] = l0;
	s->llo[1] = l1;
	m->p[m->n - 1].nsub++;
}

/* A replicated 1-D tensor (norm): a source only on TP rank 0. */
static void mg_replicated(struct mg_list *m, const struct dte_spec *spec, int32_t tensor,
			  int64_t tp_idx, const char *name)
{
	const struct dte_spec_tensor *t = &spec->t[tensor];

	mg_param(m, t->ndim, t->shape[0], t->shape[1], t->group, name);
	if (tp_idx == 0)
		mg_sub(m, tensor, 0, t->shape[0], 0, 0, 0, 0, spec);
}

static void mg_vocab(struct mg_list *m, const struct dte_spec *spec, int32_t tensor,
		     int64_t T, int64_t t, const char *name)
{
	int64_t V = spec->cfg.vocab, H = spec->cfg.hidden;
	int64_t Vp = (V + 128 * T - 1) / (128 * T) * (128 * T);
	int64_t per = Vp / T, lo = t * per, hi = lo + per < V ? lo + per : V;

	mg_param(m, 2, per, H, DTE_SPEC_GROUP_DECAY, name);
	if (!m->oom)
		m->p[m->n - 1].vocab = tensor;
	if (hi > lo)
		mg_sub(m, tensor, lo, hi - lo, 0, 0, 0, 0, spec);
}

/* linear_qkv is a column-parallel linear over the group-interleaved rows
 * [q heads of group 0; k_0; v_0; q heads of group 1; ...] (R rows in all):
 * TP rank t holds rows [r0, r1) = [t*R/T, (t+1)*R/T).  With T <= query
 * groups that is whole groups; with T > query groups (KV heads fewer than
 * TP ranks) T/groups ranks share one group, each a contiguous part of it:
 * megatron/core/transformer/attention.py, Attention.__init__
 * (num_query_groups < world_size: num_query_groups_per_partition = 1) and
 * SelfAttention.get_query_key_value_tensors, which all-gathers the rows
 * and takes group t // (T / groups). */
static void mg_qkv_rows(struct mg_list *m, const struct dte_spec *spec, int32_t q, int32_t k,
			int32_t v, int64_t r0, int64_t r1, int64_t qpg, int64_t hd, int64_t groups)
{
	int64_t grows = (qpg + 2) * hd, G;

	for (G = r0 / grows; G < groups && G * grows < r1; G++) {
		/* Parts of group G: rows [a, b) of the interleaved matrix that are
		 * canonical rows starting at c of tensor id. */
		const struct { int32_t id; int64_t a, b, c; } part[3] = {
			{ q, G * grows, G * grows + qpg * hd, G * qpg * hd },
			{ k, G * grows + qpg * hd, G * grows + (qpg + 1) * hd, G * hd },
			{ v, G * grows + (qpg + 1) * hd, (G + 1) * grows, G * hd },
		};
		for (int i = 0; i < 3; i++) {
			int64_t a = part[i].a > r0 ? part[i].a : r0, b = part[i].b < r1 ? part[i].b : r1;

			if (a < b)
				mg_sub(m, part[i].id, part[i].c + (a - part[i].a), b - a, 0, 0, a - r0, 0, spec);
		}
	}
}

/* Multi-latent attention of one layer at TP rank t (Megatron-Core 0.16
 * megatron/core/transformer/multi_latent_attention.py: MultiLatentAttention
 * .__init__ builds linear_proj, then MLASelfAttention.__init__
 * linear_q_proj or linear_q_down_proj + linear_q_up_proj, then
 * linear_kv_down_proj, linear_kv_up_proj; the TE layer spec
 * (models/gpt/gpt_layer_specs.py, multi_latent_attention with
 * qk_layernorm, as DeepSeek-V3 recipes set) keeps input_layernorm as a
 * module and fuses q_layernorm / kv_layernorm into linear_q_up_proj /
 * linear_kv_up_proj (TELayerNormColumnParallelLinear: layer_norm_weight).
 * The down projections are TELinear with parallel_mode "duplicated" (whole
 * on every TP rank: TP rank 0 is the source); the up projections are column
 * parallel over heads, linear_proj row parallel.  Row order inside a head
 * is the checkpoint's ([nope; rope] for q, [k_nope; v] for kv, [kv_lora;
 * rope] for kv_down), as MLASelfAttention.get_query_key_value_tensors
 * splits them, so the map is a straight slice. */
static void mg_mla(struct mg_list *m, const struct dte_spec *spec, int64_t l, int64_t T, int64_t t)
{
	const struct dte_spec_cfg *c = &spec->cfg;
	int64_t H = c->hidden, nhl = c->heads / T, qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
	int64_t kvb = c->qk_nope_head_dim + c->v_head_dim, qr = c->q_lora_rank, kr = c->kv_lora_rank;
	int64_t vd = c->v_head_dim;
	char n[DTE_LAYOUT_NAME_MAX];
	long long L = (long long)l;

#define LT(kind) dte_spec_layer_tensor(spec, l, kind)
	snprintf(n, sizeof(n), "decoder.layers.%lld.input_layernorm.weight", L);
	mg_replicated(m, spec, LT(DTE_SPEC_IN_NORM), t, n);
	snprintf(n, sizeof(n), "decoder.layers.%lld.self_attention.linear_proj.weight", L);
	mg_param(m, 2, H, nhl * vd, DTE_SPEC_GROUP_DECAY, n);
	mg_sub(m, LT(DTE_SPEC_O), 0, H, t * nhl * vd, nhl * vd, 0, 0, spec);
	if (qr) {
		snprintf(n, sizeof(n), "decoder.layers.%lld.self_attention.linear_q_down_proj.weight", L);
		mg_replicated(m, spec, LT(DTE_SPEC_Q_A), t, n);
		snprintf(n, sizeof(n), "decoder.layers.%lld.self_attention.linear_q_up_proj.layer_norm_weight", L);
		mg_replicated(m, spec, LT(DTE_SPEC_Q_A_NORM), t, n);
		snprintf(n, sizeof(n), "decoder.layers.%lld.self_attention.linear_q_up_proj.weight", L);
		mg_param(m, 2, nhl * qk, qr, DTE_SPEC_GROUP_DECAY, n);
		mg_sub(m, LT(DTE_SPEC_Q_B), t * nhl * qk, nhl * qk, 0, 0, 0, 0, spec);
	} else {
		snprintf(n, sizeof(n), "decoder.layers.%lld.self_attention.linear_q_proj.weight", L);
		mg_param(m, 2, nhl * qk, H, DTE_SPEC_GROUP_DECAY, n);
		mg_sub(m, LT(DTE_SPEC_Q), t * nhl * qk, nhl * qk, 0, 0, 0, 0, spec);
	}
	snprintf(n, sizeof(n), "decoder.layers.%lld.self_attention.linear_kv_down_proj.weight", L);
	mg_replicated(m, spec, LT(DTE_SPEC_KV_A), t, n);
	snprintf(n, sizeof(n), "decoder.layers.%lld.self_attention.linear_kv_up_proj.layer_norm_weight", L);
	mg_replicated(m, spec, LT(DTE_SPEC_KV_A_NORM), t, n);
	snprintf(n, sizeof(n), "decoder.layers.%lld.self_attention.linear_kv_up_proj.weight", L);
	mg_param(m, 2, nhl * kvb, kr, DTE_SPEC_GROUP_DECAY, n);
	mg_sub(m, LT(DTE_SPEC_KV_B), t * nhl * kvb, nhl * kvb, 0, 0, 0, 0, spec);
#undef LT
}

static void mg_layer_dense(struct mg_list *m, const struct dte_spec *spec, int64_t l,
			   int64_t T, int64_t t)
{
	const struct dte_spec_cfg *c = &spec->cfg;
	int64_t hd = c->head_dim, H = c->hidden, I = c->intermediate;
	int64_t qpg = c->heads / c->kv_heads;
	int64_t grows = (qpg + 2) * hd, R = c->kv_heads * grows;
	char n[DTE_LAYOUT_NAME_MAX];

#define LT(kind) dte_spec_layer_tensor(spec, l, kind)
	if (c->arch == DTE_SPEC_ARCH_MLA) {
		mg_mla(m, spec, l, T, t);
		goto mlp;
	}
	snprintf(n, sizeof(n), "decoder.layers.%lld.self_attention.linear_proj.weight", (long long)l);
	mg_param(m, 2, H, c->heads * hd / T, DTE_SPEC_GROUP_DECAY, n);
	mg_sub(m, LT(DTE_SPEC_O), 0, H, t * c->heads * hd / T, c->heads * hd / T, 0, 0, spec);
	snprintf(n, sizeof(n), "decoder.layers.%lld.self_attention.linear_qkv.layer_norm_weight", (long long)l);
	mg_replicated(m, spec, LT(DTE_SPEC_IN_NORM), t, n);
	snprintf(n, sizeof(n), "decoder.layers.%lld.self_attention.linear_qkv.weight", (long long)l);
	mg_param(m, 2, R / T, H, DTE_SPEC_GROUP_DECAY, n);
	mg_qkv_rows(m, spec, LT(DTE_SPEC_Q), LT(DTE_SPEC_K), LT(DTE_SPEC_V), t * R / T,
		    (t + 1) * R / T, qpg, hd, c->kv_heads);
	if (c->attn_bias) {
		snprintf(n, sizeof(n), "decoder.layers.%lld.self_attention.linear_qkv.bias", (long long)l);
		mg_param(m, 1, R / T, 0, DTE_SPEC_GROUP_NO_DECAY, n);
		mg_qkv_rows(m, spec, LT(DTE_SPEC_Q_BIAS), LT(DTE_SPEC_K_BIAS), LT(DTE_SPEC_V_BIAS),
			    t * R / T, (t + 1) * R / T, qpg, hd, c->kv_heads);
	}
	if (c->qk_norm) {
		snprintf(n, sizeof(n), "decoder.layers.%lld.self_attention.q_layernorm.weight", (long long)l);
		mg_replicated(m, spec, LT(DTE_SPEC_Q_NORM), t, n);
		snprintf(n, sizeof(n), "decoder.layers.%lld.self_attention.k_layernorm.weight", (long long)l);
		mg_replicated(m, spec, LT(DTE_SPEC_K_NORM), t, n);
	}
mlp:
	if (c->moe_layer[l]) {
		snprintf(n, sizeof(n), "decoder.layers.%lld.pre_mlp_layernorm.weight", (long long)l);
		mg_replicated(m, spec, LT(DTE_SPEC_POST_NORM), t, n);
		snprintf(n, sizeof(n), "decoder.layers.%lld.mlp.router.weight", (long long)l);
		mg_replicated(m, spec, LT(DTE_SPEC_ROUTER), t, n);
		if (c->router_bias) {
			/* TopKRouter (megatron/core/transformer/moe/router.py
			 * __init__, moe_router_enable_expert_bias): register_buffer
			 * 'expert_bias', FP32, no optimizer state (mg_buffers). */
			snprintf(n, sizeof(n), "decoder.layers.%lld.mlp.router.expert_bias", (long long)l);
			mg_replicated(m, spec, LT(DTE_SPEC_ROUTER_BIAS), t, n);
			if (!m->oom)
				m->p[m->n - 1].buffer = 1;
		}
		if (c->shared_experts) {
			/* SharedExpertMLP (moe/shared_experts.py), built after the
			 * experts in MoELayer.__init__; an MLP over the TP group,
			 * in the dense buffer. */
			int64_t Is = c->moe_intermediate * c->shared_experts / T;
			snprintf(n, sizeof(n), "decoder.layers.%lld.mlp.shared_experts.linear_fc1.weight", (long long)l);
			mg_param(m, 2, 2 * Is, H, DTE_SPEC_GROUP_DECAY, n);
			mg_sub(m, LT(DTE_SPEC_SH_GATE), t * Is, Is, 0, 0, 0, 0, spec);
			mg_sub(m, LT(DTE_SPEC_SH_UP), t * Is, Is, 0, 0, Is, 0, spec);
			snprintf(n, sizeof(n), "decoder.layers.%lld.mlp.shared_experts.linear_fc2.weight", (long long)l);
			mg_param(m, 2, H, Is, DTE_SPEC_GROUP_DECAY, n);
			mg_sub(m, LT(DTE_SPEC_SH_DOWN), 0, H, t * Is, Is, 0, 0, spec);
		}
		return;
	}
	snprintf(n, sizeof(n), "decoder.layers.%lld.mlp.linear_fc1.layer_norm_weight", (long long)l);
	mg_replicated(m, spec, LT(DTE_SPEC_POST_NORM), t, n);
	snprintf(n, sizeof(n), "decoder.layers.%lld.mlp.linear_fc1.weight", (long long)l);
	mg_param(m, 2, 2 * I / T, H, DTE_SPEC_GROUP_DECAY, n);
	mg_sub(m, LT(DTE_SPEC_GATE), t * I / T, I / T, 0, 0, 0, 0, spec);
	mg_sub(m, LT(DTE_SPEC_UP), t * I / T, I / T, 0, 0, I / T, 0, spec);
	snprintf(n, sizeof(n), "decoder.layers.%lld.mlp.linear_fc2.weight", (long long)l);
	mg_param(m, 2, H, I / T, DTE_SPEC_GROUP_DECAY, n);
	mg_sub(m, LT(DTE_SPEC_DOWN), 0, H, t * I / T, I / T, 0, 0, spec);
#undef LT
}

static void mg_layer_experts(struct mg_list *m, const struct dte_spec *spec, int64_t l,
			     int64_t ep, int64_t ep_idx, int64_t etp, int64_t etp_idx)
{
	const struct dte_spec_cfg *c = &spec->cfg;
	int64_t H = c->hidden, Ip = c->moe_intermediate / etp, El = c->experts / ep, e;
	char n[DTE_LAYOUT_NAME_MAX];

	for (e = 0; e < El; e++) {
		int64_t E = ep_idx * El + e;
		snprintf(n, sizeof(n), "decoder.layers.%lld.mlp.experts.linear_fc1.weight%lld", (long long)l, (long long)e);
		mg_param(m, 2, 2 * Ip, H, DTE_SPEC_GROUP_DECAY, n);
		mg_sub(m, dte_spec_expert_tensor(spec, l, E, DTE_SPEC_EXP_GATE), etp_idx * Ip, Ip, 0, 0, 0, 0, spec);
		mg_sub(m, dte_spec_expert_tensor(spec, l, E, DTE_SPEC_EXP_UP), etp_idx * Ip, Ip, 0, 0, Ip, 0, spec);
	}
	for (e = 0; e < El; e++) {
		int64_t E = ep_idx * El + e;
		snprintf(n, sizeof(n), "decoder.layers.%lld.mlp.experts.linear_fc2.weight%lld", (long long)l, (long long)e);
		mg_param(m, 2, H, Ip, DTE_SPEC_GROUP_DECAY, n);
		mg_sub(m, dte_spec_expert_tensor(spec, l, E, DTE_SPEC_EXP_DOWN), 0, H, etp_idx * Ip, Ip, 0, 0, spec);
	}
}

static int64_t gcd64(int64_t a, int64_t b)
{
	while (b) {
		int64_t r = a % b;
		a = b;
		b = r;
	}
	return a;
}

/* Offsets in reverse registration order; returns the unpadded length.
 * Megatron pads only for the distributed optimizer. */
static int64_t mg_assign_offsets(struct mg_list *m, int dist_opt)
{
	int64_t off = 0, align = dist_opt ? MG_PARAM_ALIGN : 1;
	size_t i;

	for (i = m->n; i > 0; i--) {
		struct mg_param *p = &m->p[i - 1];
		if (p->buffer) {
			p->offset = -1;
			continue;
		}
		off = (off + align - 1) / align * align;
		p->offset = off;
		off += p->numel;
	}
	return off;
}

/* Pieces of the flat range [a, z) of param p (subs sb[0..nsub)), at buffer
 * index `off` + flat position: buffers buf, buf+1, buf+2 of `rank`. */
static int mg_emit_range(struct dte_layout *l, const struct mg_param *p, const struct mg_sub *sbs,
			 size_t nsub, uint32_t rank, uint32_t buf, uint32_t group, int64_t off,
			 int64_t a, int64_t z, const struct dte_spec *spec)
{
	int64_t blo[2 * DTE_MAX_DIMS - 1][DTE_MAX_DIMS], bhi[2 * DTE_MAX_DIMS - 1][DTE_MAX_DIMS];
	size_t k;
	int nb, b;

	nb = dte_layout_flat_boxes(p->ndim, p->shape, a, z, blo, bhi);
	for (b = 0; b < nb; b++) {
		for (k = 0; k < nsub; k++) {
			const struct mg_sub *sb = &sbs[k];
			int64_t slo[2], shi[2], ilo[2], ihi[2];
			struct dte_piece pc;
			uint32_t d;

			for (d = 0; d < p->ndim; d++) {
				slo[d] = sb->llo[d];
				shi[d] = sb->llo[d] + sb->chi[d] - sb->clo[d];
			}
			if (!dte_box_intersect(p->ndim, blo[b], bhi[b], slo, shi, ilo, ihi))
				continue;
			memset(&pc, 0, sizeof(pc));
			pc.tensor = sb->tensor;
			pc.ndim = spec->t[sb->tensor].ndim;
			pc.rank = rank;
			pc.buf = buf;
			pc.buf_m = buf + 1;
			pc.buf_v = buf + 2;
			pc.group = group;
			pc.offset = off;
			for (d = 0; d < p->ndim; d++) {
				pc.lo[d] = sb->clo[d] + ilo[d] - sb->llo[d];
				pc.hi[d] = sb->clo[d] + ihi[d] - sb->llo[d];
				pc.stride[d] = d + 1 < p->ndim ? p->shape[1] : 1;
				pc.offset += ilo[d] * pc.stride[d];
			}
			if (dte_layout_add_piece(l, &pc))
				return -1;
		}
	}
	return 0;
}

/* Pieces of the flat shard [s, e) of the buffer described by m. */
static int mg_emit_shard(struct dte_layout *l, const struct mg_list *m, uint32_t rank,
			 uint32_t buf0, int64_t s, int64_t e, const struct dte_spec *spec)
{
	size_t i;

	for (i = 0; i < m->n; i++) {
		const struct mg_param *p = &m->p[i];
		int64_t a = p->offset > s ? p->offset : s;
		int64_t z = p->offset + p->numel < e ? p->offset + p->numel : e;
		if (p->buffer || a >= z || !p->nsub)
			continue;
		if (mg_emit_range(l, p, &m->s[p->sub0], p->nsub, rank, buf0, p->group, p->offset - s,
				  a - p->offset, z - p->offset, spec))
			return -1;
	}
	return 0;
}

/* One buffer kind (dense or expert) of one rank: its DP shard. */
static int mg_emit(struct dte_layout *l, const struct mg_list *m, int64_t total,
		   const struct dte_megatron_cfg *cfg, int64_t dp, int64_t dp_idx,
		   uint32_t rank, uint32_t buf0, const char *what, const struct dte_spec *spec)
{
	int64_t shard = total, s = 0;

	if (!cfg->dist_opt && dp_idx != 0)
		return 0;
	if (cfg->dist_opt) {
		int64_t pad = dp / gcd64(dp, 128) * 128;
		shard = (total + pad - 1) / pad * pad / dp;
		s = dp_idx * shard;
	}
	if (dte_layout_add_buffer(l, rank, buf0, shard, "%s param [%lld, %lld)", what, (long long)s, (long long)(s + shard)) < 0 ||
	    dte_layout_add_buffer(l, rank, buf0 + 1, shard, "%s exp_avg", what) < 0 ||
	    dte_layout_add_buffer(l, rank, buf0 + 2, shard, "%s exp_avg_sq", what) < 0)
		return -1;
	/* Where the trainer's tensors live, so a client can allocate there. */
	for (size_t i = 0; i < m->n; i++) {
		const struct mg_param *p = &m->p[i];

		if (!p->buffer && p->offset < s + shard && p->offset + p->numel > s &&
		    dte_layout_add_tensor(l, rank, buf0, p->offset - s, p->ndim, p->shape, p->name))
			return -1;
	}
	return mg_emit_shard(l, m, rank, buf0, s, s + shard, spec);
}

/* Registered buffers (p->buffer: the routers' FP32 expert_bias) are not in
 * Megatron's param-and-grad buffer: TP rank 0 / DP rank 0 (global rank 0)
 * holds them, modelled as one more buffer triple (ids 6, 7, 8), the
 * buffers back to back in registration order.  They have no exp_avg /
 * exp_avg_sq: the 7 and 8 buffers exist for the plan's piece shape only
 * (docs/SUPPORTED.md: what a sync does with them). */
static int mg_buffers(struct dte_layout *l, struct mg_list *m, const struct dte_spec *spec)
{
	int64_t total = 0;
	size_t i;

	for (i = 0; i < m->n; i++)
		if (m->p[i].buffer && m->p[i].nsub) {
			m->p[i].offset = total;
			total += m->p[i].numel;
		}
	if (!total)
		return 0;
	if (dte_layout_add_buffer(l, 0, 6, total, "buffers (fp32, not optimized) [0, %lld)", (long long)total) < 0 ||
	    dte_layout_add_buffer(l, 0, 7, total, "buffers exp_avg (none)") < 0 ||
	    dte_layout_add_buffer(l, 0, 8, total, "buffers exp_avg_sq (none)") < 0)
		return -1;
	for (i = 0; i < m->n; i++) {
		const struct mg_param *p = &m->p[i];

		if (!p->buffer || !p->nsub)
			continue;
		if (dte_layout_add_tensor(l, 0, 6, p->offset, p->ndim, p->shape, p->name) ||
		    mg_emit_range(l, p, &m->s[p->sub0], p->nsub, 0, 6, p->group, p->offset, 0,
				  p->numel, spec))
			return -1;
	}
	return 0;
}

static int mg_check(const struct dte_spec *spec, const struct dte_megatron_cfg *cfg,
		    int64_t etp, char *err, size_t errlen)
{
	const struct dte_spec_cfg *c = &spec->cfg;
	int64_t world, l;
	int dense = 0;

	if (cfg->tp < 1 || cfg->dp < 1 || cfg->ep < 1 || etp < 1 || cfg->tp > MG_MAX_PARALLEL ||
	    cfg->dp > MG_MAX_PARALLEL || cfg->ep > MG_MAX_PARALLEL || etp > MG_MAX_PARALLEL)
		return dte_layout_err(err, errlen, "megatron: tp, dp, ep, etp must be in [1, %d]", MG_MAX_PARALLEL);
	world = cfg->tp * cfg->dp;
	if (c->heads % cfg->tp)
		return dte_layout_err(err, errlen, "megatron: tp=%lld does not divide num_attention_heads=%lld",
				      (long long)cfg->tp, (long long)c->heads);
	/* TP above the query groups: ranks share a group (mg_qkv_rows). */
	if (c->arch != DTE_SPEC_ARCH_MLA && c->kv_heads % cfg->tp && (cfg->tp % c->kv_heads ||
				      (c->kv_heads * (c->heads / c->kv_heads + 2) * c->head_dim) % cfg->tp))
		return dte_layout_err(err, errlen, "megatron: tp=%lld does not divide the %lld query groups (num_key_value_heads), "
				      "nor do they divide it with linear_qkv's rows divisible by tp",
				      (long long)cfg->tp, (long long)c->kv_heads);
	for (l = 0; l < c->layers; l++)
		dense |= !c->moe_layer[l];
	if (dense && c->intermediate % cfg->tp)
		return dte_layout_err(err, errlen, "megatron: tp=%lld does not divide intermediate_size=%lld",
				      (long long)cfg->tp, (long long)c->intermediate);
	if (!c->experts)
		return 0;
	if (c->experts % cfg->ep)
		return dte_layout_err(err, errlen, "megatron: ep=%lld does not divide num_experts=%lld",
				      (long long)cfg->ep, (long long)c->experts);
	if (c->shared_experts && (c->moe_intermediate * c->shared_experts) % cfg->tp)
		return dte_layout_err(err, errlen, "megatron: tp=%lld does not divide the shared experts' intermediate size %lld",
				      (long long)cfg->tp, (long long)(c->moe_intermediate * c->shared_experts));
	if (c->moe_intermediate % etp)
		return dte_layout_err(err, errlen, "megatron: etp=%lld does not divide moe_intermediate_size=%lld",
				      (long long)etp, (long long)c->moe_intermediate);
	if (world % (cfg->ep * etp))
		return dte_layout_err(err, errlen, "megatron: ep*etp=%lld does not divide world size tp*dp=%lld",
				      (long long)(cfg->ep * etp), (long long)world);
	return 0;
}

int dte_layout_megatron(struct dte_layout *l, const struct dte_spec *spec,
			const struct dte_megatron_cfg *cfg, char *err, size_t errlen)
{
	const struct dte_spec_cfg *c = &spec->cfg;
	int64_t T = cfg->tp, etp = cfg->etp ? cfg->etp : cfg->tp, t, d, layer;
	int64_t world, edp, eg, total;
	struct mg_list m;
	int rc = -1;

	if (mg_check(spec, cfg, etp, err, errlen))
		return -1;
	world = cfg->tp * cfg->dp; /* bounded by mg_check */
	snprintf(l->desc, sizeof(l->desc), "megatron:tp=%lld,dp=%lld%s", (long long)T, (long long)cfg->dp,
		 c->experts ? "+moe" : "");
	memset(&m, 0, sizeof(m));
	for (t = 0; t < T; t++) {
		m.n = m.ns = 0;
		mg_vocab(&m, spec, spec->embed, T, t, "embedding.word_embeddings.weight");
		for (layer = 0; layer < c->layers; layer++)
			mg_layer_dense(&m, spec, layer, T, t);
		mg_replicated(&m, spec, spec->final_norm, t, "decoder.final_layernorm.weight");
		if (spec->lm_head >= 0)
			mg_vocab(&m, spec, spec->lm_head, T, t, "output_layer.weight");
		if (m.oom)
			goto oom;
		total = mg_assign_offsets(&m, cfg->dist_opt);
		for (d = 0; d < cfg->dp; d++)
			if (mg_emit(l, &m, total, cfg, cfg->dp, d, (uint32_t)(d * T + t), 0, "dense", spec))
				goto oom;
		if (t == 0 && mg_buffers(l, &m, spec))
			goto oom;
	}
	if (c->experts) {
		edp = world / (cfg->ep * etp);
		for (eg = 0; eg < cfg->ep * etp; eg++) {
			int64_t etp_idx = eg % etp, ep_idx = eg / etp;
			m.n = m.ns = 0;
			for (layer = 0; layer < c->layers; layer++)
				if (c->moe_layer[layer])
					mg_layer_experts(&m, spec, layer, cfg->ep, ep_idx, etp, etp_idx);
			if (m.oom)
				goto oom;
			total = mg_assign_offsets(&m, cfg->dist_opt);
			for (d = 0; d < edp; d++)
				if (mg_emit(l, &m, total, cfg, edp, d, (uint32_t)(d * cfg->ep * etp + eg), 3, "expert", spec))
					goto oom;
		}
	}
	dte_layout_sort_buffers(l);
	rc = 0;
	goto out;
oom:
	dte_layout_err(err, errlen, "megatron: out of memory");
out:
	mg_list_fini(&m);
	return rc;
}

/* ------------------------------------------------- registered shards */

int dte_megatron_check(const struct dte_spec *spec, const struct dte_megatron_cfg *cfg,
		       char *err, size_t errlen)
{
	return mg_check(spec, cfg, cfg->etp ? cfg->etp : cfg->tp, err, errlen);
}

/* Megatron-Core's local spec (megatron/core/models/gpt/gpt_layer_specs.py,
 * get_gpt_layer_local_spec) keeps the norms before attention and MLP as
 * modules of the layer, input_layernorm.weight and pre_mlp_layernorm.weight,
 * where the TE spec fuses them into linear_qkv.layer_norm_weight and
 * linear_fc1.layer_norm_weight (its sharded_state_dict_keys_map says the
 * same).  A dense layer's pre_mlp_layernorm is the TE spec's
 * linear_fc1.layer_norm_weight; an MoE layer has pre_mlp_layernorm in both.
 * With multi_latent_attention the local spec keeps MLASelfAttention's
 * q_layernorm and kv_layernorm as modules too, where the TE spec fuses them
 * into linear_q_up_proj / linear_kv_up_proj (mg_mla).  A name is looked up
 * as it is first, so a Qwen3 layer's own q_layernorm stays itself. */
static const struct { const char *local, *te; } mg_local_norms[] = {
	{ ".input_layernorm.weight", ".self_attention.linear_qkv.layer_norm_weight" },
	{ ".pre_mlp_layernorm.weight", ".mlp.linear_fc1.layer_norm_weight" },
	{ ".self_attention.q_layernorm.weight", ".self_attention.linear_q_up_proj.layer_norm_weight" },
	{ ".self_attention.kv_layernorm.weight", ".self_attention.linear_kv_up_proj.layer_norm_weight" },
};

/* The TE spec's name of a local-spec norm, or 0 when `in` is none. */
static int mg_local_norm_alias(const char *in, char *out, size_t len)
{
	size_t n = strlen(in), i;

	if (strncmp(in, "decoder.layers.", strlen("decoder.layers.")))
		return 0;
	for (i = 0; i < sizeof(mg_local_norms) / sizeof(mg_local_norms[0]); i++) {
		size_t k = strlen(mg_local_norms[i].local);

		if (n > k && !strcmp(in + n - k, mg_local_norms[i].local)) {
			snprintf(out, len, "%.*s%s", (int)(n - k), in, mg_local_norms[i].te);
			return 1;
		}
	}
	return 0;
}

/* SequentialMLP (megatron/core/transformer/moe/experts.py, SequentialMLP:
 * local_experts.{e}.linear_fc1.weight) names the same TP-local tensors as
 * TEGroupedMLP (linear_fc1.weight{e}); both map to the grouped name. */
static void mg_canon_name(const char *in, char *out, size_t len)
{
	const char *at = strstr(in, ".mlp.experts.local_experts.");
	const char *pre = ".mlp.experts.local_experts.";
	char *end;
	long long e;

	snprintf(out, len, "%s", in);
	if (!at)
		return;
	e = strtoll(at + strlen(pre), &end, 10);
	if (end == at + strlen(pre) || *end != '.' || e < 0)
		return;
	if (strcmp(end, ".linear_fc1.weight") && strcmp(end, ".linear_fc2.weight"))
		return;
	snprintf(out, len, "%.*s.mlp.experts%.*s%lld", (int)(at - in), in,
		 (int)strlen(".linear_fcN.weight"), end, e);
}

struct mg_named {
	const char *name;
	size_t i;
};

static int mg_name_cmp(const void *a, const void *b)
{
	return strcmp(((const struct mg_named *)a)->name, ((const struct mg_named *)b)->name);
}

static size_t mg_lookup(const struct mg_list *m, const struct mg_named *idx, const char *name)
{
	size_t lo = 0, hi = m->n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = strcmp(idx[mid].name, name);

		if (!c)
			return idx[mid].i;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return (size_t)-1;
}

int dte_megatron_shard_pieces(struct dte_layout *l, const struct dte_spec *spec,
			      const struct dte_megatron_cfg *cfg, uint32_t rank,
			      const struct dte_shard *s, size_t n, const uint32_t *bufid,
			      char *err, size_t errlen)
{
	const struct dte_spec_cfg *c = &spec->cfg;
	int64_t T = cfg->tp, etp = cfg->etp ? cfg->etp : cfg->tp, t, layer;
	struct mg_list m;
	struct mg_named *idx = NULL;
	size_t i;
	int rc = -1;

	if (mg_check(spec, cfg, etp, err, errlen))
		return -1;
	t = rank % T; /* T >= 1: mg_check */
	if ((int64_t)rank >= cfg->tp * cfg->dp)
		return dte_layout_err(err, errlen, "mcore: rank %u; tp*dp = %lld ranks", rank,
				      (long long)(cfg->tp * cfg->dp));
	memset(&m, 0, sizeof(m));
	mg_vocab(&m, spec, spec->embed, T, t, "embedding.word_embeddings.weight");
	for (layer = 0; layer < c->layers; layer++)
		mg_layer_dense(&m, spec, layer, T, t);
	mg_replicated(&m, spec, spec->final_norm, t, "decoder.final_layernorm.weight");
	if (spec->lm_head >= 0)
		mg_vocab(&m, spec, spec->lm_head, T, t, "output_layer.weight");
	if (c->experts) {
		/* The expert grid numbers ranks tp-ep-dp (header comment). */
		int64_t eg = (int64_t)rank % (cfg->ep * etp);

		for (layer = 0; layer < c->layers; layer++)
			if (c->moe_layer[layer])
				mg_layer_experts(&m, spec, layer, cfg->ep, eg / etp, etp, eg % etp);
	}
	if (m.oom || !(idx = malloc((m.n ? m.n : 1) * sizeof(*idx)))) {
		dte_layout_err(err, errlen, "mcore: out of memory");
		goto out;
	}
	for (i = 0; i < m.n; i++) {
		idx[i].name = m.p[i].name;
		idx[i].i = i;
	}
	qsort(idx, m.n, sizeof(*idx), mg_name_cmp);
	for (i = 0; i < n; i++) {
		char name[DTE_LAYOUT_NAME_MAX];
		size_t at;
		struct mg_param p;
		struct mg_sub vs;
		const struct mg_sub *subs;
		size_t nsub;
		uint32_t d;

		mg_canon_name(s[i].name, name, sizeof(name));
		at = mg_lookup(&m, idx, name);
		if (at == (size_t)-1 && mg_local_norm_alias(s[i].name, name, sizeof(name)))
			at = mg_lookup(&m, idx, name);
		if (at == (size_t)-1) {
			dte_layout_err(err, errlen, "mcore: rank %u: %s is not a parameter of this model "
				       "at tp=%lld ep=%lld", rank, s[i].name, (long long)T,
				       (long long)cfg->ep);
			goto out;
		}
		p = m.p[at];
		subs = &m.s[p.sub0];
		nsub = p.nsub;
		if (p.vocab >= 0 && s[i].ndim == 2 && s[i].shape[1] == p.shape[1] &&
		    s[i].shape[0] != p.shape[0]) {
			/* The padded vocab is what the tensor says (a tokenizer's size or
			 * --padded-vocab-size), not config.json's rounded up: megatron/
			 * training/tokenizer vocab_size_with_padding. */
			int64_t per = s[i].shape[0], V = c->vocab, lo = t * per;
			int64_t hi = lo + per < V ? lo + per : V;

			if (per * T < V) {
				dte_layout_err(err, errlen, "mcore: rank %u: %s has %lld rows per TP rank; "
					       "%lld ranks hold fewer than the %lld vocab rows", rank,
					       s[i].name, (long long)per, (long long)T, (long long)V);
				goto out;
			}
			p.shape[0] = per;
			p.numel = per * p.shape[1];
			nsub = 0;
			if (hi > lo) {
				memset(&vs, 0, sizeof(vs));
				vs.tensor = (uint32_t)p.vocab;
				vs.clo[0] = lo;
				vs.chi[0] = hi;
				vs.chi[1] = p.shape[1];
				nsub = 1;
			}
			subs = &vs;
		}
		for (d = 0; d < p.ndim && s[i].ndim == p.ndim; d++)
			if (s[i].shape[d] != p.shape[d])
				break;
		if (s[i].ndim != p.ndim || d != p.ndim) {
			dte_layout_err(err, errlen, "mcore: rank %u: %s is registered as %u-D [%lld%s%lld], "
				       "tp=%lld gives it [%lld%s%lld]", rank, s[i].name, s[i].ndim,
				       (long long)s[i].shape[0], s[i].ndim > 1 ? ", " : "",
				       s[i].ndim > 1 ? (long long)s[i].shape[1] : 0LL, (long long)T,
				       (long long)p.shape[0], p.ndim > 1 ? ", " : "",
				       p.ndim > 1 ? (long long)p.shape[1] : 0LL);
			goto out;
		}
		if (s[i].hi > p.numel) {
			dte_layout_err(err, errlen, "mcore: rank %u: %s range [%lld, %lld) beyond its %lld "
				       "elements", rank, s[i].name, (long long)s[i].lo,
				       (long long)s[i].hi, (long long)p.numel);
			goto out;
		}
		if (nsub && mg_emit_range(l, &p, subs, nsub, rank, bufid[i], s[i].group, -s[i].lo,
					  s[i].lo, s[i].hi, spec)) {
			dte_layout_err(err, errlen, "mcore: out of memory");
			goto out;
		}
	}
	rc = 0;
out:
	free(idx);
	mg_list_fini(&m);
	return rc;
}

#!/usr/bin/python3
"""Real megatron-core, whole, on gloo CPU ranks, into dted: exact every version.

Two rank processes run megatron-core (the pinned 0.16.1 of
scripts/venv-nodeps.txt) as a training job does: a GPTModel of
get_gpt_layer_local_spec() (Qwen3-like: RMSNorm, SwiGLU, qk_layernorm, GQA,
no bias, rotary; SequentialMLP experts for MoE), Float16Module (BF16),
DistributedDataParallel with the distributed optimizer and small buckets,
get_megatron_optimizer and an OptimizerParamScheduler, and per step
forward, backward, finalize_model_grads, optimizer.step().  What CUDA
upstream assumes is bent in one place, tests/system/mcore_shim.py.

Each rank attaches with Source.megatron_core to a dted the test starts and
publishes every version; the test process holds an SGLang-layout sink.
After every version every sink element must equal RNE-BF16(θ_t), θ_t the
FP32 masters the real optimizer holds, gathered from its shards and turned
into HF Qwen3 names by this file's own converter (to_hf, from Megatron-Core
naming facts, not dted's layout code) and into the sink's layout by
tests/system/layout_reference.py.  Megatron's own BF16 parameters after the
step (its copy of the masters, all-gathered) must convert to the same.

Configs (CONFIGS): dense tp=2, dense dp=2, MoE ep=2 (SequentialMLP, 4
experts, top-2) with dp=2 and with tp=2 (sequence parallel), with torch
AdamW (megatron's inner Adam without TE/Apex) and with FusedAdamLike (TE
FusedAdam's semantics: step count in param_groups), at an RL learning rate
(few BF16 weights move) and a pretraining one (most move).  Besides
exactness: no version after the first goes dense, DP shards cut
parameters, the loss falls, and θ_0 written by write_hf_checkpoint is HF
Qwen3's names, shapes and RNE(θ_0).

GLM-4.5 (glm_config: the published config at small dims) with ep=2: the
block spec's dense first layer, a shared expert, QKV bias, partial rotary,
sigmoid routing with the routers' aux-loss-free expert_bias, an FP32 buffer
Megatron updates every step outside the optimizer, which
Source.megatron_core registers at rank 0; into SGLang-layout engine
workers (FamilySink), the bias held bit for bit in FP32.  DeepSeek-V3
(deepseek_config) the same way with MLA as megatron-core's local spec
builds it (q_layernorm / kv_layernorm modules, which the mcore layout
takes as the TE spec's fused norms); its core attention, which has no
weights, is mcore_shim.MLACoreAttention (upstream's local one cannot do
MLA).

Prints `real-megatron: megatron-core=<version> configs=N versions=V exact=V/V`.

For a whole-chain test: run(...) drives the ranks and calls
on_version(v, hf_fp32) in this process after each publish;
write_hf_checkpoint writes θ_0 as a Qwen3 HF checkpoint.
"""

import io
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback

VENV_PY = os.environ.get("DTE_UPSTREAM_PYTHON", "/opt/dted-venv/bin/python")
VENV = os.path.dirname(os.path.dirname(VENV_PY))
if __name__ == "__main__" and os.path.realpath(sys.prefix) != os.path.realpath(VENV):
    if not os.access(VENV_PY, os.X_OK):
        sys.exit("real-megatron: %s is missing: run scripts/install-deps.sh (it installs "
                 "megatron-core into the upstream venv)" % VENV_PY)
    os.execv(VENV_PY, [VENV_PY] + sys.argv)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

import torch  # noqa: E402

VERSIONS = 6
BUCKET = 4000            # elements: several buckets per rank
SEQ, MICRO = 16, 2
TIMEOUT_S = 120          # one version, one rank: generous on a shared 2-core machine
# Version 0 also waits for each rank's process start and imports (torch,
# megatron-core, sympy): over 120 s once beside two CPU hogs and two
# engine tests, the ranks still importing when the deadline came.
START_S = 600


# ------------------------------------------------------------ the model
def qwen3_config(moe=False, **over):
    """A tiny Qwen3 (or Qwen3-MoE) HF config.json dict."""
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM"],
        "model_type": "qwen3_moe" if moe else "qwen3",
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": 300, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "tie_word_embeddings": False, "attention_bias": False,
        "max_position_embeddings": 128, "torch_dtype": "bfloat16",
        "hidden_act": "silu",
    }
    if moe:
        cfg.update(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                   decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)
    cfg.update(over)
    return cfg


def glm_config():
    """GLM-4.5 (tests/data/layout/models/glm-4.5.json: every field of the
    published config) at small dims: 3 layers, the first dense
    (first_k_dense_replace), 4 routed experts and 1 shared, QKV bias,
    partial rotary, a sigmoid router with its FP32 e_score_correction_bias."""
    import families as fam
    with open(os.path.join(fam.MODELS, "glm-4.5.json")) as f:
        real = json.load(f)
    return fam.small(real, num_hidden_layers=3, first_k_dense_replace=1, hidden_size=64,
                     head_dim=16, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=96, moe_intermediate_size=32, n_routed_experts=4,
                     num_experts_per_tok=2, vocab_size=300, max_position_embeddings=128,
                     pad_token_id=None, eos_token_id=None)


def deepseek_config():
    """DeepSeek-V3 (tests/data/layout/models/deepseek-v3.json) at small
    dims: MLA with q_lora, 3 layers (the first dense), 4 routed experts and
    1 shared, sigmoid routing with the FP32 e_score_correction_bias; one
    expert group (group-limited routing changes no weight)."""
    import families as fam
    with open(os.path.join(fam.MODELS, "deepseek-v3.json")) as f:
        real = json.load(f)
    return fam.small(real, num_hidden_layers=3, first_k_dense_replace=1, hidden_size=64,
                     num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24,
                     kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                     intermediate_size=96, moe_intermediate_size=32, n_routed_experts=4,
                     num_experts_per_tok=2, n_group=1, topk_group=1, vocab_size=300,
                     max_position_embeddings=128)


FAMILIES = ("glm4_moe", "deepseek_v3")     # the routers' expert_bias, shared experts


def is_moe(cfg):
    return cfg["model_type"] in ("qwen3_moe",) + FAMILIES


def is_mla(cfg):
    return cfg["model_type"] == "deepseek_v3"


def n_experts(cfg):
    return cfg["n_routed_experts"] if cfg["model_type"] in FAMILIES else cfg["num_experts"]


def padded_vocab(cfg, tp):
    """Megatron's training pads the vocab to a multiple of 128 * TP
    (megatron/training/tokenizer vocab_size_with_padding,
    --make-vocab-size-divisible-by 128)."""
    m = 128 * tp
    return -(-cfg["vocab_size"] // m) * m


def sequence_parallel(cfg, tp):
    """MoE layers with TP train only with sequence parallelism
    (transformer/moe/moe_layer.py MoELayer.forward raises without it);
    dense runs go without."""
    return is_moe(cfg) and tp > 1


def transformer_config(cfg, tp, ep):
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import (MLATransformerConfig,
                                                              TransformerConfig)
    moe, family = is_moe(cfg), cfg["model_type"] in FAMILIES
    kw = dict(
        num_layers=cfg["num_hidden_layers"], hidden_size=cfg["hidden_size"],
        ffn_hidden_size=cfg["intermediate_size"], num_attention_heads=cfg["num_attention_heads"],
        num_query_groups=cfg["num_key_value_heads"], kv_channels=cfg.get("head_dim"),
        normalization="RMSNorm", layernorm_epsilon=cfg["rms_norm_eps"], qk_layernorm=True,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        add_qkv_bias=False, attention_dropout=0.0, hidden_dropout=0.0,
        bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
        apply_rope_fusion=False, persist_layer_norm=False, gradient_accumulation_fusion=False,
        tensor_model_parallel_size=tp, expert_model_parallel_size=ep,
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        use_cpu_initialization=True, init_method_std=0.02)
    if moe:
        # Experts whole on each EP rank (expert TP 1).
        kw.update(expert_tensor_parallel_size=1, sequence_parallel=sequence_parallel(cfg, tp))
        kw.update(num_moe_experts=n_experts(cfg),
                  moe_ffn_hidden_size=cfg["moe_intermediate_size"],
                  moe_router_topk=cfg["num_experts_per_tok"], moe_grouped_gemm=False,
                  moe_token_dispatcher_type="alltoall", moe_router_load_balancing_type="none",
                  moe_aux_loss_coeff=0.0, moe_router_pre_softmax=False)
    if family:
        # GLM-4.5's config.json in Megatron-Core's terms: QKV bias, no QK norm, dense first layers
        # (moe_layer_freq), a shared expert (SharedExpertMLP), sigmoid
        # routing scaled by routed_scaling_factor with the aux-loss-free
        # expert bias (TopKRouter.expert_bias, updated by
        # finalize_model_grads._update_router_expert_bias every step).
        k, L = cfg["first_k_dense_replace"], cfg["num_hidden_layers"]
        kw.update(qk_layernorm=cfg.get("use_qk_norm", False),
                  add_qkv_bias=cfg["attention_bias"],
                  num_moe_experts=cfg["n_routed_experts"],
                  moe_shared_expert_intermediate_size=cfg["n_shared_experts"] *
                  cfg["moe_intermediate_size"],
                  moe_layer_freq=[0] * k + [1] * (L - k),
                  moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
                  moe_router_bias_update_rate=1e-3,
                  moe_router_topk_scaling_factor=cfg["routed_scaling_factor"])
    if is_mla(cfg):
        # DeepSeek-V3's MLA (transformer/multi_latent_attention.py), its
        # q_a_layernorm / kv_a_layernorm the spec's q_layernorm /
        # kv_layernorm.  rope_type "rope", not the config's yarn: the
        # position encoding has no weight.
        kw.update(qk_layernorm=True, num_query_groups=cfg["num_attention_heads"],
                  q_lora_rank=cfg["q_lora_rank"], kv_lora_rank=cfg["kv_lora_rank"],
                  qk_head_dim=cfg["qk_nope_head_dim"], qk_pos_emb_head_dim=cfg["qk_rope_head_dim"],
                  v_head_dim=cfg["v_head_dim"], rope_type="rope", rotary_base=cfg["rope_theta"])
        kw.pop("kv_channels")
        return MLATransformerConfig(**kw)
    return TransformerConfig(**kw)


# ----------------------------------------------- a FusedAdam-like optimizer
class FusedAdamLike(torch.optim.Optimizer):
    """TransformerEngine FusedAdam's semantics (transformer_engine/pytorch/
    optimizers/fused_adam.py, FusedAdam) on CPU tensors: defaults lr,
    bias_correction, betas, eps, weight_decay; adam_w_mode (decoupled decay
    folded into the update); group['step'] += 1 per group that holds
    params; params without a grad skipped; state exp_avg / exp_avg_sq in
    FP32 made by initialize_state; the update in FP32 in the order of the
    multi_tensor_adam kernel (ADAM_MODE_1):
        m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g²
        denom = sqrt(v / bc2) + eps;  update = (m / bc1) / denom + wd p
        p = p - lr update"""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 adam_w_mode=True, weight_decay=0.0, amsgrad=False, capturable=False,
                 master_weights=False, store_param_remainders=False, use_decoupled_grad=False,
                 **_ignored):
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        super().__init__(params, dict(lr=lr, bias_correction=bias_correction, betas=betas,
                                      eps=eps, weight_decay=weight_decay))
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.capturable = capturable
        self.master_weights = master_weights
        self.store_param_remainders = store_param_remainders
        self.use_decoupled_grad = use_decoupled_grad

    def initialize_state(self, param, store_param_remainders=False):
        self.state[param]["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
        self.state[param]["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)

    @torch.no_grad()
    def step(self, closure=None, grad_scaler=None):
        for g in self.param_groups:
            if not g["params"]:
                continue
            g["step"] = g.get("step", 0) + 1
            b1, b2 = g["betas"]
            bc1 = 1 - b1 ** g["step"] if g["bias_correction"] else 1.0
            bc2 = 1 - b2 ** g["step"] if g["bias_correction"] else 1.0
            for p in g["params"]:
                if p.grad is None:
                    continue
                if not self.state[p]:
                    self.initialize_state(p)
                st = self.state[p]
                m, v, grad = st["exp_avg"], st["exp_avg_sq"], p.grad.float()
                m.mul_(b1).add_(grad * (1 - b1))
                v.mul_(b2).add_(grad * grad * (1 - b2))
                denom = (v / bc2).sqrt() + g["eps"]
                update = (m / bc1) / denom
                if self.adam_w_mode:
                    update = update + p * g["weight_decay"]
                p.sub_(update * g["lr"])


# --------------------------------------------------------- the converter
def is_expert(name):
    return ".mlp.experts." in name


def _assemble(parts, what):
    """parts: [(lo, hi, FP32 values, shape)] of one tensor: its flattened
    elements [lo, hi) each.  Every element must be held exactly once."""
    shape = parts[0][3]
    n = math.prod(shape)
    out = torch.full((n,), float("nan"), dtype=torch.float32)
    seen = torch.zeros(n, dtype=torch.int32)
    for lo, hi, vals, sh in parts:
        if tuple(sh) != tuple(shape):
            raise AssertionError("%s registered with shapes %s and %s" % (what, shape, sh))
        out[lo:hi] = vals
        seen[lo:hi] += 1
    if not bool((seen == 1).all()):
        raise AssertionError("%s: shard elements held %s times (want exactly once)"
                             % (what, sorted(set(seen.tolist()))))
    return out.reshape(shape)


def to_hf(cfg, ranks):
    """θ in HF Qwen3 / Qwen3-MoE names from what every rank's optimizer holds.

    ranks: [{"tp_rank", "tp", "ep_rank", "ep", "etp_rank", "etp",
    "shards": [(name, shape, lo, hi, fp32 values)]}].  Names and layouts are
    Megatron-Core's (models/gpt/gpt_model.py, transformer/attention.py,
    transformer/mlp.py, transformer/moe/experts.py, with the local spec of
    models/gpt/gpt_layer_specs.py get_gpt_layer_local_spec):
    - embedding.word_embeddings.weight, output_layer.weight: vocab-parallel
      rows, TP rank t holds rows [t*Vp/T, (t+1)*Vp/T) of the padded vocab;
    - decoder.layers.N.self_attention.linear_qkv.weight: column parallel
      over rows interleaved per query group: [q heads of group g (qpg*hd
      rows); k_g (hd); v_g (hd)] for g = 0..groups-1
      (SelfAttention.get_query_key_value_tensors splits it that way);
    - linear_proj.weight, linear_fc2.weight: row parallel (split on dim 1);
    - mlp.linear_fc1.weight: column parallel, each TP rank [gate_t; up_t]
      (gated_linear_unit: MLP.forward chunks the output in two);
    - input_layernorm / pre_mlp_layernorm / q_layernorm / k_layernorm /
      final_layernorm weights and mlp.router.weight: whole on every TP rank;
    - SequentialMLP: mlp.experts.local_experts.i.linear_fc{1,2}.weight of
      EP rank e is expert e*E/ep + i, split over the expert-TP ranks like
      the dense MLP;
    - GLM-4.5 (glm4_moe): linear_qkv.bias split like the weight's rows; no
      QK norms; layers below first_k_dense_replace dense (moe_layer_freq);
      mlp.shared_experts.linear_fc{1,2}.weight (SharedExpertMLP, split over
      TP like the dense MLP); mlp.router.expert_bias, an FP32 buffer every
      rank holds alike (r["buffers"]), is the checkpoint's
      mlp.gate.e_score_correction_bias."""
    H, nq, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, V, L = cfg.get("head_dim"), cfg["vocab_size"], cfg["num_hidden_layers"]
    qpg = nq // nkv
    moe, family, mla = is_moe(cfg), cfg["model_type"] in FAMILIES, is_mla(cfg)
    bufs = {}
    for r in ranks:
        for name, t in r.get("buffers", []):
            if name in bufs and not torch.equal(bufs[name].view(torch.int32), t.view(torch.int32)):
                raise AssertionError("%s differs between ranks" % name)
            bufs.setdefault(name, t)
    buf_taken = set()
    # 1. Whole TP-local (or expert-TP-local) tensors from the DP shards.
    parts = {}
    for r in ranks:
        for name, shape, lo, hi, vals in r["shards"]:
            key = (name, r["ep_rank"], r["etp_rank"]) if is_expert(name) else (name, r["tp_rank"])
            parts.setdefault(key, []).append((lo, hi, vals.reshape(-1), tuple(shape)))
    local = {k: _assemble(v, " ".join(str(x) for x in k)) for k, v in parts.items()}
    tp, ep, etp = ranks[0]["tp"], ranks[0]["ep"], ranks[0]["etp"]
    taken = set()

    def take(key):
        if key not in local:
            raise AssertionError("no shards of %s" % (key,))
        taken.add(key[0])
        return local[key]

    def tps(name):
        taken.add(name)
        got = [local.get((name, t)) for t in range(tp)]
        if any(g is None for g in got):
            raise AssertionError("%s: no shards from TP ranks %s" % (
                name, [t for t, g in enumerate(got) if g is None]))
        return got

    def replicated(name):
        got = tps(name)
        for t, g in enumerate(got[1:], 1):
            if not torch.equal(g.view(torch.int32), got[0].view(torch.int32)):
                raise AssertionError("%s differs between TP ranks 0 and %d" % (name, t))
        return got[0]

    def gate_up(chunks):
        halves = [c.chunk(2, 0) for c in chunks]
        return torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])

    def attention(h, a):
        qkv = torch.cat(tps(a + "linear_qkv.weight")).reshape(nkv, qpg + 2, hd, H)
        hf[h + "self_attn.q_proj.weight"] = qkv[:, :qpg].reshape(nq * hd, H)
        hf[h + "self_attn.k_proj.weight"] = qkv[:, qpg].reshape(nkv * hd, H)
        hf[h + "self_attn.v_proj.weight"] = qkv[:, qpg + 1].reshape(nkv * hd, H)
        if cfg.get("attention_bias"):
            qkvb = torch.cat(tps(a + "linear_qkv.bias")).reshape(nkv, qpg + 2, hd)
            hf[h + "self_attn.q_proj.bias"] = qkvb[:, :qpg].reshape(nq * hd)
            hf[h + "self_attn.k_proj.bias"] = qkvb[:, qpg].reshape(nkv * hd)
            hf[h + "self_attn.v_proj.bias"] = qkvb[:, qpg + 1].reshape(nkv * hd)
        if not family or cfg.get("use_qk_norm"):
            hf[h + "self_attn.q_norm.weight"] = replicated(a + "q_layernorm.weight")
            hf[h + "self_attn.k_norm.weight"] = replicated(a + "k_layernorm.weight")
        hf[h + "self_attn.o_proj.weight"] = torch.cat(tps(a + "linear_proj.weight"), 1)

    def mla_attention(h, a):
        # MLASelfAttention (local spec: q_layernorm / kv_layernorm are
        # modules): get_query_key_value_tensors splits each head of
        # linear_q_up_proj into [nope; rope], linear_kv_down_proj into
        # [kv_lora; rope] and each head of linear_kv_up_proj into [k_nope;
        # v], the checkpoint's orders (modeling_deepseek_v3.py
        # DeepseekV3Attention): straight copies; the up projections column
        # parallel, linear_proj row parallel (this test runs TP 1).
        s_ = h + "self_attn."
        hf[s_ + "q_a_proj.weight"] = replicated(a + "linear_q_down_proj.weight")
        hf[s_ + "q_a_layernorm.weight"] = replicated(a + "q_layernorm.weight")
        hf[s_ + "q_b_proj.weight"] = torch.cat(tps(a + "linear_q_up_proj.weight"))
        hf[s_ + "kv_a_proj_with_mqa.weight"] = replicated(a + "linear_kv_down_proj.weight")
        hf[s_ + "kv_a_layernorm.weight"] = replicated(a + "kv_layernorm.weight")
        hf[s_ + "kv_b_proj.weight"] = torch.cat(tps(a + "linear_kv_up_proj.weight"))
        hf[s_ + "o_proj.weight"] = torch.cat(tps(a + "linear_proj.weight"), 1)

    def mlp(n, h, m):
        if moe and (not family or n >= cfg["first_k_dense_replace"]):
            hf[h + "mlp.gate.weight"] = replicated(m + "router.weight")
            if family:
                bn = m + "router.expert_bias"
                if bn not in bufs:
                    raise AssertionError("no rank reported %s" % bn)
                buf_taken.add(bn)
                hf[h + "mlp.gate.e_score_correction_bias"] = bufs[bn]
                sh = h + "mlp.shared_experts."
                hf[sh + "gate_proj.weight"], hf[sh + "up_proj.weight"] = \
                    gate_up(tps(m + "shared_experts.linear_fc1.weight"))
                hf[sh + "down_proj.weight"] = torch.cat(tps(m + "shared_experts.linear_fc2.weight"), 1)
            El = n_experts(cfg) // ep
            for e in range(ep):
                for i in range(El):
                    x = m + "experts.local_experts.%d." % i
                    fc1 = [take((x + "linear_fc1.weight", e, k)) for k in range(etp)]
                    fc2 = [take((x + "linear_fc2.weight", e, k)) for k in range(etp)]
                    q = h + "mlp.experts.%d." % (e * El + i)
                    hf[q + "gate_proj.weight"], hf[q + "up_proj.weight"] = gate_up(fc1)
                    hf[q + "down_proj.weight"] = torch.cat(fc2, 1)
        else:
            hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"] = \
                gate_up(tps(m + "linear_fc1.weight"))
            hf[h + "mlp.down_proj.weight"] = torch.cat(tps(m + "linear_fc2.weight"), 1)

    hf = {"model.embed_tokens.weight": torch.cat(tps("embedding.word_embeddings.weight"))[:V]}
    for n in range(L):
        p, h = "decoder.layers.%d." % n, "model.layers.%d." % n
        hf[h + "input_layernorm.weight"] = replicated(p + "input_layernorm.weight")
        (mla_attention if mla else attention)(h, p + "self_attention.")
        hf[h + "post_attention_layernorm.weight"] = replicated(p + "pre_mlp_layernorm.weight")
        mlp(n, h, p + "mlp.")
    hf["model.norm.weight"] = replicated("decoder.final_layernorm.weight")
    hf["lm_head.weight"] = torch.cat(tps("output_layer.weight"))[:V]
    unused = ({k[0] for k in local} - taken) | (set(bufs) - buf_taken)
    if unused:
        raise AssertionError("parameters the converter does not know: %s" % sorted(unused)[:4])
    return hf


def hf_shapes(cfg):
    """HF Qwen3 / Qwen3-MoE tensor shapes (transformers modeling_qwen3*.py)."""
    H, nq, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, V, I = cfg["head_dim"], cfg["vocab_size"], cfg["intermediate_size"]
    out = {"model.embed_tokens.weight": (V, H)}
    for n in range(cfg["num_hidden_layers"]):
        h = "model.layers.%d." % n
        out.update({h + "input_layernorm.weight": (H,), h + "self_attn.q_proj.weight": (nq * hd, H),
                    h + "self_attn.k_proj.weight": (nkv * hd, H),
                    h + "self_attn.v_proj.weight": (nkv * hd, H),
                    h + "self_attn.q_norm.weight": (hd,), h + "self_attn.k_norm.weight": (hd,),
                    h + "self_attn.o_proj.weight": (H, nq * hd),
                    h + "post_attention_layernorm.weight": (H,)})
        if cfg["model_type"] == "qwen3_moe":
            Im = cfg["moe_intermediate_size"]
            out[h + "mlp.gate.weight"] = (cfg["num_experts"], H)
            for e in range(cfg["num_experts"]):
                q = h + "mlp.experts.%d." % e
                out.update({q + "gate_proj.weight": (Im, H), q + "up_proj.weight": (Im, H),
                            q + "down_proj.weight": (H, Im)})
        else:
            out.update({h + "mlp.gate_proj.weight": (I, H), h + "mlp.up_proj.weight": (I, H),
                        h + "mlp.down_proj.weight": (H, I)})
    out["model.norm.weight"] = (H,)
    out["lm_head.weight"] = (V, H)
    return out


def write_hf_checkpoint(path, cfg, hf):
    """θ (HF names) as a BF16 safetensors checkpoint with config.json, for
    an engine to start from the trainer's initial weights."""
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    save_file({n: t.to(torch.bfloat16).contiguous() for n, t in hf.items()},
              os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return path


# --------------------------------------------------------- one rank
def _blob(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _unblob(b):
    return torch.load(io.BytesIO(b), weights_only=False)


def _optimizer_shards(optimizer, names):
    """[(name, TP-local shape, lo, hi, FP32 master values)] the real
    DistributedOptimizer(s) hold on this rank: the shard FP32 copies of the
    BF16 params in shard_fp32_from_float16_groups, beside model_float16_groups,
    each covering param_range_map[param]["param"] of the flattened param
    (megatron/core/optimizer/distrib_optimizer.py
    _build_model_and_main_param_groups, _get_model_param_range_map)."""
    out = []
    opts = getattr(optimizer, "chained_optimizers", [optimizer])
    for o in opts:
        for mg, sg in zip(o.model_float16_groups, o.shard_fp32_from_float16_groups):
            for model_p, main_p in zip(mg, sg):
                r = o._get_model_param_range_map(model_p)["param"]
                out.append((names[id(model_p)], tuple(model_p.shape), r.start, r.end,
                            main_p.detach().clone().reshape(-1)))
        for mg in o.model_fp32_groups:
            if mg:
                raise AssertionError("FP32 model params in a BF16 model")
    return out


def _rank_main(rank, world, store, args, to_main, from_main):
    # A rank once died of a C++ exception escaping a thread (std::terminate:
    # "std::length_error vector::reserve", SIGABRT) under two CPU hogs, with
    # nothing to say where: a fatal signal now prints every thread's Python
    # stack to stderr, which the test's log keeps.
    # A fatal signal in a thread with no Python frames (gloo's workers: a
    # SIGSEGV once came while the main thread only waited in
    # _coalescing_manager's work.wait()) also prints the native stack
    # (torch/csrc: c10::FatalSignalHandler).
    import faulthandler
    faulthandler.enable(all_threads=True)
    torch._C._set_print_stack_traces_on_fatal_signal(True)
    try:
        _rank(rank, world, store, args, to_main, from_main)
    except BaseException as e:  # noqa: BLE001 - reported to the test process
        to_main.put(("error", rank, "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc())))
        raise SystemExit(1)


def _rank(rank, world, store, args, to_main, from_main):
    import warnings
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    cfg, tp, dp, ep, kind = args["cfg"], args["tp"], args["dp"], args["ep"], args["optimizer"]
    moe, family = is_moe(cfg), cfg["model_type"] in FAMILIES
    import mcore_shim
    mcore_shim.install(moe=moe, sequence_parallel=sequence_parallel(cfg, tp))
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import (DistributedDataParallel,
                                           DistributedDataParallelConfig, finalize_model_grads)
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (get_gpt_decoder_block_spec,
                                                          get_gpt_layer_local_spec)
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module
    from dte.source import Source

    # A FileStore in the run's own directory: a TCP port picked by binding
    # port 0 and released before rank 0 binds it again can be taken by
    # anything in between (one loaded run waited 120 s for version 0).
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank,
                            world_size=world)
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep,
                                 expert_tensor_parallel_size=1 if moe else None)
    model_parallel_cuda_manual_seed(1234)
    torch.manual_seed(1234)
    tcfg = transformer_config(cfg, tp, ep)
    if family:
        # Dense and MoE layers mixed (moe_layer_freq): the block spec, of
        # local (non-TE) layers.
        spec = get_gpt_decoder_block_spec(tcfg, use_transformer_engine=False,
                                          normalization="RMSNorm")
        if is_mla(cfg):
            spec = mcore_shim.mla_core_attention(spec)
    else:
        spec = get_gpt_layer_local_spec(num_experts=cfg.get("num_experts") if moe else None,
                                        moe_grouped_gemm=False, qk_layernorm=True,
                                        normalization="RMSNorm")
    model = GPTModel(tcfg, spec, vocab_size=padded_vocab(cfg, tp),
                     rotary_percent=cfg.get("partial_rotary_factor", 1.0),
                     max_sequence_length=cfg["max_position_embeddings"], pre_process=True,
                     post_process=True, share_embeddings_and_output_weights=False,
                     position_embedding_type="rope", rotary_base=int(cfg["rope_theta"]))
    model = Float16Module(tcfg, model)
    ddp_cfg = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=True,
                                            use_distributed_optimizer=True, bucket_size=BUCKET)
    model = DistributedDataParallel(tcfg, ddp_cfg, model)
    lr = args["lr"]
    ocfg = OptimizerConfig(optimizer="adam", lr=lr, min_lr=lr / 10, weight_decay=0.1,
                           adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8, bf16=True,
                           params_dtype=torch.bfloat16, use_distributed_optimizer=True,
                           clip_grad=1.0)
    if kind == "fused":
        with mcore_shim.inner_adam(FusedAdamLike):
            optimizer = get_megatron_optimizer(ocfg, [model])
    else:
        optimizer = get_megatron_optimizer(ocfg, [model])
    # Warmup then cosine, stepped after the optimizer (megatron/training
    # training.py train_step): each step's lr differs from the last.
    sched = OptimizerParamScheduler(optimizer, init_lr=lr / 10, max_lr=lr, min_lr=lr / 10,
                                    lr_warmup_steps=2, lr_decay_steps=20, lr_decay_style="cosine",
                                    start_wd=0.1, end_wd=0.1, wd_incr_steps=20,
                                    wd_incr_style="constant")
    names = {}
    for n, p in model.named_parameters():
        while n.startswith("module."):
            n = n[len("module."):]
        names[id(p)] = n
    info = {"tp_rank": ps.get_tensor_model_parallel_rank(), "tp": tp,
            "ep_rank": ps.get_expert_model_parallel_rank(), "ep": ep,
            "etp_rank": ps.get_expert_tensor_parallel_rank(),
            "etp": ps.get_expert_tensor_parallel_world_size(),
            "dp_rank": ps.get_data_parallel_rank(), "rank": rank,
            "inner": [type(o.optimizer).__name__
                      for o in getattr(optimizer, "chained_optimizers", [optimizer])]}

    edp_rank = ps.get_expert_data_parallel_rank()

    def report(version, **extra):
        # Megatron's own BF16 params (whole TP-local tensors, all-gathered
        # after each step): one DP replica of each.
        bf16 = [(names[id(p)], p.detach().float().clone()) for p in model.parameters()
                if (edp_rank if is_expert(names[id(p)]) else info["dp_rank"]) == 0]
        # The routers' FP32 expert_bias buffers, which no optimizer holds.
        bufs = []
        for n, b in model.named_buffers():
            if n.endswith(".router.expert_bias"):
                while n.startswith("module."):
                    n = n[len("module."):]
                bufs.append((n, b.detach().float().clone()))
        to_main.put(("version", rank, version, _blob(dict(
            info, shards=_optimizer_shards(optimizer, names), bf16=bf16, buffers=bufs,
            **extra))))

    def wait_go(version):
        msg = from_main.get(timeout=args["go_timeout_s"])
        if msg != ("go", version):
            raise RuntimeError("rank %d: the test process said %r, not go %d"
                               % (rank, msg, version))

    report(0)
    wait_go(0)
    src = Source.megatron_core([model], optimizer, args["sock"], args["job"], args["token"],
                               json.dumps(cfg), tp, dp, rank, ep=ep,
                               etp=info["etp"] if moe and info["etp"] != tp else None,
                               label=args["job"])
    try:
        # One batch per DP rank, every step: the loss must fall.
        g = torch.Generator().manual_seed(4321 + info["dp_rank"])
        tokens = torch.randint(0, cfg["vocab_size"], (MICRO, SEQ + 1), generator=g)
        pos = torch.arange(SEQ).unsqueeze(0).expand(MICRO, SEQ)
        for step in range(args["versions"]):
            model.zero_grad_buffer()
            optimizer.zero_grad()
            loss = model(tokens[:, :-1], pos, None, labels=tokens[:, 1:]).float().mean()
            loss.backward()
            finalize_model_grads([model])
            ok, _norm, _zeros = optimizer.step()
            if not ok:
                raise RuntimeError("rank %d step %d: the optimizer skipped the step" % (rank, step))
            sched.step(increment=1)
            v = step + 1
            pub = src.publish(v)
            report(v, loss=float(loss.detach()), dense=bool(pub["dense"]),
                   changed=int(pub["changed"]))
            wait_go(v)
    finally:
        src.close()
    dist.barrier()
    dist.destroy_process_group()
    to_main.put(("done", rank))


# --------------------------------------------------------- the driver
def run(cfg, sock, job, token, versions, tp, dp, ep, optimizer_kind, on_version=None,
        init_hf=None, lr=1e-5, timeout_s=TIMEOUT_S, go_timeout_s=1800):
    """Train `versions` steps of real megatron-core on tp*dp gloo CPU rank
    processes (127.0.0.1 only), each attached to the dted at `sock` (job,
    token) with Source.megatron_core and publishing every version.

    In this process, after every publish and before the ranks step again,
    on_version(v, hf) gets θ_v: {HF name: FP32 tensor}, the masters the real
    optimizer holds, gathered by to_hf.  init_hf: a directory to write θ_0
    into as an HF checkpoint (write_hf_checkpoint), or a callable given
    θ_0; both before the first step, while the ranks wait (go_timeout_s).
    optimizer_kind: "torch" (megatron's inner torch AdamW, as without
    TE/Apex) or "fused" (FusedAdamLike, as with TE).  lr: the peak of the
    schedule (warmup from lr/10 over 2 steps, then cosine to lr/10; RL
    rates are 1e-7 .. 1e-5).  timeout_s bounds the wait for one version of
    the ranks.

    Returns {"inner": inner optimizer class names, "shards": shards of
    rank 0.., "split": shards that are part of a parameter, "versions":
    [{"v", "loss", "dense" (any rank), "changed" (summed), "bf16_moved"
    (HF elements whose RNE(θ) changed), "bf16_differ" (HF tensors where
    megatron's own BF16 params are not RNE(θ))}]}."""
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    world = tp * dp
    to_main = ctx.Queue()
    from_main = [ctx.Queue() for _ in range(world)]
    args = dict(cfg=cfg, tp=tp, dp=dp, ep=ep, optimizer=optimizer_kind, sock=sock, job=job,
                token=token, versions=versions, go_timeout_s=go_timeout_s, lr=lr)
    store = os.path.join(tempfile.mkdtemp(prefix="dte-mcore-store-"), "store")
    procs = [ctx.Process(target=_rank_main, args=(r, world, store, args, to_main, from_main[r]),
                         name="mcore-rank%d" % r, daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    out = {"versions": []}
    prev = None
    try:
        for v in range(versions + 1):
            got = {}
            deadline = time.monotonic() + (max(timeout_s, START_S) if v == 0 else timeout_s)
            while len(got) < world:
                msg = _get(to_main, deadline, procs, "version %d" % v)
                if msg[0] == "error":
                    raise RuntimeError("rank %d failed: %s" % (msg[1], msg[2]))
                if msg[0] != "version" or msg[2] != v:
                    raise RuntimeError("rank %d sent %r, expected version %d"
                                       % (msg[1], msg[:3], v))
                got[msg[1]] = _unblob(msg[3])
            ranks = [got[r] for r in range(world)]
            hf = to_hf(cfg, ranks)
            # Megatron's own BF16 copy of the masters, converted the same way.
            own = to_hf(cfg, [dict(r, shards=[(n, tuple(t.shape), 0, t.numel(), t.reshape(-1))
                                             for n, t in r["bf16"]]) for r in ranks])
            rne = {n: t.to(torch.bfloat16) for n, t in hf.items()}
            differ = [n for n in hf if not torch.equal(
                rne[n].view(torch.int16), own[n].to(torch.bfloat16).view(torch.int16))]
            if v == 0:
                out["inner"] = [n for r in ranks for n in r["inner"]]
                out["shards"] = sum(len(r["shards"]) for r in ranks)
                out["split"] = sum(1 for r in ranks for _n, sh, lo, hi, _t in r["shards"]
                                   if (lo, hi) != (0, math.prod(sh)))
                out["bf16_differ_0"] = differ
                if isinstance(init_hf, str):
                    write_hf_checkpoint(init_hf, cfg, hf)
                elif init_hf is not None:
                    init_hf(hf)
            else:
                moved = sum(int((rne[n].view(torch.int16) != prev[n].view(torch.int16)).sum())
                            for n in rne)
                out["versions"].append({
                    "v": v, "loss": [r["loss"] for r in ranks],
                    "dense": any(r["dense"] for r in ranks),
                    "changed": sum(r["changed"] for r in ranks), "bf16_moved": moved,
                    "bf16_differ": differ})
                if on_version is not None:
                    on_version(v, hf)
            prev = rne
            for q in from_main:
                q.put(("go", v))
        deadline = time.monotonic() + timeout_s
        done = set()
        while len(done) < world:
            msg = _get(to_main, deadline, procs, "the end")
            if msg[0] == "error":
                raise RuntimeError("rank %d failed: %s" % (msg[1], msg[2]))
            done.add(msg[1])
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(10)
        shutil.rmtree(os.path.dirname(store), ignore_errors=True)
    return out


def _get(q, deadline, procs, what):
    import queue
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            # Where were they?  Every live rank prints its threads' Python
            # stacks (faulthandler, _rank_main) before the test gives up.
            for p in procs:
                if p.exitcode is None and p.pid:
                    try:
                        os.kill(p.pid, signal.SIGABRT)
                    except OSError:
                        pass
            time.sleep(2.0)
            raise RuntimeError("no word from the ranks for %s within the deadline (their "
                               "stacks are above)" % what)
        try:
            return q.get(timeout=min(left, 1.0))
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                # A rank that died without a word (a crash, a kill).
                try:
                    return q.get(timeout=2.0)
                except queue.Empty:
                    raise RuntimeError("rank process %s exited with %s waiting for %s" % (
                        dead[0].name, dead[0].exitcode, what)) from None


# --------------------------------------------------------- the test
def check_checkpoint(c, desc, path, cfg, theta0):
    """write_hf_checkpoint's output: HF Qwen3's names, shapes and config,
    BF16 values RNE(θ_0)."""
    from safetensors.torch import load_file
    got = load_file(os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json")) as f:
        conf = json.load(f)
    shapes = hf_shapes(cfg)
    c.check({n: tuple(t.shape) for n, t in got.items()} == shapes,
            "%s: checkpoint tensors are not HF %s's" % (desc, cfg["model_type"]))
    c.check(all(t.dtype == torch.bfloat16 for t in got.values()),
            "%s: checkpoint is not BF16" % desc)
    c.check(all(torch.equal(got[n].view(torch.int16),
                            theta0[n].to(torch.bfloat16).view(torch.int16))
                for n in shapes if n in got),
            "%s: checkpoint values are not RNE(θ_0)" % desc)
    c.check(conf == cfg and conf["architectures"] == [
        "Qwen3MoeForCausalLM" if cfg["model_type"] == "qwen3_moe" else "Qwen3ForCausalLM"],
        "%s: config.json is not the model's" % desc)


CONFIGS = [
    # (name, model, tp, dp, ep, inner optimizer, peak lr, sink tp, sink ep).  At an RL
    # rate (1e-5) most BF16 weights stay put and must be proven unchanged; at a
    # pretraining rate (1e-3) most move.
    ("dense tp=2", "qwen3", 2, 1, 1, "torch", 1e-5, 2, 1),
    ("dense tp=2", "qwen3", 2, 1, 1, "fused", 1e-3, 1, 1),
    ("dense dp=2", "qwen3", 1, 2, 1, "fused", 1e-5, 2, 1),
    ("moe ep=2", "qwen3_moe", 1, 2, 2, "torch", 1e-5, 2, 2),
    ("moe ep=2", "qwen3_moe", 1, 2, 2, "fused", 1e-5, 2, 1),
    # TP 2 with EP 2 (expert TP 1): sequence parallel, norms summed over TP.
    ("moe tp=2 ep=2", "qwen3_moe", 2, 1, 2, "fused", 1e-5, 2, 2),
    # GLM-4.5 (glm_config): into SGLang-layout engine workers, its routers'
    # FP32 expert_bias as their bits.
    ("glm4_moe ep=2", "glm4_moe", 1, 2, 2, "fused", 1e-5, 2, 2),
    # DeepSeek-V3 (deepseek_config): MLA as the local spec names it, the
    # same router and experts.
    ("deepseek_v3 ep=2", "deepseek_v3", 1, 2, 2, "torch", 1e-5, 2, 2),
]


class FamilySink:
    """GLM-4.5's and DeepSeek-V3's sinks: SGLang-layout engine workers
    (dte.integrations EngineSink, as families_sync.py holds them; of MLA
    a view whose parameters are all it has), the engine's tensors
    allocated as the engine does (its FP32 router tensors FP32) from θ_0,
    checked after every version against families.engine_sink, the
    converter from the engines' module facts, of what they must serve
    (families_sync.served: RNE-BF16 of θ, the FP32 bias as its bits)."""

    def __init__(self, sock, job, cfg, cfg_text, tp, ep):
        from dte import _lib
        import families as fam
        self.fam, self.cfg, self.tp, self.ep = fam, cfg, tp, ep
        self.fp32 = _lib.fp32_tensors(cfg_text)
        self.engine_fp32 = fam.engine_fp32_names(cfg)
        self.att = dict(replica=0, job=job, token="tok", model_config=cfg_text,
                        coordinator="local", socket=sock)
        self.workers, self.params = [], None

    def start(self, hf0):
        """Attach with θ_0 loaded, as an engine started from its checkpoint."""
        import families_sync as fs
        from dte.integrations import _engine
        self.params = fs.engine_params(self.fam, self.cfg, fs.served(hf0, self.fp32), self.tp,
                                       self.ep, False, self.engine_fp32)
        layout = "sglang:tp=%d,ep=%d" % (self.tp, self.ep)
        view = None
        if is_mla(self.cfg):
            class BareWorker(_engine.ComputeView):
                """An engine worker that holds only the parameters: nothing
                is derived from them (no W_UK/W_UV), so it rebuilds all
                there is after every apply (nothing), and says so."""
                rederives = True
            view = BareWorker()
        self.workers = [_engine.EngineSink(self.params[r].items(), r, layout, self.att, view=view)
                        for r in range(self.tp)]

    def apply(self, v, hf):
        import families_sync as fs
        for wk in self.workers:
            wk.stage(v, 60000)
        for wk in self.workers:
            wk.commit(v, 60000)
        return fs.mismatches(self.fam, self.cfg, fs.served(hf, self.fp32), self.tp, self.ep,
                             False, self.params)

    def close(self):
        for wk in self.workers:
            wk.close()


def main():
    harness.asan_reexec()
    from importlib.metadata import version
    from dte import sink as dsink
    from dte.checks import Checks
    import trainers_lib as tl
    mc_version = version("megatron-core")
    ref = tl.layout_reference()
    c = Checks("real-megatron")
    tmp = tempfile.mkdtemp(prefix="dte-real-mcore-")
    # Every version after the first must go sparse (see trainers_mcore.py).
    daemon = harness.Daemon(tmp, "real-mcore", sync_mode="sparse")
    sock = daemon.sock
    versions = exact = 0
    # DTE_REAL_MCORE_ONLY=glm4_moe (a model of CONFIGS): only its configs.
    only = os.environ.get("DTE_REAL_MCORE_ONLY")
    configs = [x for x in CONFIGS if not only or x[1] == only]
    try:
        daemon.start()
        for i, (label, model, tp, dp, ep, kind, lr, stp, sep) in enumerate(configs):
            family = model in FAMILIES
            cfg = {"glm4_moe": glm_config, "deepseek_v3": deepseek_config}.get(
                model, lambda: qwen3_config(model == "qwen3_moe"))()
            cfg_text = json.dumps(cfg)
            job = "real-mcore-%d" % i
            desc = "%s %s lr=%g -> sglang:tp=%d%s" % (label, kind, lr, stp,
                                                     ",ep=%d" % sep if sep > 1 else "")
            t0 = time.time()
            arenas = sink = None
            if family:
                sink = FamilySink(sock, job, cfg, cfg_text, stp, sep)
            else:
                arenas = tl.SglangSinkArenas(cfg_text, stp, sep, label=job + "-sink")
                sink = dsink.Sink(sock, job, "tok", cfg_text, arenas.layout)
                arenas.attach(sink)
            ckpt = os.path.join(tmp, "hf-%d" % i)
            seen = {"n": 0, "exact": 0}
            theta0 = {}

            def init_hf(hf, ckpt=ckpt, cfg=cfg, theta0=theta0, sink=sink, family=family):
                theta0.update(hf)
                if family:
                    sink.start(hf)
                else:
                    write_hf_checkpoint(ckpt, cfg, hf)

            def on_version(v, hf, sink=sink, arenas=arenas, seen=seen, cfg=cfg, stp=stp,
                           sep=sep, desc=desc, family=family):
                seen["n"] += 1
                if family:
                    bad, n = sink.apply(v, hf)
                else:
                    sink.apply(v, timeout_ms=60000)
                    bad, n = tl.sink_mismatches(ref, cfg, arenas, hf, stp, sep)
                seen["exact"] += bad == 0 and n > 0
                c.check(bad == 0 and n > 0, "%s v%d: %d of %d sink elements differ from "
                        "RNE(θ_v)" % (desc, v, bad, n))

            out = {}
            try:
                out = run(cfg, sock, job, "tok", VERSIONS, tp, dp, ep, kind,
                          on_version=on_version, init_hf=init_hf, lr=lr)
            except Exception as e:  # noqa: BLE001 - this config fails, the rest run
                c.check(False, "%s: %s: %s" % (desc, type(e).__name__, e))
            finally:
                sink.close()
                if arenas is not None:
                    arenas.close()
            vs = out.get("versions", [])
            c.check(seen["n"] == len(vs) == VERSIONS, "%s: %d of %d versions" % (
                desc, seen["n"], VERSIONS))
            if out:
                want = "FusedAdamLike" if kind == "fused" else "AdamW"
                c.check(out["inner"] and all(n == want for n in out["inner"]),
                        "%s: inner optimizers %s, want %s" % (desc, out["inner"], want))
                c.check(dp == 1 or out["split"] > 0, "%s: no shard cuts a parameter (%d "
                        "shards): the buckets are too large to test ranges" % (desc, out["shards"]))
                differ = out["bf16_differ_0"] + [n for x in vs for n in x["bf16_differ"]]
                c.check(not differ, "%s: megatron's BF16 params are not RNE of its FP32 "
                        "masters in %s" % (desc, differ[:3]))
                c.check(not any(x["dense"] for x in vs[1:]), "%s: versions %s went dense" % (
                    desc, [x["v"] for x in vs[1:] if x["dense"]]))
                c.check(all(x["bf16_moved"] > 0 and x["changed"] >= 0 for x in vs),
                        "%s: a version moved no BF16 weight: %s" % (
                            desc, [(x["v"], x["bf16_moved"]) for x in vs]))
                loss = [sum(x["loss"]) / len(x["loss"]) for x in vs]
                c.check(loss and loss[-1] < loss[0], "%s: the loss did not fall: %s" % (
                    desc, ["%.3f" % x for x in loss]))
                if c.check(bool(theta0), "%s: no θ_0" % desc) and not family:
                    check_checkpoint(c, desc, ckpt, cfg, theta0)
            versions += seen["n"]
            exact += seen["exact"]
            moved = sum(x["bf16_moved"] for x in vs) // max(1, len(vs))
            sent = sum(x["changed"] for x in vs[1:]) // max(1, len(vs) - 1)
            print("%s %s: versions=%d exact=%d shards=%s split=%s per version: bf16 moved=%d "
                  "sent=%d; loss %s (%.1fs)" % (
                      "ok  " if seen["exact"] == VERSIONS else "FAIL", desc, seen["n"],
                      seen["exact"], out.get("shards"), out.get("split"), moved, sent,
                      "%.3f -> %.3f" % (sum(vs[0]["loss"]) / len(vs[0]["loss"]),
                                        sum(vs[-1]["loss"]) / len(vs[-1]["loss"])) if vs else "-",
                      time.time() - t0), flush=True)
    finally:
        daemon.stop(30)
    ok = c.total > 0 and c.passed == c.total and exact == versions == VERSIONS * len(configs)
    print("real-megatron: megatron-core=%s configs=%d versions=%d exact=%d/%d" % (
        mc_version, len(configs), versions, exact, versions), flush=True)
    if not ok:
        sys.stderr.write(daemon.log_text()[-4000:])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

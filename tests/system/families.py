#!/usr/bin/python3
"""DeepSeek-V3 / Kimi-K2 (MLA) and GLM-4.5 MoE: plans and element-exact maps.

1. `dte-plan` at the real sizes (the published configs in
   tests/data/layout/models, or $DTE_MODELS: deepseek-v3.json,
   kimi-k2.json, glm-4.5.json) from
   megatron:tp=8,dp=2,ep=8,etp=1 to sglang:tp=8,ep=8 and vllm:tp=8,ep=8 must
   say `coverage: exact`.  (etp=1: Megatron-Core's default etp is tp —
   parallel_state.initialize_model_parallel — and ep*etp = 64 does not fit
   16 ranks; the C code refuses that as Megatron does.)
2. At small dims with the real configs' structure (every field the
   engines read, same q_lora/shared/first_k_dense/bias/qk-norm choices;
   plus a q_lora_rank=null DeepSeek-V2-Lite-style variant), every canonical
   element holds its own index; an INDEPENDENT converter below builds, from
   the engines' and Megatron-Core's module definitions (cited per tensor),
   what each Megatron rank's param buffer and each SGLang / vLLM rank's
   parameters hold; the C plan (`--json --dump-entries`) is applied to the
   Megatron buffers and every sink element must equal the converter's, each
   written exactly once (padding never).  The converter reads nothing from
   the C layout code.

Prints `families-plan: deepseek_v3=plan-exact glm4_moe=plan-exact
kimi_k2=plan-exact` and `families-elements: configs=N exact=N/N ...`.
Engine load (the engines' own load_weights) is NOT run here: see
docs/SUPPORTED.md.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import layout_reference as lr  # noqa: E402  (apply_plan, run_plan, flat_buffer, pad_rows)

ROOT = os.path.dirname(os.path.dirname(HERE))
MODELS = os.environ.get("DTE_MODELS", os.path.join(ROOT, "tests", "data", "layout", "models"))
UNSET, SRC_PAD = lr.UNSET, lr.SRC_PAD


# ------------------------------------------------------------- canonical
def is_mla(cfg):
    return cfg["model_type"] in ("deepseek_v3", "kimi_k2")


def moe_layer(cfg, l):
    # vLLM deepseek_v2.py DeepseekV2DecoderLayer: l >= first_k_dense_replace
    # and l % moe_layer_freq == 0; glm4_moe.py: l >= first_k_dense_replace.
    freq = cfg.get("moe_layer_freq", 1) if is_mla(cfg) else 1
    return l >= cfg.get("first_k_dense_replace", 0) and l % freq == 0


def router_bias(cfg):
    return cfg.get("topk_method") == "noaux_tc" if is_mla(cfg) else True


def engine_fp32_names(cfg):
    """The tensors the engines allocate FP32: e_score_correction_bias (vLLM
    0.33 deepseek_v2.py DeepseekV2MoE: float32 with topk_method noaux_tc;
    SGLang 0.5.23 deepseek_v2.py MoEGate correction_bias_dtype), GLM-4.5's
    router weight and bias (SGLang glm4_moe.py Glm4MoeGate, vLLM
    glm4_moe.py Glm4MoE: params_dtype=torch.float32).  DeepSeek's router
    weight is FP32 only with router_fp32 / moe_router_dtype, which the
    published configs do not set."""
    out = set()
    for l in range(cfg["num_hidden_layers"]):
        if not moe_layer(cfg, l):
            continue
        m = "model.layers.%d.mlp.gate." % l
        if router_bias(cfg):
            out.add(m + "e_score_correction_bias")
        if cfg["model_type"] == "glm4_moe" or cfg.get("router_fp32") or cfg.get("moe_router_dtype") == "float32":
            out.add(m + "weight")
    return out


def fp32_names(cfg):
    """Of those, what moves as FP32 bits, a sink holding it as 16-bit
    halves (layout_reference.halves): the bias, an FP32 buffer no optimizer
    steps (HF Glm4MoeTopkRouter / DeepseekV3TopkRouter register_buffer,
    Megatron TopKRouter.expert_bias).  A router weight is a trained
    parameter whose BF16 trainer forward uses RNE-BF16 of its master: BF16,
    widened by the sink into the engine's FP32 parameter."""
    return {n for n in engine_fp32_names(cfg) if n.endswith("e_score_correction_bias")}


def hf_shapes(cfg):
    """The Hugging Face checkpoint's tensors (modeling_deepseek_v3.py /
    modeling_glm4_moe.py names), MTP layers excluded (the engines skip
    them)."""
    H, V, E = cfg["hidden_size"], cfg["vocab_size"], cfg["n_routed_experts"]
    nh = cfg["num_attention_heads"]
    out = [("model.embed_tokens.weight", (V, H))]
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        a = p + "self_attn."
        out.append((p + "input_layernorm.weight", (H,)))
        if is_mla(cfg):
            qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
            qr, kr = cfg["q_lora_rank"], cfg["kv_lora_rank"]
            if qr:
                out += [(a + "q_a_proj.weight", (qr, H)), (a + "q_a_layernorm.weight", (qr,)),
                        (a + "q_b_proj.weight", (nh * qk, qr))]
            else:
                out.append((a + "q_proj.weight", (nh * qk, H)))
            out += [(a + "kv_a_proj_with_mqa.weight", (kr + cfg["qk_rope_head_dim"], H)),
                    (a + "kv_a_layernorm.weight", (kr,)),
                    (a + "kv_b_proj.weight", (nh * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), kr)),
                    (a + "o_proj.weight", (H, nh * cfg["v_head_dim"]))]
        else:
            nkv, hd = cfg["num_key_value_heads"], cfg["head_dim"]
            out += [(a + "q_proj.weight", (nh * hd, H)), (a + "k_proj.weight", (nkv * hd, H)),
                    (a + "v_proj.weight", (nkv * hd, H))]
            if cfg.get("attention_bias"):
                out += [(a + "q_proj.bias", (nh * hd,)), (a + "k_proj.bias", (nkv * hd,)),
                        (a + "v_proj.bias", (nkv * hd,))]
            if cfg.get("use_qk_norm"):
                out += [(a + "q_norm.weight", (hd,)), (a + "k_norm.weight", (hd,))]
            out.append((a + "o_proj.weight", (H, nh * hd)))
        out.append((p + "post_attention_layernorm.weight", (H,)))
        m = p + "mlp."
        if moe_layer(cfg, l):
            Im = cfg["moe_intermediate_size"]
            out.append((m + "gate.weight", (E, H)))
            if router_bias(cfg):
                out.append((m + "gate.e_score_correction_bias", (E,)))
            for e in range(E):
                out += [(m + "experts.%d.gate_proj.weight" % e, (Im, H)),
                        (m + "experts.%d.up_proj.weight" % e, (Im, H)),
                        (m + "experts.%d.down_proj.weight" % e, (H, Im))]
            Is = Im * (cfg.get("n_shared_experts") or 0)
            if Is:
                out += [(m + "shared_experts.gate_proj.weight", (Is, H)),
                        (m + "shared_experts.up_proj.weight", (Is, H)),
                        (m + "shared_experts.down_proj.weight", (H, Is))]
        else:
            I = cfg["intermediate_size"]
            out += [(m + "gate_proj.weight", (I, H)), (m + "up_proj.weight", (I, H)),
                    (m + "down_proj.weight", (H, I))]
    out.append(("model.norm.weight", (H,)))
    out.append(("lm_head.weight", (V, H)))
    return out


def hf_weights(cfg):
    w, base = {}, 0
    for name, shape in hf_shapes(cfg):
        n = math.prod(shape)
        w[name] = torch.arange(base, base + n, dtype=torch.float64).reshape(shape)
        base += n
    return w


# ------------------------------------------------------- SGLang / vLLM sinks
def engine_sink(cfg, w, tp, ep, vllm):
    """{rank: [(parameter name, tensor)]} as the engines' modules hold them
    (tp = attention TP = dense TP; FusedMoE w13 = [w1; w3] per local expert,
    MoE-TP = tp/ep)."""
    H, V, E = cfg["hidden_size"], cfg["vocab_size"], cfg["n_routed_experts"]
    Vp = -(-V // 64) * 64                      # VocabParallelEmbedding pads to 64
    ranks = {}
    for t in range(tp):
        out = [("model.embed_tokens.weight", lr.pad_rows(w["model.embed_tokens.weight"], Vp, UNSET).chunk(tp)[t])]
        for l in range(cfg["num_hidden_layers"]):
            p = "model.layers.%d." % l
            a = p + "self_attn."
            out.append((p + "input_layernorm.weight", w[p + "input_layernorm.weight"]))
            if is_mla(cfg):
                if cfg["q_lora_rank"]:
                    # SGLang: fused_qkv_a_proj_with_mqa = torch.cat([q_a, kv_a])
                    # (deepseek_weight_loader.py do_load_weights, ReplicatedLinear);
                    # vLLM: fused_qkv_a_proj, shards 0/1 (MergedColumnParallelLinear,
                    # disable_tp=True).
                    fused = "fused_qkv_a_proj" if vllm else "fused_qkv_a_proj_with_mqa"
                    out.append((a + fused + ".weight", torch.cat([w[a + "q_a_proj.weight"],
                                                                  w[a + "kv_a_proj_with_mqa.weight"]])))
                    out.append((a + "q_a_layernorm.weight", w[a + "q_a_layernorm.weight"]))
                    out.append((a + "q_b_proj.weight", w[a + "q_b_proj.weight"].chunk(tp)[t]))
                else:
                    out.append((a + "q_proj.weight", w[a + "q_proj.weight"].chunk(tp)[t]))
                    out.append((a + "kv_a_proj_with_mqa.weight", w[a + "kv_a_proj_with_mqa.weight"]))
                out.append((a + "kv_b_proj.weight", w[a + "kv_b_proj.weight"].chunk(tp)[t]))
                out.append((a + "o_proj.weight", w[a + "o_proj.weight"].chunk(tp, dim=1)[t]))
                out.append((a + "kv_a_layernorm.weight", w[a + "kv_a_layernorm.weight"]))
            else:
                nkv, hd = cfg["num_key_value_heads"], cfg["head_dim"]
                kv_ids = [t * nkv // tp] if tp >= nkv else list(range(t * nkv // tp, (t + 1) * nkv // tp))

                def kv(x):
                    return torch.cat([x.reshape(nkv, hd, *x.shape[1:])[i] for i in kv_ids])
                out.append((a + "qkv_proj.weight", torch.cat([w[a + "q_proj.weight"].chunk(tp)[t],
                                                              kv(w[a + "k_proj.weight"]), kv(w[a + "v_proj.weight"])])))
                if cfg.get("attention_bias"):
                    out.append((a + "qkv_proj.bias", torch.cat([w[a + "q_proj.bias"].chunk(tp)[t],
                                                                kv(w[a + "k_proj.bias"]), kv(w[a + "v_proj.bias"])])))
                if cfg.get("use_qk_norm"):
                    out.append((a + "q_norm.weight", w[a + "q_norm.weight"]))
                    out.append((a + "k_norm.weight", w[a + "k_norm.weight"]))
                out.append((a + "o_proj.weight", w[a + "o_proj.weight"].chunk(tp, dim=1)[t]))
            out.append((p + "post_attention_layernorm.weight", w[p + "post_attention_layernorm.weight"]))
            m = p + "mlp."
            if moe_layer(cfg, l):
                mtp, El = tp // ep, E // ep
                ids = range((t // mtp) * El, (t // mtp + 1) * El)
                out.append((m + "gate.weight", w[m + "gate.weight"]))
                if router_bias(cfg):
                    out.append((m + "gate.e_score_correction_bias", w[m + "gate.e_score_correction_bias"]))
                out.append((m + "experts.w13_weight", torch.stack([torch.cat([
                    w[m + "experts.%d.gate_proj.weight" % e].chunk(mtp)[t % mtp],
                    w[m + "experts.%d.up_proj.weight" % e].chunk(mtp)[t % mtp]]) for e in ids])))
                out.append((m + "experts.w2_weight", torch.stack([
                    w[m + "experts.%d.down_proj.weight" % e].chunk(mtp, dim=1)[t % mtp] for e in ids])))
                if m + "shared_experts.gate_proj.weight" in w:
                    s = m + "shared_experts."
                    out.append((s + "gate_up_proj.weight", torch.cat([w[s + "gate_proj.weight"].chunk(tp)[t],
                                                                      w[s + "up_proj.weight"].chunk(tp)[t]])))
                    out.append((s + "down_proj.weight", w[s + "down_proj.weight"].chunk(tp, dim=1)[t]))
            else:
                out.append((m + "gate_up_proj.weight", torch.cat([w[m + "gate_proj.weight"].chunk(tp)[t],
                                                                  w[m + "up_proj.weight"].chunk(tp)[t]])))
                out.append((m + "down_proj.weight", w[m + "down_proj.weight"].chunk(tp, dim=1)[t]))
        out.append(("model.norm.weight", w["model.norm.weight"]))
        out.append(("lm_head.weight", lr.pad_rows(w["lm_head.weight"], Vp, UNSET).chunk(tp)[t]))
        ranks[t] = out
    return ranks


# --------------------------------------------------- Megatron-Core source
def mg_dense(cfg, w, tp, t):
    """Registration order of one TP rank's dense params (TE layer spec;
    multi_latent_attention.py MultiLatentAttention/MLASelfAttention,
    moe_layer.py MoELayer: router, experts, shared_experts), and the
    registered buffers (router.expert_bias) apart."""
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    Vp = -(-V // (128 * tp)) * 128 * tp
    out, bufs = [], []

    def repl(tensor, into=out):
        into.append(tensor if t == 0 else torch.full_like(tensor, SRC_PAD))

    out.append(lr.pad_rows(w["model.embed_tokens.weight"], Vp, SRC_PAD).chunk(tp)[t])
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        a = p + "self_attn."
        if is_mla(cfg):
            repl(w[p + "input_layernorm.weight"])
            out.append(w[a + "o_proj.weight"].chunk(tp, dim=1)[t])                 # linear_proj
            if cfg["q_lora_rank"]:
                repl(w[a + "q_a_proj.weight"])                                        # linear_q_down_proj
                repl(w[a + "q_a_layernorm.weight"])                                   # q_up.layer_norm_weight
                out.append(w[a + "q_b_proj.weight"].chunk(tp)[t])                     # linear_q_up_proj
            else:
                out.append(w[a + "q_proj.weight"].chunk(tp)[t])                       # linear_q_proj
            repl(w[a + "kv_a_proj_with_mqa.weight"])                                  # linear_kv_down_proj
            repl(w[a + "kv_a_layernorm.weight"])                                      # kv_up.layer_norm_weight
            out.append(w[a + "kv_b_proj.weight"].chunk(tp)[t])                        # linear_kv_up_proj
        else:
            nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
            qpg = nh // nkv
            out.append(w[a + "o_proj.weight"].chunk(tp, dim=1)[t])
            repl(w[p + "input_layernorm.weight"])
            q = w[a + "q_proj.weight"].reshape(nkv, qpg * hd, H)
            k = w[a + "k_proj.weight"].reshape(nkv, hd, H)
            v = w[a + "v_proj.weight"].reshape(nkv, hd, H)
            out.append(torch.cat([q, k, v], dim=1).reshape(-1, H).chunk(tp)[t])
            if cfg.get("attention_bias"):
                qb = w[a + "q_proj.bias"].reshape(nkv, qpg * hd)
                kb = w[a + "k_proj.bias"].reshape(nkv, hd)
                vb = w[a + "v_proj.bias"].reshape(nkv, hd)
                out.append(torch.cat([qb, kb, vb], dim=1).reshape(-1).chunk(tp)[t])
            if cfg.get("use_qk_norm"):
                repl(w[a + "q_norm.weight"])
                repl(w[a + "k_norm.weight"])
        m = p + "mlp."
        if moe_layer(cfg, l):
            repl(w[p + "post_attention_layernorm.weight"])                            # pre_mlp_layernorm
            repl(w[m + "gate.weight"])                                                # router.weight
            if router_bias(cfg):
                repl(w[m + "gate.e_score_correction_bias"], bufs)                     # router.expert_bias
            if m + "shared_experts.gate_proj.weight" in w:
                s = m + "shared_experts."
                out.append(torch.cat([w[s + "gate_proj.weight"].chunk(tp)[t], w[s + "up_proj.weight"].chunk(tp)[t]]))
                out.append(w[s + "down_proj.weight"].chunk(tp, dim=1)[t])
        else:
            repl(w[p + "post_attention_layernorm.weight"])                            # fc1.layer_norm_weight
            out.append(torch.cat([w[m + "gate_proj.weight"].chunk(tp)[t], w[m + "up_proj.weight"].chunk(tp)[t]]))
            out.append(w[m + "down_proj.weight"].chunk(tp, dim=1)[t])
    repl(w["model.norm.weight"])
    out.append(lr.pad_rows(w["lm_head.weight"], Vp, SRC_PAD).chunk(tp)[t])
    return [(None, x) for x in out], bufs


def mg_experts(cfg, w, ep, ep_idx, etp, etp_idx):
    El = cfg["n_routed_experts"] // ep
    out = []
    for l in range(cfg["num_hidden_layers"]):
        if not moe_layer(cfg, l):
            continue
        p = "model.layers.%d.mlp.experts." % l
        ids = range(ep_idx * El, (ep_idx + 1) * El)
        for e in ids:
            out.append((None, torch.cat([w[p + "%d.gate_proj.weight" % e].chunk(etp)[etp_idx],
                                         w[p + "%d.up_proj.weight" % e].chunk(etp)[etp_idx]])))
        for e in ids:
            out.append((None, w[p + "%d.down_proj.weight" % e].chunk(etp, dim=1)[etp_idx]))
    return out


def mg_source(cfg, w, tp, dp, ep, etp):
    bufs = {}
    for t in range(tp):
        dense, extra = mg_dense(cfg, w, tp, t)
        flat = lr.flat_buffer(dense, dp)
        shard = len(flat) // dp
        for d in range(dp):
            bufs[(d * tp + t, 0)] = flat[d * shard:(d + 1) * shard]
        if t == 0 and extra:
            bufs[(0, 6)] = np.concatenate([x.reshape(-1).numpy() for x in extra])
    edp = tp * dp // (ep * etp)
    for g in range(ep * etp):
        flat = lr.flat_buffer(mg_experts(cfg, w, ep, g // etp, etp, g % etp), edp)
        shard = len(flat) // edp
        for d in range(edp):
            bufs[(d * ep * etp + g, 3)] = flat[d * shard:(d + 1) * shard]
    return bufs


# ---------------------------------------------------------------- checks
def check(cfg, source, sink):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
        path = f.name
    try:
        plan = lr.run_plan(path, source, sink)
    finally:
        os.unlink(path)
    w = hf_weights(cfg)
    if plan["coverage"] != "exact":
        raise AssertionError("coverage %s" % plan["coverage"])
    if list(w) != plan["tensors"]:
        raise AssertionError("canonical tensor lists differ: %s" %
                             sorted(set(w) ^ set(plan["tensors"]))[:4])
    o = dict(kv.split("=") for kv in source.partition(":")[2].split(","))
    src = mg_source(cfg, w, int(o["tp"]), int(o["dp"]), int(o["ep"]), int(o["etp"]))
    for b in plan["source"]["buffers"]:
        key = (b["rank"], b["id"])
        if key in src and len(src[key]) != b["length"]:
            raise AssertionError("source buffer %r: reference %d elements, plan %d" % (key, len(src[key]), b["length"]))
    kind, _, opts = sink.partition(":")
    o = dict(kv.split("=") for kv in opts.split(","))
    tp, ep = int(o["tp"]), int(o["ep"])
    return lr.compare_sink(plan, src, engine_sink(cfg, w, tp, ep, kind == "vllm"), fp32_names(cfg)), plan


def small(real, **kw):
    """The real config's every field, at small dims."""
    cfg = dict(real)
    cfg.pop("quantization_config", None)
    cfg.update(kw)
    return cfg


def main():
    names = {"deepseek_v3": "deepseek-v3.json", "kimi_k2": "kimi-k2.json", "glm4_moe": "glm-4.5.json"}
    real = {}
    for fam, fn in names.items():
        path = os.path.join(MODELS, fn)
        if not os.path.exists(path):
            print("SKIP: no %s (set DTE_MODELS)" % path)
            return 77
        real[fam] = json.load(open(path))
    ok, status = True, {}
    for fam, fn in sorted(names.items()):
        res = "plan-exact"
        for sink in ("sglang:tp=8,ep=8", "vllm:tp=8,ep=8"):
            cmd = lr.plan_tool() + ["--model", os.path.join(MODELS, fn), "--source",
                                    "megatron:tp=8,dp=2,ep=8,etp=1", "--sink", sink]
            r = subprocess.run(cmd, capture_output=True, text=True)
            exact = r.returncode == 0 and "coverage: exact" in r.stdout.splitlines()
            mla_note = "NOT written" in r.stdout
            if not exact or (mla_note != is_mla(real[fam])):
                res = "FAIL"
                print("FAIL plan %s -> %s: rc=%d %s%s" % (fn, sink, r.returncode, r.stderr.strip(),
                                                          "" if mla_note == is_mla(real[fam]) else " (MLA note wrong)"))
        status[fam] = res
        ok &= res == "plan-exact"
    ds, kimi, glm = real["deepseek_v3"], real["kimi_k2"], real["glm4_moe"]
    mla_dims = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=16, vocab_size=300,
                    q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
    cases = [
        ("deepseek_v3", small(ds, num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=8,
                              num_key_value_heads=8, n_routed_experts=8, **mla_dims)),
        ("kimi_k2", small(kimi, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                          n_routed_experts=8, **mla_dims)),
        ("deepseek_v2lite", small(ds, num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4,
                                  num_key_value_heads=4, n_routed_experts=4, n_shared_experts=2,
                                  **dict(mla_dims, q_lora_rank=None))),
        ("glm4_moe", small(glm, num_hidden_layers=3, first_k_dense_replace=1, hidden_size=64, head_dim=16,
                           num_attention_heads=8, num_key_value_heads=2, intermediate_size=96,
                           moe_intermediate_size=16, n_routed_experts=8, vocab_size=300)),
        ("glm4_moe_qknorm", small(glm, num_hidden_layers=2, first_k_dense_replace=1, hidden_size=64,
                                  head_dim=16, num_attention_heads=4, num_key_value_heads=4,
                                  intermediate_size=96, moe_intermediate_size=16, n_routed_experts=4,
                                  vocab_size=200, use_qk_norm=True)),
    ]
    pairs = [("megatron:tp=2,dp=2,ep=2,etp=1", "sglang:tp=4,ep=2"),
             ("megatron:tp=4,dp=2,ep=4,etp=2", "sglang:tp=2,ep=1"),
             ("megatron:tp=2,dp=1,ep=2,etp=1", "vllm:tp=4,ep=4"),
             ("megatron:tp=1,dp=4,ep=4,etp=1", "vllm:tp=2,ep=1")]
    n = good = elems = 0
    for label, cfg in cases:
        for source, sink in pairs:
            n += 1
            try:
                e, plan = check(cfg, source, sink)
                elems += e
                good += 1
                print("ok   %s %s -> %s" % (label, source, sink))
            except AssertionError as ex:
                ok = False
                print("FAIL %s %s -> %s: %s" % (label, source, sink, ex))
    print("families-plan: " + " ".join("%s=%s" % (k, status[k]) for k in sorted(status)))
    print("families-elements: configs=%d exact=%d/%d sink_elements=%d engine_load=not-run"
          % (n, good, n, elems))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

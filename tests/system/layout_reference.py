#!/usr/bin/python3
"""Element-exact check of the C layout plans against an independent converter.

For small models with the structure of the real ones, this builds the HF
weights with index-encoded values (every canonical element holds its own
global index), converts them the way the trainer and the inference server
store them (Megatron-Core / FSDP2 sources, SGLang / vLLM sinks) with plain
torch tensor ops, then applies the plan the C code computed (`dte-plan --json
--dump-entries`) to the source buffers and compares EVERY sink element with
the reference sink tensors.  Sink padding must stay untouched, and no sink
element may be written twice.
"""
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
B = os.environ.get("B", "build")
DATA = os.path.join(ROOT, "tests", "data", "layout")
UNSET = -1.0      # sink elements nobody writes (padding)
SRC_PAD = -2.0    # source padding: reading it is a bug


def plan_tool():
    for p in (os.path.join(B, "bin", "dtectl"), os.path.join(B, "bin", "dte-plan")):
        if os.access(p, os.X_OK):
            return [p, "plan"] if p.endswith("dtectl") else [p]
    sys.exit("layout: neither dtectl nor dte-plan built under %s" % B)


# ---------------------------------------------------------------- HF weights
def hf_weights(cfg):
    """Canonical tensors, index-encoded, float64 (exact up to 2^53)."""
    H = cfg["hidden_size"]
    nq = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nq)
    hd = cfg.get("head_dim", H // nq)
    V = cfg["vocab_size"]
    mt = cfg["model_type"]
    bias = cfg.get("attention_bias", mt == "qwen2")
    shapes = [("model.embed_tokens.weight", (V, H))]
    moe = mt == "qwen3_moe"
    only = set(cfg.get("mlp_only_layers", []))
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        shapes += [(p + "input_layernorm.weight", (H,)),
                   (p + "self_attn.q_proj.weight", (nq * hd, H)),
                   (p + "self_attn.k_proj.weight", (nkv * hd, H)),
                   (p + "self_attn.v_proj.weight", (nkv * hd, H))]
        if bias:
            shapes += [(p + "self_attn.q_proj.bias", (nq * hd,)),
                       (p + "self_attn.k_proj.bias", (nkv * hd,)),
                       (p + "self_attn.v_proj.bias", (nkv * hd,))]
        if mt.startswith("qwen3"):
            shapes += [(p + "self_attn.q_norm.weight", (hd,)),
                       (p + "self_attn.k_norm.weight", (hd,))]
        shapes += [(p + "self_attn.o_proj.weight", (H, nq * hd)),
                   (p + "post_attention_layernorm.weight", (H,))]
        if moe and l not in only:
            I = cfg["moe_intermediate_size"]
            shapes.append((p + "mlp.gate.weight", (cfg["num_experts"], H)))
            for e in range(cfg["num_experts"]):
                q = p + "mlp.experts.%d." % e
                shapes += [(q + "gate_proj.weight", (I, H)), (q + "up_proj.weight", (I, H)),
                           (q + "down_proj.weight", (H, I))]
        else:
            I = cfg["intermediate_size"]
            shapes += [(p + "mlp.gate_proj.weight", (I, H)), (p + "mlp.up_proj.weight", (I, H)),
                       (p + "mlp.down_proj.weight", (H, I))]
    shapes.append(("model.norm.weight", (H,)))
    if not cfg.get("tie_word_embeddings", False):
        shapes.append(("lm_head.weight", (V, H)))
    w, base = {}, 0
    for name, shape in shapes:
        n = math.prod(shape)
        w[name] = torch.arange(base, base + n, dtype=torch.float64).reshape(shape)
        base += n
    return w


def dims(cfg):
    H = cfg["hidden_size"]
    nq = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nq)
    return H, nq, nkv, cfg.get("head_dim", H // nq)


def pad_rows(t, rows, fill):
    if t.shape[0] == rows:
        return t
    return torch.cat([t, torch.full((rows - t.shape[0],) + tuple(t.shape[1:]), fill, dtype=t.dtype)])


def is_moe_layer(cfg, l):
    return cfg["model_type"] == "qwen3_moe" and l not in set(cfg.get("mlp_only_layers", []))


# ------------------------------------------------------ Megatron-Core source
def megatron_params(cfg, w, tp, t):
    """(name, local tensor or None for a replicated non-source copy) in
    registration order, for the dense buffer of TP rank t."""
    H, nq, nkv, hd = dims(cfg)
    V = cfg["vocab_size"]
    Vp = -(-V // (128 * tp)) * 128 * tp
    out = []

    def repl(name, tensor):
        out.append((name, tensor if t == 0 else torch.full_like(tensor, SRC_PAD)))

    out.append(("embedding", pad_rows(w["model.embed_tokens.weight"], Vp, SRC_PAD).chunk(tp)[t]))
    qpg = nq // nkv
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        out.append(("linear_proj", w[p + "self_attn.o_proj.weight"].chunk(tp, dim=1)[t]))
        repl("qkv.layer_norm", w[p + "input_layernorm.weight"])
        q = w[p + "self_attn.q_proj.weight"].reshape(nkv, qpg * hd, H)
        k = w[p + "self_attn.k_proj.weight"].reshape(nkv, hd, H)
        v = w[p + "self_attn.v_proj.weight"].reshape(nkv, hd, H)
        out.append(("linear_qkv", torch.cat([q, k, v], dim=1).reshape(-1, H).chunk(tp)[t]))
        if p + "self_attn.q_proj.bias" in w:
            qb = w[p + "self_attn.q_proj.bias"].reshape(nkv, qpg * hd)
            kb = w[p + "self_attn.k_proj.bias"].reshape(nkv, hd)
            vb = w[p + "self_attn.v_proj.bias"].reshape(nkv, hd)
            out.append(("linear_qkv.bias", torch.cat([qb, kb, vb], dim=1).reshape(-1).chunk(tp)[t]))
        if p + "self_attn.q_norm.weight" in w:
            repl("q_layernorm", w[p + "self_attn.q_norm.weight"])
            repl("k_layernorm", w[p + "self_attn.k_norm.weight"])
        if is_moe_layer(cfg, l):
            repl("pre_mlp_layernorm", w[p + "post_attention_layernorm.weight"])
            repl("router", w[p + "mlp.gate.weight"])
        else:
            repl("fc1.layer_norm", w[p + "post_attention_layernorm.weight"])
            g = w[p + "mlp.gate_proj.weight"].chunk(tp)[t]
            u = w[p + "mlp.up_proj.weight"].chunk(tp)[t]
            out.append(("linear_fc1", torch.cat([g, u])))
            out.append(("linear_fc2", w[p + "mlp.down_proj.weight"].chunk(tp, dim=1)[t]))
    repl("final_layernorm", w["model.norm.weight"])
    if "lm_head.weight" in w:
        out.append(("output_layer", pad_rows(w["lm_head.weight"], Vp, SRC_PAD).chunk(tp)[t]))
    return out


def megatron_expert_params(cfg, w, ep, ep_idx, etp, etp_idx):
    E = cfg["num_experts"]
    El = E // ep
    out = []
    for l in range(cfg["num_hidden_layers"]):
        if not is_moe_layer(cfg, l):
            continue
        p = "model.layers.%d.mlp.experts." % l
        ids = range(ep_idx * El, (ep_idx + 1) * El)
        for e in ids:
            g = w[p + "%d.gate_proj.weight" % e].chunk(etp)[etp_idx]
            u = w[p + "%d.up_proj.weight" % e].chunk(etp)[etp_idx]
            out.append(("fc1.%d" % e, torch.cat([g, u])))
        for e in ids:
            out.append(("fc2.%d" % e, w[p + "%d.down_proj.weight" % e].chunk(etp, dim=1)[etp_idx]))
    return out


def flat_buffer(params, dp, dopt=True):
    """Megatron's param buffer: reverse registration order; with the
    distributed optimizer starts aligned to 64, end padded to lcm(dp, 128)."""
    chunks, off, align = [], 0, 64 if dopt else 1
    for _, t in reversed(params):
        start = -(-off // align) * align
        if start > off:
            chunks.append(np.full(start - off, SRC_PAD))
        chunks.append(t.reshape(-1).numpy())
        off = start + t.numel()
    pad = dp * 128 // math.gcd(dp, 128) if dopt else 1
    end = -(-off // pad) * pad
    chunks.append(np.full(end - off, SRC_PAD))
    return np.concatenate(chunks)


def megatron_source(cfg, w, tp, dp, ep=1, etp=None, dopt=True):
    """{(rank, buffer id): fp64 array} of param shards (without the
    distributed optimizer: DP rank 0 holds the whole buffer)."""
    etp = etp or tp
    bufs = {}
    for t in range(tp):
        flat = flat_buffer(megatron_params(cfg, w, tp, t), dp, dopt)
        if not dopt:
            bufs[(t, 0)] = flat
            continue
        shard = len(flat) // dp
        for d in range(dp):
            bufs[(d * tp + t, 0)] = flat[d * shard:(d + 1) * shard]
    if cfg["model_type"] == "qwen3_moe":
        edp = tp * dp // (ep * etp)
        for g in range(ep * etp):
            flat = flat_buffer(megatron_expert_params(cfg, w, ep, g // etp, etp, g % etp), edp, dopt)
            if not dopt:
                bufs[(g, 3)] = flat
                continue
            shard = len(flat) // edp
            for d in range(edp):
                bufs[(d * ep * etp + g, 3)] = flat[d * shard:(d + 1) * shard]
    return bufs


def fsdp_source(cfg, w, dp, tensor_ids):
    bufs = {}
    for name, t in w.items():
        for r, piece in enumerate(t.chunk(dp)):
            if piece.numel():
                bufs[(r, 3 * tensor_ids[name])] = piece.reshape(-1).numpy().copy()
    return bufs


# ---------------------------------------------------------- SGLang/vLLM sink
def sglang_sink(cfg, w, tp, ep=1):
    """{rank: [(name, tensor)]} in registration order."""
    H, nq, nkv, hd = dims(cfg)
    V = cfg["vocab_size"]
    Vp = -(-V // 64) * 64
    ranks = {}
    for t in range(tp):
        out = []
        kv_ids = [t * nkv // tp] if tp >= nkv else list(range(t * nkv // tp, (t + 1) * nkv // tp))

        def kv_rows(x):
            return torch.cat([x.reshape(nkv, hd, *x.shape[1:])[i] for i in kv_ids])

        out.append(("model.embed_tokens.weight", pad_rows(w["model.embed_tokens.weight"], Vp, UNSET).chunk(tp)[t]))
        for l in range(cfg["num_hidden_layers"]):
            p = "model.layers.%d." % l
            a = p + "self_attn."
            out.append((p + "input_layernorm.weight", w[p + "input_layernorm.weight"]))
            out.append((a + "qkv_proj.weight", torch.cat([w[a + "q_proj.weight"].chunk(tp)[t],
                                                          kv_rows(w[a + "k_proj.weight"]),
                                                          kv_rows(w[a + "v_proj.weight"])])))
            if a + "q_proj.bias" in w:
                out.append((a + "qkv_proj.bias", torch.cat([w[a + "q_proj.bias"].chunk(tp)[t],
                                                            kv_rows(w[a + "k_proj.bias"]),
                                                            kv_rows(w[a + "v_proj.bias"])])))
            if a + "q_norm.weight" in w:
                out.append((a + "q_norm.weight", w[a + "q_norm.weight"]))
                out.append((a + "k_norm.weight", w[a + "k_norm.weight"]))
            out.append((a + "o_proj.weight", w[a + "o_proj.weight"].chunk(tp, dim=1)[t]))
            out.append((p + "post_attention_layernorm.weight", w[p + "post_attention_layernorm.weight"]))
            m = p + "mlp."
            if is_moe_layer(cfg, l):
                mtp = tp // ep
                E = cfg["num_experts"]
                El = E // ep
                ids = range((t // mtp) * El, (t // mtp + 1) * El)
                out.append((m + "gate.weight", w[m + "gate.weight"]))
                w13 = [torch.cat([w[m + "experts.%d.gate_proj.weight" % e].chunk(mtp)[t % mtp],
                                  w[m + "experts.%d.up_proj.weight" % e].chunk(mtp)[t % mtp]]) for e in ids]
                w2 = [w[m + "experts.%d.down_proj.weight" % e].chunk(mtp, dim=1)[t % mtp] for e in ids]
                out.append((m + "experts.w13_weight", torch.stack(w13)))
                out.append((m + "experts.w2_weight", torch.stack(w2)))
            else:
                out.append((m + "gate_up_proj.weight", torch.cat([w[m + "gate_proj.weight"].chunk(tp)[t],
                                                                  w[m + "up_proj.weight"].chunk(tp)[t]])))
                out.append((m + "down_proj.weight", w[m + "down_proj.weight"].chunk(tp, dim=1)[t]))
        out.append(("model.norm.weight", w["model.norm.weight"]))
        if "lm_head.weight" in w:
            out.append(("lm_head.weight", pad_rows(w["lm_head.weight"], Vp, UNSET).chunk(tp)[t]))
        ranks[t] = out
    return ranks


# ----------------------------------------------------------------- checking
def halves(t):
    """An FP32 tensor as the 16-bit units a sink holds it in: [..., n, 2],
    unit (i, h) = half h of element i, written here as value * 2 + h (so
    each unit of each element is told apart); padding stays UNSET."""
    t = t.to(torch.float64)
    u = torch.stack([t * 2, t * 2 + 1], dim=-1)
    u[t == UNSET] = UNSET
    return u


def apply_plan(plan, src_bufs, sink_shapes, fp32=()):
    """Runs the C plan's box maps: returns {(rank, id): fp64 array} and the
    per-element write counts.  Entries of the tensors named in `fp32` (held
    FP32 by the engines) address 16-bit units of the source's FP32 buffers:
    unit u is half u % 2 of element u // 2, valued as halves() values."""
    got = {k: np.full(n, UNSET) for k, n in sink_shapes.items()}
    writes = {k: np.zeros(n, dtype=np.int32) for k, n in sink_shapes.items()}
    fp32_ids = {i for i, n in enumerate(plan["tensors"]) if n in set(fp32)}
    for e in plan["plan_entries"]:
        ext = e["extent"]
        grids = np.meshgrid(*[np.arange(x, dtype=np.int64) for x in ext], indexing="ij")
        si = e["src_offset"] + sum(g * s for g, s in zip(grids, e["src_stride"]))
        di = e["dst_offset"] + sum(g * s for g, s in zip(grids, e["dst_stride"]))
        src = src_bufs[(e["src_rank"], e["src_buf"])]
        dst = (e["sink_rank"], e["sink_buf"])
        unit = 2 if e["tensor"] in fp32_ids else 1
        if si.min() < 0 or si.max() // unit >= len(src) or di.min() < 0 or di.max() >= len(got[dst]):
            raise AssertionError("entry out of bounds: %r" % e)
        si = si.reshape(-1)
        got[dst][di.reshape(-1)] = src[si] if unit == 1 else src[si // 2] * 2 + si % 2
        np.add.at(writes[dst], di.reshape(-1), 1)
    return got, writes


def run_plan(model, source, sink):
    cmd = plan_tool() + ["--model", model, "--source", source, "--sink", sink, "--json", "--dump-entries"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise AssertionError("%s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
    return json.loads(r.stdout)


def compare_sink(plan, src, ref, fp32=()):
    """Apply `plan` to the source buffers `src` (apply_plan) and compare
    every sink buffer with the reference {rank: [(name, tensor), ...]}:
    names and sizes as the plan's, every mapped element written once and
    equal, padding never written.  A parameter that holds a tensor named
    in `fp32` is an FP32 one: the sink holds its halves().  Returns the
    sink elements (16-bit units) checked."""
    shapes, want = {}, {}
    bufs = {(b["rank"], b["id"]): b for b in plan["sink"]["buffers"]}
    for rank, tensors in ref.items():
        for i, (name, t) in enumerate(tensors):
            if name in fp32:
                t = halves(t)
            b = bufs.get((rank, i))
            if not b or b["name"] != name or b["length"] != t.numel():
                raise AssertionError("sink rank %d buffer %d: reference %s[%d], plan %r" % (rank, i, name, t.numel(), b))
            shapes[(rank, i)] = t.numel()
            want[(rank, i)] = t.reshape(-1).numpy()
    if len(bufs) != len(shapes):
        raise AssertionError("plan has %d sink buffers, reference %d" % (len(bufs), len(shapes)))
    got, writes = apply_plan(plan, src, shapes, fp32)
    for key in shapes:
        name = bufs[key]["name"]
        mapped = want[key] != UNSET
        if (writes[key][mapped] != 1).any() or (writes[key][~mapped] != 0).any():
            raise AssertionError("%s rank %d: elements written %s times" % (name, key[0], sorted(set(writes[key].tolist()))))
        bad = np.nonzero(got[key] != want[key])[0]
        if len(bad):
            raise AssertionError("%s rank %d: %d of %d elements differ (first at %d: got %r want %r)"
                                 % (name, key[0], len(bad), len(want[key]), bad[0], got[key][bad[0]], want[key][bad[0]]))
    return sum(shapes.values())


def check(model, source, sink):
    cfg = json.load(open(model))
    w = hf_weights(cfg)
    plan = run_plan(model, source, sink)
    if plan["coverage"] != "exact":
        raise AssertionError("coverage %s" % plan["coverage"])
    if list(w) != plan["tensors"]:
        raise AssertionError("canonical tensor lists differ")
    kind, _, opts = source.partition(":")
    o = dict(kv.split("=") for kv in opts.split(",") if kv)
    if kind == "megatron":
        src = megatron_source(cfg, w, int(o.get("tp", 1)), int(o.get("dp", 1)), int(o.get("ep", 1)),
                              int(o["etp"]) if "etp" in o else None, o.get("dopt", "1") != "0")
    else:
        src = fsdp_source(cfg, w, int(o["dp"]), {n: i for i, n in enumerate(plan["tensors"])})
    for b in plan["source"]["buffers"]:
        key = (b["rank"], b["id"])
        if key in src and len(src[key]) != b["length"]:
            raise AssertionError("source buffer %r: reference %d elements, plan %d" % (key, len(src[key]), b["length"]))
    kind, _, opts = sink.partition(":")
    o = dict(kv.split("=") for kv in opts.split(",") if kv)
    tp, ep = int(o.get("tp", 1)), int(o.get("ep", 1))
    if kind == "vllm" and ep > 1:
        ep = tp   # vLLM expert parallel spans the whole TP group
    return compare_sink(plan, src, sglang_sink(cfg, w, tp, ep))


CONFIGS = [
    ("tiny-llama-gqa.json", [
        ("megatron:tp=1,dp=1", "sglang:tp=1"),
        ("megatron:tp=2,dp=3", "sglang:tp=2"),
        ("megatron:tp=2,dp=2", "sglang:tp=8"),       # sink TP > KV heads: replicated KV
        ("megatron:tp=1,dp=4", "sglang:tp=4"),
        ("megatron:tp=2,dp=1,dopt=0", "vllm:tp=4"),
        ("fsdp:dp=3", "sglang:tp=2"),
    ]),
    ("tiny-qwen2-bias.json", [
        ("megatron:tp=2,dp=2", "sglang:tp=4"),
        ("megatron:tp=1,dp=3", "sglang:tp=2"),
        ("fsdp:dp=4", "vllm:tp=4"),
    ]),
    ("tiny-qwen3-mqa-tied.json", [
        ("megatron:tp=1,dp=4", "sglang:tp=8"),
        ("megatron:tp=1,dp=2", "sglang:tp=2"),
        ("megatron:tp=2,dp=2", "sglang:tp=4"),       # TP above the one KV group
        ("fsdp:dp=2", "sglang:tp=1"),
    ]),
    ("tiny-qwen3-moe.json", [
        ("megatron:tp=2,dp=2,ep=2,etp=1", "sglang:tp=4,ep=2"),
        ("megatron:tp=1,dp=4,ep=4,etp=1", "sglang:tp=2"),
        ("megatron:tp=2,dp=1", "sglang:tp=4,ep=4"),
        ("megatron:tp=2,dp=4,ep=2,etp=2", "sglang:tp=1"),
        ("megatron:tp=2,dp=2,ep=4,etp=1", "vllm:tp=2,ep=2"),
        ("megatron:tp=2,dp=2,ep=2,dopt=0", "sglang:tp=2,ep=2"),
        ("megatron:tp=4,dp=2,ep=2,etp=1", "sglang:tp=4,ep=2"),  # TP above the 2 KV groups
        ("fsdp:dp=3", "sglang:tp=4,ep=2"),
    ]),
]


def main():
    models = configs = exact = elements = 0
    for model, pairs in CONFIGS:
        models += 1
        for source, sink in pairs:
            configs += 1
            try:
                elements += check(os.path.join(DATA, model), source, sink)
                exact += 1
                print("ok   %s %s -> %s" % (model, source, sink))
            except AssertionError as e:
                print("FAIL %s %s -> %s: %s" % (model, source, sink, e))
    print("layout: models=%d configs=%d exact=%d/%d sink_elements=%d" % (models, configs, exact, configs, elements))
    return 0 if exact == configs else 1


if __name__ == "__main__":
    sys.exit(main())

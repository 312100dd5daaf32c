#!/usr/bin/python3
"""SGLang's and vLLM's OWN weight loaders, run on this CPU, against the
independent converter (tests/system/sglang_reference.py).

For several small Qwen3 shapes and TP sizes (KV heads replicated when
tp > num_key_value_heads, split when fewer; tied and untied heads), this
instantiates, per TP rank, the engine's real parallel layers

  QKVParallelLinear (qkv_proj), RowParallelLinear (o_proj, down_proj),
  MergedColumnParallelLinear (gate_up_proj), VocabParallelEmbedding
  (embed_tokens), ParallelLMHead (lm_head), RMSNorm (norm weights)

with BF16 parameters, feeds them HF tensors (RNE-BF16 of an FP32 θ, as a
trainer publishes) through the layers' own `weight_loader`s exactly as the
model's `load_weights` does (stacked_params_mapping: q/k/v -> qkv_proj with
shard ids "q"/"k"/"v", gate/up -> gate_up_proj with 0/1; everything else
through its parameter's weight_loader or default_weight_loader), and
compares every per-rank parameter bit for bit with
sglang_reference.hf_to_sglang_ranks.  tests/system/engines.py in turn
compares what the dted daemon writes into SGLang- and vLLM-layout sinks
with that same converter after every version, so the chain is:
upstream loaders == reference == dted's sinks.

How a single process stands in for each TP rank, from the upstream code:
- SGLang 0.5.23: python/sglang/srt/runtime_context.py
  ParallelContext.override(**fields) ("state it with
  get_parallel().override(...)"); the layers read the rank through
  layers/linear.py _resolve_linear_group, which, with no process group
  built, returns _LogicalGroup(tp_rank, tp_size) ("own a weight partition
  before distributed communication is initialized"), and
  vocab_parallel_embedding.py VocabParallelEmbedding.__init__ reads
  get_parallel().tp_rank / tp_size.
- vLLM 0.33.0: model_executor/layers/linear.py and
  vocab_parallel_embedding.py read get_tensor_model_parallel_rank() /
  get_tensor_model_parallel_world_size() (vllm/distributed/parallel_state.py)
  in their __init__ and weight_loader; those two names are patched where
  those modules look them up (their module globals).

The upstream packages are installed with --no-deps into a directory of
their own, $DTE_VENV/engines (default /opt/dted-venv/engines; listed in
scripts/venv-engines.txt, installed by scripts/install-deps.sh), with
the imports they need at module load; the only module replaced is
torchvision (PyPI has CUDA builds only, which do not load with the CPU
torch): a stub package that sglang's multimodal config helpers import at
module load and that no weight loader touches, hidden from transformers'
availability probe so transformers behaves as without torchvision.

Qwen3-MoE experts: SGLang's FusedMoE (MoE-TP 2; EP 2) loads each expert through
its weight_loader under a topology published as SGLang's layer tests do, and
w13/w2 per rank must equal tests/system/engines.py's moe_expected, the very
function it checks the daemon's MoE sinks with (read from its source);
vLLM's MoE block (FusedMoEFactory, MoE-TP 2 and expert parallel 2) the same,
loaded through its own MoERunner.load_weights.

Exits 77 (SKIP) when neither engine imports.
"""

import collections
import importlib.abc
import importlib.machinery
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
VENV = os.environ.get("DTE_VENV", "/opt/dted-venv")
# scripts/install-deps.sh installs scripts/venv-engines.txt here (--target).
ENGINES_DIR = os.environ.get("DTE_ENGINES_DIR", os.path.join(VENV, "engines"))


def skip(why):
    print("SKIP: %s" % why)
    sys.exit(77)


def reexec_in_venv():
    py = os.path.join(VENV, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        return
    if not os.access(py, os.X_OK):
        skip("no upstream venv at %s (scripts/install-deps.sh builds it)" % VENV)
    os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])


# ---- the one stub: torchvision ------------------------------------------------------

class _Unusable:
    def __init__(self, *a, **k):
        raise RuntimeError("torchvision is stubbed in engines_upstream.py")


def _stub_attr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (_Unusable,), {})


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = _stub_attr
        return m

    def exec_module(self, module):
        pass


class _StubFinder(importlib.abc.MetaPathFinder):
    """torchvision.* -> empty stub packages, except for transformers'
    availability probe (transformers/utils/import_utils.py
    _is_package_available), which must keep seeing no torchvision."""

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] != "torchvision":
            return None
        f = sys._getframe(1)
        while f is not None:
            if f.f_code.co_filename.endswith(os.path.join("transformers", "utils",
                                                          "import_utils.py")):
                return None
            f = f.f_back
        return importlib.machinery.ModuleSpec(name, _StubLoader(), is_package=True)


# ---- shapes under test ------------------------------------------------------------------

def qwen3_cfg(**kw):
    cfg = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=1, head_dim=32,
               vocab_size=500, tie_word_embeddings=False)
    cfg.update(kw)
    return cfg


# (label, cfg, tp): KV replicated (tp > nKV), KV split (nKV > tp), tied head,
# a vocab that pads (500 -> 512) and one that pads unevenly across 4 ranks.
CASES = [
    ("kv1-tp1", qwen3_cfg(), 1),
    ("kv1-tp2", qwen3_cfg(), 2),
    ("kv1-tp4", qwen3_cfg(), 4),
    ("kv2-tp4", qwen3_cfg(num_key_value_heads=2, num_attention_heads=8, head_dim=16), 4),
    ("kv4-tp2", qwen3_cfg(num_key_value_heads=4, num_attention_heads=8, head_dim=16), 2),
    ("tied-tp2", qwen3_cfg(tie_word_embeddings=True, vocab_size=1000), 2),
    ("v130-tp4", qwen3_cfg(vocab_size=130), 4),
]


def hf_tensors(cfg, seed):
    """FP32 θ in HF names -> {name: BF16 tensor of RNE(θ)}, via the
    reference's integer RNE (no torch cast involved)."""
    import torch
    import sglang_reference as ref
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nH, nKV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    shapes = collections.OrderedDict()
    shapes["model.embed_tokens.weight"] = (V, H)
    for n in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % n
        shapes[p + "input_layernorm.weight"] = (H,)
        shapes[p + "self_attn.q_proj.weight"] = (nH * hd, H)
        shapes[p + "self_attn.k_proj.weight"] = (nKV * hd, H)
        shapes[p + "self_attn.v_proj.weight"] = (nKV * hd, H)
        shapes[p + "self_attn.o_proj.weight"] = (H, nH * hd)
        shapes[p + "self_attn.q_norm.weight"] = (hd,)
        shapes[p + "self_attn.k_norm.weight"] = (hd,)
        shapes[p + "post_attention_layernorm.weight"] = (H,)
        shapes[p + "mlp.gate_proj.weight"] = (I, H)
        shapes[p + "mlp.up_proj.weight"] = (I, H)
        shapes[p + "mlp.down_proj.weight"] = (H, I)
    shapes["model.norm.weight"] = (H,)
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (V, H)
    g = torch.Generator().manual_seed(seed)
    out = collections.OrderedDict()
    for name, shape in shapes.items():
        theta = torch.randn(shape, generator=g, dtype=torch.float32)
        # Every element distinct enough that a misplaced row shows: add the
        # row index so equal-valued blocks cannot mask a wrong offset.
        if len(shape) == 2:
            theta += torch.arange(shape[0], dtype=torch.float32)[:, None] * 1e-2
        out[name] = ref.rne_bf16_bits(theta).view(torch.bfloat16)
    return out


# Model-level mapping from HF names to (module attribute, shard id), as in
# sglang/srt/models/qwen3.py Qwen3ForCausalLM.load_weights
# stacked_params_mapping and vllm/model_executor/models/qwen3.py (via
# qwen2.py Qwen2Model.load_weights): identical in both engines.
STACKED = (("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"),
           ("qkv_proj", "v_proj", "v"), ("gate_up_proj", "gate_proj", 0),
           ("gate_up_proj", "up_proj", 1))


def load_rank(layers, hf, cfg, default_loader):
    """Run the engine's own weight_loaders: HF tensors -> this rank's
    parameters; returns {engine parameter name: int16 bits}."""
    import torch
    params = {}
    for name, w in hf.items():
        target, shard = name, None
        for param_name, shard_name, shard_id in STACKED:
            if "." + shard_name + "." in name:
                target, shard = name.replace(shard_name, param_name), shard_id
                break
        param = layers[target]
        loader = getattr(param, "weight_loader", default_loader)
        if shard is None:
            loader(param, w)
        else:
            loader(param, w, shard)
        params[target] = param
    return collections.OrderedDict(
        (n, p.data.detach().contiguous().view(torch.int16).clone()) for n, p in params.items())


def build_layers(mods, cfg):
    """One rank's engine layers (the current rank is whatever the caller
    put in force): {engine parameter name: torch Parameter}."""
    import torch
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nH, nKV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    dt = torch.bfloat16
    out = {}
    emb = mods.VocabParallelEmbedding(V, H, params_dtype=dt)
    out["model.embed_tokens.weight"] = emb.weight
    for n in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % n
        out[p + "self_attn.qkv_proj.weight"] = mods.qkv(H, hd, nH, nKV, dt).weight
        out[p + "self_attn.o_proj.weight"] = mods.row(nH * hd, H, dt).weight
        out[p + "mlp.gate_up_proj.weight"] = mods.MergedColumnParallelLinear(
            H, [I, I], bias=False, params_dtype=dt).weight
        out[p + "mlp.down_proj.weight"] = mods.RowParallelLinear(
            I, H, bias=False, params_dtype=dt).weight
        for norm, size in (("input_layernorm", H), ("post_attention_layernorm", H),
                           ("self_attn.q_norm", hd), ("self_attn.k_norm", hd)):
            out[p + norm + ".weight"] = mods.norm(size).weight
    out["model.norm.weight"] = mods.norm(H).weight
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = mods.ParallelLMHead(V, H, params_dtype=dt).weight
    return out


def compare(label, engine, got_ranks, want_ranks, lines):
    """Every tensor of every rank, bit for bit; returns (exact, total)."""
    import torch
    exact = total = 0
    for r, (got, want) in enumerate(zip(got_ranks, want_ranks)):
        for name in sorted(set(got) | set(want)):
            total += 1
            if name not in got or name not in want:
                lines.append("%s %s rank %d: %s only in the %s" % (
                    engine, label, r, name, "reference" if name in want else "engine"))
                continue
            g, w = got[name], want[name]
            if tuple(g.shape) != tuple(w.shape):
                lines.append("%s %s rank %d: %s shape %s, reference %s" % (
                    engine, label, r, name, tuple(g.shape), tuple(w.shape)))
                continue
            bad = int((g != w).sum())
            if bad:
                lines.append("%s %s rank %d: %s %d/%d elements differ" % (
                    engine, label, r, name, bad, w.numel()))
                continue
            exact += 1
    if len(got_ranks) != len(want_ranks):
        lines.append("%s %s: %d engine ranks, %d reference ranks" % (
            engine, label, len(got_ranks), len(want_ranks)))
        total += 1
    return exact, total


# ---- SGLang -------------------------------------------------------------------------------

def sglang_engine():
    """-> (version, run(cfg, tp, hf) -> [per rank {name: bits}])."""
    import torch
    import sglang
    from sglang.srt.layers import layernorm, linear, vocab_parallel_embedding as vpe
    from sglang.srt.model_loader.weight_utils import default_weight_loader
    from sglang.srt.runtime_context import get_parallel

    mods = types.SimpleNamespace(
        VocabParallelEmbedding=vpe.VocabParallelEmbedding,
        ParallelLMHead=vpe.ParallelLMHead,
        MergedColumnParallelLinear=linear.MergedColumnParallelLinear,
        RowParallelLinear=linear.RowParallelLinear,
        # sglang/srt/models/qwen3.py Qwen3Attention: qkv_proj and o_proj
        # are built on the attention-TP group (parallel_group="attn_tp").
        qkv=lambda H, hd, nH, nKV, dt: linear.QKVParallelLinear(
            H, hd, nH, nKV, bias=False, params_dtype=dt, parallel_group="attn_tp"),
        row=lambda i, o, dt: linear.RowParallelLinear(
            i, o, bias=False, params_dtype=dt, parallel_group="attn_tp",
            reduce_results=False),
        norm=lambda size: layernorm.RMSNorm(size))

    def run(cfg, tp, hf):
        ranks = []
        old = torch.get_default_dtype()
        # The model loader builds the model under the model dtype
        # (model_loader/utils.py set_default_torch_dtype): norms are BF16.
        torch.set_default_dtype(torch.bfloat16)
        try:
            for r in range(tp):
                with get_parallel().override(tp_rank=r, tp_size=tp, attn_tp_rank=r,
                                             attn_tp_size=tp, attn_dp_size=1,
                                             attn_cp_size=1):
                    layers = build_layers(mods, cfg)
                    ranks.append(load_rank(layers, hf, cfg, default_weight_loader))
        finally:
            torch.set_default_dtype(old)
        return ranks

    return getattr(sglang, "__version__", "?"), run


# ---- MoE: FusedMoE w13/w2 against engines.py's own expectation ---------------------------

def engines_moe_converter():
    """CFG_MOE, hf_moe_shapes and moe_expected exactly as
    tests/system/engines.py defines them (what it checks the daemon's MoE
    sinks against), taken from its source without importing it (importing
    it would start its harness)."""
    import ast
    import torch
    src = open(os.path.join(HERE, "engines.py")).read()
    keep = [n for n in ast.parse(src).body
            if (isinstance(n, ast.FunctionDef) and n.name in ("hf_moe_shapes", "moe_expected"))
            or (isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "CFG_MOE"
                                                   for t in n.targets))]
    if len(keep) != 3:
        raise RuntimeError("engines.py no longer defines CFG_MOE, hf_moe_shapes, moe_expected")
    ns = {"torch": torch}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "engines.py", "exec"), ns)
    return ns["CFG_MOE"], ns["hf_moe_shapes"], ns["moe_expected"]


# (label, tp, ep): MoE-TP 2 (engines.py's SGLang engine) and expert
# parallel 2 within TP 2 (its vLLM engine's vllm:tp=2,ep=2).
MOE_CASES = [("moe-tp2", 2, 1), ("moe-tp2-ep2", 2, 2)]


def sglang_moe(cfg, hf, tp, ep):
    """Per rank {w13/w2 name: bits} through SGLang's FusedMoE.weight_loader.

    The topology is published as SGLang's own layer tests do
    (sglang/test/test_utils.py published_topology: ServerArgs(model_path=
    "dummy", ...) published with SpawnRanks(world_rank=r)); FusedMoE reads
    moe_ep_rank/size and moe_tp_rank/size from it
    (layers/moe/fused_moe_triton/layer.py FusedMoE.__init__).  Expert
    tensors go through FusedMoE.make_expert_params_mapping and
    weight_loader(param, w, name, shard_id=, expert_id=) as
    models/qwen3_moe.py Qwen3MoeForCausalLM.load_weights calls them."""
    import torch
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs
    E, H, Im = cfg["num_experts"], cfg["hidden_size"], cfg["moe_intermediate_size"]
    mapping = FusedMoE.make_expert_params_mapping(
        ckpt_gate_proj_name="gate_proj", ckpt_down_proj_name="down_proj",
        ckpt_up_proj_name="up_proj", num_experts=E)
    ranks = []
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        for r in range(tp):
            reset_context()
            publish(ServerArgs(model_path="dummy", tp_size=tp, ep_size=ep, device="cpu"),
                    role="test", ranks=SpawnRanks(world_rank=r))
            params = {}
            for n in range(cfg["num_hidden_layers"]):
                p = "model.layers.%d.mlp." % n
                moe = FusedMoE(num_experts=E, hidden_size=H, intermediate_size=Im,
                               layer_id=n, top_k=cfg["num_experts_per_tok"],
                               params_dtype=torch.bfloat16, prefix=p + "experts")
                for pn, t in moe.named_parameters():
                    params[p + "experts." + pn] = t
            for name, w in hf.items():
                if ".mlp.experts." not in name:
                    continue
                for param_name, weight_name, expert_id, shard_id in mapping:
                    if weight_name not in name:
                        continue
                    target = name.replace(weight_name, param_name)
                    param = params[target]
                    param.weight_loader(param, w, target, shard_id=shard_id,
                                        expert_id=expert_id)
                    break
                else:
                    raise RuntimeError("no expert mapping for %s" % name)
            ranks.append(collections.OrderedDict(
                (n, t.data.contiguous().view(torch.int16).clone()) for n, t in params.items()))
    finally:
        reset_context()
        torch.set_default_dtype(old)
    return ranks


def vllm_moe_name(name):
    """Where vLLM's model holds an expert tensor the reference names by its
    checkpoint-side module (mlp.experts.w13_weight): MoERunner keeps the
    experts in its child routed_experts (vllm 0.33.0 model_executor/layers/
    fused_moe/runner/moe_runner.py MoERunner.__init__; its load_weights
    reports them as routed_experts.*)."""
    head, _, leaf = name.rpartition(".")
    return head + ".routed_experts." + leaf if head.endswith(".mlp.experts") else name


def moe_compare(engine, run_moe, lines):
    import torch
    import sglang_reference as ref
    cfg, shapes_of, expected = engines_moe_converter()
    rename = vllm_moe_name if engine == "vllm" else (lambda n: n)
    ex = tot = 0
    for seed, (label, tp, ep) in enumerate(MOE_CASES):
        g = torch.Generator().manual_seed(100 + seed)
        hf = collections.OrderedDict(
            (n, ref.rne_bf16_bits(torch.randn(sh, generator=g)).view(torch.bfloat16))
            for n, sh in shapes_of(cfg).items())
        want = [collections.OrderedDict((rename(n), t.view(torch.int16)) for n, t in d.items()
                                        if ".mlp.experts." in n)
                for d in expected(hf, cfg, tp, ep)]
        got = run_moe(cfg, hf, tp, ep)
        e, t = compare(label, engine, got, want, lines)
        ex, tot = ex + e, tot + t
    return ex, tot


# ---- vLLM ---------------------------------------------------------------------------------

def vllm_engine():
    import torch
    import vllm
    from vllm.model_executor.layers import layernorm, linear, vocab_parallel_embedding as vpe
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    from vllm.config import ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    from vllm.model_executor.layers.fused_moe import layer as moe_layer

    # The rank and size every vLLM layer and parameter reads: linear.py,
    # vocab_parallel_embedding.py and parameter.py (BasevLLMParameter
    # .__init__) call get_tensor_model_parallel_rank() /
    # get_tensor_model_parallel_world_size(), imported from
    # vllm/distributed/parallel_state.py.  Each module that holds those
    # functions gets the stand-in, and the two imported here must be among them.
    rank = {"r": 0, "tp": 1}
    originals = {"get_tensor_model_parallel_rank": ("r", ps.get_tensor_model_parallel_rank),
                 "get_tensor_model_parallel_world_size":
                     ("tp", ps.get_tensor_model_parallel_world_size)}
    patched = set()
    for modname, mod in list(sys.modules.items()):
        if not modname.startswith("vllm") or mod is None:
            continue
        for fn, (key, orig) in originals.items():
            if getattr(mod, fn, None) is orig:
                setattr(mod, fn, (lambda k: (lambda *a, **kw: rank[k]))(key))
                patched.add(modname)
    for need in ("layers.linear", "layers.vocab_parallel_embedding", "parameter",
                 "layers.fused_moe.config"):
        if "vllm.model_executor." + need not in patched:
            raise RuntimeError("vllm.model_executor.%s no longer reads "
                               "get_tensor_model_parallel_rank" % need)

    mods = types.SimpleNamespace(
        VocabParallelEmbedding=vpe.VocabParallelEmbedding,
        ParallelLMHead=vpe.ParallelLMHead,
        MergedColumnParallelLinear=linear.MergedColumnParallelLinear,
        RowParallelLinear=linear.RowParallelLinear,
        qkv=lambda H, hd, nH, nKV, dt: linear.QKVParallelLinear(
            H, hd, nH, nKV, bias=False, params_dtype=dt),
        row=lambda i, o, dt: linear.RowParallelLinear(i, o, bias=False, params_dtype=dt,
                                                      reduce_results=False),
        norm=lambda size: layernorm.RMSNorm(size))

    def run(cfg, tp, hf):
        ranks = []
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            # CustomOp layers (RMSNorm) read the current VllmConfig at
            # construction; vLLM's own tests set a default one the same way
            # (tests/conftest.py fixture default_vllm_config).
            with set_current_vllm_config(VllmConfig()):
                for r in range(tp):
                    rank["r"], rank["tp"] = r, tp
                    layers = build_layers(mods, cfg)
                    ranks.append(load_rank(layers, hf, cfg, default_weight_loader))
        finally:
            torch.set_default_dtype(old)
        return ranks

    def run_moe(cfg, hf, tp, ep):
        """Per rank {w13/w2 name: bits} through vLLM's MoE layer as
        models/qwen3_moe.py Qwen3MoeSparseMoeBlock builds it
        (fused_moe/layer.py FusedMoEFactory; expert parallel when
        ParallelConfig.enable_expert_parallel, then ep = tp, MoE-TP 1:
        fused_moe/config.py FusedMoEParallelConfig.make) and loads it
        (AutoWeightsLoader hands the block's expert tensors, named relative
        to it, to runner/moe_runner.py MoERunner.load_weights ->
        routed_experts.py RoutedExperts.load_weights -> weight_loader)."""
        if ep not in (1, tp):
            raise ValueError("vLLM's expert parallel is ep = tp (dp 1), not %d/%d" % (ep, tp))
        E, H, Im = cfg["num_experts"], cfg["hidden_size"], cfg["moe_intermediate_size"]
        ranks = []
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            for r in range(tp):
                rank["r"], rank["tp"] = r, tp
                out = collections.OrderedDict()
                # A fresh VllmConfig per rank: each one is its own process.
                with set_current_vllm_config(VllmConfig(parallel_config=ParallelConfig(
                        enable_expert_parallel=ep > 1))):
                    for n in range(cfg["num_hidden_layers"]):
                        prefix = "model.layers.%d.mlp.experts" % n
                        block = moe_layer.FusedMoEFactory(
                            num_experts=E, top_k=cfg["num_experts_per_tok"], hidden_size=H,
                            intermediate_size=Im, params_dtype=torch.bfloat16,
                            renormalize=True, prefix=prefix,
                            # one engine, no DP/PCP: the sizes its DP and PCP
                            # groups (get_dp_group/get_pcp_group) would report
                            dp_size=1, pcp_size=1)
                        mine = [(name[len(prefix) + 1:], w) for name, w in hf.items()
                                if name.startswith(prefix + ".")]
                        loaded = set(block.load_weights(mine))
                        if not loaded:
                            raise RuntimeError("vLLM loaded nothing into %s" % prefix)
                        for pn, t in block.named_parameters():
                            # the names vLLM's model has (routed_experts.w13_weight),
                            # as they are: the reference names them the same way
                            # (moe_compare, vllm_moe_names)
                            out[prefix + "." + pn] = t.data.contiguous().view(torch.int16).clone()
                ranks.append(out)
        finally:
            torch.set_default_dtype(old)
        return ranks

    run.moe = run_moe
    # For other tests that build vLLM layers per rank (fp8_layout.py):
    # the rank every patched module reads.
    run.set_rank = lambda r, tp: rank.update(r=r, tp=tp)
    return getattr(vllm, "__version__", "?"), run


def main():
    reexec_in_venv()
    # vLLM's own switch for its CPU platform (vllm/platforms/__init__.py
    # cpu_platform_plugin: VLLM_TARGET_DEVICE == "cpu"); the CUDA wheel on a
    # machine without a GPU otherwise infers no device at all.
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    if not os.path.isdir(ENGINES_DIR):
        skip("no %s: scripts/install-deps.sh installs scripts/venv-engines.txt there"
             % ENGINES_DIR)
    sys.path.insert(0, ENGINES_DIR)
    sys.path.insert(0, HERE)
    sys.meta_path.insert(0, _StubFinder())
    import importlib.util
    present = [e for e in ("sglang", "vllm") if importlib.util.find_spec(e) is not None]
    if not present:
        skip("neither sglang nor vllm is installed in %s (scripts/venv-engines.txt)"
             % ENGINES_DIR)
    import torch
    import sglang_reference as ref

    builders = {"sglang": sglang_engine, "vllm": vllm_engine}
    results, problems, versions, moe = {}, [], {}, {}
    moe_runners = {"sglang": sglang_moe}
    for engine in present:
        try:
            versions[engine], run = builders[engine]()
        except Exception as e:  # an import that fails is a failure, not a skip
            problems.append("%s: its weight-loading modules do not import: %s: %s"
                            % (engine, type(e).__name__, e))
            results[engine] = None
            continue
        ex = tot = 0
        for seed, (label, cfg, tp) in enumerate(CASES):
            hf = hf_tensors(cfg, seed)
            want = ref.hf_to_sglang_ranks(
                collections.OrderedDict((n, t.view(torch.int16)) for n, t in hf.items()),
                cfg, tp)
            got = run(cfg, tp, hf)
            e, t = compare(label, engine, got, want, problems)
            ex, tot = ex + e, tot + t
        results[engine] = (ex, tot)
        run_moe = moe_runners.get(engine) or getattr(run, "moe", None)
        if run_moe is not None:
            moe[engine] = moe_compare(engine, run_moe, problems)
    for line in problems[:40]:
        print("MISMATCH " + line)
    parts = []
    for engine in ("sglang", "vllm"):
        if engine in results and results[engine] is None:
            parts.append("%s=IMPORT-FAILED" % engine)
        elif engine in results:
            ex, tot = results[engine]
            parts.append("%s=tensors %d/%d %s" % (engine, ex, tot,
                                                  "exact" if ex == tot else "DIFFER"))
        else:
            parts.append("%s=absent" % engine)
    for engine in ("sglang", "vllm"):
        if engine in moe:
            ex, tot = moe[engine]
            parts.append("%s-moe=tensors %d/%d %s" % (engine, ex, tot,
                                                      "exact" if ex == tot else "DIFFER"))
        elif engine in results:
            parts.append("%s-moe=not-run" % engine)
    print("engines-upstream: %s cases=%d" % (" ".join(parts), len(CASES) + len(MOE_CASES)))
    print("engines-upstream-versions: %s" % " ".join(
        "%s=%s" % kv for kv in sorted(versions.items())))
    counts = list(results.values()) + list(moe.values())
    ok = all(c is not None and c[0] == c[1] > 0 for c in counts)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

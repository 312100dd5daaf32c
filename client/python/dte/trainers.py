"""Walk real trainers' optimizers for the shards they hold.

Source.megatron_core and Source.fsdp2 (dte.source) use these to find, per
shard a rank's optimizer updates, the parameter it belongs to (trainer name,
TP-local shape), the range of its flattened elements, and the three FP32
tensors (θ, exp_avg, exp_avg_sq).  Nothing here knows bucket sizes or
padding: ranges are what the optimizer itself reports.

Upstream versions these were written against: Megatron-LM core_v0.13 ..
main of 2025 (megatron/core/optimizer/distrib_optimizer.py,
optimizer.py, __init__.py), TransformerEngine 2.x
(transformer_engine/pytorch/optimizers/fused_adam.py), PyTorch 2.x FSDP2
(torch/distributed/fsdp/_fully_shard/_fsdp_param.py).
"""

import torch

from .shard import Shard, SourceError, adamw_state, move_to_arena

KINDS = ("theta", "exp_avg", "exp_avg_sq")


def strip_wrappers(name):
    """Megatron model chunks come wrapped (DDP, Float16Module): their
    named_parameters() carry 'module.' prefixes the layout does not."""
    while name.startswith("module."):
        name = name[len("module."):]
    return name


# ---- Megatron-Core -------------------------------------------------------------------

def _inner_optimizers(optimizer):
    """Megatron's optimizers as a flat list: ChainedOptimizer
    (megatron/core/optimizer/optimizer.py, ChainedOptimizer.chained_optimizers:
    the dense and the expert-parallel optimizer) or one."""
    subs = getattr(optimizer, "chained_optimizers", None)
    if subs is not None:
        out = []
        for s in subs:
            out += _inner_optimizers(s)
        return out
    return [optimizer]


def inner_optimizers(optimizer):
    """The Megatron optimizers (not their inner torch optimizers) of a
    ChainedOptimizer or one, skipping stubs."""
    return [o for o in _inner_optimizers(optimizer) if not getattr(o, "is_stub_optimizer", False)]


def is_distributed(optimizer):
    """True when every optimizer of it shards (DistributedOptimizer)."""
    return all(hasattr(o, "_get_model_param_range_map") for o in _inner_optimizers(optimizer))


def is_expert(name):
    """Expert weights (SequentialMLP or TEGroupedMLP): not the router."""
    return ".mlp.experts." in name


def _fused_state(inner, key, kind):
    """TE FusedAdam keeps state per param; with master_weights the FP32
    master is state['master_param'] (fused_adam.py, FusedAdam.initialize_state)."""
    st = inner.state.get(key)
    if not st:
        init = getattr(inner, "initialize_state", None)
        if init is not None:
            init(key, getattr(inner, "store_param_remainders", False) and
                 key.dtype == torch.bfloat16)
        else:
            # torch Adam/AdamW create zero moments and a 0 step on their first
            # step when the state is empty (torch/optim/adamw.py _init_group).
            inner.state[key] = {"step": torch.tensor(0.0),
                                "exp_avg": torch.zeros_like(key, memory_format=torch.preserve_format),
                                "exp_avg_sq": torch.zeros_like(key, memory_format=torch.preserve_format)}
        st = inner.state[key]
    return st.get(kind)


def megatron_core_shards(model_chunks, optimizer, names=None):
    """[(Shard without memory checks yet)] for one rank: every shard the
    optimizer (DistributedOptimizer, ChainedOptimizer of them, or the
    non-distributed Float16OptimizerWithFloat16Params / FP32Optimizer)
    updates on this rank.  Returns [(name, shape, lo, hi, theta, m, v, inner, key)]
    with the tensor objects the optimizer holds (not views of them)."""
    if names is None:
        names = {}
        for chunk in model_chunks:
            for n, p in chunk.named_parameters():
                names[id(p)] = strip_wrappers(n)
    out = []
    for opt in _inner_optimizers(optimizer):
        inner = getattr(opt, "optimizer", None)
        if inner is None:
            raise SourceError("source: %s has no inner optimizer" % type(opt).__name__)
        if getattr(opt, "is_stub_optimizer", False):
            continue
        cfg = getattr(opt, "config", None)
        aware = bool(getattr(cfg, "use_precision_aware_optimizer", False))
        if aware and getattr(inner, "store_param_remainders", False):
            raise SourceError(
                "source: the precision-aware optimizer keeps no FP32 master with "
                "store_param_remainders=True (Megatron --use-precision-aware-optimizer with "
                "OptimizerConfig.store_param_remainders, TE FusedAdam(store_param_remainders"
                "=True)): only BF16 params and 16-bit remainders exist; set "
                "store_param_remainders=False (FP32 master_param in FusedAdam)")
        if hasattr(opt, "_get_model_param_range_map"):
            # DistributedOptimizer (distrib_optimizer.py,
            # _build_model_and_main_param_groups): per group, model params and
            # their shards in the same order; the shard's range in the param is
            # param_range_map[param]["param"] (_build_model_gbuf_param_range_map).
            pairs = []
            for mg, sg, hg in zip(opt.model_float16_groups, opt.shard_fp32_from_float16_groups,
                                  opt.shard_float16_groups):
                for model_p, main_p, half_p in zip(mg, sg, hg):
                    pairs.append((model_p, half_p if aware else main_p, aware))
            for mg, sg in zip(opt.model_fp32_groups, opt.shard_fp32_groups):
                for model_p, main_p in zip(mg, sg):
                    pairs.append((model_p, main_p, False))
            for model_p, key, master in pairs:
                rng = opt._get_model_param_range_map(model_p)["param"]
                out.append(_mc_entry(names, model_p, key, master, inner, rng.start, rng.end))
        elif hasattr(opt, "float16_groups"):
            # Float16OptimizerWithFloat16Params (optimizer.py): whole FP32
            # copies fp32_from_float16_groups, and FP32 params as they are.
            for mg, sg in zip(opt.float16_groups, opt.fp32_from_float16_groups):
                for model_p, main_p in zip(mg, sg):
                    out.append(_mc_entry(names, model_p, main_p, False, inner, 0, model_p.numel()))
            for g in opt.fp32_from_fp32_groups:
                for p in g:
                    out.append(_mc_entry(names, p, p, False, inner, 0, p.numel()))
        else:
            # FP32Optimizer: the inner optimizer steps the model params.
            for g in inner.param_groups:
                for p in g["params"]:
                    out.append(_mc_entry(names, p, p, False, inner, 0, p.numel()))
    return out


def megatron_core_buffers(model_chunks):
    """[(name, shape, 0, n, theta, m, v, None, None)]: the FP32 buffers the
    layout sends as their bits (the MoE routers' expert_bias), which no
    optimizer steps.  TopKRouter registers `expert_bias` as an FP32 buffer
    when moe_router_enable_expert_bias (megatron/core/transformer/moe/
    router.py, TopKRouter.__init__); Float16Module casts it to BF16 with the
    model, and the router's own _maintain_float32_expert_bias makes it FP32
    again (a new tensor) at its first forward, so it is called here first:
    the memory registered is the memory _update_router_expert_bias
    (distributed/finalize_model_grads.py) then copies each update into.
    Every rank holds the same values; the layout takes rank 0's
    (daemon/layout/gen_megatron.c mg_buffers).  Moments: zeros, unread."""
    out = []
    for chunk in model_chunks:
        for mod in chunk.modules():
            keep = getattr(mod, "_maintain_float32_expert_bias", None)
            if keep is not None and getattr(mod, "expert_bias", None) is not None:
                keep()
        for n, b in chunk.named_buffers():
            n = strip_wrappers(n)
            if not n.endswith(".router.expert_bias"):
                continue
            if b.dtype != torch.float32:
                raise SourceError("source: %s is %s; Megatron keeps the routers' expert_bias "
                                  "in FP32" % (n, b.dtype))
            z = torch.zeros(b.numel(), dtype=torch.float32, device=b.device)
            out.append((n, tuple(b.shape), 0, b.numel(), b, z, z.clone(), None, None))
    return out


def _mc_entry(names, model_p, key, master, inner, lo, hi):
    name = names.get(id(model_p))
    if name is None:
        raise SourceError("source: an optimizer parameter of shape %s is in no model chunk"
                          % (tuple(model_p.shape),))
    if master:
        theta = _fused_state(inner, key, "master_param")
        if theta is None:
            raise SourceError("source: %s: the precision-aware optimizer holds no master_param "
                              "(FusedAdam master_weights=False?)" % name)
    else:
        theta = key
    m = _fused_state(inner, key, "exp_avg")
    v = _fused_state(inner, key, "exp_avg_sq")
    for kind, t in (("master weight", theta), ("exp_avg", m), ("exp_avg_sq", v)):
        if t is None or t.dtype != torch.float32:
            raise SourceError("source: %s %s is %s; dted reads FP32 masters and moments "
                              "(FusedAdam exp_avg_dtype/exp_avg_sq_dtype/master_weight_dtype "
                              "must stay float32)" % (name, kind, None if t is None else t.dtype))
    return (name, tuple(model_p.shape), lo, hi, theta, m, v, inner, key)


# ---- FSDP2 ---------------------------------------------------------------------------

def _fsdp_params(model):
    """FSDPParam objects of every fully_shard'ed module (torch/distributed/fsdp/
    _fully_shard/_fsdp_state.py, FSDPState._fsdp_param_group.fsdp_params)."""
    out = []
    for mod in model.modules():
        get = getattr(mod, "_get_fsdp_state", None)
        if get is None:
            continue
        group = get()._fsdp_param_group
        if group is not None:
            out += list(group.fsdp_params)
    return out


def fsdp2_shards(model, optimizer, label, host_arenas):
    """[(name, global shape, lo, hi, theta, m, v, optimizer, param)] of this
    rank's local shards.  FSDP2 shards dim 0 with torch.chunk semantics, so
    a local shard is the contiguous flat range starting at its global row
    offset (torch.distributed.tensor._utils.compute_local_shape_and_global_offset).
    CPU: the local shards and the optimizer states are moved into memfd
    arenas (appended to host_arenas) and FSDP2's own references rebound."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    names = {id(p): n for n, p in model.named_parameters()}
    fparams = {id(fp.sharded_param): fp for fp in _fsdp_params(model)}
    entries = []
    for g in optimizer.param_groups:
        for p in g["params"]:
            if id(p) not in names:
                raise SourceError("source: the optimizer steps a tensor that is not a parameter "
                                  "of the model")
            st = adamw_state(optimizer, g, p)
            entries.append((names[id(p)], p, st))
    if not entries:
        raise SourceError("source: the optimizer holds no parameters")
    host = [e for e in entries if not e[1].is_cuda]
    if host:
        _fsdp2_to_host_arenas(host, fparams, label, host_arenas, DTensor)
    out = []
    for name, p, st in entries:
        if isinstance(p, DTensor):
            local = p._local_tensor
            shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh,
                                                                  p.placements)
            if tuple(shape) != tuple(local.shape):
                raise SourceError("source: %s: local shard %s, DTensor says %s" % (
                    name, tuple(local.shape), tuple(shape)))
            if any(offset[d] for d in range(1, len(offset))):
                raise SourceError("source: %s is not sharded on dim 0 (placements %s)"
                                  % (name, p.placements))
            if local.numel() == 0:
                continue
            inner = local.numel() // local.shape[0]
            lo = offset[0] * inner
            m, v = st["exp_avg"]._local_tensor, st["exp_avg_sq"]._local_tensor
        else:
            local, lo, m, v = p.detach(), 0, st["exp_avg"], st["exp_avg_sq"]
        out.append((name, tuple(p.shape), lo, lo + local.numel(), local.view(-1), m.view(-1),
                    v.view(-1), optimizer, p))
    return out


def _fsdp2_to_host_arenas(entries, fparams, label, host_arenas, DTensor):
    """FSDP2 keeps each sharded parameter as a padded flat buffer
    (FSDPParam._sharded_param_data) whose first elements the DTensor's local
    tensor views (_fsdp_param.py, FSDPParam._init_sharded_param and
    reset_sharded_param).  Both are rebound to one memfd arena, values kept,
    so all-gathers read and the optimizer writes the memory dted maps."""
    flats = []
    for name, p, _st in entries:
        fp = fparams.get(id(p))
        if fp is None and isinstance(p, DTensor):
            raise SourceError("source: %s is a DTensor that no fully_shard module owns" % name)
        if fp is not None:
            flats.append((name, fp._sharded_param_data))
    arena = move_to_arena(label + "-param", [(n, t.detach()) for n, t in flats])
    host_arenas.append(arena)
    for i, (name, _t) in enumerate(flats):
        fp = fparams[id(next(p for n, p, _ in entries if n == name))]
        flat = arena.tensor(str(i))
        local = fp.sharded_param._local_tensor
        n = local.numel()
        fp._sharded_param_data = flat
        local.data = flat[:n].view(local.shape)
        if local.data_ptr() != flat.data_ptr() and n:
            raise SourceError("source: %s: FSDP2's local shard did not follow its flat buffer" % name)
    plain = [(n, p) for n, p, _ in entries if id(p) not in fparams]
    if plain:
        host_arenas.append(move_to_arena(label + "-plain", plain))
    for kind in ("exp_avg", "exp_avg_sq"):
        ts = []
        for name, _p, st in entries:
            t = st[kind]
            ts.append((name, t._local_tensor if isinstance(t, DTensor) else t))
        host_arenas.append(move_to_arena("%s-%s" % (label, kind), ts))


def megatron_core_to_host(entries, label, host_arenas):
    """CPU: θ, m, v of every entry into memfd arenas (rebinding the objects
    the optimizer holds).  A θ that is a view of a model parameter (FP32
    model params under the distributed optimizer: shard_fp32_groups are
    views of the param buffer) cannot move without splitting it from the
    model, so it is refused."""
    for e in entries:
        if e[4]._base is not None:
            raise SourceError("source: %s: its FP32 master is a view of the model's buffer; "
                              "on the host path register a BF16 model (FP32 params are "
                              "supported on CUDA)" % e[0])
    for i, kind in enumerate(KINDS):
        host_arenas.append(move_to_arena("%s-%s" % (label, kind),
                                         [(e[0], e[4 + i]) for e in entries]))

"""A CPU model of Megatron-Core's optimizer memory, from upstream facts.

Used by trainers_mcore.py.  Nothing here comes from dted's layout code;
each fact names the upstream place it comes from (Megatron-LM
megatron/core, core_v0.13 .. 0.16):

- param_and_grad_buffer.py, _ParamAndGradBuffer.__init__: parameters are
  laid out in reverse registration order; with the distributed optimizer
  each param start is padded to a multiple of 64 and each bucket end to
  lcm(dp, 128); a bucket closes once it holds bucket_size elements.
- distrib_optimizer.py, _build_model_gbuf_range: every bucket is cut into
  dp equal ranges, DP rank d owns range d of every bucket; a parameter's
  shard is the part of it inside that range, param_range_map[p]["param"]
  (_build_model_gbuf_param_range_map).
- distrib_optimizer.py, _build_model_and_main_param_groups: one FP32
  allocation per shard (shard_model_param.clone().float()), in
  model_float16_groups / shard_fp32_from_float16_groups; the inner
  optimizer's param groups hold the shards.
- transformer_engine/pytorch/optimizers/fused_adam.py, FusedAdam.step:
  group["step"] += 1 per group with params, params whose grad is None are
  skipped, state (exp_avg, exp_avg_sq) created at the first step;
  adam_w_mode update in FP32 in the kernel's order.
- optimizer/__init__.py, _get_param_groups: groups by (no weight decay for
  1-D params and biases, lr multiplier, decoupled lr for embedding and
  output layer, expert-parallel or not); expert-parallel params (ep > 1)
  have their own buffer and their own DistributedOptimizer, joined in a
  ChainedOptimizer (optimizer.py); with ep = 1 they sit in the dense buffer.
- MoE: SequentialMLP names experts local_experts.{i}.linear_fc1.weight
  (registered expert by expert), TEGroupedMLP linear_fc1.weight{i}
  (all fc1, then all fc2) (transformer/moe/experts.py).

When megatron-core (pinned in scripts/venv-nodeps.txt) imports, the bucket
layout and shard ranges are also computed by its own code
(upstream_layout) and must agree with this model.
"""

import collections
import math
import types

import torch

PAD = -1.0


class Range:
    def __init__(self, start, end):
        self.start, self.end, self.size = start, end, end - start


# ------------------------------------------------- TP-local parameters
def _pad_rows(t, rows):
    if t.shape[0] >= rows:
        return t
    return torch.cat([t, torch.full((rows - t.shape[0],) + tuple(t.shape[1:]), PAD,
                                    dtype=t.dtype)])


def local_params(cfg, w, tp, t, vp, ep_idx, ep, etp_idx, etp, naming):
    """[(name, index tensor)] of one rank in registration order: dense params
    of TP rank t, experts of (ep_idx, etp_idx).  w: index-encoded HF tensors
    (layout_reference.hf_weights).  vp: the padded vocab (all TP ranks)."""
    H, nq = cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", H // nq)
    qpg = nq // nkv
    moe = cfg["model_type"] == "qwen3_moe"
    only = set(cfg.get("mlp_only_layers", []))
    out = []
    dense, experts = [], []
    dense.append(("embedding.word_embeddings.weight",
                  _pad_rows(w["model.embed_tokens.weight"], vp).chunk(tp)[t]))
    for l in range(cfg["num_hidden_layers"]):
        p, h = "decoder.layers.%d." % l, "model.layers.%d." % l
        a = p + "self_attention."
        dense.append((a + "linear_proj.weight", w[h + "self_attn.o_proj.weight"].chunk(tp, 1)[t]))
        dense.append((a + "linear_qkv.layer_norm_weight", w[h + "input_layernorm.weight"]))
        q = w[h + "self_attn.q_proj.weight"].reshape(nkv, qpg * hd, H)
        k = w[h + "self_attn.k_proj.weight"].reshape(nkv, hd, H)
        v = w[h + "self_attn.v_proj.weight"].reshape(nkv, hd, H)
        dense.append((a + "linear_qkv.weight", torch.cat([q, k, v], 1).reshape(-1, H).chunk(tp)[t]))
        if h + "self_attn.q_norm.weight" in w:
            dense.append((a + "q_layernorm.weight", w[h + "self_attn.q_norm.weight"]))
            dense.append((a + "k_layernorm.weight", w[h + "self_attn.k_norm.weight"]))
        m = p + "mlp."
        if moe and l not in only:
            dense.append((p + "pre_mlp_layernorm.weight", w[h + "post_attention_layernorm.weight"]))
            dense.append((m + "router.weight", w[h + "mlp.gate.weight"]))
            E = cfg["num_experts"]
            El = E // ep
            ids = list(range(ep_idx * El, (ep_idx + 1) * El))
            fc1 = [torch.cat([w[h + "mlp.experts.%d.gate_proj.weight" % e].chunk(etp)[etp_idx],
                              w[h + "mlp.experts.%d.up_proj.weight" % e].chunk(etp)[etp_idx]])
                   for e in ids]
            fc2 = [w[h + "mlp.experts.%d.down_proj.weight" % e].chunk(etp, 1)[etp_idx] for e in ids]
            if naming == "grouped":
                experts += [(m + "experts.linear_fc1.weight%d" % i, x) for i, x in enumerate(fc1)]
                experts += [(m + "experts.linear_fc2.weight%d" % i, x) for i, x in enumerate(fc2)]
            else:
                for i in range(El):
                    experts.append((m + "experts.local_experts.%d.linear_fc1.weight" % i, fc1[i]))
                    experts.append((m + "experts.local_experts.%d.linear_fc2.weight" % i, fc2[i]))
        else:
            dense.append((m + "linear_fc1.layer_norm_weight", w[h + "post_attention_layernorm.weight"]))
            I = cfg["intermediate_size"]
            dense.append((m + "linear_fc1.weight",
                          torch.cat([w[h + "mlp.gate_proj.weight"].chunk(tp)[t],
                                     w[h + "mlp.up_proj.weight"].chunk(tp)[t]])))
            dense.append((m + "linear_fc2.weight", w[h + "mlp.down_proj.weight"].chunk(tp, 1)[t]))
            del I
    dense.append(("decoder.final_layernorm.weight", w["model.norm.weight"]))
    if "lm_head.weight" in w:
        dense.append(("output_layer.weight", _pad_rows(w["lm_head.weight"], vp).chunk(tp)[t]))
    out = [(n, x.contiguous()) for n, x in dense], [(n, x.contiguous()) for n, x in experts]
    return out


def replicated(name):
    return name.endswith("layer_norm_weight") or name.endswith("layernorm.weight") or \
        name.endswith("router.weight")


# ------------------------------------------------- buffer layout (facts)
def buffer_layout(numels, dp, bucket_size):
    """numels: [(name, numel)] in registration order.  Returns
    ({name: (start, end)}, [(bucket start, bucket end)])."""
    def pad(n, d):
        return -(-n // d) * d
    index, buckets = {}, []
    start = bstart = 0
    end = 0
    open_bucket = False
    for name, n in reversed(numels):
        start = pad(start, 64)
        end = start + n
        index[name] = (start, end)
        open_bucket = True
        if bucket_size is not None and end - bstart >= bucket_size:
            bend = pad(end, math.lcm(dp, 128))
            buckets.append((bstart, bend))
            bstart = start = bend
            open_bucket = False
        else:
            start = end
    if open_bucket:
        buckets.append((bstart, pad(end, math.lcm(dp, 128))))
    return index, buckets


def shard_ranges(index, buckets, dp, d):
    """{name: Range in the param} of DP rank d."""
    out = {}
    for bs, be in buckets:
        per = (be - bs) // dp
        lo, hi = bs + d * per, bs + (d + 1) * per
        for name, (s, e) in index.items():
            a, b = max(s, lo), min(e, hi)
            if a < b:
                if name in out:
                    raise AssertionError("%s in two buckets" % name)
                out[name] = Range(a - s, b - s)
    return out


# ------------------------------------------ the same through megatron-core
def upstream_available():
    try:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBuffer  # noqa
            from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer  # noqa
        return True
    except Exception:
        return False


def upstream_layout(numels, dp, d, bucket_size):
    """megatron-core's own _ParamAndGradBuffer layout (its __init__ up to
    the device allocation, which needs CUDA) and DistributedOptimizer.
    _build_model_gbuf_range for DP rank d.  Returns {name: Range}."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBuffer
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    params = [torch.nn.Parameter(torch.empty(n, dtype=torch.bfloat16)) for _, n in numels]
    names = {p: n for p, (n, _) in zip(params, numels)}
    group = types.SimpleNamespace(size=lambda: dp, rank=lambda: d)
    pgc = types.SimpleNamespace(tp=group, dp_cp=group)
    buf = _ParamAndGradBuffer.__new__(_ParamAndGradBuffer)
    cfg = DistributedDataParallelConfig(use_distributed_optimizer=True)
    try:
        buf.__init__(cfg, torch.bfloat16, torch.float32, params, group, bucket_size, names, 1.0,
                     list(range(len(params))), False, pgc)
    except (AssertionError, RuntimeError, AttributeError, TypeError):
        # The layout is computed; what fails is allocating on the GPU.
        if not getattr(buf, "param_index_map", None) or not getattr(buf, "bucket_indices", None):
            raise
    fake = types.SimpleNamespace(
        data_parallel_group=group, param_index_map=buf.param_index_map,
        buckets=[types.SimpleNamespace(grad_data=torch.empty(e - s, dtype=torch.uint8), offset=s)
                 for s, e in buf.bucket_indices])
    out = {}
    for bi in range(len(fake.buckets)):
        rng = DistributedOptimizer._build_model_gbuf_range(fake, bi)
        for p, r in rng["param_map"].items():
            out[names[p]] = Range(r["param"].start, r["param"].end)
    return out, {names[p]: v[:2] for p, v in buf.param_index_map.items()}, list(buf.bucket_indices)


# ------------------------------------------------- FusedAdam on the CPU
class FusedAdamCPU(torch.optim.Optimizer):
    """TE FusedAdam's semantics on the CPU (fused_adam.py, FusedAdam):
    defaults lr, bias_correction, betas, eps, weight_decay; adam_w_mode;
    group['step'] per group; grad None skipped; FP32 math in the
    multi-tensor kernel's order (decoupled decay folded into the update)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 master_weights=False, store_param_remainders=False, use_decoupled_grad=False):
        super().__init__(params, dict(lr=lr, bias_correction=True, betas=betas, eps=eps,
                                      weight_decay=weight_decay))
        self.adam_w_mode = 1
        self.master_weights = master_weights
        self.capturable = False
        self.use_decoupled_grad = use_decoupled_grad
        # FusedAdam.__init__: remainders only with FP32 masters of BF16 params.
        self.store_param_remainders = store_param_remainders and master_weights

    def initialize_state(self, p, store_param_remainders=False):
        self.state[p]["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
        self.state[p]["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
        if self.master_weights:
            # FusedAdam.initialize_state: the FP32 master (or int16 remainders).
            self.state[p]["master_param"] = torch.zeros_like(p, dtype=torch.int16) \
                if store_param_remainders else p.detach().clone().float()

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            if not g["params"]:
                continue
            g["step"] = g.get("step", 0) + 1
            b1, b2 = g["betas"]
            t = g["step"]
            bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
            for p in g["params"]:
                if not self.state[p]:
                    self.initialize_state(p, self.store_param_remainders)
                grad = getattr(p, "decoupled_grad", None) if self.use_decoupled_grad else p.grad
                if grad is None:
                    continue
                st = self.state[p]
                m, v = st["exp_avg"], st["exp_avg_sq"]
                w = st["master_param"] if self.master_weights else p
                m.mul_(b1).add_(grad * (1 - b1))
                v.mul_(b2).add_(grad * grad * (1 - b2))
                denom = (v / bc2).sqrt() + g["eps"]
                update = (m / bc1) / denom + w * g["weight_decay"]
                w.sub_(update * g["lr"])
                if self.master_weights:
                    p.copy_(w)          # the BF16 param from its FP32 master


# ------------------------------------------------- one rank's optimizer
class CpuDistOpt:
    """The DistributedOptimizer attributes Source.megatron_core reads."""

    def __init__(self, model_params, ranges, groups_of, inner_cls, hp, aware=False):
        # use_precision_aware_optimizer: the inner optimizer gets the BF16
        # shards and holds the FP32 masters itself (distrib_optimizer.py,
        # _build_model_and_main_param_groups: shard_main_param = None).
        self.config = types.SimpleNamespace(use_precision_aware_optimizer=aware)
        self.aware = aware
        self._ranges = {}
        ngroups = max(groups_of.values()) + 1 if groups_of else 0
        self.model_float16_groups = [[] for _ in range(ngroups)]
        self.shard_float16_groups = [[] for _ in range(ngroups)]
        self.shard_fp32_from_float16_groups = [[] for _ in range(ngroups)]
        self.model_fp32_groups = [[] for _ in range(ngroups)]
        self.shard_fp32_groups = [[] for _ in range(ngroups)]
        self.main_of = {}
        for name, p in model_params.items():
            r = ranges.get(name)
            if r is None:
                continue
            gi = groups_of[name]
            shard_model = p.detach().view(-1)[r.start:r.end]
            main = None if aware else shard_model.clone().float()   # one allocation per shard
            self._ranges[id(p)] = {"param": r}
            self.model_float16_groups[gi].append(p)
            self.shard_float16_groups[gi].append(shard_model)
            self.shard_fp32_from_float16_groups[gi].append(main)
            self.main_of[name] = shard_model if aware else main
        groups = []
        for gi in range(ngroups):
            d = dict(hp[gi])
            d["params"] = list(self.shard_float16_groups[gi] if aware
                               else self.shard_fp32_from_float16_groups[gi])
            groups.append(d)
        self.optimizer = inner_cls(groups)

    def master(self, name):
        """The FP32 values the optimizer updates for `name`'s shard."""
        t = self.main_of[name]
        if self.aware:
            st = self.optimizer.state[t]
            if not st:
                self.optimizer.initialize_state(t, self.optimizer.store_param_remainders)
            return st["master_param"]
        return t

    def _get_model_param_range_map(self, p):
        return self._ranges[id(p)]

    def step(self):
        self.optimizer.step()


class CpuChained:
    """ChainedOptimizer (optimizer.py): the dense and the expert optimizer."""

    def __init__(self, opts):
        self.chained_optimizers = opts

    def step(self):
        for o in self.chained_optimizers:
            o.step()


def module_of(named):
    """An nn.Module whose named_parameters() are `named`, under a
    DDP-like 'module.' wrapper."""
    nn = torch.nn

    class Node(nn.Module):
        pass

    root = Node()
    inner = Node()
    root.add_module("module", inner)
    for name, p in named.items():
        mod = inner
        parts = name.split(".")
        for q in parts[:-1]:
            if not hasattr(mod, q):
                mod.add_module(q, Node())
            mod = getattr(mod, q)
        mod.register_parameter(parts[-1], p)
    return root


def param_group_index(name, is_expert):
    """Megatron-like groups (_get_param_groups): (no_wd, lr_mult,
    decoupled); the caller gives each its own hyper-parameters."""
    if name.endswith("embedding.word_embeddings.weight") or name.endswith("output_layer.weight"):
        return 2                 # --decoupled-lr
    if name.endswith("router.weight"):
        return 3                 # an lr multiplier group
    if name.endswith("bias") or "norm" in name:
        return 1                 # no weight decay
    return 0


__all__ = ["Range", "local_params", "buffer_layout", "shard_ranges", "upstream_available",
           "upstream_layout", "FusedAdamCPU", "CpuDistOpt", "CpuChained", "module_of",
           "param_group_index", "replicated", "collections"]

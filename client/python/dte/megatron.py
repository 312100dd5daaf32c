"""Trainer side: a Qwen3 model in the Megatron-Core tensor-parallel layout.

TP is simulated inside one process: for each TP rank r the model holds
exactly the shards Megatron-Core (TransformerEngine spec, qk_layernorm) would
hold on rank r, under Megatron's names, and the forward does what the ranks
do together: column-parallel outputs are concatenated, row-parallel partial
sums are added (the all-reduce), padded vocab logits are dropped.

Every FP32 master weight and both AdamW moments live in shared memory: per
rank, three arenas (params, exp_avg, exp_avg_sq) with identical layouts, so a
source piece's one mapping addresses all three (DESIGN.md §3).

Replicated parameters (all norms) exist once per rank, as in Megatron.  Their
gradients are summed across ranks before the optimizer step (Megatron's
all-reduce of layernorm grads), so every rank's copy receives the same
update and the copies stay bit-identical; the layout treats rank 0 as the
source of replicated elements.
"""

import collections
import json

import torch

from . import qwen3
from .shm import Arena

VOCAB_DIVISIBLE_BY = 128  # Megatron's --make-vocab-size-divisible-by default


def padded_vocab(vocab_size, tp):
    """Megatron pads the vocab to a multiple of 128 * TP."""
    mult = VOCAB_DIVISIBLE_BY * tp
    return (vocab_size + mult - 1) // mult * mult


def check_tp(cfg, tp):
    if not isinstance(tp, int) or tp < 1:
        raise ValueError("megatron: tp must be a positive int")
    for key in ("num_key_value_heads", "intermediate_size"):
        if cfg[key] % tp:
            raise ValueError("megatron: %s=%d is not divisible by tp=%d"
                             % (key, cfg[key], tp))


def shard_shapes(cfg, tp):
    """{megatron_name: per-rank shape}; every rank has the same shapes."""
    cfg = qwen3.make_config(cfg)
    check_tp(cfg, tp)
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    nH, nKV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    qpg = nH // nKV
    Vp = padded_vocab(cfg["vocab_size"], tp)
    s = collections.OrderedDict()
    s["embedding.word_embeddings.weight"] = (Vp // tp, H)
    for n in range(cfg["num_hidden_layers"]):
        p = "decoder.layers.%d." % n
        s[p + "self_attention.linear_qkv.layer_norm_weight"] = (H,)
        s[p + "self_attention.linear_qkv.weight"] = ((nKV // tp) * (qpg + 2) * hd, H)
        s[p + "self_attention.q_layernorm.weight"] = (hd,)
        s[p + "self_attention.k_layernorm.weight"] = (hd,)
        s[p + "self_attention.linear_proj.weight"] = (H, nH * hd // tp)
        s[p + "mlp.linear_fc1.layer_norm_weight"] = (H,)
        s[p + "mlp.linear_fc1.weight"] = (2 * I // tp, H)
        s[p + "mlp.linear_fc2.weight"] = (H, I // tp)
    s["decoder.final_layernorm.weight"] = (H,)
    if not cfg["tie_word_embeddings"]:
        s["output_layer.weight"] = (Vp // tp, H)
    return s


# Tests rebind shard_shapes to flat_buffer_shapes; this stays the original.
_plain_shard_shapes = shard_shapes


def registration_order(cfg):
    """Megatron-Core's parameter registration order (daemon/layout/
    gen_megatron.c documents the same list): per layer linear_proj,
    linear_qkv.layer_norm_weight, linear_qkv, q/k_layernorm, then
    linear_fc1.layer_norm_weight, linear_fc1, linear_fc2."""
    cfg = qwen3.make_config(cfg)
    names = ["embedding.word_embeddings.weight"]
    for n in range(cfg["num_hidden_layers"]):
        p = "decoder.layers.%d." % n
        names += [p + "self_attention.linear_proj.weight",
                  p + "self_attention.linear_qkv.layer_norm_weight",
                  p + "self_attention.linear_qkv.weight",
                  p + "self_attention.q_layernorm.weight",
                  p + "self_attention.k_layernorm.weight",
                  p + "mlp.linear_fc1.layer_norm_weight",
                  p + "mlp.linear_fc1.weight",
                  p + "mlp.linear_fc2.weight"]
    names.append("decoder.final_layernorm.weight")
    if not cfg["tie_word_embeddings"]:
        names.append("output_layer.weight")
    return names


def flat_buffer_shapes(cfg, tp):
    """shard_shapes in the order of Megatron's distributed-optimizer flat
    buffer: reverse registration order (the buffer is filled back to
    front).  shm.Arena's 256-byte alignment is the 64-element padding of
    each parameter's start, so an arena built in this order is byte for
    byte the flat buffer `megatron:tp=N` expects."""
    s = _plain_shard_shapes(cfg, tp)
    order = list(reversed(registration_order(cfg)))
    if sorted(order) != sorted(s):
        raise RuntimeError("megatron: registration order out of date with shard_shapes")
    return collections.OrderedDict((n, s[n]) for n in order)


def placed_specs(cfg, shapes, placement, rank, role, dtype, esize):
    """Arena specs that put every tensor where a layout says.

    placement: a layout string ("megatron:tp=2", "sglang:tp=2"), asked of
    libdte (dte_layout_tensors) for this rank, or the rank's list of
    _lib.TensorPlace.  Returns (specs with byte offsets, {name: buffer id},
    {buffer id: length in elements or None}); ValueError when the layout's
    tensors are not exactly `shapes`."""
    from . import _lib
    lengths = {}
    if isinstance(placement, str):
        text = json.dumps(cfg)
        places = _lib.layout_tensors(text, placement, role, rank)
        lengths = {b: n for b, n, _ in _lib.layout_buffers(text, placement, role, rank)}
    else:
        places = list(placement)
    got = {p.name: tuple(p.shape) for p in places}
    if got != {n: tuple(v) for n, v in shapes.items()}:
        missing = sorted(set(shapes) - set(got))[:3]
        extra = sorted(set(got) - set(shapes))[:3]
        wrong = sorted(n for n in set(got) & set(shapes) if got[n] != tuple(shapes[n]))[:3]
        raise ValueError("placement for rank %d does not match this model: missing %s, "
                         "unknown %s, other shape %s" % (rank, missing, extra, wrong))
    specs, where = [], {}
    for p in sorted(places, key=lambda q: (q.buffer, q.offset)):
        if p.offset < 0:
            raise ValueError("placement: %s at offset %d (a DP shard boundary); this model "
                             "holds whole tensors" % (p.name, p.offset))
        specs.append((p.name, tuple(p.shape), dtype, p.offset * esize))
        where[p.name] = p.buffer
    return specs, where, lengths


def is_replicated(name):
    """Norm weights are whole on every rank; everything else is a shard."""
    return name.endswith("layer_norm_weight") or name.endswith("layernorm.weight")


# ---- converters: plain indexing, written to be obviously right ---------------

def hf_to_megatron(hf, cfg, tp):
    """HF tensors -> list (one dict per TP rank) of Megatron shards (copies)."""
    cfg = qwen3.make_config(cfg)
    check_tp(cfg, tp)
    qwen3.check_hf_weights(hf, cfg)
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nH, nKV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    qpg = nH // nKV
    Vp = padded_vocab(V, tp)
    Vr, Ir, Gr = Vp // tp, I // tp, nKV // tp

    def vocab_shard(w, r):
        padded = torch.zeros(Vp, H, dtype=w.dtype)
        padded[:V] = w
        return padded[r * Vr:(r + 1) * Vr].clone()

    ranks = []
    for r in range(tp):
        m = collections.OrderedDict()
        m["embedding.word_embeddings.weight"] = vocab_shard(hf["model.embed_tokens.weight"], r)
        for n in range(cfg["num_hidden_layers"]):
            h = "model.layers.%d." % n
            p = "decoder.layers.%d." % n
            rows = []
            for g in range(r * Gr, (r + 1) * Gr):  # query groups of rank r
                rows.append(hf[h + "self_attn.q_proj.weight"][g * qpg * hd:(g + 1) * qpg * hd])
                rows.append(hf[h + "self_attn.k_proj.weight"][g * hd:(g + 1) * hd])
                rows.append(hf[h + "self_attn.v_proj.weight"][g * hd:(g + 1) * hd])
            m[p + "self_attention.linear_qkv.layer_norm_weight"] = \
                hf[h + "input_layernorm.weight"].clone()
            m[p + "self_attention.linear_qkv.weight"] = torch.cat(rows, 0)
            m[p + "self_attention.q_layernorm.weight"] = hf[h + "self_attn.q_norm.weight"].clone()
            m[p + "self_attention.k_layernorm.weight"] = hf[h + "self_attn.k_norm.weight"].clone()
            cols = nH * hd // tp
            m[p + "self_attention.linear_proj.weight"] = \
                hf[h + "self_attn.o_proj.weight"][:, r * cols:(r + 1) * cols].clone()
            m[p + "mlp.linear_fc1.layer_norm_weight"] = \
                hf[h + "post_attention_layernorm.weight"].clone()
            m[p + "mlp.linear_fc1.weight"] = torch.cat(
                (hf[h + "mlp.gate_proj.weight"][r * Ir:(r + 1) * Ir],
                 hf[h + "mlp.up_proj.weight"][r * Ir:(r + 1) * Ir]), 0)
            m[p + "mlp.linear_fc2.weight"] = \
                hf[h + "mlp.down_proj.weight"][:, r * Ir:(r + 1) * Ir].clone()
        m["decoder.final_layernorm.weight"] = hf["model.norm.weight"].clone()
        if not cfg["tie_word_embeddings"]:
            m["output_layer.weight"] = vocab_shard(hf["lm_head.weight"], r)
        ranks.append(m)
    return ranks


def megatron_to_hf(shards, cfg, tp):
    """List of per-rank Megatron shards -> HF tensors (replicated: rank 0)."""
    cfg = qwen3.make_config(cfg)
    check_tp(cfg, tp)
    if len(shards) != tp:
        raise ValueError("megatron: %d shard dicts for tp=%d" % (len(shards), tp))
    expected = shard_shapes(cfg, tp)
    for r, m in enumerate(shards):
        for name, shape in expected.items():
            if name not in m or tuple(m[name].shape) != shape:
                raise ValueError("megatron: rank %d %s missing or not %s" % (r, name, shape))
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    nH, nKV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    qpg = nH // nKV

    def cat(name, dim):
        return torch.cat([m[name] for m in shards], dim)

    hf = collections.OrderedDict()
    hf["model.embed_tokens.weight"] = cat("embedding.word_embeddings.weight", 0)[:V].clone()
    for n in range(cfg["num_hidden_layers"]):
        h = "model.layers.%d." % n
        p = "decoder.layers.%d." % n
        # [groups, q heads of the group + k + v, head_dim, H]
        qkv = cat(p + "self_attention.linear_qkv.weight", 0).view(nKV, qpg + 2, hd, H)
        fc1 = [m[p + "mlp.linear_fc1.weight"] for m in shards]
        half = fc1[0].shape[0] // 2
        hf[h + "input_layernorm.weight"] = \
            shards[0][p + "self_attention.linear_qkv.layer_norm_weight"].clone()
        hf[h + "self_attn.q_proj.weight"] = qkv[:, :qpg].reshape(nH * hd, H).clone()
        hf[h + "self_attn.k_proj.weight"] = qkv[:, qpg].reshape(nKV * hd, H).clone()
        hf[h + "self_attn.v_proj.weight"] = qkv[:, qpg + 1].reshape(nKV * hd, H).clone()
        hf[h + "self_attn.o_proj.weight"] = cat(p + "self_attention.linear_proj.weight", 1)
        hf[h + "self_attn.q_norm.weight"] = shards[0][p + "self_attention.q_layernorm.weight"].clone()
        hf[h + "self_attn.k_norm.weight"] = shards[0][p + "self_attention.k_layernorm.weight"].clone()
        hf[h + "post_attention_layernorm.weight"] = \
            shards[0][p + "mlp.linear_fc1.layer_norm_weight"].clone()
        hf[h + "mlp.gate_proj.weight"] = torch.cat([w[:half] for w in fc1], 0)
        hf[h + "mlp.up_proj.weight"] = torch.cat([w[half:] for w in fc1], 0)
        hf[h + "mlp.down_proj.weight"] = cat(p + "mlp.linear_fc2.weight", 1)
    hf["model.norm.weight"] = shards[0]["decoder.final_layernorm.weight"].clone()
    if not cfg["tie_word_embeddings"]:
        hf["lm_head.weight"] = cat("output_layer.weight", 0)[:V].clone()
    # Canonical order, whatever order the conversion produced.
    return collections.OrderedDict((n, hf[n]) for n in qwen3.hf_tensor_shapes(cfg))


# ---- the model ---------------------------------------------------------------

class MegatronModel(torch.nn.Module):
    """Qwen3 with TP-sharded FP32 params and AdamW moments in shm arenas.

    params[r][name] is rank r's nn.Parameter (a view of arenas[r]['param']);
    arenas[r] = {'param': Arena, 'exp_avg': Arena, 'exp_avg_sq': Arena}.
    """

    def __init__(self, cfg=None, tp=2, hf=None, seed=0, label="megatron", flat=False,
                 placement=None):
        super().__init__()
        self.cfg = qwen3.make_config(cfg)
        self.tp = tp
        # flat=True: arenas laid out as the distributed optimizer's flat
        # buffer, so one fd per kind and rank is what the daemon registers.
        # placement= (a layout string such as "megatron:tp=2", or per rank a
        # list of dte._lib.TensorPlace): every tensor at the offset the
        # daemon's layout gives it, asked of libdte rather than assumed.
        self.flat = flat or placement is not None
        self.shapes = (flat_buffer_shapes if flat else shard_shapes)(self.cfg, tp)
        if hf is None:
            hf = qwen3.init_hf_weights(self.cfg, seed=seed)
        init = hf_to_megatron(hf, self.cfg, tp)
        specs = [(n, s, torch.float32) for n, s in self.shapes.items()]
        self.arenas = []
        self.params = []
        self._plist = torch.nn.ParameterList()
        for r in range(tp):
            size = 0
            if placement is not None:
                from . import _lib
                specs, where, lengths = placed_specs(
                    self.cfg, self.shapes, placement if isinstance(placement, str)
                    else placement[r], r, _lib.SOURCE, torch.float32, 4)
                if set(where.values()) != {0}:
                    raise ValueError("placement: this model keeps dense tensors only "
                                     "(layout buffer 0)")
                size = 4 * (lengths.get(0) or 0)
            ar = {kind: Arena("%s-tp%d-%s" % (label, r, kind), specs, min_size=size)
                  for kind in ("param", "exp_avg", "exp_avg_sq")}
            self.arenas.append(ar)
            ps = collections.OrderedDict()
            for n in self.shapes:
                t = ar["param"].tensor(n)
                t.copy_(init[r][n])
                # Parameter shares t's storage: optimizer updates land in shm.
                ps[n] = torch.nn.Parameter(t)
                self._plist.append(ps[n])
            self.params.append(ps)

    # -- forward: what the TP ranks compute together --
    def forward(self, tokens):
        cfg, tp = self.cfg, self.tp
        tokens = qwen3.check_tokens(tokens, cfg["vocab_size"])
        eps, hd = cfg["rms_norm_eps"], cfg["head_dim"]
        nH, nKV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        qpg, Gr = nH // nKV, nKV // tp
        B, T = tokens.shape
        cos, sin = qwen3.rope_tables(T, hd, cfg["rope_theta"])
        P = self.params

        # VocabParallelEmbedding: each rank looks up its rows, the rest is 0.
        Vr = self.shapes["embedding.word_embeddings.weight"][0]
        x = 0
        for r in range(tp):
            local = tokens - r * Vr
            inside = (local >= 0) & (local < Vr)
            e = P[r]["embedding.word_embeddings.weight"][local.clamp(0, Vr - 1)]
            x = x + e * inside.unsqueeze(-1)

        for n in range(cfg["num_hidden_layers"]):
            p = "decoder.layers.%d." % n
            partial = 0
            for r in range(tp):
                y = qwen3.rms_norm(x, P[r][p + "self_attention.linear_qkv.layer_norm_weight"], eps)
                qkv = (y @ P[r][p + "self_attention.linear_qkv.weight"].T).view(B, T, Gr, qpg + 2, hd)
                q = qkv[:, :, :, :qpg].reshape(B, T, Gr * qpg, hd)
                k = qkv[:, :, :, qpg]
                v = qkv[:, :, :, qpg + 1]
                o = qwen3.attention_heads(q, k, v, P[r][p + "self_attention.q_layernorm.weight"],
                                          P[r][p + "self_attention.k_layernorm.weight"],
                                          cos, sin, eps)
                partial = partial + o @ P[r][p + "self_attention.linear_proj.weight"].T
            x = x + partial
            partial = 0
            for r in range(tp):
                y = qwen3.rms_norm(x, P[r][p + "mlp.linear_fc1.layer_norm_weight"], eps)
                gate, up = (y @ P[r][p + "mlp.linear_fc1.weight"].T).chunk(2, dim=-1)
                h = torch.nn.functional.silu(gate) * up
                partial = partial + h @ P[r][p + "mlp.linear_fc2.weight"].T
            x = x + partial

        out_name = "embedding.word_embeddings.weight" if cfg["tie_word_embeddings"] \
            else "output_layer.weight"
        logits = []
        for r in range(tp):
            y = qwen3.rms_norm(x, P[r]["decoder.final_layernorm.weight"], eps)
            logits.append(y @ P[r][out_name].T)
        return torch.cat(logits, -1)[..., :cfg["vocab_size"]]

    def loss(self, tokens, targets):
        logits = self.forward(tokens)
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def allreduce_replicated_grads(self):
        """Sum each replicated param's grad over ranks, give every rank the sum."""
        for n in self.shapes:
            if not is_replicated(n):
                continue
            grads = [self.params[r][n].grad for r in range(self.tp)]
            if any(g is None for g in grads):
                continue
            total = grads[0].clone()
            for g in grads[1:]:
                total += g
            for r in range(self.tp):
                self.params[r][n].grad.copy_(total)

    def to_hf(self):
        """Current FP32 weights as HF tensors (copies)."""
        with torch.no_grad():
            shards = [{n: t.detach() for n, t in ps.items()} for ps in self.params]
            return megatron_to_hf(shards, self.cfg, self.tp)

    def replicas_identical(self):
        """True when every replicated param is bit-identical on all ranks."""
        for n in self.shapes:
            if is_replicated(n):
                for r in range(1, self.tp):
                    if not torch.equal(self.params[0][n], self.params[r][n]):
                        return False
        return True

    def close(self):
        """Release the shm arenas (drops params and optimizer references first)."""
        self.params = []
        self._plist = torch.nn.ParameterList()
        for ar in self.arenas:
            for a in ar.values():
                a.close()
        self.arenas = []


# ---- optimizer with shm state, and the record the daemon needs --------------

GroupHyper = collections.namedtuple(
    "GroupHyper", "name lr beta1 beta2 eps weight_decay step")


class Trainer:
    """AdamW over a MegatronModel with its state in the model's arenas.

    Two groups: 'decay' (matrices, weight_decay) and 'no_decay' (norms, 0).
    The lr schedule is stepped after the optimizer, as Megatron does; each
    step's record holds the lr that step actually used, per group, plus the
    step count — exactly what the daemon needs to invert the update.
    """

    def __init__(self, model, lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
                 weight_decay=0.01, foreach=False, warmup=0):
        self.model = model
        decay, no_decay = [], []
        self.param_info = {}  # id(param) -> (rank, name)
        for r, ps in enumerate(model.params):
            for n, p in ps.items():
                (no_decay if is_replicated(n) else decay).append(p)
                self.param_info[id(p)] = (r, n)
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": weight_decay, "name": "decay"},
             {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"}],
            lr=lr, betas=betas, eps=eps, foreach=foreach)
        # Pre-create the state with shm tensors: AdamW only initialises state
        # that is empty, and updates existing moments in place.
        for r, ps in enumerate(model.params):
            for n, p in ps.items():
                self.opt.state[p] = {
                    "step": torch.tensor(0.0),
                    "exp_avg": model.arenas[r]["exp_avg"].tensor(n),
                    "exp_avg_sq": model.arenas[r]["exp_avg_sq"].tensor(n),
                }
        warm = max(int(warmup), 0)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
        self.history = []

    def step(self, tokens, targets):
        """One forward/backward/AdamW step; returns and records its hypers."""
        self.opt.zero_grad(set_to_none=True)
        loss = self.model.loss(tokens, targets)
        loss.backward()
        self.model.allreduce_replicated_grads()
        used = [(g["name"], g["lr"], g["betas"][0], g["betas"][1], g["eps"],
                 g["weight_decay"]) for g in self.opt.param_groups]
        self.opt.step()
        self.sched.step()
        steps = {float(self.opt.state[p]["step"]) for g in self.opt.param_groups
                 for p in g["params"]}
        if len(steps) != 1:
            raise RuntimeError("megatron: params disagree on the step count %s" % steps)
        step = int(steps.pop())
        rec = {"step": step, "loss": float(loss.detach()),
               "groups": [GroupHyper(*u, step) for u in used]}
        self.history.append(rec)
        return rec

    def group_of(self, rank, name):
        """'decay' or 'no_decay': the group a source piece belongs to."""
        return "no_decay" if is_replicated(name) else "decay"

    def close(self):
        """Drop the optimizer's references to the arena tensors, so that
        model.close() can unmap them."""
        self.opt.state.clear()
        for g in self.opt.param_groups:
            g["params"] = []
        self.param_info.clear()

    def state_in_shm(self):
        """True when every param and moment is still the arena's own memory."""
        m = self.model
        for r, ps in enumerate(m.params):
            for n, p in ps.items():
                st = self.opt.state[p]
                if p.data_ptr() != m.arenas[r]["param"].tensor(n).data_ptr():
                    return False
                for kind in ("exp_avg", "exp_avg_sq"):
                    if st[kind].data_ptr() != m.arenas[r][kind].tensor(n).data_ptr():
                        return False
        return True

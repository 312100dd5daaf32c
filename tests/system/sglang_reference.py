"""What an SGLang TP sink must hold for a trainer's FP32 θ, written for the check.

The demo's `exact?` column (dte.demo) and tests/system/demo_short.py compare
EVERY element of EVERY sink rank with what this module computes.  It is
deliberately independent of the code it checks: it uses neither dted's
layout/plan code (daemon/layout, dte._lib.layout_*) nor dte.sglang's or
dte.megatron's converters.  Everything here is written from the upstream
projects' own sharding rules, cited where used:

  trainer side (Megatron-Core, TransformerEngine spec) -> HF checkpoint tensors
  HF checkpoint tensors -> SGLang per-rank parameters (its weight_loaders)
  FP32 -> BF16 by round-to-nearest-even, in integer arithmetic

and it reads the sink's memory itself (SinkMemory: the inference process's
memfds opened through /proc/<pid>/fd), not through the stand-in's helpers.

Upstream read at: sgl-project/sglang python/sglang/srt/layers/linear.py
(commit 0079fcc18b3e) and layers/vocab_parallel_embedding.py (04d5e392629c);
NVIDIA/Megatron-LM megatron/core/transformer/attention.py (00c2c0adeec1).

It needs torch only; it never imports dte.

tests/system/engines_upstream.py checks hf_to_sglang_ranks against SGLang
0.5.23's and vLLM 0.33.0's own weight_loaders, run on the CPU.
"""

import collections
import mmap
import os

import torch


# ---- FP32 -> BF16, round to nearest, ties to even ---------------------------------

def rne_bf16_bits(x):
    """BF16 bit patterns (int16 tensor) of RNE(x) for an FP32 tensor x.

    Integer arithmetic on the FP32 bits: add 0x7FFF plus the lowest kept
    bit, drop the low 16 bits (ties go to the even neighbour; a carry into
    the exponent is the correct round-up, also to infinity).  NaNs keep
    their sign and become quiet NaNs.  No torch dtype cast is involved."""
    if x.dtype != torch.float32:
        raise TypeError("rne_bf16_bits: FP32 input, got %s" % x.dtype)
    u = x.detach().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    out = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    out = torch.where(nan, (u >> 16) | 0x0040, out) & 0xFFFF
    out = torch.where(out >= 0x8000, out - 0x10000, out)
    return out.to(torch.int16).view(x.shape)


# ---- the model's shape facts -------------------------------------------------------

def _dims(cfg):
    H = cfg["hidden_size"]
    nH = cfg["num_attention_heads"]
    return dict(H=H, I=cfg["intermediate_size"], V=cfg["vocab_size"], L=cfg["num_hidden_layers"],
                nH=nH, nKV=cfg["num_key_value_heads"], hd=cfg.get("head_dim", H // nH),
                tied=bool(cfg.get("tie_word_embeddings", False)))


# ---- Megatron-Core shards -> HF ----------------------------------------------------

def megatron_core_to_hf(shards, cfg, tp):
    """shards[r]: {Megatron-Core parameter name: rank r's tensor} -> HF tensors.

    Upstream facts used (Megatron-LM, megatron/core):
    - transformer/attention.py SelfAttention.get_query_key_value_tensors:
      linear_qkv's per-rank output is viewed as [ng/tp, (np/ng + 2) * hn]
      and split [np/ng * hn, hn, hn]: per local query group, its np/ng
      query heads, then its one key head, then its one value head; rank r
      holds query groups [r*ng/tp, (r+1)*ng/tp).
    - transformer/mlp.py (gated_linear_unit): linear_fc1's per-rank output
      is torch.chunk(x, 2, dim=-1) -> (gate, up), so rank r holds
      [gate rows of r; up rows of r].
    - tensor_parallel/layers.py ColumnParallelLinear / RowParallelLinear:
      output rows (resp. input columns) split evenly, rank r takes block r.
    - tensor_parallel/layers.py VocabParallelEmbedding (and output_layer):
      the padded vocab split evenly by rows; rows >= vocab_size are padding.
    - norms (TE LayerNormColumnParallelLinear.layer_norm_weight,
      q/k_layernorm, final_layernorm) are whole on every rank; rank 0's
      copy is taken here (replicas_disagree reports the others).
    """
    d = _dims(cfg)
    H, V, nH, nKV, hd = d["H"], d["V"], d["nH"], d["nKV"], d["hd"]
    qpg, g_per_rank = nH // nKV, nKV // tp
    if len(shards) != tp or nKV % tp:
        raise ValueError("megatron_core_to_hf: %d shard dicts, tp=%d, %d KV groups"
                         % (len(shards), tp, nKV))

    def rows(name):
        return torch.cat([s[name] for s in shards], 0)

    def cols(name):
        return torch.cat([s[name] for s in shards], 1)

    hf = collections.OrderedDict()
    hf["model.embed_tokens.weight"] = rows("embedding.word_embeddings.weight")[:V].clone()
    for n in range(d["L"]):
        m, h = "decoder.layers.%d." % n, "model.layers.%d." % n
        q, k, v = [], [], []
        for r in range(tp):
            w = shards[r][m + "self_attention.linear_qkv.weight"]
            per_group = (qpg + 2) * hd
            if w.shape[0] != g_per_rank * per_group:
                raise ValueError("megatron_core_to_hf: %s rank %d has %d rows, expected %d"
                                 % (m + "linear_qkv", r, w.shape[0], g_per_rank * per_group))
            for g in range(g_per_rank):
                blk = w[g * per_group:(g + 1) * per_group]
                q.append(blk[:qpg * hd])
                k.append(blk[qpg * hd:(qpg + 1) * hd])
                v.append(blk[(qpg + 1) * hd:])
        fc1 = [s[m + "mlp.linear_fc1.weight"] for s in shards]
        half = [f.shape[0] // 2 for f in fc1]
        hf[h + "input_layernorm.weight"] = \
            shards[0][m + "self_attention.linear_qkv.layer_norm_weight"].clone()
        hf[h + "self_attn.q_proj.weight"] = torch.cat(q, 0)
        hf[h + "self_attn.k_proj.weight"] = torch.cat(k, 0)
        hf[h + "self_attn.v_proj.weight"] = torch.cat(v, 0)
        hf[h + "self_attn.o_proj.weight"] = cols(m + "self_attention.linear_proj.weight")
        hf[h + "self_attn.q_norm.weight"] = \
            shards[0][m + "self_attention.q_layernorm.weight"].clone()
        hf[h + "self_attn.k_norm.weight"] = \
            shards[0][m + "self_attention.k_layernorm.weight"].clone()
        hf[h + "post_attention_layernorm.weight"] = \
            shards[0][m + "mlp.linear_fc1.layer_norm_weight"].clone()
        hf[h + "mlp.gate_proj.weight"] = torch.cat([f[:k_] for f, k_ in zip(fc1, half)], 0)
        hf[h + "mlp.up_proj.weight"] = torch.cat([f[k_:] for f, k_ in zip(fc1, half)], 0)
        hf[h + "mlp.down_proj.weight"] = cols(m + "mlp.linear_fc2.weight")
    hf["model.norm.weight"] = shards[0]["decoder.final_layernorm.weight"].clone()
    if not d["tied"]:
        hf["lm_head.weight"] = rows("output_layer.weight")[:V].clone()
    shapes = {"model.embed_tokens.weight": (V, H), "lm_head.weight": (V, H)}
    for name, t in hf.items():
        if name in shapes and tuple(t.shape) != shapes[name]:
            raise ValueError("megatron_core_to_hf: %s is %s, expected %s"
                             % (name, tuple(t.shape), shapes[name]))
    return hf


def replicas_disagree(shards):
    """Elements where a rank's copy of a replicated (norm) parameter differs
    from rank 0's: {name: count}.  The trainer's θ is ambiguous there."""
    out = {}
    for name, t0 in shards[0].items():
        if not (name.endswith("layer_norm_weight") or name.endswith("layernorm.weight")):
            continue
        n = sum(int((s[name].view(torch.int32) != t0.view(torch.int32)).sum())
                for s in shards[1:])
        if n:
            out[name] = n
    return out


# ---- HF -> SGLang per-rank parameters ---------------------------------------------

SGLANG_VOCAB_PADDING = 64  # sglang/srt/layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE


def hf_to_sglang_ranks(hf, cfg, tp):
    """HF tensors -> [per rank {SGLang parameter name: tensor}] (dtype kept).

    Upstream facts used (sgl-project/sglang, python/sglang/srt/):
    - layers/linear.py QKVParallelLinear.__init__: num_heads = nH/tp; when
      tp >= nKV each rank holds num_kv_heads = 1 and num_kv_head_replicas =
      tp/nKV, else num_kv_heads = nKV/tp.  weight_loader: the q shard sits
      at offset 0 (num_heads*hd rows, taken from row tp_rank*shard_size of
      q_proj); k at num_heads*hd and v at (num_heads+num_kv_heads)*hd, each
      num_kv_heads*hd rows taken from row (tp_rank // num_kv_head_replicas)
      * shard_size of k_proj / v_proj.
    - layers/linear.py MergedColumnParallelLinear.weight_loader (gate_up_proj,
      output_sizes [I, I]): shard i at sum(output_sizes[:i]) // tp, size
      output_sizes[i] // tp, taken from row tp_rank * shard_size.
    - layers/linear.py RowParallelLinear (o_proj, down_proj): input_dim 1,
      columns [tp_rank*shard, (tp_rank+1)*shard).
    - layers/vocab_parallel_embedding.py: vocab padded to a multiple of 64
      (pad_vocab_size), split evenly (vocab_range_from_global_vocab_size);
      weight_loader copies the real rows and fills the rest with 0;
      ParallelLMHead is the same, and tie_weights shares embed_tokens.
    - models/qwen3.py: RMSNorm weights (input/post_attention layernorm,
      q_norm, k_norm, model.norm) are plain parameters, whole on every rank.
    """
    d = _dims(cfg)
    H, I, V, nH, nKV, hd = d["H"], d["I"], d["V"], d["nH"], d["nKV"], d["hd"]
    if nH % tp or I % tp:
        raise ValueError("hf_to_sglang_ranks: heads %d / intermediate %d vs tp %d" % (nH, I, tp))
    num_heads = nH // tp
    if tp >= nKV:
        if tp % nKV:
            raise ValueError("hf_to_sglang_ranks: tp %d not a multiple of %d KV heads" % (tp, nKV))
        num_kv_heads, replicas = 1, tp // nKV
    else:
        if nKV % tp:
            raise ValueError("hf_to_sglang_ranks: %d KV heads not divisible by tp %d" % (nKV, tp))
        num_kv_heads, replicas = nKV // tp, 1
    Vp = (V + SGLANG_VOCAB_PADDING - 1) // SGLANG_VOCAB_PADDING * SGLANG_VOCAB_PADDING
    if Vp % tp:
        raise ValueError("hf_to_sglang_ranks: padded vocab %d not divisible by tp %d" % (Vp, tp))
    per_part = Vp // tp

    def vocab_rows(w, r):
        out = torch.zeros(per_part, H, dtype=w.dtype)
        lo, hi = min(r * per_part, V), min((r + 1) * per_part, V)
        out[:hi - lo] = w[lo:hi]
        return out

    ranks = []
    for r in range(tp):
        s = collections.OrderedDict()
        s["model.embed_tokens.weight"] = vocab_rows(hf["model.embed_tokens.weight"], r)
        q_size, kv_size = num_heads * hd, num_kv_heads * hd
        kv_start = (r // replicas) * kv_size
        for n in range(d["L"]):
            p = "model.layers.%d." % n
            s[p + "input_layernorm.weight"] = hf[p + "input_layernorm.weight"].clone()
            s[p + "self_attn.qkv_proj.weight"] = torch.cat((
                hf[p + "self_attn.q_proj.weight"][r * q_size:(r + 1) * q_size],
                hf[p + "self_attn.k_proj.weight"][kv_start:kv_start + kv_size],
                hf[p + "self_attn.v_proj.weight"][kv_start:kv_start + kv_size]), 0)
            s[p + "self_attn.o_proj.weight"] = \
                hf[p + "self_attn.o_proj.weight"][:, r * q_size:(r + 1) * q_size].clone()
            s[p + "self_attn.q_norm.weight"] = hf[p + "self_attn.q_norm.weight"].clone()
            s[p + "self_attn.k_norm.weight"] = hf[p + "self_attn.k_norm.weight"].clone()
            s[p + "post_attention_layernorm.weight"] = \
                hf[p + "post_attention_layernorm.weight"].clone()
            i_size = I // tp
            s[p + "mlp.gate_up_proj.weight"] = torch.cat((
                hf[p + "mlp.gate_proj.weight"][r * i_size:(r + 1) * i_size],
                hf[p + "mlp.up_proj.weight"][r * i_size:(r + 1) * i_size]), 0)
            s[p + "mlp.down_proj.weight"] = \
                hf[p + "mlp.down_proj.weight"][:, r * i_size:(r + 1) * i_size].clone()
        s["model.norm.weight"] = hf["model.norm.weight"].clone()
        if not d["tied"]:
            s["lm_head.weight"] = vocab_rows(hf["lm_head.weight"], r)
        ranks.append(s)
    return ranks


def expected_sink(shards, cfg, tp_trainer, tp_sink):
    """The trainer's FP32 Megatron-Core shards -> per sink rank
    {SGLang name: BF16 bits (int16)}: what every sink element must be."""
    hf = megatron_core_to_hf(shards, cfg, tp_trainer)
    bits = collections.OrderedDict((n, rne_bf16_bits(t)) for n, t in hf.items())
    return hf_to_sglang_ranks(bits, cfg, tp_sink)


def expected_sink_from_hf(hf_fp32, cfg, tp_sink):
    """Same, from unsharded FP32 HF tensors (an FSDP/HF-named trainer)."""
    bits = collections.OrderedDict((n, rne_bf16_bits(t)) for n, t in hf_fp32.items())
    return hf_to_sglang_ranks(bits, cfg, tp_sink)


# ---- the sink's memory, read from outside -------------------------------------------

class SinkMemory:
    """The BF16 tensors an inference process registered, read (and, for
    tests only, written) through its own memfds: /proc/<pid>/fd/<fd> opens
    the same memory the daemon scatters into.

    locs: per rank, the process's own table of (name, fd, offset, nbytes,
    dtype, shape) — where its engine keeps each parameter (what it would
    hand to any weight-update mechanism), fd numbers in process pid."""

    def __init__(self, pid, locs, writable=False):
        self.pid = pid
        self.ranks = []
        self._maps = {}
        try:
            for rank in locs:
                entries = collections.OrderedDict()
                for name, fd, offset, nbytes, dtype, shape in rank:
                    if dtype != "bf16":
                        raise ValueError("SinkMemory: %s is %s, not bf16" % (name, dtype))
                    numel = 1
                    for s in shape:
                        numel *= int(s)
                    if nbytes != 2 * numel:
                        raise ValueError("SinkMemory: %s: %d bytes for shape %s"
                                         % (name, nbytes, tuple(shape)))
                    entries[name] = (self._map(fd, writable), int(offset), int(nbytes),
                                     tuple(int(s) for s in shape))
                self.ranks.append(entries)
        except BaseException:
            self.close()
            raise

    def _map(self, fd, writable):
        if fd in self._maps:
            return self._maps[fd]
        path = "/proc/%d/fd/%d" % (self.pid, fd)
        own = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            size = os.fstat(own).st_size
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            mm = mmap.mmap(own, size, mmap.MAP_SHARED, prot)
        finally:
            os.close(own)
        self._maps[fd] = mm
        return mm

    def names(self, r):
        return list(self.ranks[r])

    def shape(self, r, name):
        return self.ranks[r][name][3]

    def bits(self, r, name):
        """A copy of rank r's tensor `name` as int16 BF16 bit patterns."""
        mm, off, nbytes, shape = self.ranks[r][name]
        return torch.frombuffer(bytearray(mm[off:off + nbytes]), dtype=torch.int16).view(shape)

    def flip_bit(self, r, name, index, bit=0):
        """TEST ONLY: flip one bit of one element (flat index) in the sink's
        memory, behind the daemon's and the engine's back."""
        mm, off, nbytes, _ = self.ranks[r][name]
        if not 0 <= index < nbytes // 2 or not 0 <= bit < 16:
            raise IndexError("flip_bit: element %d bit %d outside %s" % (index, bit, name))
        at = off + 2 * index + bit // 8
        mm[at] = mm[at] ^ (1 << (bit % 8))

    def close(self):
        for mm in self._maps.values():
            mm.close()
        self._maps = {}
        self.ranks = []


# ---- the comparison -------------------------------------------------------------------

def compare(want, sink):
    """want: per rank {name: int16 bits}; sink: SinkMemory.  Returns
    (mismatched elements, elements compared, [(rank, name, mismatched)]).
    A tensor the sink lacks, has extra or holds in another shape counts
    all its elements as mismatched."""
    bad, total, where = 0, 0, []
    if len(want) != len(sink.ranks):
        raise ValueError("compare: %d expected ranks, the sink has %d"
                         % (len(want), len(sink.ranks)))
    for r, w in enumerate(want):
        names = set(w) | set(sink.names(r))
        for name in sorted(names):
            if name not in w or name not in sink.ranks[r]:
                n = (w[name].numel() if name in w else sink.bits(r, name).numel())
                bad, total = bad + n, total + n
                where.append((r, name, n))
                continue
            have = sink.bits(r, name)
            if tuple(have.shape) != tuple(w[name].shape):
                n = max(have.numel(), w[name].numel())
                bad, total = bad + n, total + n
                where.append((r, name, n))
                continue
            n = int((have != w[name]).sum())
            total += have.numel()
            if n:
                bad += n
                where.append((r, name, n))
    return bad, total, where

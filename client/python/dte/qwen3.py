"""Qwen3 architecture in plain torch: config, canonical HF tensors, reference forward.

This is the canonical space of DESIGN.md §3: every other layout (Megatron
shards, SGLang fused tensors) is checked against the names, shapes and the
forward function defined here.  The forward is written for clarity, not speed,
and always computes in FP32 (BF16 weights are upcast), so it can serve as the
reference for both the trainer and the inference stand-in.
"""

import math

import torch

# The demo's embedded default: tiny, but every Qwen3 feature is exercised
# (GQA with 2 query heads per group, q/k norm, untied lm_head).
DEFAULT_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "vocab_size": 512,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
}

_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads", "num_key_value_heads", "vocab_size")


def make_config(cfg=None, **overrides):
    """Return a complete, validated config dict (HF config.json keys).

    Missing optional keys get Qwen3 defaults; head_dim defaults to
    hidden_size / num_attention_heads as in HF.  Raises ValueError on a config
    no Qwen3 model could have.
    """
    out = dict(DEFAULT_CONFIG if cfg is None else cfg)
    out.update(overrides)
    for key in _REQUIRED:
        if key not in out:
            raise ValueError("qwen3 config: missing %r" % key)
        if not isinstance(out[key], int) or out[key] <= 0:
            raise ValueError("qwen3 config: %r must be a positive int, got %r"
                             % (key, out[key]))
    out.setdefault("head_dim", out["hidden_size"] // out["num_attention_heads"])
    out.setdefault("tie_word_embeddings", False)
    out.setdefault("rms_norm_eps", 1e-6)
    out.setdefault("rope_theta", 1000000.0)
    if out["num_attention_heads"] % out["num_key_value_heads"]:
        raise ValueError("qwen3 config: num_attention_heads %d is not a multiple "
                         "of num_key_value_heads %d"
                         % (out["num_attention_heads"], out["num_key_value_heads"]))
    if out["head_dim"] % 2:
        raise ValueError("qwen3 config: head_dim must be even for RoPE")
    return out


def hf_tensor_shapes(cfg):
    """Canonical tensors of the model, in checkpoint order: {hf_name: shape}."""
    cfg = make_config(cfg)
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nH, nKV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    shapes = {"model.embed_tokens.weight": (V, H)}
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
    return shapes


def is_norm(hf_name):
    """Norm weights are 1-D and take no weight decay."""
    return hf_name.endswith("norm.weight")


def init_hf_weights(cfg, seed=0, std=0.02, norm_jitter=0.0):
    """Random FP32 weights {hf_name: tensor}: N(0, std) matrices, norms near 1.

    norm_jitter > 0 perturbs the norms so tests notice a misplaced norm.
    """
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in hf_tensor_shapes(cfg).items():
        if is_norm(name):
            t = torch.ones(shape)
            if norm_jitter:
                t += norm_jitter * torch.randn(shape, generator=gen)
        else:
            t = std * torch.randn(shape, generator=gen)
        out[name] = t
    return out


def check_hf_weights(weights, cfg):
    """Raise ValueError unless weights has exactly the canonical names/shapes."""
    shapes = hf_tensor_shapes(cfg)
    missing = [n for n in shapes if n not in weights]
    extra = [n for n in weights if n not in shapes]
    if missing or extra:
        raise ValueError("hf weights: missing %s, unexpected %s" % (missing[:3], extra[:3]))
    for n, s in shapes.items():
        if tuple(weights[n].shape) != tuple(s):
            raise ValueError("hf weights: %s has shape %s, expected %s"
                             % (n, tuple(weights[n].shape), s))


def round_bf16(weights):
    """RNE to BF16 of every tensor (what an inference server holds)."""
    return {n: t.to(torch.bfloat16) for n, t in weights.items()}


# ---- building blocks, shared by every layout's forward -----------------------

def rms_norm(x, weight, eps):
    """RMSNorm over the last dim, in FP32 (HF Qwen3RMSNorm)."""
    x = x.float()
    var = x.pow(2).mean(-1, keepdim=True)
    return weight.float() * (x * torch.rsqrt(var + eps))


def rope_tables(seq_len, head_dim, theta):
    """cos/sin [T, head_dim] for the non-interleaved (rotate_half) RoPE."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    pos = torch.arange(seq_len, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    """x: [B, heads, T, hd]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def causal_attention(q, k, v):
    """q [B, nq, T, hd], k/v [B, nkv, T, hd] with nq a multiple of nkv (GQA)."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    T = q.shape[2]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def attention_heads(q, k, v, q_norm, k_norm, cos, sin, eps):
    """Per-head part of a Qwen3 attention block.

    q [B, T, nq, hd], k/v [B, T, nkv, hd] straight out of the projections;
    returns [B, T, nq*hd] ready for o_proj.  q/k norm comes before RoPE.
    """
    B, T = q.shape[0], q.shape[1]
    q = rms_norm(q, q_norm, eps).transpose(1, 2)
    k = rms_norm(k, k_norm, eps).transpose(1, 2)
    v = v.float().transpose(1, 2)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    o = causal_attention(q, k, v)
    return o.transpose(1, 2).reshape(B, T, -1)


def check_tokens(tokens, vocab_size):
    """Validate a [B, T] token batch; raise ValueError rather than index OOB."""
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        raise ValueError("tokens must be a 2-D LongTensor [batch, seq]")
    if tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError("tokens must be integer, got %s" % tokens.dtype)
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise ValueError("token id out of range [0, %d)" % vocab_size)
    return tokens.long()


def forward(weights, cfg, tokens):
    """Reference forward: logits [B, T, vocab] in FP32 from HF tensors."""
    cfg = make_config(cfg)
    check_hf_weights(weights, cfg)
    tokens = check_tokens(tokens, cfg["vocab_size"])
    W = {n: t.float() for n, t in weights.items()}
    eps, hd = cfg["rms_norm_eps"], cfg["head_dim"]
    nH, nKV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    B, T = tokens.shape
    cos, sin = rope_tables(T, hd, cfg["rope_theta"])
    x = W["model.embed_tokens.weight"][tokens]
    for n in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % n
        y = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = (y @ W[p + "self_attn.q_proj.weight"].T).view(B, T, nH, hd)
        k = (y @ W[p + "self_attn.k_proj.weight"].T).view(B, T, nKV, hd)
        v = (y @ W[p + "self_attn.v_proj.weight"].T).view(B, T, nKV, hd)
        o = attention_heads(q, k, v, W[p + "self_attn.q_norm.weight"],
                            W[p + "self_attn.k_norm.weight"], cos, sin, eps)
        x = x + o @ W[p + "self_attn.o_proj.weight"].T
        y = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        gate = y @ W[p + "mlp.gate_proj.weight"].T
        up = y @ W[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ W[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"]
    return x @ head.T

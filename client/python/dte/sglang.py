"""Inference stand-in: a Qwen3 model stored exactly as SGLang stores it.

Per TP rank r, the BF16 tensors are SGLang's (Qwen3ForCausalLM with
QKVParallelLinear / MergedColumnParallelLinear / RowParallelLinear /
VocabParallelEmbedding):
  self_attn.qkv_proj   [q_shard; k_shard; v_shard]; when tp > kv heads each
                       rank holds one KV head, replicated tp/kv times
  self_attn.o_proj     [H, nH*hd/tp]                 (row-parallel)
  mlp.gate_up_proj     [gate_shard; up_shard]
  mlp.down_proj        [H, I/tp]                     (row-parallel)
  embed_tokens/lm_head vocab padded to a multiple of 64, split by rows
  norms                replicated (one copy per rank, as each worker has)
Each rank's tensors live in one BF16 shm arena: the buffer a sink registers.

TP is simulated in one process; the forward upcasts the BF16 weights and
computes in FP32 on one thread, so the same weights give bit-identical logits
in any process and on any run.  run_standin() serves the model over a pipe
from its own process.
"""

import collections
import contextlib
import os
import traceback

import torch

from . import qwen3
from .shm import Arena

VOCAB_PAD = 64  # SGLang's DEFAULT_VOCAB_PADDING_SIZE


def padded_vocab(vocab_size):
    return (vocab_size + VOCAB_PAD - 1) // VOCAB_PAD * VOCAB_PAD


def check_tp(cfg, tp):
    if not isinstance(tp, int) or tp < 1:
        raise ValueError("sglang: tp must be a positive int")
    nH, nKV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    if nH % tp or cfg["intermediate_size"] % tp or padded_vocab(cfg["vocab_size"]) % tp:
        raise ValueError("sglang: heads %d, intermediate %d and padded vocab %d must "
                         "all be divisible by tp=%d" % (nH, cfg["intermediate_size"],
                                                        padded_vocab(cfg["vocab_size"]), tp))
    if (tp >= nKV and tp % nKV) or (tp < nKV and nKV % tp):
        raise ValueError("sglang: tp=%d and kv heads=%d must divide one another" % (tp, nKV))


def kv_heads_of_rank(cfg, tp, r):
    """Global KV head ids rank r holds (one replicated head when tp > kv)."""
    nKV = cfg["num_key_value_heads"]
    if tp >= nKV:
        return [r // (tp // nKV)]
    per = nKV // tp
    return list(range(r * per, (r + 1) * per))


def shard_shapes(cfg, tp):
    """{sglang_name: per-rank shape}."""
    cfg = qwen3.make_config(cfg)
    check_tp(cfg, tp)
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    nH, hd = cfg["num_attention_heads"], cfg["head_dim"]
    nkv_r = len(kv_heads_of_rank(cfg, tp, 0))
    Vr = padded_vocab(cfg["vocab_size"]) // tp
    s = collections.OrderedDict()
    s["model.embed_tokens.weight"] = (Vr, H)
    for n in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % n
        s[p + "input_layernorm.weight"] = (H,)
        s[p + "self_attn.qkv_proj.weight"] = ((nH // tp + 2 * nkv_r) * hd, H)
        s[p + "self_attn.o_proj.weight"] = (H, nH * hd // tp)
        s[p + "self_attn.q_norm.weight"] = (hd,)
        s[p + "self_attn.k_norm.weight"] = (hd,)
        s[p + "post_attention_layernorm.weight"] = (H,)
        s[p + "mlp.gate_up_proj.weight"] = (2 * I // tp, H)
        s[p + "mlp.down_proj.weight"] = (H, I // tp)
    s["model.norm.weight"] = (H,)
    if not cfg["tie_word_embeddings"]:
        s["lm_head.weight"] = (Vr, H)
    return s


# ---- converters ---------------------------------------------------------------

def hf_to_sglang(hf, cfg, tp):
    """HF tensors -> list (one dict per rank) of SGLang tensors, dtype kept."""
    cfg = qwen3.make_config(cfg)
    check_tp(cfg, tp)
    qwen3.check_hf_weights(hf, cfg)
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nH, hd = cfg["num_attention_heads"], cfg["head_dim"]
    Vp = padded_vocab(V)
    Vr, Ir, qr = Vp // tp, I // tp, nH // tp

    def vocab_shard(w, r):
        padded = torch.zeros(Vp, H, dtype=w.dtype)
        padded[:V] = w
        return padded[r * Vr:(r + 1) * Vr].clone()

    def heads(w, ids):
        return torch.cat([w[h * hd:(h + 1) * hd] for h in ids], 0)

    ranks = []
    for r in range(tp):
        kv = kv_heads_of_rank(cfg, tp, r)
        s = collections.OrderedDict()
        s["model.embed_tokens.weight"] = vocab_shard(hf["model.embed_tokens.weight"], r)
        for n in range(cfg["num_hidden_layers"]):
            p = "model.layers.%d." % n
            s[p + "input_layernorm.weight"] = hf[p + "input_layernorm.weight"].clone()
            s[p + "self_attn.qkv_proj.weight"] = torch.cat((
                heads(hf[p + "self_attn.q_proj.weight"], range(r * qr, (r + 1) * qr)),
                heads(hf[p + "self_attn.k_proj.weight"], kv),
                heads(hf[p + "self_attn.v_proj.weight"], kv)), 0)
            s[p + "self_attn.o_proj.weight"] = \
                hf[p + "self_attn.o_proj.weight"][:, r * qr * hd:(r + 1) * qr * hd].clone()
            s[p + "self_attn.q_norm.weight"] = hf[p + "self_attn.q_norm.weight"].clone()
            s[p + "self_attn.k_norm.weight"] = hf[p + "self_attn.k_norm.weight"].clone()
            s[p + "post_attention_layernorm.weight"] = \
                hf[p + "post_attention_layernorm.weight"].clone()
            s[p + "mlp.gate_up_proj.weight"] = torch.cat(
                (hf[p + "mlp.gate_proj.weight"][r * Ir:(r + 1) * Ir],
                 hf[p + "mlp.up_proj.weight"][r * Ir:(r + 1) * Ir]), 0)
            s[p + "mlp.down_proj.weight"] = \
                hf[p + "mlp.down_proj.weight"][:, r * Ir:(r + 1) * Ir].clone()
        s["model.norm.weight"] = hf["model.norm.weight"].clone()
        if not cfg["tie_word_embeddings"]:
            s["lm_head.weight"] = vocab_shard(hf["lm_head.weight"], r)
        ranks.append(s)
    return ranks


def sglang_to_hf(ranks, cfg, tp):
    """Per-rank SGLang tensors -> HF tensors.  Replicated norms and replicated
    KV heads are taken from the lowest rank holding them."""
    cfg = qwen3.make_config(cfg)
    check_tp(cfg, tp)
    if len(ranks) != tp:
        raise ValueError("sglang: %d rank dicts for tp=%d" % (len(ranks), tp))
    expected = shard_shapes(cfg, tp)
    for r, s in enumerate(ranks):
        for name, shape in expected.items():
            if name not in s or tuple(s[name].shape) != shape:
                raise ValueError("sglang: rank %d %s missing or not %s" % (r, name, shape))
    V = cfg["vocab_size"]
    nH, nKV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    q_rows = nH // tp * hd
    kv_rows = len(kv_heads_of_rank(cfg, tp, 0)) * hd
    first_holder = {}
    for r in range(tp):
        for h in kv_heads_of_rank(cfg, tp, r):
            first_holder.setdefault(h, (r, kv_heads_of_rank(cfg, tp, r).index(h)))

    hf = collections.OrderedDict()
    hf["model.embed_tokens.weight"] = \
        torch.cat([s["model.embed_tokens.weight"] for s in ranks], 0)[:V].clone()
    for n in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % n
        qkv = [s[p + "self_attn.qkv_proj.weight"].split([q_rows, kv_rows, kv_rows], 0)
               for s in ranks]
        k_heads, v_heads = [], []
        for h in range(nKV):
            r, i = first_holder[h]
            k_heads.append(qkv[r][1][i * hd:(i + 1) * hd])
            v_heads.append(qkv[r][2][i * hd:(i + 1) * hd])
        gate_up = [s[p + "mlp.gate_up_proj.weight"].chunk(2, 0) for s in ranks]
        hf[p + "input_layernorm.weight"] = ranks[0][p + "input_layernorm.weight"].clone()
        hf[p + "self_attn.q_proj.weight"] = torch.cat([t[0] for t in qkv], 0)
        hf[p + "self_attn.k_proj.weight"] = torch.cat(k_heads, 0)
        hf[p + "self_attn.v_proj.weight"] = torch.cat(v_heads, 0)
        hf[p + "self_attn.o_proj.weight"] = torch.cat([s[p + "self_attn.o_proj.weight"]
                                                       for s in ranks], 1)
        hf[p + "self_attn.q_norm.weight"] = ranks[0][p + "self_attn.q_norm.weight"].clone()
        hf[p + "self_attn.k_norm.weight"] = ranks[0][p + "self_attn.k_norm.weight"].clone()
        hf[p + "post_attention_layernorm.weight"] = \
            ranks[0][p + "post_attention_layernorm.weight"].clone()
        hf[p + "mlp.gate_proj.weight"] = torch.cat([g for g, _ in gate_up], 0)
        hf[p + "mlp.up_proj.weight"] = torch.cat([u for _, u in gate_up], 0)
        hf[p + "mlp.down_proj.weight"] = torch.cat([s[p + "mlp.down_proj.weight"]
                                                    for s in ranks], 1)
    hf["model.norm.weight"] = ranks[0]["model.norm.weight"].clone()
    if not cfg["tie_word_embeddings"]:
        hf["lm_head.weight"] = torch.cat([s["lm_head.weight"] for s in ranks], 0)[:V].clone()
    return collections.OrderedDict((n, hf[n]) for n in qwen3.hf_tensor_shapes(cfg))


# ---- the model ------------------------------------------------------------------

@contextlib.contextmanager
def _one_thread():
    """Pin intra-op threads to 1 so results never depend on the caller's setting."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


class SGLangModel:
    """Qwen3 with SGLang's per-rank BF16 tensors in one shm arena per rank."""

    def __init__(self, cfg=None, tp=2, label="sglang", placement=None):
        """placement= (a layout string such as "sglang:tp=2", or per rank a
        list of dte._lib.TensorPlace): each rank's arena holds its tensors in
        the layout's buffer order, and buffer_ids[r][name] is the layout
        buffer each one is registered as (one buffer per tensor)."""
        self.cfg = qwen3.make_config(cfg)
        self.tp = tp
        self.shapes = shard_shapes(self.cfg, tp)
        specs = [(n, s, torch.bfloat16) for n, s in self.shapes.items()]
        self.buffer_ids = None
        if placement is None:
            self.arenas = [Arena("%s-tp%d" % (label, r), specs) for r in range(tp)]
            return
        from . import _lib
        from .megatron import placed_specs
        self.arenas, self.buffer_ids = [], []
        for r in range(tp):
            placed, where, _ = placed_specs(self.cfg, self.shapes, placement if isinstance(
                placement, str) else placement[r], r, _lib.SINK, torch.bfloat16, 2)
            # One buffer per tensor, each at its buffer's start: the arena
            # packs them (aligned) in buffer-id order.
            self.arenas.append(Arena("%s-tp%d" % (label, r),
                                     [(n, sh, dt) for n, sh, dt, _ in placed]))
            self.buffer_ids.append(where)

    def weights(self, r):
        """Rank r's live BF16 tensors {sglang_name: tensor}."""
        return self.arenas[r].tensors()

    def locs(self):
        """Per rank: [TensorLoc] — what the sink registers with the daemon."""
        return [a.locs() for a in self.arenas]

    def load_hf(self, hf):
        """Dense load of HF tensors (FP32 ones are rounded to BF16, RNE)."""
        for r, s in enumerate(hf_to_sglang(hf, self.cfg, self.tp)):
            for n, t in s.items():
                self.arenas[r].tensor(n).copy_(t.to(torch.bfloat16))

    def to_hf(self):
        return sglang_to_hf([{n: t.clone() for n, t in self.weights(r).items()}
                             for r in range(self.tp)], self.cfg, self.tp)

    @torch.no_grad()
    def logits(self, tokens):
        """FP32 logits [B, T, vocab] of the current BF16 weights."""
        with _one_thread():
            return self._forward(tokens)

    def _forward(self, tokens):
        cfg, tp = self.cfg, self.tp
        tokens = qwen3.check_tokens(tokens, cfg["vocab_size"])
        eps, hd = cfg["rms_norm_eps"], cfg["head_dim"]
        nq = cfg["num_attention_heads"] // tp
        nkv = len(kv_heads_of_rank(cfg, tp, 0))
        B, T = tokens.shape
        cos, sin = qwen3.rope_tables(T, hd, cfg["rope_theta"])
        W = [{n: t.float() for n, t in self.weights(r).items()} for r in range(tp)]

        Vr = self.shapes["model.embed_tokens.weight"][0]
        x = torch.zeros(B, T, cfg["hidden_size"])
        for r in range(tp):
            local = tokens - r * Vr
            inside = (local >= 0) & (local < Vr)
            x += W[r]["model.embed_tokens.weight"][local.clamp(0, Vr - 1)] * inside.unsqueeze(-1)

        for n in range(cfg["num_hidden_layers"]):
            p = "model.layers.%d." % n
            partial = torch.zeros_like(x)
            for r in range(tp):
                y = qwen3.rms_norm(x, W[r][p + "input_layernorm.weight"], eps)
                qkv = y @ W[r][p + "self_attn.qkv_proj.weight"].T
                q, k, v = qkv.split([nq * hd, nkv * hd, nkv * hd], -1)
                o = qwen3.attention_heads(q.reshape(B, T, nq, hd), k.reshape(B, T, nkv, hd),
                                          v.reshape(B, T, nkv, hd),
                                          W[r][p + "self_attn.q_norm.weight"],
                                          W[r][p + "self_attn.k_norm.weight"], cos, sin, eps)
                partial += o @ W[r][p + "self_attn.o_proj.weight"].T
            x = x + partial
            partial = torch.zeros_like(x)
            for r in range(tp):
                y = qwen3.rms_norm(x, W[r][p + "post_attention_layernorm.weight"], eps)
                gate, up = (y @ W[r][p + "mlp.gate_up_proj.weight"].T).chunk(2, -1)
                partial += (torch.nn.functional.silu(gate) * up) @ W[r][p + "mlp.down_proj.weight"].T
            x = x + partial

        head = "model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"
        out = [qwen3.rms_norm(x, W[r]["model.norm.weight"], eps) @ W[r][head].T
               for r in range(tp)]
        return torch.cat(out, -1)[..., :cfg["vocab_size"]]

    def close(self):
        for a in self.arenas:
            a.close()
        self.arenas = []


def reference_logits(hf, cfg, tp, tokens):
    """Logits the stand-in must produce for HF weights hf (rounded to BF16):
    a fresh SGLangModel through the very same code path."""
    m = SGLangModel(cfg, tp, label="sglang-ref")
    try:
        m.load_hf(hf)
        return m.logits(tokens)
    finally:
        m.close()


# ---- the stand-in process ---------------------------------------------------------
#
# Requests are tuples (command, *args); every reply is ('ok', result) or
# ('error', message).  Tensors cross the pipe as plain (dtype, shape, bytes) so
# nothing depends on torch's own shared-memory pickling.  HANDLERS is the one
# table of commands; the libdte binding adds its own (register, apply, ...).

def pack(t):
    t = t.detach().contiguous()
    raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
    return (str(t.dtype), tuple(t.shape), raw.numpy().tobytes())


def unpack(p):
    dtype_s, shape, raw = p
    dtype = {"torch.float32": torch.float32, "torch.bfloat16": torch.bfloat16,
             "torch.int64": torch.int64, "torch.int32": torch.int32}.get(dtype_s)
    if dtype is None:
        raise ValueError("unsupported dtype %r on the pipe" % dtype_s)
    store = torch.int16 if dtype == torch.bfloat16 else dtype
    t = torch.frombuffer(bytearray(raw), dtype=store).view(shape)
    return t.view(dtype) if dtype == torch.bfloat16 else t


def _cmd_ping(model):
    return os.getpid()


def _cmd_locs(model):
    return [[tuple(loc) for loc in rank] for rank in model.locs()]


def _cmd_load_hf(model, packed):
    model.load_hf({n: unpack(p) for n, p in packed.items()})


def _cmd_logits(model, tokens):
    return pack(model.logits(unpack(tokens)))


def _cmd_hf(model):
    return {n: pack(t) for n, t in model.to_hf().items()}


HANDLERS = {"ping": _cmd_ping, "locs": _cmd_locs, "load_hf": _cmd_load_hf,
            "logits": _cmd_logits, "hf": _cmd_hf}


def run_standin(conn, cfg=None, tp=2, label="standin"):
    """Serve an SGLangModel over conn until 'stop' or the parent goes away."""
    # The sink_* commands (dte.sink): this process registers its own arenas
    # with its daemon and applies versions between two commands.
    from . import sink
    sink.install(HANDLERS)
    model = SGLangModel(cfg, tp, label=label)
    try:
        while True:
            try:
                req = conn.recv()
            except (EOFError, OSError):
                return
            if not isinstance(req, tuple) or not req or not isinstance(req[0], str):
                conn.send(("error", "request must be a tuple (command, *args)"))
                continue
            if req[0] == "stop":
                conn.send(("ok", None))
                return
            handler = HANDLERS.get(req[0])
            if handler is None:
                conn.send(("error", "unknown command %r" % req[0]))
                continue
            try:
                conn.send(("ok", handler(model, *req[1:])))
            except Exception as e:  # report, keep serving
                conn.send(("error", "%s: %s\n%s" % (type(e).__name__, e,
                                                    traceback.format_exc(limit=3))))
    finally:
        sink.close_model(model)
        model.close()


class StandinError(RuntimeError):
    pass


class Standin:
    """Parent-side handle: the stand-in in its own (spawned) process."""

    def __init__(self, cfg=None, tp=2, label="standin", timeout=60.0):
        import multiprocessing
        ctx = multiprocessing.get_context("spawn")  # no fork of a threaded torch
        self.timeout = timeout
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=run_standin, args=(child, cfg, tp, label),
                                name="dte-" + label, daemon=True)
        self.proc.start()
        child.close()

    def call(self, cmd, *args):
        self._conn.send((cmd,) + args)
        if not self._conn.poll(self.timeout):
            raise StandinError("stand-in did not answer %r within %.0fs" % (cmd, self.timeout))
        status, result = self._conn.recv()
        if status != "ok":
            raise StandinError("stand-in %r failed: %s" % (cmd, result))
        return result

    def load_hf(self, hf):
        self.call("load_hf", {n: pack(t) for n, t in hf.items()})

    def logits(self, tokens):
        return unpack(self.call("logits", pack(tokens)))

    def to_hf(self):
        return {n: unpack(p) for n, p in self.call("hf").items()}

    def stop(self):
        if self.proc is None:
            return
        try:
            if self.proc.is_alive():
                self.call("stop")
        except (StandinError, OSError, EOFError):
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)
        self._conn.close()
        self.proc = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

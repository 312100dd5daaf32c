#!/usr/bin/python3
"""dte.integrations against real daemons: SGLang's loader and controller,
vLLM's worker extension and controller, with engines faked from the
upstream call paths (tests/system/engines_fake.py says which).

One deployment, one job, four engines: SGLang A (TP=2 with one KV head, so
KV is replicated; FP32 norms as with --rl-on-policy-target; an EAGLE3
draft; runners called target-then-draft as in 0.5.23), SGLang B (TP=1,
draft-then-target as older versions), vLLM AsyncLLM C (TP=2) and vLLM
LLM D (TP=1), replicas 0..3.  A trainer (Megatron TP=1, real AdamW)
publishes 12 versions; after each, every controller syncs its engine and
every worker's parameters must equal RNE-BF16(θ_v) through the
independent converter (tests/system/sglang_reference.py) bit for bit, FP32 norms
as the exact FP32 of it.  Along the way:
  * requests pending in SGLang (running and queued): auto picks retract
    and flushes after the update; none is ever served KV computed with
    other weights than those it runs on (an older SGLang that refuses the
    flush while requests wait: the controller aborts them and flushes);
  * vLLM requests in flight: auto pauses with wait (they finish first);
  * a worker that fails its stage (A rank 1 at v5, C rank 0 at v7) or
    hangs past the controller's timeout (C rank 1 at v9): the sync
    raises, names that worker, and every worker of that engine still
    holds v-1 exactly; the next version applies everywhere;
  * a worker whose commit is lost after every worker agreed (A rank 1 at
    v8): reported as split, generation stays paused, and the next version
    brings every worker level again;
  * an SGLang worker that hangs past the controller's timeout (B at v11):
    the HTTP call times out, the report names it, the engine stays on v10;
  * a Qwen3-MoE job (FSDP-layout trainer): SGLang TP=2 with MoE-TP 2 and
    vLLM TP=2 with expert parallel (vllm:tp=2,ep=2), FusedMoE w13/w2
    checked against the upstream weight loaders' semantics, 10 versions;
  * the draft model is never attached or written; DP attention and a
    MoE model with vLLM dp > 1 are refused with clear errors.
"""

import json
import tempfile

import harness  # sets ROOT and B, puts client/python on sys.path

harness.asan_preload_reexec("DTE_ENGINES_ASAN")

import asyncio  # noqa: E402
import types  # noqa: E402

import torch  # noqa: E402

from dte import _lib, megatron, qwen3, toy  # noqa: E402
from dte.checks import Checks  # noqa: E402
from dte.integrations import _engine, sglang as dsg, vllm as dvl  # noqa: E402
from dte.integrations._engine import IntegrationError, SyncError  # noqa: E402

import engines_fake as fake  # noqa: E402
import sglang_reference as ref  # noqa: E402

JOB, TOKEN = "engines", "t0ken"
CFG = qwen3.make_config(None, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                        vocab_size=500)
CFG_TEXT = json.dumps(CFG)
SRC_LAYOUT = "megatron:tp=1"
VERSIONS = 12
LR, WARMUP = 1e-4, 2


def source(c, sock, model):
    cli = _lib.Client(sock)
    cli.job_create(JOB, CFG_TEXT, TOKEN, "local", 1)
    parts = []
    for r in range(model.tp):
        ids = []
        for (_bid, length, _name), kind in zip(
                _lib.layout_buffers(CFG_TEXT, SRC_LAYOUT, _lib.SOURCE, r),
                ("param", "exp_avg", "exp_avg_sq")):
            ids.append(cli.register_fd(model.arenas[r][kind].fd, 0, length, _lib.FP32, kind))
        parts.append(cli.attach(JOB, TOKEN, _lib.SOURCE, SRC_LAYOUT, r, ids))
    return cli, parts


def compare(want, got):
    """Names whose bits differ: BF16 params against the BF16 expectation,
    FP32 params against its exact FP32 widening."""
    bad = []
    for name, w in want.items():
        g = got[name]
        if g.dtype == torch.float32:
            same = torch.equal(w.float().view(torch.int32), g.view(torch.int32))
        else:
            same = g.dtype == torch.bfloat16 and torch.equal(w.view(torch.int16),
                                                             g.view(torch.int16))
        if not same:
            bad.append(name)
    return bad


def sglang_weights(eng):
    return [{n: fake.unpack(p) for n, p in d.items()} for d in eng.workers.all("weights")]


def refusals(c):
    """Configurations the layouts cannot describe are refused up front."""
    par = dsg._Parallel(0, 4, 2, 1, 1, None)
    c.raises(IntegrationError, lambda: dsg.layout_of(par, CFG_TEXT),
             "sglang: DP attention (attention TP 2 of TP 4) refused")
    try:
        dsg.layout_of(par, CFG_TEXT)
    except IntegrationError as e:
        c.check("DP attention" in str(e) and "attention-TP" in str(e),
                "the DP attention refusal says why: %s" % str(e)[:90])
    c.check(dsg.layout_of(dsg._Parallel(1, 4, 4, 1, 1, None), CFG_TEXT) == "sglang:tp=4",
            "sglang: attention TP == TP is the sglang:tp=4 layout")
    moe = dict(CFG, num_experts=8, moe_intermediate_size=64)
    c.check(dsg.layout_of(dsg._Parallel(0, 4, 4, 2, 1, None), moe) == "sglang:tp=4,ep=2",
            "sglang: MoE with moe_ep_size 2 -> sglang:tp=4,ep=2")
    pc = types.SimpleNamespace(data_parallel_size=2, enable_expert_parallel=True,
                               data_parallel_rank=1)
    c.check(dvl.sink_place(pc, 1, 2, moe, 5) == ("vllm:tp=2,dp=2,ep=4", 3, 5),
            "vllm: MoE with dp 2: the DP group is one replica (5), experts over tp*dp=4 "
            "ranks, DP rank 1 TP rank 1 is rank 3: %s" % (dvl.sink_place(pc, 1, 2, moe, 5),))
    pc0 = types.SimpleNamespace(data_parallel_size=2, enable_expert_parallel=False,
                                data_parallel_rank=1)
    c.check(dvl.sink_place(pc0, 0, 2, moe, 5) == ("vllm:tp=2,dp=2,ep=1", 2, 5),
            "vllm: MoE with dp 2 without expert parallel: MoE-TP over the 4 ranks")
    c.check(dvl.sink_place(pc0, 0, 2, CFG, 5) == ("vllm:tp=2", 0, 6),
            "vllm: dense dp 2: DP rank 1 is replica 5 + 1 at TP rank 0")
    pc1 = types.SimpleNamespace(data_parallel_size=1, enable_expert_parallel=True)
    c.check(dvl.layout_of(pc1, 2, moe) == "vllm:tp=2,ep=2", "vllm: EP within one engine: ep = tp")
    c.check(dvl.layout_of(pc, 2, CFG) == "vllm:tp=2", "vllm: dense dp 2: each DP rank a replica")
    c.raises(ValueError, lambda: dsg.SGLangController("http://x", JOB, TOKEN, CFG_TEXT,
                                                      mode="in_place"),
             "sglang: pause mode in_place refused")
    c.raises(ValueError, lambda: dvl.VLLMController(None, JOB, TOKEN, CFG_TEXT, mode="keep"),
             "vllm: pause mode keep refused")
    c.check(dsg.is_draft(type("LlamaForCausalLMEagle3", (), {})()) and
            dsg.is_draft(type("Qwen3MoeForCausalLMMTP", (), {})()) and
            not dsg.is_draft(type("Qwen3ForCausalLM", (), {})()), "draft classes recognised")


def sink_refusals(c, sock):
    """A model the layout cannot fill completely is refused before anything
    is registered; ignore= names parameters that stay the engine's own."""
    base = dict(fake.make_model("Qwen3ForCausalLM", fake.target_shapes(CFG, 1), False, 1)
                .named_parameters())
    att = _engine.attach_request(sock, JOB, TOKEN, CFG_TEXT, replica=9)
    extra = dict(base)
    extra["model.rotary_extra"] = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    c.raises(IntegrationError, lambda: _engine.EngineSink(extra.items(), 0, "sglang:tp=1", att),
             "a parameter no layout buffer fills is refused")
    half = dict(base)
    half["model.norm.weight"] = torch.nn.Parameter(torch.zeros(CFG["hidden_size"],
                                                               dtype=torch.float16))
    c.raises(IntegrationError, lambda: _engine.EngineSink(half.items(), 0, "sglang:tp=1", att),
             "an FP16 parameter is refused")
    gone = dict(base)
    del gone["lm_head.weight"]
    c.raises(IntegrationError, lambda: _engine.EngineSink(gone.items(), 0, "sglang:tp=1", att),
             "a missing parameter is refused")
    es = _engine.EngineSink(extra.items(), 0, "sglang:tp=1",
                            dict(att, ignore=["model.rotary_extra"]))
    c.check(len(es.parts) == 1, "ignore= lets the engine keep a parameter of its own")
    es.close()
    # A layer whose quant_method post-processes its weights after loading
    # (an FP8 method; SGLang's and vLLM's Fp8LinearMethod) computes from
    # something other than the parameter: refused at attach, naming it.
    quant = fake.make_model("Qwen3ForCausalLM", fake.target_shapes(CFG, 1), False, 1)
    qkv = torch.nn.Module()
    qkv.quant_method = type("Fp8LinearMethod", (), {})()
    qkv.weight = quant._parameters.pop("model.layers.1.self_attn.qkv_proj.weight")
    quant._modules["model.layers.1.self_attn.qkv_proj"] = qkv
    for view in (dsg.SGLangComputeView(quant), dvl.VLLMComputeView(quant)):
        c.raises(IntegrationError, lambda view=view: _engine.EngineSink(
            quant.named_parameters(), 0, "sglang:tp=1", att, view=view),
            "%s: a quantized layer is refused at attach" % view.engine)
    unq = type("UnquantizedLinearMethod", (), {})()
    qkv.quant_method = unq
    # vLLM-CPU's dispatch_cpu_unquantized_gemm(remove_weight=True) leaves an
    # empty parameter and computes from layer.cpu_linear: refused, saying why
    # and what makes it work.
    full = qkv.weight
    qkv.weight = torch.nn.Parameter(torch.empty(0, dtype=torch.bfloat16), requires_grad=False)
    qkv.cpu_linear = lambda x, w, b: x
    c.raises(IntegrationError, lambda: _engine.EngineSink(
        quant.named_parameters(), 0, "sglang:tp=1", att, view=dvl.VLLMComputeView(quant)),
        "vllm: a CPU GEMM layer whose weight vLLM dropped is refused, naming "
        "DTE_VLLM_CPU_KEEP_WEIGHTS")
    try:
        _engine.EngineSink(quant.named_parameters(), 0, "sglang:tp=1", att,
                           view=dvl.VLLMComputeView(quant))
    except IntegrationError as e:
        c.check("qkv_proj" in str(e) and "DTE_VLLM_CPU_KEEP_WEIGHTS" in str(e) and
                "worker_extension_cls" in str(e), "the refusal names the layer and the setting: "
                "%s" % e)
    qkv.weight = full
    del qkv.cpu_linear
    es = _engine.EngineSink(quant.named_parameters(), 0, "sglang:tp=1", att,
                            view=dsg.SGLangComputeView(quant))
    c.check(len(es.parts) == 1, "the same layer unquantized attaches")
    es.close()


# ---- MoE: FusedMoE w13/w2 with MoE-TP (SGLang) and expert parallel (vLLM) ----
JOB_MOE = "engines-moe"
CFG_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
           "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
           "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
           "mlp_only_layers": [], "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 200,
           "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "rope_theta": 1e6}
MOE_VERSIONS = 10


def hf_moe_shapes(cfg):
    """transformers' Qwen3MoeForCausalLM tensor names and shapes."""
    H, Im, E, V = (cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["num_experts"],
                   cfg["vocab_size"])
    nH, nKV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    s = {"model.embed_tokens.weight": (V, H)}
    for n in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % n
        s.update({p + "input_layernorm.weight": (H,), p + "self_attn.q_proj.weight": (nH * hd, H),
                  p + "self_attn.k_proj.weight": (nKV * hd, H),
                  p + "self_attn.v_proj.weight": (nKV * hd, H),
                  p + "self_attn.o_proj.weight": (H, nH * hd),
                  p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                  p + "post_attention_layernorm.weight": (H,), p + "mlp.gate.weight": (E, H)})
        for e in range(E):
            q = p + "mlp.experts.%d." % e
            s.update({q + "gate_proj.weight": (Im, H), q + "up_proj.weight": (Im, H),
                      q + "down_proj.weight": (H, Im)})
    s["model.norm.weight"] = (H,)
    s["lm_head.weight"] = (V, H)
    return s


# tests/system/engines_upstream.py runs SGLang 0.5.23's FusedMoE and vLLM
# 0.33.0's FusedMoEFactory weight loaders on the CPU and checks them against
# this very function (and the dense layers against sglang_reference.py).
def moe_expected(hf, cfg, tp, ep):
    """Per rank, what the engine's own weight loaders put where, written
    from their semantics: VocabParallelEmbedding.weight_loader (rows of the
    rank, padding zero), QKVParallelLinear.weight_loader (q heads of the
    rank; KV heads split, or one replicated when tp >= kv heads),
    RowParallelLinear (o_proj columns), ReplicatedLinear (router) and
    FusedMoE._load_w13 / _load_w2 (expert e of ep rank e // (E/ep): w1 into
    the first half of w13, w3 into the second, each narrowed to the MoE-TP
    rank's rows; w2 narrowed on dim 1)."""
    H, V, E, Im = cfg["hidden_size"], cfg["vocab_size"], cfg["num_experts"], \
        cfg["moe_intermediate_size"]
    nH, nKV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    Vp = (V + 63) // 64 * 64
    mtp, El = tp // ep, E // ep
    Ip = Im // mtp
    out = []
    for r in range(tp):
        ep_rank, mt = r // mtp, r % mtp
        kv = [r // (tp // nKV)] if tp >= nKV else list(range(r * nKV // tp, (r + 1) * nKV // tp))
        q = nH // tp

        def rows(w, heads):
            return torch.cat([w[h * hd:(h + 1) * hd] for h in heads], 0)

        def vocab(w):
            pad = torch.zeros(Vp, H, dtype=w.dtype)
            pad[:V] = w
            return pad[r * Vp // tp:(r + 1) * Vp // tp].clone()
        d = {"model.embed_tokens.weight": vocab(hf["model.embed_tokens.weight"]),
             "lm_head.weight": vocab(hf["lm_head.weight"]),
             "model.norm.weight": hf["model.norm.weight"]}
        for n in range(cfg["num_hidden_layers"]):
            p = "model.layers.%d." % n
            for k in ("input_layernorm.weight", "post_attention_layernorm.weight",
                      "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate.weight"):
                d[p + k] = hf[p + k]
            d[p + "self_attn.qkv_proj.weight"] = torch.cat((
                rows(hf[p + "self_attn.q_proj.weight"], range(r * q, (r + 1) * q)),
                rows(hf[p + "self_attn.k_proj.weight"], kv),
                rows(hf[p + "self_attn.v_proj.weight"], kv)), 0)
            d[p + "self_attn.o_proj.weight"] = \
                hf[p + "self_attn.o_proj.weight"][:, r * q * hd:(r + 1) * q * hd]
            w13, w2 = [], []
            for e in range(ep_rank * El, (ep_rank + 1) * El):
                x = p + "mlp.experts.%d." % e
                w13.append(torch.cat((hf[x + "gate_proj.weight"][mt * Ip:(mt + 1) * Ip],
                                      hf[x + "up_proj.weight"][mt * Ip:(mt + 1) * Ip]), 0))
                w2.append(hf[x + "down_proj.weight"][:, mt * Ip:(mt + 1) * Ip])
            d[p + "mlp.experts.w13_weight"] = torch.stack(w13)
            d[p + "mlp.experts.w2_weight"] = torch.stack(w2)
        out.append(d)
    return out


def moe_phase(c, sock, tmp):
    from dte.source import Source
    cfg_text = json.dumps(CFG_MOE)
    g = torch.Generator().manual_seed(7)
    params = {n: torch.nn.Parameter(torch.randn(sh, generator=g) * 0.02)
              for n, sh in hf_moe_shapes(CFG_MOE).items()}
    targets = {n: torch.randn(p.shape, generator=g) * 0.02 for n, p in params.items()}
    opt = torch.optim.AdamW([
        {"params": [p for p in params.values() if p.dim() > 1], "weight_decay": 0.01},
        {"params": [p for p in params.values() if p.dim() == 1], "weight_decay": 0.0}], lr=1e-3)
    src = Source.hf(params, opt, sock, JOB_MOE, TOKEN, cfg_text)
    S = fake.FakeSGLangServer(CFG_MOE, 2, tmp, "moe-sglang")          # MoE-TP 2
    L = fake.FakeLLM(CFG_MOE, 2, ep=True)                               # EP 2, MoE-TP 1
    exact = {"sglang": 0, "vllm": 0}
    try:
        cs = dsg.SGLangController(S.url, JOB_MOE, TOKEN, cfg_text, socket=sock, replica=0)
        cv = dvl.VLLMController(L, JOB_MOE, TOKEN, cfg_text, socket=sock, replica=1)
        cs.attach()
        att = cv.attach()
        c.check([r.get("layout") for r in att] == ["vllm:tp=2,ep=2"] * 2,
                "vLLM with enable_expert_parallel attaches vllm:tp=2,ep=2: %s"
                % [r.get("layout") for r in att])
        for v in range(1, MOE_VERSIONS + 1):
            opt.zero_grad()
            sum(((p - targets[n]) ** 2).sum() for n, p in params.items()).backward()
            opt.step()
            src.publish(v)
            hf = {n: p.detach().to(torch.bfloat16) for n, p in params.items()}
            for kind, ctl_, eng, ep in (("sglang", cs, S, 1), ("vllm", cv, L, 2)):
                rep = ctl_.sync(v, raise_on_failure=False)
                got = sglang_weights(eng) if kind == "sglang" else eng.weights()
                bad = []
                for r, (w, g_) in enumerate(zip(moe_expected(hf, CFG_MOE, 2, ep), got)):
                    if kind == "vllm":   # vLLM's own names for the experts
                        w = {fake.vllm_moe_name(n): t for n, t in w.items()}
                    bad += ["rank %d %s" % (r, n) for n in compare(w, g_)]
                c.check(rep.ok and not bad, "MoE v%d %s: %s %s" % (v, kind, rep.summary(), bad[:3]))
                exact[kind] += rep.ok and not bad
    finally:
        S.stop()
        L.stop()
        src.close()
    return exact


def main():
    c = Checks("engines")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    refusals(c)
    tmp = tempfile.mkdtemp(prefix="dte-engines-")
    daemon = harness.Daemon(tmp, "engines")
    sock = daemon.sock
    engines = []
    exact = {"sglang": 0, "vllm": 0}
    try:
        daemon.start()
        model = megatron.MegatronModel(CFG, tp=1, seed=0, label="eng-src", placement=SRC_LAYOUT)
        trainer = megatron.Trainer(model, lr=LR, warmup=WARMUP)
        task = toy.ToyTask(CFG["vocab_size"])
        tcli, src = source(c, sock, model)

        sink_refusals(c, sock)
        A = fake.FakeSGLangServer(CFG, 2, tmp, "A", fp32_norms=True, draft=True,
                                  order=("target", "draft"))
        engines.append(A)
        # B: an SGLang before 0.5.23 (no sessions or selector: the draft's
        # runner is called first; the flush counts queued requests while paused).
        B = fake.FakeSGLangServer(CFG, 1, tmp, "B", draft=True, order=("draft", "target"),
                                  sessions=False, flush_ignores_paused_waiting=False)
        engines.append(B)
        C = fake.FakeAsyncLLM(CFG, 2)
        engines.append(C)
        D = fake.FakeLLM(CFG, 1)
        engines.append(D)
        fake.install_io_struct()
        # A is driven through its HTTP API on odd versions and as an
        # in-process sglang.Engine on even ones (no selector there: the
        # draft's runner is called too, after the target's).
        ctl_a_engine = dsg.SGLangController(fake.FakeEngine(A), JOB, TOKEN, CFG_TEXT, socket=sock,
                                            replica=0, timeout_s=60)
        c.check(isinstance(ctl_a_engine.surface, dsg._Engine), "an Engine gets the Engine path")
        ctl = {
            "A": dsg.SGLangController(A.url, JOB, TOKEN, CFG_TEXT, socket=sock, replica=0,
                                      timeout_s=60),
            "B": dsg.SGLangController(B.url, JOB, TOKEN, CFG_TEXT, socket=sock, replica=1,
                                      timeout_s=60),
            "C": dvl.VLLMController(C, JOB, TOKEN, CFG_TEXT, socket=sock, replica=2,
                                    timeout_s=60),
            "D": dvl.VLLMController(D, JOB, TOKEN, CFG_TEXT, socket=sock, replica=3,
                                    timeout_s=60),
        }
        wa = ctl["A"].attach()
        c.check(sorted(wa) == [0, 1] and all(w["tp"] == 2 for w in wa.values()),
                "SGLang A: both TP workers attached (the target; daemon: %s)" % wa)
        c.check(sorted(ctl["B"].attach()) == [0], "SGLang B: its worker attached")
        c.check(all(r["ok"] for r in asyncio.run(ctl["C"].attach_async())),
                "vLLM AsyncLLM C: both workers attached through collective_rpc")
        c.check(all(r["ok"] for r in ctl["D"].attach()), "vLLM LLM D: attached")
        E = fake.FakeLLM(CFG, 1)
        try:
            bad = dvl.VLLMController(E, JOB, "not-the-token", CFG_TEXT, socket=sock, replica=4)
            try:
                bad.attach()
                c.check(False, "an engine with the wrong token attached")
            except IntegrationError as e:
                c.check("token" in str(e), "wrong token: attach refused clearly (%s)"
                        % str(e)[:100])
        finally:
            E.stop()
        c.check(all(A.workers.all("draft_untouched")) and all(B.workers.all("draft_untouched")),
                "the EAGLE3 draft was not attached (either call order)")

        expected = {}
        for v in range(1, VERSIONS + 1):
            rec = trainer.step(*task.batch_at(v))
            for p in src:
                tcli.publish(JOB, p, v, rec["step"], harness.groups_of(rec))
            # The independent converter (tests/system/sglang_reference.py,
            # written from Megatron-Core's and SGLang's sources, no dte
            # code): the trainer's FP32 shards -> RNE-BF16 per engine rank.
            theta = [{n: p.detach().clone() for n, p in ps.items()} for ps in model.params]
            expected[v] = {tp: [{n: t.view(torch.bfloat16) for n, t in rank.items()}
                                for rank in ref.expected_sink(theta, CFG, model.tp, tp)]
                           for tp in (1, 2)}
            want_at = {"A": v, "B": v, "C": v, "D": v}

            # --- SGLang ---
            if v in (3, 6, 9, 11):
                A.submit("a%d-run0" % v, "sys-prompt", running=True)
                A.submit("a%d-run1" % v, "p%d" % v, running=True)
                A.submit("a%d-wait" % v, "sys-prompt", running=False)
            if v == 10:
                B.submit("b10-run", "q", running=True)
                B.submit("b10-wait", "q", running=False)
            if v == 5:
                A.workers.send(1, "inject", "stage_raises")
                A.workers.recv(1)
            if v == 8:
                A.workers.send(1, "inject", "commit_raises")
                A.workers.recv(1)
            if v == 11:
                B.workers.send(0, "inject", "stage_hangs:6")
                B.workers.recv(0)
                ctl["B"].timeout_s = 3.0
            for name, eng in (("A", A), ("B", B)):
                try:
                    rep = (ctl_a_engine if name == "A" and v % 2 == 0 else ctl[name]).sync(v)
                except SyncError as e:
                    rep = e.report
                if name == "A" and v == 5:
                    want_at["A"] = 4
                    c.check(not rep.ok and 1 in rep.failed and not rep.split and
                            "continued" in rep.actions,
                            "v5: A rank 1 failed its stage: reported (%s), engine resumed on v4"
                            % rep.failed)
                    c.check(all(w["applied"] == 4 and w["staged"] >= 5
                                for w in rep.workers.values()),
                            "v5: the daemon staged v5 on both ranks, neither applied it: %s"
                            % rep.workers)
                elif name == "B" and v == 11:
                    want_at["B"] = 10
                    ctl["B"].timeout_s = 60.0
                    c.check(not rep.ok and not rep.split and 0 in rep.failed and
                            any("update_weights_from_tensor raised" in a and "timed out" in a
                                for a in rep.actions) and "continued" in rep.actions,
                            "v11: B's worker hung past the timeout: reported, still v10, "
                            "continued (%s)" % rep.summary())
                elif name == "A" and v == 8:
                    want_at["A"] = {0: 8, 1: 7}
                    c.check(not rep.ok and rep.split and "continued" not in rep.actions and
                            eng.is_pause and rep.failed.keys() == {1},
                            "v8: A rank 1 lost its commit after the agreement: reported as "
                            "split, generation stays paused (%s)" % rep.summary())
                else:
                    c.check(rep.ok, "v%d %s: %s" % (v, name, rep.summary()))
                if name == "A" and v in (3, 6, 9, 11):
                    c.check(rep.mode == "retract" and rep.pending == 3 and
                            any(a.startswith("flush_cache: ok") for a in rep.actions),
                            "v%d A: 3 pending -> retract, explicit flush ok (%s)"
                            % (v, rep.actions))
                elif name == "B" and v == 10:
                    c.check(rep.mode == "retract" and
                            any("refused" in a for a in rep.actions) and
                            any(a.startswith("abort_request") and a.endswith("ok")
                                for a in rep.actions),
                            "v10 B: flush refused while requests wait -> abort, flush (%s)"
                            % rep.actions)
                elif not (name == "A" and v == 5) and not (name == "B" and v == 11):
                    c.check(rep.mode == "abort" and rep.pending == 0,
                            "v%d %s: nothing pending -> abort with the update's flush" % (v, name))
                eng.run_until_idle()
                c.check(not eng.stale_served(), "v%d %s: no request ran on KV of other weights "
                        "(%s)" % (v, name, eng.stale_served()[:3]))
                c.check(eng.session is None and eng.is_pause == (name == "A" and v == 8),
                        "v%d %s: session closed, generation %s" % (
                            v, name, "paused" if name == "A" and v == 8 else "continued"))

            # --- vLLM ---
            if v in (4, 8):
                C.submit("c%d-0" % v)
                C.submit("c%d-1" % v)
            if v == 7:
                C.workers.send(0, "inject", "stage_raises")
                C.workers.recv(0)
            if v == 9:
                C.workers.send(1, "inject", "stage_hangs:6")
                C.workers.recv(1)
                ctl["C"].timeout_s = 3.0
            try:
                rep = asyncio.run(ctl["C"].sync_async(v))
            except SyncError as e:
                rep = e.report
            ctl["C"].timeout_s = 60.0
            if v == 7:
                want_at["C"] = 6
                c.check(not rep.ok and 0 in rep.failed and "injected" in str(rep.failed[0]) and
                        "resumed" in rep.actions and not rep.split,
                        "v7: C rank 0 failed its stage: reported, nothing committed, resumed "
                        "(%s)" % rep.summary())
            elif v == 9:
                want_at["C"] = 8
                c.check(not rep.ok and "TimeoutError" in (rep.error or "") and
                        "resumed" in rep.actions and "dte_apply" in C.rpcs and
                        not any(a == "committed" for a in rep.actions),
                        "v9: C rank 1 hung past the timeout: reported, nothing committed (%s)"
                        % rep.summary())
                c.check(all(w.get("applied") == 8 for w in rep.workers.values()),
                        "v9: every C worker still at v8: %s" % rep.workers)
            else:
                c.check(rep.ok, "v%d C: %s" % (v, rep.summary()))
            if v in (4, 8):
                c.check(rep.mode == "wait" and not C.in_flight and
                        all(kv == w for _i, kv, w in C.served),
                        "v%d C: in-flight requests finished under the old weights (wait)" % v)
            rep = ctl["D"].sync(v)
            c.check(rep.ok and D.prefix_resets >= v, "v%d D: %s" % (v, rep.summary()))

            # --- exactness, every worker of every engine ---
            ok = {"sglang": True, "vllm": True}
            for name, eng, kind in (("A", A, "sglang"), ("B", B, "sglang"), ("C", C, "vllm"),
                                    ("D", D, "vllm")):
                got = sglang_weights(eng) if kind == "sglang" else eng.weights()
                for r, g in enumerate(got):
                    at = want_at[name][r] if isinstance(want_at[name], dict) else want_at[name]
                    bad = compare(expected[at][len(got)][r], g)
                    if bad:
                        ok[kind] = False
                        print("v%d %s rank %d differs from v%d: %s" % (
                            v, name, r, at, ", ".join(bad[:4])), flush=True)
                if name == "A":
                    c.check(all(t.dtype == torch.float32 for n, t in got[0].items()
                                if n.endswith("norm.weight")),
                            "A's norms are FP32 parameters")
            for k in ok:
                exact[k] += ok[k]
        c.check(all(A.workers.all("draft_untouched")) and all(B.workers.all("draft_untouched")),
                "after %d versions the draft model is still untouched" % VERSIONS)
        c.check(C.pauses and all(cc for _m, cc in C.pauses), "vLLM pauses all clear the cache")
        c.check(exact["sglang"] == VERSIONS and exact["vllm"] == VERSIONS,
                "every engine exact at every version (sglang %d, vllm %d of %d)"
                % (exact["sglang"], exact["vllm"], VERSIONS))
        moe = moe_phase(c, sock, tmp)
        print("engines-moe: sglang=%d/%d vllm=%d/%d exact" % (
            moe["sglang"], MOE_VERSIONS, moe["vllm"], MOE_VERSIONS), flush=True)
        st = harness.dtectl(sock, "status")
        c.check(st.returncode == 0, "daemon still serving")
        tcli.close()
        trainer.close()
    finally:
        for e in engines:
            try:
                e.stop()
            except Exception as ex:
                print("stop: %s" % ex)
        daemon.stop(10)
    print("engines: sglang=%d/%d vllm=%d/%d exact" % (exact["sglang"], VERSIONS,
                                                       exact["vllm"], VERSIONS), flush=True)
    c.finish(versions=VERSIONS)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Source.hf on real transformers 5 models, and trainer memory replaced.

(a) moe: a tiny transformers 5 Qwen3MoeForCausalLM (random init, config
    built in code, no hub), whose experts are fused parameters
    (mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]), trained
    with real torch AdamW (three param groups, an lr schedule) through
    Source.hf(dict(model.named_parameters()), ...).  Top-2 of 8 routing on
    a few tokens leaves some experts without tokens on some steps (their
    rows get zero gradients but still step: weight decay, momentum), and on
    some steps whole tensors get no gradient at all (grad None: they do not
    step and their own step count falls behind; the old Source.hf stopped
    with "parameters disagree on the step count").
(b) dense: a tiny Qwen3ForCausalLM whose trainer replaces registered memory
    after attach: optimizer.load_state_dict(deepcopy of its state_dict),
    an offload of the optimizer state and of the parameters and back (new
    allocations, as colocated RL frameworks do), also right before a mark
    and between a step and its publish.  The Source adopts each replaced
    tensor back before the capture; every version stays exact.
(c) refusals: a replaced tensor that cannot be adopted back (another dtype,
    another shape, a state entry gone) fails the publish with a SourceError
    naming the tensor, and the Source publishes again once the trainer
    holds the memory again; the flat layout (Source.megatron) refuses a
    step in which a tensor had no gradient.  (A replaced CUDA tensor, the
    other refusal, needs a GPU.)

After every version every element of an SGLang-layout TP=2 sink must equal
RNE-BF16(θ_t), θ_t converted to the checkpoint's per-expert names by this
file's own converter (plain slicing of the fused tensors as transformers'
Qwen3MoeExperts.forward reads them, checked against that forward) and to
the sink by tests/system/layout_reference.py.  The daemon gets the config
transformers writes (num_local_experts, no num_experts); only the
reference converter is handed num_experts as well.

Runs in /opt/dted-vllm (transformers 5, torch 2.x; scripts/install-deps.sh).
Prints `source-real: models=N versions=V exact=V/V replaced=R readopted=R`.
"""

import copy
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

if __name__ == "__main__":   # transformers 5, torch 2.x
    harness.venv_reexec(os.environ.get("DTE_HF5_PYTHON", harness.VLLM_PY))

import torch  # noqa: E402

from dte.checks import Checks  # noqa: E402

SINK_TP = 2
MOE_STEPS = 10
DENSE_STEPS = 10


# ---- the test's own converter: fused experts -> checkpoint names ----------------------

def canonical(model):
    """θ (FP32) under the checkpoint's names.  transformers 5
    (models/qwen3_moe/modeling_qwen3_moe.py, Qwen3MoeExperts.forward):
    `gate, up = linear(x, gate_up_proj[e]).chunk(2, dim=-1)` and
    `linear(act(gate) * up, down_proj[e])`: the first half of
    gate_up_proj[e]'s rows is gate_proj.weight, the second up_proj.weight,
    down_proj[e] is down_proj.weight."""
    out = {}
    for n, p in model.named_parameters():
        t = p.detach().clone()
        if n.endswith(".mlp.experts.gate_up_proj"):
            base = n[:-len("gate_up_proj")]
            for e in range(t.shape[0]):
                gate, up = t[e].chunk(2, dim=0)
                out[base + "%d.gate_proj.weight" % e] = gate
                out[base + "%d.up_proj.weight" % e] = up
        elif n.endswith(".mlp.experts.down_proj"):
            base = n[:-len("down_proj")]
            for e in range(t.shape[0]):
                out[base + "%d.down_proj.weight" % e] = t[e]
        else:
            out[n] = t
    return out


def converter_follows_forward(c, model):
    """The converter's per-expert weights give what transformers' own
    experts module computes for a token routed to that expert alone."""
    experts = model.model.layers[0].mlp.experts
    w = canonical(model)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, model.config.hidden_size, generator=g)
    worst = 0.0
    with torch.no_grad():
        for e in range(model.config.num_experts):
            idx = torch.full((5, 1), e, dtype=torch.long)
            got = experts(x, idx, torch.ones(5, 1))
            q = "model.layers.0.mlp.experts.%d." % e
            h = torch.nn.functional.silu(x @ w[q + "gate_proj.weight"].T) * \
                (x @ w[q + "up_proj.weight"].T)
            want = h @ w[q + "down_proj.weight"].T
            worst = max(worst, float((got - want).abs().max() / want.abs().max()))
    c.check(worst < 1e-5, "the converter's expert weights reproduce Qwen3MoeExperts.forward "
            "(%s implementation; worst relative difference %.2g)"
            % (model.config._experts_implementation, worst))


# ---- a sink and its exactness -----------------------------------------------------------

class SinkSide:
    def __init__(self, sock, job, cfg_text, ref_cfg):
        import trainers_lib as tl
        from dte import sink as dsink
        self.tl, self.ref, self.ref_cfg = tl, tl.layout_reference(), ref_cfg
        self.arenas = tl.SglangSinkArenas(cfg_text, SINK_TP, label=job + "-sink")
        self.sink = dsink.Sink(sock, job, "tok", cfg_text, self.arenas.layout)
        self.arenas.attach(self.sink)

    def exact(self, v, model):
        """(differing elements, elements checked); (-1, 0) when the sink
        could not apply v (its checksum failed: a missed change)."""
        try:
            self.sink.apply(v, timeout_ms=60000)
        except Exception as e:  # the check that uses this fails, naming it
            print("sink apply of v%d: %s: %s" % (v, type(e).__name__, e), flush=True)
            return -1, 0
        bad, total = self.tl.sink_mismatches(self.ref, self.ref_cfg, self.arenas,
                                             canonical(model), SINK_TP)
        return bad, total

    def close(self):
        self.sink.close()
        self.arenas.close()


def in_arenas(src, tensors):
    return all(any(a.contains(t) for a in src.arenas) for t in tensors)


def three_groups(model, lr):
    """Decay for matrices, none for 1-D tensors, a smaller lr for routers."""
    router = [p for n, p in model.named_parameters() if n.endswith(".mlp.gate.weight")]
    rid = {id(p) for p in router}
    mats = [p for p in model.parameters() if p.dim() > 1 and id(p) not in rid]
    vecs = [p for p in model.parameters() if p.dim() == 1]
    groups = [{"params": mats, "weight_decay": 0.05}, {"params": vecs, "weight_decay": 0.0}]
    if router:
        groups.append({"params": router, "weight_decay": 0.0, "lr": lr / 2})
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def batch(gen, vocab, n):
    tokens = torch.randint(0, vocab, (1, n), generator=gen)
    return tokens


# ---- (a) transformers 5 Qwen3-MoE, fused experts -----------------------------------------

def moe_case(c, sock, tot):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    from dte.source import Source
    cfg = Qwen3MoeConfig(vocab_size=256, hidden_size=64, intermediate_size=96,
                         moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, num_experts=8,
                         num_experts_per_tok=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    torch.manual_seed(5)
    model = Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(".mlp.gate.weight"):
                # More spread than HF's 0.02 init, so routing moves from
                # step to step; well inside (-1, 1): trainers_lib's
                # reference marks sink padding with the value -1.0.
                p.normal_(0.0, 0.1)
    cfg_text = model.config.to_json_string()
    d = json.loads(cfg_text)
    c.check("num_local_experts" in d and "num_experts" not in d,
            "transformers 5 writes num_local_experts (not num_experts) in config.json")
    ref_cfg = dict(d, num_experts=d["num_local_experts"])
    converter_follows_forward(c, model)
    names0 = [(n, id(p)) for n, p in model.named_parameters()]
    opt = three_groups(model, 2e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.3 * s))
    job = "hf5-moe"
    src = Source.hf(dict(model.named_parameters()), opt, sock, job, "tok", cfg_text,
                    label=job)
    side = None
    try:
        fused = [p for n, p in model.named_parameters() if ".mlp.experts." in n]
        c.check(src.layout == "fsdp2:dp=1" and len(fused) == 4 and in_arenas(src, fused) and
                [(n, id(p)) for n, p in model.named_parameters()] == names0,
                "Source.hf registered the fused experts in place: same names, same Parameter "
                "objects, their memory in the Source's memfd arenas (layout %s)" % src.layout)
        nshards = len(src.shards[0])
        # Per layer: q, k, v, o, q_norm, k_norm, two layer norms, the
        # router, 3 per expert; then embed_tokens, norm, lm_head.
        c.check(nshards == 2 * (9 + 3 * 8) + 3,
                "one shard per checkpoint tensor, experts as views of the fused ones (%d)"
                % nshards)
        side = SinkSide(sock, job, cfg_text, ref_cfg)
        gen = torch.Generator().manual_seed(9)
        idle = unstepped = dense_after_first = 0
        for step in range(MOE_STEPS):
            tokens = batch(gen, cfg.vocab_size, 6)
            opt.zero_grad(set_to_none=True)
            out = model(input_ids=tokens, labels=tokens)
            out.loss.backward()
            for n, p in model.named_parameters():
                if n.endswith(".mlp.experts.gate_up_proj"):
                    idle += int((p.grad.flatten(1).abs().sum(1) == 0).sum())
            if step % 3 == 1:
                # No gradient at all: a layer no token reached, a frozen module.
                for n, p in model.named_parameters():
                    if n.startswith("model.layers.1.mlp.") or n.endswith("0.self_attn.q_norm.weight"):
                        p.grad = None
                        unstepped += 1
            opt.step()
            sched.step()
            v = step + 1
            info = src.publish(v)
            bad, total = side.exact(v, model)
            tot["versions"] += 1
            tot["exact"] += bad == 0 and total > 0
            dense_after_first += v > 1 and bool(info["dense"])
            c.check(bad == 0 and total > 0, "moe v%d: %d of %d sink elements differ from "
                    "RNE(θ) (%s)" % (v, bad, total, "dense" if info["dense"] else "sparse"))
        steps = {int(float(st["step"])) for st in opt.state.values()}
        c.check(idle > 0, "some experts got no token on some steps (%d expert-steps)" % idle)
        c.check(unstepped > 0 and len(steps) > 1,
                "tensors without a gradient did not step: own step counts %s" % sorted(steps))
        c.check(dense_after_first == 0, "every version after the first went sparse")
    finally:
        if side:
            side.close()
        src.close()
    tot["models"] += 1


# ---- (b) dense Qwen3, registered memory replaced -----------------------------------------

def replace_state(opt, how):
    """The optimizer's moments in new allocations; returns how many."""
    n = 0
    for st in opt.state.values():
        for k in ("exp_avg", "exp_avg_sq"):
            st[k] = how(st[k])
            n += 1
    return n


def offload_state(opt):
    """verl-style: state[k] = value.to(offload device), later back: two
    new allocations each, the second kept."""
    replace_state(opt, lambda t: t.to("cpu", copy=True))
    return replace_state(opt, lambda t: t.clone())


def offload_params(model):
    """param.data = param.data.to(offload device), later back."""
    n = 0
    for p in model.parameters():
        p.data = p.data.clone()
        p.data = p.data.clone()
        n += 1
    return n


def dense_case(c, sock, tot):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from dte.source import Source
    cfg = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(6)
    model = Qwen3ForCausalLM(cfg)
    cfg_text = model.config.to_json_string()
    ref_cfg = json.loads(cfg_text)
    opt = three_groups(model, 1e-3)
    job = "hf5-dense"
    src = Source.hf(dict(model.named_parameters()), opt, sock, job, "tok", cfg_text, label=job)
    side = None
    replaced = 0
    try:
        side = SinkSide(sock, job, cfg_text, ref_cfg)
        gen = torch.Generator().manual_seed(4)
        v = 0
        for step in range(DENSE_STEPS):
            what = ""
            if step == 2:
                # A checkpoint loaded after attach: new state tensors.
                opt.load_state_dict(copy.deepcopy(opt.state_dict()))
                replaced += 2 * len(opt.state)
                what = "load_state_dict"
            elif step == 4:
                replaced += offload_state(opt)
                what = "optimizer state offloaded and back"
            elif step == 6:
                replaced += offload_params(model)
                what = "params offloaded and back"
            opt.zero_grad(set_to_none=True)
            tokens = batch(gen, cfg.vocab_size, 8)
            model(input_ids=tokens, labels=tokens).loss.backward()
            if step == 1:
                # A tensor without a gradient (a frozen norm): it does not step.
                model.model.layers[0].self_attn.q_norm.weight.grad = None
                what = "q_norm without a gradient"
            opt.step()
            if step == 8:
                # Between the step and its publish.
                replaced += offload_state(opt) + offload_params(model)
                what = "state and params replaced after the step"
            if step in (3, 6):
                # Not published: marked.  A mark adopts back too (step 7:
                # the params replaced before it).
                before = src.readopted
                src.mark()
                want = len(list(model.parameters())) if step == 6 else 0
                c.check(src.readopted - before == want, "mark after step %d adopted back %d "
                        "tensors (want %d)" % (step + 1, src.readopted - before, want))
                continue
            v += 1
            before = src.readopted
            info = src.publish(v)
            bad, total = side.exact(v, model)
            tot["versions"] += 1
            tot["exact"] += bad == 0 and total > 0
            c.check(bad == 0 and total > 0, "dense v%d (step %d%s): %d of %d sink elements "
                    "differ from RNE(θ) (%s, %d adopted back)" % (
                        v, step + 1, ", " + what if what else "", bad, total,
                        "dense" if info["dense"] else "sparse", src.readopted - before))
        held = [p for p in model.parameters()] + \
            [st[k] for st in opt.state.values() for k in ("exp_avg", "exp_avg_sq")]
        c.check(in_arenas(src, held), "after every replacement the model and the optimizer "
                "hold the Source's memfd memory again")
        c.check(replaced == src.readopted and replaced > 0,
                "every replaced tensor was adopted back (replaced %d, adopted %d)"
                % (replaced, src.readopted))
        tot["replaced"] += replaced
        tot["readopted"] += src.readopted
        refusals(c, model, opt, src, side, v, tot)
    finally:
        if side:
            side.close()
        src.close()
    tot["models"] += 1


# ---- (c) what cannot be adopted back ------------------------------------------------------

def refusals(c, model, opt, src, side, v, tot):
    from dte.source import SourceError
    gen = torch.Generator().manual_seed(8)

    def step():
        opt.zero_grad(set_to_none=True)
        tokens = batch(gen, model.config.vocab_size, 8)
        model(input_ids=tokens, labels=tokens).loss.backward()
        opt.step()

    named = dict(model.named_parameters())
    q = "model.layers.0.self_attn.q_proj.weight"
    p = named[q]
    st = opt.state[p]
    mine = st["exp_avg"]
    cases = [
        ("exp_avg", "another dtype", lambda: st.__setitem__("exp_avg", mine.to(torch.bfloat16)),
         lambda: st.__setitem__("exp_avg", mine)),
        ("param", "another shape", None, None),
        ("exp_avg_sq", "gone from the state", None, None),
    ]
    step()
    src.mark()
    for kind, why, breakit, fix in cases:
        if kind == "param":
            keep = p.data
            breakit = lambda: setattr(p, "data", torch.zeros(3, 5))  # noqa: E731
            fix = lambda: setattr(p, "data", keep)  # noqa: E731
        elif kind == "exp_avg_sq":
            keep_sq = st["exp_avg_sq"]
            breakit = lambda: st.pop("exp_avg_sq")  # noqa: E731
            fix = lambda: st.__setitem__("exp_avg_sq", keep_sq)  # noqa: E731
        breakit()
        try:
            src.publish(v + 1)
            c.check(False, "a %s replaced by one of %s was not refused" % (kind, why))
        except SourceError as e:
            c.check(("%s %s" % (q, kind)) in str(e),
                    "%s %s: the publish is refused naming the tensor: %s" % (kind, why, e))
        fix()
    v += 1
    info = src.publish(v)
    bad, total = side.exact(v, model)
    tot["versions"] += 1
    tot["exact"] += bad == 0 and total > 0
    c.check(bad == 0 and total > 0, "once the trainer holds the memory again the next publish "
            "is exact (v%d, %d of %d differ, %s)" % (v, bad, total,
                                                     "dense" if info["dense"] else "sparse"))


def flat_refusal(c, sock):
    """The flat megatron: layout has one step count per group: a tensor
    without a gradient is refused clearly (a shard layout would send it as
    unchanged)."""
    from dte import megatron, qwen3, toy
    from dte.source import Source, SourceError
    cfg = qwen3.make_config(None, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=2, head_dim=32,
                            vocab_size=256)
    model = megatron.MegatronModel(cfg, tp=1, seed=0, label="flat-refuse", flat=True)
    tr = megatron.Trainer(model, lr=1e-3)
    src = Source.megatron(model, tr.opt, sock, "flat-refuse", "tok")
    try:
        n = len(model.params[0])
        c.check(len(src.held) == 3 * n, "Source.megatron checks all %d registered tensors at "
                "publish (θ, exp_avg, exp_avg_sq of %d params: %d)" % (3 * n, n, len(src.held)))
        tokens, targets = toy.ToyTask(cfg["vocab_size"]).batch_at(0)
        tr.step(tokens, targets)
        src.publish(1)
        tr.opt.zero_grad(set_to_none=True)
        model.loss(tokens, targets).backward()
        frozen = next(p for p in model.params[0].values() if p.dim() == 1)
        frozen.grad = None
        del frozen
        tr.opt.step()
        c.raises(SourceError, lambda: src.publish(2),
                 "megatron:tp=1 (two groups) refuses a step in which a tensor had no gradient")
    finally:
        src.close()
        tr.close()
        model.close()


def main():
    harness.asan_reexec()
    import transformers
    c = Checks("source-real")
    torch.set_num_threads(1)
    c.check(int(transformers.__version__.split(".")[0]) >= 5,
            "transformers %s (5 holds MoE experts fused)" % transformers.__version__)
    tmp = tempfile.mkdtemp(prefix="dte-source-real-")
    # Versions after the first must go sparse: the inversion is what is
    # checked (sync_mode = auto could pick dense on models this small).
    daemon = harness.Daemon(tmp, "source-real", sync_mode="sparse")
    sock = daemon.sock
    tot = dict(models=0, versions=0, exact=0, replaced=0, readopted=0)
    try:
        daemon.start()
        for case in (moe_case, dense_case):
            t0 = time.time()
            try:
                case(c, sock, tot)
            except Exception as e:  # a crash is a failed check, then the summary
                import traceback
                traceback.print_exc()
                c.check(False, "%s: %s: %s" % (case.__name__, type(e).__name__, e))
            print("%s done: %d versions so far (%.1fs)" % (case.__name__, tot["versions"],
                                                           time.time() - t0), flush=True)
        flat_refusal(c, sock)
    finally:
        daemon.stop(30)
    print("source-real: models=%d versions=%d exact=%d/%d replaced=%d readopted=%d" % (
        tot["models"], tot["versions"], tot["exact"], tot["versions"], tot["replaced"],
        tot["readopted"]), flush=True)
    if c.passed != c.total:
        sys.stderr.write(daemon.log_text()[-3000:])
    c.finish()


if __name__ == "__main__":
    main()

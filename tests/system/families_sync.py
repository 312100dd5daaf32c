#!/usr/bin/python3
"""GLM-4.5 MoE synced through the daemons, its FP32 router tensors exact.

The engines hold GLM-4.5's router weight and e_score_correction_bias in
FP32 (SGLang 0.5.23 models/glm4_moe.py Glm4MoeGate, vLLM 0.33
models/glm4_moe.py Glm4MoE: torch.float32).  The bias is an FP32 buffer
the trainer uses as it is and no optimizer steps: dted moves its exact
bits (16-bit halves, docs/SYNC.md "FP32 tensors").  The router weight is
a trained parameter whose BF16 trainer forward uses RNE-BF16 of its
master: it moves as BF16 and the sink widens it into the FP32 parameter
(daemon/layout/spec.c).

A tiny transformers 5 Glm4MoeForCausalLM (random init; the published
glm-4.5.json's structure at small dims: attention bias, shared experts,
first_k_dense_replace, noaux_tc router) trains with real torch AdamW
through Source.hf(params and the e_score_correction_bias buffers).  Each
step also moves every bias as aux-loss-free balancing does (outside the
optimizer; by less than a BF16 ulp on some steps, so only its FP32 bits
change).  Two engines' workers are sinks through dte.integrations'
EngineSink, their parameters allocated as the engines allocate them (BF16,
the router weight and bias FP32): SGLang TP 2 with EP 2 and vLLM TP 2
with expert parallel.  After every version every worker's every parameter
must equal the independent converter's (tests/system/families.py
engine_sink, from the engines' module definitions) applied to the
trainer's θ: RNE-BF16, widened in the FP32 router weight, and θ's own
FP32 bits in the bias; padding never written.

Prints `families-sync: model=glm4_moe engines=2 versions=V exact=V/V
fp32_tensors=N fp32_only_steps=S`.
"""

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

VERSIONS = int(os.environ.get("DTE_FAMILIES_SYNC_VERSIONS", "10"))
SINKS = (("sglang", 2, 2), ("vllm", 2, 2))      # (engine, tp, ep)


def canonical(model):
    """θ under the checkpoint's names: transformers 5 holds the routed
    experts fused as Qwen3-MoE does (models/glm4_moe/modeling_glm4_moe.py
    Glm4MoeNaiveMoe: `gate, up = linear(x, gate_up_proj[e]).chunk(2,
    dim=-1)`, `linear(act(gate) * up, down_proj[e])`: source_real.py's
    converter), and the router's bias is a buffer
    (Glm4MoeTopkRouter.e_score_correction_bias)."""
    import source_real
    out = source_real.canonical(model)
    out.update((n, b.detach().clone()) for n, b in model.named_buffers()
               if n.endswith("e_score_correction_bias"))
    return out


def served(w, fp32):
    """What the engines must hold, as float64 (exact): RNE-BF16 of θ, or
    θ itself for the tensors they hold in FP32."""
    return {n: (t if n in fp32 else t.to(torch.bfloat16)).to(torch.float64) for n, t in w.items()}


def engine_params(fam, cfg, w, tp, ep, vllm, fp32):
    """{rank: {name: tensor}} allocated as the engine does (BF16; FP32 for
    its FP32 router tensors), holding the converter's values of w (padding
    as the reference's UNSET)."""
    out = {}
    for rank, tensors in fam.engine_sink(cfg, w, tp, ep, vllm).items():
        out[rank] = {n: t.to(torch.float32 if n in fp32 else torch.bfloat16).contiguous()
                     for n, t in tensors}
    return out


def mismatches(fam, cfg, w, tp, ep, vllm, params):
    """(differing elements, elements checked) of every rank's parameters
    against the converter; padding must still hold UNSET."""
    bad = total = 0
    for rank, tensors in fam.engine_sink(cfg, w, tp, ep, vllm).items():
        for n, ref in tensors:
            got = params[rank][n].to(torch.float64)
            if got.shape != ref.shape:
                raise AssertionError("rank %d %s: %s, converter %s" % (rank, n, tuple(got.shape),
                                                                      tuple(ref.shape)))
            diff = int((got != ref).sum())
            if diff:
                print("rank %d %s: %d of %d differ" % (rank, n, diff, ref.numel()), flush=True)
            bad += diff
            total += ref.numel()
    return bad, total


def main():
    harness.asan_reexec()
    import transformers
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM
    import families as fam
    from dte import _lib
    from dte.integrations import _engine
    from dte.source import Source

    c = Checks("families-sync")
    torch.set_num_threads(1)
    real = json.load(open(os.path.join(fam.MODELS, "glm-4.5.json")))
    small = fam.small(real, num_hidden_layers=3, first_k_dense_replace=1, hidden_size=64,
                      head_dim=16, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=96, moe_intermediate_size=16, n_routed_experts=4,
                      num_experts_per_tok=2, vocab_size=200, max_position_embeddings=64,
                      pad_token_id=None, eos_token_id=None, bos_token_id=None)
    keys = set(Glm4MoeConfig().to_dict())
    cfg = Glm4MoeConfig(**{k: v for k, v in small.items() if k in keys})
    torch.manual_seed(3)
    model = Glm4MoeForCausalLM(cfg)
    cfg_text = model.config.to_json_string()
    ref_cfg = dict(small, **json.loads(cfg_text))
    fp32 = _lib.fp32_tensors(cfg_text)
    engine_fp32 = fam.engine_fp32_names(ref_cfg)
    c.check(fp32 == fam.fp32_names(ref_cfg) and len(fp32) == 2 and len(engine_fp32) == 4,
            "the daemon moves the FP32 biases as their bits (%s); the engines' FP32 router "
            "weights are widened BF16" % sorted(fp32))
    biases = {n: b for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(".mlp.gate.weight"):
                p.normal_(0.0, 0.1)
        for b in biases.values():
            b.normal_(0.0, 0.01)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.01)
    tmp = tempfile.mkdtemp(prefix="dte-families-sync-")
    daemon = harness.Daemon(tmp, "families-sync", sync_mode="sparse")
    job, tot = "glm", dict(versions=0, exact=0, fp32_only=0)
    src, sinks = None, []
    try:
        daemon.start()
        src = Source.hf(dict(list(model.named_parameters()) + list(biases.items())), opt,
                        daemon.sock, job, "tok", cfg_text, label=job)
        w0 = served(canonical(model), fp32)
        for replica, (engine, tp, ep) in enumerate(SINKS):
            vllm = engine == "vllm"
            layout = "%s:tp=%d,ep=%d" % (engine, tp, ep)
            params = engine_params(fam, ref_cfg, w0, tp, ep, vllm, engine_fp32)
            att = dict(replica=replica, job=job, token="tok", model_config=cfg_text,
                       coordinator="local", socket=daemon.sock)
            workers = [_engine.EngineSink(params[r].items(), r, layout, att) for r in range(tp)]
            sinks.append((engine, tp, ep, vllm, params, workers))
        gen = torch.Generator().manual_seed(9)
        for v in range(1, VERSIONS + 1):
            tokens = torch.randint(0, cfg.vocab_size, (1, 8), generator=gen)
            opt.zero_grad(set_to_none=True)
            model(input_ids=tokens, labels=tokens).loss.backward()
            opt.step()
            before = {n: t.to(torch.bfloat16) for n, t in canonical(model).items() if n in fp32}
            with torch.no_grad():
                # Aux-loss-free balancing (DeepSeek-V3 §2.1.2): bias += u *
                # sign(load error), outside the optimizer.  Every third
                # step by far less than a BF16 ulp.
                u = 1e-7 if v % 3 == 0 else 1e-3
                for b in biases.values():
                    b.add_(u * torch.sign(torch.randn(b.shape, generator=gen)))
            src.publish(v)
            w = served(canonical(model), fp32)
            ok = True
            for engine, tp, ep, vllm, params, workers in sinks:
                try:
                    for wk in workers:
                        wk.stage(v, 60000)
                    for wk in workers:
                        wk.commit(v, 60000)
                    bad, total = mismatches(fam, ref_cfg, w, tp, ep, vllm, params)
                except Exception as e:  # the check below fails, naming it
                    print("v%d %s: %s: %s" % (v, engine, type(e).__name__, e), flush=True)
                    bad, total = -1, 0
                ok &= bad == 0 and total > 0
                c.check(bad == 0 and total > 0, "v%d %s tp=%d ep=%d: %d of %d elements differ "
                        "from the converter" % (v, engine, tp, ep, bad, total))
            if v % 3 == 0:
                # Only the FP32 bits of the biases moved: a BF16 path
                # would have left the sinks' values as they were.
                same = all(torch.equal(before[n], t.to(torch.bfloat16))
                           for n, t in canonical(model).items() if n.endswith("bias") and n in fp32)
                tot["fp32_only"] += same and ok
            tot["versions"] += 1
            tot["exact"] += ok
        c.check(tot["fp32_only"] > 0, "versions in which the biases moved below a BF16 ulp "
                "arrived exact (%d)" % tot["fp32_only"])
    finally:
        for *_x, workers in sinks:
            for wk in workers:
                wk.close()
        if src:
            src.close()
        daemon.stop(30)
    print("families-sync: model=glm4_moe engines=%d versions=%d exact=%d/%d fp32_tensors=%d "
          "fp32_only_steps=%d transformers=%s" % (len(SINKS), tot["versions"], tot["exact"],
                                                  tot["versions"], len(fp32), tot["fp32_only"],
                                                  transformers.__version__), flush=True)
    if c.passed != c.total:
        sys.stderr.write(daemon.log_text()[-3000:])
    c.finish()


if __name__ == "__main__":
    main()

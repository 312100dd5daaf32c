#!/usr/bin/python3
"""GLM-4.5 MoE, DeepSeek-V3 and Kimi-K2 synced through the daemons, their
FP32 router tensors exact, MLA's derived weights rebuilt.

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

DeepSeek-V3 and Kimi-K2 (DeepseekV3ForCausalLM; the config dted reads
says model_type kimi_k2, as the published one does) the same way, from
transformers 5's DeepseekV3ForCausalLM: MLA with q_lora, the dense first
layer, shared experts, grouped routing, the FP32 router bias.  Their
workers rebuild w_kc/w_vc from kv_b_proj at every refresh (mla_view, as
the engines do after loading; the engines' own rebuilds run in
sglang_mla.py and real_vllm_mla.py): after every version the rebuilt
copies must be those of the converter's kv_b_proj.

Prints `families-sync: model=M engines=2 versions=V exact=V/V
fp32_tensors=N fp32_only_steps=S [derived=V/V]` per family, then issue
33's `families: deepseek_v3=exact glm4_moe=exact kimi_k2=exact` (each
exact after every one of >= 10 versions in both engines' layouts).
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


def mla_view(params, cfg, tp):
    """The view of a test engine worker of an MLA model: the engines build
    w_kc/w_vc (SGLang, post_load_weights) or W_UK/W_UV (vLLM,
    process_weights_after_loading) from kv_b_proj; this worker keeps
    SGLang's split of every layer's live kv_b_proj (derived_from), rebuilt
    at every refresh, so a commit that did not refresh leaves it stale.
    (The engines' own rebuilds run in sglang_mla.py and real_vllm_mla.py.)"""
    from dte.integrations import _engine

    class MLAView(_engine.ComputeView):
        rederives = True

        def __init__(self):
            self.derived = {}

        def refresh(self):
            for n, t in params.items():
                if n.endswith("self_attn.kv_b_proj.weight"):
                    self.derived[n] = derived_from(t, cfg, tp)
            return 0.0
    return MLAView()


def derived_from(kv_b, cfg, tp):
    """SGLang's w_kc, w_vc of a TP rank's kv_b_proj [heads/tp * (nope +
    v), kv_lora] (models/deepseek_common/deepseek_weight_loader.py: the
    weight viewed per head and split at qk_nope_head_dim), as float64."""
    heads = cfg["num_attention_heads"] // tp
    nope, v = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    w = kv_b.to(torch.float64).view(heads, nope + v, kv_b.shape[-1])
    return w[:, :nope, :].clone(), w[:, nope:, :].clone()


MLA_DIMS = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=16, vocab_size=200,
                q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                v_head_dim=8)
NO_TOKENS = dict(max_position_embeddings=64, pad_token_id=None, eos_token_id=None,
                 bos_token_id=None)
# (family, published config, transformers classes, the small dims): the
# real config's every field, its structure kept (dense first layers,
# shared experts, routing groups, the router bias), at small dims.
FAMILIES = (
    ("glm4_moe", "glm-4.5.json", ("Glm4MoeConfig", "Glm4MoeForCausalLM"),
     dict(num_hidden_layers=3, first_k_dense_replace=1, hidden_size=64, head_dim=16,
          num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
          moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, vocab_size=200,
          **NO_TOKENS)),
    # DeepSeek-V3: 8 groups of 32 experts, top 4 groups; here 2 of 2
    ("deepseek_v3", "deepseek-v3.json", ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
     dict(num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=4,
          num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=2,
          topk_group=1, **MLA_DIMS, **NO_TOKENS)),
    # Kimi-K2: DeepseekV3ForCausalLM, model_type kimi_k2, one group
    ("kimi_k2", "kimi-k2.json", ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
     dict(num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=4,
          num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
          **MLA_DIMS, **NO_TOKENS)),
)


def run_family(c, daemon, name, config_file, classes, dims):
    """One family through VERSIONS versions into both engines' workers;
    its totals."""
    import transformers
    import families as fam
    from dte import _lib
    from dte.integrations import _engine
    from dte.source import Source

    real = json.load(open(os.path.join(fam.MODELS, config_file)))
    small = fam.small(real, **dims)
    cfg_cls, model_cls = (getattr(transformers, x) for x in classes)
    keys = set(cfg_cls().to_dict())
    cfg = cfg_cls(**{k: v for k, v in small.items() if k in keys})
    torch.manual_seed(3)
    model = model_cls(cfg)
    # What dted reads is the checkpoint's config.json: the published
    # fields (model_type kimi_k2, topk_method, ...) with transformers' own
    # on top for what it holds.
    ref_cfg = dict(small, **json.loads(model.config.to_json_string()))
    for k in ("model_type", "architectures"):
        ref_cfg[k] = real[k]
    cfg_text = json.dumps(ref_cfg)
    mla = fam.is_mla(ref_cfg)
    fp32 = _lib.fp32_tensors(cfg_text)
    engine_fp32 = fam.engine_fp32_names(ref_cfg)
    moe_layers = sum(1 for layer in range(ref_cfg["num_hidden_layers"])
                     if fam.moe_layer(ref_cfg, layer))
    c.check(fp32 == fam.fp32_names(ref_cfg) and len(fp32) == moe_layers and
            set(fp32) <= set(engine_fp32),
            "%s: the daemon moves the FP32 router biases as their bits (%s); the engines' "
            "other FP32 router tensors are widened BF16 (%s)"
            % (name, sorted(fp32), sorted(set(engine_fp32) - set(fp32))))
    biases = {n: b for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(".mlp.gate.weight"):
                p.normal_(0.0, 0.1)
        for b in biases.values():
            b.normal_(0.0, 0.01)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.01)
    job, tot = name, dict(versions=0, exact=0, fp32_only=0, derived=0)
    src, sinks = None, []
    try:
        src = Source.hf(dict(list(model.named_parameters()) + list(biases.items())), opt,
                        daemon.sock, job, "tok", cfg_text, label=job)
        w0 = served(canonical(model), fp32)
        for replica, (engine, tp, ep) in enumerate(SINKS):
            vllm = engine == "vllm"
            layout = "%s:tp=%d,ep=%d" % (engine, tp, ep)
            params = engine_params(fam, ref_cfg, w0, tp, ep, vllm, engine_fp32)
            att = dict(replica=replica, job=job, token="tok", model_config=cfg_text,
                       coordinator="local", socket=daemon.sock)
            views = [mla_view(params[r], ref_cfg, tp) if mla else None for r in range(tp)]
            workers = [_engine.EngineSink(params[r].items(), r, layout, att, view=views[r])
                       for r in range(tp)]
            sinks.append((engine, tp, ep, vllm, params, workers, views))
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
            ok = derived_ok = True
            for engine, tp, ep, vllm, params, workers, views in sinks:
                try:
                    for wk in workers:
                        wk.stage(v, 60000)
                    for wk in workers:
                        wk.commit(v, 60000)
                    bad, total = mismatches(fam, ref_cfg, w, tp, ep, vllm, params)
                    if mla:
                        stale = stale_derived(fam, ref_cfg, w, tp, ep, vllm, views)
                        derived_ok &= not stale
                        c.check(not stale, "v%d %s %s: w_kc/w_vc rebuilt from the applied "
                                "kv_b_proj (stale: %s)" % (v, name, engine, stale[:3]))
                except Exception as e:  # the check below fails, naming it
                    print("v%d %s %s: %s: %s" % (v, name, engine, type(e).__name__, e),
                          flush=True)
                    bad, total = -1, 0
                ok &= bad == 0 and total > 0
                c.check(bad == 0 and total > 0, "v%d %s %s tp=%d ep=%d: %d of %d elements "
                        "differ from the converter" % (v, name, engine, tp, ep, bad, total))
            if v % 3 == 0:
                # Only the FP32 bits of the biases moved: a BF16 path
                # would have left the sinks' values as they were.
                same = all(torch.equal(before[n], t.to(torch.bfloat16))
                           for n, t in canonical(model).items() if n.endswith("bias") and n in fp32)
                tot["fp32_only"] += same and ok
            tot["versions"] += 1
            tot["exact"] += ok and derived_ok
            tot["derived"] += mla and derived_ok
        c.check(tot["fp32_only"] > 0, "%s: versions in which the biases moved below a BF16 "
                "ulp arrived exact (%d)" % (name, tot["fp32_only"]))
    finally:
        for *_x, workers, _views in sinks:
            for wk in workers:
                wk.close()
        if src:
            src.close()
    print("families-sync: model=%s engines=%d versions=%d exact=%d/%d fp32_tensors=%d "
          "fp32_only_steps=%d%s transformers=%s" % (
              name, len(SINKS), tot["versions"], tot["exact"], tot["versions"], len(fp32),
              tot["fp32_only"], " derived=%d/%d" % (tot["derived"], tot["versions"]) if mla
              else "", transformers.__version__), flush=True)
    return tot


def stale_derived(fam, cfg, w, tp, ep, vllm, views):
    """The MLA layers whose rebuilt w_kc/w_vc differ from those of the
    converter's kv_b_proj (what the engine would build from RNE(θ_v))."""
    out = []
    for rank, tensors in fam.engine_sink(cfg, w, tp, ep, vllm).items():
        for n, ref in tensors:
            if n.endswith("self_attn.kv_b_proj.weight"):
                want = derived_from(ref, cfg, tp)
                got = views[rank].derived.get(n)
                if got is None or any(not torch.equal(a, b) for a, b in zip(got, want)):
                    out.append("rank %d %s" % (rank, n))
    return out


def main():
    harness.asan_reexec()
    c = Checks("families-sync")
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="dte-families-sync-")
    daemon = harness.Daemon(tmp, "families-sync", sync_mode="sparse")
    status = {}
    try:
        daemon.start()
        for name, config_file, classes, dims in FAMILIES:
            tot = run_family(c, daemon, name, config_file, classes, dims)
            status[name] = "exact" if tot["versions"] == VERSIONS and \
                tot["exact"] == tot["versions"] else "FAIL"
    finally:
        daemon.stop(30)
    c.check(all(x == "exact" for x in status.values()) and len(status) == len(FAMILIES),
            "every family exact after every version in both engines (%s)" % status)
    print("families: " + " ".join("%s=%s" % (k, status.get(k, "FAIL"))
                                  for k, *_r in sorted(FAMILIES)), flush=True)
    if c.passed != c.total:
        sys.stderr.write(daemon.log_text()[-3000:])
    c.finish()

if __name__ == "__main__":
    main()

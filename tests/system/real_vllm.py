#!/usr/bin/python3
# dte-test: serial=vllm (a real vLLM-CPU engine: one at a time, tests/run-system.sh)
"""dted against a real vLLM engine, whole, on this machine's CPUs.

vLLM's CPU build (vllm-cpu, in the venv scripts/install-deps.sh makes at
/opt/dted-vllm) serves a tiny Qwen3 and a tiny Qwen3-MoE made here with
transformers' save_pretrained (random init, no hub), as vllm.LLM at TP 1 and
TP 2, attached exactly as docs/INTEGRATION.md tells a user:
worker_extension_cls="dte.integrations.vllm.DteWorkerExtension" and a
VLLMController.  The trainer is the HF model itself in FP32 with a real
torch AdamW, through Source.hf.  After every version:

  * exact: every parameter of every worker equals RNE(θ_t) mapped into
    vLLM's layout by an independent converter (vllm_real_lib.hf_to_vllm),
    the prepacked expert weights equal vLLM's own cpu_prepack_moe_weight of
    it, and every CPU GEMM copy compute reads is the one vLLM packs from
    the live weight;
  * generations: greedy generation of a fixed batch of token prompts
    (tokens and the sampled tokens' logprobs) is bit-identical to a
    reference engine.  Dense (TP 1 and 2): a second engine of the same TP
    after vLLM's own reload_weights with RNE(θ_t), every version.  MoE:
    vLLM-CPU's reload does not redo its expert prepack, so the reference is
    a fresh vllm.LLM loaded from a checkpoint of RNE(θ_t), about 10-20 s
    per engine on this machine; it is compared at the first version, every
    MOE_GEN_EVERY-th and the last (the exact check above, the prepacked
    experts included, runs at every version).  The prompts were served
    before the version, so a prefix cache that was not reset would show;
  * HF transformers' teacher-forced logprobs of the same tokens are within
    HF_TOL nats (vLLM-CPU's own load already differs from HF by BF16
    rounding on near-ties: a sanity check, not the exactness reference).

Then an AsyncLLM with requests in flight: the controller pauses (wait),
applies, resumes; the in-flight requests finish entirely under the old
weights and the next ones run on the new, both told by HF's teacher-forced
logprobs of the tokens vLLM chose under each version (AsyncLLM batches a
request's first step with another's last, so it is not compared bit for
bit with a fresh engine: see run_async).

Prints `real-engine: engine=vllm-cpu-<version> models=N versions=V
exact=V/V generations=G/G`.  Never skips on this machine kind: the venv is
part of scripts/install-deps.sh; without it the test fails.
"""

import os
import sys


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

if __name__ == "__main__":
    harness.venv_reexec(os.environ.get("DTE_VLLM_PYTHON", harness.VLLM_PY))

harness.vllm_test_env(HERE)

import asyncio  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

import vllm_real_lib as vl  # noqa: E402

VERSIONS = int(os.environ.get("DTE_REAL_VERSIONS", "10"))
ASYNC_VERSIONS = 3
HF_TOL = 0.25        # nats, teacher-forced logprob of each generated token
ASYNC_TOL = 0.02     # nats: vLLM against HF on the same weights (seen: <= 0.005)
LR = 2e-3
# (model, MoE, TP, versions).  The MoE's generations are compared with a
# fresh engine (~17 s each at TP 2: vLLM-CPU's reload_weights does not redo
# its expert prepack) at versions 1, every MOE_GEN_EVERY-th and the last, so
# the MoE at TP 2 runs 3 versions; the MoE model gets its ten at TP 1.
MOE_GEN_EVERY = int(os.environ.get("DTE_REAL_MOE_GEN_EVERY", "4"))
RUNS = [("qwen3", False, 1, VERSIONS), ("qwen3", False, 2, VERSIONS),
        ("qwen3_moe", True, 1, VERSIONS), ("qwen3_moe", True, 2, min(3, VERSIONS))]


class Tally:
    def __init__(self, c):
        self.c = c
        self.versions = self.exact = self.gens = self.gens_ok = 0
        self.models = set()
        self.refresh_ms = []
        self.hf_max = 0.0


def check_exact(t, llm, model, cfgd, tp, tag):
    want = vl.hf_to_vllm(vl.hf_state(model), cfgd, tp)
    res = llm.collective_rpc(vl.worker_check, args=({r: vl.pack(w) for r, w in want.items()},))
    packed = llm.collective_rpc(vl.worker_packed_is_live)
    ok = True
    for rank, checked, bad in res:
        ok &= t.c.check(not bad and checked == len(want[rank]),
                        "%s rank %d exact (%d checked): %s" % (tag, rank, checked, bad[:4]))
    for rank, n, stale in packed:
        ok &= t.c.check(n > 0 and not stale,
                        "%s rank %d CPU GEMM copies packed from the live weights (%d layers): "
                        "stale %s" % (tag, rank, n, stale[:4]))
    return ok


def check_gens(t, tag, got, ref, model, ps):
    t.gens += 1
    same = got == ref
    if not same:
        diff = [i for i, (a, b) in enumerate(zip(got, ref)) if a != b]
        print("  %s: prompt %s: got %s want %s" % (tag, diff[:1], got[diff[0]] if diff else None,
                                                   ref[diff[0]] if diff else None))
    t.gens_ok += t.c.check(same, "%s generations bit-identical to the reference engine" % tag)
    bf = {n: vl.rne_bf16(p) for n, p in model.state_dict().items()}
    hf = hf_model_bf16(model, bf)
    lps = vl.hf_logprobs(hf, ps, got)
    worst = max(abs(a - b) for (_tk, mine), theirs in zip(got, lps) for a, b in zip(mine, theirs))
    t.hf_max = max(t.hf_max, worst)
    t.c.check(worst <= HF_TOL, "%s teacher-forced logprobs within %.2f nats of HF transformers "
              "(worst %.4f)" % (tag, HF_TOL, worst))


_HF_BF16 = {}


def hf_model_bf16(model, bf):
    from transformers import AutoModelForCausalLM
    key = id(model)
    m = _HF_BF16.get(key)
    if m is None:
        m = _HF_BF16[key] = AutoModelForCausalLM.from_config(model.config, dtype=torch.bfloat16)
        m.eval()
    m.load_state_dict(bf)
    return m


def run_offline(t, sock, tmp, fresh, name, moe, tp, versions):
    from vllm import LLM
    from dte.integrations.vllm import VLLMController
    from dte.source import Source
    tag0 = "%s tp=%d" % (name, tp)
    job = "real-%s-tp%d" % (name, tp)
    cfg = vl.qwen3_config(moe)
    model = vl.make_model(cfg, seed=11 + tp + 10 * moe)
    d0 = vl.save_bf16(model, os.path.join(tmp, job + "-v0"))
    cfg_text = open(os.path.join(d0, "config.json")).read()
    cfgd = json.loads(cfg_text)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1" if tp == 2 else "auto"
    t0 = time.time()
    llm = LLM(model=d0, tensor_parallel_size=tp,
              worker_extension_cls="dte.integrations.vllm.DteWorkerExtension",
              **vl.engine_kwargs())
    ref = None
    if not moe:
        ref = LLM(model=d0, tensor_parallel_size=tp, **vl.engine_kwargs())
    print("  %s: engine%s up in %.1fs" % (tag0, "s" if ref else "", time.time() - t0), flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    src = Source.hf(dict(model.named_parameters()), opt, sock, job, "tok", cfg_text,
                    label=job)
    ctl = VLLMController(llm, job, "tok", cfg_text, socket=sock, replica=0)
    att = ctl.attach()
    print("  %s: attached %s" % (tag0, [r.get("compute") for r in att]), flush=True)
    ps = vl.prompts(vocab=cfgd["vocab_size"])
    vl.generate(llm, ps)          # served before: the prefix cache holds them
    g = torch.Generator().manual_seed(5)
    t.models.add(name)
    try:
        for v in range(1, versions + 1):
            tag = "%s v%d" % (tag0, v)
            loss = vl.train_step(model, opt, g, cfgd["vocab_size"])
            src.publish(v)
            rep = ctl.sync(v, raise_on_failure=False)
            t.c.check(rep.ok, "%s sync: %s" % (tag, rep.summary()))
            t.refresh_ms += [w.get("refresh_ms", 0.0) for w in rep.workers.values()
                             if "refresh_ms" in w]
            t.versions += 1
            t.exact += check_exact(t, llm, model, cfgd, tp, tag)
            if ref is None and not (v == 1 or v == versions or v % MOE_GEN_EVERY == 0):
                print("  %s: loss %.4f sync %s (generations compared at v1, every %d-th, v%d)"
                      % (tag, loss, "ok" if rep.ok else "FAILED", MOE_GEN_EVERY, versions),
                      flush=True)
                continue
            got = vl.generate(llm, ps)
            if ref is not None:
                ref.collective_rpc(vl.worker_reload, args=(vl.pack(vl.hf_state(model)),))
                ref.reset_prefix_cache()
                want = vl.generate(ref, ps)
            else:
                dv = vl.save_bf16(model, os.path.join(tmp, "%s-v%d" % (job, v)))
                want = fresh.generate(dv, ps, tp=tp)
                shutil.rmtree(dv, ignore_errors=True)
            check_gens(t, tag, got, want, model, ps)
            print("  %s: loss %.4f sync %s" % (tag, loss, "ok" if rep.ok else "FAILED"),
                  flush=True)
    finally:
        src.close()
        del llm, ref
        import gc
        gc.collect()


async def run_async(t, sock, tmp, fresh):
    """AsyncLLM: requests in flight while a version is applied."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.async_llm import AsyncLLM
    from dte.integrations.vllm import VLLMController
    from dte.source import Source
    job = "real-async"
    cfg = vl.qwen3_config(False)
    model = vl.make_model(cfg, seed=31)
    d0 = vl.save_bf16(model, os.path.join(tmp, job + "-v0"))
    cfg_text = open(os.path.join(d0, "config.json")).read()
    cfgd = json.loads(cfg_text)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "auto"
    eng = AsyncLLM.from_engine_args(AsyncEngineArgs(
        model=d0, tensor_parallel_size=1,
        worker_extension_cls="dte.integrations.vllm.DteWorkerExtension", **vl.engine_kwargs()))
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    src = Source.hf(dict(model.named_parameters()), opt, sock, job, "tok", cfg_text, label=job)
    ctl = VLLMController(eng, job, "tok", cfg_text, socket=sock, replica=0, mode="wait")
    await ctl.attach_async()
    ps = vl.prompts(vocab=cfgd["vocab_size"], seed=9)
    long_tokens = 48
    g = torch.Generator().manual_seed(6)
    n = [0]

    async def one(p, max_tokens, first=None):
        n[0] += 1
        last = None
        async for out in eng.generate(TokensPrompt(prompt_token_ids=p), vl.sampling(max_tokens),
                                      request_id="r%d" % n[0]):
            last = out
            if first is not None:
                first.set()
        return vl.outputs_of([last])[0]

    try:
        prev_bf = {n: vl.rne_bf16(p) for n, p in model.state_dict().items()}
        for v in range(1, ASYNC_VERSIONS + 1):
            tag = "async v%d" % v
            vl.train_step(model, opt, g, cfgd["vocab_size"])
            src.publish(v)
            firsts = [asyncio.Event() for _ in ps]
            inflight = [asyncio.ensure_future(one(p, long_tokens, f)) for p, f in zip(ps, firsts)]
            # every request has produced its first token before the sync starts
            await asyncio.wait_for(asyncio.gather(*[f.wait() for f in firsts]), 60)
            t.c.check(not any(f.done() for f in inflight),
                      "%s: %d requests in flight when the sync starts" % (tag, len(ps)))
            rep = await ctl.sync_async(v, raise_on_failure=False)
            t.c.check(rep.ok, "%s sync with %d requests in flight: %s"
                      % (tag, len(ps), rep.summary()))
            old = await asyncio.gather(*inflight)
            # Which weights did each in-flight token see?  HF's teacher-forced
            # logprobs of the very tokens vLLM chose, under θ_{v-1} and θ_v:
            # vLLM's must be those of θ_{v-1} (batching may flip a near-tie
            # token, so the tokens are not compared with another run's).
            new_bf = {n: vl.rne_bf16(p) for n, p in model.state_dict().items()}
            lp_old = vl.hf_logprobs(hf_model_bf16(model, prev_bf), ps, old)
            lp_new = vl.hf_logprobs(hf_model_bf16(model, new_bf), ps, old)
            d_old = max(abs(a - b) for (_t, m), h in zip(old, lp_old) for a, b in zip(m, h))
            d_new = max(abs(a - b) for (_t, m), h in zip(old, lp_new) for a, b in zip(m, h))
            t.c.check(d_old <= ASYNC_TOL < d_new,
                      "%s: every token of the %d requests in flight was computed with the old "
                      "weights (pause mode %s): worst %.4f nats from HF on θ_%d, %.4f on θ_%d"
                      % (tag, len(ps), rep.mode, d_old, v - 1, d_new, v))
            print("  %s: in flight: worst %.4f nats from HF on the old weights, %.4f on the new"
                  % (tag, d_old, d_new), flush=True)
            t.versions += 1
            # After the sync, one request at a time, against a fresh engine
            # doing the same.  Bit-identical is not asked here: AsyncLLM may
            # run a request's first step in one batch with the previous
            # request's last (its scheduler overlaps them), and where
            # vLLM-CPU has no oneDNN BF16 matmul (AVX2-only CPUs: "fallback
            # to torch linear") a batch's rows are not computed as they
            # are alone, so a logprob moves in its last bits (seen: 5e-5
            # nats, the tokens the same).  Which weights the tokens came
            # from is what the sync decides: as for the requests in
            # flight, HF's logprobs of the tokens under θ_v within
            # ASYNC_TOL, under θ_{v-1} not (a near-tie token may flip in
            # such a batch: the tokens are reported, not compared).
            got = [await one(p, long_tokens) for p in ps]
            dv = vl.save_bf16(model, os.path.join(tmp, "%s-v%d" % (job, v)))
            want = fresh.generate(dv, ps, max_tokens=long_tokens, sequential=True)
            shutil.rmtree(dv, ignore_errors=True)
            a_new = vl.hf_logprobs(hf_model_bf16(model, new_bf), ps, got)
            a_old = vl.hf_logprobs(hf_model_bf16(model, prev_bf), ps, got)
            n_new = max(abs(a - b) for (_t, m), h in zip(got, a_new) for a, b in zip(m, h))
            n_old = max(abs(a - b) for (_t, m), h in zip(got, a_old) for a, b in zip(m, h))
            same_tokens = [g[0] for g in got] == [w[0] for w in want]
            print("  %s: after the sync: worst %.4f nats from HF on θ_%d, %.4f on θ_%d; "
                  "tokens as a fresh engine's %s, bit-identical %s"
                  % (tag, n_new, v, n_old, v - 1, same_tokens, got == want), flush=True)
            t.c.check(n_new <= ASYNC_TOL < n_old,
                      "%s: requests after the sync run on the new weights (worst %.4f nats "
                      "from HF on θ_%d, %.4f on θ_%d)" % (tag, n_new, v, n_old, v - 1))
            want_p = vl.hf_to_vllm(vl.hf_state(model), cfgd, 1)
            (rank, checked, bad), = await eng.collective_rpc(
                vl.worker_check, args=({r: vl.pack(w) for r, w in want_p.items()},))
            t.exact += t.c.check(rep.ok and not bad and checked == len(want_p[0]),
                                 "%s exact (%d checked): %s" % (tag, checked, bad[:4]))
            t.gens += 1
            t.gens_ok += n_new <= ASYNC_TOL < n_old
            prev_bf = new_bf
            print("  %s: %s" % (tag, rep.summary()), flush=True)
    finally:
        src.close()
        eng.shutdown()


def main():
    from dte.checks import Checks
    import vllm
    c = Checks("real-vllm")
    t = Tally(c)
    tmp = tempfile.mkdtemp(prefix="dte-real-vllm-")
    daemon = harness.Daemon(tmp, "real-vllm")
    sock = daemon.sock
    fresh = vl.FreshEngines(sys.executable, os.environ)
    try:
        daemon.start()
        only = os.environ.get("DTE_REAL_ONLY")
        for name, moe, tp, versions in RUNS:
            if only and only != "%s-%d" % (name, tp):
                continue
            run_offline(t, sock, tmp, fresh, name, moe, tp, versions)
        if not only or only == "async":
            asyncio.run(run_async(t, sock, tmp, fresh))
    finally:
        fresh.close()
        daemon.stop(10)
    if c.passed != c.total:
        print("dted log (tail):\n" + daemon.log_tail(30))
    shutil.rmtree(tmp, ignore_errors=True)
    rm = sorted(t.refresh_ms)
    print("real-engine: repack after apply: median %.2f ms, max %.2f ms per worker; "
          "HF teacher-forced worst %.4f nats" % (rm[len(rm) // 2] if rm else 0,
                                                  rm[-1] if rm else 0, t.hf_max))
    print("real-engine: engine=vllm-cpu-%s models=%d versions=%d exact=%d/%d generations=%d/%d"
          % (vllm.__version__, len(t.models), t.versions, t.exact, t.versions, t.gens_ok, t.gens))
    c.finish()


if __name__ == "__main__":
    main()

"""vLLM: the worker extension and the controller that drives it.

Written against vLLM 0.33.0; what it relies on:

  * `LLM(..., worker_extension_cls="dte.integrations.vllm.DteWorkerExtension")`
    (ParallelConfig.worker_extension_cls): WorkerWrapperBase.init_worker
    (v1/worker/worker_base.py) appends the class to every worker's
    __bases__, refusing names the worker already has (hence the dte_
    prefix), so its methods run inside each worker with `self`.
  * `collective_rpc(method, timeout=None, args=(), kwargs=None)` runs a
    method on every worker and returns one result per worker
    (entrypoints/llm.py LLM.collective_rpc, v1/engine/async_llm.py
    AsyncLLM.collective_rpc).  The extension's methods never raise: they
    return {"rank", "ok", "error", ...} so the controller sees every worker.
  * The model: `self.model_runner.get_model()` (v1/worker/gpu_model_runner.py:
    unwraps a CUDAGraphWrapper; the graphs keep reading the same tensors,
    which apply writes in place), else `self.model_runner.model`.
  * TP rank and size: vllm.distributed.parallel_state.
    get_tensor_model_parallel_rank / _world_size.
  * Expert parallel: FusedMoEParallelConfig.make (model_executor/layers/
    fused_moe/config.py) flattens TP across DP, and with
    enable_expert_parallel ep_size = tp * dp with MoE-TP 1.  Within one
    engine (dp 1) that is the vllm:tp=T,ep=T layout; a MoE model with
    dp > 1 shards its experts across engines, which no sink layout
    describes: refused.  Dense models with dp > 1: every DP rank is a full
    replica, replica = base replica + data_parallel_rank.
  * Pausing (AsyncLLM.pause_generation(mode=..., clear_cache=...),
    v1/engine/core.py EngineCoreProc.pause_scheduler): "abort" aborts
    in-flight requests, "wait" lets them finish (under the old weights)
    and then pauses, "keep" freezes them with their KV cache.  "keep" is
    refused: those requests would continue on KV computed with the old
    weights.  clear_cache=True resets the KV and prefix caches once idle;
    `reset_prefix_cache()` after the apply makes sure nothing computed
    before it is reused.  resume_generation() ends the pause.  The offline
    LLM runs nothing between two generate() calls, so it is not paused.
"""

import asyncio
import inspect
import time

from . import _engine
from ._engine import IntegrationError, SyncError, SyncReport


def _tp():
    from vllm.distributed.parallel_state import (get_tensor_model_parallel_rank,
                                                 get_tensor_model_parallel_world_size)
    return int(get_tensor_model_parallel_rank()), int(get_tensor_model_parallel_world_size())


def layout_of(parallel_config, tp, model_config):
    dp = int(getattr(parallel_config, "data_parallel_size", 1) or 1)
    moe = _engine.has_experts(model_config)
    if moe and dp > 1:
        raise IntegrationError(
            "vllm: a MoE model with data_parallel_size %d shards its experts over tp*dp = %d "
            "ranks across engines (FusedMoEParallelConfig.make); no sink layout describes "
            "that: use dp 1 per engine" % (dp, tp * dp))
    if moe and getattr(parallel_config, "enable_expert_parallel", False):
        return "vllm:tp=%d,ep=%d" % (tp, tp)
    return "vllm:tp=%d" % tp


class DteWorkerExtension:
    """Mixed into every vLLM worker (worker_extension_cls)."""

    def _dte_model(self):
        mr = self.model_runner
        get = getattr(mr, "get_model", None)
        return get() if callable(get) else mr.model

    def _dte_result(self, ok, **kw):
        es = getattr(self, "_dte_sink", None)
        out = {"rank": getattr(self, "_dte_rank", None), "ok": ok,
               "version": es.version if es is not None else 0}
        out.update(kw)
        return out

    def dte_attach(self, attach):
        """Attach this worker's weights (idempotent): attach is
        _engine.attach_request(...)."""
        try:
            if getattr(self, "_dte_sink", None) is not None:
                return self._dte_result(True, parts=self._dte_sink.parts)
            rank, tp = _tp()
            self._dte_rank = rank
            pc = self.vllm_config.parallel_config
            attach = dict(attach)
            attach["replica"] = int(attach["replica"]) + int(getattr(pc, "data_parallel_rank", 0)
                                                             or 0)
            layout = layout_of(pc, tp, attach["model_config"])
            self._dte_sink = _engine.EngineSink(self._dte_model().named_parameters(), rank,
                                                layout, attach)
            return self._dte_result(True, parts=self._dte_sink.parts, layout=layout,
                                    replica=attach["replica"])
        except Exception as e:
            return self._dte_result(False, error="%s: %s" % (type(e).__name__, e))

    def dte_apply(self, version, phase="stage", timeout_ms=30000):
        """phase "stage": version is staged here, nothing written;
        "commit": apply it (after every worker staged)."""
        es = getattr(self, "_dte_sink", None)
        if es is None:
            return self._dte_result(False, phase=phase, error="not attached")
        try:
            if phase == "stage":
                es.stage(int(version), int(timeout_ms))
                return self._dte_result(True, phase=phase)
            if phase == "commit":
                infos = es.commit(int(version), int(timeout_ms))
                return self._dte_result(True, phase=phase,
                                        checksum_ok=all(i["checksum_ok"] for i in infos))
            return self._dte_result(False, phase=phase, error="unknown phase %r" % phase)
        except Exception as e:
            return self._dte_result(False, phase=phase, error="%s: %s" % (type(e).__name__, e))

    def dte_version(self):
        """The version this worker applied last ({"rank", "ok", "version",
        "daemon"}: daemon is what dted reports for its participants)."""
        es = getattr(self, "_dte_sink", None)
        if es is None:
            return self._dte_result(False, error="not attached")
        try:
            return self._dte_result(True, daemon=es.applied())
        except Exception as e:
            return self._dte_result(False, error="%s: %s" % (type(e).__name__, e))

    def dte_detach(self):
        es = getattr(self, "_dte_sink", None)
        if es is not None:
            es.close()
            self._dte_sink = None
        return self._dte_result(True)


async def _maybe(x):
    return await x if inspect.isawaitable(x) else x


class VLLMController:
    """Drives one vLLM engine (LLM or AsyncLLM) per version.

        llm = LLM(model=..., tensor_parallel_size=2,
                  worker_extension_cls="dte.integrations.vllm.DteWorkerExtension")
        ctl = VLLMController(llm, job="rl", token=TOKEN, model_config=config_json_text)
        ctl.sync(v)                    # LLM: between two generate() calls
        await ctl.sync_async(v)        # AsyncLLM: pauses and resumes around it

    mode (AsyncLLM): "auto" = "wait" (in-flight requests finish under the
    old weights; if they do not within timeout_s, or this engine cannot
    wait, they are aborted), "wait" or "abort"; "keep" is refused.
    """

    def __init__(self, llm, job, token, model_config, socket=None, coordinator="local",
                 replica=0, mode="auto", timeout_s=60.0, ignore=()):
        if mode not in ("auto", "wait", "abort"):
            raise ValueError("vllm: pause mode %r: use auto, wait or abort (keep resumes "
                             "requests on KV computed with the old weights)" % mode)
        self.llm, self.mode, self.timeout_s = llm, mode, float(timeout_s)
        self.replica = int(replica)
        self.attach_req = _engine.attach_request(socket, job, token, model_config, coordinator,
                                                 replica, ignore)
        self.is_async = inspect.iscoroutinefunction(getattr(llm, "collective_rpc", None))
        self.attached = False

    async def _rpc(self, method, args=(), timeout=None):
        return await _maybe(self.llm.collective_rpc(method, timeout=timeout, args=args))

    def attach(self):
        """Attach every worker now (before the trainer's first publish)."""
        if self.is_async:
            raise RuntimeError("vllm: an AsyncLLM is attached with `await attach_async()`")
        return asyncio.run(self.attach_async())

    async def attach_async(self):
        res = await self._rpc("dte_attach", (self.attach_req,), self.timeout_s)
        bad = ["rank %s: %s" % (r.get("rank", i), r.get("error")) for i, r in enumerate(res)
               if not r.get("ok")]
        if bad:
            raise IntegrationError("vllm: attach failed: " + "; ".join(bad))
        self.attached = True
        return res

    def sync(self, version, raise_on_failure=True):
        if self.is_async:
            raise RuntimeError("vllm: an AsyncLLM is synced with `await sync_async(v)`")
        return asyncio.run(self.sync_async(version, raise_on_failure))

    async def _pause(self, rep):
        pause = getattr(self.llm, "pause_generation", None)
        if not self.is_async or pause is None:
            rep.mode = "none (offline LLM: nothing runs between generate calls)"
            return False
        mode = "wait" if self.mode == "auto" else self.mode
        try:
            await asyncio.wait_for(pause(mode=mode, clear_cache=True), self.timeout_s)
        except asyncio.TimeoutError:
            rep.act("pause(wait) did not drain in %.0fs" % self.timeout_s)
            mode = "abort"
            await pause(mode=mode, clear_cache=True)
        except ValueError as e:  # "'wait' mode can't be used in inproc-engine mode"
            if mode != "wait":
                raise
            rep.act("pause(wait) refused (%s)" % e)
            mode = "abort"
            await pause(mode=mode, clear_cache=True)
        rep.mode = mode
        rep.act("paused (%s, clear_cache)" % mode)
        return True

    async def sync_async(self, version, raise_on_failure=True):
        version = int(version)
        rep = SyncReport("vllm replica %d" % self.replica, version)
        t_end = time.monotonic() + self.timeout_s
        paused = await self._pause(rep)
        resume = True
        try:
            if not self.attached:
                res = await self._rpc("dte_attach", (self.attach_req,), self.timeout_s)
                bad = [r for r in res if not r.get("ok")]
                for i, r in enumerate(res):
                    rep.workers[r.get("rank", i)] = r
                if bad:
                    for i, r in enumerate(res):
                        if not r.get("ok"):
                            rep.failed[r.get("rank") if r.get("rank") is not None else i] = \
                                r.get("error")
                    rep.error = "attach failed"
                    return self._done(rep, raise_on_failure)
                self.attached = True
                rep.act("attached %d workers" % len(res))
            left = max(0.001, t_end - time.monotonic())
            # Phase 1 everywhere; phase 2 only when every worker staged.
            try:
                staged = await self._rpc("dte_apply", (version, "stage", int(left * 1000)),
                                         left + 1.0)
            except Exception as e:  # collective_rpc's TimeoutError, a worker died
                rep.error = "stage: %s: %s" % (type(e).__name__, e)
                rep.act("stage did not return from every worker; nothing committed")
                await self._versions(rep, version)
                return self._done(rep, raise_on_failure)
            for i, r in enumerate(staged):
                rep.workers[r.get("rank", i)] = r
                if not r.get("ok"):
                    rep.failed[r.get("rank", i)] = r.get("error")
            if rep.failed:
                rep.act("stage failed on %d of %d workers; nothing committed"
                        % (len(rep.failed), len(staged)))
                rep.error = "version %d not staged everywhere; every worker keeps %d" % (
                    version, min(r.get("version", 0) for r in staged))
                return self._done(rep, raise_on_failure)
            rep.act("staged on %d workers" % len(staged))
            try:
                done = await self._rpc("dte_apply", (version, "commit", 30000), self.timeout_s)
            except Exception as e:
                done = []
                rep.error = "commit: %s: %s" % (type(e).__name__, e)
            for i, r in enumerate(done):
                if not r.get("ok"):
                    rep.failed[r.get("rank", i)] = r.get("error")
            rep.act("committed")
            await self._versions(rep, version)
            if rep.ok and hasattr(self.llm, "reset_prefix_cache"):
                reset = await _maybe(self.llm.reset_prefix_cache())
                rep.act("reset_prefix_cache: %s" % reset)
                if reset is False:
                    rep.ok, resume = False, False
                    rep.error = "the prefix cache could not be reset; generation stays paused"
            elif not rep.ok and not rep.split:
                pass
            if rep.split:
                resume = False
            return self._done(rep, raise_on_failure)
        finally:
            if paused and resume and not rep.split:
                await self.llm.resume_generation()
                rep.act("resumed")

    async def _versions(self, rep, version):
        """Where every worker stands now (dte_version on each)."""
        try:
            vs = await self._rpc("dte_version", (), self.timeout_s)
        except Exception as e:
            rep.error = (rep.error + "; " if rep.error else "") + \
                "dte_version: %s: %s" % (type(e).__name__, e)
            rep.split = True  # unknown: do not serve
            return
        at = 0
        for i, r in enumerate(vs):
            rank = r.get("rank", i)
            rep.workers[rank] = dict(rep.workers.get(rank, {}), applied=r.get("daemon"),
                                     version=r.get("version"))
            if r.get("ok") and r.get("version") == version and r.get("daemon") == version:
                at += 1
            else:
                rep.failed.setdefault(rank, "holds version %s (daemon %s)" % (
                    r.get("version"), r.get("daemon")))
        rep.ok = at == len(vs) and not rep.failed
        rep.split = 0 < at < len(vs)
        if rep.split:
            rep.error = "workers disagree; generation stays paused"

    def _done(self, rep, raise_on_failure):
        if not rep.ok and raise_on_failure:
            raise SyncError(rep)
        return rep

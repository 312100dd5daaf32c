"""What the SGLang and vLLM integrations share: one engine worker's
weights attached as a sink (EngineSink), the daemon's view of an engine's
workers (daemon_workers), and the report a controller hands back.

An engine worker holds its TP rank's parameters in the engine's own fused
layout (sglang:tp=T / vllm:tp=T: QKVParallelLinear, MergedColumnParallel-
Linear, VocabParallelEmbedding padded to 64, FusedMoE w13/w2; see
daemon/layout/gen_sglang.c).  EngineSink registers those very tensors with
the node's daemon:

  * BF16 CUDA parameters in place (CUDA IPC, dte.source.register_cuda_tensor);
  * BF16 CPU parameters moved once, at attach, into a memfd arena
    (param.data points at the arena afterwards; a CPU engine keeps
    working on the same values) so the daemon can map them;
  * FP32 parameters of tensors the engines hold in FP32 (GLM-4.5's router
    weight, the MoE routers' e_score_correction_bias: vLLM 0.33
    glm4_moe.py Glm4MoE and deepseek_v2.py DeepseekV2MoE, SGLang 0.5.23
    glm4_moe.py Glm4MoeGate and deepseek_v2.py MoEGate allocate them
    torch.float32) in place, as their 16-bit halves: the layout counts
    such a buffer in 16-bit units, twice the elements, and the daemon
    writes the trainer's exact FP32 bits (dte._lib.fp32_tensors);
  * other FP32 parameters (SGLang's --rl-on-policy-target keeps the Qwen3 norms
    in FP32: RMSNorm(weight_dtype=torch.float32) in sglang/srt/models/
    qwen3.py and qwen2.py) through a BF16 shadow on the same device.  The
    daemon writes the shadow; commit() widens it into the FP32 parameter.
    The parameter thus holds exactly FP32(RNE-BF16(θ)), never θ itself:
    that is what the engine holds when the trainer sends it its BF16
    weights through SGLang's own path (default_weight_loader's
    param.data.copy_ of a BF16 tensor into the FP32 parameter, sglang/srt/
    model_loader/weight_utils.py), what an FSDP/Megatron BF16 forward
    multiplies by (the BF16 cast of the master weight), and the only value
    dted can verify: changes, checksums and sparse bases are defined on
    the BF16 image of θ.  Widening BF16 to FP32 is exact, so the FP32
    parameter is as verified as the shadow.

Every parameter of the module must be one the layout fills (or be named
in `ignore`), so no weight can silently stay at an old version.

Applying is two-phase (stage, then commit) so that the workers of one
engine apply version v all together or not at all: stage() waits until v
is staged on every participant of this worker and writes nothing; only
when every worker staged does each commit() (dted's apply, then the FP32
widening).  A worker that fails its stage leaves the whole engine on v-1,
and the version stays staged in its daemon, so the next sync applies it.
"""

import json
import os
import subprocess
import time

import torch

from .. import _lib
from ..shm import Arena
from ..sink import Sink


class IntegrationError(RuntimeError):
    pass


MARKER = "dte.sync:"


def make_marker(payload):
    """The (name, tensor) pair a controller passes through the engine's own
    weight-update call: the request rides in the name, the tensor has no
    elements (torch pickles an empty storage without any shared memory,
    torch/multiprocessing/reductions.py reduce_storage, so it crosses
    SGLang's MultiprocessingSerializer over HTTP or in-process alike)."""
    return (MARKER + json.dumps(payload, sort_keys=True), torch.empty(0, dtype=torch.uint8))


def find_marker(named_tensors):
    """The payload of the dte marker among (name, tensor) pairs, or None."""
    found = None
    for item in named_tensors:
        name = item[0]
        if isinstance(name, str) and name.startswith(MARKER):
            if found is not None:
                raise IntegrationError("more than one dte marker in one weight update")
            found = json.loads(name[len(MARKER):])
    return found


def attach_request(socket, job, token, model_config, coordinator="local", replica=0,
                   ignore=()):
    """What a worker needs to attach: sent once with every sync so a worker
    that restarted attaches again on its own."""
    if not isinstance(model_config, str):
        model_config = json.dumps(model_config)
    return {"socket": socket, "job": job, "token": token, "model_config": model_config,
            "coordinator": coordinator, "replica": int(replica), "ignore": list(ignore)}


def has_experts(model_config):
    cfg = json.loads(model_config) if isinstance(model_config, str) else model_config
    # transformers 5 writes num_local_experts (Qwen3MoeConfig.attribute_map)
    return int(cfg.get("num_experts") or cfg.get("num_local_experts") or
               cfg.get("n_routed_experts") or 0) > 0


class ComputeView:
    """How an engine's compute reads the parameters a layout names.

    The default: by the layout's names, in place (what dted writes is what
    the next forward multiplies by).  An engine integration overrides it
    where that is not so (dte.integrations.vllm.VLLMComputeView):

      * model_name(layout_name): the engine model's own name of the tensor;
      * prepare(model_name, param): None when compute reads `param` itself
        (refresh() may still rebuild a derived copy); a function
        fn(canonical) when the engine computes from a transform of the
        loaded values held in `param` (dted then writes a canonical BF16
        shadow and commit() calls fn(shadow) to write param as the engine's
        own post-load processing would); raise IntegrationError when
        neither is possible, naming the layer and what would make it work;
      * refresh(): after every commit, rebuild what compute reads that is
        derived from the parameters (a packed GEMM copy); returns seconds;
      * derives(model_name): True for an engine parameter refresh()
        rebuilds from the layout's (not written by dted, not refused as
        one the layout misses);
      * rederives: True when refresh() rebuilds what the engine derives
        from the weights after loading (MLA's W_UK/W_UV from kv_b_proj):
        the daemon attaches a sink of such a model only then.

    Never a silent no-op: a parameter compute does not read is either made
    to be read or refused at attach."""

    rederives = False

    def model_name(self, layout_name):
        return layout_name

    def derives(self, model_name):
        """True for a parameter refresh() rebuilds from others."""
        return False

    def prepare(self, model_name, param):
        return None

    def refresh(self):
        return 0.0

    def describe(self):
        return {}


UNQUANTIZED = ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod",
               "UnquantizedFusedMoEMethod")


class ModuleComputeView(ComputeView):
    """A ComputeView over an engine's nn.Module: a parameter whose module
    computes through a quant_method other than the unquantized ones
    (SGLang's and vLLM's UnquantizedLinearMethod, UnquantizedEmbedding-
    Method, UnquantizedFusedMoEMethod) is post-processed after loading
    (FP8 scales, Marlin or other repacking: process_weights_after_loading)
    and computes from something other than the parameter: refused."""

    engine = "engine"

    def __init__(self, model):
        self.model = model
        self.modules = dict(model.named_modules())

    def owner(self, model_name):
        mod, _, leaf = model_name.rpartition(".")
        return mod, self.modules.get(mod), leaf

    def prepare(self, model_name, param):
        mod_name, mod, _leaf = self.owner(model_name)
        qm = getattr(mod, "quant_method", None) if mod is not None else None
        if qm is not None and type(qm).__name__ not in UNQUANTIZED:
            raise IntegrationError(
                "%s: %s computes through %s, which post-processes its weights after "
                "loading (process_weights_after_loading), and this integration does not "
                "re-run that after an apply: serve the model unquantized, or register "
                "block-FP8 weights as they are loaded through dte.Sink with an fp8=1 "
                "layout (docs/INTEGRATION.md, \"FP8 block-scaled weights\")"
                % (self.engine, mod_name, type(qm).__name__))
        return None


class EngineSink:
    """One engine worker (one TP rank) of one engine (replica) as a sink."""

    def __init__(self, named_params, rank, layout, attach, client=None, view=None):
        self.rank, self.layout = rank, layout
        self.replica = int(attach["replica"])
        self.job = attach["job"]
        self.view = view or ComputeView()
        self.sink = Sink(attach.get("socket"), attach["job"], attach["token"],
                         attach["model_config"], layout, attach.get("coordinator", "local"),
                         self.replica, client=client)
        self.arena = None
        self.widen = []        # (FP32 parameter, its BF16 shadow)
        self.derived = []      # (model name, fn, canonical BF16 shadow): fn(shadow) writes it
        self.refresh_s = 0.0   # the last commit's derived writes and refresh
        self.version = 0
        try:
            self._attach(dict(named_params), set(attach.get("ignore") or ()))
        except Exception:
            self.close()
            raise

    def _attach(self, params, ignore):
        want = self.sink.expected(self.rank)
        names = [n for _b, _l, n in want]
        model = {n: self.view.model_name(n) for n in names}
        missing = [model[n] for n in names if model[n] not in params]
        if missing:
            raise IntegrationError(
                "%s rank %d: the model has no parameter %s (the layout's names are the "
                "engine's own: %s...)" % (self.layout, self.rank, ", ".join(missing[:4]),
                                         ", ".join(model[n] for n in names[:3])))
        dev = {params[model[n]].device.type for n in names}
        if len(dev) != 1 or dev.pop() not in ("cuda", "cpu"):
            raise IntegrationError("%s rank %d: parameters must all be on one CUDA device "
                                   "or all on the CPU" % (self.layout, self.rank))
        shapes = {t.name: t.shape for t in _lib.layout_tensors(
            self.sink.model_config, self.layout, _lib.SINK, self.rank)}
        regs = {}
        for _bid, length, name in want:
            mname = model[name]
            p = params[mname].data
            fn = self.view.prepare(mname, params[mname])
            halves = p.dtype == torch.float32 and length == 2 * p.numel()
            if (p.numel() != length and not halves) or \
                    (name in shapes and tuple(p.shape) != shapes[name]):
                # the shape too: a [E/ep, 2I, H] w13 and an [E, 2I/ep, H] one
                # have the same size and very different contents
                raise IntegrationError("%s rank %d: %s is %s, the layout's is %s"
                                       % (self.layout, self.rank, mname, tuple(p.shape),
                                          shapes.get(name, (length,))))
            if not p.is_contiguous():
                raise IntegrationError("%s rank %d: %s is not contiguous"
                                       % (self.layout, self.rank, mname))
            if fn is not None:
                if p.dtype != torch.bfloat16:
                    raise IntegrationError("%s rank %d: %s is %s and post-processed by the "
                                           "engine; dted writes BF16 there only"
                                           % (self.layout, self.rank, mname, p.dtype))
                regs[name] = ("derived", params[mname], fn)
            elif halves:
                regs[name] = ("halves", params[mname], None)
            elif p.dtype == torch.bfloat16:
                regs[name] = ("bf16", params[mname], None)
            elif p.dtype == torch.float32:
                regs[name] = ("fp32", params[mname], None)
            else:
                raise IntegrationError("%s rank %d: %s is %s; dted writes BF16 (and FP32 "
                                       "through a BF16 shadow) only"
                                       % (self.layout, self.rank, mname, p.dtype))
        # Checked once the view has seen every parameter: what it rebuilds
        # from them after each apply (MLA's W_UK_T / W_UV) is not extra.
        held = set(model.values())
        extra = [n for n, p in params.items() if n not in held and n not in ignore
                 and p.is_floating_point() and not self.view.derives(n)]
        if extra:
            raise IntegrationError(
                "%s rank %d: parameters %s are not in the layout, so they would never be "
                "updated; pass them in ignore= if that is intended"
                % (self.layout, self.rank, ", ".join(extra[:4])))
        # the view has seen every parameter: whether it rebuilds what the
        # engine derives (MLA) is known now, before the daemon is asked
        self.sink.rederives = bool(self.view.rederives)
        if params[model[names[0]]].is_cuda:
            tensors = {}
            for name, (kind, p, fn) in regs.items():
                if kind == "bf16":
                    tensors[name] = p.data
                elif kind == "halves":
                    tensors[name] = p.data.view(torch.bfloat16)   # the same memory
                else:
                    shadow = torch.zeros(p.shape, dtype=torch.bfloat16, device=p.device) \
                        if kind == "derived" else p.data.to(torch.bfloat16).contiguous()
                    tensors[name] = shadow
                    if kind == "fp32":
                        self.widen.append((p, shadow))
                    else:
                        self.derived.append((model[name], fn, shadow))
            self.sink.attach_cuda(self.rank, tensors)
        else:
            # The daemon maps host memory it is handed as a memfd: move the
            # BF16 parameters there (same values), and put the FP32 ones'
            # shadows there too, and the canonical shadows of what the
            # engine post-processes (a fresh sink's first version is dense,
            # so they need no initial values: nothing reads them before it).
            self.arena = Arena("engine-r%d-%d" % (self.replica, self.rank),
                               [(n, tuple(p.shape), torch.float32 if k == "halves" else
                                 torch.bfloat16) for n, (k, p, _f) in regs.items()])
            for name, (kind, p, fn) in regs.items():
                t = self.arena.tensor(name)
                if kind in ("bf16", "halves"):
                    t.copy_(p.data)
                    p.data = t
                elif kind == "fp32":
                    t.copy_(p.data)
                    self.widen.append((p, t))
                else:
                    self.derived.append((model[name], fn, t))
            self.sink.attach_host(self.rank, {loc.name: (loc.fd, loc.offset, loc.nbytes)
                                              for loc in self.arena.locs()})

    @property
    def parts(self):
        return list(self.sink.parts)

    def stage(self, version, timeout_ms):
        """Phase 1: v is staged (or already applied) here; nothing written."""
        self.sink.stage(version, timeout_ms)

    def commit(self, version, timeout_ms):
        """Phase 2: dted applies every staged version <= v, then the FP32
        parameters take their shadows' values (exact widening), the
        post-processed ones are written from their canonical shadows, and
        the engine's derived copies are rebuilt (ComputeView.refresh)."""
        infos = self.sink.apply(version, timeout_ms)
        t0 = time.perf_counter()
        with torch.no_grad():
            for p, shadow in self.widen:
                p.data.copy_(shadow)
            for _name, fn, shadow in self.derived:
                fn(shadow)
            self.view.refresh()
        self.refresh_s = time.perf_counter() - t0
        self.version = version
        return infos

    def applied(self):
        return self.sink.version()

    def close(self):
        if self.sink is not None:
            self.sink.close()
            self.sink = None
        self.widen = []
        self.derived = []
        # The arena's tensors are the engine's parameters now: it lives as
        # long as they do (closing it under them would unmap live memory).


# ---- the controller's view of the workers, from the daemon --------------------

def find_dtectl(explicit=None):
    """dtectl: explicit, $DTECTL, $B/bin/dtectl (B as libdte resolves it),
    or the one on PATH."""
    if explicit:
        return explicit
    if os.environ.get("DTECTL"):
        return os.environ["DTECTL"]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))))
    b = os.environ.get("B", "build")
    cand = os.path.join(b if os.path.isabs(b) else os.path.join(root, b), "bin", "dtectl")
    return cand if os.path.exists(cand) else "dtectl"


def daemon_workers(dtectl, socket, job, runtime, replica):
    """{rank: {"applied", "staged", "checksum_failures", "tp"}} of the sink
    participants of one engine (layout runtime:..., this replica) on the
    controller's daemon (`dtectl --json job JOB`).  Empty when the job is
    unknown or no worker attached yet."""
    args = [dtectl] + (["--socket", socket] if socket else []) + ["--json", "job", job]
    res = subprocess.run(args, capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        if "unknown job" in (res.stderr + res.stdout) or "not_found" in res.stderr:
            return {}
        raise IntegrationError("dtectl job %s failed: %s" % (job, res.stderr.strip()))
    out = {}
    for p in json.loads(res.stdout).get("participants", []):
        lay = p.get("layout", "")
        if p.get("role") != "sink" or int(p.get("replica", 0)) != replica or \
                not lay.startswith(runtime + ":") or not p.get("local", False):
            continue
        opts = dict(kv.split("=", 1) for kv in lay.split(":", 1)[1].split(",") if "=" in kv)
        out[int(p["rank"])] = {"applied": int(p.get("version", 0)),
                               "staged": int(p.get("staged", 0)),
                               "checksum_failures": int(p.get("checksum_failures", 0)),
                               "tp": int(opts.get("tp", 0))}
    return out


class SyncError(RuntimeError):
    """A sync that did not leave every worker of the engine on the version;
    .report says what was done and where every worker stands."""

    def __init__(self, report):
        super().__init__(report.summary())
        self.report = report


class SyncReport:
    def __init__(self, engine, version):
        self.engine, self.version = engine, version
        self.ok = False
        self.mode = None           # the pause mode used
        self.pending = None        # requests in the engine before the pause
        self.actions = []          # what the controller did, in order
        self.workers = {}          # rank -> what the worker (or the daemon) reports
        self.failed = {}           # rank -> why it did not apply
        self.split = False         # some workers on v, others not (engine left paused)
        self.error = None

    def act(self, what):
        self.actions.append(what)

    def summary(self):
        head = "%s: version %d %s" % (self.engine, self.version,
                                      "applied on every worker" if self.ok else
                                      "SPLIT across workers" if self.split else "not applied")
        tail = "; ".join("rank %s: %s" % kv for kv in sorted(self.failed.items()))
        return "%s (mode %s; %s)%s%s" % (head, self.mode, ", ".join(self.actions),
                                         "; " + tail if tail else "",
                                         "; " + self.error if self.error else "")

    def as_dict(self):
        return {"engine": self.engine, "version": self.version, "ok": self.ok,
                "mode": self.mode, "pending": self.pending, "actions": list(self.actions),
                "workers": dict(self.workers), "failed": dict(self.failed),
                "split": self.split, "error": self.error}

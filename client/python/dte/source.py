"""Trainer side: publish a torch model's AdamW updates through dted.

A Source is one trainer process's view of a job: it registers, per trainer
rank it hosts, the FP32 memory a layout expects (param, exp_avg,
exp_avg_sq) and attaches it; it watches the optimizer so every step's
hyper-parameters are the ones torch actually used; and it exposes
publish / mark / wait (docs/SYNC.md).

    src = Source.megatron_core(model_chunks, optimizer, socket, job, token,
                               config_json, tp, dp, rank)   # a real Megatron-Core rank
    src = Source.fsdp2(model, opt, socket, job, token, config_json, rank, world)
    src = Source.megatron(model, trainer.opt, socket, job, token)   # dte.megatron stand-in
    src = Source.hf(dict(model.named_parameters()), opt, socket, ...)  # unsharded, fsdp2:dp=1
    loss.backward(); opt.step()             # captured by the Source
    src.publish(v)                          # returns at once: the daemon reads θ, m, v
                                            # while the trainer runs forward/backward
    loss.backward(); opt.step()             # the step waits until that capture is done
    src.publish(v, wait=True)               # sync: returns once every sink applied

Publish does not stop the trainer (protocol 2, docs/SYNC.md): publish(v)
returns once the daemon accepted the version; its capture reads θ, m, v
while the trainer runs its next forward and backward, and the wrapped
optimizer step waits (wait_captured) only if that capture has not finished
reading.  An error the capture found is raised there, by the step, before
anything is written.  The info publish(v) returns resolves (waits for the
capture) when first read.

One wrapper around optimizer.step for every Source: OptimizerWatch.  It
reads each group's hyper-parameters and which parameters have a gradient
before the step, and the step counts after it.  ShardSource (Source.hf,
Source.megatron_core, Source.fsdp2; layouts fsdp2:, mcore:) registers
what the optimizer holds, shard by shard, and gives every shard its own
group: any number of param groups, each tensor's own step count, and
tensors that did not step (grad None: an expert no token reached) sent as
unchanged.  The flat layouts (megatron:, fsdp:; Source.megatron,
attach_host / attach_cuda + track) know two groups, 0 for tensors with
weight decay (every matrix) and 1 for those without (1-D: norms,
biases); Source derives that record from the watch and refuses a step it
cannot describe that way (param groups of one layout group that disagree,
a tensor that did not step).

Registered memory stays what the trainer updates (docs/DESIGN.md,
"Registered trainer memory"): host memory goes to the daemon as memfds
(shm.Arena) the Source owns; CUDA tensors as IPC handles of their
allocations plus an IPC event the Source records after every optimizer
step (register_cuda_tensor).  The Source keeps a reference to every
registered tensor (so the allocator cannot free or reuse it while the
Source lives) and, at every publish and mark, before the capture, checks
that the model and the optimizer still hold that memory: a host tensor
the trainer replaced (optimizer.load_state_dict, an offload and reload of
the optimizer state) is adopted back (its values copied into the
registered memory, the optimizer or parameter pointed at it again); what
cannot be adopted (CUDA memory, another shape or dtype) fails the publish
with a SourceError naming the tensor.
"""

import collections
import collections.abc
import re
import time
import types

import torch

from . import _lib
from .shard import (Shard, SourceError, adamw_state,  # noqa: F401  (dte.source's own names too)
                    move_to_arena)
from .shm import Arena

LAYOUT_GROUPS = 2  # 0: weight decay (matrices), 1: no decay (1-D)

KINDS = ("param", "exp_avg", "exp_avg_sq")


def layout_group(param):
    """The daemon's group id for a parameter: 1-D tensors carry no decay."""
    return 1 if param.dim() == 1 else 0


# What a Source publishes for one step and one rank: the step, one
# hyper-parameter dict per group, and (shard layouts) each group's own step
# count or GROUP_UNCHANGED (None: every group has `step`).
StepRecord = collections.namedtuple("StepRecord", "step groups steps", defaults=(None,))
# The group of a shard no optimizer steps (Shard.opt None: an FP32 tensor
# the engines hold, sent whole every version): nothing to invert.
UNSTEPPED = {"lr": 0.0, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0,
             "variant": "torch"}


# ---- the optimizer step: one wrapper for every Source --------------------------------

def optimizer_form(opt):
    """('torch', 'state') for torch Adam/AdamW (per-parameter step in
    state['step']); ('fused', 'group') for Apex / TransformerEngine
    FusedAdam in decoupled mode (transformer_engine/pytorch/optimizers/
    fused_adam.py FusedAdam.step: group['step'] += 1 per group, params whose
    grad is None skipped; apex/optimizers/fused_adam.py likewise).  Anything
    whose update is not the AdamW the compute core inverts is refused."""
    if isinstance(opt, torch.optim.AdamW):
        for gi, g in enumerate(opt.param_groups):
            if g.get("amsgrad") or g.get("maximize"):
                raise SourceError("source: param group %d uses amsgrad/maximize; its update "
                                  "cannot be inverted" % gi)
        return "torch", "state"
    if isinstance(opt, torch.optim.Adam):
        for gi, g in enumerate(opt.param_groups):
            if g.get("amsgrad") or g.get("maximize"):
                raise SourceError("source: param group %d uses amsgrad/maximize" % gi)
            if float(g["weight_decay"]) != 0.0 or g.get("decoupled_weight_decay"):
                if not g.get("decoupled_weight_decay"):
                    raise SourceError("source: torch.optim.Adam with weight_decay (L2 on the "
                                      "gradient) is not AdamW; use AdamW")
        return "torch", "state"
    if hasattr(opt, "adam_w_mode") and all("bias_correction" in g for g in opt.param_groups):
        if not opt.adam_w_mode:
            if any(float(g["weight_decay"]) for g in opt.param_groups):
                raise SourceError("source: %s with adam_w_mode=False (L2 decay) is not AdamW"
                                  % type(opt).__name__)
        if not all(g["bias_correction"] for g in opt.param_groups):
            raise SourceError("source: %s without bias_correction cannot be inverted"
                              % type(opt).__name__)
        if getattr(opt, "capturable", False):
            raise SourceError("source: %s(capturable=True) keeps its step on the device; "
                              "not supported" % type(opt).__name__)
        return "fused", "group"
    raise SourceError("source: cannot invert %s.%s (torch AdamW, or Apex/TransformerEngine "
                      "FusedAdam)" % (type(opt).__module__, type(opt).__name__))


def _hyper(g, variant):
    lr = g["lr"]
    return {"lr": float(lr), "beta1": float(g["betas"][0]), "beta2": float(g["betas"][1]),
            "eps": float(g["eps"]), "weight_decay": float(g["weight_decay"]),
            "variant": variant}


StepSeen = collections.namedtuple("StepSeen", "calls hyper stepped steps group_steps")


class OptimizerWatch:
    """Wraps one optimizer's step (the optimizer that updates the FP32
    values: Megatron's inner optimizer, not its wrapper).  Before the step
    it reads each group's hyper-parameters (a scheduler stepped afterwards,
    as Megatron does, cannot make the record lie) and which parameters have
    a gradient; after it, the step counts (StepSeen)."""

    def __init__(self, opt):
        self.opt = opt
        self.variant, self.where = optimizer_form(opt)
        self.calls = 0
        self.last = None
        self.listeners = []
        self.before = []         # called before the real step (Source: wait_captured)
        self._orig = opt.step
        watch = self

        def step(o, *args, **kwargs):
            hyper = [_hyper(g, watch.variant) for g in o.param_groups]
            decoupled = getattr(o, "use_decoupled_grad", False)
            stepped = {}
            for g in o.param_groups:
                for p in g["params"]:
                    grad = getattr(p, "decoupled_grad", None) if decoupled else p.grad
                    stepped[id(p)] = grad is not None
            for f in watch.before:
                f()
            out = watch._orig(*args, **kwargs)
            watch._after(hyper, stepped)
            return out

        # A scheduler made earlier already wraps _orig to see the steps; say
        # so, or it warns that step() was overridden (torch 1.x
        # _with_counter, 2.x _wrapped_by_lr_sched: torch/optim/lr_scheduler.py).
        for mark in ("_with_counter", "_wrapped_by_lr_sched"):
            if getattr(self._orig, mark, False):
                setattr(step, mark, True)
        # A bound method, so that a scheduler created later can still wrap it.
        opt.step = types.MethodType(step, opt)

    def _after(self, hyper, stepped):
        self.calls += 1
        steps, gsteps = {}, []
        for g in self.opt.param_groups:
            gs = g.get("step")
            gsteps.append(int(gs) if gs is not None else 0)
            if self.where == "state":
                for p in g["params"]:
                    st = self.opt.state.get(p)
                    if st and "step" in st:
                        steps[id(p)] = int(float(st["step"]))
        self.last = StepSeen(self.calls, hyper, stepped, steps, gsteps)
        for f in self.listeners:
            f(self)

    def group_of(self, key):
        for gi, g in enumerate(self.opt.param_groups):
            if any(p is key for p in g["params"]):
                return gi
        raise SourceError("source: a shard's tensor is in no param group of %s"
                          % type(self.opt).__name__)

    def step_of(self, seen, gi, key):
        """The step count `key` (in param group gi) reached in `seen`, or
        GROUP_UNCHANGED when it had no gradient (it did not step)."""
        if not seen.stepped.get(id(key), False):
            return _lib.GROUP_UNCHANGED
        if self.where == "group":
            return seen.group_steps[gi]
        return seen.steps.get(id(key), 0)

    def detach(self):
        if self.opt is not None:
            self.opt.step = self._orig
            self.opt = None


# The name earlier releases gave their (second) step wrapper.
StepCapture = OptimizerWatch


class StepView:
    """Source.capture: the step its OptimizerWatch saw last, as this Source
    publishes it.  .last is that StepRecord (of the first attached rank; None
    before any step); ._orig is the watched optimizer's own step.  It wraps
    nothing itself."""

    def __init__(self, src):
        self._src = src

    @property
    def watch(self):
        ws = list(self._src.watches.values())
        if len(ws) != 1:
            raise SourceError("source: %d optimizers watched; use Source.watches" % len(ws))
        return ws[0]

    @property
    def last(self):
        if all(w.last is None for w in self._src.watches.values()):
            return None
        return self._src.record()

    @property
    def steps(self):
        return self.watch.calls

    @property
    def _orig(self):
        return self.watch._orig

    @_orig.setter
    def _orig(self, f):
        self.watch._orig = f


# ---- registered memory: still what the trainer updates? -------------------------------

def _local(t):
    """The plain tensor holding t's memory (a DTensor's local shard)."""
    if t is None:
        return None
    inner = getattr(t, "_local_tensor", None)
    return inner if inner is not None else t.detach()


def _span(t):
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def _within(t, outer):
    """True when tensor t's memory lies inside tensor outer's."""
    if outer is None or t.device != outer.device or t.numel() == 0:
        return False
    a, b = _span(t)
    c, d = _span(outer)
    return c <= a and b <= d


def _same_memory(a, b):
    return (a.device == b.device and a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
            and a.stride() == b.stride() and a.data_ptr() == b.data_ptr())


class Held:
    """One registered tensor and where the trainer keeps it.

    reg: the memory the daemon reads (a private alias: it pins the storage,
    so neither torch's caching allocator nor the host allocator can hand it
    to anything else while the Source lives); get(): the tensor the model or
    optimizer holds now for it; put(t): makes the trainer hold t again
    (None where that cannot be done: DTensors, CUDA)."""

    __slots__ = ("name", "reg", "get", "put")

    def __init__(self, name, reg, get, put=None):
        self.name, self.reg, self.get, self.put = name, reg.detach(), get, put

    def check(self):
        """False while the trainer still holds the registered memory; True
        after adopting a replacement back; SourceError where it cannot."""
        try:
            live = self.get()
        except (KeyError, AttributeError, TypeError, IndexError):
            live = None
        reg = self.reg
        if live is not None and _same_memory(live, reg):
            return False
        why = ("the trainer no longer holds it" if live is None else
               "the trainer replaced it (now %s %s on %s at 0x%x; registered: %s %s on %s at "
               "0x%x)" % (live.dtype, tuple(live.shape), live.device, live.data_ptr(),
                          reg.dtype, tuple(reg.shape), reg.device, reg.data_ptr()))
        if reg.is_cuda:
            raise SourceError(
                "source: %s: %s.  Its CUDA memory was registered by IPC handle at attach; "
                "re-registering CUDA memory needs a new attach (close this Source and attach "
                "again after the trainer settled its memory), so this publish is refused"
                % (self.name, why))
        if live is None or self.put is None:
            raise SourceError("source: %s: %s, and the Source cannot point the trainer back at "
                              "the registered memory; attach again" % (self.name, why))
        if live.dtype != reg.dtype or tuple(live.shape) != tuple(reg.shape) or \
                live.device != reg.device:
            raise SourceError("source: %s: %s; a tensor of another shape, dtype or device "
                              "cannot be adopted into the registered memory; attach again"
                              % (self.name, why))
        with torch.no_grad():
            reg.copy_(live)
        self.put(reg)
        now = self.get()
        if now is None or not _same_memory(now, reg):
            raise SourceError("source: %s: %s, and pointing the trainer back at the registered "
                              "memory did not hold; attach again" % (self.name, why))
        return True


def held_tensors(opt, key, name, thetas=(), moments=((), ())):
    """Held entries for one tensor the optimizer steps (key): its θ when
    every registered θ in `thetas` lies in key's memory (or in
    state['master_param']: FusedAdam master weights), and each moment whose
    registered views (moments[0]: exp_avg, moments[1]: exp_avg_sq) lie in
    the state tensor.  A parameter or state tensor is pointed back by
    key.data = / state[kind] = , which only plain tensors allow."""
    out = []
    plain = not hasattr(key, "_local_tensor")
    local = _local(key)

    def put_param(reg, key=key):
        key.data = reg

    def state_getter(kind):
        def get():
            st = opt.state.get(key)
            return _local(st.get(kind)) if st else None
        return get

    def state_putter(kind):
        def put(reg):
            opt.state[key][kind] = reg.detach()
        return put

    st = opt.state.get(key) or {}
    if thetas and all(_within(t, local) for t in thetas):
        out.append(Held("%s param" % name, local, lambda: _local(key),
                        put_param if plain and not local.is_cuda else None))
    elif thetas and all(_within(t, _local(st.get("master_param"))) for t in thetas):
        mp = st["master_param"]
        out.append(Held("%s master_param" % name, _local(mp), state_getter("master_param"),
                        state_putter("master_param") if not hasattr(mp, "_local_tensor")
                        else None))
    for kind, views in zip(("exp_avg", "exp_avg_sq"), moments):
        t = st.get(kind)
        if views and all(_within(v, _local(t)) for v in views):
            out.append(Held("%s %s" % (name, kind), _local(t), state_getter(kind),
                            state_putter(kind) if not hasattr(t, "_local_tensor") else None))
    return out


# ---- CUDA: IPC handles of the storages ------------------------------------------

def cuda_ipc_region(t):
    """(handle bytes, byte offset of t in the allocation, device) of a CUDA
    tensor, through the same torch call its multiprocessing uses."""
    if not t.is_cuda:
        raise SourceError("source: %s is not a CUDA tensor" % (t.device,))
    if not t.is_contiguous():
        raise SourceError("source: CUDA tensors must be contiguous to be registered")
    # torch >= 2 deprecates TypedStorage; 1.13 has only tensor.storage().
    storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    device, handle, _size, storage_off, _rc_h, _rc_off, _ev, _ev_sync = storage._share_cuda_()
    offset = int(storage_off) + t.storage_offset() * t.element_size()
    return _cuda_ipc_mem_handle(bytes(handle)), offset, int(device)


CUDA_IPC_HANDLE_SIZE = 64


def _cuda_ipc_mem_handle(h):
    """The cudaIpcMemHandle_t inside torch's shareable handle.  torch 1.x
    gives the 64 raw bytes; torch 2.x prefixes a version byte and a type
    byte: 'c' (a cudaMalloc block, then the 64 bytes) or 'e' (an expandable
    segment, exported as cuMem handles that cudaIpcOpenMemHandle cannot
    open)."""
    if len(h) == CUDA_IPC_HANDLE_SIZE:
        return h
    if len(h) == CUDA_IPC_HANDLE_SIZE + 2 and h[1:2] == b"c":
        return h[2:]
    if len(h) >= 2 and h[1:2] == b"e":
        raise SourceError("source: the tensor lives in an expandable segment "
                          "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), which has no "
                          "CUDA IPC memory handle; allocate registered tensors without it")
    raise SourceError("source: unknown torch shareable CUDA handle (%d bytes, starts %r)"
                      % (len(h), h[:2]))


def register_cuda_tensor(cli, t, dtype, name="", event=None):
    """Register a CUDA tensor's memory with the daemon; returns the buffer id."""
    handle, offset, device = cuda_ipc_region(t)
    ev = bytes(event.ipc_handle()) if event is not None else b""
    return cli.register_cuda(handle, offset, t.numel(), dtype, ev, device, name)


# ---- the Source -------------------------------------------------------------------

class Source:
    """One trainer process: its ranks attached to a job as sources."""

    def __init__(self, socket, job, token, model_config, layout, coordinator="local",
                 interval=1, client=None, detect=None, job_options=None):
        """detect: the job option ("adamw", the default, or "snapshot";
        docs/SYNC.md) when this Source creates the job.  job_options: more
        Client.job_create arguments, e.g. a storage writer's
        dict(transport="storage", storage_root="/mnt/dte") (docs/STORAGE.md)."""
        self.job, self.token, self.layout = job, token, layout
        self.model_config = model_config
        self.cli = client or _lib.Client(socket)
        self._own_cli = client is None
        self.created = self.cli.job_create(job, model_config, token, coordinator, interval,
                                           detect=detect, **(job_options or {}))
        self.parts = []          # participant id per attached rank
        self.ranks = []
        self.watches = {}        # id(optimizer) -> OptimizerWatch
        self.capture = StepView(self)
        self.held = []           # [Held]: registered tensors checked at publish and mark
        self.readopted = 0       # replaced host tensors adopted back so far
        self.event = None        # CUDA IPC event recorded after each step
        self.arenas = []         # arenas this Source made (hf path) and must close
        self.published = None    # the step of the last publish
        self.pending = []        # [(part, version)]: async captures not known done
        self.captures = collections.OrderedDict()  # version -> summed capture info
        self.blocked_s = 0.0     # time steps spent waiting for captures
        self.waits = 0           # wait_captured calls that found a capture pending
        self.wait_lib_s = 0.0    # of blocked_s, the time inside libdte's wait_captured
        self.publish_lib_s = 0.0  # time inside libdte's publish calls
        self.cap_events = {}     # part -> the daemon's capture event (CUDA sources)
        self.stream_waits = 0    # times the trainer's stream waited on one

    # -- registration --
    def expected(self, rank):
        """[(id, length, name)] of the buffers `rank` must register."""
        return _lib.layout_buffers(self.model_config, self.layout, _lib.SOURCE, rank)

    def attach_host(self, rank, regions):
        """regions: one (fd, offset, nbytes) per expected buffer, in order."""
        want = self.expected(rank)
        if len(regions) != len(want):
            raise SourceError("source: rank %d of %s needs %d buffers, got %d" % (
                rank, self.layout, len(want), len(regions)))
        ids = []
        for (_bid, length, name), (fd, offset, nbytes) in zip(want, regions):
            if nbytes < 4 * length:
                raise SourceError("source: rank %d buffer %r holds %d bytes, the layout needs "
                                  "%d FP32 elements" % (rank, name, nbytes, length))
            ids.append(self.cli.register_fd(fd, offset, length, _lib.FP32, name))
        return self._attach(rank, ids)

    def attach_cuda(self, rank, tensors):
        """tensors: one contiguous FP32 CUDA tensor per expected buffer."""
        want = self.expected(rank)
        if len(tensors) != len(want):
            raise SourceError("source: rank %d of %s needs %d buffers, got %d" % (
                rank, self.layout, len(want), len(tensors)))
        if self.event is None:
            self.event = torch.cuda.Event(interprocess=True)
            self.event.record()
        ids = []
        for (_bid, length, name), t in zip(want, tensors):
            if t.dtype != torch.float32 or t.numel() < length:
                raise SourceError("source: rank %d buffer %r: need FP32 with %d elements, got "
                                  "%s with %d" % (rank, name, length, t.dtype, t.numel()))
            ids.append(register_cuda_tensor(self.cli, t, _lib.FP32, name, self.event))
        return self._attach(rank, ids)

    def check_places(self, rank, arena):
        """Where the layout says each tensor of `rank` lives in its first
        buffer must be where `arena` holds it (the moments' arenas share the
        offsets).  Needs libdte's layout_tensors; skipped without it."""
        places = getattr(_lib, "layout_tensors", None)
        if places is None:
            return
        for pl in places(self.model_config, self.layout, _lib.SOURCE, rank):
            if pl.buffer != 0:
                continue
            try:
                loc = arena.loc(pl.name)
            except KeyError:
                raise SourceError("source: the layout places %r, which the arena does not "
                                  "hold" % pl.name) from None
            if loc.offset != 4 * pl.offset or tuple(loc.shape) != tuple(pl.shape):
                raise SourceError("source: %r is at byte %d with shape %s in the arena, the "
                                  "layout says byte %d with shape %s" % (
                                      pl.name, loc.offset, tuple(loc.shape), 4 * pl.offset,
                                      tuple(pl.shape)))

    def _attach(self, rank, ids):
        part = self.cli.attach(self.job, self.token, _lib.SOURCE, self.layout, rank, ids)
        self.parts.append(part)
        self.ranks.append(rank)
        return part


    def watch(self, opt):
        """The OptimizerWatch of `opt`, made on first use: the one wrapper of
        its step.  Before each step it waits for a capture that still reads
        (and on CUDA makes the stream wait on the daemon's event); after it,
        the Source's IPC event, if any, is recorded."""
        w = self.watches.get(id(opt))
        if w is None:
            w = self.watches[id(opt)] = OptimizerWatch(opt)
            w.before.append(self._before_step)
            w.listeners.append(self._stepped)
        return w

    def track(self, optimizer):
        """Capture every optimizer step from now on (flat layouts: one
        optimizer, whose param groups map onto the layout's two groups)."""
        if self.watches:
            raise SourceError("source: already tracking an optimizer")
        if not any(g["params"] for g in optimizer.param_groups):
            raise SourceError("source: the optimizer holds no parameters")
        self.watch(optimizer)
        return self

    def _before_step(self):
        if self.pending:
            self.wait_captured()
        if self.cap_events:
            # The two-way handshake of the GPU path: the daemon's stream
            # waited on our step event before its capture kernels read θ,
            # m, v; our stream now waits on the event it recorded after
            # them (cudaStreamWaitEvent: no host synchronisation).
            stream = torch.cuda.current_stream()
            for ev in self.cap_events.values():
                stream.wait_event(ev)
            self.stream_waits += 1

    def _cap_event(self, part, info):
        """Open the daemon's capture event of `part` once (CUDA sources)."""
        h = info.get("cuda_event") or b""
        if h and part not in self.cap_events and self.event is not None:
            # torch/cuda/streams.py Event.from_ipc_handle, as
            # torch/multiprocessing/reductions.py rebuild_event opens one.
            self.cap_events[part] = torch.cuda.Event.from_ipc_handle(
                torch.cuda.current_device(), h)


    def _stepped(self, _watch):
        if self.event is not None:
            self.event.record()  # the daemon waits on it before reading

    # -- per step --
    def record(self, index=0):
        """The StepRecord the last step gives rank `index`: on the flat
        layouts the two groups (0: matrices, 1: 1-D tensors), each with the
        hyper-parameters of the param groups that hold such tensors and one
        step count for all.  A step that does not fit is refused here:
        param groups of one layout group that disagree, or a tensor that
        had no gradient (it did not step; a shard layout sends it as
        unchanged)."""
        if not self.watches:
            raise SourceError("source: no optimizer step captured yet (call track() first)")
        w = next(iter(self.watches.values()))
        seen = w.last
        if seen is None or w.opt is None:
            raise SourceError("source: no optimizer step captured yet")
        groups, holder, steps = [None] * LAYOUT_GROUPS, [None] * LAYOUT_GROUPS, {}
        kinds = ("matrix", "1-D")
        for gi, g in enumerate(w.opt.param_groups):
            for p in g["params"]:
                lg = layout_group(p)
                if groups[lg] is None:
                    groups[lg], holder[lg] = seen.hyper[gi], gi
                elif seen.hyper[gi] != groups[lg]:
                    raise SourceError(
                        "source: param groups %d and %d disagree on hyper-parameters (%s vs "
                        "%s) but layout %s has one group for all %s tensors" % (
                            holder[lg], gi, groups[lg], seen.hyper[gi], self.layout, kinds[lg]))
                s = w.step_of(seen, gi, p)
                if s == _lib.GROUP_UNCHANGED:
                    raise SourceError(
                        "source: a %s tensor of shape %s (param group %d) had no gradient on "
                        "optimizer step %d, so it did not step; layout %s gives all %s tensors "
                        "one step count and cannot say so (a shard layout can: Source.hf, "
                        "ShardSource)" % (kinds[lg], tuple(p.shape), gi, seen.calls,
                                          self.layout, kinds[lg]))
                steps.setdefault(s, tuple(p.shape))
        if len(steps) != 1:
            raise SourceError("source: parameters disagree on the step count %s" % sorted(steps))
        fill = next(v for v in groups if v is not None)
        return StepRecord(next(iter(steps)), [v if v is not None else fill for v in groups])

    def check_memory(self):
        """Before a capture: every registered tensor must still be what the
        model / optimizer holds.  A replaced host tensor is adopted back
        (values copied into the registered memory, the trainer pointed at
        it); anything else raises SourceError naming the tensor.  Returns
        how many were adopted back."""
        n = 0
        for h in self.held:
            n += bool(h.check())
        self.readopted += n
        return n

    def publish(self, version, wait=False, timeout_ms=60000, asynchronous=True):
        """Publish `version` on every attached rank.  By default returns
        once the daemon accepted it: the capture reads θ, m, v while the
        trainer runs forward and backward, and the next optimizer step
        waits for it (wait_captured).  asynchronous=False returns after the
        capture; wait=True also waits until every sink applied it (today's
        meaning).  Returns the summed publish info (it waits for the
        capture when first read)."""
        rec = self.record()
        return self._publish(version, [(part, rec.groups, None) for part in self.parts],
                             rec.step, wait, timeout_ms, asynchronous)

    def _publish(self, version, per_part, step, wait, timeout_ms, asynchronous):
        if self.pending:
            self.wait_captured(timeout_ms=timeout_ms)
        # No capture reads the registered memory now: adopting a replaced
        # tensor back may write it.
        self.check_memory()
        asynchronous = asynchronous and not wait
        infos = []
        for part, groups, steps in per_part:
            t1 = time.perf_counter()
            try:
                infos.append(self.cli.publish(self.job, part, version, step, groups, steps,
                                              asynchronous=asynchronous))
            finally:
                self.publish_lib_s += time.perf_counter() - t1
            self._cap_event(part, infos[-1])
            if asynchronous and not infos[-1]["captured"]:
                self.pending.append((part, version))
        self.published = step
        if not any(p[1] == version for p in self.pending):
            self._keep(version, infos)
        if wait:
            self.wait(version, timeout_ms)
        return PublishInfo(self, version, step)

    def _keep(self, version, infos):
        total = collections.Counter()
        for info in infos:
            for k in ("sinks", "dense", "changed", "elements", "bytes"):
                total[k] += info[k]
            total["capture_ms"] = max(total["capture_ms"], info["capture_ms"])
        self.captures[version] = dict(total)
        while len(self.captures) > 64:
            self.captures.popitem(last=False)

    def wait_captured(self, timeout_ms=60000):
        """Returns once no capture of this Source reads θ, m, v any more.
        Raises SourceError with the capture's own error (that capture is
        then over: the trainer may step), or when a capture still reads
        after timeout_ms (then it must not step)."""
        t0 = time.monotonic()
        self.waits += 1
        errors, infos = [], collections.defaultdict(list)
        try:
            while self.pending:
                part, version = self.pending[0]
                try:
                    t1 = time.perf_counter()
                    try:
                        got = self.cli.wait_captured(self.job, part, version, timeout_ms)
                    finally:
                        self.wait_lib_s += time.perf_counter() - t1
                    # libdte reads the async publish's accept here (it is
                    # pipelined): its capture event, if any, comes with it.
                    self._cap_event(part, got)
                    infos[version].append(got)
                except _lib.DteError as e:
                    if e.code == _lib.ERR_TIMEOUT:
                        raise SourceError("source: the capture of version %d still reads the "
                                          "trainer's buffers after %d ms: %s"
                                          % (version, timeout_ms, e.msg)) from e
                    errors.append("version %d: %s" % (version, e.msg))
                self.pending.pop(0)
        finally:
            self.blocked_s += time.monotonic() - t0
        for version, got in infos.items():
            self._keep(version, got)
        if errors:
            raise SourceError("source: capture failed: %s" % "; ".join(errors))


    def mark(self):
        """After each step that is not published (publish interval K > 1)."""
        rec = self.record()
        if self.pending:
            self.wait_captured()
        self.check_memory()
        return sum(self.cli.mark(self.job, part, rec.step, rec.groups) for part in self.parts)

    def wait(self, version, timeout_ms=60000):
        """Returns when every sink applied `version`; DteError when one
        failed it (raised only once every sink settled it: docs/SYNC.md,
        WAIT) or on timeout."""
        if self.pending:
            self.wait_captured(timeout_ms=timeout_ms)
        self.cli.wait(self.job, version, timeout_ms)


    def detach(self):
        """Put every watched optimizer's own step back (close calls this)."""
        for w in self.watches.values():
            w.detach()
        self.watches = {}

    def close(self):
        if self.pending and self.cli is not None:
            try:
                self.wait_captured(timeout_ms=10000)
            except SourceError:
                pass  # closing anyway: the daemon drops the capture with the connection
        self.detach()
        self.held = []
        if self._own_cli and self.cli is not None:
            self.cli.close()
        self.cli = None
        for a in self.arenas:
            try:
                a.close()
            except BufferError:
                pass  # the model still uses it: unmapped when the last view goes
        self.arenas = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- ready-made sources --
    @classmethod
    def megatron(cls, model, optimizer, socket, job, token, coordinator="local", interval=1,
                 model_config=None):
        """A dte.megatron.MegatronModel built with flat=True (its arenas are
        the distributed optimizer's flat buffers) and the AdamW whose state
        lives in those arenas (layout megatron:tp=N, two groups)."""
        import json
        if not getattr(model, "flat", False):
            raise SourceError("source: build the MegatronModel with flat=True, so each rank's "
                              "arenas are the flat buffers megatron:tp=N expects")
        for r, ps in enumerate(model.params):
            for n, p in ps.items():
                st = optimizer.state.get(p, {})
                for kind in ("exp_avg", "exp_avg_sq"):
                    t = st.get(kind)
                    if t is None or t.data_ptr() != model.arenas[r][kind].tensor(n).data_ptr():
                        raise SourceError("source: rank %d %s %s is not in the shm arena "
                                          "(create the AdamW state there first)" % (r, n, kind))
        cfg_text = model_config or json.dumps(model.cfg)
        src = cls(socket, job, token, cfg_text, "megatron:tp=%d" % model.tp, coordinator,
                  interval)
        try:
            for r in range(model.tp):
                src.check_places(r, model.arenas[r]["param"])
                src.attach_host(r, [(model.arenas[r][k].fd, 0, model.arenas[r][k].size)
                                    for k in KINDS])
                for n, p in model.params[r].items():
                    st = optimizer.state[p]
                    src.held += held_tensors(optimizer, p, "rank %d %s" % (r, n),
                                             [model.arenas[r]["param"].tensor(n)],
                                             ([st["exp_avg"]], [st["exp_avg_sq"]]))
            src.track(optimizer)
        except Exception:
            src.close()
            raise
        return src


class PublishInfo(collections.abc.Mapping):
    """What publish(v) returns: sinks, dense, changed, elements, bytes,
    capture_ms (summed over the Source's ranks) and step.  The counts are
    the capture's: the first read waits for it (Source.wait_captured)."""

    def __init__(self, src, version, step):
        self._src, self._version, self._step = src, version, step
        self._d = None

    def _resolve(self):
        if self._d is None:
            src = self._src
            if any(v == self._version for _p, v in src.pending):
                src.wait_captured()
            d = dict(src.captures.get(self._version, {}))
            d["step"] = self._step
            self._d = d
        return self._d

    def __getitem__(self, k):
        return self._resolve()[k]

    def __iter__(self):
        return iter(self._resolve())

    def __len__(self):
        return len(self._resolve())

    def __repr__(self):
        return repr(self._resolve())


def host_region(arenas, t):
    """(fd, byte offset) of a CPU tensor inside one of the arenas."""
    for a in arenas:
        if a.contains(t):
            return a.fd, t.data_ptr() - a.base
    raise SourceError("source: a host tensor is not in a registered memfd arena "
                      "(the daemon maps memfds only)")


# ---- registered shards: what a real optimizer holds ---------------------------------
#
# Real trainers keep one FP32 master and one pair of Adam moments per
# parameter shard (Megatron-Core DistributedOptimizer, FSDP2), not flat
# buffers.  A ShardSource registers each shard as three buffers and tells
# the daemon which parameter and which flat range of it they hold (layouts
# mcore: and fsdp2:, daemon/layout/gen_shards.c).  Every shard is its own
# optimizer group at the daemon: it carries its param group's
# hyper-parameters and its own step count, and a shard whose tensor did not
# step (grad None: an MoE expert no token reached, a frozen module) is sent
# as unchanged.  A shard itself is dte.shard.Shard.


class ShardSource(Source):
    """A trainer whose ranks register shards (layouts mcore:, fsdp2:).

    Build it, attach_shards(rank, shards) per rank this process hosts, then
    train and publish(v) as with any Source.  Host shards must already live
    in memfd arenas this Source knows (self.arenas; move_to_arena), CUDA
    shards are registered by IPC handle."""

    def __init__(self, socket, job, token, model_config, layout, coordinator="local",
                 interval=1, client=None, detect=None, job_options=None):
        super().__init__(socket, job, token, model_config, layout, coordinator, interval, client,
                         detect, job_options)
        self.shards = []         # per attached part: [Shard]

    @staticmethod
    def table(rank, shards):
        """The shard table of one rank (proto/dte.proto AttachRequest.shards):
        shard k is its own group k."""
        return "".join("%d %d %d %d %s %s\n" % (rank, k, s.lo, s.hi, s.name,
                                               ",".join(str(d) for d in s.shape))
                       for k, s in enumerate(shards))

    def attach_shards(self, rank, shards, names=None):
        """names: {id(key): the trainer's name of that tensor}, for messages
        about its memory (default: its first shard's name)."""
        shards = list(shards)
        for s in shards:
            if s.opt is not None:   # None: an FP32 tensor without optimizer (Shard)
                self.watch(s.opt).group_of(s.key)  # refuses a tensor the optimizer does not step
        ids = []
        cuda = [s for s in shards if s.theta.is_cuda]
        if cuda and self.event is None:
            self.event = torch.cuda.Event(interprocess=True)
            self.event.record()
        for s in shards:
            for kind in ("theta", "exp_avg", "exp_avg_sq"):
                t = getattr(s, kind)
                label = "%s [%d, %d) %s" % (s.name, s.lo, s.hi, kind)
                if t.is_cuda:
                    ids.append(register_cuda_tensor(self.cli, t, _lib.FP32, label[:95],
                                                    self.event))
                else:
                    fd, off = host_region(self.arenas, t)
                    ids.append(self.cli.register_fd(fd, off, t.numel(), _lib.FP32, label[:95]))
        part = self.cli.attach(self.job, self.token, _lib.SOURCE, self.layout, rank, ids,
                               shards=self.table(rank, shards))
        self.parts.append(part)
        self.ranks.append(rank)
        self.shards.append(shards)
        self.held += self._held_of(shards, names or {})
        return part

    @staticmethod
    def _held_of(shards, names):
        """Held entries per tensor the optimizer steps (held_tensors): one
        per registered θ / moment tensor, however many shards view it."""
        by = collections.OrderedDict()
        for s in shards:
            if s.opt is not None:
                by.setdefault((id(s.opt), id(s.key)), []).append(s)
        out = []
        for group in by.values():
            s0 = group[0]
            out += held_tensors(s0.opt, s0.key, names.get(id(s0.key), s0.name),
                                [s.theta for s in group],
                                ([s.exp_avg for s in group], [s.exp_avg_sq for s in group]))
        return out

    # -- per step --
    def _groups(self, shards):
        groups, steps, index = [], [], {}
        for s in shards:
            if s.opt is None:
                # Sent whole every version (its halves): no step to invert.
                groups.append(UNSTEPPED)
                steps.append(_lib.GROUP_UNCHANGED)
                continue
            w = self.watches[id(s.opt)]
            seen = w.last
            if seen is None:
                raise SourceError("source: no optimizer step captured yet")
            gis = index.get(id(w))
            if gis is None:
                gis = index[id(w)] = {id(p): gi for gi, g in enumerate(w.opt.param_groups)
                                      for p in g["params"]}
            gi = gis.get(id(s.key))
            if gi is None:
                w.group_of(s.key)  # raises, naming the optimizer
            groups.append(seen.hyper[gi])
            steps.append(w.step_of(seen, gi, s.key))
            if steps[-1] == 0:
                raise SourceError("source: %s stepped but its optimizer keeps no step count"
                                  % s.name)
        return groups, steps

    def _step(self):
        if not self.watches or all(w.last is None for w in self.watches.values()):
            raise SourceError("source: no optimizer step captured yet")
        return max(w.calls for w in self.watches.values())

    def record(self, index=0):
        """The StepRecord of rank `index` (its index in self.parts): one
        group per shard, each with its own step count or GROUP_UNCHANGED."""
        step = self._step()
        groups, steps = self._groups(self.shards[index])
        return StepRecord(step, groups, steps)

    def publish(self, version, wait=False, timeout_ms=60000, asynchronous=True):
        step = self._step()
        per_part = []
        for part, shards in zip(self.parts, self.shards):
            groups, steps = self._groups(shards)
            per_part.append((part, groups, steps))
        return self._publish(version, per_part, step, wait, timeout_ms, asynchronous)

    def mark(self):
        step = self._step()
        if self.pending:
            self.wait_captured()
        self.check_memory()
        n = 0
        for part, shards in zip(self.parts, self.shards):
            groups, steps = self._groups(shards)
            n += self.cli.mark(self.job, part, step, groups, steps)
        return n

    def track(self, optimizer):
        self.watch(optimizer)
        return self

    def close(self):
        self.shards = []
        super().close()


def _shards_from(entries):
    return [Shard(name, shape, lo, hi, theta.reshape(-1), m.reshape(-1), v.reshape(-1), opt, key)
            for name, shape, lo, hi, theta, m, v, opt, key in entries]


# ---- Hugging Face models, unsharded ---------------------------------------------------
#
# transformers 5 holds an MoE layer's experts fused, as two parameters
# (transformers/models/qwen3_moe/modeling_qwen3_moe.py, Qwen3MoeExperts,
# transformers 5.19): gate_up_proj [E, 2I, H] and down_proj [E, H, I].
# Its forward takes `gate, up = linear(x, gate_up_proj[e]).chunk(2, dim=-1)`
# and `linear(h, down_proj[e])`, so rows [0, I) of gate_up_proj[e] are
# expert e's gate_proj.weight [I, H], rows [I, 2I) its up_proj.weight, and
# down_proj[e] its down_proj.weight [H, I] (the decorator
# use_experts_implementation: is_concatenated=True, is_transposed=False).
# Each of those is a contiguous range of the fused tensor: the Source
# registers the checkpoint's per-expert tensors as views of it.

EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def _numel(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


def hf_places(named, wanted):
    """Where each canonical tensor (name, shape) of `wanted` lives among the
    model's parameters `named`: [(name, shape, model name, flat offset)].
    A tensor the model holds under its own name is the whole of it; an
    expert's tensor missing under its name is a range of the fused
    mlp.experts.gate_up_proj / down_proj (transformers 5).  Every element
    of a model tensor used must be some canonical tensor's."""
    out, covered = [], collections.Counter()
    for name, shape in wanted:
        shape = tuple(int(s) for s in shape)
        n = _numel(shape)
        p = named.get(name)
        if p is not None:
            if tuple(p.shape) != shape:
                raise SourceError("source: %s is %s in the model, the config says %s"
                                  % (name, tuple(p.shape), shape))
            out.append((name, shape, name, 0))
            covered[name] += n
            continue
        m = EXPERT.match(name)
        fused = None
        if m and len(shape) == 2:
            base, e, proj = m.group(1), int(m.group(2)), m.group(3)
            fname = base + (".down_proj" if proj == "down_proj" else ".gate_up_proj")
            f = named.get(fname)
            if f is not None:
                rows = shape[0] if proj == "down_proj" else 2 * shape[0]
                if f.dim() != 3 or e >= f.shape[0] or tuple(f.shape[1:]) != (rows, shape[1]):
                    raise SourceError("source: %s is %s; expert %d's %s %s does not fit in it "
                                      "as transformers' Qwen3MoeExperts holds it ([E, 2I, H] "
                                      "gate_up_proj, [E, H, I] down_proj)"
                                      % (fname, tuple(f.shape), e, proj, shape))
                lo = e * rows * shape[1] + (n if proj == "up_proj" else 0)
                fused = (name, shape, fname, lo)
        if fused is None:
            raise SourceError("source: the layout wants %r, which the model does not have%s"
                              % (name, " (an HF buffer: pass dict(model.named_buffers()) too)"
                                 if name.endswith("e_score_correction_bias") else ""))
        out.append(fused)
        covered[fused[2]] += n
    for mname, n in covered.items():
        if n != named[mname].numel():
            raise SourceError("source: the config's tensors cover %d of the %d elements of %s "
                              "%s (more experts in the model than in config.json?)"
                              % (n, named[mname].numel(), mname, tuple(named[mname].shape)))
    return out


def _hf(cls, named_params, optimizer, socket, job, token, model_config, coordinator="local",
        interval=1, label="hf-source", detect=None, job_options=None):
    if not (isinstance(cls, type) and issubclass(cls, ShardSource)):
        cls = ShardSource
    named = collections.OrderedDict(named_params)
    wanted = [(pl.name, pl.shape) for pl in
              _lib.layout_tensors(model_config, "fsdp:dp=1", _lib.SOURCE, 0)]
    places = hf_places(named, wanted)
    used = collections.OrderedDict()
    for _c, _s, mname, _lo in places:
        used.setdefault(mname, named[mname])
    for n, p in used.items():
        if p.dtype != torch.float32 or p.is_cuda:
            raise SourceError("source: %s is %s on %s; the host path takes FP32 CPU "
                              "params" % (n, p.dtype, p.device))
    # Tensors the engines hold in FP32 are sent as their exact bits, whole
    # every version; one the optimizer does not step (an HF buffer:
    # mlp.gate.e_score_correction_bias, which aux-loss-free balancing
    # moves outside the optimizer) is registered with zero moments,
    # which nothing reads.
    fp32 = _lib.fp32_tensors(model_config)
    src = cls(socket, job, token, model_config, "fsdp2:dp=1", coordinator, interval,
              detect=detect, job_options=job_options)
    try:
        w = src.watch(optimizer)
        if w.where != "state":
            raise SourceError("source: Source.hf takes torch AdamW (or Adam with decoupled "
                              "decay), not %s" % type(optimizer).__name__)
        group = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        free = set()
        for n, p in used.items():
            if id(p) not in group:
                if all(c in fp32 for c, _s, m, _lo in places if m == n):
                    free.add(n)
                    continue
                raise SourceError("source: the optimizer does not step %s" % n)
            adamw_state(optimizer, group[id(p)], p)
        # Params and moments into memfd arenas (values kept), so the daemon
        # reads the very memory torch updates.
        specs = [(n, tuple(p.shape), torch.float32) for n, p in used.items()]
        arenas = collections.OrderedDict((k, Arena("%s-%s" % (label, k), specs)) for k in KINDS)
        src.arenas = list(arenas.values())
        for n, p in used.items():
            t = arenas["param"].tensor(n)
            t.copy_(p.detach())
            p.data = t
            if n in free:
                continue        # moments stay zero
            st = optimizer.state[p]
            for kind in ("exp_avg", "exp_avg_sq"):
                t = arenas[kind].tensor(n)
                t.copy_(st[kind])
                st[kind] = t
        shards = []
        for cname, shape, mname, lo in places:
            n = _numel(shape)
            views = [arenas[k].tensor(mname).view(-1)[lo:lo + n] for k in KINDS]
            shards.append(Shard(cname, shape, 0, n, views[0], views[1], views[2],
                                None if mname in free else optimizer, used[mname]))
        src.attach_shards(0, shards, names={id(p): n for n, p in used.items()})
    except Exception:
        src.close()
        raise
    return src


_hf.__doc__ = """An unsharded model under HF names (dict(model.named_parameters()))
as rank 0 of fsdp2:dp=1, every canonical tensor its own shard (so a tensor
that did not step is sent as unchanged).  Its FP32 params and AdamW moments
are moved into shm arenas (values kept), so the daemon reads the very
memory torch updates.  transformers 5's fused MoE experts
(mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]) are
registered as the per-expert tensors of the checkpoint, views of the fused
memory; nothing the model holds is copied or renamed."""


def _megatron_core(cls, model_chunks, optimizer, socket, job, token, model_config, tp, dp,
                   rank, ep=1, etp=None, coordinator="local", interval=1, label="mcore"):
    from . import trainers
    entries = trainers.megatron_core_shards(model_chunks, optimizer)
    if not trainers.is_distributed(optimizer):
        # Without the distributed optimizer every DP replica holds whole FP32
        # copies: the first replica is the source (of experts: the first
        # of the expert-data-parallel group).
        eg = ep * (etp or tp)
        entries = [e for e in entries if (rank // eg if trainers.is_expert(e[0]) else rank // tp) == 0]
    if rank == 0:
        entries += trainers.megatron_core_buffers(model_chunks)
    desc = "mcore:tp=%d,dp=%d,ep=%d%s" % (tp, dp, ep, ",etp=%d" % etp if etp else "")
    src = cls(socket, job, token, model_config, desc, coordinator, interval)
    try:
        for opt in trainers.inner_optimizers(optimizer):
            src.watch(opt.optimizer)   # the step count, even of a rank that holds no shard
        if any(not e[4].is_cuda for e in entries):
            trainers.megatron_core_to_host(entries, "%s-r%d" % (label, rank), src.arenas)
        src.attach_shards(rank, _shards_from(entries))
    except Exception:
        src.close()
        raise
    return src


def _fsdp2(cls, model, optimizer, socket, job, token, model_config, rank, world,
           coordinator="local", interval=1, label="fsdp2"):
    from . import trainers
    src = cls(socket, job, token, model_config, "fsdp2:dp=%d" % world, coordinator, interval)
    try:
        entries = trainers.fsdp2_shards(model, optimizer, "%s-r%d" % (label, rank), src.arenas)
        src.attach_shards(rank, _shards_from(entries))
    except Exception:
        src.close()
        raise
    return src


_megatron_core.__doc__ = """One Megatron-Core rank: Source.megatron_core(model_chunks,
optimizer, socket, job, token, config.json text, tp, dp, rank) walks the
DistributedOptimizer / ChainedOptimizer (or the non-distributed one) and
registers every shard under the names and ranges the optimizer reports.
rank = dp_idx * tp + tp_idx (daemon/layout/gen_megatron.c); for experts
with ep > 1 the expert grid numbers it the same way."""
_fsdp2.__doc__ = """One FSDP2 rank: Source.fsdp2(model, optimizer, socket, job, token,
config.json text, rank, world) registers its local DTensor shards and their
AdamW states (torch foreach or fused) under the model's parameter names,
which must be the HF names of config.json's model."""
ShardSource.megatron_core = classmethod(_megatron_core)
ShardSource.fsdp2 = classmethod(_fsdp2)
Source.megatron_core = ShardSource.megatron_core
Source.fsdp2 = ShardSource.fsdp2
ShardSource.hf = classmethod(_hf)
Source.hf = ShardSource.hf

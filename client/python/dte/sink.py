"""Inference side: receive versions from dted into an engine's own weights.

A Sink is one inference process's view of a job: per TP rank it hosts, it
registers that rank's BF16 weight tensors — one buffer per tensor, in the
engine's own layout (sglang:tp=N: fused qkv_proj and gate_up_proj,
row-parallel o_proj/down_proj, padded vocab) — and attaches them.  The
daemon stages each version in its own memory; the engine calls apply() at a
safe point (between decode steps, or with generation paused), which is
when its weights change, all at once, to exactly version v.

    sink = Sink.sglang(model, socket, job, token, model_config)
    v = sink.wait_staged()           # a version is ready
    ...pause or finish the current batch...
    sink.apply(v)                    # scatter + checksum verify, per rank

The stand-in (dte.sglang.Standin) serves the same from its own process:
install() adds the sink_* commands to its HANDLERS table, and StandinSink
drives them from the parent.
"""

import time

import torch

from . import _lib


class SinkError(RuntimeError):
    pass


# Dtypes an FP8 sink registers as 16-bit units (dte_layout_buffers).
_UNITS = tuple(d for d in (getattr(torch, "float8_e4m3fn", None), torch.float32, torch.uint8)
               if d is not None)


class Sink:
    """One inference process: its ranks attached to a job as sinks."""

    def __init__(self, socket, job, token, model_config, layout, coordinator="local",
                 replica=0, client=None, rederives=False):
        """rederives: this process rebuilds, after every apply, what its
        engine derives from the weights (MLA's W_UK/W_UV from kv_b_proj);
        the daemon refuses a sink of such a model that does not say so."""
        self.job, self.token, self.layout = job, token, layout
        self.model_config = model_config
        self.replica = replica
        self.rederives = rederives
        self.cli = client or _lib.Client(socket)
        self._own_cli = client is None
        # A sink may arrive first: creating the job (same parameters) is idempotent.
        self.cli.job_create(job, model_config, token, coordinator, 1)
        self.parts = []
        self.ranks = []
        self.last = []

    def expected(self, rank):
        return _lib.layout_buffers(self.model_config, self.layout, _lib.SINK, rank)

    def attach_host(self, rank, locs):
        """locs: {buffer name: (fd, offset, nbytes)} of BF16 tensors in memfds."""
        ids = []
        for _bid, length, name in self.expected(rank):
            if name not in locs:
                raise SinkError("sink: %s rank %d needs %r, which was not given" % (
                    self.layout, rank, name))
            fd, offset, nbytes = locs[name]
            if nbytes != 2 * length:
                raise SinkError("sink: %r holds %d bytes, the layout needs %d BF16 elements" % (
                    name, nbytes, length))
            ids.append(self.cli.register_fd(fd, offset, length, _lib.BF16, name))
        return self._attach(rank, ids)

    def attach_cuda(self, rank, tensors):
        """tensors: {buffer name: contiguous BF16 CUDA tensor}; an FP8 sink's
        float8_e4m3fn weights and FP32 weight_scale_inv (fp8=1 layouts) are
        taken as they are and registered as 16-bit units (the lengths
        expected() gives)."""
        from .source import register_cuda_tensor
        ids = []
        for _bid, length, name in self.expected(rank):
            t = tensors.get(name)
            if t is not None and t.dtype in _UNITS and t.is_contiguous() and t.dim() > 0 and \
                    t.numel() * t.element_size() == 2 * length:
                t = t.reshape(-1).view(torch.int16)     # the same memory, 16-bit units
            if t is None or t.dtype not in (torch.bfloat16, torch.int16) or t.numel() != length:
                raise SinkError("sink: %r must be a BF16 CUDA tensor of %d elements (an FP8 "
                                "sink's float8_e4m3fn or FP32 tensor: %d bytes)" % (
                                    name, length, 2 * length))
            ids.append(register_cuda_tensor(self.cli, t, _lib.BF16, name))
        return self._attach(rank, ids)

    def _attach(self, rank, ids):
        part = self.cli.attach(self.job, self.token, _lib.SINK, self.layout, rank, ids,
                               replica=self.replica, rederives=self.rederives)
        self.parts.append(part)
        self.ranks.append(rank)
        return part

    def wait_staged(self, timeout_ms=30000):
        """The newest version staged on every rank (DteError on timeout)."""
        return min(self.cli.wait_staged(self.job, p, timeout_ms) for p in self.parts)

    def _wait_for(self, part, version, deadline):
        why = ""
        while True:
            left = int((deadline - time.monotonic()) * 1000)
            if left <= 0:
                # The daemon's own words when it knows why (the
                # coordinator here could not plan: "; no plan: ...").
                raise _lib.DteError(_lib.ERR_TIMEOUT, "sink: version %d not staged in time%s"
                                    % (version, " (%s)" % why if why else ""))
            applied, staged = self.cli.query_version(self.job, part)
            if applied >= version or staged >= version:
                return
            try:
                self.cli.wait_staged(self.job, part, min(left, 1000))
            except _lib.DteError as e:
                if e.code != _lib.ERR_TIMEOUT:
                    raise
                why = e.msg[e.msg.index("no plan:"):] if "no plan:" in e.msg else why
            # An older version staged wakes us up without the one we want.
            time.sleep(0.002)

    def stage(self, version, timeout_ms=30000):
        """Wait until `version` (or a newer one) is staged, or applied, on
        every rank, writing nothing: the first phase of an apply that must
        happen on every worker of an engine or on none
        (dte.integrations)."""
        deadline = time.monotonic() + timeout_ms / 1000.0
        for p in self.parts:
            self._wait_for(p, version, deadline)

    def apply(self, version, timeout_ms=30000):
        """Wait until `version` is staged on every rank, then apply it
        everywhere.  A checksum failure is reported by the daemon, which
        repairs densely at the next version; it raises here so an engine
        never serves it silently."""
        deadline = time.monotonic() + timeout_ms / 1000.0
        for p in self.parts:
            self._wait_for(p, version, deadline)
        self.last = [self.cli.apply(self.job, p, version) for p in self.parts]
        bad = [r for r, info in zip(self.ranks, self.last) if not info["checksum_ok"]]
        if bad:
            raise SinkError("sink: version %d failed its checksum on rank(s) %s" % (version, bad))
        return self.last

    def sync(self, timeout_ms=30000):
        """Apply the newest version staged on every rank; returns it."""
        v = self.wait_staged(timeout_ms)
        self.apply(v, timeout_ms)
        return v

    def version(self):
        """The version every rank holds (the lowest applied)."""
        return min(self.cli.query_version(self.job, p)[0] for p in self.parts)

    def close(self):
        if self._own_cli and self.cli is not None:
            self.cli.close()
        self.cli = None
        self.parts = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @classmethod
    def sglang(cls, model, socket, job, token, model_config, coordinator="local", replica=0):
        """Every rank of a dte.sglang.SGLangModel (its BF16 arenas)."""
        sink = cls(socket, job, token, model_config, "sglang:tp=%d" % model.tp, coordinator,
                   replica)
        try:
            for r in range(model.tp):
                locs = {loc.name: (loc.fd, loc.offset, loc.nbytes)
                        for loc in model.arenas[r].locs()}
                sink.attach_host(r, locs)
        except Exception:
            sink.close()
            raise
        return sink


# ---- the stand-in's commands ------------------------------------------------------
#
# They run inside the stand-in process, between any two other commands (its
# safe point: no forward is in flight).  The Sink hangs off the model.

def _cmd_attach(model, socket, job, token, model_config, coordinator="local", replica=0):
    if getattr(model, "dte_sink", None) is not None:
        raise SinkError("sink: this stand-in is already attached")
    model.dte_sink = Sink.sglang(model, socket, job, token, model_config, coordinator, replica)
    return list(model.dte_sink.parts)


def _sink_of(model):
    s = getattr(model, "dte_sink", None)
    if s is None:
        raise SinkError("sink: the stand-in is not attached (send sink_attach first)")
    return s


def _cmd_apply(model, version, timeout_ms=30000):
    t0 = time.perf_counter()
    infos = _sink_of(model).apply(version, timeout_ms)
    return {"version": version, "ms": (time.perf_counter() - t0) * 1e3, "ranks": infos}


def _cmd_sync(model, timeout_ms=30000):
    return _sink_of(model).sync(timeout_ms)


def _cmd_version(model):
    return _sink_of(model).version()


def _cmd_detach(model):
    s = getattr(model, "dte_sink", None)
    if s is not None:
        s.close()
        model.dte_sink = None


def install(handlers):
    """Add the sink commands to a stand-in's HANDLERS table."""
    handlers.update({"sink_attach": _cmd_attach, "sink_apply": _cmd_apply,
                     "sink_sync": _cmd_sync, "sink_version": _cmd_version,
                     "sink_detach": _cmd_detach})


def close_model(model):
    """Stand-in shutdown: leave the job before the arenas go."""
    _cmd_detach(model)


class StandinSink:
    """Parent-side handle on a stand-in's sink: the stand-in process itself
    talks to its daemon; the parent only says when to apply."""

    def __init__(self, standin, socket, job, token, model_config, coordinator="local",
                 replica=0):
        self.standin = standin
        self.parts = standin.call("sink_attach", socket, job, token, model_config, coordinator,
                                  replica)

    def apply(self, version, timeout_ms=30000):
        return self.standin.call("sink_apply", version, timeout_ms)

    def sync(self, timeout_ms=30000):
        return self.standin.call("sink_sync", timeout_ms)

    def version(self):
        return self.standin.call("sink_version")

    def detach(self):
        self.standin.call("sink_detach")

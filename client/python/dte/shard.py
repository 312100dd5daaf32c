"""What a trainer's optimizer holds, as dted reads it.

A Shard is one range of one parameter's flattened elements with the three
FP32 tensors the optimizer updates for it; move_to_arena puts host tensors
into a memfd arena the daemon can map; SourceError is what both raise on
memory dted cannot read; adamw_state creates the state torch AdamW would
on its first step, so it can be registered before that step.  dte.source
(the Source classes) and dte.trainers (the walks over real optimizers)
both build on these, so neither needs the other's module to describe a
shard.
"""

import torch

from .shm import Arena


class SourceError(RuntimeError):
    pass


class Shard:
    """One shard the optimizer holds.

    name, shape: the trainer-side parameter (TP-local shape); [lo, hi): the
    range of its row-major flattened elements held; theta, exp_avg,
    exp_avg_sq: 1-D FP32 tensors of hi - lo elements (the very memory the
    optimizer updates); opt: the torch optimizer that steps it; key: the
    tensor that optimizer steps (its param_groups entry: grad and state
    are looked up on it).  opt None: a tensor the engines hold in FP32
    that no optimizer steps (dte._lib.fp32_tensors; an HF buffer such as
    e_score_correction_bias): sent whole every version, moments unread."""

    __slots__ = ("name", "shape", "lo", "hi", "theta", "exp_avg", "exp_avg_sq", "opt", "key")

    def __init__(self, name, shape, lo, hi, theta, exp_avg, exp_avg_sq, opt, key):
        self.name, self.shape = name, tuple(int(s) for s in shape)
        self.lo, self.hi = int(lo), int(hi)
        self.theta, self.exp_avg, self.exp_avg_sq = theta, exp_avg, exp_avg_sq
        self.opt, self.key = opt, key
        n = self.hi - self.lo
        for kind in ("theta", "exp_avg", "exp_avg_sq"):
            t = getattr(self, kind)
            if t is None or t.dtype != torch.float32 or t.numel() != n or not t.is_contiguous():
                raise SourceError("source: %s [%d, %d) %s must be a contiguous FP32 tensor of %d "
                                  "elements, not %s" % (name, lo, hi, kind, n, None if t is None
                                                        else "%s %s" % (t.dtype, tuple(t.shape))))


def move_to_arena(label, tensors):
    """Puts CPU tensors into one memfd arena, values kept, and rebinds each
    tensor object to its arena memory (t.data = ...), so every holder of
    the object (optimizer state, param groups) now updates shared memory.
    tensors: [(key, tensor)].  Returns the Arena."""
    specs = [(str(i), tuple(t.shape), torch.float32) for i, (_k, t) in enumerate(tensors)]
    arena = Arena(label, specs)
    for i, (_k, t) in enumerate(tensors):
        if t.dtype != torch.float32 or t.is_cuda:
            arena.close()
            raise SourceError("source: %s is %s on %s; the host path takes FP32 CPU tensors"
                              % (_k, t.dtype, t.device))
        view = arena.tensor(str(i))
        view.copy_(t.detach())
        t.data = view
    return arena


def adamw_state(opt, group, p):
    """The state dict torch Adam/AdamW keeps for p (opt.state[p]).  When it
    has none yet it is created as the optimizer's first step would create
    it (torch/optim/adam.py _init_group: a 0 step, zero moments; the step a
    0-d tensor on p's device for fused / capturable), so its moments exist
    before that step and can be registered; an existing state is kept."""
    st = opt.state.setdefault(p, {})
    if "step" not in st:
        fused = bool(group.get("fused")) or bool(group.get("capturable"))
        st["step"] = (torch.zeros((), dtype=torch.float32, device=p.device) if fused
                      else torch.tensor(0.0, dtype=torch.float32))
        st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    return st

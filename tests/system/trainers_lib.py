"""Shared by the real-trainer tests (trainers_fsdp2.py, trainers_mcore.py):
an SGLang-layout sink in BF16 memfd arenas, and the exactness check of its
contents against RNE(θ) converted by tests/system/layout_reference.py's
plain-torch HF -> SGLang converter (independent of dted's layout code)."""

import importlib.util
import json
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def layout_reference():
    spec = importlib.util.spec_from_file_location("layout_reference",
                                                  os.path.join(HERE, "layout_reference.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class SglangSinkArenas:
    """One BF16 memfd arena per sink rank, each runtime tensor where the
    layout (libdte dte_layout_tensors) places it."""

    def __init__(self, cfg_text, tp, ep=1, label="sink"):
        from dte import _lib
        from dte.shm import Arena
        self.layout = "sglang:tp=%d%s" % (tp, ",ep=%d" % ep if ep > 1 else "")
        self.tp = tp
        self.arenas, self.locs = [], []
        for r in range(tp):
            places = _lib.layout_tensors(cfg_text, self.layout, _lib.SINK, r)
            bufs = {b: (n, name) for b, n, name in
                    _lib.layout_buffers(cfg_text, self.layout, _lib.SINK, r)}
            specs = [(p.name, p.shape, torch.bfloat16) for p in places]
            a = Arena("%s-%d" % (label, r), specs)
            locs = {}
            for p in places:
                n, bname = bufs[p.buffer]
                loc = a.loc(p.name)
                if p.offset != 0 or loc.nbytes != 2 * n:
                    raise AssertionError("sink buffer %s is not one whole tensor" % bname)
                locs[bname] = (loc.fd, loc.offset, loc.nbytes)
            self.arenas.append(a)
            self.locs.append(locs)

    def attach(self, sink):
        for r in range(self.tp):
            sink.attach_host(r, self.locs[r])

    def close(self):
        for a in self.arenas:
            try:
                a.close()
            except BufferError:
                pass


def sink_mismatches(ref, cfg, arenas, hf_fp32, tp, ep=1):
    """Every sink element the reference converter places must equal
    RNE(θ) of its canonical element, bit for bit; padding stays 0.
    Returns (mismatching elements, elements checked)."""
    want_hf = {n: t.to(torch.bfloat16).to(torch.float64) for n, t in hf_fp32.items()}
    want = ref.sglang_sink(cfg, want_hf, tp, ep)
    bad = total = 0
    for r in range(tp):
        for name, w in want[r]:
            got = arenas.arenas[r].tensor(name).to(torch.float64)
            if tuple(got.shape) != tuple(w.shape):
                raise AssertionError("%s rank %d: sink %s, reference %s" % (
                    name, r, tuple(got.shape), tuple(w.shape)))
            unset = w == ref.UNSET
            w = torch.where(unset, torch.zeros_like(w), w)
            d = got != w
            bad += int(d.sum())
            total += int((~unset).sum())
    return bad, total


def load_cfg(path, **shrink):
    with open(path) as f:
        cfg = json.load(f)
    cfg.update(shrink)
    return cfg

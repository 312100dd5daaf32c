"""Publish interval K > 1 through a real dted, on the AdamW fixtures of
adamw_fixtures.py (shared by tests/system/sync_k4.py and
tests/bench/bench_k4.py).

One dted, one source (fsdp:dp=1: θ, m, v of every tensor in memfds) and
one sink (sglang:tp=1, BF16 memfds), a Qwen3-shaped model whose tied
embedding holds most of its elements.  Every tensor gets the fixtures'
weights (N(0, 0.02), 1 % zeros, 1 % tiny) and, per step, a fresh window of
their heavy-tailed gradient pool; the optimizer is torch.optim.AdamW
(single-tensor or foreach) or the FusedAdam forward of adamw_fixtures.Fused,
as in adamw_fixtures.run_config.  The trainer publishes every K-th step and
marks the steps in between (DESIGN §2.6).

After each version the sink must hold RNE(θ_t) exactly (every element,
converted independently by dte.sglang.hf_to_sglang).  Elements sent whose
BF16 did not change since the version before (in the sink's element space)
are the false positives: sent - truly changed, where sent is the publish's
own count; a sent count below the changes, or a sink that differs, fails.

`run(...)` returns per configuration: versions, sparse versions, elements,
changed, sent, false positives, and the daemon's side-table figures
(dted_mark_table_* metrics).
"""

import gc
import json
import os
import sys
import tempfile
import time

import harness  # sets ROOT and B, puts client/python on sys.path

import numpy as np  # noqa: E402
import torch  # noqa: E402

from dte import _lib, qwen3, sglang  # noqa: E402
from dte.shm import Arena  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import adamw_fixtures as fx  # noqa: E402

JOB, TOKEN = "k4", "s3cret"
SRC_LAYOUT, SINK_LAYOUT = "fsdp:dp=1", "sglang:tp=1"


def model_config(vocab, hidden):
    """A Qwen3 whose tied embedding (vocab x hidden) dominates."""
    return qwen3.make_config(None, hidden_size=hidden, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=1, num_key_value_heads=1, head_dim=64,
                             vocab_size=vocab, tie_word_embeddings=True)


def all_configs():
    """Every configuration adamw_fixtures.py runs: flavour x lr x wd."""
    return [(f, lr, wd) for f in ("torch-single", "torch-foreach", "fused")
            for lr in fx.LRS for wd in fx.WDS]


class HF:
    """The source's θ by HF name, as harness.expected_sglang wants it."""

    def __init__(self, arenas, names):
        self.arenas, self.names = arenas, names

    def to_hf(self):
        return {n: self.arenas["param"].tensor(n) for n in self.names}


def metric(sock, name):
    r = harness.dtectl(sock, "--json", "metrics")
    if r.returncode:
        raise RuntimeError("dtectl metrics: %s" % r.stderr.strip())
    out = {}
    for s in json.loads(r.stdout)["samples"]:
        if s["name"] == name:
            out[s["labels"].get("outcome", "")] = s["value"]
    return out


def Daemon(cap, label, hook=None):
    """One dted (the fixture, harness.Daemon) in a directory of its own with
    [daemon] mark_table_size = cap (None: the default); hook: DTE_TEST_HOOK,
    run by the test build."""
    return harness.Daemon(tempfile.mkdtemp(prefix="dte-k4-"), label, mark_table_size=cap,
                          hook=hook).start()


def run_config(d, flavour, lr, wd, seed, cfg, k, steps, job, fault_version=0):
    """One configuration on daemon d (a job of its own): the per-version
    figures; raises AssertionError on a missed change or an inexact sink."""
    shapes = qwen3.hf_tensor_shapes(cfg)
    specs = [(n, tuple(s), torch.float32) for n, s in shapes.items()]
    arenas = {kd: Arena("k4-%s" % kd, specs) for kd in ("param", "exp_avg", "exp_avg_sq")}
    sink_model = sglang.SGLangModel(cfg, tp=1, label="k4-sink", placement=SINK_LAYOUT)
    ok = False
    try:
        rows = _train(d, flavour, lr, wd, seed, cfg, k, steps, job, arenas, sink_model,
                      list(shapes), fault_version)
        ok = True
        return rows
    finally:
        gc.collect()
        for a in [sink_model.arenas[0]] + list(arenas.values()):
            try:
                a.close()
            except BufferError:
                if ok:
                    raise


def _train(d, flavour, lr, wd, seed, cfg, k, steps, job, arenas, sink_model, names,
           fault_version):
    cfg_text = json.dumps(cfg)
    rng = np.random.default_rng(seed)
    for n in names:
        t = arenas["param"].tensor(n)
        w = rng.standard_normal(t.numel(), dtype=np.float32) * np.float32(0.02)
        w[rng.random(t.numel(), dtype=np.float32) < 0.01] = 0.0
        w[rng.random(t.numel(), dtype=np.float32) < 0.01] *= np.float32(1e-4)
        t.view(-1).copy_(torch.from_numpy(w))
        arenas["exp_avg"].tensor(n).zero_()
        arenas["exp_avg_sq"].tensor(n).zero_()
    params = [arenas["param"].tensor(n) for n in names]
    if flavour == "fused":
        opts = []
        for n, p in zip(names, params):
            o = fx.Fused(p, lr, wd)
            o.m, o.v = arenas["exp_avg"].tensor(n), arenas["exp_avg_sq"].tensor(n)
            opts.append(o)
    else:
        ps = [torch.nn.Parameter(p) for p in params]
        opt = torch.optim.AdamW(ps, lr=lr, betas=fx.BETAS, eps=fx.EPS, weight_decay=wd,
                                foreach=(flavour == "torch-foreach"))
        # The moments live in the memfds: AdamW only creates empty state and
        # updates existing moments in place (megatron.Trainer does the same).
        for n, p in zip(names, ps):
            opt.state[p] = {"step": torch.tensor(0.0),
                            "exp_avg": arenas["exp_avg"].tensor(n),
                            "exp_avg_sq": arenas["exp_avg_sq"].tensor(n)}

    cli = _lib.Client(d.sock)
    cli.job_create(job, cfg_text, TOKEN, "local", k)
    ids = []
    for _bid, length, bname in _lib.layout_buffers(cfg_text, SRC_LAYOUT, _lib.SOURCE, 0):
        base, _, kind = bname.partition(" ")
        loc = arenas[kind or "param"].loc(base)
        ids.append(cli.register_fd(loc.fd, loc.offset, length, _lib.FP32, bname))
    src = cli.attach(job, TOKEN, _lib.SOURCE, SRC_LAYOUT, 0, ids)
    scli = _lib.Client(d.sock)
    sids = []
    for _bid, length, name in _lib.layout_buffers(cfg_text, SINK_LAYOUT, _lib.SINK, 0):
        loc = sink_model.arenas[0].loc(name)
        sids.append(scli.register_fd(loc.fd, loc.offset, length, _lib.BF16, name))
    sink = scli.attach(job, TOKEN, _lib.SINK, SINK_LAYOUT, 0, sids)
    hf = HF(arenas, names)
    groups = [{"lr": lr, "beta1": fx.BETAS[0], "beta2": fx.BETAS[1], "eps": fx.EPS,
               "weight_decay": wd, "variant": "fused" if flavour == "fused" else "torch"}] * 2
    prev = None
    rows = []
    mark_s = 0.0
    for t in range(1, steps + 1):
        for i, p in enumerate(params):
            off = int(rng.integers(0, fx.POOL - p.numel()))
            g = fx.GRADS[off:off + p.numel()] * np.float32(rng.uniform(0.5, 2.0))
            g = torch.from_numpy(g).view(p.shape)
            if flavour == "fused":
                opts[i].step(g)
            else:
                ps[i].grad = g
        if flavour != "fused":
            opt.step()
        if t % k:
            t0 = time.perf_counter()
            cli.mark(job, src, t, groups)
            mark_s += time.perf_counter() - t0
            continue
        v = t // k
        t0 = time.perf_counter()
        info = cli.publish(job, src, v, t, groups)
        publish_s = time.perf_counter() - t0
        got = scli.wait_staged(job, sink, 60000)
        rep = scli.apply(job, sink, got)
        want = harness.expected_sglang(hf, cfg, 1)[0]
        bad = harness.mismatches(want, sink_model.weights(0))
        row = {"version": v, "dense": info["dense"], "elements": info["elements"],
               "sent": info["changed"], "checksum_ok": rep["checksum_ok"], "differs": bad,
               "mark_s": mark_s, "publish_s": publish_s}
        mark_s = 0.0
        if prev is not None:
            row["changed"] = sum(int((want[n].view(torch.int16) !=
                                      prev[n].view(torch.int16)).sum()) for n in want)
        if v == fault_version:
            # A change withheld on purpose (test build, wrong-drop): the
            # caller checks what the sink made of it.
            try:
                cli.wait(job, v, 30000)
                row["wait_failed"] = False
            except _lib.DteError:
                row["wait_failed"] = True
        else:
            assert got == v and rep["checksum_ok"] and not bad, \
                "version %d: staged %d, checksum_ok %s, differs: %s" % (
                    v, got, rep["checksum_ok"], ", ".join(bad[:4]))
            cli.wait(job, v, 30000)
            assert "changed" not in row or row["sent"] >= row["changed"], \
                "version %d: %d sent, %d changed" % (v, row["sent"], row["changed"])
        prev = {n: x.clone() for n, x in want.items()}
        del want
        rows.append(row)
    scli.close()
    cli.close()
    return rows


def summarize(rows):
    sp = [r for r in rows if r["dense"] == 0 and "changed" in r and r["checksum_ok"]]
    el = sum(r["elements"] for r in sp)
    fp = sum(r["sent"] - r["changed"] for r in sp)
    return {"versions": len(rows), "sparse": len(sp), "elements": el,
            "mark_s": sum(r["mark_s"] for r in sp), "publish_s": sum(r["publish_s"] for r in sp),
            "changed": sum(r["changed"] for r in sp), "sent": sum(r["sent"] for r in sp),
            "fp": fp, "fp_rate": fp / el if el else float("nan"),
            "max_version_fp_rate": max(((r["sent"] - r["changed"]) / r["elements"] for r in sp),
                                       default=float("nan"))}


def run(configs, cap, vocab, hidden, k=4, steps=20, log=print, label="k4", hook=None,
        fault_version=0, rows_out=None, seed=1):
    """Every configuration on one dted with mark_table_size = cap (None:
    the default; hook: DTE_TEST_HOOK for the test build); returns
    ({config: summary}, side-table metrics, model elements).  rows_out
    (a dict) gets every configuration's per-version rows.  Configuration i
    draws its weights and gradients from seed + i."""
    if fx.GRADS is None:
        fx.GRADS = fx.grad_pool()
    cfg = model_config(vocab, hidden)
    elements = sum(int(np.prod(s)) for s in qwen3.hf_tensor_shapes(cfg).values())
    d = Daemon(cap, label, hook)
    out = {}
    try:
        for i, (flavour, lr, wd) in enumerate(configs):
            rows = run_config(d, flavour, lr, wd, seed + i, cfg, k, steps, "%s-%d" % (JOB, i),
                              fault_version)
            if rows_out is not None:
                rows_out[(flavour, lr, wd)] = rows
            out[(flavour, lr, wd)] = s = summarize(rows)
            log("k4-config: table=%s %s lr=%g wd=%g versions=%d sparse=%d changed=%d sent=%d "
                "fp_rate=%.6f" % ("off" if cap == 0 else "on", flavour, lr, wd, s["versions"],
                                  s["sparse"], s["changed"], s["sent"], s["fp_rate"]))
        m = metric(d.sock, "dted_mark_table_elements_total")
        m["peak_bytes"] = metric(d.sock, "dted_mark_table_peak_bytes").get("", 0.0)
        m["bytes_now"] = metric(d.sock, "dted_mark_table_bytes").get("", 0.0)
    finally:
        rc = d.stop()
    if rc != 0:
        raise RuntimeError("dted exited with %s:\n%s" % (rc, d.log_tail(30)))
    return out, m, elements

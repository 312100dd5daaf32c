#!/usr/bin/python3
"""Soak: many versions through two real daemons, daemon memory must not grow.

A tiny Qwen3 (Megatron TP=2 trainer with real AdamW in this process) on
daemon "src" (also the coordinator), one SGLang TP=2 sink replica on daemon
"sink" over UCX.  Every apply must pass its checksum; every 50th version and
the last are compared element by element with RNE(θ).  The resident set of
both daemons is read from /proc once the bounded per-version structures are
full, and at the end.  The last to fill is the job's history ring
(JOB_HISTORY versions, read from daemon/job_state.h: a fixed array in
struct job whose pages are first touched as it fills, ~400 B a version),
so the window starts a tenth of the run after the ring is full; its size
is checked against `dtectl history` at the end.  Measured from v100
instead, the ring filling alone read as 1.2 % growth.  What the window
still shows is printed in bytes per version, with the growth while the
ring filled for contrast.

  soak.py [--versions N]      (N >= JOB_HISTORY + N/10 + 100)
Final line: `soak: versions=N rss_growth_pct=X rss_growth_b_per_version=Y`
(the larger daemon's growth over the window).  Fails at X >= 1, or at
Y > PER_VERSION_LIMIT: 1 % of ~14 MB over the window of a 1000-version
run is ~360 B a version, and a leak of 200 B a version planted in
hist_get read as 0.55 % but 211 B/version.

  soak.py --valgrind [--versions N]      (make valgrind)
Both daemons run under valgrind --leak-check=full --error-exitcode=1
(suppressions: tests/faults/valgrind.supp) through start, N versions and a
SIGTERM stop; either one exiting non-zero fails.  Final line:
`valgrind: daemons=2 versions=N errors=E`.
"""

import argparse
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import faults_lib  # noqa: E402,F401  (sys.path and B)
import cluster_sync_lib as csl  # noqa: E402

csl.asan_reexec([sys.executable] + sys.argv)

import torch  # noqa: E402

import sync_local as sl  # noqa: E402
from dte import _lib, megatron, qwen3, sglang, toy  # noqa: E402

# Smaller than sync_local's model: the soak is about many versions.
sl.CFG = qwen3.make_config(None, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                           vocab_size=256)
sl.CFG_TEXT = json.dumps(sl.CFG)


PER_VERSION_LIMIT = 128   # B/version; seen: 0-21 (one 4 KiB page is 10.6 at 1000 versions)


def history_bound():
    """JOB_HISTORY: the versions a job's history ring keeps (daemon/job_state.h)."""
    with open(os.path.join(faults_lib.ROOT, "daemon", "job_state.h")) as f:
        m = re.search(r"^#define\s+JOB_HISTORY\s+(\d+)", f.read(), re.M)
    if not m:
        raise RuntimeError("JOB_HISTORY not found in daemon/job_state.h")
    return int(m.group(1))


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--versions", type=int, default=1000)
    ap.add_argument("--valgrind", action="store_true")
    args = ap.parse_args()
    n = args.versions
    bound = history_bound()
    # The window: from a tenth of the run after the history ring is full
    # (every bounded structure is then at its size) to the end.
    warm = bound + max(n // 10, 1)
    if not args.valgrind and n < warm + 100:
        print("soak: --versions %d leaves no window: the history ring (JOB_HISTORY=%d) is "
              "full at v%d, the window starts at v%d and needs 100 versions" % (
                  n, bound, bound, warm))
        sys.exit(2)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    work = csl.Workdir("dte-soak-")
    wrap = []
    if args.valgrind:
        wrap = ["valgrind", "-q", "--leak-check=full", "--error-exitcode=1",
                "--suppressions=%s" % os.path.join(HERE, "valgrind.supp"),
                "--log-file=%s/vg.%%p.log" % work.path]
    src = csl.Daemon(work.path, "src", log_level="notice", wrap=wrap)
    sink = csl.Daemon(work.path, "sink", log_level="notice", wrap=wrap)
    fails = []
    rss0 = rss1 = rss_early = None
    early = min(max(n // 10, 1), bound)
    v = checked = 0
    t0 = time.time()
    try:
        src.start(timeout=120 if args.valgrind else 20)
        sink.start(timeout=120 if args.valgrind else 20)
        megatron.shard_shapes = getattr(sl, "flat_order_shapes", None) or \
            megatron.flat_buffer_shapes
        model = megatron.MegatronModel(sl.CFG, tp=sl.TP, seed=0, label="soak-src")
        trainer = megatron.Trainer(model, lr=sl.LR, warmup=sl.WARMUP)
        task = toy.ToyTask(sl.CFG["vocab_size"])
        tcli = _lib.Client(src.sock)
        tcli.job_create(sl.JOB, sl.CFG_TEXT, sl.TOKEN, "local", 1)
        parts = []
        for r in range(sl.TP):
            want = _lib.layout_buffers(sl.CFG_TEXT, sl.SRC_LAYOUT, _lib.SOURCE, r)
            ids = [tcli.register_fd(model.arenas[r][k].fd, 0, length, _lib.FP32, k)
                   for (_b, length, _n), k in zip(want, ("param", "exp_avg", "exp_avg_sq"))]
            parts.append(tcli.attach(sl.JOB, sl.TOKEN, _lib.SOURCE, sl.SRC_LAYOUT, r, ids))
        rep = sglang.SGLangModel(sl.CFG, tp=sl.TP, label="soak-sink")
        scli = _lib.Client(sink.sock)
        scli.job_create(sl.JOB, sl.CFG_TEXT, sl.TOKEN, src.address, 1)
        sparts = [sl.attach_sink(scli, rep.arenas[r], r, 0) for r in range(sl.TP)]
        for v in range(1, n + 1):
            rec = trainer.step(*task.batch_at(v))
            for p in parts:
                tcli.publish(sl.JOB, p, v, rec["step"], sl.groups_of(rec))
            for p in sparts:
                got = scli.wait_staged(sl.JOB, p, 20000)
                res = scli.apply(sl.JOB, p, got)
                if not res["checksum_ok"] or got != v:
                    fails.append("v%d: staged %d checksum_ok=%s" % (v, got, res["checksum_ok"]))
            tcli.wait(sl.JOB, v, 20000)
            if v % 50 == 0 or v == n:
                want = sl.expected(model)
                for r in range(sl.TP):
                    bad = sl.exact(want[r], rep.weights(r))
                    if bad:
                        fails.append("v%d rank %d differs: %s" % (v, r, bad[:3]))
                checked += 1
            if v == early:
                rss_early = (rss_kb(src.proc.pid), rss_kb(sink.proc.pid))
            if v == warm:
                rss0 = (rss_kb(src.proc.pid), rss_kb(sink.proc.pid))
            if len(fails) > 5:
                break
        rss1 = (rss_kb(src.proc.pid), rss_kb(sink.proc.pid))
        hist = src.ctl_json("history", sl.JOB) or {}
        modes = [x.get("mode") for x in hist.get("versions", [])]
        print("soak: history keeps %d versions (%d sparse)" % (len(modes), modes.count("sparse")))
        # The ring's size is what the window's start was computed from
        # (asked only now: building that answer grows the heap once, and
        # the free memory it leaves would hide a leak in the window).
        if v == n and len(modes) != bound:
            fails.append("the history keeps %d versions, not JOB_HISTORY=%d from "
                         "daemon/job_state.h: the window did not start at a full ring" % (
                             len(modes), bound))
        scli.close()
        tcli.close()
        trainer.close()
    finally:
        rcs = [src.stop(timeout=120), sink.stop(timeout=120)]
        if any(rcs):
            fails.append("daemons exited %s" % rcs)
        for d in (src, sink):
            fails += ["sanitizer report in %s's log: %s" % (d.name, x)
                      for x in faults_lib.sanitizer_lines(d.log_text())[:3]]
        if args.valgrind:
            for name in sorted(os.listdir(work.path)):
                if name.startswith("vg.") and os.path.getsize(os.path.join(work.path, name)):
                    with open(os.path.join(work.path, name)) as f:
                        print("--- %s ---\n%s" % (name, f.read()[-6000:]))
        if fails:
            print(src.log_tail(10))
            print(sink.log_tail(10))
        work.close(keep=bool(fails))
    growth = 0.0
    per_version = 0.0
    if rss0 and rss1:
        growth = max(100.0 * (b - a) / a for a, b in zip(rss0, rss1))
        per_version = max(1024.0 * (b - a) / max(v - warm, 1) for a, b in zip(rss0, rss1))
        if per_version > PER_VERSION_LIMIT:
            fails.append("a daemon grew %.1f B/version after the history ring was full "
                         "(limit %d)" % (per_version, PER_VERSION_LIMIT))
        print("soak: rss_kb src %d -> %d, sink %d -> %d (window v%d..v%d, after the "
              "%d-version history ring filled)" % (rss0[0], rss1[0], rss0[1], rss1[1], warm, v,
                                                  bound))
        span = max(v - warm, 1)
        print("soak: what remains in the window: src %+.1f B/version, sink %+.1f B/version "
              "(%d versions; one 4 KiB page is %.1f B/version)" % (
                  1024.0 * (rss1[0] - rss0[0]) / span, 1024.0 * (rss1[1] - rss0[1]) / span,
                  span, 4096.0 / span))
        if rss_early:
            fill = max(warm - early, 1)
            print("soak: while the ring filled (v%d..v%d): src %+.1f B/version, sink %+.1f "
                  "B/version" % (early, warm, 1024.0 * (rss0[0] - rss_early[0]) / fill,
                                 1024.0 * (rss0[1] - rss_early[1]) / fill))
    for f in fails[:6]:
        print("FAIL: " + f)
    if args.valgrind:
        print("valgrind: daemons=2 versions=%d errors=%d" % (v, sum(1 for r in rcs if r)))
        sys.exit(0 if not fails and v == n else 1)
    print("soak: %.1f s, %.1f ms/version, %d exact checks" % (
        time.time() - t0, 1000 * (time.time() - t0) / max(v, 1), checked))
    print("soak: versions=%d rss_growth_pct=%.2f rss_growth_b_per_version=%.1f" % (
        v, growth, per_version), flush=True)
    sys.exit(0 if not fails and rss0 and growth < 1.0 and v == n else 1)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""`make bench-plan` (also a step of `make bench`): `dtectl plan` at real size.

Plans Qwen3-235B-A22B (tests/data/layout/models or $DTE_MODELS) for two layouts,
each as a fresh `dte-plan` process, BENCH_PLAN_RUNS times (default 3), and
prints one line per layout:
    bench plan model=qwen3-235b layout=fsdp64 s=S mb=M wall_s=W entries=N
    bench plan model=qwen3-235b layout=megatron-tp8-dp32-ep32 s=S mb=M wall_s=W entries=N
s: the fewest CPU seconds (user + sys) of the runs, mb: the largest maximum
resident set (MiB), wall_s: the shortest wall time (the machine may be
shared: CPU time is the figure).  BENCH_PLAN_BASE=PATH times another
dte-plan binary (an older build) in the same rounds, alternating, and adds
its lines with `build=base` and whether both printed the same.  Issue 34's
goal for fsdp64: s <= 1, mb <= 512.
"""

import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
B = os.environ.get("B", "build")
if not os.path.isabs(B):
    B = os.path.join(ROOT, B)
MODELS = os.environ.get("DTE_MODELS", os.path.join(ROOT, "tests", "data", "layout", "models"))
MODEL = "qwen3-235b-a22b.json"
LAYOUTS = [
    ("fsdp64", "fsdp:dp=64", "sglang:tp=8"),
    ("megatron-tp8-dp32-ep32", "megatron:tp=8,dp=32,ep=32", "sglang:tp=8,ep=8"),
]


def once(binary, model, src, sink):
    """(cpu_s, max_rss_mib, wall_s, stdout) of one plan."""
    with tempfile.TemporaryFile() as out:
        t0 = time.monotonic()
        p = subprocess.Popen([binary, "--model", model, "--source", src, "--sink", sink],
                             stdout=out, stderr=subprocess.PIPE)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.monotonic() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        err = p.stderr.read().decode()
        p.stderr.close()
        if p.returncode:
            raise RuntimeError("%s %s -> %s failed: %s" % (binary, src, sink, err.strip()))
        out.seek(0)
        text = out.read().decode()
    return ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024.0, wall, text


def entries(text):
    for line in text.splitlines():
        if line.startswith("entries: "):
            return int(line.split()[1])
    return -1


def run(log=print, runs=None):
    """{"model": path, "runs": n, "rows": [{"layout", "build", "s", "mb", "wall_s",
    "entries", "same"}]} or {"skipped": why}."""
    model = os.path.join(MODELS, MODEL)
    if not os.path.exists(model):
        return {"skipped": "no %s in %s (DTE_MODELS)" % (MODEL, MODELS)}
    runs = runs or int(os.environ.get("BENCH_PLAN_RUNS", "3"))
    builds = [("new", os.path.join(B, "bin", "dte-plan"))]
    if os.environ.get("BENCH_PLAN_BASE"):
        builds.append(("base", os.environ["BENCH_PLAN_BASE"]))
    rows = []
    for name, src, sink in LAYOUTS:
        got = {b: [] for b, _ in builds}
        texts = {}
        for _ in range(runs):
            for b, binary in builds:
                cpu, mb, wall, text = once(binary, model, src, sink)
                got[b].append((cpu, mb, wall))
                texts[b] = text
        for b, _ in builds:
            rows.append({"layout": name, "source": src, "sink": sink, "build": b,
                         "s": min(x[0] for x in got[b]), "mb": max(x[1] for x in got[b]),
                         "wall_s": min(x[2] for x in got[b]), "entries": entries(texts[b]),
                         "same": texts[b] == texts["new"]})
            log(line(rows[-1]))
    return {"model": model, "runs": runs, "rows": rows}


def line(r):
    s = "bench plan model=qwen3-235b layout=%s s=%.2f mb=%.0f wall_s=%.2f entries=%d" % (
        r["layout"], r["s"], r["mb"], r["wall_s"], r["entries"])
    if r["build"] != "new":
        s += " build=%s same_output=%s" % (r["build"], "yes" if r["same"] else "NO")
    return s


def lines(res):
    if "skipped" in res:
        return ["bench plan skipped (%s)" % res["skipped"]]
    return [line(r) for r in res["rows"]]


def main():
    res = run(log=lambda s: None)
    for s in lines(res):
        print(s, flush=True)
    if "skipped" in res:
        return 0
    bad = [r for r in res["rows"] if not r["same"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

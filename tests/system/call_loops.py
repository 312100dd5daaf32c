#!/usr/bin/python3
"""No two files of the daemon call each other, directly or around a loop.

Read from the built objects' symbol tables (nm), like engine_layers.sh:
file A calls file B when A's object uses a global symbol that B's object
defines.  Every source file daemon/**/*.c must have its object under
$B/obj (a file not read could hide a loop).  A loop of calls (a strongly
connected set of two files or more) fails, naming the files and the
symbols each takes from the next.  The engine's finer rule (a file calls
only the layers below it) is engine_layers.sh's.

Positive control: the same graph with a call added back from buf.c to
job_cuda.c (the loop this check was written after) must show a loop, or
the check could not fail.

Prints
    call-loops: files=N calls=M loops=0
"""

import glob
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
B = os.environ.get("B", "build")
if not os.path.isabs(B):
    B = os.path.join(ROOT, B)


def nm(args, obj):
    r = subprocess.run(["nm"] + args + [obj], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("nm %s: %s" % (obj, r.stderr.strip()))
    return [line.split() for line in r.stdout.splitlines() if line.split()]


def graph():
    srcs = sorted(os.path.relpath(p, ROOT)
                  for p in glob.glob(os.path.join(ROOT, "daemon", "**", "*.c"), recursive=True))
    objs, missing = {}, []
    for s in srcs:
        o = os.path.join(B, "obj", s[:-2] + ".o")
        if os.path.exists(o):
            objs[s] = o
        else:
            missing.append(s)
    defs, uses = {}, {}
    for s, o in objs.items():
        for f in nm(["-g", "--defined-only"], o):
            if len(f) == 3:
                defs.setdefault(f[2], set()).add(s)
        uses[s] = {f[-1] for f in nm(["-u"], o)}
    edges = {s: {} for s in objs}
    for s, names in uses.items():
        for n in names:
            owners = defs.get(n, set()) - {s}
            if len(owners) == 1:      # a name two files define (test builds' twins) is no call
                edges[s].setdefault(owners.pop(), set()).add(n)
    return srcs, missing, edges


def loops(edges):
    """Tarjan's strongly connected components of two files or more."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    srcs, missing, edges = graph()
    if missing:
        print("call-loops: FAIL: not built (make first): %s" % " ".join(missing))
        return 1
    calls = sum(len(t) for t in edges.values())
    if len(srcs) < 50 or calls < 100:
        print("call-loops: FAIL: only %d files and %d calls read; is the list right?"
              % (len(srcs), calls))
        return 1
    found = loops(edges)
    for comp in found:
        print("loop of %d files:" % len(comp))
        for a in comp:
            for b in comp:
                if b in edges[a]:
                    print("  %s -> %s: %s" % (a, b, ", ".join(sorted(edges[a][b])[:6])))
    # Positive control: the loop this was written after, put back.
    ctl = {k: dict(v) for k, v in edges.items()}
    ctl.setdefault("daemon/buf.c", {})["daemon/job_cuda.c"] = {"jcuda_buf_open"}
    control = any("daemon/buf.c" in c and "daemon/job_cuda.c" in c for c in loops(ctl))
    if not control:
        print("call-loops: FAIL: the control loop buf.c <-> job_cuda.c was not seen")
        return 1
    print("call-loops: files=%d calls=%d loops=%d" % (len(srcs), calls, len(found)))
    if found:
        print("FAIL: files that call each other; move the function to its layer or pass an "
              "interface down (buf.h's struct dbuf_dev_ops, route.h's receiver)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

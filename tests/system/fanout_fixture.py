#!/usr/bin/python3
"""Relay fan-out with the real engine code on modelled links (issue 34:
"If the engine-instance fixture exists, run the real engine code in it
rather than a separate model").

Runs tests/bench/bench_fanout_fixture.c small: 1 + N engines in one
process on the fixture's timed links (tests/unit/fixture.h: each NIC
serves its destinations in turn, a hop costs a latency, a receiver's loop
checks each payload at the data path's measured per-byte cost), N = 1, 4
and 8 sink replicas at 10 Gbit/s and N = 1 and 8 at 400 Gbit/s (where the
checks bound a replica), a dense and two sparse versions, direct and
through the planner's relay trees.  The bench itself checks every
replica exact against RNE(theta) after every version.  Checked here:

  * relay beats direct from 4 replicas on, for every version;
  * the dense version through the relay takes at most 1.25x one
    replica's time at 8 replicas (issue 34's goal, here where no CPU is
    shared: the links and the checks are modelled, everything else is
    the engine's);
  * the engine's times agree with the planner's model (daemon/
    relay_plan.c, relay_model_s) within 10 %, direct and relay: the model
    the coordinator plans with, and bench_fanout_sim extrapolates to 1000
    nodes with, is the engine's behaviour.  (It was not: the model left
    out the leaves' own check, 2.8x short at 400 Gbit/s.)

Prints `fanout-fixture: sinks=1,4,8 versions=3 exact=yes dense_ratio_8=R
relay_vs_model_max=E direct_vs_model_max=E`.  Times are the fixture's
clock, not this machine's: the same on any machine.
"""

import os
import re
import subprocess
import sys

B = os.environ.get("B", "build")
BIN = os.path.join(B, "tests", "bench_fanout_fixture")


def run(args):
    r = subprocess.run([BIN, "--big", "0", "--versions", "3"] + args,
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        print("FAIL: bench_fanout_fixture %s exited %d" % (" ".join(args), r.returncode))
        return None
    return [dict(re.findall(r"(\w+)=(\S+)", line)) for line in r.stdout.splitlines()
            if line.startswith("bench fanout-fixture sinks=")]


def main():
    if not os.access(BIN, os.X_OK):
        print("FAIL: %s not built (make all)" % BIN)
        return 1
    rows, fast = run(["--sinks", "1,4,8"]), run(["--sinks", "1,8", "--gbit", "400"])
    if rows is None or fast is None:
        return 1
    fails = []
    if len(rows) != 9 or len(fast) != 6:
        fails.append("expected 9 + 6 result lines, got %d + %d" % (len(rows), len(fast)))
    one = {}
    rel_err = dir_err = 0.0
    dense8 = None
    for x in rows:
        n, v = int(x["sinks"]), int(x["v"])
        d, rl = float(x["direct_s"]), float(x["relay_s"])
        md, mr = float(x["model_direct_s"]), float(x["model_relay_s"])
        if x.get("exact") != "yes":
            fails.append("sinks=%d v%d not exact" % (n, v))
        if n == 1:
            one[v] = rl
        if n >= 4 and not rl < d:
            fails.append("sinks=%d v%d: relay %.4f s not under direct %.4f s" % (n, v, rl, d))
        rel_err = max(rel_err, abs(rl / mr - 1))
        dir_err = max(dir_err, abs(d / md - 1))
        if n == 8 and x["version"] == "dense":
            dense8 = rl / one[v]
    # 400 Gbit/s: the checks, not the links, bound every replica
    for x in fast:
        if x.get("exact") != "yes":
            fails.append("400 Gbit/s sinks=%s v%s not exact" % (x["sinks"], x["v"]))
        rel_err = max(rel_err, abs(float(x["relay_s"]) / float(x["model_relay_s"]) - 1))
        dir_err = max(dir_err, abs(float(x["direct_s"]) / float(x["model_direct_s"]) - 1))
    if rel_err > 0.10 or dir_err > 0.10:
        fails.append("engine against model: relay %.3f, direct %.3f (at most 0.10)"
                     % (rel_err, dir_err))
    if dense8 is None or dense8 > 1.25:
        fails.append("dense through the relay at 8 replicas: %s x one replica's time "
                     "(at most 1.25)" % dense8)
    print("fanout-fixture: sinks=1,4,8 versions=3 exact=%s dense_ratio_8=%s "
          "relay_vs_model_max=%.3f direct_vs_model_max=%.3f"
          % ("yes" if not any("exact" in f for f in fails) else "no",
             "%.3f" % dense8 if dense8 else "-", rel_err, dir_err))
    for f in fails:
        print("FAIL: " + f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""The relay shape from measured links against the fixed one (issue 34:
"a chain or a tree, chosen by the coordinator's plan from the measured
link rates"; docs/BENCHMARKS.md, "Relay shape, measured"): one source
daemon and N sink daemons (8 unless BENCH_SHAPE_SINKS says otherwise) in
network namespaces, every NIC shaped to BENCH_FANOUT_GBIT (10) both ways,
except replica 0's uplink, congested to BENCH_SHAPE_SLOW_MBIT (200).
relay_fanout = 1: the first plan is the chain s0 -> s1 -> ... in replica
order, the congested uplink at its head.

The same job twice, on fresh daemons: relay_shape = fixed (the chain
stays) and measured (after the dense v1 the members' RATES make s0 a
leaf).  Per run: v1 dense (both shapes send it down the first chain, and
the measured run learns from it), v2 a heavy version (lr 1e-3, most
elements change, sparse), v3..v5 sparse (lr 1e-5).  A version's time runs
from the publish until every replica has it staged; every replica is
checked exact (the independent converter) after every version.

Prints, per version kind:
    bench fanout-shape sinks=N slow_mbit=M gbit=G version=heavy|sparse
        fixed_s=... measured_s=... speedup=... bytes=... reshapes=R exact=yes
Needs root (ip netns, tc)."""

import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_fanout as bf  # noqa: E402  (harness, CFG, Replica, shape)
from bench_fanout import harness, Daemon, Netns, Workdir, torch  # noqa: E402

N = int(os.environ.get("BENCH_SHAPE_SINKS", "8"))
SLOW_MBIT = int(os.environ.get("BENCH_SHAPE_SLOW_MBIT", "200"))
LRS = {1: 1e-5, 2: 1e-3, 3: 1e-5, 4: 1e-5, 5: 1e-5}


def metric(d, name, label):
    for k, v in d.metrics().items():
        if k.startswith(name + "{") and label in k:
            return v
    return 0.0


def run(net, measured):
    work = Workdir("dte-fanout-shape-")
    daemons, reps = [], []
    out = {"t": {}, "bytes": {}, "exact": True, "reshapes": 0}
    try:
        kw = dict(part_size="256K", sync_mode="sparse",
                  log_level=os.environ.get("BENCH_FANOUT_LOG", "notice"))
        coord = Daemon(work.path, "coord", host=net.addrs[0], netns=net.names[0],
                       dev=net.devs[0], relay_fanout="1", relay_lag_ms="0",
                       relay_shape="measured" if measured else "fixed", **kw).start()
        daemons.append(coord)
        for k in range(N):
            daemons.append(Daemon(work.path, "s%d" % k, host=net.addrs[k + 1],
                                  netns=net.names[k + 1], dev=net.devs[k + 1], **kw).start())
        tr = bf.Tp1Trainer(coord.sock, bf.JOB, bf.TOKEN, bf.CFG, "fs-src", LRS[1], 1)
        model, trainer, task, tcli, src = tr.model, tr.trainer, tr.task, tr.cli, tr.src
        for k in range(N):
            reps.append(bf.Replica(k, daemons[k + 1], coord.address))
        for v in sorted(LRS):
            trainer.sched.base_lrs = [LRS[v]] * len(trainer.opt.param_groups)
            for g in trainer.opt.param_groups:
                g["lr"] = LRS[v]
            rec = trainer.step(*task.batch_at(v))
            t0 = time.perf_counter()
            info = tcli.publish(bf.JOB, src, v, rec["step"], harness.groups_of(rec))
            for r in reps:
                got = r.cli.wait_staged(bf.JOB, r.part, 60000)
                if got < v:
                    raise RuntimeError("replica %d staged %d, not %d" % (r.k, got, v))
            out["t"][v] = time.perf_counter() - t0
            out["bytes"][v] = info["bytes"]
            for r in reps:
                r.cli.apply(bf.JOB, r.part, v)
            want_w = bf.expected(model)
            for r in reps:
                if harness.mismatches(want_w[0], r.model.weights(0)):
                    out["exact"] = False
            if v == 1 and measured:
                # The rates of v1 reach the coordinator; it re-plans
                # between versions.
                end = time.time() + 20
                while time.time() < end and metric(coord, "dted_relay_reshapes_total",
                                                   'cause="measured"') < 1:
                    time.sleep(0.05)
        out["reshapes"] = int(metric(coord, "dted_relay_reshapes_total", 'cause="measured"'))
        out["why"] = [x.split(": ", 1)[-1] for x in coord.log_text().splitlines()
                      if "relay shape of" in x]
    finally:
        for r in reps:
            r.close()
        for d in daemons:
            try:
                d.stop()
            except Exception:
                pass
        work.close()
    return out


def run_all(log=print):
    if os.geteuid() != 0 or not Netns.available():
        return {"skipped": "needs root and ip netns"}
    torch.set_num_threads(1)
    net = Netns(N + 1)
    res = {}
    try:
        net.setup()
        bf.shape(net, bf.GBIT)
        # replica 0's uplink: its veth's egress in its namespace
        burst = max(64 * 1024, int(SLOW_MBIT * 1e6 / 8 * 0.002))
        subprocess.run(["tc", "-n", net.names[1], "qdisc", "replace", "dev", net.devs[1],
                        "root", "tbf", "rate", "%dmbit" % SLOW_MBIT, "burst", str(burst),
                        "latency", "50ms"], check=True, capture_output=True)
        for measured in (False, True):
            res[measured] = r = run(net, measured)
            log("  fanout-shape %s: %s" % ("measured" if measured else "fixed",
                                           " ".join("v%d=%.3fs" % kv for kv in
                                                    sorted(r["t"].items()))))
            for why in r.get("why", []):
                log("    %s" % why)
    finally:
        net.close()
    return res


def lines(res):
    if "skipped" in res:
        return ["bench fanout-shape skipped (%s)" % res["skipped"]]
    f, m = res[False], res[True]
    out = []
    for kind, vs in (("dense", [1]), ("heavy", [2]), ("sparse", [3, 4, 5])):
        tf = statistics.median(f["t"][v] for v in vs)
        tm = statistics.median(m["t"][v] for v in vs)
        out.append("bench fanout-shape sinks=%d slow_mbit=%d gbit=%g version=%s fixed_s=%.4f "
                   "measured_s=%.4f speedup=%.2f bytes=%d reshapes=%d exact=%s%s" % (
                       N, SLOW_MBIT, bf.GBIT, kind, tf, tm, tf / tm, m["bytes"][vs[0]],
                       m["reshapes"], "yes" if f["exact"] and m["exact"] else "NO",
                       " (both shapes send v1 down the first chain)" if kind == "dense"
                       else ""))
    return out


def main():
    res = run_all(log=lambda s: print(s, flush=True))
    for line in lines(res):
        print(line, flush=True)
    if "skipped" in res:
        return 0
    return 0 if res[False]["exact"] and res[True]["exact"] and res[True]["reshapes"] >= 1 else 1


if __name__ == "__main__":
    sys.exit(main())

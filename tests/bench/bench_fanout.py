#!/usr/bin/python3
"""Relay fan-out measured (issue 34; docs/BENCHMARKS.md, "Relay fan-out,
measured"): one source daemon and N sink daemons, each in its own network
namespace on a bridge, every node's uplink shaped by tc tbf (10 Gbit/s
unless BENCH_FANOUT_GBIT says otherwise).  For each N (1, 2, 4, 8, 16 or
BENCH_FANOUT_SINKS) the same job runs twice on fresh daemons: direct (every
replica fed by the source) and relay ([peer] relay_fanout on the
coordinator, a chain unless BENCH_FANOUT_FANOUT says otherwise).

The source is this process's trainer: a Qwen3-shaped model as
megatron:tp=1 (FP32 theta, m, v in memfds) stepped by torch AdamW; each
sink daemon serves one sglang:tp=1 replica (BF16 memfd arenas in this
process).  Per run: version 1 is dense (every replica fresh), versions 2
and 3 sparse (lr 1e-5, real AdamW steps).  A version's time runs from the
publish call until every replica has it staged (wait_staged on each, in
turn: the last to answer bounds it); then every replica applies it (not
timed) and is checked exact against RNE(theta) by the independent
converter.  direct_s and relay_s are the medians of the sparse versions
(dense: version 1), ratio_to_one_sink = relay_s / the N=1 run's relay_s.

Each version's floor on this machine, per run: the larger of the sources'
link (N copies of the version's bytes direct, one by relay, at the shaped
rate) and the CPU floor (every daemon's CPU seconds in that version's
window over the machine's cores: all N + 1 daemons share them, where a
deployment gives each its own node); relay_over_floor and
direct_over_floor are each time over its floor.

Per relay daemon (relay runs): CPU seconds (utime + stime over the run)
and peak RSS (VmHWM) of the root, of the chain's middle and of the last
replica, and the same for a direct run's sink, to compare.

Prints, one per N and kind (sparse, dense):
    bench fanout sinks=N version=sparse direct_s=... relay_s=...
        ratio_to_one_sink=... direct_ratio_to_one_sink=... exact=yes
and a line per N with the relays' CPU and memory.  Needs root (ip netns, tc).
"""

import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "system"))

import harness  # noqa: E402  (B, client/python on sys.path)
from cluster_sync_lib import Daemon, Netns, Tp1Replica, Tp1Trainer, Workdir  # noqa: E402

import torch  # noqa: E402

from dte import qwen3  # noqa: E402

JOB, TOKEN = "fanout", "fanout-token"
GBIT = float(os.environ.get("BENCH_FANOUT_GBIT", "10"))
SINKS = [int(x) for x in os.environ.get("BENCH_FANOUT_SINKS", "1,2,4,8,16").split(",")]
FANOUT = int(os.environ.get("BENCH_FANOUT_FANOUT", "1"))
SMALL = os.environ.get("BENCH_SMALL") == "1"
CFG = qwen3.make_config(None, hidden_size=256 if SMALL else 512,
                        intermediate_size=768 if SMALL else 1536,
                        num_hidden_layers=2 if SMALL else 4, num_attention_heads=8,
                        num_key_value_heads=4, head_dim=64, vocab_size=4096 if SMALL else 16384)
CFG_TEXT = json.dumps(CFG)
LR, WARMUP = 1e-5, 1


def shape(net, gbit):
    """tbf on every node's veth (its uplink into the bridge) and on every
    bridge port (its downlink): each node's NIC at gbit both ways."""
    burst = max(256 * 1024, int(gbit * 1e9 / 8 * 0.002))
    rate = "%dmbit" % int(gbit * 1000)
    for ns, dev in zip(net.names, net.devs):
        for args in (["-n", ns, "qdisc", "replace", "dev", dev],
                     ["-n", net.hub, "qdisc", "replace", "dev", dev + "p"]):
            subprocess.run(["tc"] + args + ["root", "tbf", "rate", rate, "burst", str(burst),
                                            "latency", "50ms"], check=True, capture_output=True)


def proc_cpu_mem(pid):
    with open("/proc/%d/stat" % pid) as f:
        st = f.read().rsplit(")", 1)[1].split()
    cpu = (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")
    hwm = 0
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
    return cpu, hwm


def expected(model):
    return harness.expected_sglang(model, CFG, 1)


def Replica(k, daemon, coord_addr):
    return Tp1Replica(k, daemon, coord_addr, JOB, TOKEN, CFG, "fo%d" % k)


def run(n, relay, net):
    """One job with n replicas; {"dense": s, "sparse": [s, ...], "exact":
    bool, "cpu": {...}, "mem": {...}}."""
    work = Workdir("dte-fanout-")
    daemons, reps = [], []
    out = {"sparse": [], "exact": True}
    try:
        kw = dict(part_size="256K", sync_mode="sparse",
                  log_level=os.environ.get("BENCH_FANOUT_LOG", "notice"))
        coord = Daemon(work.path, "coord", host=net.addrs[0], netns=net.names[0],
                       dev=net.devs[0], relay_fanout=str(FANOUT if relay else 0),
                       relay_shape=os.environ.get("BENCH_FANOUT_SHAPE", "fixed"), **kw).start()
        daemons.append(coord)
        for k in range(n):
            daemons.append(Daemon(work.path, "s%d" % k, host=net.addrs[k + 1],
                                  netns=net.names[k + 1], dev=net.devs[k + 1], **kw).start())
        tr = Tp1Trainer(coord.sock, JOB, TOKEN, CFG, "fo-src", LR, WARMUP)
        model, trainer, task, tcli, src = tr.model, tr.trainer, tr.task, tr.cli, tr.src
        for k in range(n):
            reps.append(Replica(k, daemons[k + 1], coord.address))
        cpu0 = {d.name: proc_cpu_mem(d.pid)[0] for d in daemons}
        out["cpu_floor"] = {"sparse": []}
        for v in (1, 2, 3):
            rec = trainer.step(*task.batch_at(v))
            c0 = sum(proc_cpu_mem(d.pid)[0] for d in daemons)
            t0 = time.perf_counter()
            info = tcli.publish(JOB, src, v, rec["step"], harness.groups_of(rec))
            for r in reps:
                got = r.cli.wait_staged(JOB, r.part, 60000)
                if got < v:
                    raise RuntimeError("replica %d staged %d, not %d" % (r.k, got, v))
            dt = time.perf_counter() - t0
            # The daemons' CPU in that window over the cores they share:
            # no schedule on this machine delivers the version sooner.
            floor = (sum(proc_cpu_mem(d.pid)[0] for d in daemons) - c0) / os.cpu_count()
            if v == 1:
                out["dense"] = dt
                out["dense_bytes"] = info["bytes"]
                out["cpu_floor"]["dense"] = floor
            else:
                out["sparse"].append(dt)
                out["cpu_floor"]["sparse"].append(floor)
                out.setdefault("sparse_bytes", info["bytes"])
            for r in reps:
                r.cli.apply(JOB, r.part, v)
            want_w = expected(model)
            for r in reps:
                if harness.mismatches(want_w[0], r.model.weights(0)):
                    out["exact"] = False
        out["cpu"], out["mem"] = {}, {}
        for d in daemons:
            cpu, hwm = proc_cpu_mem(d.pid)
            out["cpu"][d.name] = cpu - cpu0[d.name]
            out["mem"][d.name] = hwm
        out["elements"] = sum(e for e in (info.get("elements", 0),))
    finally:
        for r in reps:
            r.close()
        for d in daemons:
            try:
                d.stop()
            except Exception:
                pass
        work.close(keep=bool(os.environ.get("BENCH_FANOUT_KEEP")))
        if os.environ.get("BENCH_FANOUT_KEEP"):
            print("  kept %s" % work.path, flush=True)
    return out


def run_all(log=print):
    """Every N, direct and relay: {"rows": {(n, relay): result}} or
    {"skipped": why}."""
    if os.geteuid() != 0 or not Netns.available():
        return {"skipped": "needs root and ip netns"}
    torch.set_num_threads(1)
    net = Netns(max(SINKS) + 1)
    results = {}
    try:
        net.setup()
        shape(net, GBIT)
        for n in SINKS:
            for relay in (False, True):
                results[(n, relay)] = r = run(n, relay, net)
                log("  fanout n=%d %s: dense %.3f s, sparse %s s, exact %s" % (
                    n, "relay" if relay else "direct", r["dense"],
                    " ".join("%.3f" % x for x in r["sparse"]), r["exact"]))
    finally:
        net.close()
    return {"rows": results}


def lines(res):
    if "skipped" in res:
        return ["bench fanout skipped (%s)" % res["skipped"]]
    results = res["rows"]
    out = []

    def t(r, kind):
        return statistics.median(r[kind]) if kind == "sparse" else r[kind]
    def fl(r, kind):
        f = r["cpu_floor"][kind]
        return statistics.median(f) if kind == "sparse" else f
    one_r, one_d = results[(SINKS[0], True)], results[(SINKS[0], False)]
    for n in SINKS:
        d, r = results[(n, False)], results[(n, True)]
        for kind in ("sparse", "dense"):
            nbytes = r["%s_bytes" % kind]
            # The sources' link carries n copies direct, one by relay.
            link_d, link_r = n * nbytes * 8 / (GBIT * 1e9), nbytes * 8 / (GBIT * 1e9)
            out.append("bench fanout sinks=%d version=%s gbit=%g fanout=%d direct_s=%.4f "
                       "relay_s=%.4f ratio_to_one_sink=%.3f direct_ratio_to_one_sink=%.3f "
                       "bytes=%d direct_floor_s=%.4f relay_floor_s=%.4f relay_over_floor=%.2f "
                       "direct_over_floor=%.2f exact=%s" % (
                           n, kind, GBIT, FANOUT, t(d, kind), t(r, kind),
                           t(r, kind) / t(one_r, kind), t(d, kind) / t(one_d, kind), nbytes,
                           max(link_d, fl(d, kind)), max(link_r, fl(r, kind)),
                           t(r, kind) / max(link_r, fl(r, kind)),
                           t(d, kind) / max(link_d, fl(d, kind)),
                           "yes" if d["exact"] and r["exact"] else "NO"))
        names = ["s0", "s%d" % ((n - 1) // 2), "s%d" % (n - 1)]
        out.append("bench fanout-cost sinks=%d relay_cpu_s=%s relay_peak_mb=%s "
                   "direct_sink_cpu_s=%.2f direct_sink_peak_mb=%.0f source_cpu_s=%.2f/%.2f "
                   "(relay: root/middle/last; source: direct/relay)" % (
                       n, "/".join("%.2f" % r["cpu"][x] for x in names),
                       "/".join("%.0f" % r["mem"][x] for x in names), d["cpu"]["s0"],
                       d["mem"]["s0"], d["cpu"]["coord"], r["cpu"]["coord"]))
    return out


def main():
    res = run_all(log=lambda s: print(s, flush=True))
    for line in lines(res):
        print(line, flush=True)
    if "skipped" in res:
        return 0
    return 0 if all(r["exact"] for r in res["rows"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())

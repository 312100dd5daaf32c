#!/usr/bin/python3
"""Relay shape from measured links (issue 34: "a chain or a tree, chosen
by the coordinator's plan from the measured link rates"; docs/SYNC.md,
"Relay shape from measured links").

Five daemons, each in its own network namespace on a bridge: the
coordinator with the trainer (megatron:tp=1, real AdamW steps) and four
sink daemons s0..s3, one SGLang TP=1 replica each, [peer] relay_fanout = 1
(a chain) and relay_shape = measured.  Replica order makes the first plan
the chain s0 -> s1 -> s2 -> s3, s0 the root.  s0's uplink alone is shaped
slow (tc tbf on its veth, 80 Mbit/s; its downlink and every other link are
not), so what only s0 itself can measure shows it: the coordinator's
own sends to s0 go at full speed.

v1 is dense and goes down the chain through s0's slow uplink.  Each
daemon times the parts it sends and forwards and reports the rates to
the coordinator (RATES, peer protocol 10); the coordinator finds s0's
rate under a third of the median, and, between versions, re-plans: s0 a leaf
at the chain's end, s1 the root.  Checked: the first plan's chain; the
re-plan (dted_relay_reshapes_total, the log's reason, dtectl job's
parents: nobody below s0); every replica exact after every version; s0
forwards nothing after the re-plan and s1 does.  A leaf sends nothing,
so its rate is never measured again: after [peer] relay_rate_max_age_ms
(10 s here) it expires, the coordinator plans the first chain again, and
the next large version through s0 makes it a leaf again.  Without the members'
reports the coordinator would see s1 receive slowly and take s1 for the
slow one (the test fails then: s1 would be the leaf).

Prints `relay-shape: replicas=4 slow=s0 reshapes=3 versions=6 exact=6/6
fast_staged_s=A/B` where A and B are how long the three fast replicas took
to stage v1 (through s0) and v2 (a sparse version that changed about as
many bytes, s0 a leaf) -- for the reader, not asserted.  Needs root and
ip netns (SKIP otherwise)."""

import json
import os
import subprocess
import sys
import time

import harness  # noqa: E402  (sets B, client/python on sys.path)

from cluster_sync_lib import Daemon, Netns, Tp1Replica, Tp1Trainer, Workdir, asan_reexec  # noqa: E402

asan_reexec([sys.executable] + sys.argv)

import torch  # noqa: E402

from dte import qwen3  # noqa: E402
from dte.checks import Checks  # noqa: E402

JOB, TOKEN = "shape", "shape-token"
CFG = qwen3.make_config(None, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                        num_attention_heads=8, num_key_value_heads=4, head_dim=32,
                        vocab_size=8192)
CFG_TEXT = json.dumps(CFG)
N = 4
SLOW_MBIT = 80
VERSIONS = 5
AGE_MS = 10000      # [peer] relay_rate_max_age_ms on every daemon


def Replica(k, daemon, coord_addr):
    return Tp1Replica(k, daemon, coord_addr, JOB, TOKEN, CFG, "shape%d" % k)


def metric(d, name, label=""):
    for k, v in d.metrics().items():
        if (k == name or k.startswith(name + "{")) and label in k:
            return v
    return 0.0


def sink_parents(coord):
    """{replica index: (participant id, relay parent id)} from dtectl job."""
    job = coord.ctl_json("job", JOB) or {}
    out = {}
    for x in job.get("participants", []):
        if x.get("role") == "sink":
            out[int(x.get("replica", 0))] = (int(x["id"]), int(x.get("relay_parent", 0) or 0))
    return out


def chain_order(par):
    """The replicas from the root down, when par is one chain; else None."""
    by_id = {pid: k for k, (pid, _up) in par.items()}
    roots = [k for k, (_pid, up) in par.items() if not up]
    if len(roots) != 1:
        return None
    order, seen = [roots[0]], {roots[0]}
    while True:
        kids = [k for k, (_pid, up) in par.items() if up == par[order[-1]][0]]
        if not kids:
            break
        if len(kids) != 1 or kids[0] in seen:
            return None
        order.append(kids[0])
        seen.add(kids[0])
    return order if len(order) == len(par) and all(
        by_id.get(up, -1) in seen for _pid, up in par.values() if up) else None


def wait_for(cond, timeout):
    end = time.time() + timeout
    while time.time() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    return cond()


def main():
    c = Checks("relay-shape")
    if not Netns.available() or not subprocess.run(["which", "tc"],
                                                   capture_output=True).returncode == 0:
        print("SKIP: needs root, ip netns and tc", flush=True)
        sys.exit(77)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = Netns(N + 1)
    work = Workdir("dte-relay-shape-")
    daemons, reps = [], []
    exact = reshapes = 0
    fast, rates = {}, {}
    ok = False
    try:
        net.setup()
        # s0's uplink only: its veth's egress, inside its namespace.
        subprocess.run(["tc", "-n", net.names[1], "qdisc", "replace", "dev", net.devs[1], "root",
                        "tbf", "rate", "%dmbit" % SLOW_MBIT, "burst", "64k", "latency", "100ms"],
                       check=True, capture_output=True)
        kw = dict(part_size="256K", sync_mode="sparse", log_level="info",
                  relay_rate_max_age_ms=str(AGE_MS))
        coord = Daemon(work.path, "coord", host=net.addrs[0], netns=net.names[0],
                       dev=net.devs[0], relay_fanout="1", relay_shape="measured",
                       relay_lag_ms="0", **kw).start()
        daemons.append(coord)
        sinks = []
        for k in range(N):
            d = Daemon(work.path, "s%d" % k, host=net.addrs[k + 1], netns=net.names[k + 1],
                       dev=net.devs[k + 1], **kw).start()
            sinks.append(d)
            daemons.append(d)
        tr = Tp1Trainer(coord.sock, JOB, TOKEN, CFG, "shape-src", 1e-5, 1)
        model, trainer, task, tcli, src = tr.model, tr.trainer, tr.task, tr.cli, tr.src
        for k in range(N):
            reps.append(Replica(k, sinks[k], coord.address))
        first = wait_for(lambda: chain_order(sink_parents(coord)), 20)
        c.check(first == [0, 1, 2, 3], "the first plan is the chain s0 -> s1 -> s2 -> s3 in "
                "replica order (%s)" % first)
        def version(v, lr):
            """Publish v at lr; every replica stages (s0 last), applies and
            is checked exact.  Returns when the three fast replicas had
            staged it."""
            nonlocal exact
            trainer.sched.base_lrs = [lr] * len(trainer.opt.param_groups)
            for g in trainer.opt.param_groups:
                g["lr"] = lr
            rec = trainer.step(*task.batch_at(v))
            t0 = time.perf_counter()
            info = tcli.publish(JOB, src, v, rec["step"], harness.groups_of(rec))
            staged = {}
            for r in sorted(reps, key=lambda r: r.k == 0):	# s0 last
                got = r.cli.wait_staged(JOB, r.part, 60000)
                staged[r.k] = time.perf_counter() - t0
                c.check(got >= v, "v%d: s%d staged it (%d)" % (v, r.k, got))
            print("relay-shape: v%d %s bytes=%d staged_s %s" % (
                v, "dense" if info["dense"] else "sparse", info["bytes"],
                " ".join("s%d=%.3f" % (k, staged[k]) for k in range(N))), flush=True)
            for r in reps:
                res = r.cli.apply(JOB, r.part, v)
                c.check(res["checksum_ok"], "v%d: s%d's checksum holds" % (v, r.k))
            want_w = harness.expected_sglang(model, CFG, 1)
            bad = [(r.k, harness.mismatches(want_w[0], r.model.weights(0))[:3]) for r in reps]
            bad = [b for b in bad if b[1]]
            exact += c.check(not bad, "v%d: every replica exact (%s)" % (v, bad))
            return max(staged[k] for k in range(1, N))

        def reshapes_now():
            return metric(coord, "dted_relay_reshapes_total", 'cause="measured"')

        fwd0 = None
        for v in range(1, VERSIONS + 1):
            # v2 moves about as many bytes as the dense v1 (lr 1e-3: most
            # elements change), for the fast_staged_s comparison.
            fast[v] = version(v, 1e-3 if v == 2 else 1e-5)
            if v == 1:
                # The rates of v1 come in; the coordinator re-plans
                # between versions (nothing is in flight now).
                reshaped = wait_for(lambda: metric(coord, "dted_relay_reshapes_total",
                                                   'cause="measured"') >= 1, 20)
                c.check(reshaped, "the coordinator re-planned for the measured rates "
                        "(dted_relay_reshapes_total %s)" % metric(
                            coord, "dted_relay_reshapes_total", 'cause="measured"'))
                after = wait_for(lambda: chain_order(sink_parents(coord)), 10)
                c.check(after == [1, 2, 3, 0], "after it the chain is s1 -> s2 -> s3 -> s0: "
                        "the slow uplink a leaf (%s)" % after)
                log = coord.log_text()
                c.check("from measured rates" in log and "1 slow of 4" in log,
                        "the coordinator's log says why: %s" % [
                            x for x in log.splitlines() if "relay shape" in x][-2:])
                fwd0 = {d.name: metric(d, "dted_relayed_bytes_total", 'outcome="sent"')
                        for d in sinks}
                # What each end measured (dted_link_send_rate_bytes): s0
                # its forwards to s1 slow, the coordinator its parts to s0
                # fast; only s0's own report could tell the coordinator.
                rates["s0->s1"] = metric(sinks[0], "dted_link_send_rate_bytes", 'node="s1"')
                rates["coord->s0"] = metric(coord, "dted_link_send_rate_bytes", 'node="s0"')
                rates["s1->s2"] = metric(sinks[1], "dted_link_send_rate_bytes", 'node="s2"')
                c.check(0 < rates["s0->s1"] < rates["coord->s0"] / 2 and
                        rates["s0->s1"] < rates["s1->s2"] / 2,
                        "s0 measured its sends to s1 slow, the coordinator its sends to s0 and "
                        "s1 its sends to s2 fast: %s" % {k: "%.1f MB/s" % (v / 1e6)
                                                         for k, v in rates.items()})
            if v == 2:
                # v2 came well within the rates' age: s0 a leaf still
                fwd = {d.name: metric(d, "dted_relayed_bytes_total", 'outcome="sent"')
                       for d in sinks}
                c.check(fwd0 is not None and fwd0["s0"] > 0 and fwd["s0"] == fwd0["s0"] and
                        fwd["s1"] > fwd0["s1"] and reshapes_now() == 1,
                        "s0 forwarded v1 and not v2, s1 forwarded v2, one re-plan: %s -> %s" %
                        (fwd0, fwd))
        # s0 sends nothing as a leaf, so its rate is never measured again:
        # once relay_rate_max_age_ms passed it is unmeasured, not slow, and
        # the coordinator plans it in its place; the next large version
        # through it measures it slow again.
        back = wait_for(lambda: reshapes_now() >= 2, AGE_MS / 1000.0 + 20)
        order = wait_for(lambda: chain_order(sink_parents(coord)) == [0, 1, 2, 3], 10)
        c.check(back and order, "s0's rate expired after relay_rate_max_age_ms: the first "
                "chain again (%s, %s re-plans)" % (chain_order(sink_parents(coord)),
                                                    reshapes_now()))
        version(VERSIONS + 1, 1e-3)
        again = wait_for(lambda: reshapes_now() >= 3, 20)
        order = wait_for(lambda: chain_order(sink_parents(coord)) == [1, 2, 3, 0], 10)
        c.check(again and order, "v%d through s0 measured it slow again: a leaf again (%s, "
                "%s re-plans)" % (VERSIONS + 1, chain_order(sink_parents(coord)),
                                  reshapes_now()))
        reshapes = reshapes_now()
        for r in reps:
            r.close()
        reps = []
        tcli.close()
        for d in daemons:
            c.check(d.stop() == 0, "%s shuts down cleanly" % d.name)
        daemons = []
        ok = True
    finally:
        for r in reps:
            r.close()
        for d in daemons:
            if not ok:
                print(d.log_tail(30), flush=True)
            try:
                d.stop()
            except Exception:
                pass
        net.close()
        work.close(keep=not ok)
    print("relay-shape: replicas=%d slow=s0 reshapes=%d versions=%d exact=%d/%d "
          "fast_staged_s=%.3f/%.3f slow_MBps=%.1f fast_MBps=%.1f" % (
              N, reshapes, VERSIONS + 1, exact, VERSIONS + 1, fast.get(1, 0), fast.get(2, 0),
              rates.get("s0->s1", 0) / 1e6, rates.get("s1->s2", 0) / 1e6), flush=True)
    c.finish()


if __name__ == "__main__":
    main()

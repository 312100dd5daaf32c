#!/usr/bin/python3
"""Relay between sink daemons (issue 34; docs/SYNC.md, "Relay between sink
daemons"), on real dted daemons over real UCX (loopback).

Node "coord" is the job's coordinator and holds the sources: a
Megatron-Core-layout TP=2 trainer doing real torch AdamW steps.  Each sink
node "sN" holds one SGLang TP=2 replica (both ranks).  The coordinator's
[peer] relay_fanout makes each sink rank's replicas a tree: the sources
send to the root only, every other replica gets the root's records
forwarded, unchanged, by its parent.

  chain   relay_fanout = 1, four replicas s1 -> s2 -> s3 -> s4: every
          version exact on every replica; the coordinator's link to s2..s4
          carries no payload (its bytes to them stay a fraction of its bytes
          to s1), s1..s3 forward (dted_relayed_bytes_total{outcome=sent})
          and s4, the chain's end, forwards nothing.  Then s2's daemon is
          stopped (SIGSTOP) for five versions: s3 and s4 miss the first
          two, holding what they held, whole; the coordinator, seeing s2
          two versions behind its parent for [peer] relay_lag_ms (1000
          ms), re-plans it as the chain's end (s1 -> s3 -> s4 -> s2), so
          the third reaches s3 and s4 (dense, directly: their last one
          went out under the old plan) and the next two are relayed by s1
          and s3, sparse, while s2 is still stopped; continued, s2 catches
          up, takes its place again, and every replica is exact.
  tree    relay_fanout = 2, replicas s1 -> (s2, s3), s2 -> s4; a fifth
          replica (s5) joins mid-run: its first version is dense, sent to
          it directly while the others' sparse versions are relayed
          (relay_direct).  Then the relay s2 is killed mid-version
          (dted-faults, die-in-relay: it forwards one record of the
          version and dies): the replicas below it must hold the version
          before, whole (torn=0), the coordinator re-plans them under
          another parent, and from the next version on every replica is
          exact again (wrong=0).
  mixed   relay_fanout = 1, replicas of two layouts (SGLang TP 2 and TP 1):
          trees per (layout, rank), no parent of another layout or rank,
          every replica of either layout exact (run_mixed).
  apart   the chain's stopped relay again, with the coordinator on a
          daemon of its own (c0, no participants): the trainer daemon's
          sources are the only ones that know what each sink staged and
          was sent, so the coordinator judges the lag from the trainer
          daemon's RATES.seen (peer protocol 10).

Final line: `relay: versions=N exact=N/N torn=0 wrong=0 ...`.
"""

import os
import signal
import sys
import time

import harness  # sets ROOT and B, puts client/python on sys.path

from cluster_sync_lib import Daemon, Workdir, asan_reexec  # noqa: E402

asan_reexec([sys.executable] + sys.argv)

import torch  # noqa: E402

import sync_local as sl  # noqa: E402  (model, layouts, the independent converter)
from dte import _lib, megatron, toy  # noqa: E402
from dte.checks import Checks  # noqa: E402

JOB, TOKEN, TP = sl.JOB, sl.TOKEN, sl.TP
DTED_FAULTS = harness.DTED_FAULTS


class Rep:
    """One SGLang TP=2 replica, both ranks on one sink daemon."""

    def __init__(self, k, daemon, coord_addr, tp=TP, **create):
        """create: more job_create arguments (storage_relay.py's relay
        reader job: transport, storage_root, storage_role)."""
        self.k, self.daemon, self.tp = k, daemon, tp
        self.layout = "sglang:tp=%d" % tp
        self.model = None
        self.cli = _lib.Client(daemon.sock)
        self.cli.job_create(JOB, sl.CFG_TEXT, TOKEN, coord_addr, 1, **create)
        from dte import sglang
        self.model = sglang.SGLangModel(sl.CFG, tp=tp, label="relay-rep%d" % k,
                                        placement=self.layout)
        if tp == TP:
            self.parts = [sl.attach_sink(self.cli, self.model.arenas[r], r, k)
                          for r in range(TP)]
        else:
            self.parts = [self.attach(r) for r in range(tp)]
        self.held = 0
        self.want = None     # the expected weights of the version it holds

    def attach(self, rank):
        """sync_local.attach_sink for another SGLang TP (its own layout)."""
        ids = []
        for _bid, length, name in _lib.layout_buffers(sl.CFG_TEXT, self.layout, _lib.SINK,
                                                      rank):
            loc = self.model.arenas[rank].loc(name)
            ids.append(self.cli.register_fd(loc.fd, loc.offset, length, _lib.BF16, name))
        return self.cli.attach(JOB, TOKEN, _lib.SINK, self.layout, rank, ids, replica=self.k)

    def apply(self, version, timeout_ms=20000):
        """Wait for version staged on every rank, then apply it on each (as
        the integrations do: sglang.py's _wait_staged, before pausing
        anything); the results, or None when it did not come in time (no
        rank applied)."""
        out = []
        end = time.time() + timeout_ms / 1000.0
        for p in self.parts:
            while self.cli.query_version(JOB, p)[1] < version:
                # A replica catching up stages older versions first, and
                # wait_staged answers at once while one of them is staged
                # and not applied: asked again after a short pause, not
                # in a spin on the control socket.
                left = int((end - time.time()) * 1000)
                if left <= 0:
                    return None
                try:
                    if self.cli.wait_staged(JOB, p, min(left, 1000)) < version:
                        time.sleep(0.005)
                except _lib.DteError as e:
                    if e.code != _lib.ERR_TIMEOUT:
                        raise
        for p in self.parts:
            out.append(self.cli.apply(JOB, p, version))
        self.held = version
        return out

    def tensors(self, r):
        return self.model.weights(r)

    def close(self):
        try:
            self.cli.close()
        except Exception:
            pass


class Boss:
    """The job created on a coordinator of its own (run's apart), held
    open with the replicas (teardown closes it)."""

    def __init__(self, daemon):
        self.daemon, self.k, self.held, self.want = daemon, -1, 0, None
        self.cli = _lib.Client(daemon.sock)
        self.cli.job_create(JOB, sl.CFG_TEXT, TOKEN, "local", 1)

    def close(self):
        try:
            self.cli.close()
        except Exception:
            pass


def metric(d, name, label):
    m = d.metrics()
    for k, v in m.items():
        if k.startswith(name + "{") and label in k:
            return v
    return 0.0


def peer_bytes_out(coord, node):
    p = coord.peer(node)
    return p["bytes_out"] if p else 0


def wait_for(cond, what, timeout=20.0):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.05)
    print("timed out waiting for %s" % what, flush=True)
    return False


def trainer_on(coord, seed, label, coord_addr="local"):
    """The Megatron-Core-layout TP=2 trainer on daemon coord (the job's
    coordinator unless coord_addr names another), its job created and its
    sources attached: (model, trainer, task, client, source participant
    ids)."""
    megatron.shard_shapes = sl.flat_order_shapes
    model = megatron.MegatronModel(sl.CFG, tp=TP, seed=seed, label=label,
                                   placement=sl.SRC_LAYOUT)
    trainer = megatron.Trainer(model, lr=sl.LR, warmup=sl.WARMUP)
    task = toy.ToyTask(sl.CFG["vocab_size"])
    tcli = _lib.Client(coord.sock)
    tcli.job_create(JOB, sl.CFG_TEXT, TOKEN, coord_addr, 1)
    return model, trainer, task, tcli, sl.attach_sources(tcli, model)


def teardown(c, name, work, reps, daemons, ok):
    """Every replica closed, every daemon stopped; the work directory kept
    (and said) when the run broke off or a check failed."""
    for rp in reps:
        rp.close()
    for d in daemons:
        try:
            d.stop()
        except Exception:
            pass
    work.close(keep=not ok or c.passed != c.total)
    if not ok or c.passed != c.total:
        print("%s: work dir kept: %s" % (name, work.path), flush=True)


def run(c, name, fanout, n_reps, versions, late=None, kill=None, lag=None, apart=False):
    """One job: coord + n_reps sink daemons (+1 when late), the chain or
    tree of fanout.  late: (version, replica index) joining then; kill:
    (version, replica index) whose daemon dies relaying that version; lag:
    (version, replica index) whose daemon is stopped (SIGSTOP) for that
    version and the two after it, then continued.  apart: the coordinator
    is a daemon of its own (c0, no participants), so what the sources know
    of the sinks reaches it only in the trainer daemon's RATES.
    Returns (versions, exact, torn, wrong)."""
    work = Workdir("dte-relay-%s-" % name)
    daemons = []
    reps = []
    extra = []       # apart: the coordinator's own client
    total = n_reps + (1 if late else 0)
    n_ok = n_exact = torn = wrong = missed = 0
    ok = False
    try:
        # relay_shape = fixed: the checks name which replica relays to
        # which (a stopped relay's stalled sends would read as a slow link
        # to the measured shape: tests/system/relay_shape.py's).
        relay = dict(relay_fanout=str(fanout), relay_shape="fixed")
        boss = None
        if apart:
            boss = Daemon(work.path, "c0", part_size="64K", sync_mode="sparse", **relay).start()
            daemons.append(boss)
            relay = {}
            # the job on the coordinator, which holds no participant
            extra.append(Boss(boss))
        coord = Daemon(work.path, "coord", part_size="64K", sync_mode="sparse", **relay).start()
        daemons.append(coord)
        boss = boss or coord
        sinks = []
        for k in range(total):
            kw = {}
            if kill and kill[1] == k:
                kw = dict(binary=DTED_FAULTS, hook="die-in-relay@%d" % kill[0])
            d = Daemon(work.path, "s%d" % (k + 1), part_size="64K", sync_mode="sparse", **kw)
            sinks.append(d.start())
            daemons.append(d)
        model, trainer, task, tcli, src_parts = trainer_on(
            coord, 0, "relay-src", boss.address if apart else "local")
        for k in range(n_reps):
            reps.append(Rep(k, sinks[k], boss.address))
        job = boss.ctl_json("job", JOB)
        c.check(job and job.get("complete") and
                len(job.get("participants", [])) == TP + TP * n_reps,
                "%s: coordinator planned %d sources + %d sinks" % (name, TP, TP * n_reps))
        parents = [int(x.get("relay_parent", 0) or 0) for x in job.get("participants", [])
                   if x.get("role") == "sink"] if job else []
        c.check(sum(1 for x in parents if x) == TP * (n_reps - 1),
                "%s: dtectl job shows a relay parent for every replica but the roots (%s)" %
                (name, parents))
        log = boss.log_text()
        c.check("relay trees %d" % TP in log,
                "%s: the plan has one relay tree per sink rank (%d)" % (name, TP))
        before = None     # expected weights of the version before
        step = 0
        dead = None
        stopped = None
        for v in range(1, versions + 1):
            step += 1
            rec = trainer.step(*task.batch_at(step))
            if lag and v == lag[0]:
                # Where the bytes went so far: the sources fed the root alone.
                bytes_out = {d.name: peer_bytes_out(coord, d.name) for d in sinks}
                stopped = reps[lag[1]]
                os.kill(stopped.daemon.pid, signal.SIGSTOP)
            if lag and v == lag[0] + 5:
                os.kill(stopped.daemon.pid, signal.SIGCONT)
                stopped = None
            if late and v == late[0]:
                reps.append(Rep(late[1], sinks[late[1]], boss.address))
                reps[-1].since = v
            infos = [tcli.publish(JOB, p, v, rec["step"], sl.groups_of(rec)) for p in src_parts]
            want = sl.expected(model)
            good = True
            lagging = lag and lag[0] <= v <= lag[0] + 1
            for rp in reps:
                if rp is dead or rp is stopped:
                    continue
                short = (kill and v == kill[0]) or lagging
                res = rp.apply(v, timeout_ms=3000 if short else 20000)
                if res is None:
                    # Not staged: it must still hold the version it held,
                    # whole (a relay died with this version in flight, or
                    # is stopped and its children not yet routed around).
                    exp_ok = (kill and v == kill[0]) or lagging
                    bad = [] if rp.want is None else \
                        [m for r in range(TP) for m in sl.exact(rp.want[r], rp.tensors(r))]
                    if bad:
                        torn += 1
                        print("%s v%d replica %d: neither v%d nor v%d: %s" %
                              (name, v, rp.k, v - 1, v, ", ".join(bad[:4])), flush=True)
                    c.check(exp_ok and not bad,
                            "%s v%d: replica %d below the %s relay kept v%d whole" %
                            (name, v, rp.k, "stopped" if lagging else "dead", rp.held))
                    missed += 1
                    good = False
                    continue
                if not all(x["checksum_ok"] for x in res):
                    c.check(False, "%s v%d replica %d: checksum failed" % (name, v, rp.k))
                bad = [m for r in range(TP) for m in sl.exact(want[r], rp.tensors(r))]
                rp.want = want
                if bad:
                    wrong += 1
                    good = False
                    print("%s v%d replica %d differs: %s" % (name, v, rp.k, ", ".join(bad[:4])),
                          flush=True)
            n_ok += 1
            n_exact += good
            dense = sum(i["dense"] for i in infos)
            fed = sum(i["sinks"] for i in infos)
            if v == 1:
                c.check(dense == fed, "%s v1: dense to every sink (%d/%d)" % (name, dense, fed))
            if late and v == late[0]:
                c.check(0 < dense < fed, "%s v%d: dense only to the replica that joined "
                        "(%d of %d pairs), sent to it directly" % (name, v, dense, fed))
            if late and v == late[0] + 1:
                c.check(dense == 0, "%s v%d: every pair sparse again (%d dense)" % (name, v, dense))
            if kill and v == kill[0]:
                dead = reps[kill[1]]
                c.check(wait_for(lambda: dead.daemon.proc.poll() is not None,
                                 "the relay's death"),
                        "%s v%d: relay s%d died relaying it (die-in-relay)" %
                        (name, v, kill[1] + 1))
                c.check("test hook: die-in-relay" in dead.daemon.log_text(),
                        "%s: the relay's hook fired" % name)
                dead.close()
                # The coordinator notices and re-plans the replicas below it.
                c.check(wait_for(lambda: (boss.peer(dead.daemon.name) or {}).get("state") ==
                                 "down", "coord to see the relay down"),
                        "%s: coord sees the dead relay down" % name)
                c.check(wait_for(lambda: len((boss.ctl_json("job", JOB) or {})
                                             .get("participants", [])) ==
                                 TP + TP * (len(reps) - 1), "the re-plan"),
                        "%s: re-planned without the dead relay's sinks" % name)
            if lag and v == lag[0] + 2:
                # Two versions behind its parent for relay_lag_ms: the
                # coordinator planned the stopped relay as a leaf before
                # this version, whose replicas below it get it dense and
                # directly (their last version went out under the old
                # plan), although it is still stopped.
                stopped_ids = [p["id"] for p in (boss.ctl_json("job", JOB) or {})
                               .get("participants", []) if p.get("role") == "sink" and
                               p.get("node") == stopped.daemon.name]
                parents = {p.get("node"): int(p.get("relay_parent", 0) or 0)
                           for p in (boss.ctl_json("job", JOB) or {}).get("participants", [])
                           if p.get("role") == "sink"}
                log = boss.log_text()
                c.check("lags (holds v%d" % (v - 3) in log and
                        "planned as a leaf" in log,
                        "%s: the coordinator saw the stopped relay lag and planned it as a "
                        "leaf" % name)
                c.check(stopped_ids and parents.get("s3") not in stopped_ids and
                        parents.get("s3") != 0,
                        "%s v%d: s3's parent is no longer the stopped relay (%s; stopped %s)" %
                        (name, v, parents, stopped_ids))
                below = [rp for rp in reps if rp.k > lag[1]]
                c.check(good and 0 < dense < fed and all(rp.held == v for rp in below),
                        "%s v%d: replicas below the stopped relay routed around it (%d of %d "
                        "pairs dense, held %s)" % (name, v, dense, fed,
                                                   [rp.held for rp in below]))
            if lag and lag[0] + 3 <= v <= lag[0] + 4:
                # Still stopped: the replicas that were below it are relayed
                # by their new parent, sparse; only its own pairs go dense.
                c.check(good and dense == fed // len(reps),
                        "%s v%d: with the relay still stopped, every other replica got it "
                        "sparse through its new parent (%d of %d pairs dense: the stopped "
                        "relay's)" % (name, v, dense, fed))
            if lag and v == lag[0] + 6:
                c.check(good, "%s v%d: every replica exact again, the stopped relay too" %
                        (name, v))
            if kill and v == kill[0] + 1:
                # Re-parented, their last version unacknowledged under the
                # old term: dense to them (sent directly), sparse elsewhere.
                c.check(0 < dense < fed, "%s v%d: dense only to the replicas below the dead "
                        "relay (%d of %d pairs)" % (name, v, dense, fed))
            if kill and v == kill[0] + 2:
                c.check(good, "%s v%d: every replica exact again after the relay died" %
                        (name, v))
            before = want
        if lag:
            c.check(wait_for(lambda: "caught up" in boss.log_text(), "the relay to catch up"),
                    "%s: the stopped relay, continued, caught up and took its place again" %
                    name)
            lagm = {e: metric(boss, "dted_relay_lag_replans_total", 'event="%s"' % e)
                    for e in ("lagging", "caught_up")}
            c.check(lagm == {"lagging": TP, "caught_up": TP},
                    "%s: dted_relay_lag_replans_total counts the stopped relay's %d ranks "
                    "out and back: %s" % (name, TP, lagm))
        # Where the bytes went: the sources fed the roots alone (before a
        # stopped relay made them send its subtree directly).
        if not lag:
            bytes_out = {d.name: peer_bytes_out(coord, d.name) for d in sinks}
        root_node = sinks[0].name
        to_root = bytes_out[root_node]
        for d in sinks[1:]:
            if kill and d is sinks[kill[1]]:
                continue
            b = bytes_out[d.name]
            if not (late and d is sinks[late[1]]) and not kill:
                c.check(b < to_root / 10,
                        "%s: coord sent %s %d bytes, the root %s %d (no payload: relayed)" %
                        (name, d.name, b, root_node, to_root))
        fwd = {d.name: metric(d, "dted_relayed_bytes_total", 'outcome="sent"')
               for d in sinks if not (kill and d is sinks[kill[1]])}
        plans = {k: metric(boss, "dted_plans_total", 'kind="%s"' % k)
                 for k in ("sent_whole", "sent_changes")}
        taken = {d.name: metric(d, "dted_plans_total", 'kind="taken_changes"')
                 for d in sinks if not (kill and d is sinks[kill[1]])}
        print("%s: plans sent %s; taken as changes by node %s" % (name, plans, taken),
              flush=True)
        if late or kill:
            # A join and a leave re-plan: the members that acknowledged
            # the plan before get only what changed (peer protocol 8).
            c.check(plans["sent_changes"] > 0 and any(taken.values()),
                    "%s: re-plans sent members only what changed (%s, taken %s)"
                    % (name, plans, taken))
        print("%s: relayed bytes by node: %s; coord -> root %d bytes" % (name, fwd, to_root),
              flush=True)
        if fanout == 1 and not late and not kill:
            # With a relay re-planned as the chain's end while it lagged,
            # the end before it (s4) forwarded to it meanwhile.
            c.check(all(fwd[s.name] > 0 for s in sinks[:-1]) and
                    (fwd[sinks[-1].name] > 0 if lag else fwd[sinks[-1].name] == 0),
                    "%s: every replica but the chain's end forwards%s" % (
                        name, " (s4 too: the stopped relay was planned below it)" if lag
                        else ""))
        for rp in reps:
            rp.close()
        for d in daemons:
            if d.proc.poll() is None:
                c.check(d.stop() == 0, "%s: %s shuts down cleanly" % (name, d.name))
        ok = True
    finally:
        teardown(c, name, work, reps + extra, daemons, ok)
    return n_ok, n_exact, torn, wrong, missed


def run_mixed(c, versions):
    """Two sink layouts in one job, relay_fanout = 1: replicas s1, s2, s3
    hold SGLang TP 2, s4 and s5 SGLang TP 1.  Relay trees are per
    (layout, rank): s1 -> s2 -> s3 for each TP 2 rank, s4 -> s5 for the TP
    1 rank (three trees); no sink's parent is of another layout or rank;
    the sources feed s1 and s4 alone; every replica, of either layout,
    exact after every version (each checked against the independent
    converter at its own TP).  Returns (versions, exact)."""
    work = Workdir("dte-relay-mixed-")
    daemons, reps = [], []
    tps = [TP, TP, TP, 1, 1]
    n_exact = 0
    ok = False
    try:
        coord = Daemon(work.path, "coord", part_size="64K", sync_mode="sparse",
                       relay_fanout="1", relay_shape="fixed").start()
        daemons.append(coord)
        sinks = [Daemon(work.path, "s%d" % (k + 1), part_size="64K",
                        sync_mode="sparse").start() for k in range(len(tps))]
        daemons += sinks
        model, trainer, task, tcli, src_parts = trainer_on(coord, 1, "relay-mixed-src")
        for k, tp in enumerate(tps):
            reps.append(Rep(k, sinks[k], coord.address, tp=tp))
        job = coord.ctl_json("job", JOB) or {}
        snk = {int(x["id"]): x for x in job.get("participants", []) if x.get("role") == "sink"}
        c.check(len(snk) == sum(tps), "mixed: coordinator planned %d sinks (%d)"
                % (sum(tps), len(snk)))
        cross = [(i, x.get("relay_parent")) for i, x in snk.items()
                 if x.get("relay_parent") and
                 (snk.get(int(x["relay_parent"]), {}).get("layout") != x.get("layout") or
                  snk.get(int(x["relay_parent"]), {}).get("rank") != x.get("rank"))]
        c.check(not cross and sum(1 for x in snk.values() if x.get("relay_parent")) ==
                2 * TP + 1, "mixed: every relay parent of the sink's own layout and rank, "
                "%d relayed sinks (%d; across layouts or ranks: %s)" %
                (2 * TP + 1, sum(1 for x in snk.values() if x.get("relay_parent")), cross))
        c.check("relay trees %d" % (TP + 1) in coord.log_text(),
                "mixed: the plan has one relay tree per (layout, rank): %d" % (TP + 1))
        for v in range(1, versions + 1):
            rec = trainer.step(*task.batch_at(v))
            for p in src_parts:
                tcli.publish(JOB, p, v, rec["step"], sl.groups_of(rec))
            good = True
            for rp in reps:
                want = harness.expected_sglang(model, sl.CFG, rp.tp)
                res = rp.apply(v)
                bad = ["not staged"] if res is None else \
                    [m for r in range(rp.tp) for m in sl.exact(want[r], rp.tensors(r))]
                if res is not None and not all(x["checksum_ok"] for x in res):
                    bad.append("checksum failed")
                if bad:
                    good = False
                    print("mixed v%d replica s%d (%s) differs: %s" % (v, rp.k + 1, rp.layout,
                                                                      ", ".join(bad[:4])),
                          flush=True)
            n_exact += c.check(good, "mixed v%d: every replica of both layouts exact" % v)
        out = {d.name: peer_bytes_out(coord, d.name) for d in sinks}
        fwd = {d.name: metric(d, "dted_relayed_bytes_total", 'outcome="sent"') for d in sinks}
        print("mixed: coord -> sinks bytes %s; relayed bytes by node %s" % (out, fwd), flush=True)
        c.check(all(out[n] < out["s1"] / 10 for n in ("s2", "s3")) and
                out["s5"] < out["s4"] / 10,
                "mixed: the sources fed each layout's root alone (s1, s4): %s" % out)
        c.check(fwd["s1"] > 0 and fwd["s2"] > 0 and fwd["s4"] > 0 and
                fwd["s3"] == 0 and fwd["s5"] == 0,
                "mixed: s1, s2 and s4 forward, the chains' ends s3 and s5 do not: %s" % fwd)
        for rp in reps:
            rp.close()
        for d in daemons:
            c.check(d.stop() == 0, "mixed: %s shuts down cleanly" % d.name)
        ok = True
    finally:
        teardown(c, "mixed", work, reps, daemons, ok)
    return versions, n_exact


def main():
    c = Checks("relay")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    a = run(c, "chain", 1, 4, 12, lag=(5, 1))
    b = run(c, "tree", 2, 4, 14, late=(5, 4), kill=(9, 1))
    m = run_mixed(c, 6)
    # The same stopped relay with the coordinator on a daemon of its own:
    # the lag is judged from the trainer daemon's RATES.seen.
    d = run(c, "apart", 1, 4, 9, lag=(3, 1), apart=True)
    versions, exact = a[0] + b[0] + m[0] + d[0], a[1] + b[1] + m[1] + d[1]
    torn, wrong = a[2] + b[2] + d[2], a[3] + b[3] + d[3]
    c.check(torn == 0 and wrong == 0, "no replica torn or wrong")
    c.check(b[4] == 2, "the two replicas below the killed relay missed its version (%d)" % b[4])
    c.check(a[4] == 4, "the two replicas below the stopped relay missed two versions each, "
            "then were routed around it (%d)" % a[4])
    c.check(d[4] == 4, "apart: the two replicas below the stopped relay missed two versions "
            "each, then were routed around it by a coordinator that feeds none of them (%d)" %
            d[4])
    # exact: versions every live replica held exactly; the killed relay's
    # version is not, for the two replicas below it, which kept the one
    # before (missed), whole.
    print("relay: versions=%d exact=%d/%d torn=%d wrong=%d missed=%d (below the killed relay "
          "or the stopped one, each kept the version it held whole)" % (
              versions, exact, versions, torn, wrong,
                                                   a[4] + b[4] + d[4]), flush=True)
    c.finish()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Same-cluster sync across three real dted daemons over real UCX.

Node "coord" is the job's coordinator and the source node: a Megatron-Core
TP=2 trainer (two source ranks, FP32 θ/m/v in memfds) doing real torch
AdamW steps.  Nodes "sink1" and "sink2" hold SGLang TP=2 sinks: replica 0
has rank 0 on sink1 and rank 1 on sink2, replica 1 the other way round, and
replica 2 attaches at a later version (rank 0 on sink1, rank 1 on sink2).
After every version, every sink element must be bit-identical to RNE(θ_t)
mapped through the independent Python converter.  Mid-run the sink2 DAEMON
is SIGKILLed and restarted; its sinks re-attach and must be exact from
their next version on.  A misbehaving peer (dte-peer-forge) sends a wrong
token, an unknown job, a stale base version, out-of-range positions and a
corrupt payload to sink1: each must be refused with a logged reason while
the job keeps going exact.

  cluster_sync.py              loopback (UCX_TLS=tcp, UCX_NET_DEVICES=lo)
  cluster_sync.py --netns      each daemon in its own network namespace,
                               joined by veths into a bridge (cluster_sync_netns.py)

Final line: `cluster-sync: versions=N exact=N/N sinks=S` (or cluster-sync-netns).
"""

import json
import os
import sys
import time

import harness  # sets ROOT and B, puts client/python on sys.path

B = harness.B

from cluster_sync_lib import Daemon, Netns, Workdir, asan_reexec, child_env, forge, peer_proto_version  # noqa: E402,E501

asan_reexec([sys.executable] + sys.argv)

import torch  # noqa: E402

import sync_local as sl  # noqa: E402  (G's single-daemon harness: model, layouts, checks)
from dte import _lib, megatron, sglang, toy  # noqa: E402
from dte.checks import Checks  # noqa: E402

JOB, TOKEN, TP = sl.JOB, sl.TOKEN, sl.TP


class SinkRank:
    """One SGLang rank of one replica, attached on one daemon."""

    def __init__(self, model, replica, rank, daemon):
        self.model, self.replica, self.rank, self.daemon = model, replica, rank, daemon
        self.cli = None
        self.part = None
        self.since = None        # first version it must hold exactly

    def attach(self, coord_addr, from_version):
        self.cli = _lib.Client(self.daemon.sock)
        self.cli.job_create(JOB, sl.CFG_TEXT, TOKEN, coord_addr, 1)
        self.part = sl.attach_sink(self.cli, self.model.arenas[self.rank], self.rank,
                                   self.replica)
        self.since = from_version

    def drop(self):
        """Its daemon died: the connection is gone with it."""
        if self.cli:
            try:
                self.cli.close()
            except Exception:
                pass
        self.cli = None
        self.part = None
        self.since = None

    def apply(self, version, timeout_ms=20000):
        got = self.cli.wait_staged(JOB, self.part, timeout_ms)
        if got < version:
            got = self.cli.wait_staged(JOB, self.part, timeout_ms)
        return self.cli.apply(JOB, self.part, version)

    def tensors(self):
        return self.model.weights(self.rank)

    def label(self):
        return "replica %d rank %d on %s" % (self.replica, self.rank, self.daemon.name)


def plan_pairs():
    """Plan entries per (source rank, sink rank) in plan order: their boxes
    (elements), from the same layout code the daemon uses (dtectl plan)."""
    cfg = os.path.join(os.environ.get("TMPDIR", "/tmp"), "cluster-sync-cfg-%d.json" % os.getpid())
    with open(cfg, "w") as f:
        f.write(sl.CFG_TEXT)
    import subprocess
    r = subprocess.run([os.path.join(B, "bin", "dtectl"), "plan", "--model", cfg, "--source",
                        sl.SRC_LAYOUT, "--sink", sl.SINK_LAYOUT, "--json", "--dump-entries"],
                       capture_output=True, text=True, check=True, env=child_env())
    os.unlink(cfg)
    pairs = {}
    for e in json.loads(r.stdout)["plan_entries"]:
        box = 1
        for x in e["extent"]:
            box *= x
        pairs.setdefault((e["src_rank"], e["sink_rank"]), []).append(box)
    return pairs


def misbehave(c, tmp, target, coord, ns_of, dev_of, sink, held, sources, epoch, pairs):
    """Forged records to `target` (a sink daemon) for `sink` (holding
    version `held`).  Returns nothing; records checks."""
    ns, dev = ns_of(target), dev_of(target)
    # Only sources with plan entries for this sink rank feed it.
    sources = [s for s in sources if (s["rank"], sink.rank) in pairs]
    n_for = {s["id"]: len(pairs[(s["rank"], sink.rank)]) for s in sources}

    def counts(version, base, src, cnt, payload_bytes=0, token=TOKEN, job=JOB):
        return ("counts job=%s token=%s epoch=%d version=%d base=%d mode=sparse src=%d dst=%d "
                "counts=%s payload_bytes=%d" % (job, token, epoch, version, base, src, sink.part,
                                                ",".join(str(x) for x in cnt), payload_bytes))

    before = target.log_text()
    # 1, 2: wrong token, unknown job: REFUSED comes back with the reason.
    rc, out = forge(target.address, [counts(held + 1, held, sources[0]["id"], [0], token="bad"),
                                     counts(held + 1, held, sources[0]["id"], [0], job="nojob")],
                    expect=2, netns=ns, dev=dev)
    refused = [x for x in out if x.startswith("recv REFUSED")]
    c.check(len(refused) == 2 and "reason=wrong token" in refused[0] and
            'unknown job "nojob"' in refused[1], "forged wrong token / unknown job refused: %s" %
            refused)
    # A JOIN from a daemon of another peer protocol, or of another model:
    # the coordinator refuses it with the reason, the job goes on.
    # (The forger greets as "oldpeer": a JOIN speaks for its sender only.)
    rc, out = forge(coord.address,
                    ["join job=%s token=%s node=oldpeer address=10.9.9.9:1 spec_hash=%d "
                     "peer_proto=%d" % (JOB, TOKEN, h, p)
                     for h, p in ((0, 1), (0, 0), (1, peer_proto_version()))],
                    node="oldpeer", expect=3, netns=ns_of(coord), dev=dev_of(coord))
    refused = [x for x in out if x.startswith("recv REFUSED")]
    c.check(len(refused) == 3 and "peer protocol 1;" in refused[0] and
            "peer protocol 0 (a dted from before" in refused[1] and "model spec" in refused[2],
            "forged JOINs of peer protocol 1 and 0, and of another model, refused: %s" % refused)
    # A LEAVE speaking for another node (the sink's) would drop its
    # participants: refused where it enters, the job goes on.
    rc, out = forge(coord.address, ["leave job=%s token=%s node=%s participants=%d" %
                                    (JOB, TOKEN, target.name, sink.part)],
                    expect=1, netns=ns_of(coord), dev=dev_of(coord))
    refused = [x for x in out if x.startswith("recv REFUSED")]
    c.check(len(refused) == 1 and 'speaks for node "%s"' % target.name in refused[0],
            "forged LEAVE for node %s refused: %s" % (target.name, refused))
    # A PLAN from a coordinator of another peer protocol: the member
    # rejects it with the reason (and keeps the plan it has).
    rc, out = forge(target.address, ["plan job=%s token=%s epoch=%d peer_proto=1" %
                                     (JOB, TOKEN, 1 << 40)], netns=ns, dev=dev)
    want = "rejected: the coordinator speaks peer protocol 1"
    t_end = time.time() + 5
    while want not in target.log_text() and time.time() < t_end:
        time.sleep(0.05)
    c.check(rc == 0 and want in target.log_text(),
            "forged PLAN of peer protocol 1 rejected by %s" % target.name)
    # 3: stale base: every source announces a sparse version on an old base.
    far = held + 1000
    recs = [counts(far, held - 3, s["id"], [0] * n_for[s["id"]]) for s in sources]
    rc, out = forge(target.address, recs, wait_ms=800, netns=ns, dev=dev)
    # 4: positions far outside the entry box; 5: a corrupted chunk.
    enc = os.path.join(tmp, "forged.bin")
    bad = os.path.join(tmp, "corrupt.bin")
    s0 = sources[0]["id"]
    for path, extra in ((enc, ""), (bad, " corrupt=40")):
        rc, out = forge(target.address, ["encode out=%s entries=2147483648 box=4294967296 chunk=0%s"
                                         % (path, extra)], wait_ms=1, netns=ns, dev=dev)
    size = os.path.getsize(enc)
    for version, path in ((held + 2000, enc), (held + 3000, bad)):
        recs = []
        for s in sources:
            cnt = [0] * n_for[s["id"]]
            if s["id"] == s0:
                cnt[0] = 1
            recs.append(counts(version, held, s["id"], cnt, size if s["id"] == s0 else 0))
        recs.append("payload job=%s token=%s epoch=%d version=%d src=%d dst=%d encoding=0 data=@%s"
                    % (JOB, TOKEN, epoch, version, s0, sink.part, path))
        rc, out = forge(target.address, recs, wait_ms=800, netns=ns, dev=dev)
        c.check(rc == 0, "forged version %d sent: %s" % (version, out[-1:]))
    deadline = time.time() + 5
    want = ["wrong token", 'unknown job \\"nojob\\"'.replace("\\", ""),
            "refuses version %d: sparse from" % far,
            "refuses version %d: entry 0:" % (held + 2000),
            "refuses version %d: source %x: payload corrupt" % (held + 3000, s0)]
    while time.time() < deadline:
        log = target.log_text()[len(before):]
        if all(w in log for w in want):
            break
        time.sleep(0.1)
    log = target.log_text()[len(before):]
    for w in want:
        c.check(w in log, "%s: logged '%s'" % (target.name, w))
    st = target.ctl("status", check=False)
    c.check(st.returncode == 0, "%s still serving after the forged records" % target.name)


def main():
    netns = "--netns" in sys.argv
    name = "cluster-sync-netns" if netns else "cluster-sync"
    c = Checks(name)
    if netns and not Netns.available():
        # The skip convention (HELPERS.md): exit 77 with the reason.
        print("SKIP: %s needs root and ip netns (euid %d)" % (name, os.geteuid()), flush=True)
        sys.exit(77)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    n_versions = 24 if netns else 50
    late_at = 10 if netns else 20
    kill_at = 14 if netns else 30
    forge_at = 18 if netns else 40
    work = Workdir("dte-cluster-")
    net = Netns(3) if netns else None
    daemons = []
    versions = exact_versions = 0
    ok = False
    try:
        if net:
            net.setup()
        names = ["coord", "sink1", "sink2"]
        for i, n in enumerate(names):
            # sync_mode = sparse: the checks below say which pairs go
            # sparse (dense for cost: tests/system/sync_mode.py).
            # The smallest part size: every dense version and most sparse
            # ones go as several PAYLOAD parts over UCX, before COUNTS.
            if net:
                d = Daemon(work.path, n, host=net.addrs[i], netns=net.names[i], dev=net.devs[i],
                           part_size="64K", sync_mode="sparse")
            else:
                d = Daemon(work.path, n, part_size="64K", sync_mode="sparse")
            daemons.append(d.start())
        coord, sink1, sink2 = daemons

        def ns_of(d):
            return d.netns

        def dev_of(d):
            return d.dev

        # The trainer's arenas laid out as the C generator's flat buffer.
        megatron.shard_shapes = getattr(sl, "flat_order_shapes", None) or \
            megatron.flat_buffer_shapes
        model = megatron.MegatronModel(sl.CFG, tp=TP, seed=0, label="cl-src")
        trainer = megatron.Trainer(model, lr=sl.LR, warmup=sl.WARMUP)
        task = toy.ToyTask(sl.CFG["vocab_size"])
        tcli = _lib.Client(coord.sock)
        c.check(tcli.job_create(JOB, sl.CFG_TEXT, TOKEN, "local", 1), "job created on coord")
        src_parts = []
        for r in range(TP):
            want = _lib.layout_buffers(sl.CFG_TEXT, sl.SRC_LAYOUT, _lib.SOURCE, r)
            ids = []
            for (bid, length, bname), kind in zip(want, ("param", "exp_avg", "exp_avg_sq")):
                a = model.arenas[r][kind]
                ids.append(tcli.register_fd(a.fd, 0, length, _lib.FP32, "%s r%d" % (kind, r)))
            src_parts.append(tcli.attach(JOB, TOKEN, _lib.SOURCE, sl.SRC_LAYOUT, r, ids))

        replicas = [sglang.SGLangModel(sl.CFG, tp=TP, label="cl-rep%d" % k) for k in range(3)]
        where = {0: (sink1, sink2), 1: (sink2, sink1), 2: (sink1, sink2)}
        sinks = [SinkRank(replicas[k], k, r, where[k][r]) for k in range(3) for r in range(TP)]
        for s in sinks:
            if s.replica < 2:
                s.attach(coord.address, 1)
        job = coord.ctl_json("job", JOB)
        c.check(job and job.get("complete") and len(job.get("participants", [])) == 2 + 4,
                "coordinator planned 2 sources + 4 sinks over 3 nodes")
        pairs = plan_pairs()

        t0 = time.time()
        step = 0
        csum_bad = []
        for v in range(1, n_versions + 1):
            step += 1
            rec = trainer.step(*task.batch_at(step))
            if v == late_at:
                for s in sinks:
                    if s.replica == 2:
                        s.attach(coord.address, v)
            if v == kill_at + 2:
                # sink2 comes back (new incarnation, new port) and its
                # sinks re-attach with the memory they had.
                sink2.start()
                for s in sinks:
                    if s.daemon is sink2 and s.cli is None:
                        s.attach(coord.address, v)
            infos = [tcli.publish(JOB, p, v, rec["step"], sl.groups_of(rec)) for p in src_parts]
            live = [s for s in sinks if s.cli is not None]
            for s in live:
                res = s.apply(v)
                if not res["checksum_ok"]:
                    csum_bad.append((v, s.label()))
            tcli.wait(JOB, v, 30000)
            want = sl.expected(model)
            good = True
            for s in live:
                bad = sl.exact(want[s.rank], s.tensors())
                if bad:
                    good = False
                    print("version %d %s differs: %s" % (v, s.label(), ", ".join(bad[:4])),
                          flush=True)
            versions += 1
            exact_versions += good
            dense, fed = sum(i["dense"] for i in infos), sum(i["sinks"] for i in infos)
            if v == 1:
                c.check(dense == fed, "version 1 dense to all (%d/%d)" % (dense, fed))
            if v in (late_at, kill_at + 2):
                c.check(0 < dense < fed, "v%d: dense only to the new sinks (%d of %d pairs)" %
                        (v, dense, fed))
            if v in (late_at + 1, kill_at + 1, kill_at + 3, n_versions):
                c.check(dense == 0, "v%d: every pair sparse (%d of %d dense)" % (v, dense, fed))
            if v == kill_at + 1:
                c.check(len(live) == 3, "v%d published with sink2's sinks gone (%d live)" %
                        (v, len(live)))
            if v == kill_at:
                sink2.kill()
                for s in sinks:
                    if s.daemon is sink2:
                        s.drop()
                # The coordinator notices (the kernel resets the sockets).
                end = time.time() + 10
                while time.time() < end:
                    p = coord.peer("sink2")
                    if p and p["state"] == "down":
                        break
                    time.sleep(0.05)
                p = coord.peer("sink2")
                c.check(p and p["state"] == "down", "coord sees sink2 down after SIGKILL: %s" % p)
            if v == forge_at:
                job1 = sink1.ctl_json("job", JOB)
                srcs = [x for x in job1["participants"] if x["role"] == "source"]
                victim = next(s for s in sinks if s.daemon is sink1 and s.replica == 0)
                misbehave(c, work.path, sink1, coord, ns_of, dev_of, victim, v, srcs,
                          job1["epoch"], pairs)
        elapsed = time.time() - t0
        c.check(not csum_bad, "every apply verified its checksum (failures: %s)" % csum_bad[:4])
        c.check(exact_versions == versions, "every version exact on every attached sink (%d/%d)"
                % (exact_versions, versions))
        hist = coord.ctl_json("history", JOB) or {}
        hv = hist.get("versions", [])
        c.check(len(hv) == n_versions, "history on coord has every version (%d)" % len(hv))
        c.check(any(x.get("mode") == "sparse" for x in hv), "sparse versions went over UCX")
        for d in (coord, sink1, sink2):
            p = d.ctl_json("peers") or {}
            up = [x["node"] for x in p.get("peers", []) if x["state"] == "up"]
            need = ["sink1", "sink2"] if d is coord else ["coord"]
            c.check(all(n in up for n in need), "%s: peers up %s" % (d.name, up))
        if net:
            pa = (coord.peer("sink1") or {}).get("address", "")
            c.check(pa.startswith("10.232."), "coord reaches sink1 over the veth (%s)" % pa)
        c.check((coord.ctl_json("peers") or {}).get("restarts") == 1,
                "coord's router saw sink2 come back as a new incarnation")
        pc = coord.peer("sink1")
        c.check(pc and pc["bytes_out"] > 0 and pc["msgs_in"] > 0,
                "dtectl peers counts traffic coord->sink1 (%s out, %s msgs in)" %
                (pc and pc["bytes_out"], pc and pc["msgs_in"]))
        st = coord.ctl_json("status") or {}
        c.check(st.get("peers") == 2, "dtectl status on coord: 2 peers up (%s)" % st.get("peers"))
        print("%d versions in %.1f s" % (n_versions, elapsed))
        for s in sinks:
            s.drop()
        tcli.close()
        trainer.close()
        ok = True
    finally:
        rcs = [d.stop() for d in daemons]
        if ok:
            c.check(all(r == 0 for r in rcs), "daemons exit cleanly (%s)" % rcs)
        if c.passed != c.total or not ok:
            for d in daemons:
                print("--- %s log (tail) ---\n%s" % (d.name, d.log_tail(25)))
        if net:
            net.close()
        work.close(keep=c.passed != c.total)
    print("%s-checks: checks=%d passed=%d (%.1fs)" % (name, c.total, c.passed,
                                                     time.time() - c.start))
    print("%s: versions=%d exact=%d/%d%s" % (name, versions, exact_versions, versions,
                                            "" if netns else " sinks=%d" % (3 * TP)), flush=True)
    sys.exit(0 if c.total and c.passed == c.total and exact_versions == versions else 1)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Peers that prove who they are (issue 30 item 7, peer protocol 5).

Two real daemons over UCX: "coord" (the job's coordinator, a Megatron
TP=2 trainer's sources) and "sinkd" (an SGLang TP=2 replica's sinks).  A
version in the middle of the run, a host that can reach both peer ports
but does not hold the job key (dte-peer-forge) sends COUNTS, PAYLOAD,
PLAN, STAGED, APPLIED, JOIN: sealed under a guessed token's key, with no
MAC at all, and with the real token in clear and no MAC (what a protocol-4
peer sent, and what anyone who saw one JOIN could replay).

- auth on (the default): every forged record is refused where it enters,
  with the reason sent back, counted in dted_refused_total{reason="auth"}
  and the job's `refused`; a record sealed under the real key passes the
  check and meets the sink's own checks (so the check tells the key, not
  just "a forge"); every version, the one in flight included, lands exact
  and verified on both sink ranks.
- auth off for the job (conf [peer] auth_off_jobs): the same records with
  the token in clear are NOT refused by the entry check (none counted as
  auth, the sink's own checks meet them): the MAC is what refuses them.
- REFUSED records are sealed too: a sink's attach pending on a coordinator
  that does not hold the job yet meets REFUSED records that do not verify
  under the job key (the coordinator's own `unknown job`, which it cannot
  seal, one under a guessed token's key, one with no MAC): none is acted
  on, each is counted as an auth refusal, and the attach lands once the
  coordinator holds the job.  A REFUSED sealed under the real key is
  acted on: a pending attach fails with its reason.
Final lines: `auth: forged=N refused=N`, `auth-off: forged=N refused=0` and
`auth-refusals: unverified=N acted_on=0 sealed_acted_on=1`.
"""

import os
import sys
import threading
import time

import harness  # sets ROOT and B, puts client/python on sys.path

B = harness.B

import cluster_sync_lib as csl  # noqa: E402

csl.asan_reexec([sys.executable] + sys.argv)

import torch  # noqa: E402

import sync_local as sl  # noqa: E402
from cluster_sync import SinkRank  # noqa: E402
from dte import _lib, megatron, sglang, toy  # noqa: E402
from dte.checks import Checks  # noqa: E402

JOB, TOKEN, TP = sl.JOB, sl.TOKEN, sl.TP
N_VERSIONS, FORGE_AT = 8, 4


def auth_refused(d):
    r = d.ctl("metrics", check=False)
    if r.returncode != 0:
        return None
    m = harness.parse_metrics(r.stdout)
    return sum(v for k, v in m.items()
               if k.startswith("dted_refused_total") and 'reason="auth"' in k)


def forged_records(held, epoch, src, dst, token, clear):
    """The records a host without the key sends (clear: the token in
    clear, no MAC), as (target, record) with target "sink" or "coord"."""
    extra = " auth=off" if clear else ""
    j = "job=%s token=%s%s" % (JOB, token, extra)
    return [
        ("sink", "counts %s epoch=%d version=%d base=%d mode=sparse src=%d dst=%d counts=0 "
                 "payload_bytes=0" % (j, epoch, held + 1, held, src, dst)),
        ("sink", "payload %s epoch=%d version=%d src=%d dst=%d encoding=0 part=0 first_entry=0 "
                 "part_entries=1" % (j, epoch, held + 1, src, dst)),
        ("sink", "plan %s epoch=%d" % (j, epoch + 1)),
        ("coord", "staged %s version=%d src=%d dst=%d" % (j, held + 1, src, dst)),
        ("coord", "applied %s version=%d dst=%d result=0 message=forged" % (j, held + 1, dst)),
        ("coord", "join %s node=forge address=10.9.9.9:1 spec_hash=1" % j),
    ]


def misbehave(c, coord, sink, held, auth):
    """Forge at both daemons; returns (forged, refused by the auth check)."""
    job = sink.ctl_json("job", JOB) or {}
    srcs = [x["id"] for x in job.get("participants", []) if x.get("role") == "source"]
    dsts = [x["id"] for x in job.get("participants", [])
            if x.get("role") == "sink" and x.get("local")]
    epoch = job.get("epoch", 0)
    a0 = (auth_refused(coord) or 0) + (auth_refused(sink) or 0)
    if auth:
        recs = (forged_records(held, epoch, srcs[0], dsts[0], "guessed-token", False) +
                forged_records(held, epoch, srcs[0], dsts[0], "", False) +
                forged_records(held, epoch, srcs[0], dsts[0], TOKEN, True))
    else:
        recs = forged_records(held, epoch, srcs[0], dsts[0], TOKEN, True)
    refused = 0
    for target in ("sink", "coord"):
        d = sink if target == "sink" else coord
        mine = [r for t, r in recs if t == target]
        rc, out = csl.forge(d.address, mine, expect=len(mine) if auth else 0,
                            wait_ms=30000 if auth else 800)  # leaves once answered
        c.check(rc == 0 or not auth, "forged records to %s sent: %s" % (d.name, out[-1:]))
        refused += sum(1 for x in out if x.startswith("recv REFUSED") and "MAC" in x)
    end = time.time() + 5
    while time.time() < end:
        a1 = (auth_refused(coord) or 0) + (auth_refused(sink) or 0)
        if not auth or a1 - a0 >= len(recs):
            break
        time.sleep(0.05)
    a1 = (auth_refused(coord) or 0) + (auth_refused(sink) or 0)
    if auth:
        c.check(refused == len(recs), "every forged record refused with the reason sent back "
                "(%d of %d)" % (refused, len(recs)))
        c.check(a1 - a0 == len(recs), "counted in dted_refused_total{reason=\"auth\"} (%d of %d)"
                % (a1 - a0, len(recs)))
        j1 = sink.ctl_json("job", JOB) or {}
        c.check(j1.get("refused", 0) >= job.get("refused", 0) + 4,
                "the sink's job counts them in refused (%s -> %s)" %
                (job.get("refused"), j1.get("refused")))
        c.check("refused by peer auth" in sink.log_text() and
                "refused by peer auth" in coord.log_text(), "refusals logged on both daemons")
        # A peer holding the key: its (malformed) COUNTS passes the check
        # and is refused by the sink's own checks, not by auth.
        far = held + 1000
        rc, out = csl.forge(sink.address, [
            "counts job=%s token=%s epoch=%d version=%d base=%d mode=sparse src=%d dst=%d "
            "counts=0 payload_bytes=0" % (JOB, TOKEN, epoch, far, held - 3, srcs[0], dsts[0])],
            wait_ms=800)
        want = "v%d malformed" % far
        end = time.time() + 5
        while want not in sink.log_text() and time.time() < end:
            time.sleep(0.05)
        c.check(want in sink.log_text(), "a record sealed with the real key passes the check "
                "(the sink's own checks meet it)")
        a2 = (auth_refused(coord) or 0) + (auth_refused(sink) or 0)
        c.check(a2 == a1, "...and is not counted as an auth refusal (%s -> %s)" % (a1, a2))
    else:
        c.check(refused == 0 and a1 == a0, "auth off: no forged record refused by the entry "
                "check (%d replies, %s counted)" % (refused, a1 - a0))
        want = "v%d malformed" % (held + 1)
        end = time.time() + 5
        while want not in sink.log_text() and time.time() < end:
            time.sleep(0.05)
        c.check(want in sink.log_text(), "auth off: the forged COUNTS got past the entry check "
                "(the sink's own checks met it)")
    return len(recs), refused


def scenario(c, auth):
    name = "auth" if auth else "auth-off"
    work = csl.Workdir("dte-auth-")
    conf = "" if auth else "auth_off_jobs = other-job, %s\n" % JOB
    coord = csl.Daemon(work.path, "coord", part_size="64K", sync_mode="sparse", peer_conf=conf)
    sinkd = csl.Daemon(work.path, "sinkd", part_size="64K", sync_mode="sparse", peer_conf=conf)
    daemons = [coord, sinkd]
    versions = exact = 0
    forged = refused = 0
    ok = False
    try:
        for d in daemons:
            d.start()
        megatron.shard_shapes = getattr(sl, "flat_order_shapes", None) or \
            megatron.flat_buffer_shapes
        model = megatron.MegatronModel(sl.CFG, tp=TP, seed=0, label="auth-src")
        trainer = megatron.Trainer(model, lr=sl.LR, warmup=sl.WARMUP)
        task = toy.ToyTask(sl.CFG["vocab_size"])
        tcli = _lib.Client(coord.sock)
        tcli.job_create(JOB, sl.CFG_TEXT, TOKEN, "local", 1)
        src_parts = sl.attach_sources(tcli, model)
        rep = sglang.SGLangModel(sl.CFG, tp=TP, label="auth-rep")
        sinks = [SinkRank(rep, 0, r, sinkd) for r in range(TP)]
        for s in sinks:
            s.attach(coord.address, 1)
        bad_csum = []
        for v in range(1, N_VERSIONS + 1):
            rec = trainer.step(*task.batch_at(v))
            for p in src_parts:
                tcli.publish(JOB, p, v, rec["step"], sl.groups_of(rec))
            if v == FORGE_AT:
                # While version v is in flight.
                forged, refused = misbehave(c, coord, sinkd, v - 1, auth)
            for s in sinks:
                res = s.apply(v)
                if not res["checksum_ok"]:
                    bad_csum.append(v)
            tcli.wait(JOB, v, 30000)
            want = sl.expected(model)
            good = True
            for s in sinks:
                diff = sl.exact(want[s.rank], s.tensors())
                if diff:
                    good = False
                    print("%s: version %d %s differs: %s" % (name, v, s.label(),
                                                            ", ".join(diff[:4])), flush=True)
            versions += 1
            exact += good
        c.check(not bad_csum, "%s: every apply verified (failures at %s)" % (name, bad_csum))
        c.check(exact == versions, "%s: every version exact on both sink ranks, the one in "
                "flight while forged included (%d/%d)" % (name, exact, versions))
        st = sinkd.ctl("status", check=False)
        c.check(st.returncode == 0, "%s: sinkd still serving" % name)
        for s in sinks:
            s.drop()
        tcli.close()
        trainer.close()
        ok = True
    finally:
        rcs = [d.stop() for d in daemons]
        if ok:
            c.check(all(r == 0 for r in rcs), "%s: daemons exit cleanly (%s)" % (name, rcs))
        if c.passed != c.total or not ok:
            for d in daemons:
                print("--- %s log (tail) ---\n%s" % (d.name, d.log_tail(25)))
        work.close(keep=c.passed != c.total)
    print("%s-sync: versions=%d exact=%d/%d" % (name, versions, exact, versions), flush=True)
    return forged, refused


def attach_pending(cli, job, model, out):
    """sl.attach_sink for job `job`, in a thread: out gets "part" or "err"."""
    def run():
        want = _lib.layout_buffers(sl.CFG_TEXT, sl.SINK_LAYOUT, _lib.SINK, 0)
        try:
            ids = [cli.register_fd(model.arenas[0].loc(n).fd, model.arenas[0].loc(n).offset,
                                   length, _lib.BF16, n) for _b, length, n in want]
            out["part"] = cli.attach(job, TOKEN, _lib.SINK, sl.SINK_LAYOUT, 0, ids, replica=0)
        except Exception as e:  # the attach's answer, checked by the caller
            out["err"] = str(e)
    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def wait_until(cond, secs):
    end = time.time() + secs
    while not cond() and time.time() < end:
        time.sleep(0.05)
    return cond()


def refusals(c):
    """REFUSED records: only one that verifies under the job key is acted
    on.  Returns (unverified refusals seen, of them acted on, sealed ones
    acted on)."""
    work = csl.Workdir("dte-auth-refused-")
    coord = csl.Daemon(work.path, "coord", sync_mode="sparse")
    sinkd = csl.Daemon(work.path, "sinkd", sync_mode="sparse")
    daemons = [coord, sinkd]
    unverified = acted = sealed_acted = 0
    ok = False
    try:
        for d in daemons:
            d.start()
        rep = sglang.SGLangModel(sl.CFG, tp=TP, label="refused-rep")
        scli = _lib.Client(sinkd.sock)
        # The coordinator does not hold the job yet: it answers the JOIN
        # with REFUSED "unknown job", which it cannot seal.
        scli.job_create(JOB, sl.CFG_TEXT, TOKEN, coord.address, 1)
        a0 = auth_refused(sinkd) or 0
        res = {}
        th = attach_pending(scli, JOB, rep, res)
        c.check(wait_until(lambda: "not acted on" in sinkd.log_text(), 10),
                "the coordinator's unsealed REFUSED (unknown job) is not acted on")
        # The forger's link may fail before its records are out (once, under
        # load: "Endpoint timeout" 5 ms after it came up, nothing delivered):
        # it sends again, at most three times; each copy is refused alike.
        for _try in range(3):
            rc, out = csl.forge(sinkd.address, [
                "refused job=%s token=guessed-token reason=forged-guessed-key" % JOB,
                "refused job=%s token= reason=forged-no-mac" % JOB], wait_ms=300)
            seen = wait_until(lambda: "forged-no-mac" in sinkd.log_text() and
                              "forged-guessed-key" in sinkd.log_text(), 10)
            if seen:
                break
        c.check(rc == 0, "forged REFUSED records sent: %s" % out[-1:])
        c.check(seen, "both forged REFUSED records logged as not acted on")
        a1 = auth_refused(sinkd) or 0
        unverified = a1 - a0
        c.check(unverified >= 3, "counted as auth refusals on sinkd (%d)" % unverified)
        acted = int("err" in res)
        c.check(th.is_alive() and not acted, "the pending attach stands after %d unverified "
                "refusals (%s)" % (unverified, res))
        # The job appears at the coordinator: the JOIN's retry lands.
        ccli = _lib.Client(coord.sock)
        ccli.job_create(JOB, sl.CFG_TEXT, TOKEN, "local", 1)
        th.join(30)
        c.check("part" in res, "the attach lands once the coordinator holds the job (%s)" % res)
        # A REFUSED sealed under the real key is acted on.
        job2 = JOB + "-2"
        scli.job_create(job2, sl.CFG_TEXT, TOKEN, coord.address, 1)
        res2 = {}
        th2 = attach_pending(scli, job2, rep, res2)
        wait_until(lambda: sinkd.log_text().count("not acted on") >= 3, 10)
        for _try in range(3):  # as above: a forger's link that failed sends again
            rc, out = csl.forge(sinkd.address, ["refused job=%s token=%s reason=sealed-refusal" %
                                                (job2, TOKEN)], wait_ms=300)
            th2.join(10)
            if not th2.is_alive():
                break
        sealed_acted = int("sealed-refusal" in res2.get("err", ""))
        c.check(sealed_acted == 1, "a REFUSED sealed under the job key fails the pending attach "
                "with its reason (%s)" % res2)
        c.check(sinkd.ctl("status", check=False).returncode == 0, "sinkd still serving")
        scli.close()
        ccli.close()
        ok = True
    finally:
        rcs = [d.stop() for d in daemons]
        if ok:
            c.check(all(r == 0 for r in rcs), "refusals: daemons exit cleanly (%s)" % (rcs,))
        if c.passed != c.total or not ok:
            for d in daemons:
                print("--- %s log (tail) ---\n%s" % (d.name, d.log_tail(25)))
        work.close(keep=c.passed != c.total)
    return unverified, acted, sealed_acted


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    c = Checks("peer-auth")
    forged, refused = scenario(c, True)
    off_forged, off_refused = scenario(c, False)
    unverified, acted, sealed_acted = refusals(c)
    print("peer-auth: checks=%d passed=%d (%.1fs)" % (c.total, c.passed, time.time() - c.start))
    print("auth: forged=%d refused=%d" % (forged, refused))
    print("auth-off: forged=%d refused=%d" % (off_forged, off_refused))
    print("auth-refusals: unverified=%d acted_on=%d sealed_acted_on=%d" %
          (unverified, acted, sealed_acted), flush=True)
    sys.exit(0 if c.total and c.passed == c.total and forged > 0 and refused == forged and
             unverified > 0 and not acted and sealed_acted else 1)


if __name__ == "__main__":
    main()

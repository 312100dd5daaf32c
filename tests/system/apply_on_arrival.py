#!/usr/bin/python3
"""Apply on arrival with undo (docs/SYNC.md, "Apply on arrival").

One dted (the test build, DTE_TEST_HOOK=wrong-value@WRONG_AT): a Megatron
TP=2 trainer publishes, an SGLang TP=2 sink whose two ranks each wait in
wait_staged (on a connection of their own, in a thread) *before* every
publish, so each sink is parked at its safe point when the version's
records arrive and its parts are swapped into the buffers as they come.

- Versions 2..WRONG_AT-1 (sparse): every sink rank is bit-exact after
  apply, and the daemon's dted_apply_on_arrival_total counters prove the
  on-arrival path ran (parts swapped in, versions staged in place) rather
  than staging.
- Version WRONG_AT: the hook flips one value of one rank's payload after
  its checks, so that rank's version fails its checksum once every part is
  swapped in (each pair's version is one part here: the part that fails is
  its last).  It must be undone: that rank's buffers bit-for-bit what they
  were before WRONG_AT was published, its wait_staged sees nothing staged,
  the undo is counted; the other rank applies WRONG_AT exactly.
- Version WRONG_AT+1 repairs (dense): every rank exact.
"""

import shutil
import tempfile
import threading
import time

import harness  # sets ROOT and B, puts client/python on sys.path
from harness import groups_of  # noqa: E402

harness.asan_preload_reexec("DTE_SYNC_ASAN")

import torch  # noqa: E402

import sync_local as sl  # noqa: E402
from dte import _lib, megatron, sglang, toy  # noqa: E402
from dte.checks import Checks  # noqa: E402

WRONG_AT = 6
WAIT_MS = 4000


def metrics(sock):
    r = harness.dtectl(sock, "metrics", check=False)
    if r.returncode != 0:
        raise RuntimeError("dtectl metrics failed (rc %d): %s" % (r.returncode, r.stderr))
    return harness.parse_metrics(r.stdout)


arrival = harness.arrival_count


def wait_for(what, pred, deadline_s):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.01)
    raise RuntimeError("timed out after %.1f s waiting for %s" % (deadline_s, what))


def bits(tensors):
    return {k: t.clone().view(torch.int16) for k, t in tensors.items()}


def same_bits(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def main():
    c = Checks("apply-on-arrival")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="dte-arrival-")
    daemon = harness.Daemon(tmp, "arrival", hook="wrong-value@%d" % WRONG_AT)
    try:
        sock = daemon.start().sock
        model = megatron.MegatronModel(sl.CFG, tp=sl.TP, seed=0, label="arrival-src",
                                       placement=sl.SRC_LAYOUT)
        trainer = megatron.Trainer(model, lr=sl.LR, warmup=sl.WARMUP)
        task = toy.ToyTask(sl.CFG["vocab_size"])
        tcli = _lib.Client(sock)
        tcli.job_create(sl.JOB, sl.CFG_TEXT, sl.TOKEN, "local", 1)
        src_parts = sl.attach_sources(tcli, model)
        # One connection per sink rank: each waits in wait_staged on its own.
        sink = sglang.SGLangModel(sl.CFG, tp=sl.TP, label="arrival-sink",
                                  placement=sl.SINK_LAYOUT)
        clis = [_lib.Client(sock) for _ in range(sl.TP)]
        parts = [sl.attach_sink(clis[r], sink.arenas[r], r, 0) for r in range(sl.TP)]
        version = 0

        def publish(parked):
            """Publish the next version with every sink rank parked (when
            parked) in wait_staged; returns per rank the version its wait
            saw (None: nothing staged in time)."""
            nonlocal version
            version += 1
            got = [None] * sl.TP
            threads = []
            if parked:
                base = metrics(sock).get("dted_sinks_parked", 0.0)

                def waiter(r):
                    try:
                        got[r] = clis[r].wait_staged(sl.JOB, parts[r], WAIT_MS)
                    except _lib.DteError:
                        got[r] = None
                for r in range(sl.TP):
                    t = threading.Thread(target=waiter, args=(r,))
                    t.start()
                    threads.append(t)
                wait_for("both sink ranks parked",
                         lambda: metrics(sock).get("dted_sinks_parked", 0.0) >= base + sl.TP, 10)
            rec = trainer.step(*task.batch_at(version))
            for p in src_parts:
                tcli.publish(sl.JOB, p, version, rec["step"], groups_of(rec))
            for t in threads:
                t.join()
            if not parked:
                for r in range(sl.TP):
                    got[r] = clis[r].wait_staged(sl.JOB, parts[r], 20000)
            return got

        def apply_all(got):
            return [clis[r].apply(sl.JOB, parts[r], got[r]) if got[r] else None
                    for r in range(sl.TP)]

        def exact_ranks():
            want = sl.expected(model)
            return [not sl.exact(want[r], sink.weights(r)) for r in range(sl.TP)]

        # 1: dense, staged as usual (nothing to undo onto yet is fine too).
        got = publish(parked=False)
        apply_all(got)
        c.check(all(exact_ranks()), "version 1 (dense) exact on every rank")

        m0 = metrics(sock)
        ok_versions = 0
        for _ in range(2, WRONG_AT):
            got = publish(parked=True)
            out = apply_all(got)
            if all(g == version for g in got) and all(o and o["checksum_ok"] for o in out) \
                    and all(exact_ranks()):
                ok_versions += 1
        m1 = metrics(sock)
        n = WRONG_AT - 2
        c.check(ok_versions == n, "versions 2..%d applied on arrival: staged, applied, bit-exact "
                "on every rank (%d of %d)" % (WRONG_AT - 1, ok_versions, n))
        parts_in = arrival(m1, "part") - arrival(m0, "part")
        versions_in = arrival(m1, "version") - arrival(m0, "version")
        c.check(versions_in == n * sl.TP and parts_in >= n * sl.TP,
                "the on-arrival path ran: %d versions staged in place, %d parts swapped in "
                "(want %d versions)" % (versions_in, parts_in, n * sl.TP))
        c.check(arrival(m1, "undo") == 0 and arrival(m1, "retreat") == arrival(m0, "retreat"),
                "nothing undone or retreated while every version was good")

        # WRONG_AT: one rank's payload carries a wrong value.
        before = [bits(sink.weights(r)) for r in range(sl.TP)]
        got = publish(parked=True)
        m2 = metrics(sock)
        text = daemon.log_text()
        c.check("test hook: wrong-value: version %d" % WRONG_AT in text,
                "the hook flipped a value of version %d" % WRONG_AT)
        c.check("applied on arrival fails" in text, "the daemon logged the on-arrival failure")
        bad = [r for r in range(sl.TP) if got[r] is None]
        good = [r for r in range(sl.TP) if got[r] == version]
        c.check(len(bad) == 1 and len(good) == sl.TP - 1,
                "version %d: one rank refused it (nothing staged), the other staged it "
                "(waits saw %s)" % (version, got))
        c.check(arrival(m2, "undo") - arrival(m1, "undo") == 1,
                "one version undone (undo counter %d -> %d)" % (arrival(m1, "undo"),
                                                              arrival(m2, "undo")))
        c.check(bad and same_bits(before[bad[0]], bits(sink.weights(bad[0]))),
                "the failed rank's memory is bit-for-bit the previous version after the undo")
        apply_all(got)
        ex = exact_ranks()
        c.check(good and all(ex[r] for r in good), "the other rank applied version %d exactly"
                % version)

        # WRONG_AT+1 repairs the failed pair densely; every rank exact.
        got = publish(parked=True)
        apply_all(got)
        c.check(all(g == version for g in got) and all(exact_ranks()),
                "version %d repairs: every rank exact (waits saw %s)" % (version, got))
        m3 = metrics(sock)
        print("apply-on-arrival: versions=%d parts_on_arrival=%d versions_in_place=%d undone=%d "
              "retreated=%d" % (version, arrival(m3, "part"), arrival(m3, "version"),
                                arrival(m3, "undo"), arrival(m3, "retreat")), flush=True)
    finally:
        rc = daemon.stop(10)
        c.check(rc == 0, "dted exits cleanly (status %s)" % rc)
        if c.passed != c.total:
            print("--- dted log (tail) ---\n" + daemon.log_tail(40))
        shutil.rmtree(tmp, ignore_errors=True)
    c.finish()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""A write skipped inside the apply: caught by the sink's own check, undone.

One dted (the test build) with DTE_TEST_HOOK=skip-write@SKIP_AT: a
Megatron TP=2 trainer publishes, an SGLang TP=2 sink applies every version
(docs/SYNC.md step 5, "Host writes are swaps" and "A failed check is
undone").

- Versions 1..SKIP_AT-1: dense, then sparse, verified and exact.
- Version SKIP_AT (sparse, onto a verified state: the incremental check):
  rank 0's apply (the hook fires once per version; rank 1 applies its part
  cleanly) of its first sparse entry leaves one element on its old value
  after the write.  The apply's own delta says it was written; the check,
  which reads the memory back, must fail: the apply answers checksum_ok
  false with the version before, the source's wait fails, and the sink's
  memory is the version before bit for bit (every write undone), also
  when read again after the failure, and `query_version` says so.
- Version SKIP_AT+1 is the dense repair, exact; later versions sparse and
  exact.
"""

import shutil
import tempfile

import harness  # sets ROOT and B, puts client/python on sys.path
from harness import groups_of  # noqa: E402

harness.asan_preload_reexec("DTE_SYNC_ASAN")

import torch  # noqa: E402

import sync_local as sl  # noqa: E402
from dte import _lib, megatron, toy  # noqa: E402
from dte.checks import Checks  # noqa: E402

SKIP_AT = 4
VERSIONS = 7


def snapshot(sink):
    return [{k: t.clone() for k, t in sink.tensors(r).items()} for r in range(sl.TP)]


def same_bits(a, b, ranks=range(sl.TP)):
    """Names of tensors whose bits differ (BF16 compared as int16)."""
    bad = []
    for r in ranks:
        for k, t in a[r].items():
            if not torch.equal(t.view(torch.int16), b[r][k].view(torch.int16)):
                bad.append("rank %d %s" % (r, k))
    return bad


def main():
    c = Checks("skip-write")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="dte-skip-write-")
    daemon = harness.Daemon(tmp, "skip-write", hook="skip-write@%d" % SKIP_AT)
    version = 0
    exact = 0
    try:
        sock = daemon.start().sock
        model = megatron.MegatronModel(sl.CFG, tp=sl.TP, seed=0, label="skip-src",
                                       placement=sl.SRC_LAYOUT)
        trainer = megatron.Trainer(model, lr=sl.LR, warmup=sl.WARMUP)
        task = toy.ToyTask(sl.CFG["vocab_size"])
        tcli = _lib.Client(sock)
        tcli.job_create(sl.JOB, sl.CFG_TEXT, sl.TOKEN, "local", 1)
        src_parts = sl.attach_sources(tcli, model)
        sink = sl.Replica(c, sock, 0, "skip-sink")

        def log_has(text):
            return text in daemon.log_text()

        def publish():
            nonlocal version
            version += 1
            rec = trainer.step(*task.batch_at(version))
            infos = [tcli.publish(sl.JOB, p, version, rec["step"], groups_of(rec))
                     for p in src_parts]
            out = sink.step()
            try:
                tcli.wait(sl.JOB, version, 30000)
                waited = True
            except _lib.DteError:
                waited = False
            return infos, out, waited

        before = None
        for _ in range(VERSIONS):
            if version + 1 == SKIP_AT:
                before = snapshot(sink)
            infos, out, waited = publish()
            dense = any(i["dense"] > 0 for i in infos)
            want = sl.expected(model)
            diff = [m for r in range(sl.TP) for m in sl.exact(want[r], sink.tensors(r))]
            if version != SKIP_AT:
                good = all(r["checksum_ok"] and r["version"] == version for r in out)
                c.check(good and waited and not diff and dense == (version in (1, SKIP_AT + 1)),
                        "version %d: %s, verified, exact (%s)" %
                        (version, "dense" if dense else "sparse", diff[:2]))
                exact += not diff
                continue
            c.check(not dense, "version %d sparse" % version)
            c.check(log_has("test hook: skip-write: version %d" % version),
                    "the hook skipped a write of version %d" % version)
            c.check(not out[0]["checksum_ok"] and out[0]["version"] == version - 1 and
                    out[0]["applied"] == 0,
                    "the sink's own check caught it: apply answered %s" % out[0])
            c.check(log_has("(incremental); dense repair requested; undone: the sink holds "
                            "version %d" % (version - 1)),
                    "the incremental check (read back) caught it and undid the apply")
            c.check(not waited, "the source's wait(%d) fails" % version)
            # The hook fires once per version: rank 0's apply (the first)
            # loses a write; rank 1 applies its part cleanly.
            bad = same_bits(before, snapshot(sink), [0])
            c.check(not bad, "rank 0 holds version %d bit for bit (%s)" % (version - 1, bad[:3]))
            c.check(out[1]["checksum_ok"] and not sl.exact(want[1], sink.tensors(1)),
                    "rank 1: version %d, verified, exact" % version)
            applied = [sink.cli.query_version(sl.JOB, p)[0] for p in sink.parts]
            c.check(applied[0] == version - 1, "query_version: applied %s" % applied)
            again = sink.cli.apply(sl.JOB, sink.parts[0], version)
            c.check(not again["checksum_ok"] and again["version"] == version - 1,
                    "apply(%d) again: still failed, nothing written (%s)" % (version, again))
            c.check(not same_bits(before, snapshot(sink), [0]), "still version %d" % (version - 1))
        c.check(daemon.running(), "daemon alive")
        print("skip-write: caught=1 undone=1 exact %d/%d" % (exact, version))
        tcli.close()
        trainer.close()
    finally:
        rc = daemon.stop(10)
        c.check(rc == 0, "dted exits cleanly (status %s)" % rc)
        if c.passed != c.total:
            print("--- dted log (tail) ---\n" + daemon.log_tail(40))
        shutil.rmtree(tmp, ignore_errors=True)
    c.finish(versions=version)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""A sink's apply verification, incremental and full (docs/SYNC.md).

One dted with verify_full_every = 4 and DTE_TEST_HOOK=wrong-value@6: a
Megatron TP=2 trainer publishes, an SGLang TP=2 sink applies every version.

- Version 6 carries a well-formed payload with one wrong value (the hook
  flips it after the staging checks); it is applied onto a verified state,
  so the incremental check (old sum + the apply's deltas) must catch it:
  checksum failure, "(incremental)" in the log, dense repair at 7, exact.
- Then a sink element is changed outside any apply.  Incremental checks
  cannot see that (only the elements an apply writes are read); the
  periodic full pass must, within verify_full_every versions, and the
  sink is repaired densely and exact again.
- The same corruption once more, caught at once by `dtectl verify` (a full
  pass on demand), then repaired by the next (dense) version.
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

FULL_EVERY = 4
WRONG_AT = 6
ROW = "model.layers.0.self_attn.o_proj.weight"


def main():
    c = Checks("sync-verify")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="dte-sync-verify-")
    daemon = harness.Daemon(tmp, "sync-verify", hook="wrong-value@%d" % WRONG_AT,
                            verify_full_every=FULL_EVERY)
    exact = 0
    version = 0
    try:
        sock = daemon.start().sock
        model = megatron.MegatronModel(sl.CFG, tp=sl.TP, seed=0, label="verify-src",
                                       placement=sl.SRC_LAYOUT)
        trainer = megatron.Trainer(model, lr=sl.LR, warmup=sl.WARMUP)
        task = toy.ToyTask(sl.CFG["vocab_size"])
        tcli = _lib.Client(sock)
        tcli.job_create(sl.JOB, sl.CFG_TEXT, sl.TOKEN, "local", 1)
        src_parts = sl.attach_sources(tcli, model)
        sink = sl.Replica(c, sock, 0, "verify-sink")
        results = {}

        def publish():
            nonlocal version, exact
            version += 1
            rec = trainer.step(*task.batch_at(version))
            infos = [tcli.publish(sl.JOB, p, version, rec["step"], groups_of(rec))
                     for p in src_parts]
            out = sink.step()
            try:
                tcli.wait(sl.JOB, version, 30000)
            except _lib.DteError:
                pass   # a failed checksum: the version after it repairs
            ok = all(r["checksum_ok"] for r in out)
            want = sl.expected(model)
            same = all(not sl.exact(want[r], sink.tensors(r)) for r in range(sl.TP))
            exact += same
            results[version] = (ok, same, any(i["dense"] > 0 for i in infos))
            return ok, same

        def log_has(text):
            return text in daemon.log_text()

        # 1 dense (full pass), 2..5 sparse (incremental, then the periodic
        # full pass), 6 the wrong value, 7 the repair.
        for _ in range(WRONG_AT - 1):
            publish()
        c.check(all(results[v][0] and results[v][1] for v in results),
                "versions 1..%d verified and exact" % (WRONG_AT - 1))
        c.check(not any(results[v][2] for v in range(2, WRONG_AT)),
                "versions 2..%d sparse" % (WRONG_AT - 1))
        ok, same = publish()
        c.check(log_has("test hook: wrong-value"), "the hook flipped a staged value")
        c.check(not ok and not same, "version %d: the wrong value is applied and its checksum "
                "fails" % WRONG_AT)
        c.check(log_has("(incremental); dense repair requested"),
                "the incremental check caught it (not a full pass)")
        ok, same = publish()
        c.check(ok and same and results[version][2], "version %d: dense repair, exact" % version)

        # Outside any apply: one element of a sink buffer.  An incremental
        # check sees it only if an apply happens to write that element (it
        # reads the old value from the buffer); otherwise the periodic full
        # pass must, within verify_full_every versions.  Trials until one
        # is caught by the full pass (each is ~1/3 likely to be written
        # first at this toy model's change rate).
        caught_by = []
        for trial in range(10):
            publish()
            w = sink.tensors(0)[ROW]
            w[trial % w.shape[0]][trial].fill_(1234.0)
            mark = len(daemon.log_text())
            caught = None
            for _ in range(FULL_EVERY):
                ok, same = publish()
                if not ok:
                    caught = version
                    break
            tail = daemon.log_text()[mark:]
            kind = ("full" if "(full pass); dense repair requested" in tail else
                    "incremental" if "(incremental); dense repair requested" in tail else None)
            caught_by.append(kind if caught else None)
            ok, same = publish()
            if not (ok and same and results[version][2]) or not caught or kind == "full":
                break
        c.check(all(caught_by), "every corruption outside an apply caught within %d versions (%s)"
                % (FULL_EVERY, caught_by))
        c.check("full" in caught_by, "the periodic full pass caught one (%s)" % caught_by)
        c.check(ok and same and results[version][2], "version %d: dense repair, exact" % version)

        # Once more, found at once by a forced full pass.
        publish()
        w = sink.tensors(0)[ROW]
        w[1].fill_(-77.0)
        v = harness.dtectl(sock, "verify", sl.JOB)
        c.check("mismatch: 1" in v.stdout,
                "dtectl verify finds the corruption at once: %s" %
                v.stdout.replace("\n", " ")[:160])
        ok, same = publish()
        c.check(ok and same and results[version][2],
                "after verify: version %d dense, exact" % version)
        # Both kinds of check ran and are counted for operators.
        mt = harness.dtectl(sock, "metrics").stdout
        kinds = {}
        for line in mt.splitlines():
            if line.startswith("dted_apply_verifications_total{"):
                kinds[line.split('"')[1]] = float(line.split()[-1])
        c.check(kinds.get("incremental", 0) >= 1 and kinds.get("full", 0) >= 1,
                "metrics count incremental and full checks: %s" % kinds)
        c.check(daemon.running(), "daemon alive")
        print("sync-verify: outside-apply corruptions caught by %s; exact %d/%d" %
              (caught_by, exact, version))
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

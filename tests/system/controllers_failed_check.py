#!/usr/bin/python3
"""A failed check, seen through the engine controllers (docs/SYNC.md "A
failed check is undone"; issue 30 item 2, the controllers' part).

One dted (the test build) with DTE_TEST_HOOK=skip-write@4/1: from
version 4 on, the daemon's first apply of each version (once per version,
one participant: whichever engine worker commits first) puts one element
of its first sparse entry back on its old value; the sink's own check
reads the memory back, fails, undoes the apply (the participant holds v-1
from its staged old values) and asks for a dense repair at v+1.  A
trainer (Megatron TP=1, real AdamW, as tests/system/engines.py) publishes
to four engines built from the upstream call paths
(tests/system/engines_fake.py), each attached as engines.py does:

  C  vLLM AsyncLLM, TP=2, VLLMController       (replica 0)
  S  SGLang server, TP=2, FP32 norms
     (--rl-on-policy-target), SGLangController (replica 1)
  E  vLLM AsyncLLM, TP=1                       (replica 2)
  T  SGLang server, TP=1, FP32 norms           (replica 3)

They are hit in that order, one per version from v4: the engine to be hit
syncs first, so the hook's apply is one of its workers'.  A skip that
changes nothing (seen at some versions: the check then rightly passes and
the engine is exact, so the element must have held that value already) is
reported and the same engine is hit again
at the next version.  After the last hit, its dense repair syncs first (the
hook's skip needs a sparse entry: a no-op there) and that final version is
clean everywhere.

At a version v the hook hits, the engine it targets syncs first (so the
hook's one apply is one of its workers') and:
  * the sync raises SyncError; the report names the worker, and says it
    is a checksum failure (vLLM: the worker's commit error; SGLang: the
    daemon's checksum_failures for that worker); the trainer's wait(v)
    fails;
  * the failed worker's parameters (every one, the FP32-widened norms
    included) are RNE-BF16(θ_{v-1}) bit for bit through the independent
    converter (tests/system/sglang_reference.py); at TP=2 the other worker
    is on v exactly;
  * TP=2 (workers disagree): reported as split, the engine stays paused
    (no resume/continue call during the sync; C.paused / S.is_pause);
    TP=1 (every worker on v-1): not split, resumed on v-1;
  * `dtectl --json job` says which version each worker holds (v-1 on the
    failed one, with a checksum failure counted, v on the others);
  * v+1 (the dense repair) applies on every worker of every engine,
    exactly, and generation resumes.
Every resume/continue any engine ever gets is recorded with the workers'
parameters at that moment: all of them must be one version exactly (the
one the test expects), so no engine ever serves weights mixed across
versions.  Engines not hit sync every version normally, exactly.
"""

import asyncio
import json
import shutil
import tempfile

import harness  # sets ROOT and B, puts client/python on sys.path

# engines.py (imported below) uses the same guard: one re-exec at most.
harness.asan_preload_reexec("DTE_ENGINES_ASAN")

import torch  # noqa: E402

from dte import megatron, toy, _lib  # noqa: E402
from dte.checks import Checks  # noqa: E402
from dte.integrations import sglang as dsg, vllm as dvl  # noqa: E402
from dte.integrations._engine import SyncError  # noqa: E402

import engines as eng  # noqa: E402  (CFG, the trainer's source, compare)
import engines_fake as fake  # noqa: E402
import sglang_reference as ref  # noqa: E402

FIRST = 4
MAX_VERSIONS = 20
HOOK = "skip-write@%d/1" % FIRST
JOB, TOKEN, CFG, CFG_TEXT = eng.JOB, eng.TOKEN, eng.CFG, eng.CFG_TEXT


class Engine:
    """One fake engine, its controller, what the test expects of it, and
    every resume it got (with the workers' parameters at that moment)."""

    def __init__(self, name, kind, tp, replica, obj, ctl):
        self.name, self.kind, self.tp, self.replica = name, kind, tp, replica
        self.obj, self.ctl = obj, ctl
        self.fail_at = None        # the version whose check failed on it
        self.resumes = []          # (version synced, [per-rank {name: tensor}])
        self.at = {r: 0 for r in range(tp)}   # the version each worker must hold
        self.syncing = 0
        if kind == "vllm":
            orig = obj.resume_generation

            async def resumed():
                self.resumes.append((self.syncing, obj.weights()))
                await orig()
            obj.resume_generation = resumed
        else:
            orig = obj.handle

            def handle(method, path, body):
                if path.split("?")[0] == "/continue_generation":
                    self.resumes.append((self.syncing, eng.sglang_weights(obj)))
                return orig(method, path, body)
            obj.handle = handle     # the HTTP handler calls srv.handle

    def weights(self):
        return eng.sglang_weights(self.obj) if self.kind == "sglang" else self.obj.weights()

    def paused(self):
        return self.obj.is_pause if self.kind == "sglang" else self.obj.paused

    def sync(self, v):
        self.syncing = v
        try:
            if self.kind == "vllm":
                return asyncio.run(self.ctl.sync_async(v)), False
            return self.ctl.sync(v), False
        except SyncError as e:
            return e.report, True


def versions_of(expected, got, tp):
    """Per rank, the versions whose expectation the rank equals bit for bit."""
    return [{u for u in expected if not eng.compare(expected[u][tp][r], g)}
            for r, g in enumerate(got)]


def daemon_view(sock):
    """harness.sink_versions of this test's job."""
    return harness.sink_versions(sock, JOB)


def main():
    c = Checks("controllers-failed-check")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="dte-ctl-failed-")
    daemon = harness.Daemon(tmp, "ctl-failed-check", peer_listen=False, hook=HOOK)
    sock = daemon.sock
    objs = []
    engines = []
    held, repaired = [], []

    def log_has(text):
        return text in daemon.log_since()

    try:
        daemon.start()
        model = megatron.MegatronModel(CFG, tp=1, seed=0, label="ctlfail-src",
                                       placement=eng.SRC_LAYOUT)
        trainer = megatron.Trainer(model, lr=eng.LR, warmup=eng.WARMUP)
        task = toy.ToyTask(CFG["vocab_size"])
        tcli, src = eng.source(c, sock, model)

        C = fake.FakeAsyncLLM(CFG, 2)
        objs.append(C)
        S = fake.FakeSGLangServer(CFG, 2, tmp, "S", fp32_norms=True)
        objs.append(S)
        E = fake.FakeAsyncLLM(CFG, 1)
        objs.append(E)
        T = fake.FakeSGLangServer(CFG, 1, tmp, "T", fp32_norms=True)
        objs.append(T)
        kw = dict(socket=sock, timeout_s=60)
        engines = [
            Engine("C", "vllm", 2, 0, C,
                   dvl.VLLMController(C, JOB, TOKEN, CFG_TEXT, replica=0, **kw)),
            Engine("S", "sglang", 2, 1, S,
                   dsg.SGLangController(S.url, JOB, TOKEN, CFG_TEXT, replica=1, **kw)),
            Engine("E", "vllm", 1, 2, E,
                   dvl.VLLMController(E, JOB, TOKEN, CFG_TEXT, replica=2, **kw)),
            Engine("T", "sglang", 1, 3, T,
                   dsg.SGLangController(T.url, JOB, TOKEN, CFG_TEXT, replica=3, **kw)),
        ]
        for e in engines:
            if e.kind == "vllm":
                ok = all(r["ok"] for r in asyncio.run(e.ctl.attach_async()))
            else:
                ok = sorted(e.ctl.attach()) == list(range(e.tp))
            c.check(ok, "%s (%s TP=%d): every worker attached" % (e.name, e.kind, e.tp))

        expected = {}
        queue = list(engines)      # engines still to be hit, in this order
        noops = []                 # (version, engine): the hook's skip changed nothing
        v = 0
        while v < MAX_VERSIONS:
            # Done after the last hit engine's repair (the version after its hit).
            if not queue and max(e.fail_at for e in engines) != v:
                break
            v += 1
            rec = trainer.step(*task.batch_at(v))
            for p in src:
                tcli.publish(JOB, p, v, rec["step"], harness.groups_of(rec))
            theta = [{n: p.detach().clone() for n, p in ps.items()} for ps in model.params]
            expected[v] = {tp: [{n: t.view(torch.bfloat16) for n, t in rank.items()}
                                for rank in ref.expected_sink(theta, CFG, model.tp, tp)]
                           for tp in (1, 2)}
            # From FIRST on the hook fires at every version, on the
            # daemon's first apply of it: the engine to be hit next syncs
            # first.  Once every engine was hit, the last one's dense
            # repair goes first: its apply takes the hook (which skips a
            # write of a sparse entry only: a no-op there) and the final
            # version is clean everywhere.
            target = queue[0] if queue and v >= FIRST else None
            first = target or next((e for e in engines if e.fail_at == v - 1), None)
            order = ([first] if first else []) + [e for e in engines if e is not first]
            for e in order:
                nres = len(e.resumes)
                rep, raised = e.sync(v)
                if e is target and rep.ok and not raised and \
                        not log_has("undone: the sink holds version %d" % (v - 1)):
                    # The skip changed nothing (its element held that
                    # value already): nothing to catch.  Checked exact and
                    # served as any clean version; hit it again next.
                    noops.append((v, e.name))
                    target = None
                if e is not target:
                    for r in e.at:
                        e.at[r] = v
                    c.check(rep.ok and not raised and not e.paused() and
                            len(e.resumes) == nres + 1,
                            "v%d %s: %s" % (v, e.name, rep.summary()))
                    if e.fail_at == v - 1:
                        repaired.append(e.name)
                    continue
                # --- the failed check, as the controller saw and handled it ---
                e.fail_at = v
                queue.pop(0)
                c.check(log_has("test hook: skip-write: version %d" % v),
                        "v%d %s: the hook skipped one write of version %d" % (v, e.name, v))
                c.check(log_has("dense repair requested; undone: the sink holds version %d"
                                % (v - 1)),
                        "v%d %s: the daemon's check failed and undid the apply (v%d held)"
                        % (v, e.name, v - 1))
                c.check(raised and not rep.ok, "v%d %s: the sync raised SyncError (%s)"
                        % (v, e.name, rep.summary()))
                c.check(len(rep.failed) == 1, "v%d %s: exactly one worker reported failed: %s"
                        % (v, e.name, rep.failed))
                f = min(rep.failed) if rep.failed else 0
                why = str(rep.failed.get(f))
                if e.kind == "vllm":
                    named = "checksum" in why and ("[%d]" % f) in why
                else:
                    named = ("holds version %d" % (v - 1)) in why and \
                        "checksum failures" in why and \
                        rep.workers.get(f, {}).get("checksum_failures", 0) >= 1
                c.check(named, "v%d %s: the report names rank %s and its checksum failure "
                        "(%s; daemon %s)" % (v, e.name, f, why, rep.workers.get(f)))
                got = e.weights()
                at = versions_of(expected, got, e.tp)
                for r in range(e.tp):
                    e.at[r] = v - 1 if r == f else v
                c.check(at[f] == {v - 1}, "v%d %s: the failed rank %s holds RNE-BF16(θ_%d) "
                        "bit for bit, FP32 norms included (matches %s)"
                        % (v, e.name, f, v - 1, sorted(at[f])))
                if e.kind == "sglang":
                    c.check(all(t.dtype == torch.float32 for n, t in got[f].items()
                                if n.endswith("norm.weight")),
                            "v%d %s: its norms are FP32 (widened) parameters" % (v, e.name))
                others = [r for r in range(e.tp) if r != f]
                c.check(all(at[r] == {v} for r in others),
                        "v%d %s: the other ranks %s hold v%d exactly (%s)"
                        % (v, e.name, others, v, [sorted(at[r]) for r in others]))
                if e.tp > 1:
                    c.check(rep.split and len(e.resumes) == nres and e.paused() and
                            not any(a in ("resumed", "continued") for a in rep.actions),
                            "v%d %s: workers disagree: split, the engine stays paused (%s)"
                            % (v, e.name, rep.summary()))
                else:
                    c.check(not rep.split and not e.paused() and len(e.resumes) == nres + 1 and
                            any(a in ("resumed", "continued") for a in rep.actions),
                            "v%d %s: every worker on v%d: not split, resumed on v%d (%s)"
                            % (v, e.name, v - 1, v - 1, rep.summary()))
                dv = daemon_view(sock)
                want = {(e.replica, r): e.at[r] for r in range(e.tp)}
                have = {k: dv.get(k, (None,))[0] for k in want}
                c.check(have == want and dv.get((e.replica, f), (0, 0, 0))[2] >= 1,
                        "v%d %s: dtectl job: workers hold %s (want %s), rank %s counts a "
                        "checksum failure (%s)" % (v, e.name, have, want, f,
                                                   dv.get((e.replica, f))))
                held.append((e.name, v, v - 1))
            try:
                tcli.wait(JOB, v, 30000)
                waited = True
            except _lib.DteError as ex:
                waited = False
                why = str(ex)
            hit = target is not None
            c.check(waited != hit, "v%d: the trainer's wait %s%s" % (
                v, "failed" if not waited else "succeeded", " (%s)" % why if not waited else ""))
            # Every worker of every engine, exactly where it must be.
            for e in engines:
                at = versions_of(expected, e.weights(), e.tp)
                c.check(all(e.at[r] in at[r] for r in range(e.tp)),
                        "v%d %s: every worker exact (want %s, matches %s)"
                        % (v, e.name, e.at, [sorted(a) for a in at]))
        # No engine ever resumed on weights mixed across versions: at every
        # resume every worker held one version, the one synced (or, after
        # an undone TP=1 apply, the one before).
        for e in engines:
            bad = []
            for sv, got in e.resumes:
                at = versions_of(expected, got, e.tp)
                want = sv - 1 if sv == e.fail_at else sv
                if not all(want in a for a in at):
                    bad.append((sv, [sorted(a) for a in at]))
            c.check(not bad and len(e.resumes) == v - (e.tp > 1),
                    "%s: %d resumes, each on one version, never a mixed one (%s)"
                    % (e.name, len(e.resumes), bad[:3]))
        dv = daemon_view(sock)
        c.check(not queue and all(dv.get((e.replica, r), (0,))[0] == v for e in engines
                                  for r in range(e.tp)),
                "every engine hit (%s), then dtectl job: every worker on v%d (%s)"
                % (" ".join("%s@%s" % (e.name, e.fail_at) for e in engines), v, dv))
        if noops:
            print("controllers-failed-check: the hook's skip was a no-op at %s (retried)"
                  % ", ".join("v%d on %s" % x for x in noops), flush=True)
        c.check(daemon.running(), "daemon alive")
        c.check(sorted(repaired) == sorted(e.name for e in engines),
                "every hit engine repaired at the next version: %s" % repaired)
        tcli.close()
        trainer.close()
    finally:
        for o in objs:
            try:
                o.stop()
            except Exception as ex:
                print("stop: %s" % ex)
        rc = daemon.stop()
        daemon.close()
        c.check(rc == 0, "dted exits cleanly (status %s)" % rc)
        if c.passed != c.total:
            print("--- dted log (tail; all of it in %s) ---\n%s" % (daemon.logpath,
                                                               daemon.log_tail(40)))
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    for name, fv, hv in held:
        e = next(x for x in engines if x.name == name)
        print("controllers-failed-check: %s %s tp=%d failed_at=%d held=%d split=%s" % (
            name, e.kind, e.tp, fv, hv, "yes" if e.tp > 1 else "no"), flush=True)
    print("controllers-failed-check: engines=%d failed_at=%s held=%s exact_after_repair=%s" % (
        len(engines), ",".join(str(v) for _n, v, _h in held),
        ",".join(str(h) for _n, _v, h in held),
        "yes" if c.passed == c.total and len(repaired) == len(engines) else "no"), flush=True)
    c.finish(versions=v)


if __name__ == "__main__":
    main()

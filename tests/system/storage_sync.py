#!/usr/bin/python3
"""Cross-cluster sync through a shared directory, with real daemons
(docs/STORAGE.md, DESIGN §5).

Group A: one dted (coordinator, storage writer) and a Megatron TP=2 trainer
running real torch AdamW in shm.  Group B: one dted with SGLang TP=2 sinks
reading the same directory.  The groups share only that directory: no UCX
between them, neither knows the other's address.  After every version each
sink element must be bit-identical to RNE(θ_t) through the independent
Python converter (dte.sglang.hf_to_sglang).

Then: the writer killed with SIGKILL half way through a chunk and half way
through a manifest (DTE_STORAGE_HOOK): readers apply nothing partial and
the next version is exact; a corrupted chunk byte, a truncated manifest and
a deleted chunk are refused with a reason (daemon log, dtectl job/history)
and repaired from a requested keyframe; group C joins after 30 versions and
starts exact from a keyframe.
"""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

import harness  # sets ROOT and B, puts client/python on sys.path
from harness import B, groups_of  # noqa: E402  (groups_of: also for importers)

harness.asan_preload_reexec("DTE_STORAGE_ASAN")

import torch  # noqa: E402

from dte import _lib, megatron, qwen3, sglang, toy  # noqa: E402
from dte.checks import Checks  # noqa: E402

JOB, TOKEN = "qwen-store", "s3cret"
CFG = qwen3.make_config(None, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                        vocab_size=512)
CFG_TEXT = json.dumps(CFG)
TP = 2
SRC_LAYOUT, SINK_LAYOUT = "megatron:tp=2", "sglang:tp=2"
LR, WARMUP = 1e-5, 5
KEYFRAME_EVERY, KEEP, KEEP_KEYS = 10, 12, 2


def Daemon(tmp, name, env=None, dted=None):
    """One group's dted (the fixture, harness.Daemon: tmp/<name>.{conf,sock,
    log}), serving when it returns; env: more variables (DTE_STORAGE_HOOK,
    DTE_TEST_HOOK), dted: the program (default $B/bin/dted)."""
    return harness.Daemon(tmp, name, env=env, binary=dted).start()


def exit_ok(d, rc):
    """Killed on purpose: the kill landed (-9).  Otherwise: exit 0."""
    return rc == -signal.SIGKILL if d.killed else (rc == 0 and not d.hung)


def exit_label(d, rc):
    return "%s=%s%s" % (d.name, rc, " (killed by the test)" if d.killed else
                        " (hung on SIGTERM, SIGKILLed)" if d.hung else "")


class Writer:
    """Group A's trainer attached to one writer daemon."""

    def __init__(self, model, daemon, store):
        self.d = daemon
        self.cli = _lib.Client(daemon.sock)
        self.cli.job_create(JOB, CFG_TEXT, TOKEN, "local", 1, transport="storage",
                            storage_root=store, keyframe_every=KEYFRAME_EVERY,
                            keep_versions=KEEP, keep_keyframes=KEEP_KEYS)
        self.parts = []
        for r in range(TP):
            want = _lib.layout_buffers(CFG_TEXT, SRC_LAYOUT, _lib.SOURCE, r)
            ids = []
            for (_bid, length, _n), kind in zip(want, ("param", "exp_avg", "exp_avg_sq")):
                a = model.arenas[r][kind]
                ids.append(self.cli.register_fd(a.fd, 0, length, _lib.FP32, "%s r%d" % (kind, r)))
            self.parts.append(self.cli.attach(JOB, TOKEN, _lib.SOURCE, SRC_LAYOUT, r, ids))

    def publish(self, version, rec, wait=True):
        for p in self.parts:
            self.cli.publish(JOB, p, version, rec["step"], groups_of(rec))
        if wait:
            self.cli.wait(JOB, version, 30000)

    def close(self):
        try:
            self.cli.close()
        except Exception:
            pass


class Readers:
    """A group of one daemon with SGLang TP=2 sinks on a reader job."""

    def __init__(self, daemon, store, label):
        self.d = daemon
        self.model = sglang.SGLangModel(CFG, tp=TP, label=label, placement=SINK_LAYOUT)
        self.cli = _lib.Client(daemon.sock)
        self.cli.job_create(JOB, CFG_TEXT, TOKEN, "local", 1, transport="storage",
                            storage_root=store, storage_role="reader")
        self.parts = []
        for r in range(TP):
            ids = []
            for _bid, length, name in _lib.layout_buffers(CFG_TEXT, SINK_LAYOUT, _lib.SINK, r):
                loc = self.model.arenas[r].loc(name)
                ids.append(self.cli.register_fd(loc.fd, loc.offset, length, _lib.BF16, name))
            self.parts.append(self.cli.attach(JOB, TOKEN, _lib.SINK, SINK_LAYOUT, r, ids))
        self.applied = 0
        self.failures = 0

    def catch_up(self, version, timeout=20.0):
        """Apply what the daemon stages until every rank holds `version`."""
        end = time.time() + timeout
        held = [0] * TP
        while min(held) < version and time.time() < end:
            for i, p in enumerate(self.parts):
                try:
                    v = self.cli.wait_staged(JOB, p, 200)
                except _lib.DteError as e:
                    if e.code == _lib.ERR_TIMEOUT:
                        continue
                    raise
                r = self.cli.apply(JOB, p, v)
                held[i] = r["version"]
                self.failures += not r["checksum_ok"]
        self.applied = min(held)
        return self.applied

    def nothing_staged(self, ms=300):
        for p in self.parts:
            try:
                v = self.cli.wait_staged(JOB, p, ms)
                return v
            except _lib.DteError as e:
                if e.code != _lib.ERR_TIMEOUT:
                    raise
        return None

    def tensors(self, r):
        return self.model.weights(r)


def expected(model):
    return harness.expected_sglang(model, CFG, TP)


def exact(want, grp):
    bad = []
    for r in range(TP):
        bad += harness.mismatches(want[r], grp.tensors(r), "rank %d " % r)
    return bad


def until(get, ok, timeout=5.0):
    """Poll get() until ok(value) or the deadline; the last value either
    way (the caller's check fails on it), and a line saying it timed out."""
    end = time.time() + timeout
    x = get()
    while not ok(x):
        if time.time() >= end:
            print("timed out after %.1f s waiting; last value: %.300s" % (timeout, x), flush=True)
            break
        time.sleep(0.02)
        x = get()
    return x


def storage_ls(store):
    r = subprocess.run([os.path.join(B, "bin", "dte-storage"), "ls", store, JOB, "--json"],
                       capture_output=True, text=True)
    return json.loads(r.stdout) if r.returncode == 0 else {}


def held_reads(c, start, w, publish_next, verify, state, tmp, store):
    release = os.path.join(tmp, "read-release")
    first = state["version"] + 1
    d = start("grp-d", {"DTE_TEST_HOOK": "storage-read-stall@%d/1" % first,
                        "DTE_TEST_HOOK_RELEASE": release}, dted=harness.DTED_FAULTS)
    c.check(d.wait_log("test hook armed: storage-read-stall"), "group D runs the test build "
            "with storage-read-stall@%d/1 armed" % first)
    grp = Readers(d, store, "sink-d")
    v = state["version"]
    grp.catch_up(v)
    c.check(verify(grp, v, "group D"), "group D exact at v%d" % v)

    def head():
        return int(json.loads(d.ctl("--json", "job", JOB, timeout=5, check=False).stdout or "{}")
                   .get("storage_head", -2))

    # The read of `first` is held on the worker (the hook wrote its marker
    # and the reader's position stays before it).
    v = publish_next(w)
    held = until(lambda: os.path.exists(release + ".held.%d" % v), bool, timeout=20)
    lat, heads = [], []
    for _ in range(20):
        t0 = time.monotonic()
        try:
            ok = d.ctl("status", timeout=5, check=False).returncode == 0
            heads.append(head())
        except subprocess.TimeoutExpired:
            ok = False
        lat.append((time.monotonic() - t0) * 1000 if ok else float("inf"))
    lat.sort()
    c.check(held and not os.path.exists(release), "the read of v%d is held on its worker" % v)
    c.check(lat[-1] < 1000 and heads == [v - 1] * len(lat),
            "while it is held: dtectl status + job answered %d/%d times, p50 %.0f ms, max %.0f "
            "ms; reader head %s (want v%d)" % (sum(x != float("inf") for x in lat), len(lat),
                                               lat[len(lat) // 2], lat[-1],
                                               sorted(set(heads)), v - 1))
    print("storage-read-held: status_job_p50_ms=%.1f max_ms=%.1f samples=%d" % (
        lat[len(lat) // 2], lat[-1], len(lat)), flush=True)
    open(release, "w").close()
    grp.catch_up(v)
    c.check(verify(grp, v, "group D after the held read") and
            until(head, lambda x: x == v) == v, "released: v%d applied exact, head v%d" % (v, v))

    # The next read is held too: SIGTERM then waits for it (the shutdown
    # drain), and the daemon exits 0 once it is let go.
    v = publish_next(w)
    held = until(lambda: os.path.exists(release + ".held.%d" % v), bool, timeout=20)
    grp.cli.close()
    d.proc.send_signal(signal.SIGTERM)
    waiting = d.wait_log("shutdown: waiting for", timeout=15)
    alive = d.proc.poll() is None
    open(release, "w").close()
    try:
        rc = d.proc.wait(20)
    except subprocess.TimeoutExpired:
        rc = None
    c.check(held and waiting and alive and rc == 0,
            "SIGTERM with the read of v%d held: held=%s, shutdown waited for it=%s (alive=%s), "
            "exit %s once let go" % (v, held, waiting, alive, rc))


def main():
    c = Checks("storage-sync")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="dte-storage-sync-")
    store = os.path.join(tmp, "shared")
    os.makedirs(store)
    jobdir = os.path.join(store, JOB)
    daemons = []
    state = {"versions": 0, "exact": 0, "version": 0, "step": 0}
    wants = {}
    bpe = ratio = 0.0

    model = megatron.MegatronModel(CFG, tp=TP, seed=0, label="store-src", placement=SRC_LAYOUT)
    trainer = megatron.Trainer(model, lr=LR, warmup=WARMUP)
    task = toy.ToyTask(CFG["vocab_size"])

    def start(name, env=None, dted=None):
        d = Daemon(tmp, name, env, dted)
        daemons.append(d)
        return d

    def train():
        state["step"] += 1
        return trainer.step(*task.batch_at(state["step"]))

    def verify(grp, version, tag):
        bad = exact(wants[version], grp)
        state["versions"] += 1
        state["exact"] += not bad
        if bad:
            print("v%d %s differs: %s" % (version, tag, ", ".join(bad[:4])), flush=True)
        return not bad

    def publish_next(w, wait=True):
        state["version"] += 1
        v = state["version"]
        rec = train()
        w.publish(v, rec, wait)
        wants[v] = expected(model)
        return v

    a = start("grp-a")
    w = Writer(model, a, store)
    b = start("grp-b")
    rb = Readers(b, store, "sink-b")
    try:
        # 1. Two groups sharing only a directory.
        for _ in range(20):
            v = publish_next(w)
            rb.catch_up(v)
            verify(rb, v, "group B")
        c.check(state["exact"] == state["versions"] == 20, "20 versions exact at group B")
        j = until(lambda: json.loads(b.ctl("--json", "job", JOB, check=False).stdout or "{}"),
                  lambda j: int(j.get("storage_head", -1)) == 20)
        c.check(j.get("transport") == "storage" and j.get("storage_role") == "reader" and
                int(j.get("storage_head", -1)) == 20, "dtectl job on B: reader at v20 (%s)" %
                {k: j.get(k) for k in ("transport", "storage_role", "storage_head")})
        c.check(not a.ctl("peers").stdout.count("grp-b") and not b.ctl("peers").stdout.count("grp-a"),
                "the groups never talked to each other")

        # 2. Writer killed half way through a chunk, then a manifest.
        w.close()
        a.kill()
        for hook in ("chunk", "manifest"):
            a = start("grp-a", {"DTE_STORAGE_HOOK": hook + "-pause"}, dted=harness.DTED_FAULTS)
            w = Writer(model, a, store)
            v = state["version"] + 1
            rec = train()
            w.publish(v, rec, wait=False)
            paused = a.wait_log("paused in " + hook)
            # The commit runs on a worker thread: with it stuck in the
            # middle of a file, the daemon still answers at once.
            t0 = time.time()
            try:
                r = a.ctl("--json", "job", JOB, timeout=5, check=False)
                j = json.loads(r.stdout or "{}")
            except subprocess.TimeoutExpired:
                r, j = None, {}
            c.check(r is not None and r.returncode == 0 and
                    int(j.get("storage_head", -1)) == state["version"],
                    "paused in a %s: dtectl job answered in %.2f s, storage head v%s" % (
                        hook, time.time() - t0, j.get("storage_head")))
            w.close()
            a.kill()
            c.check(paused, "writer paused half way through a %s of v%d" % (hook, v))
            c.check(not os.path.exists(os.path.join(jobdir, "v%d.manifest" % v)),
                    "killed in a %s: v%d never committed" % (hook, v))
            c.check(rb.nothing_staged() is None, "killed in a %s: readers stage nothing" % hook)
            c.check(not exact(wants[state["version"]], rb), "readers still hold v%d intact" %
                    state["version"])
            # The trainer moved on; the next writer publishes its state as v.
        # SIGTERM while a commit is on the worker (held 2 s half way through
        # its first chunk): dted waits for it, the version lands whole and
        # the daemon exits cleanly.
        a = start("grp-a", {"DTE_STORAGE_HOOK": "chunk-slow"}, dted=harness.DTED_FAULTS)
        w = Writer(model, a, store)
        v = state["version"] + 1
        rec = train()
        w.publish(v, rec, wait=False)
        slowed = a.wait_log("slowed in chunk")
        w.close()
        rc = a.stop()
        c.check(slowed and rc == 0 and os.path.exists(os.path.join(jobdir, "v%d.manifest" % v)),
                "SIGTERM during a commit of v%d: slowed=%s exit=%s, manifest %s" % (
                    v, slowed, rc, os.path.exists(os.path.join(jobdir, "v%d.manifest" % v))))
        state["version"] = v
        wants[v] = expected(model)
        a = start("grp-a")
        w = Writer(model, a, store)
        for _ in range(5):
            v = publish_next(w)
            rb.catch_up(v)
            c.check(verify(rb, v, "after kills"), "v%d exact after the writer kills" % v)

        # 3. Corruption: refused with a reason, repaired from a keyframe.
        def corrupt_chunk(ver):
            d = os.path.join(jobdir, "v%d" % ver)
            f = sorted(x for x in os.listdir(d) if x.startswith("d"))[0]
            with open(os.path.join(d, f), "r+b") as fh:
                fh.seek(os.path.getsize(os.path.join(d, f)) // 2)
                byte = fh.read(1)
                fh.seek(-1, 1)
                fh.write(bytes([byte[0] ^ 0x40]))

        def truncate_manifest(ver):
            p = os.path.join(jobdir, "v%d.manifest" % ver)
            os.truncate(p, os.path.getsize(p) // 2)

        def delete_chunk(ver):
            d = os.path.join(jobdir, "v%d" % ver)
            os.unlink(os.path.join(d, sorted(x for x in os.listdir(d) if x.startswith("d"))[0]))

        for what, harm, reason in (("corrupted chunk byte", corrupt_chunk, "checksum"),
                                   ("truncated manifest", truncate_manifest, "manifest"),
                                   ("deleted chunk", delete_chunk, "chunk")):
            before = json.loads(b.ctl("--json", "job", JOB, check=False).stdout or "{}")
            # Group B holds v-1 staged, so it cannot read v before the harm.
            prev = publish_next(w)
            v = publish_next(w)
            harm(v)
            rb.catch_up(prev)
            verify(rb, prev, what)
            # The reader refuses v on its next look at the directory: wait
            # for the refusal to be counted (the count must then be exact).
            broken0 = int(before.get("storage_broken", 0))
            after = until(lambda: b.ctl_json("job", JOB, check=False) or {},
                          lambda j: int(j.get("storage_broken", 0)) > broken0, timeout=20)
            err = after.get("storage_error", "")
            c.check(int(after.get("storage_broken", 0)) == int(before.get("storage_broken", 0)) + 1
                    and reason in err.lower(), "%s of v%d refused: %s" % (what, v, err))
            c.check(rb.nothing_staged(100) is None, "%s: nothing of v%d staged" % (what, v))
            r = a.ctl("storage", "keyframe", JOB, check=False)    # the daemon knows the root
            c.check(r.returncode == 0, "keyframe requested: %s%s" % (r.stdout.strip(), r.stderr))
            v = publish_next(w)
            c.check(storage_ls(store).get("versions", [{}])[-1].get("kind") == "keyframe",
                    "v%d is the requested keyframe" % v)
            rb.catch_up(v)
            c.check(verify(rb, v, what + " repaired"), "%s: repaired at keyframe v%d, exact" % (
                what, v))
        h = json.loads(b.ctl("--json", "history", JOB).stdout or "{}").get("versions", [])
        notes = [x.get("note", "") for x in h if x.get("note", "").startswith("refused")]
        c.check(len(notes) == 3, "dtectl history on B names the 3 refusals: %s" % notes)
        log = b.log_text()
        c.check(log.count("storage version refused") == 3, "B's log names the 3 refusals")

        # 4. Group C joins after 30 versions and starts from a keyframe.
        while state["version"] < 31:
            v = publish_next(w)
            rb.catch_up(v)
            verify(rb, v, "group B")
        cd = start("grp-c")
        rc = Readers(cd, store, "sink-c")
        v = state["version"]
        rc.catch_up(v)
        c.check(verify(rc, v, "group C"), "late group C exact at v%d" % v)
        hc = json.loads(cd.ctl("--json", "history", JOB).stdout or "{}").get("versions", [])
        c.check(hc and hc[0].get("note", "").startswith("keyframe"),
                "group C started from keyframe %s" % (hc[0].get("note") if hc else None))
        while state["version"] < 52:
            v = publish_next(w)
            rb.catch_up(v)
            rc.catch_up(v)
            verify(rb, v, "group B")
            verify(rc, v, "group C")
        c.check(rb.failures == 0 and rc.failures == 0, "no sink checksum failures (%d, %d)" % (
            rb.failures, rc.failures))

        # 5. Retention and what operators see.
        ls = until(lambda: storage_ls(store), lambda ls: all(
            r["version"] == state["version"] for r in ls.get("readers", [])))
        vs = [x for x in ls.get("versions", []) if x.get("ok")]
        c.check(vs and vs[0]["version"] > 1 and len(vs) <= KEEP + KEYFRAME_EVERY + 2,
                "retention keeps %d versions from v%d" % (len(vs), vs[0]["version"] if vs else -1))
        readers = {r["name"]: r["version"] for r in ls.get("readers", [])}
        c.check(readers.get("grp-b") == state["version"] and readers.get("grp-c") == state["version"],
                "readers' positions registered: %s" % readers)
        r = b.ctl("storage", "ls", JOB, check=False)
        c.check(r.returncode == 0 and ("v%d" % state["version"]) in r.stdout and "grp-c" in r.stdout,
                "dtectl storage ls JOB on a reader daemon: %s" % (r.stdout + r.stderr)[-300:])
        r = a.ctl("storage", "gc", JOB, "--keep", str(KEEP), "--keep-keyframes", str(KEEP_KEYS))
        c.check(r.returncode == 0 and "gc: floor=" in r.stdout, "dtectl storage gc JOB: %s" % (
            r.stdout + r.stderr).strip())
        ja = json.loads(a.ctl("--json", "job", JOB, check=False).stdout or "{}")
        c.check(ja.get("storage_role") == "writer" and int(ja.get("storage_head", -1)) ==
                state["version"], "dtectl job on A: writer head v%s" % ja.get("storage_head"))
        deltas = [x for x in vs if x.get("changed")]
        changed = sum(x["changed"] for x in deltas)
        dbytes = sum(x["delta_bytes"] for x in deltas)
        keys = [x for x in vs if x.get("kind") == "keyframe"]
        bpe = dbytes / changed if changed else 0
        ratio = (dbytes / len(deltas)) / (sum(x["keyframe_bytes"] for x in keys) / len(keys)) \
            if deltas and keys else 0
        c.check(0 < bpe < 4, "bytes per changed element %.3f" % bpe)
        c.check(state["exact"] == state["versions"] and state["versions"] >= 50,
                "every version exact (%d/%d)" % (state["exact"], state["versions"]))

        # 6. A reader's heavy steps (reading, unpacking, checking and staging
        # a version) run on a worker: with a read held there
        # (storage-read-stall, test build only) the daemon answers dtectl at
        # once, and a SIGTERM waits for the read to come back.
        held_reads(c, start, w, publish_next, verify, state, tmp, store)
        w.close()
    finally:
        # Every daemon the test started: the ones it SIGKILLed on purpose
        # died of that kill, every other one exited 0 on SIGTERM.
        rcs = [d.stop() for d in daemons]
        bad = [d for d, x in zip(daemons, rcs) if not exit_ok(d, x)]
        c.check(rcs and not bad, "all %d daemons exit as they should (%s)" % (
            len(rcs), ", ".join(exit_label(d, x) for d, x in zip(daemons, rcs))))
        c.check(not any(d.sanitizer_reports() for d in daemons),
                "no sanitizer report in any daemon log")
        if c.passed != c.total:
            for d in bad + [d for d in daemons[-3:] if d not in bad]:
                print("--- %s log (tail) ---\n%s" % (d.name, d.log_tail(25)))
        trainer.close()
    shutil.rmtree(tmp, ignore_errors=True)
    print("storage: versions=%d exact=%d/%d bytes_per_changed_element=%.3f sparse_vs_dense=%.4f" % (
        state["versions"], state["exact"], state["versions"], bpe, ratio))
    c.finish(versions=state["versions"])


if __name__ == "__main__":
    main()

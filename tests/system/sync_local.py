#!/usr/bin/python3
"""Same-cluster sync inside one dted (docs/SYNC.md), end to end.

A trainer (Megatron-Core TP=2, two source ranks, FP32 θ/m/v in memfds laid
out exactly as the C generator expects) runs real torch AdamW steps and
publishes every version through a real dted; sinks (SGLang TP=2: replica 0
in this process, replica 1 in a child process that is SIGKILLed and
restarted, replica 2 attaching at version 20) apply every version.  After
each version every sink element must be bit-identical to RNE(θ_t) mapped
through the independent Python converter (dte.sglang.hf_to_sglang).
At version 28 a buffer of replica 0 is corrupted (its checksum fails, so
wait(28) fails) while the restarted child's rank 1 is held on 27 for
HOLD_S: wait(28) must answer only after that rank applied 28, and replica
1 must then hold 28 exactly (a failure answered before every sink settled
once let this test read 27 there under load: issue 30).
Phases: K=1, K=4 with marks (sparse, exact), K=4 without marks (dense,
exact), then bad input (wrong token, unknown job, out-of-range and
unsealed registrations, another client's buffer) must be refused with a
clear error while the daemon keeps serving.

DTE_DETECT=snapshot runs every phase with the job option detect = snapshot
(the sources diff against the BF16 values they last captured instead of
inverting AdamW): the same exactness on every sink, every version.
"""

import json
import mmap
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading

import harness  # sets ROOT and B, puts client/python on sys.path
from harness import ROOT, groups_of  # noqa: E402  (groups_of: also for importers)

DETECT = os.environ.get("DTE_DETECT") or None
harness.asan_preload_reexec("DTE_SYNC_ASAN")

import torch  # noqa: E402

from dte import _lib, megatron, qwen3, sglang, toy  # noqa: E402
from dte.checks import Checks  # noqa: E402
from dte.shm import Arena  # noqa: E402

JOB, TOKEN = "qwen-sync", "s3cret"
CFG = qwen3.make_config(None, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                        vocab_size=512)
CFG_TEXT = json.dumps(CFG)
TP = 2
SRC_LAYOUT, SINK_LAYOUT = "megatron:tp=2", "sglang:tp=2"
LR, WARMUP = 1e-5, 5
HOLD_S = 2.0    # publish(held=): how long a sink rank is kept from the version


# ---------------------------------------------------------------- trainer
# Kept for cluster_sync.py, isolation.py and tests/faults, which install it
# as dte.megatron.shard_shapes; this test places tensors with placement=.
flat_order_shapes = megatron.flat_buffer_shapes


# ------------------------------------------------------------------ sinks
class Replica:
    """SGLang TP=2 sink replica in this process."""

    def __init__(self, c, sock, replica, label):
        self.replica = replica
        self.model = sglang.SGLangModel(CFG, tp=TP, label=label, placement=SINK_LAYOUT)
        self.cli = _lib.Client(sock)
        self.parts = []
        for r in range(TP):
            self.parts.append(attach_sink(self.cli, self.model.arenas[r], r, replica))

    def step(self, timeout_ms=20000):
        out = []
        for p in self.parts:
            v = self.cli.wait_staged(JOB, p, timeout_ms)
            out.append(self.cli.apply(JOB, p, v))
        self.last = out
        return out

    def tensors(self, r):
        return self.model.weights(r)


def attach_sink(cli, arena, rank, replica):
    want = _lib.layout_buffers(CFG_TEXT, SINK_LAYOUT, _lib.SINK, rank)
    ids = []
    for _bid, length, name in want:
        loc = arena.loc(name)
        assert loc.nbytes == 2 * length, "%s: arena %d bytes, layout %d elements" % (
            name, loc.nbytes, length)
        ids.append(cli.register_fd(loc.fd, loc.offset, length, _lib.BF16, name))
    return cli.attach(JOB, TOKEN, _lib.SINK, SINK_LAYOUT, rank, ids, replica=replica)


def attach_sources(cli, model):
    """Register every rank's θ, m, v arenas of model (a megatron.MegatronModel
    in SRC_LAYOUT) on cli and attach them as JOB's sources; the
    participant ids, one per rank."""
    parts = []
    for r in range(TP):
        want = _lib.layout_buffers(CFG_TEXT, SRC_LAYOUT, _lib.SOURCE, r)
        ids = [cli.register_fd(model.arenas[r][kind].fd, 0, length, _lib.FP32,
                               "%s r%d" % (kind, r))
               for (_bid, length, _n), kind in zip(want, ("param", "exp_avg", "exp_avg_sq"))]
        parts.append(cli.attach(JOB, TOKEN, _lib.SOURCE, SRC_LAYOUT, r, ids))
    return parts


def child_main(sock, replica, hold=None):
    """A sink replica in its own process: apply whatever is staged, forever.

    hold = (rank, version): once that rank has applied version - 1, leave
    it alone (no wait_staged, so nothing of it is parked or applied on
    arrival, and no apply) until the parent writes a line on stdin; the
    other rank goes on as usual.  The window the parent's wait(version)
    must not answer in (docs/SYNC.md, wait)."""
    model = sglang.SGLangModel(CFG, tp=TP, label="child%d" % replica)
    cli = _lib.Client(sock)
    parts = [attach_sink(cli, model.arenas[r], r, replica) for r in range(TP)]
    print("READY %s" % " ".join(str(model.arenas[r].fd) for r in range(TP)), flush=True)
    held = False
    while True:
        for rank, p in enumerate(parts):
            if held and rank == hold[0]:
                if not select.select([sys.stdin], [], [], 0)[0]:
                    continue
                sys.stdin.readline()
                held, hold = False, None
            try:
                v = cli.wait_staged(JOB, p, 100)
            except _lib.DteError as e:
                if e.code == _lib.ERR_TIMEOUT:
                    continue
                raise
            r = cli.apply(JOB, p, v)
            if not r["checksum_ok"]:
                print("CHECKSUM-FAILED %d" % v, flush=True)
            if hold and rank == hold[0] and hold[1] - 1 <= r["version"] < hold[1]:
                held = True


class ChildReplica:
    """A sink replica in a child process; its memory read through /proc."""

    def __init__(self, sock, replica, hold=None):
        self.replica = replica
        argv = [sys.executable, __file__, "--sink-child", sock, str(replica)]
        if hold:
            argv += ["%d:%d" % hold]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=ROOT)
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "READY":
            raise RuntimeError("sink child did not start: %r" % line)
        self.layout = sglang.SGLangModel(CFG, tp=TP, label="childview%d" % replica)
        self.maps = []
        for r, fd in enumerate(line[1:]):
            own = os.open("/proc/%d/fd/%s" % (self.proc.pid, fd), os.O_RDONLY)
            size = os.fstat(own).st_size
            self.maps.append(mmap.mmap(own, size, mmap.MAP_SHARED, mmap.PROT_READ))
            os.close(own)

    def tensors(self, r):
        out = {}
        for name in self.layout.shapes:
            loc = self.layout.arenas[r].loc(name)
            raw = self.maps[r][loc.offset:loc.offset + loc.nbytes]
            out[name] = torch.frombuffer(bytearray(raw), dtype=torch.bfloat16).view(loc.shape)
        return out

    def release(self):
        """Ends the child's hold (child_main)."""
        self.proc.stdin.write("release\n")
        self.proc.stdin.flush()

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        for m in self.maps:
            m.close()
        self.maps = []
        self.layout.close()


# -------------------------------------------------------------- checking
def expected(model):
    """RNE(θ_t) of the trainer's FP32 weights, converted independently."""
    return harness.expected_sglang(model, CFG, TP)


def exact(want, got_tensors):
    return harness.mismatches(want, got_tensors)


dtectl = harness.dtectl


def bad_input(c, sock, trainer_cli, src_ids):
    E = _lib.DteError
    other = _lib.Client(sock)
    ar = Arena("bad", [("w", (64,), "bf16")])
    c.raises(E, lambda: other.attach(JOB, "wrong", _lib.SINK, SINK_LAYOUT, 0, []),
             "wrong token refused")
    try:
        other.attach(JOB, "wrong", _lib.SINK, SINK_LAYOUT, 0, [])
    except E as e:
        c.check(e.code == _lib.ERR_DENIED and "token" in e.msg, "wrong token: %s" % e.msg)
    c.raises(E, lambda: other.attach("no-such-job", TOKEN, _lib.SINK, SINK_LAYOUT, 0, []),
             "unknown job refused")
    c.raises(E, lambda: other.register_fd(ar.fd, ar.size, 64, _lib.BF16, "past the end"),
             "registration offset past the end refused")
    c.raises(E, lambda: other.register_fd(ar.fd, 0, ar.size, _lib.BF16, "too long"),
             "registration length past the end refused")
    c.raises(E, lambda: other.register_fd(ar.fd, 1, 8, _lib.BF16, "misaligned"),
             "misaligned registration offset refused")
    unsealed = os.memfd_create("unsealed")
    os.ftruncate(unsealed, 4096)
    c.raises(E, lambda: other.register_fd(unsealed, 0, 64, _lib.BF16, "unsealed"),
             "unsealed memfd refused")
    os.close(unsealed)
    # Another connection's buffers (the trainer's) cannot be named.
    try:
        other.attach(JOB, TOKEN, _lib.SOURCE, SRC_LAYOUT, 0, src_ids)
        c.check(False, "another client's buffers: attach succeeded")
    except E as e:
        c.check("not registered on this connection" in e.msg,
                "another client's buffers refused: %s" % e.msg)
    c.raises(E, lambda: other.unregister(src_ids[0]), "unregistering another client's buffer refused")
    c.raises(E, lambda: other.apply(JOB, 12345, 1), "apply for a participant not ours refused")
    good = other.register_fd(ar.fd, 0, 64, _lib.BF16, "ok")
    c.check(good > 0, "a valid registration after the refusals works")
    c.raises(E, lambda: other.attach(JOB, TOKEN, _lib.SINK, SINK_LAYOUT, 0, [good]),
             "attach with the wrong number of buffers refused")
    c.raises(E, lambda: other.attach(JOB, TOKEN, _lib.SINK, "sglang:tp=3", 0, [good]),
             "impossible layout refused")
    c.raises(E, lambda: other.register_cuda(b"x" * 64, 0, 64, _lib.BF16),
             "CUDA IPC buffer refused without a CUDA device")
    other.close()
    ar.close()
    st = dtectl(sock, "status")
    c.check(st.returncode == 0 and "jobs: 1" in st.stdout, "daemon still serving: %s" %
            st.stdout.replace("\n", " ")[:120])


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--sink-child":
        torch.set_num_threads(1)
        hold = tuple(int(x) for x in sys.argv[4].split(":")) if len(sys.argv) > 4 else None
        child_main(sys.argv[2], int(sys.argv[3]), hold)
        return
    c = Checks("sync-local")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="dte-sync-local-")
    # The corruption at version 27 is made outside any apply: only a full
    # checksum pass sees it for sure, so every apply takes one here
    # (sync_verify.py covers the incremental path and its periodic pass).
    # Its checks say which versions go sparse (marks, gaps, repairs):
    # sync_mode = sparse, so dted never picks dense for cost here
    # (tests/system/sync_mode.py covers that choice).
    daemon = harness.Daemon(tmp, "sync-local", verify_full_every=1, sync_mode="sparse")
    children = []
    versions = exact_versions = 0
    sparse_pct = []
    try:
        sock = daemon.start().sock
        # Every tensor where the daemon's layout says it lives (libdte's
        # dte_layout_tensors), not where this test assumes.
        model = megatron.MegatronModel(CFG, tp=TP, seed=0, label="sync-src",
                                       placement=SRC_LAYOUT)
        for r in range(TP):
            for pl in _lib.layout_tensors(CFG_TEXT, SRC_LAYOUT, _lib.SOURCE, r):
                loc = model.arenas[r]["param"].loc(pl.name)
                assert loc.offset == 4 * pl.offset and loc.shape == pl.shape, pl
        trainer = megatron.Trainer(model, lr=LR, warmup=WARMUP)
        task = toy.ToyTask(CFG["vocab_size"])
        tcli = _lib.Client(sock)
        c.check(tcli.job_create(JOB, CFG_TEXT, TOKEN, "local", 1, detect=DETECT),
                "job created (detect %s)" % (DETECT or "adamw"))
        c.check(not tcli.job_create(JOB, CFG_TEXT, TOKEN, "local", 1, detect=DETECT),
                "job_create is idempotent")
        other = "adamw" if DETECT == "snapshot" else "snapshot"
        c.raises(_lib.DteError, lambda: tcli.job_create(JOB, CFG_TEXT, TOKEN, "local", 1,
                                                        detect=other),
                 "same job with detect %s refused" % other)
        c.raises(_lib.DteError, lambda: tcli.job_create(JOB + "-x", CFG_TEXT, TOKEN, "local", 1,
                                                        detect="telepathy"),
                 "unknown detect mode refused")
        c.raises(_lib.DteError, lambda: tcli.job_create(JOB, CFG_TEXT, "other", "local", 1),
                 "same job with another token refused")
        src_parts, src_ids = [], []
        for r in range(TP):
            want = _lib.layout_buffers(CFG_TEXT, SRC_LAYOUT, _lib.SOURCE, r)
            ids = []
            for (bid, length, name), kind in zip(want, ("param", "exp_avg", "exp_avg_sq")):
                a = model.arenas[r][kind]
                last = a.loc(a.names()[-1])
                c.check(last.offset + last.nbytes <= 4 * length <= a.size,
                        "rank %d %s: arena fits the layout's %d elements" % (r, kind, length))
                ids.append(tcli.register_fd(a.fd, 0, length, _lib.FP32, "%s r%d" % (kind, r)))
            src_ids += ids
            src_parts.append(tcli.attach(JOB, TOKEN, _lib.SOURCE, SRC_LAYOUT, r, ids))
        rep0 = Replica(c, sock, 0, "sink-r0")
        child = ChildReplica(sock, 1)
        children.append(child)
        sinks = {0: rep0, 1: child}
        late = None
        step = 0
        version = 0
        modes = {}

        def publish(rec, wait_fails=False, held=None):
            """held: a ChildReplica one rank of which holds version - 1
            (child_main's hold); it is released HOLD_S after the wait
            began, and the wait must not have answered before that: a
            wait answers once every sink settled the version, even when
            another sink failed it (docs/SYNC.md, WAIT).  Returns the
            publish infos and what ends the hold (call it after the
            check of the sinks' memory)."""
            nonlocal version
            version += 1
            infos = [tcli.publish(JOB, p, version, rec["step"], groups_of(rec)) for p in src_parts]
            for s in sinks.values():
                if isinstance(s, Replica):
                    s.step()
            released = threading.Event()

            def release():
                released.set()
                held.release()
            timer = threading.Timer(HOLD_S, release) if held else None
            if timer:
                timer.start()
            if wait_fails:
                c.raises(_lib.DteError, lambda: tcli.wait(JOB, version, 30000),
                         "wait reports the sink that failed its checksum")
            else:
                tcli.wait(JOB, version, 30000)
            if timer:
                c.check(released.is_set(), "wait(%d) answered only after replica %d's held rank "
                        "was released to apply it" % (version, held.replica))

            def unhold():
                if timer:
                    timer.cancel()
                    timer.join()
                    if not released.is_set():
                        release()
            return infos, unhold

        def verify(tag, skip=()):
            nonlocal versions, exact_versions
            want = expected(model)
            ok = True
            for k, s in sorted(sinks.items()):
                for r in range(TP):
                    if (k, r) in skip:
                        continue
                    bad = exact(want[r], s.tensors(r))
                    if bad:
                        ok = False
                        print("version %d %s replica %d rank %d differs: %s" % (
                            version, tag, k, r, ", ".join(bad[:4])), flush=True)
            versions += 1
            exact_versions += ok
            return ok

        # Phase A: K=1, a late sink at 20, a sink killed and restarted at 25.
        for v in range(1, 31):
            step += 1
            rec = trainer.step(*task.batch_at(step))
            if v == 20:
                late = Replica(c, sock, 2, "sink-late")
                sinks[2] = late
            if v == 25:
                child.kill()
                # Its rank 1 holds version 27 until publish(28) releases
                # it: 28 is the version another sink fails, and wait(28)
                # once answered that failure while this sink still held
                # 27 (issue 30, "a rare inexact version").
                child = ChildReplica(sock, 1, hold=(1, 28))
                children.append(child)
                sinks[1] = child
            infos, unhold = publish(rec, wait_fails=v == 28, held=child if v == 28 else None)
            modes[version] = infos
            if v == 28:
                # The corruption below is caught by the checksum, not by luck.
                c.check(not rep0.last[0]["checksum_ok"] and rep0.last[1]["checksum_ok"],
                        "corrupted sink buffer: checksum failure reported (%s)" % rep0.last)
                verify("K=1", skip={(0, 0)})
                unhold()
                continue
            if v == 29:
                c.check(rep0.last[0]["checksum_ok"] and infos[0]["dense"] == 1,
                        "after a checksum failure: that sink repaired densely (%s)" % infos[0])
            verify("K=1")
            if v == 27:
                w = rep0.tensors(0)["model.layers.0.self_attn.o_proj.weight"]
                w[0].fill_(1234.0)
        c.check(all(i["dense"] == i["sinks"] for i in modes[1]), "version 1 is dense")
        c.check(any(i["dense"] == 0 for v in range(2, 20) for i in modes[v]),
                "K=1 versions go sparse")
        c.check(all(0 < i["dense"] < i["sinks"] for i in modes[20]),
                "version 20: only the new sinks dense (%s)" % modes[20])
        # Phase B: K=4 with marks.
        for v in range(10):
            for k in range(4):
                step += 1
                rec = trainer.step(*task.batch_at(step))
                if k < 3:
                    for p in src_parts:
                        tcli.mark(JOB, p, rec["step"], groups_of(rec))
            infos, _ = publish(rec)
            modes[version] = infos
            verify("K=4 marks")
        c.check(all(i["dense"] == 0 for v in range(version - 9, version + 1) for i in modes[v]),
                "K=4 with marks: every version sparse")
        # Phase C: K=4 without marks: a gap, so dense.
        for v in range(10):
            for k in range(4):
                step += 1
                rec = trainer.step(*task.batch_at(step))
            infos, _ = publish(rec)
            modes[version] = infos
            verify("K=4 no marks")
        c.check(all(i["dense"] == i["sinks"] for v in range(version - 9, version + 1)
                    for i in modes[v]), "K=4 without marks: every version dense")
        # Back to K=1: sparse again on top of the dense ones.
        for v in range(3):
            step += 1
            rec = trainer.step(*task.batch_at(step))
            infos, _ = publish(rec)
            modes[version] = infos
            verify("K=1 again")
        c.check(all(i["dense"] == 0 for i in modes[version]), "sparse again after dense versions")
        c.check(exact_versions == versions, "every version exact on every sink (%d/%d)" %
                (exact_versions, versions))

        # What operators see.
        h = dtectl(sock, "--json", "history", JOB)
        hist = json.loads(h.stdout).get("versions", []) if h.returncode == 0 else []
        c.check(len(hist) == version, "history has every version (%d)" % len(hist))
        c.check(all(x.get("checksum") == ("failed" if x["version"] == 28 else "ok") for x in hist),
                "history: checksum ok, failed at the corrupted version 28")
        c.check(any(x.get("mode") == "sparse" for x in hist) and
                any(x.get("mode") == "dense" for x in hist), "history shows sparse and dense")
        j = dtectl(sock, "job", JOB)
        c.check(j.returncode == 0 and "complete: true" in j.stdout and "is_coordinator: true" in j.stdout,
                "dtectl job: complete, coordinator")
        jl = dtectl(sock, "jobs")
        c.check(jl.returncode == 0 and JOB in jl.stdout, "dtectl jobs lists the job")
        sparse_pct = [x["changed_pct"] for x in hist if x.get("mode") == "sparse"]
        print("history tail: %s" % json.dumps(hist[-2:]))
        bad_input(c, sock, tcli, src_ids[:3])
        c.check(daemon.running(), "daemon alive at the end")
        tcli.close()
        trainer.close()
    finally:
        for ch in children:
            if ch.proc.poll() is None:
                ch.proc.send_signal(signal.SIGKILL)
                ch.proc.wait()
        rc = daemon.stop(10)
        c.check(rc == 0, "dted exits cleanly (status %s)" % rc)
        if c.passed != c.total:
            print("--- dted log (tail) ---\n" + daemon.log_tail(40))
    print("sync-local: versions=%d exact=%d/%d sinks=%d" % (versions, exact_versions, versions,
                                                             2 * TP + TP))
    c.finish(versions=versions, sparse_changed_pct="%.1f" % (
        sum(sparse_pct) / len(sparse_pct) if sparse_pct else 0))


if __name__ == "__main__":
    main()

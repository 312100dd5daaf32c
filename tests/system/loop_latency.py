#!/usr/bin/python3
# dte-test: exclusive (it asserts a 50 ms bound on the loop's answers: run alone)
"""The loop answers clients while a dense version of 2^28 elements is
applied (issue 17: heavy work off the loop thread, docs/SYNC.md).

One dted, one source (fsdp:dp=1) and one sink (sglang:tp=1) of a model
whose embedding alone is 2^28 elements (65536 x 4096, BF16 at the sink:
512 MiB).  Every version is dense (the first one is; before the others an
operator `dtectl resync` forces it).  While the sink's apply of each
version runs, a second connection polls the daemon's status (the request
`dtectl status` sends, through the Python binding, so no process start is
timed) back to back and times every round trip.

Which polls overlapped the apply is proven, not assumed: the apply request
went out at A0 and its answer came at A1 (client clock), and the daemon
reports the apply's own duration D (apply_ms).  The apply ran inside
[A0, A1] for D, so it surely ran during [A1 - D, A0 + D]; a poll that
intersects that core overlapped the apply.  The test fails unless at least
MIN_POLLS polls did, and unless every poll that overlapped [A0, A1] (the
latency sample) answered within 50 ms.  Prints

    loop-latency: p50_ms=X max_ms=Y during=dense-apply polls=N ...

The same for `dtectl verify` (a whole-model sum on a worker; its duration
D from the daemon's log): `verify-latency: ... during=verify`.  Last, a
SIGTERM while the apply of a version that differs from the one before in
every element (θ negated) runs: the daemon must wait for its worker
through the completion (its log says the apply came back during
shutdown; the client got no answer), exit 0, and leave the sink holding
that version whole, bit-exact, never torn.

Memory: the source's θ (FP32, 1 GiB, touched) and its untouched m/v
memfds, the sink's 512 MiB and the daemon's staged 512 MiB: about 2.5 GiB.
"""

import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time

import harness  # sets ROOT and B, puts client/python on sys.path

# An ASan build: libdte needs the runtime preloaded here; dted gets the
# caller's environment back (child_env), leak checks included.
harness.asan_reexec()

import torch  # noqa: E402

from dte import _lib, qwen3  # noqa: E402
from dte.checks import Checks  # noqa: E402
from dte.shm import Arena  # noqa: E402

JOB, TOKEN = "loop-latency", "s3cret"
# 65536 x 4096 = 2^28 elements in the (tied) embedding, plus one tiny layer.
CFG = qwen3.make_config(None, hidden_size=4096, intermediate_size=128, num_hidden_layers=1,
                        num_attention_heads=1, num_key_value_heads=1, head_dim=128,
                        vocab_size=65536, tie_word_embeddings=True)
SRC_LAYOUT, SINK_LAYOUT = "fsdp:dp=1", "sglang:tp=1"
APPLIES = int(os.environ.get("LOOP_LATENCY_APPLIES", "3"))
LIMIT_MS = 50.0
MIN_POLLS = 10           # polls that surely overlapped the applies, all of them
MIN_APPLY_MS = LIMIT_MS  # work shorter than the limit could not show a stall
GROUPS = [{"lr": 1e-5, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": wd,
           "variant": "torch"} for wd in (0.01, 0.0)]


def run_delay(f):
    """Nanoseconds a thread has waited on a run queue (runnable, no core
    free), from its /proc schedstat file (second field)."""
    f.seek(0)
    return int(f.read().split()[1])


class Poller(threading.Thread):
    """Status round trips on its own connection, back to back (1 ms apart,
    so the daemon keeps its cores), each as (t0, t1) in perf_counter s.
    With each, how long the daemon's loop thread (the daemon's main
    thread) and this thread waited for a core meanwhile (ms, schedstat;
    None where /proc has no schedstat): a slow answer is then either the
    loop's own doing or a machine with no core free, and a failure says
    which."""

    def __init__(self, sock, daemon_pid):
        super().__init__(daemon=True)
        self.cli = _lib.Client(sock)
        self.stop = threading.Event()
        self.samples = []
        self.waits = {}
        self.error = None
        self.loop_stat = "/proc/%d/task/%d/schedstat" % (daemon_pid, daemon_pid)

    def run(self):
        try:
            try:
                lf = open(self.loop_stat)
                mf = open("/proc/self/task/%d/schedstat" % threading.get_native_id())
            except OSError:
                lf = mf = None
            while not self.stop.is_set():
                w0 = (run_delay(lf), run_delay(mf)) if lf else None
                t0 = time.perf_counter()
                self.cli.status()
                t1 = time.perf_counter()
                if w0:
                    self.waits[(t0, t1)] = ((run_delay(lf) - w0[0]) / 1e6,
                                            (run_delay(mf) - w0[1]) / 1e6)
                self.samples.append((t0, t1))
                time.sleep(0.001)
        except Exception as e:  # noqa: BLE001  (reported by the main thread)
            self.error = e

    def worst(self, keep):
        """The slowest poll that keep((t0, t1)) accepts, as
        'rtt_ms=X loop_wait_ms=Y poller_wait_ms=Z'."""
        got = [s for s in self.samples if keep(s)]
        if not got:
            return "none"
        t0, t1 = max(got, key=lambda s: s[1] - s[0])
        w = self.waits.get((t0, t1))
        return "rtt_ms=%.2f loop_wait_ms=%s poller_wait_ms=%s" % (
            (t1 - t0) * 1e3, "%.2f" % w[0] if w else "?", "%.2f" % w[1] if w else "?")


def window_stats(samples, a0, a1, d):
    """Polls overlapping [a0, a1] (their round trips, ms), and how many
    surely overlapped work of duration d that ran inside [a0, a1]: those
    meeting its core [a1 - d, a0 + d]."""
    lat = [(t1 - t0) * 1e3 for t0, t1 in samples if t0 < a1 and t1 > a0]
    lo, hi = a1 - d, a0 + d
    core = sum(1 for t0, t1 in samples if t0 < hi and t1 > lo)
    return lat, core


def main():
    c = Checks("loop-latency")
    cfg_text = __import__("json").dumps(CFG)
    shapes = qwen3.hf_tensor_shapes(CFG)
    elements = sum(int(torch.Size(s).numel()) for s in shapes.values())
    tmp = tempfile.mkdtemp(prefix="dte-loop-latency-")
    daemon = harness.Daemon(tmp, "loop-latency")
    arenas, sink_arenas = {}, []
    results = []
    try:
        sock = daemon.start().sock
        # Source: θ in memfds as fsdp:dp=1 names them; m and v stay holes
        # (a dense capture reads θ only).
        specs = [(n, tuple(s), torch.float32) for n, s in shapes.items()]
        arenas = {k: Arena("ll-%s" % k, specs) for k in ("param", "exp_avg", "exp_avg_sq")}
        g = torch.Generator().manual_seed(0)
        for n in shapes:
            arenas["param"].tensor(n).uniform_(-1.0, 1.0, generator=g)
        cli = _lib.Client(sock)
        cli.job_create(JOB, cfg_text, TOKEN, "local", 1)
        ids = []
        for _bid, length, bname in _lib.layout_buffers(cfg_text, SRC_LAYOUT, _lib.SOURCE, 0):
            base, _, kind = bname.partition(" ")
            loc = arenas[kind or "param"].loc(base)
            ids.append(cli.register_fd(loc.fd, loc.offset, length, _lib.FP32, bname))
        src = cli.attach(JOB, TOKEN, _lib.SOURCE, SRC_LAYOUT, 0, ids)
        # Sink: one BF16 memfd per layout buffer, on its own connection.
        scli = _lib.Client(sock)
        sids = []
        for _bid, length, bname in _lib.layout_buffers(cfg_text, SINK_LAYOUT, _lib.SINK, 0):
            a = Arena("ll-sink", [(bname, (length,), torch.bfloat16)])
            sink_arenas.append(a)
            loc = a.loc(bname)
            sids.append(scli.register_fd(loc.fd, loc.offset, length, _lib.BF16, bname))
        sink = scli.attach(JOB, TOKEN, _lib.SINK, SINK_LAYOUT, 0, sids)
        c.check(elements >= 1 << 28, "the model has %d elements (>= 2^28)" % elements)

        poller = Poller(sock, daemon.pid)
        poller.start()
        staged_windows = []
        for v in range(1, APPLIES + 1):
            if v > 1:
                r = harness.dtectl(sock, "resync", JOB)
                c.check(r.returncode == 0, "dtectl resync before version %d: %s" %
                        (v, (r.stdout + r.stderr).strip()[:120]))
            p0 = time.perf_counter()
            info = cli.publish(JOB, src, v, v, GROUPS)
            c.check(info["sinks"] == 1 and info["dense"] == 1,
                    "version %d captured dense (%s)" % (v, info))
            got = scli.wait_staged(JOB, sink, 60000)
            staged_windows.append((p0, time.perf_counter()))
            c.check(got == v, "version %d staged (got %d)" % (v, got))
            a0 = time.perf_counter()
            rep = scli.apply(JOB, sink, v)
            a1 = time.perf_counter()
            c.check(rep["checksum_ok"] and rep["version"] == v,
                    "version %d applied and verified (%s)" % (v, rep))
            results.append((a0, a1, rep["apply_ms"] / 1e3))
            cli.wait(JOB, v, 30000)
        # dtectl verify: a whole-model sum, on a worker too.  Its duration
        # on the worker comes from the daemon's log.
        n0 = len(poller.samples)
        t0 = time.perf_counter()
        r = harness.dtectl(sock, "verify", JOB)
        t1 = time.perf_counter()
        c.check(r.returncode == 0 and "ok: 1" in r.stdout,
                "dtectl verify: the sink is ok (%s)" % (r.stdout + r.stderr).strip()[:160])
        m = re.findall(r"verify of 1 sinks: 1 ok, 0 mismatch; summed on a worker in ([0-9.]+) ms",
                       daemon.log_text())
        vd = float(m[-1]) / 1e3 if m else 0.0
        c.check(m and vd <= t1 - t0, "the daemon logged the verify's sum (%.1f ms)" % (vd * 1e3))
        vlat, vcore = window_stats(poller.samples[n0:], t0, t1, vd)
        verify_window = (t0, t1)
        poller.stop.set()
        poller.join(10)
        c.check(poller.error is None, "every status poll answered (%s)" % poller.error)

        # The sink holds what the source published (RNE of θ).
        want = arenas["param"].tensor("model.embed_tokens.weight").to(torch.bfloat16)
        got_t = None
        for a in sink_arenas:
            for name in a.names():
                t = a.tensor(name)
                if t.numel() == want.numel():
                    got_t = t.view(want.shape)
        c.check(got_t is not None and torch.equal(got_t, want),
                "the sink's embedding is bit-exact to RNE(θ)")

        lat, core_polls, inside = [], 0, 0
        for a0, a1, d in results:
            c.check(d <= a1 - a0, "apply took %.1f ms, within its request's %.1f ms"
                    % (d * 1e3, (a1 - a0) * 1e3))
            lo, hi = a1 - d, a0 + d
            for t0, t1 in poller.samples:
                if t0 < a1 and t1 > a0:
                    lat.append((t1 - t0) * 1e3)
                if t0 < hi and t1 > lo:
                    core_polls += 1
                if t0 >= a0 and t1 <= a1:
                    inside += 1
        lat.sort()
        p50 = lat[len(lat) // 2] if lat else float("nan")
        mx = lat[-1] if lat else float("nan")
        apply_ms = max(d for _a0, _a1, d in results) * 1e3 if results else 0.0
        print("loop-latency: p50_ms=%.2f max_ms=%.2f during=dense-apply polls=%d inside=%d "
              "applies=%d apply_ms=%.0f elements=%d" % (p50, mx, core_polls, inside,
                                                         len(results), apply_ms, elements))
        sys.stdout.flush()
        c.check(apply_ms >= MIN_APPLY_MS, "the longest apply took %.0f ms (>= %.0f: long "
                "enough to show a stall)" % (apply_ms, MIN_APPLY_MS))
        c.check(core_polls >= MIN_POLLS, "%d polls surely overlapped the applies (>= %d)"
                % (core_polls, MIN_POLLS))
        c.check(lat and mx < LIMIT_MS, "every status poll during an apply answered within "
                "%.0f ms (max %.2f ms, p50 %.2f ms, %d polls; slowest: %s)"
                % (LIMIT_MS, mx, p50, len(lat), poller.worst(
                    lambda s: any(s[0] < a1 and s[1] > a0 for a0, a1, _d in results))))
        # Capture (worker), then staging: part checks and xxh3 over the
        # 512 MiB (worker), publish to staged as the clients see it.
        slat = sorted((t1 - t0) * 1e3 for t0, t1 in poller.samples
                      if any(t0 < b and t1 > a for a, b in staged_windows))
        sp50 = slat[len(slat) // 2] if slat else float("nan")
        smx = slat[-1] if slat else float("nan")
        print("stage-latency: p50_ms=%.2f max_ms=%.2f during=dense-capture-and-stage polls=%d "
              "window_ms=%.0f" % (sp50, smx, len(slat),
                                  max((b - a) * 1e3 for a, b in staged_windows)))
        c.check(len(slat) >= MIN_POLLS and smx < LIMIT_MS,
                "every status poll from publish to staged answered within %.0f ms (max %.2f ms, "
                "%d polls; slowest: %s)" % (LIMIT_MS, smx, len(slat), poller.worst(
                    lambda s: any(s[0] < b and s[1] > a for a, b in staged_windows))))
        vlat.sort()
        vp50 = vlat[len(vlat) // 2] if vlat else float("nan")
        vmx = vlat[-1] if vlat else float("nan")
        print("verify-latency: p50_ms=%.2f max_ms=%.2f during=verify polls=%d verify_ms=%.0f"
              % (vp50, vmx, vcore, vd * 1e3))
        sys.stdout.flush()
        c.check(vd * 1e3 >= MIN_APPLY_MS and vcore >= MIN_POLLS,
                "%d polls surely overlapped a %.0f ms verify (>= %d)" % (vcore, vd * 1e3, MIN_POLLS))
        c.check(vlat and vmx < LIMIT_MS, "every status poll during the verify answered within "
                "%.0f ms (max %.2f ms; slowest: %s)" % (LIMIT_MS, vmx, poller.worst(
                    lambda s: s[0] < verify_window[1] and s[1] > verify_window[0])))

        # Shutdown while an apply is on the worker: a version that differs
        # from the last in every element (θ negated), SIGTERM once its apply
        # went out.  The daemon must wait for the worker (its log says the
        # apply came back during shutdown), exit 0, and leave the sink
        # holding that version whole: never torn, never half of it.
        v = APPLIES + 1
        arenas["param"].tensor("model.embed_tokens.weight").neg_()
        r = harness.dtectl(sock, "resync", JOB)
        info = cli.publish(JOB, src, v, v, GROUPS)
        got = scli.wait_staged(JOB, sink, 60000)
        c.check(info["dense"] == 1 and got == v, "version %d (negated) staged dense" % v)
        outcome = {}

        def apply_last():
            try:
                outcome["rep"] = scli.apply(JOB, sink, v)
            except _lib.DteError as e:
                outcome["err"] = str(e)

        started = "sink %x: apply up to version %d handed to a worker" % (sink, v)
        # The worker has started once the sink's memory changes: a sample
        # of its bits (every element's sign flips; bits, so -0 counts).
        # Handed to the thread pool is not enough: a task not yet started
        # when SIGTERM comes is cancelled (the sink keeps v-1 whole).
        probe = got_t[::256, ::512].view(torch.int16).clone()
        th = threading.Thread(target=apply_last, daemon=True)
        th.start()
        deadline = time.time() + 30
        while started not in daemon.log_text() or torch.equal(
                got_t[::256, ::512].view(torch.int16), probe):
            if time.time() > deadline or not th.is_alive():
                break
            time.sleep(0.0005)
        # At once: the worker has hundreds of ms of writing and summing
        # the sink's 512 MiB ahead of it.
        daemon.proc.send_signal(signal.SIGTERM)
        th.join(30)
        daemon.wait_exit(30)
        text = daemon.log_text()
        after = text.split("shutting down")[-1] if "shutting down" in text else ""
        landed = (started in text and "shutdown: waiting for 1 tasks on workers" in after and
                  "shutdown: the apply of version %d of sink" % v in after)
        c.check(landed and "rep" not in outcome,
                "SIGTERM landed during the apply of version %d (answered: %s; log: %s)"
                % (v, outcome, "came back during shutdown" if landed else "no such line"))
        c.check(daemon.proc.returncode == 0, "dted exited 0 after draining its worker "
                "(status %s)" % daemon.proc.returncode)
        want = arenas["param"].tensor("model.embed_tokens.weight").to(torch.bfloat16)
        c.check(got_t is not None and torch.equal(got_t, want),
                "the sink holds version %d whole after the shutdown (bit-exact, not torn)" % v)
    finally:
        if daemon.running():
            daemon.stop(20)
            if daemon.hung:
                c.check(False, "dted did not exit within 20 s of SIGTERM")
        for a in list(arenas.values()) + sink_arenas:
            try:
                a.close()
            except BufferError:
                pass
        san = re.findall(r"ERROR: (?:Address|Leak|Thread)Sanitizer|runtime error:",
                         daemon.log_text())
        c.check(not san, "no sanitizer report in the daemon's log (%s)" % san[:3])
        if c.passed != c.total:
            sys.stdout.write(daemon.log_text()[-4000:])
        shutil.rmtree(tmp, ignore_errors=True)
    return c.finish()


if __name__ == "__main__":
    sys.exit(main())

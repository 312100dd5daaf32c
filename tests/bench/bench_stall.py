#!/usr/bin/python3
"""The stall benchmark (issue 18, "Stall"): how long dted stops a trainer.

An offloaded-optimizer trainer loop on bench_e2e's model (2^28 elements;
BENCH_SMALL=1: 102,766,848): forward and backward are GPU time the host
CPU does not spend (a sleep on the trainer thread), then torch AdamW on the
host θ, m, v (memfd arenas, foreach=False, one torch thread: the
optimizer's own core), then publish through dte.Source, which answers at
once (protocol 2) while the daemon captures during the next forward and
backward; the wrapped optimizer step waits only if that capture still
reads.  One dted (the production build) holds the source and an SGLang
TP=1 sink, which its own process (bench_stall.py --sink, as an inference
node would) applies as versions stage.

Measured in one run, per forward+backward time fb (fractions of the
capture time measured first, the curve as fb shrinks):
  step_s      mean step time publishing every step, and without publishing
              (the same loop, same work, no publish);
  blocked_s   per version, the trainer's time inside dted: the publish call
              plus the wait in the step wrapper (Source.blocked_s), of which
              wait_lib_s inside libdte's wait_captured (Source.wait_lib_s:
              the rest is the wrapper's own Python); publish_lib_s the
              publish call's time inside libdte (Source.publish_lib_s);
The headline, at fb = the capture time (the smallest fb the goal covers):
  blocked_ratio = blocked_s per version / detect floor (bench_scan's detect
                  alone over the same element count; goal <= 0.05)
  step_overhead = step time with publish / without (goal <= 1.05)
For context it also measures the synchronous publish (today's protocol 1
behaviour): the trainer blocked for the whole capture.

    B=build /usr/bin/python3 tests/bench/bench_stall.py   (prints the line)
run.py calls run() and prints `bench stall blocked_ratio=R step_overhead=R`.
"""

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
B = os.environ.get("B", "build")
if not os.path.isabs(B):
    B = os.path.join(ROOT, B)
os.environ["B"] = B

import torch  # noqa: E402

import bench_e2e  # noqa: E402
from dte import sglang  # noqa: E402
from dte.sink import Sink  # noqa: E402
from dte.source import Source  # noqa: E402

# fb / capture time, the curve
FRACS = tuple(float(x) for x in os.environ.get("BENCH_STALL_FRACS", "2,1,0.5,0.25,0").split(","))
HEADLINE = 1.0                        # fb = the capture time
STEPS = int(os.environ.get("BENCH_STALL_STEPS", "2"))     # per block
ROUNDS = int(os.environ.get("BENCH_STALL_ROUNDS", "3"))   # interleaved blocks per fb


def detect_floor(n):
    """bench_scan's detect alone over n elements (seconds)."""
    r = subprocess.run([os.path.join(B, "tests", "bench_scan"), str(n)], capture_output=True,
                       text=True)
    if r.returncode:
        raise RuntimeError("bench_scan failed: %s" % r.stderr)
    for line in r.stdout.splitlines():
        if line.startswith("scan-detail:"):
            return float(dict(x.split("=", 1) for x in line.split() if "=" in x)["detect_s"])
    raise RuntimeError("bench_scan printed no scan-detail line")


def sink_main(sock):
    """The sink's own process (as on an inference node): attach an SGLang
    TP=1 sink, print "ready", then apply whatever stages and print
    "applied V" after each apply, until stdin closes."""
    torch.set_num_threads(1)
    cfg = bench_e2e.model_config()
    cfg_text = json.dumps(cfg)
    eng = sglang.SGLangModel(cfg, tp=1, label="stall-sink")
    sink = Sink.sglang(eng, sock, bench_e2e.JOB, bench_e2e.TOKEN, cfg_text)
    print("ready", flush=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    part = sink.parts[0]
    while not stop.is_set():
        try:
            v = sink.cli.wait_staged(sink.job, part, 200)
        except Exception:
            continue
        sink.cli.apply(sink.job, part, v)
        print("applied %d" % v, flush=True)
    sink.close()
    eng.close()


class SinkProc:
    """bench_stall.py --sink in a child process; applied() follows it."""

    def __init__(self, sock):
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--sink", sock],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.v = 0
        line = self.p.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError("the sink process did not attach (%r)" % line)

    def drain(self, v, timeout=600):
        """Until the sink applied version v."""
        end = time.monotonic() + timeout
        while self.v < v:
            if time.monotonic() > end or self.p.poll() is not None:
                raise RuntimeError("the sink did not apply version %d (at %d)" % (v, self.v))
            line = self.p.stdout.readline()
            if line.startswith("applied "):
                self.v = int(line.split()[1])

    def close(self):
        try:
            self.p.stdin.close()
            self.p.wait(60)
        except Exception:
            self.p.kill()


def run(floor_s=None, log=print, steps=STEPS, fracs=FRACS):
    torch.set_num_threads(1)
    cfg = bench_e2e.model_config()
    cfg_text = json.dumps(cfg)
    n = bench_e2e.model_elements()
    if floor_s is None:
        log("stall: detect floor: bench_scan over %d elements" % n)
        floor_s = detect_floor(n)
    tmp = tempfile.mkdtemp(prefix="dte-stall-")
    log("stall: daemon in %s" % tmp)
    daemon = bench_e2e.harness.Daemon(tmp, "stall", log_level="notice")
    sock = daemon.sock
    trainer = src = sink = None
    out = {"elements": n, "floor_s": floor_s, "steps": steps, "rounds": ROUNDS, "rows": [],
           "load_start": os.getloadavg()[0]}
    try:
        daemon.start(30)
        log("stall: model of %d elements, θ/m/v in memfds, torch AdamW, 1 thread" % n)
        trainer = bench_e2e.Trainer(cfg)
        src = Source(sock, bench_e2e.JOB, bench_e2e.TOKEN, cfg_text, "fsdp:dp=1")
        src.parts.append(trainer.attach(src.cli, cfg_text))
        src.ranks.append(0)
        src.track(trainer.opt)
        sink = SinkProc(sock)
        g = torch.Generator().manual_seed(2)
        for p in trainer.params.values():
            # The gradient the backward copies to the host; the same every
            # step (AdamW still moves θ: m and v evolve), so no CPU time goes
            # to making new ones.
            p.grad = torch.empty_like(p).normal_(0.0, 1e-3, generator=g)
        state = {"v": 0}

        def loop(fb, publish, k, asynchronous=True):
            """k steps; mean step time, blocked per version, capture ms."""
            times, blocked, caps, calls, libw, libp = [], [], [], [], [], []
            for _ in range(k):
                b0, l0, p0 = src.blocked_s, src.wait_lib_s, src.publish_lib_s
                t0 = time.monotonic()
                time.sleep(fb)                   # forward + backward on the GPU
                trainer.opt.step()               # waits for the last capture if it reads
                tb = 0.0
                if publish:
                    state["v"] += 1
                    t1 = time.monotonic()
                    info = src.publish(state["v"], asynchronous=asynchronous)
                    tb = time.monotonic() - t1
                times.append(time.monotonic() - t0)
                if publish:
                    blocked.append(tb + src.blocked_s - b0)
                    calls.append(tb)
                    libw.append(src.wait_lib_s - l0)
                    libp.append(src.publish_lib_s - p0)
                    caps.append(info)
            if publish:
                # The last capture ends before the next measurement (and its
                # wait is not in any step: it would be in the next one).
                src.wait_captured()
                sink.drain(state["v"])
            cap = [i["capture_ms"] for i in caps] if publish else []
            dense = sum(1 for i in caps if i["dense"]) if publish else 0
            state["calls"] = calls
            state["libw"] = libw
            state["libp"] = libp
            return times, blocked, cap, dense

        def warm():
            """A step and a publish nothing measures: the dense version a
            gap (unpublished steps) forces, then one sparse."""
            loop(0.0, True, 2, asynchronous=False)

        log("stall: first (dense) version and calibration (synchronous publish)")
        warm()
        st, sb, scap, sdense = loop(0.0, True, max(2, steps // 2), asynchronous=False)
        cap_s = statistics.median(scap) / 1e3
        out["capture_s"] = cap_s
        out["sync"] = {"step_s": statistics.mean(st), "blocked_s": statistics.mean(sb),
                       "capture_s": cap_s, "dense": sdense}
        log("stall: synchronous publish: blocked %.3f s per version (capture %.3f s), "
            "detect floor %.3f s" % (out["sync"]["blocked_s"], cap_s, floor_s))
        for frac in fracs:
            fb = frac * cap_s
            t0, t1, b1, c1, calls, libw, libp, d1 = [], [], [], [], [], [], [], 0
            # Rounds of (publishing, not publishing), interleaved, so the
            # shared machine's drift falls on both alike; each publishing
            # block starts after an unmeasured dense + sparse pair (the
            # unpublished steps before it are a gap).
            for _ in range(ROUNDS):
                warm()
                w, b, cp, d = loop(fb, True, steps)
                t1 += w
                b1 += b
                c1 += cp
                d1 += d
                calls += state["calls"]
                libw += state["libw"]
                libp += state["libp"]
                t0 += loop(fb, False, steps)[0]
            row = {"frac": frac, "fb_s": fb, "step_s_without": statistics.median(t0),
                   "step_s_with": statistics.median(t1), "blocked_s": statistics.mean(b1),
                   "blocked_max_s": max(b1), "capture_s": statistics.median(c1) / 1e3,
                   "dense": d1, "publish_call_s": statistics.mean(calls),
                   "wait_lib_s": statistics.mean(libw), "publish_lib_s": statistics.mean(libp),
                   "versions": len(b1)}
            row["step_overhead"] = row["step_s_with"] / row["step_s_without"]
            row["blocked_ratio"] = row["blocked_s"] / floor_s
            out["rows"].append(row)
            log("stall: fb=%.3f s (%.2f x capture): step %.3f s with publish, %.3f s "
                "without (x%.3f, medians); blocked %.4f s per version (max %.4f; the publish "
                "call %.4f of which libdte %.4f, libdte's wait_captured %.4f) = %.4f of the "
                "detect floor; capture %.3f s; %d dense of %d" % (
                    fb, frac, row["step_s_with"], row["step_s_without"],
                    row["step_overhead"], row["blocked_s"], row["blocked_max_s"],
                    row["publish_call_s"], row["publish_lib_s"], row["wait_lib_s"],
                    row["blocked_ratio"],
                    row["capture_s"], d1, len(b1)))
        head = min(out["rows"], key=lambda r: abs(r["frac"] - HEADLINE))
        out["blocked_ratio"] = head["blocked_ratio"]
        out["step_overhead"] = head["step_overhead"]
        out["headline_frac"] = head["frac"]
        out["load_end"] = os.getloadavg()[0]
        log("stall: load average %.1f at the start, %.1f at the end" % (out["load_start"],
                                                                         out["load_end"]))
    finally:
        for x in (sink, src, trainer):
            try:
                if x is not None:
                    x.close()
            except Exception as e:  # closing must not hide the figures
                log("stall: close: %s" % e)
        daemon.stop(30)
    return out


def summary_line(st):
    if not st or "blocked_ratio" not in st:
        return "bench stall blocked_ratio=- step_overhead=- (not measured)"
    return "bench stall blocked_ratio=%.4f step_overhead=%.3f" % (st["blocked_ratio"],
                                                                  st["step_overhead"])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--sink":
        sink_main(sys.argv[2])
        sys.exit(0)
    # SIGTERM ends the run through its finally (the daemon and sink stop).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    res = run()
    print(json.dumps(res, indent=1))
    print(summary_line(res), flush=True)

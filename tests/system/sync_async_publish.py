#!/usr/bin/python3
"""Publish that does not stop the trainer (issue 18; protocol 2).

One dted (the test build: DTE_TEST_HOOK=capture-stall@HELD holds the
capture of version HELD until the test creates the release file), an
HF-named model (fsdp:dp=1 source, real torch AdamW, θ/m/v in memfd arenas)
and an SGLang TP=1 sink in this process.

  * async: src.publish(HELD) answers while its capture is held (the capture
    cannot have read anything yet: the hook blocks it before the first
    read), so the trainer runs on: it mutates a DIFFERENT buffer (the grads
    and an activation buffer, none of them registered) and runs forward and
    backward while the capture is still pending.
  * the step waits: the next opt.step() starts on another thread while the
    capture is still held.  It must block in the Source's step wrapper
    (wait_captured) without touching θ (bit-compared with the snapshot
    taken at publish), and the real AdamW step must start only after the
    test released the capture: ordering, not timing.
  * exact: the sink applies HELD and holds RNE(θ as it was at publish),
    every element; versions before and after too.
  * errors reach the caller: a publish whose capture fails (one
    optimizer group given where the layout has two: the capture refuses
    it) is accepted, and the failure is raised by the next opt.step(), from
    wait_captured, before anything is written; so is a publish the daemon
    refuses outright (a version not after the last), whose answer libdte
    reads only later (the async publish is pipelined), with status and
    wait calls in between getting their own replies; the version
    after them is exact.

Breaking the wait (Source._before_step doing nothing) makes the real step
run during the held capture: the ordering checks fail and the sink holds
torn weights (`exact` fails).
"""

import json
import os
import tempfile
import threading
import time

import harness  # sets ROOT and B, puts client/python on sys.path

harness.asan_preload_reexec("DTE_ASYNC_ASAN")

import torch  # noqa: E402

from dte import _lib, qwen3, sglang  # noqa: E402
from dte.checks import Checks  # noqa: E402
from dte.sink import Sink  # noqa: E402
from dte.source import Source, SourceError  # noqa: E402

JOB, TOKEN = "async-publish", "t0k"
HELD = 3          # the version whose capture the hook holds
VERSIONS = 6


def rne(params):
    return {n: p.detach().to(torch.bfloat16).clone() for n, p in params.items()}


def exact(want_hf, eng, cfg):
    """Names of sink tensors that differ from RNE(θ) (bitwise)."""
    want = sglang.hf_to_sglang(want_hf, cfg, 1)
    return [n for n, w in want[0].items()
            if not torch.equal(w.view(torch.int16), eng.weights(0)[n].view(torch.int16))]


def wait_for(cond, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out waiting for %s" % what)
        time.sleep(0.005)


def main():
    c = Checks("sync-async-publish")
    tmp = tempfile.mkdtemp(prefix="dte-async-")
    release = os.path.join(tmp, "release")
    # sync_mode = sparse: the checks below say which versions go sparse
    # (dense for cost: tests/system/sync_mode.py).
    daemon = harness.Daemon(tmp, "async", hook="capture-stall@%d" % HELD,
                            env={"DTE_TEST_HOOK_RELEASE": release}, sync_mode="sparse")
    src = sink = eng = None
    waited_ms = 0.0
    try:
        sock = daemon.start().sock
        cfg = qwen3.make_config()
        cfg_text = json.dumps(cfg)
        params = {n: torch.nn.Parameter(t.clone())
                  for n, t in qwen3.init_hf_weights(cfg, seed=3).items()}
        mats = [p for p in params.values() if p.dim() > 1]
        vecs = [p for p in params.values() if p.dim() == 1]
        opt = torch.optim.AdamW([{"params": mats, "weight_decay": 0.05},
                                 {"params": vecs, "weight_decay": 0.0}],
                                lr=3e-4, betas=(0.9, 0.99), eps=1e-8)
        src = Source.hf(params, opt, sock, JOB, TOKEN, cfg_text)
        eng = sglang.SGLangModel(cfg, tp=1, label="async-sink")
        sink = Sink.sglang(eng, sock, JOB, TOKEN, cfg_text)
        gen = torch.Generator().manual_seed(5)
        activ = torch.zeros(4096)       # a buffer the daemon does not read

        def forward_backward():
            tokens = torch.randint(0, cfg["vocab_size"], (2, 16), generator=gen)
            opt.zero_grad(set_to_none=False)
            logits = qwen3.forward(params, cfg, tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     tokens[:, 1:].reshape(-1))
            activ.copy_(torch.randn(4096, generator=gen))
            loss.backward()

        # The real AdamW step, observed: when it starts, relative to the release.
        real = {"t": None, "calls": 0}
        orig = src.capture._orig

        def observed(*a, **k):
            real["t"] = time.monotonic()
            real["calls"] += 1
            return orig(*a, **k)
        src.capture._orig = observed

        forward_backward()
        opt.step()
        v = 0
        dense_after_error = None
        while v < VERSIONS:
            v += 1
            want = rne(params)
            info = src.publish(v)
            if v == HELD:
                # 1. publish answered while the hook holds the capture: async.
                c.check(src.pending and not os.path.exists(release),
                        "v%d: publish returned while its capture is held (pending %s)"
                        % (v, src.pending))
                grads_before = sum(float(p.grad.abs().sum()) for p in params.values())
                forward_backward()   # mutates grads and activ, not θ/m/v
                grads_after = sum(float(p.grad.abs().sum()) for p in params.values())
                c.check(grads_before != grads_after,
                        "v%d: forward and backward ran during the capture (grads changed)" % v)
                # 2. the next step is attempted now: it must wait.
                th_err = []

                def step():
                    try:
                        opt.step()
                    except Exception as e:  # reported below
                        th_err.append(e)
                waits0, calls0 = src.waits, real["calls"]
                th = threading.Thread(target=step)
                th.start()
                wait_for(lambda: src.waits > waits0 or not th.is_alive(),
                         "the step to reach wait_captured")
                # It is inside wait_captured (or finished, which fails below);
                # the daemon still holds the capture, so it cannot return.
                th.join(0.3)
                blocked = th.is_alive()
                theta_kept = all(torch.equal(p.detach().to(torch.bfloat16).view(torch.int16),
                                             want[n].view(torch.int16))
                                 for n, p in params.items())
                c.check(blocked and real["calls"] == calls0 and theta_kept,
                        "v%d: the step waits for the held capture (blocked=%s, real step "
                        "calls %d->%d, θ unchanged=%s)" % (v, blocked, calls0, real["calls"],
                                                          theta_kept))
                t_release = time.monotonic()
                open(release, "w").close()
                th.join(60)
                c.check(not th.is_alive() and not th_err,
                        "v%d: the step finished after the release (%s)" % (v, th_err))
                c.check(real["t"] is not None and real["t"] >= t_release,
                        "v%d: the real AdamW step started after the capture was released "
                        "(%.1f ms after)" % (v, 1e3 * ((real["t"] or 0) - t_release)))
                waited_ms = 1e3 * (time.monotonic() - t_release)
            else:
                forward_backward()
                opt.step()           # waits only if the capture still reads
            try:
                sink.apply(v)
            except Exception as e:  # a torn capture fails the sink's checksum
                c.check(False, "v%d: the sink applied it: %s" % (v, e))
            bad = exact(want, eng, cfg)
            c.check(not bad, "v%d: every sink element is RNE(θ at publish) %s" % (v, bad[:3]))
            c.check(info["elements"] > 0 and (v == 1 or v == dense_after_error or
                                              not info["dense"]),
                    "v%d: publish info resolves: %s" % (v, dict(info)))
            if v == HELD + 1:
                # 3. a capture that fails: accepted, raised by the next step.
                part = src.parts[0]
                rec = src.capture.last
                v += 1
                r = src.cli.publish(JOB, part, v, rec.step, rec.groups[:1], asynchronous=True)
                src.pending.append((part, v))
                c.check(r["captured"] is False, "v%d: a publish with one group accepted" % v)
                forward_backward()
                calls0 = real["calls"]
                try:
                    opt.step()
                    c.check(False, "v%d: the failed capture was not reported" % v)
                except SourceError as e:
                    c.check("no hyper-parameters" in str(e) and real["calls"] == calls0,
                            "v%d: the step raised the capture's error before stepping: %s"
                            % (v, e))
                opt.step()           # the capture is over: stepping is safe
                c.check(real["calls"] == calls0 + 1, "the step after the error ran")
                # 4. a publish the daemon refuses (a version not after the
                # last): libdte sends it and returns before the answer
                # (pipelined), a call in between gets its own reply, and
                # the refusal is raised by the next step, before stepping.
                rec = src.capture.last
                r = src.cli.publish(JOB, part, HELD, rec.step, rec.groups, asynchronous=True)
                src.pending.append((part, HELD))
                st = src.cli.status()
                src.cli.wait(JOB, HELD, 5000)   # every sink applied HELD: answers OK
                c.check(r["captured"] is False and st["protocol"] == 2 and st["jobs"] == 1,
                        "v%d again: the publish returned before its answer, status and wait "
                        "in between got theirs (protocol %d, %d jobs)"
                        % (HELD, st["protocol"], st["jobs"]))
                forward_backward()
                calls0 = real["calls"]
                try:
                    opt.step()
                    c.check(False, "v%d again: the refused publish was not reported" % HELD)
                except SourceError as e:
                    c.check("is not after the last published" in str(e) and
                            real["calls"] == calls0 and not src.pending,
                            "v%d again: the step raised the publish's refusal before "
                            "stepping: %s" % (HELD, e))
                opt.step()           # the handle is still usable
                c.check(real["calls"] == calls0 + 1, "the step after the refusal ran")
                dense_after_error = v + 1
        # An old-style publish still answers after its capture.
        forward_backward()
        opt.step()
        v += 1
        want = rne(params)
        info = src.publish(v, asynchronous=False)
        c.check(not src.pending and info["elements"] > 0, "v%d: synchronous publish" % v)
        sink.apply(v)
        c.check(not exact(want, eng, cfg), "v%d: exact" % v)
        c.check(src.blocked_s > 0.25, "the Source counted its blocked time (%.3f s)"
                % src.blocked_s)
    finally:
        for x in (sink, src, eng):
            try:
                if x is not None:
                    x.close()
            except Exception as e:  # closing must not hide the checks
                print("close: %s" % e)
        rc = daemon.stop()
        if daemon.hung:
            rc = "hung"
    text = daemon.log_text()
    c.check(rc == 0 and "Sanitizer" not in text,
            "dted exits cleanly after SIGTERM (%s)%s" % (rc, "" if rc == 0 else text[-2000:]))
    c.finish(versions=VERSIONS + 1, held=HELD, step_waited_ms="%.1f" % waited_ms)


if __name__ == "__main__":
    main()

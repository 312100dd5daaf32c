#!/usr/bin/python3
"""Capture runs off dted's loop (docs/SYNC.md, "One version").

One dted, a Megatron TP=1 source over ~47 M FP32 elements (θ/m/v placed
where libdte's dte_layout_tensors says) and an SGLang TP=1 sink.  While the
first (dense) publish is being captured, another client's `dtectl ping`
and `dtectl status` must come back before the publish answer: ordering,
not timing.  The daemon runs with DTE_TEST_HOOK=capture-stall@1, so the
capture worker of version 1 holds until the test creates the release file
after ping and status have answered: if capture ran on the loop, they
could not.  The test sends them only once the hook's marker file shows the
capture has started and is held (no sleep).  The sink then applies the version, checked against RNE(θ).
"""

import json
import os
import tempfile
import threading
import time

import harness  # sets ROOT and B, puts client/python on sys.path

harness.asan_preload_reexec("DTE_SYNC_ASAN")

import torch  # noqa: E402

from dte import _lib, qwen3  # noqa: E402
from dte.checks import Checks  # noqa: E402
from dte.shm import Arena  # noqa: E402

JOB, TOKEN = "capture-async", "t0k"
# ~47 M source elements: vocab 8000 x 1024 twice (untied) + 2 layers.
CFG = qwen3.make_config(None, hidden_size=1024, intermediate_size=4096, num_hidden_layers=2,
                        num_attention_heads=8, num_key_value_heads=4, head_dim=128,
                        vocab_size=8000)
CFG_TEXT = json.dumps(CFG)
SRC, SINK = "megatron:tp=1", "sglang:tp=1"


def dtectl(sock, *args):
    t0 = time.monotonic()
    r = harness.dtectl(sock, *args, timeout=60)
    return r.returncode, r.stdout + r.stderr, time.monotonic() - t0


def rss_anon(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    c = Checks("sync-capture")
    elems, pub = 0, []
    tmp = tempfile.mkdtemp(prefix="dte-capture-")
    release = os.path.join(tmp, "release")
    # sync_mode = sparse: versions 2 and 3 must go sparse (the K = 1 memory
    # check below), never dense for cost
    daemon = harness.Daemon(tmp, "capture", hook="capture-stall@1",
                            env={"DTE_TEST_HOOK_RELEASE": release}, sync_mode="sparse")
    arenas = []
    try:
        sock = daemon.start().sock
        cli = _lib.Client(sock)
        cli.job_create(JOB, CFG_TEXT, TOKEN, "local", 1)
        # Source: three arenas with every tensor where the layout puts it.
        places = _lib.layout_tensors(CFG_TEXT, SRC, _lib.SOURCE, 0)
        bufs = _lib.layout_buffers(CFG_TEXT, SRC, _lib.SOURCE, 0)
        length = bufs[0][1]
        specs = [(p.name, p.shape, "fp32", 4 * p.offset) for p in sorted(places, key=lambda p: p.offset)]
        src = {k: Arena("cap-%s" % k, specs, min_size=4 * length)
               for k in ("param", "exp_avg", "exp_avg_sq")}
        arenas += list(src.values())
        gen = torch.Generator().manual_seed(7)
        for p in places:
            src["param"].tensor(p.name).copy_(torch.randn(p.shape, generator=gen) * 0.02)
            src["exp_avg_sq"].tensor(p.name).fill_(1e-6)
        ids = [cli.register_fd(src[k].fd, 0, length, _lib.FP32, k)
               for k in ("param", "exp_avg", "exp_avg_sq")]
        spart = cli.attach(JOB, TOKEN, _lib.SOURCE, SRC, 0, ids)
        # Sink: one arena, one registered buffer per tensor.
        sp = _lib.layout_tensors(CFG_TEXT, SINK, _lib.SINK, 0)
        sink = Arena("cap-sink", [(p.name, p.shape, "bf16") for p in sorted(sp, key=lambda p: p.buffer)])
        arenas.append(sink)
        sids = []
        for p in sorted(sp, key=lambda p: p.buffer):
            loc = sink.loc(p.name)
            sids.append(cli.register_fd(loc.fd, loc.offset, loc.nbytes // 2, _lib.BF16, p.name))
        kpart = cli.attach(JOB, TOKEN, _lib.SINK, SINK, 0, sids)
        elems = sum(b[1] for b in bufs[:1])
        print("source elements %d (%.2f GB of θ/m/v)" % (elems, 12 * elems / 1e9))

        groups = [{"lr": 1e-5, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0}] * 2
        events = []
        lock = threading.Lock()

        def publish():
            # The participant's own connection; nothing else uses cli meanwhile.
            t0 = time.monotonic()
            info = cli.publish(JOB, spart, 1, 1, groups)
            with lock:
                events.append(("publish", time.monotonic(), time.monotonic() - t0, info))

        th = threading.Thread(target=publish)
        th.start()
        # The capture has started: the hook, called by the capture worker
        # as version 1's capture begins, writes <release>.held.1 before it
        # holds the worker.  Within a deadline, and before any answer.
        held, deadline = release + ".held.1", time.monotonic() + 60
        while not os.path.exists(held) and th.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        c.check(os.path.exists(held) and th.is_alive(),
                "the capture of version 1 started and is held by the hook (%s seen, publish "
                "%s)" % (os.path.basename(held), "pending" if th.is_alive() else "answered"))
        for cmd in ("ping", "status"):
            rc, out, dt = dtectl(sock, cmd)
            c.check(rc == 0, "dtectl %s answered during the capture (%.3f s)" % (cmd, dt))
            with lock:
                events.append((cmd, time.monotonic(), dt, None))
        with lock:
            pending = not any(e[0] == "publish" for e in events)
        c.check(pending and th.is_alive(), "the publish is still being captured (held by the hook)")
        open(release, "w").close()
        th.join(120)
        order = [e[0] for e in events]
        pub = [e for e in events if e[0] == "publish"]
        c.check(order == ["ping", "status", "publish"],
                "ping and status answered before the publish that started first: %s" % order)
        # The answer says captured, and the version lands exactly.
        v = cli.wait_staged(JOB, kpart, 60000)
        r = cli.apply(JOB, kpart, v)
        c.check(v == 1 and r["checksum_ok"], "version 1 staged and applied, checksum ok")
        bad = 0
        want = {}
        for p in places:
            want[p.name] = src["param"].tensor(p.name).to(torch.bfloat16)
        # Spot-check through the HF names: embedding rows (same in both runtimes).
        e_src = want["embedding.word_embeddings.weight"][:CFG["vocab_size"]]
        e_dst = sink.tensor("model.embed_tokens.weight")[:CFG["vocab_size"]]
        bad += int((e_src.view(torch.int16) != e_dst.view(torch.int16)).sum())
        n_src = want["decoder.final_layernorm.weight"]
        n_dst = sink.tensor("model.norm.weight")
        bad += int((n_src.view(torch.int16) != n_dst.view(torch.int16)).sum())
        del e_src, e_dst, n_src, n_dst, want
        c.check(bad == 0, "sink embedding and final norm equal RNE(θ) (%d differ)" % bad)
        # K = 1 keeps no per-element state between versions: sparse
        # versions 2 and 3 leave the daemon's private memory where version
        # 1 left it (a dirty bitmap kept per pair would add elems/8 bytes).
        anon = [rss_anon(daemon.pid)]
        for v in (2, 3):
            info = cli.publish(JOB, spart, v, v, groups)
            r = cli.apply(JOB, kpart, cli.wait_staged(JOB, kpart, 60000))
            c.check(not info["dense"] and r["checksum_ok"],
                    "version %d sparse, applied, checksum ok" % v)
            anon.append(rss_anon(daemon.pid))
        grow = anon[-1] - anon[0]
        print("daemon RssAnon after versions 1-3: %s kB" % [a // 1024 for a in anon])
        c.check(grow < elems // 16, "no dirty bitmap kept between K=1 versions: RssAnon %s kB, "
                "grew %d kB (a bitmap is %d kB)" % (anon, grow // 1024, elems // 8192))
        cli.close()
    finally:
        daemon.stop()
        for a in arenas:
            try:
                a.close()
            except BufferError:
                pass
    c.finish(elements=elems, publish_s="%.2f" % (pub[0][2] if pub else -1))


if __name__ == "__main__":
    main()

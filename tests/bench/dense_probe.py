"""Dense-path probe: the e2e bench's two daemons (two network namespaces,
one veth pair), a smaller Qwen3-shaped model, and only dense versions (a
fresh sink replica for each), timed per stage.  For finding what bounds
the dense path without the 10-minute `make bench`:

    sudo /usr/bin/python3 tests/bench/dense_probe.py [GBIT ...]

GBIT 0 leaves the veth unshaped.  PROBE_DTED names another dted binary (the
same client library drives both: an A/B against an older build).  PROBE_HIDDEN (default 2048) sizes the
model, PROBE_N (default 2) dense versions per link; PROBE_KEEP=1 keeps the
daemons' logs (PROBE_LOG=debug for more) in its work directory.  Prints one line per
version:
    dense-probe: link=G v=V bytes=B total_s=T publish_s=P payload_gbit=R ...
"""
import json
import os
import shutil
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_e2e as be  # noqa: E402

be.MODEL.update(hidden_size=int(os.environ.get("PROBE_HIDDEN", "2048")))
# PROBE_DTED: another dted binary (an A/B against an older build).
DTED = os.environ.get("PROBE_DTED")     # None: the build's
be.MODEL.update(intermediate_size=2 * be.MODEL["hidden_size"],
                num_attention_heads=be.MODEL["hidden_size"] // 128,
                num_key_value_heads=max(1, be.MODEL["hidden_size"] // 512))


def sched(pid):
    """(on-CPU s, runnable-but-waiting s) summed over pid's threads."""
    run = wait = 0
    for t in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, t)) as f:
                a, b, _ = f.read().split()
        except (OSError, ValueError):
            continue
        run += int(a)
        wait += int(b)
    return run / 1e9, wait / 1e9


def main():
    links = [int(a) for a in sys.argv[1:]] or [0]
    nver = int(os.environ.get("PROBE_N", "2"))
    work = "/tmp/dense-probe-%d" % os.getpid()
    os.makedirs(work, exist_ok=True)
    cfg = be.model_config()
    cfg_text = json.dumps(cfg)
    net = be.Link().setup()
    daemons, tr, cli, sink, eng = [], None, None, None, None
    try:
        srcd = be.BenchDaemon(work, "src", host=net.addr[0], netns=net.ns[0], dev=net.dev[0],
                              log_level=os.environ.get("PROBE_LOG", "warning"), binary=DTED)
        snkd = be.BenchDaemon(work, "sink", host=net.addr[1], netns=net.ns[1], dev=net.dev[1],
                              log_level=os.environ.get("PROBE_LOG", "warning"), binary=DTED)
        for d in (srcd, snkd):
            daemons.append(d)
            d.start()
        tr = be.Trainer(cfg)
        cli = be._lib.Client(srcd.sock)
        cli.job_create(be.JOB, cfg_text, be.TOKEN, "local", 1)
        part = tr.attach(cli, cfg_text)
        version, k = 0, 0
        for gbit in links:
            if gbit:
                net.shape(gbit)
            for _ in range(nver):
                if sink is not None:
                    sink.close()
                    eng.close()
                eng = be.sglang.SGLangModel(cfg, tp=1, label="probe-sink%d" % k)
                be.populate(eng)
                sink = be.Sink.sglang(eng, snkd.sock, be.JOB, be.TOKEN, cfg_text,
                                      coordinator=srcd.address, replica=k)
                k += 1
                be.wait_plan(srcd, sink.parts[0])
                step, groups = tr.step()
                version += 1
                c0 = {n: sched(d.proc.pid) for n, d in (("src", srcd), ("snk", snkd))}
                t0 = time.perf_counter()
                info = cli.publish(be.JOB, part, version, step, groups)
                t1 = time.perf_counter()
                sink.apply(version, timeout_ms=300000)
                cli.wait(be.JOB, version, 300000)
                t2 = time.perf_counter()
                c1 = {n: sched(d.proc.pid) for n, d in (("src", srcd), ("snk", snkd))}
                # Tensors whose SGLang tp=1 layout is the HF one: the sink
                # holds exactly θ rounded to BF16 (the daemon verified its
                # checksum too; this catches a part lost or misplaced).
                w = eng.weights(0)
                same = [n for n in ("model.embed_tokens.weight",
                                    "model.layers.0.self_attn.o_proj.weight",
                                    "model.layers.0.mlp.down_proj.weight", "model.norm.weight")
                        if n in w and n in tr.params]
                bad = [n for n in same
                       if not torch.equal(w[n], tr.params[n].detach().to(torch.bfloat16))]
                if len(same) < 3 or bad:
                    raise RuntimeError("version %d: sink differs in %s (of %s)" % (
                        version, bad, same))
                del w
                h = be.history(srcd, version)
                if not info["dense"]:
                    raise RuntimeError("version %d went sparse" % version)
                print("dense-probe: link=%d v=%d bytes=%d total_s=%.3f publish_s=%.3f "
                      "payload_gbit=%.2f capture_ms=%s transfer_ms=%s apply_ms=%s "
                      "src_cpu_s=%.2f src_runq_s=%.2f sink_cpu_s=%.2f sink_runq_s=%.2f exact=%d" % (
                          gbit, version, info["bytes"], t2 - t0, t1 - t0,
                          info["bytes"] * 8 / (t2 - t0) / 1e9, h.get("capture_ms"),
                          h.get("transfer_ms"), h.get("apply_ms"),
                          c1["src"][0] - c0["src"][0], c1["src"][1] - c0["src"][1],
                          c1["snk"][0] - c0["snk"][0], c1["snk"][1] - c0["snk"][1],
                          len(same)), flush=True)
    finally:
        for step in [sink.close if sink else None, eng.close if eng else None,
                     cli.close if cli else None, tr.close if tr else None] + \
                [d.stop for d in daemons] + [net.close]:
            if step:
                try:
                    step()
                except Exception as e:  # noqa: BLE001
                    print("cleanup: %s" % e, file=sys.stderr)
        if not os.environ.get("PROBE_KEEP"):
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

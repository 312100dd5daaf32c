#!/usr/bin/python3
"""What peer auth costs end to end (docs/SYNC.md, "Peers that prove the
job key"): two daemons on loopback over UCX (tests/system/peer_auth.py's pair: a Megatron
TP=2 trainer on "coord", an SGLang TP=2 replica on "sinkd"), the job with
auth on and with auth off (conf [peer] auth_off_jobs), rounds alternating.
Version 1 goes dense to the fresh sinks, the rest sparse (sync_mode =
sparse); each is timed from the publish calls to `wait` returning (every
sink applied and verified).  Prints one line per mode:
    bench peer-auth-e2e auth=on|off dense_ms=.. sparse_ms=.. (medians)
      dense_bytes=.. sparse_bytes=..
Usage: B=build python3 tests/bench/peer_auth_e2e.py [ROUNDS] [VERSIONS]
"""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "system"))

import harness  # noqa: E402

import cluster_sync_lib as csl  # noqa: E402

csl.asan_reexec([sys.executable] + sys.argv)

import torch  # noqa: E402

import sync_local as sl  # noqa: E402
from cluster_sync import SinkRank  # noqa: E402
from dte import _lib, megatron, sglang, toy  # noqa: E402

JOB, TOKEN, TP = sl.JOB, sl.TOKEN, sl.TP


def run(auth, n_versions):
    work = csl.Workdir("dte-authb-")
    conf = "" if auth else "auth_off_jobs = %s\n" % JOB
    coord = csl.Daemon(work.path, "coord", sync_mode="sparse", log_level="notice",
                       peer_conf=conf)
    sinkd = csl.Daemon(work.path, "sinkd", sync_mode="sparse", log_level="notice",
                       peer_conf=conf)
    times, byts = {}, {}
    try:
        coord.start()
        sinkd.start()
        megatron.shard_shapes = getattr(sl, "flat_order_shapes", None) or \
            megatron.flat_buffer_shapes
        model = megatron.MegatronModel(sl.CFG, tp=TP, seed=0, label="authb-src")
        trainer = megatron.Trainer(model, lr=sl.LR, warmup=sl.WARMUP)
        task = toy.ToyTask(sl.CFG["vocab_size"])
        tcli = _lib.Client(coord.sock)
        tcli.job_create(JOB, sl.CFG_TEXT, TOKEN, "local", 1)
        parts = sl.attach_sources(tcli, model)
        rep = sglang.SGLangModel(sl.CFG, tp=TP, label="authb-rep")
        sinks = [SinkRank(rep, 0, r, sinkd) for r in range(TP)]
        for s in sinks:
            s.attach(coord.address, 1)
        for v in range(1, n_versions + 1):
            rec = trainer.step(*task.batch_at(v))
            t0 = time.perf_counter()
            for p in parts:
                tcli.publish(JOB, p, v, rec["step"], sl.groups_of(rec))
            for s in sinks:
                res = s.apply(v)
                assert res["checksum_ok"], "v%d: checksum failed" % v
            tcli.wait(JOB, v, 30000)
            times[v] = (time.perf_counter() - t0) * 1e3
        hist = (coord.ctl_json("history", JOB) or {}).get("versions", [])
        for h in hist:
            byts[h["version"]] = h.get("bytes", 0)
        for s in sinks:
            s.drop()
        tcli.close()
        trainer.close()
    finally:
        for d in (coord, sinkd):
            d.stop()
        work.close()
    return times, byts


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    n_versions = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    torch.manual_seed(0)
    torch.set_num_threads(1)
    res = {True: ([], [], [], []), False: ([], [], [], [])}
    for _ in range(rounds):
        for auth in (True, False):
            t, b = run(auth, n_versions)
            res[auth][0].append(t[1])
            res[auth][1].extend(t[v] for v in range(2, n_versions + 1))
            res[auth][2].append(b.get(1, 0))
            res[auth][3].extend(b.get(v, 0) for v in range(2, n_versions + 1))
    for auth in (True, False):
        d, s, db, sb = res[auth]
        print("bench peer-auth-e2e auth=%s dense_ms=%.1f sparse_ms=%.1f dense_bytes=%d "
              "sparse_bytes=%d rounds=%d versions=%d" %
              ("on" if auth else "off", statistics.median(d), statistics.median(s),
               statistics.median(db), statistics.median(sb), rounds, n_versions), flush=True)


if __name__ == "__main__":
    main()

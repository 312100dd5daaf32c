#!/usr/bin/python3
"""A source whose registered shards leave a tensor uncovered: the
coordinator cannot plan, and says why where a user looks.

One dted; a tiny Qwen3 as rank 0 of fsdp2:dp=1 (ShardSource, every
canonical tensor its own shard, FP32 in memfd arenas) that leaves one
tensor out (as Source.megatron_core once left the routers' expert_bias
out), and an SGLang TP=1 sink.  Then:
  * `dtectl --json job` has plan_error naming the tensor;
  * the sink's wait for version 1 fails with that reason, not a bare
    timeout;
  * the same source registering every tensor plans: plan_error gone.

Prints `plan-error: checks=N passed=N`.
"""

import json
import shutil
import tempfile

import harness  # sets ROOT and B, puts client/python on sys.path

harness.asan_preload_reexec("DTE_SYNC_ASAN")

import torch  # noqa: E402

import trainers_lib as tl  # noqa: E402
from dte import _lib, qwen3, sink as dsink  # noqa: E402
from dte.checks import Checks  # noqa: E402
from dte.shard import Shard  # noqa: E402
from dte.shm import Arena  # noqa: E402
from dte.source import ShardSource  # noqa: E402

CFG = qwen3.make_config(None, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        vocab_size=300)
CFG_TEXT = json.dumps(CFG)
LEFT_OUT = "model.layers.1.mlp.down_proj.weight"


def source(sock, job, skip):
    """ShardSource rank 0 of fsdp2:dp=1 holding every canonical tensor but
    `skip`, FP32 values in memfd arenas (moments zero)."""
    wanted = [(p.name, tuple(p.shape)) for p in
              _lib.layout_tensors(CFG_TEXT, "fsdp:dp=1", _lib.SOURCE, 0) if p.name != skip]
    specs = [(n, sh, torch.float32) for n, sh in wanted]
    src = ShardSource(sock, job, "tok", CFG_TEXT, "fsdp2:dp=1")
    arenas = [Arena("plan-error-%s-%d" % (job, k), specs) for k in range(3)]
    src.arenas = arenas
    shards = []
    for n, sh in wanted:
        t = [a.tensor(n).view(-1) for a in arenas]
        shards.append(Shard(n, sh, 0, t[0].numel(), t[0], t[1], t[2], None, None))
    src.attach_shards(0, shards)
    return src


def main():
    c = Checks("plan-error")
    tmp = tempfile.mkdtemp(prefix="dte-plan-error-")
    daemon = harness.Daemon(tmp, "plan-error")
    srcs, sinks = [], []
    try:
        daemon.start()
        for job, skip in (("gap", LEFT_OUT), ("whole", None)):
            srcs.append(source(daemon.sock, job, skip))
            arenas = tl.SglangSinkArenas(CFG_TEXT, 1, label="plan-error-" + job)
            sink = dsink.Sink(daemon.sock, job, "tok", CFG_TEXT, arenas.layout)
            arenas.attach(sink)
            sinks.append((sink, arenas))
            info = daemon.ctl_json("job", job)
            err = info.get("plan_error", "")
            if skip:
                c.check(skip in err, "job %s: dtectl job plan_error names %s: %r"
                        % (job, skip, err))
                try:
                    sink.stage(1, timeout_ms=1500)
                    c.check(False, "job %s: version 1 staged without a source of %s"
                            % (job, skip))
                except _lib.DteError as e:
                    c.check(e.code == _lib.ERR_TIMEOUT and "no plan:" in e.msg and skip in e.msg,
                            "job %s: the sink's wait says why: %s" % (job, e.msg))
            else:
                c.check(not err and info.get("complete"),
                        "job %s: planned, no plan_error (%r, complete %s)"
                        % (job, err, info.get("complete")))
    finally:
        for sink, arenas in sinks:
            sink.close()
            arenas.close()
        for s in srcs:
            s.close()
        daemon.stop(10)
    if c.passed != c.total:
        print("dted log (tail):\n" + daemon.log_tail(20))
    shutil.rmtree(tmp, ignore_errors=True)
    c.finish()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""The demo's pipeline in short form, plus the helpers' other paths.

1. `python3 -m dte.demo --versions 8 --check-weights`: two daemons over UCX
   on loopback, Megatron TP=2 trainer -> SGLang TP=2 stand-in in its own
   process; every version exact (logits and every weight), versions after
   the first sparse, every process gone at the end.
2. Source.hf (an unsharded HF-named model, fsdp:dp=1, AdamW with two
   groups and a warmup scheduler stepped after the optimizer, so a wrongly
   captured lr would break exactness) -> Sink.sglang in this process, one
   daemon: every element equals RNE(θ_t) after every version.
3. Refusals: a non-flat Megatron model, an amsgrad optimizer, publishing
   before any step, a sink missing a tensor, a wrong-sized tensor.
"""

import json
import re
import subprocess
import sys
import tempfile
import types

import harness  # sets ROOT and B, puts client/python on sys.path
from harness import B, PYDIR, ROOT  # noqa: E402

from dte import demo  # noqa: E402

# The same ASan rule as the demo's, for this process's own libdte use.
if __name__ == "__main__":
    harness.asan_reexec()

import torch  # noqa: E402

from dte import _lib, megatron, qwen3, sglang  # noqa: E402
from dte.checks import Checks  # noqa: E402
from dte.sink import Sink, SinkError  # noqa: E402
from dte.source import Source, SourceError, StepCapture  # noqa: E402

VERSIONS = 8


def run_demo(c):
    env = demo.child_env({"PYTHONPATH": PYDIR, "B": B})
    r = subprocess.run([sys.executable, "-m", "dte.demo", "--versions", str(VERSIONS),
                        "--warm-steps", "3", "--check-weights"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    print(r.stdout)
    if r.returncode:
        print(r.stderr[-4000:])
    c.check(r.returncode == 0, "demo exits 0 (status %d)" % r.returncode)
    last = [x for x in r.stdout.splitlines() if x.startswith("demo: versions=")]
    m = re.match(r"demo: versions=(\d+) exact=(\d+)/(\d+) sparse_bytes=(\d+) "
                 r"dense_bytes=(\d+) ratio=([\d.]+)$", last[-1] if last else "")
    c.check(m is not None, "demo ends with its summary line")
    if not m:
        return
    n, ex, sb, db = int(m.group(1)), int(m.group(2)), int(m.group(4)), int(m.group(5))
    c.check(n == VERSIONS and ex == n, "every version exact (%d/%d)" % (ex, n))
    c.check(0 < sb < db, "fewer bytes on the wire than dense (%d < %d)" % (sb, db))
    rows = [x.split() for x in r.stdout.splitlines() if re.match(r"^\s+\d+\s+\d+\s", x)]
    c.check(len(rows) == VERSIONS, "one table row per version (%d)" % len(rows))
    c.check(rows and rows[0][6] == "dense" and all(x[6] == "sparse" for x in rows[1:]),
            "version 1 dense, the rest sparse")
    c.check(all(0 < float(x[3]) < 20 for x in rows[1:]),
            "sparse versions change a few %% of elements (%s)" % [x[3] for x in rows[1:]])
    c.check("processes left: none" in r.stdout, "no process left behind")
    c.check("two daemons over UCX" in r.stdout, "trainer and inference on separate daemons")


def start_daemon(tmp):
    d = demo.Daemon(tmp, "hf")
    return d.start()


def run_hf(c, tmp):
    cfg = qwen3.make_config(None, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                            vocab_size=512)
    cfg_text = json.dumps(cfg)
    d = start_daemon(tmp)
    src = sink = eng = None
    try:
        params = {n: torch.nn.Parameter(t.clone())
                  for n, t in qwen3.init_hf_weights(cfg, seed=3).items()}
        mats = [p for p in params.values() if p.dim() > 1]
        vecs = [p for p in params.values() if p.dim() == 1]
        opt = torch.optim.AdamW([{"params": mats, "weight_decay": 0.05},
                                 {"params": vecs, "weight_decay": 0.0}],
                                lr=2e-5, betas=(0.9, 0.99), eps=1e-8)
        # Stepped after the optimizer: each step uses a different lr.
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / 4.0)
        src = Source.hf(params, opt, d.sock, "hf-job", "tok", cfg_text)
        c.check(all(any(a.contains(p) for a in src.arenas[:1]) for p in params.values()),
                "HF params now live in the source's shm arena")
        c.raises(SourceError, lambda: src.publish(1), "publish before any step refused")
        eng = sglang.SGLangModel(cfg, tp=2, label="hf-sink")
        sink = Sink.sglang(eng, d.sock, "hf-job", "tok", cfg_text)
        gen = torch.Generator().manual_seed(7)
        lrs = []
        for v in range(1, 6):
            tokens = torch.randint(0, cfg["vocab_size"], (2, 16), generator=gen)
            opt.zero_grad(set_to_none=True)
            logits = qwen3.forward(params, cfg, tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     tokens[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            lrs.append(src.capture.last.groups[0]["lr"])
            sched.step()
            info = src.publish(v)
            sink.apply(v)
            src.wait(v)
            want = sglang.hf_to_sglang({n: p.detach().to(torch.bfloat16)
                                        for n, p in params.items()}, cfg, 2)
            bad = [(r, n) for r in range(2) for n, w in want[r].items()
                   if not torch.equal(w.view(torch.int16), eng.weights(r)[n].view(torch.int16))]
            c.check(not bad, "hf v%d (%s): every sink element is RNE(theta) %s" % (
                v, "dense" if info["dense"] else "sparse", bad[:3]))
            c.check(sink.version() == v, "sink reports version %d" % v)
        c.check(lrs == [2e-5 * k / 4.0 for k in range(1, 6)],
                "captured lr is the one each step used: %s" % lrs)
        c.raises(SinkError, lambda: sink.attach_host(0, {}), "sink missing its tensors refused")
        locs = {loc.name: (loc.fd, loc.offset, loc.nbytes - 2) for loc in eng.arenas[0].locs()}
        c.raises(SinkError, lambda: sink.attach_host(0, locs), "wrong-sized sink tensor refused")
    finally:
        if sink:
            sink.close()
        if src:
            src.close()
        if eng:
            eng.close()
        rc = d.stop()
        c.check(rc == 0, "hf daemon exits cleanly (%s)" % rc)
        if c.passed != c.total:
            print(d.tail())


def refusals(c):
    cfg = qwen3.make_config(None, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=2, head_dim=32,
                            vocab_size=256)
    model = megatron.MegatronModel(cfg, tp=2, seed=0, label="refuse")
    tr = megatron.Trainer(model, lr=1e-3)
    c.raises(SourceError, lambda: Source.megatron(model, tr.opt, "/nonexistent", "j", "t"),
             "a MegatronModel without flat=True refused")
    p = torch.nn.Parameter(torch.zeros(4, 4))
    c.raises(SourceError, lambda: StepCapture(torch.optim.AdamW([p], amsgrad=True)),
             "amsgrad refused (not invertible)")
    c.raises(SourceError, lambda: StepCapture(torch.optim.SGD([p], lr=0.1)),
             "a non-AdamW optimizer refused")
    if hasattr(_lib, "layout_tensors"):
        # The arena-vs-layout placement check, both ways.
        me = types.SimpleNamespace(model_config=json.dumps(cfg), layout="megatron:tp=2")
        c.raises(SourceError, lambda: Source.check_places(me, 0, model.arenas[0]["param"]),
                 "an arena not in the flat-buffer order refused by placement")
        flat = megatron.MegatronModel(cfg, tp=2, seed=0, label="refuse-flat", flat=True)
        try:
            Source.check_places(me, 1, flat.arenas[1]["param"])
            c.check(True, "a flat arena matches the layout's placement")
        except SourceError as e:
            c.check(False, "flat arena placement: %s" % e)
        flat.close()
    cap = StepCapture(torch.optim.AdamW([p], lr=1e-3))
    c.check(cap.last is None, "nothing captured before a step")
    tr.close()
    model.close()


def main():
    c = Checks("demo-short")
    torch.set_num_threads(1)
    refusals(c)
    tmp = tempfile.mkdtemp(prefix="dte-demo-short-")
    try:
        run_hf(c, tmp)
    finally:
        left = demo.leftovers(tmp, [])
        c.check(not left, "no daemon left from the hf phase (%s)" % left)
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    run_demo(c)
    c.finish(versions=VERSIONS)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""The demo's pipeline in short form, plus the helpers' other paths.

1. `python3 -m dte.demo --versions 8`: two daemons over UCX on loopback,
   Megatron TP=2 trainer -> SGLang TP=2 stand-in in its own process; every
   version exact (every element of both sink ranks equals RNE(θ_v) through
   the independent converter tests/system/sglang_reference.py, and the
   held-out logits match), versions after the first sparse, every process
   gone at the end.
2. The same demo with one sink bit flipped after apply(2) (an embedding
   row no batch uses: logits cannot see it) and after apply(3) (rank 1's
   replica of model.norm.weight): exactly those two versions must be NO,
   with one element each, and the demo must fail — the check can fail.
3. Source.hf (an unsharded HF-named model, fsdp:dp=1, AdamW with two
   groups and a warmup scheduler stepped after the optimizer, so a wrongly
   captured lr would break exactness) -> Sink.sglang in this process, one
   daemon, one KV head so SGLang replicates it on both ranks: every element
   of both ranks equals RNE(θ_t) through the independent converter.
4. The independent converter itself: its RNE against torch's cast on
   edge cases, and its SGLang/Megatron mappings against index-encoded
   weights placed by hand-checked rules.
5. Refusals: a non-flat Megatron model, an amsgrad optimizer, publishing
   before any step, a sink missing a tensor, a wrong-sized tensor.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import types

import harness  # sets ROOT and B, puts client/python on sys.path
from harness import B, PYDIR, ROOT  # noqa: E402

from dte import demo as demo_mod  # noqa: E402

# The same ASan rule as the demo's, for this process's own libdte use.
if __name__ == "__main__":
    harness.asan_reexec()

import torch  # noqa: E402

from dte import _lib, megatron, qwen3, sglang  # noqa: E402
from dte.checks import Checks  # noqa: E402
from dte.sink import Sink, SinkError  # noqa: E402
from dte.source import Source, SourceError, StepCapture  # noqa: E402

import sglang_reference as ref  # noqa: E402  (tests/system: independent of dte)

VERSIONS = 8


ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\d+)\s+(\d+)\s+(dense|sparse)\s+"
                 r"(\S+)\s+(.*)$")


def demo(args, quote=False):
    """Run dte.demo with args; (status, stdout, table rows, summary match).
    quote: indent its output, so a deliberately corrupted run's own result
    lines are not mistaken for this test's (the runner shows ^name: lines)."""
    env = demo_mod.child_env({"PYTHONPATH": PYDIR, "B": B})
    r = subprocess.run([sys.executable, "-m", "dte.demo"] + args, cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    print("\n".join(("  | " + x if quote else x) for x in r.stdout.splitlines()))
    if r.returncode:
        print(r.stderr[-4000:])
    rows = [m.groups() for m in map(ROW.match, r.stdout.splitlines()) if m]
    last = [x for x in r.stdout.splitlines() if x.startswith("demo: versions=")]
    m = re.match(r"demo: versions=(\d+) exact=(\d+)/(\d+) sparse_bytes=(\d+) "
                 r"dense_bytes=(\d+) ratio=([\d.]+)$", last[-1] if last else "")
    return r.returncode, r.stdout, rows, m


def run_demo(c):
    rc, out, rows, m = demo(["--versions", str(VERSIONS), "--warm-steps", "3"])
    c.check(rc == 0, "demo exits 0 (status %d)" % rc)
    c.check(m is not None, "demo ends with its summary line")
    if not m:
        return
    n, ex, sb, db = int(m.group(1)), int(m.group(2)), int(m.group(4)), int(m.group(5))
    c.check(n == VERSIONS and ex == n, "every version exact (%d/%d)" % (ex, n))
    c.check(0 < sb < db, "fewer bytes on the wire than dense (%d < %d)" % (sb, db))
    c.check(len(rows) == VERSIONS, "one table row per version (%d)" % len(rows))
    c.check(all(x[8] == "yes" for x in rows),
            "every row: all sink elements and held-out logits exact %s" % [x[8] for x in rows])
    elems = re.search(r"exact\? = all (\d+) BF16 elements of both stand-in ranks", out)
    c.check(elems is not None and int(elems.group(1)) == expected_elements(),
            "the check covers every element of both ranks (%s, expected %d)" % (
                elems.group(1) if elems else None, expected_elements()))
    c.check(rows and rows[0][6] == "dense" and all(x[6] == "sparse" for x in rows[1:]),
            "version 1 dense, the rest sparse")
    c.check(all(0 < float(x[3]) < 20 for x in rows[1:]),
            "sparse versions change a few %% of elements (%s)" % [x[3] for x in rows[1:]])
    c.check("processes left: none" in out, "no process left behind")
    c.check("two daemons over UCX" in out, "trainer and inference on separate daemons")
    c.check(re.search(r"^demo: held-out loss \(the stand-in's logits on a batch never trained "
                      r"on\): [\d.]+ after version 1 -> [\d.]+ after version %d$" % VERSIONS,
                      out, re.M) is not None, "held-out loss over the synced versions reported")
    # 8 versions on the toy task's 8 batches: no two rows share a batch.
    c.check(re.search(r"^demo: training loss: the %d synced versions each stepped on a "
                      r"different one of the task's 8 batches .* their mean [\d.]+$" % VERSIONS,
                      out, re.M) is not None, "training loss reported as per-batch")
    whole = re.search(r"^demo: whole run, versions 1\.\.%d \(version 1 dense, to a fresh "
                      r"sink\): sent (\d+) bytes against (\d+) .*: ([\d.]+)x fewer" % VERSIONS,
                      out, re.M)
    c.check(whole is not None and (whole.group(1), whole.group(2), whole.group(3)) ==
            (m.group(4), m.group(5), m.group(6)),
            "the whole-run line names the last line's bytes and ratio (%s)" % (
                whole.groups() if whole else None,))
    steady = re.search(r"^demo: versions 2\.\.%d \(sparse\): .* sent (\d+) bytes where dense "
                       r"syncs would send (\d+): ([\d.]+)x fewer" % VERSIONS, out, re.M)
    c.check(steady is not None and
            int(steady.group(1)) == sum(int(x[4]) for x in rows[1:]) and
            float(steady.group(3)) > float(m.group(6)),
            "versions 2..N: the sparse rows' sent bytes, a higher ratio than the whole "
            "run's (%s)" % (steady.groups() if steady else None,))
    marks = [x for x in out.splitlines() if x.startswith("demo: starting ")]
    c.check(len(marks) == 3, "it says when it starts each daemon and the stand-in (%s)" % marks)


def run_demo_corrupted(c):
    """The negative control: the same check must fail on a flipped bit."""
    rc, out, rows, m = demo(["--versions", "4", "--warm-steps", "1",
                             "--corrupt", "2:embed-unused", "--corrupt", "3:norm-replica"],
                             quote=True)
    total = expected_elements()
    c.check(rc != 0, "corrupted demo exits non-zero (status %d)" % rc)
    c.check(m is not None and m.group(2) == "2" and m.group(1) == "4",
            "corrupted demo: exact=2/4 (%s)" % (m.group(0) if m else None))
    verdicts = [x[8] for x in rows]
    c.check(len(rows) == 4 and verdicts[0] == "yes" and verdicts[3] == "yes",
            "versions 1 and 4 (before and after the flips) exact: %s" % verdicts)
    c.check(len(rows) == 4 and verdicts[1] == "NO: 1 of %d elements differ" % total,
            "flip in an embedding row no batch uses: 1 element differs, held-out logits "
            "cannot see it: %r" % (verdicts[1:2],))
    c.check(len(rows) == 4 and verdicts[2] ==
            "NO: 1 of %d elements differ, held-out logits differ" % total,
            "flip in rank 1's replica of model.norm.weight: 1 element differs, logits "
            "too: %r" % (verdicts[2:3],))
    c.check("rank 1 model.embed_tokens.weight: 1 elements differ" in out and
            "rank 1 model.norm.weight: 1 elements differ" in out,
            "the mismatches are located (rank and tensor)")
    c.check("processes left: none" in out, "corrupted demo: no process left behind")


def expected_elements():
    """Elements of both SGLang ranks of the default model, from upstream
    shapes (sglang_reference on zero weights), not from the demo."""
    cfg = qwen3.make_config(None)
    zeros = {n: torch.zeros(s) for n, s in qwen3.hf_tensor_shapes(cfg).items()}
    return sum(t.numel() for rank in ref.expected_sink_from_hf(zeros, cfg, 2) for t in rank.values())


def start_daemon(tmp):
    d = demo_mod.Daemon(tmp, "hf")
    return d.start()


def run_hf(c, tmp):
    # One KV head on two ranks: SGLang holds it on both (num_kv_head_replicas
    # = 2); vocab 500: padded to 512, rank 1 ends in 12 zero rows.
    cfg = qwen3.make_config(None, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                            vocab_size=500)
    cfg_text = json.dumps(cfg)
    d = start_daemon(tmp)
    src = sink = eng = mem = None
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
        mem = ref.SinkMemory(os.getpid(), [[tuple(loc) for loc in rank] for rank in eng.locs()])
        n_sink = sum(t.numel() for r in range(2) for t in eng.weights(r).values())
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
            want = ref.expected_sink_from_hf({n: p.detach() for n, p in params.items()},
                                             cfg, 2)
            bad, total, where = ref.compare(want, mem)
            c.check(bad == 0 and total == n_sink,
                    "hf v%d (%s): all %d elements of both sink ranks are RNE(theta) (%d "
                    "differ: %s)" % (v, "dense" if info["dense"] else "sparse", total, bad,
                                     where[:3]))
            c.check(sink.version() == v, "sink reports version %d" % v)
        c.check(lrs == [2e-5 * k / 4.0 for k in range(1, 6)],
                "captured lr is the one each step used: %s" % lrs)
        c.raises(SinkError, lambda: sink.attach_host(0, {}), "sink missing its tensors refused")
        locs = {loc.name: (loc.fd, loc.offset, loc.nbytes - 2) for loc in eng.arenas[0].locs()}
        c.raises(SinkError, lambda: sink.attach_host(0, locs), "wrong-sized sink tensor refused")
    finally:
        if mem:
            mem.close()
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


def converter_checks(c):
    """The independent converter is only worth what its own rules are."""
    # RNE in integer arithmetic against torch's cast, edge cases first.
    edge = [0x00000000, 0x80000000, 0x3F800000, 0x3F808000, 0x3F818000, 0x3F808001,
            0x3F807FFF, 0xBF818000, 0x7F7FFFFF, 0x7F7F7FFF, 0x00000001, 0x00008000,
            0x00018000, 0x807FFFFF, 0x7F800000, 0xFF800000, 0x477FFFFF, 0x3F7FFFFF]
    gen = torch.Generator().manual_seed(11)
    rnd = torch.randint(0, 2 ** 32, (200000,), generator=gen, dtype=torch.int64)
    bits = torch.cat([torch.tensor(edge, dtype=torch.int64), rnd])
    bits = torch.where(bits >= 2 ** 31, bits - 2 ** 32, bits).to(torch.int32)
    x = bits.view(torch.float32)
    finite = ~torch.isnan(x)
    mine = ref.rne_bf16_bits(x)
    theirs = x.to(torch.bfloat16).view(torch.int16)
    c.check(torch.equal(mine[finite], theirs[finite]),
            "RNE bits == torch's BF16 cast on %d values incl. ties, carries, overflow, "
            "subnormals (%d differ)" % (int(finite.sum()), int((mine != theirs)[finite].sum())))
    nan_out = mine[~finite].view(torch.bfloat16)
    c.check(bool(torch.isnan(nan_out).all()) and torch.equal(
        (mine[~finite] < 0), (bits[~finite] < 0)), "NaNs stay NaNs with their sign")
    c.check([int(v) & 0xFFFF for v in mine[3:9]] == [0x3F80, 0x3F82, 0x3F81, 0x3F80, 0xBF82,
                                                     0x7F80],
            "ties to even, above/below a tie, and overflow to inf by hand")

    # SGLang facts by hand, index-encoded (element value = global HF row).
    def hf_rows(cfg):
        return {n: torch.arange(s[0], dtype=torch.float32).view(-1, *[1] * (len(s) - 1))
                .expand(*s).clone() for n, s in qwen3.hf_tensor_shapes(cfg).items()}
    cfg = qwen3.make_config(None, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=2,
                            vocab_size=70)
    s4 = ref.hf_to_sglang_ranks(hf_rows(cfg), cfg, 4)  # 2 KV heads on 4 ranks: 2 replicas
    qkv = [r["model.layers.0.self_attn.qkv_proj.weight"][:, 0].tolist() for r in s4]
    c.check(qkv == [[0, 1, 0, 1, 0, 1], [2, 3, 0, 1, 0, 1], [4, 5, 2, 3, 2, 3],
                    [6, 7, 2, 3, 2, 3]],
            "qkv_proj: rank r = q head r, then KV head r // 2 (k, v) %s" % qkv)
    gu = [r["model.layers.0.mlp.gate_up_proj.weight"][:, 0].tolist() for r in s4]
    c.check(gu == [[0, 1, 0, 1], [2, 3, 2, 3], [4, 5, 4, 5], [6, 7, 6, 7]],
            "gate_up_proj: rank r = gate rows then up rows of block r %s" % gu)
    emb = [r["model.embed_tokens.weight"][:, 0].tolist() for r in s4]
    c.check(emb[0] == list(range(32)) and emb[1] == list(range(32, 64)) and
            emb[2] == list(range(64, 70)) + [0] * 26 and emb[3] == [0] * 32,
            "embedding: vocab 70 padded to 128, 32 rows a rank, padding rows zero")
    o = [r["model.layers.0.self_attn.o_proj.weight"] for r in
         ref.hf_to_sglang_ranks({n: t.T.contiguous() if n.endswith("o_proj.weight") else t
                                 for n, t in hf_rows(cfg).items()}, cfg, 4)]
    c.check([t[0].tolist() for t in o] == [[0, 1], [2, 3], [4, 5], [6, 7]],
            "o_proj: columns split by rank")

    # Cross-check with the product's own converters (written separately):
    # agreement on index-encoded weights for several shapes.
    agree = []
    for nkv, tp, tied, V in ((1, 2, False, 500), (2, 2, True, 512), (2, 4, False, 70),
                             (4, 2, False, 130)):
        cf = qwen3.make_config(None, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=nkv, head_dim=4,
                               vocab_size=V, tie_word_embeddings=tied)
        hf = {n: torch.arange(t.numel(), dtype=torch.float32).view(t.shape) + 0.25
              for n, t in qwen3.init_hf_weights(cf, seed=1).items()}
        mine, theirs = ref.hf_to_sglang_ranks(hf, cf, tp), sglang.hf_to_sglang(hf, cf, tp)
        same = all(list(mine[r]) == list(theirs[r]) and
                   all(torch.equal(mine[r][n], theirs[r][n]) for n in mine[r]) for r in range(tp))
        if tp <= nkv or nkv % tp == 0:
            mg = megatron.hf_to_megatron(hf, cf, tp)
            back = ref.megatron_core_to_hf(mg, cf, tp)
            same = same and list(back) == list(hf) and all(torch.equal(back[n], hf[n])
                                                         for n in hf)
        agree.append(same)
    c.check(all(agree), "independent converters agree with dte.sglang / dte.megatron on "
            "index-encoded weights (KV replicated, tied, padded vocab) %s" % agree)


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
    converter_checks(c)
    refusals(c)
    tmp = tempfile.mkdtemp(prefix="dte-demo-short-")
    try:
        run_hf(c, tmp)
    finally:
        left = demo_mod.leftovers(tmp, [])
        c.check(not left, "no daemon left from the hf phase (%s)" % left)
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    run_demo(c)
    run_demo_corrupted(c)
    c.finish(versions=VERSIONS)


if __name__ == "__main__":
    main()

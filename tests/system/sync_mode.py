#!/usr/bin/python3
"""The cheaper mode, chosen per pair and version (docs/SYNC.md, "Sparse or
dense: the cost"; daemon/pair_sm.c, pair_sm_choose).

One dted, a Megatron TP=1 source (~10 M FP32 elements, θ/m/v where libdte's
dte_layout_tensors puts them, stepped by torch's own AdamW) and an SGLang
TP=1 sink on the same node: a local pair, no link.  Run twice:

- sync_mode = auto: versions at a small learning rate go sparse; then the
  learning rate jumps so that nearly every BF16 weight changes: the first
  such versions are still sparse (they measure the changed fraction), and
  within a few versions the pair goes dense with `reason=cost`, which
  `dtectl history` prints (`mode=dense reason=cost sparse_est_s=..
  dense_est_s=..`).
- sync_mode = sparse: the same steps never go dense after the first
  (`reason=forced`): the dense versions above came from the cost.

Every version is applied with its checksum verified and the sink's
embedding and final norm compared with RNE(θ) bit for bit.
"""

import json
import re
import tempfile

import harness  # sets ROOT and B, puts client/python on sys.path

harness.asan_preload_reexec("DTE_SYNC_ASAN")

import torch  # noqa: E402

from dte import _lib, qwen3  # noqa: E402
from dte.checks import Checks  # noqa: E402
from dte.shm import Arena  # noqa: E402

JOB, TOKEN = "sync-mode", "t0k"
CFG = qwen3.make_config(None, hidden_size=512, intermediate_size=2048, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                        vocab_size=8000)
CFG_TEXT = json.dumps(CFG)
SRC, SINK = "megatron:tp=1", "sglang:tp=1"
LOW, HIGH = 1e-6, 3e-2
N_LOW, N_HIGH = 4, 10


def run(c, mode):
    """One daemon in sync_mode `mode`; returns [(version, lr, dense, reason)]."""
    out = []
    tmp = tempfile.mkdtemp(prefix="dte-mode-")
    daemon = harness.Daemon(tmp, "mode-" + mode, sync_mode=mode)
    arenas = []
    try:
        sock = daemon.start().sock
        cfg = harness.dtectl(sock, "config", timeout=30).stdout
        c.check(re.search(r"sync_mode\s*[:=]?\s*\"?%s" % mode, cfg) is not None,
                "%s: dtectl config shows sync_mode %s" % (mode, mode))
        cli = _lib.Client(sock)
        cli.job_create(JOB, CFG_TEXT, TOKEN, "local", 1)
        places = _lib.layout_tensors(CFG_TEXT, SRC, _lib.SOURCE, 0)
        bufs = _lib.layout_buffers(CFG_TEXT, SRC, _lib.SOURCE, 0)
        length = bufs[0][1]
        specs = [(p.name, p.shape, "fp32", 4 * p.offset)
                 for p in sorted(places, key=lambda p: p.offset)]
        src = {k: Arena("mode-%s" % k, specs, min_size=4 * length)
               for k in ("param", "exp_avg", "exp_avg_sq")}
        arenas += list(src.values())
        gen = torch.Generator().manual_seed(7)
        params = []
        for p in places:
            t = src["param"].tensor(p.name)
            t.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            params.append((p.name, torch.nn.Parameter(t)))
        opt = torch.optim.AdamW([q for _, q in params], lr=LOW, betas=(0.9, 0.95), eps=1e-8,
                                weight_decay=0.0, foreach=False)
        for name, q in params:
            st = opt.state[q]
            st["step"] = torch.tensor(0.0)
            st["exp_avg"] = src["exp_avg"].tensor(name)
            st["exp_avg_sq"] = src["exp_avg_sq"].tensor(name)
        ids = [cli.register_fd(src[k].fd, 0, length, _lib.FP32, k)
               for k in ("param", "exp_avg", "exp_avg_sq")]
        spart = cli.attach(JOB, TOKEN, _lib.SOURCE, SRC, 0, ids)
        sp = _lib.layout_tensors(CFG_TEXT, SINK, _lib.SINK, 0)
        sink = Arena("mode-sink", [(p.name, p.shape, "bf16")
                                   for p in sorted(sp, key=lambda p: p.buffer)])
        arenas.append(sink)
        sids = []
        for p in sorted(sp, key=lambda p: p.buffer):
            loc = sink.loc(p.name)
            sids.append(cli.register_fd(loc.fd, loc.offset, loc.nbytes // 2, _lib.BF16, p.name))
        kpart = cli.attach(JOB, TOKEN, _lib.SINK, SINK, 0, sids)
        ggen = torch.Generator().manual_seed(11)
        lrs = [LOW] * N_LOW + [HIGH] * N_HIGH
        bad_versions = 0
        for v, lr in enumerate(lrs, start=1):
            for g in opt.param_groups:
                g["lr"] = lr
            for _, q in params:
                q.grad = torch.randn(q.shape, generator=ggen) * 1e-3
            opt.step()
            groups = [{"lr": lr, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
                       "weight_decay": 0.0}] * 2
            info = cli.publish(JOB, spart, v, v, groups)
            staged = cli.wait_staged(JOB, kpart, 60000)
            r = cli.apply(JOB, kpart, staged)
            e_src = src["param"].tensor("embedding.word_embeddings.weight")[:CFG["vocab_size"]]
            e_dst = sink.tensor("model.embed_tokens.weight")[:CFG["vocab_size"]]
            n_src = src["param"].tensor("decoder.final_layernorm.weight")
            n_dst = sink.tensor("model.norm.weight")
            diff = int((e_src.to(torch.bfloat16).view(torch.int16) !=
                        e_dst.view(torch.int16)).sum()) + \
                int((n_src.to(torch.bfloat16).view(torch.int16) != n_dst.view(torch.int16)).sum())
            if staged != v or not r["checksum_ok"] or diff:
                bad_versions += 1
                print("version %d: staged %d checksum_ok %s, %d elements differ" % (
                    v, staged, r["checksum_ok"], diff))
            hist = json.loads(harness.dtectl(sock, "--json", "history", JOB,
                                             timeout=30).stdout)["versions"]
            h = [x for x in hist if int(x["version"]) == v][0]
            out.append((v, lr, bool(info["dense"]), h.get("reason", ""),
                        100.0 * info["changed"] / max(info["elements"], 1)))
            print("%s: v%d lr=%g %s changed=%.1f%% %s" % (
                mode, v, lr, "dense" if info["dense"] else "sparse", out[-1][4], out[-1][3]))
        c.check(bad_versions == 0, "%s: %d versions applied, checksum ok, sink = RNE(θ)" % (
            mode, len(lrs)))
        text = harness.dtectl(sock, "history", JOB, timeout=30).stdout
        out.append(text)
        cli.close()
    finally:
        rc = daemon.stop()
        for a in arenas:
            try:
                a.close()
            except BufferError:
                pass
        c.check(rc == 0, "%s: dted exited cleanly (%s)" % (mode, rc))
    return out


def main():
    c = Checks("sync-mode")
    auto = run(c, "auto")
    auto_text = auto.pop()
    c.check(auto[0][2] and "reason=initial" in auto[0][3], "auto: v1 dense, reason initial")
    low = auto[1:N_LOW]
    c.check(all(not d for _, _, d, _, _ in low),
            "auto: small learning rate (%.1f%% changed) stays sparse" % low[-1][4])
    high = auto[N_LOW:]
    cost = [x for x in high if x[2] and "mode=dense reason=cost" in x[3]]
    c.check(not high[0][2], "auto: the first version at the high rate is sparse (%.1f%% changed; "
            "the estimate still knows the low fraction)" % high[0][4])
    c.check(bool(cost), "auto: a version at the high rate goes dense for cost")
    if cost:
        m = re.search(r"sparse_est_s=([0-9.e+-]+) dense_est_s=([0-9.e+-]+)", cost[0][3])
        c.check(m is not None and float(m.group(2)) < float(m.group(1)),
                "auto: its reason names both estimates, dense below sparse: %s" % cost[0][3])
    c.check("reason=cost" in auto_text and "dense_est_s" in auto_text,
            "auto: dtectl history prints the reason")
    forced = run(c, "sparse")
    forced.pop()
    c.check(all(not d for _, _, d, _, _ in forced[1:]) and
            all("reason=forced" in r for _, _, _, r, _ in forced[1:]),
            "sparse: every version after the first sparse, reason forced")
    c.finish(cost_versions=len(cost), first_cost_version=cost[0][0] if cost else 0,
             high_changed_pct="%.1f" % high[-1][4])


if __name__ == "__main__":
    main()

"""Codec figure: bytes per changed BF16 element on real torch AdamW steps.

A small MLP (about 8.4M parameters) regresses random data with
torch.optim.AdamW.  For every learning rate of the sweep it starts from the
same weights and state, takes WARM steps at that rate (so the moments look
like a run at that rate), and measures the next step: the elements whose
BF16 rounding changed, written as a dte-storage delta file.  That set is
then encoded
  - same-cluster: bench_codec (gpu/codec.h sparse payload, chunk framed
    raw and with zstd level 1, as a remote pair sends it);
  - storage: `dte-storage write` (daemon/storage chunk codec, gap codes and
    high/low bytes in separate zstd frames), size from `dte-storage ls`.
Values are included in every byte count.
"""

import json
import os
import struct
import subprocess
import tempfile

import numpy as np
import torch

LRS = [1e-7, 3e-7, 1e-6, 3e-6, 1e-5, 3e-5, 1e-4]
WARM = 3


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                               torch.nn.Linear(4096, 1024), torch.nn.GELU(),
                               torch.nn.Linear(1024, 1024))


def bf16(m):
    with torch.no_grad():
        return np.concatenate([p.detach().reshape(-1).to(torch.bfloat16).view(torch.int16)
                               .numpy().view(np.uint16) for p in m.parameters()])


def write_delta(path, numel, prev, cur):
    out = [b"DTSD1\0\0\0", struct.pack("<II", len(numel), 0)]
    changed, off = 0, 0
    for n in numel:
        idx = np.nonzero(prev[off:off + n] != cur[off:off + n])[0].astype("<u8")
        out += [struct.pack("<Q", len(idx)), idx.tobytes(),
                cur[off:off + n][idx].astype("<u2").tobytes()]
        changed += len(idx)
        off += n
    with open(path, "wb") as f:
        f.write(b"".join(out))
    return changed


def kv(line):
    return {k: v for k, v in (x.split("=", 1) for x in line.split() if "=" in x)}


def storage_run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s failed: %s" % (" ".join(cmd[:2]), r.stderr.strip()))
    return r.stdout


def one_lr(lr, base_state, numel, tmp, tools, x, y):
    m = model()
    m.load_state_dict(base_state)
    opt = torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.01, foreach=False)

    def step():
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()

    for _ in range(WARM):
        step()
    prev = bf16(m)
    step()
    cur = bf16(m)
    # What the daemon sends for this step: dtc_detect over θ, m, v (guard
    # band included) and AReaL-DTE's margin rule, on the same state.
    state = os.path.join(tmp, "state-%g.bin" % lr)
    with open(state, "wb") as f:
        off = 0
        for prm in m.parameters():
            st = opt.state[prm]
            n = prm.numel()
            for t in (prm.detach(), st["exp_avg"], st["exp_avg_sq"]):
                f.write(t.reshape(-1).to(torch.float32).numpy().astype("<f4").tobytes())
            f.write(prev[off:off + n].astype("<u2").tobytes())
            off += n
        g = opt.param_groups[0]
        steps = {int(float(opt.state[prm]["step"])) for prm in m.parameters()}
        assert len(steps) == 1, steps
    r = subprocess.run([tools["bench_codec"], "--detect", state, ",".join(str(n) for n in numel),
                        repr(g["lr"]), repr(g["betas"][0]), repr(g["betas"][1]), repr(g["eps"]),
                        repr(g["weight_decay"]), str(steps.pop())],
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError("bench_codec --detect: %s" % r.stderr.strip())
    dt = kv(r.stdout.strip().splitlines()[-1])
    os.unlink(state)
    delta = os.path.join(tmp, "delta-%g.bin" % lr)
    changed = write_delta(delta, numel, prev, cur)
    r = subprocess.run([tools["bench_codec"], delta, ",".join(str(n) for n in numel)],
                       capture_output=True, text=True, check=True)
    cl = kv(r.stdout.strip().splitlines()[-1])
    if int(cl["changed"]) != changed:
        raise RuntimeError("bench_codec counted %s changes, torch %d" % (cl["changed"], changed))
    if int(dt["changed"]) != changed:
        raise RuntimeError("bench_codec --detect counted %s changes, torch %d" % (dt["changed"],
                                                                                changed))
    spec = os.path.join(tmp, "spec.json")
    with open(spec, "w") as f:
        json.dump({"tensors": [{"name": "t%d" % i, "numel": n} for i, n in enumerate(numel)]}, f)
    root = os.path.join(tmp, "store-%g" % lr)
    os.mkdir(root)
    dense = os.path.join(tmp, "dense.bin")
    prev.astype("<u2").tofile(dense)
    st = tools["dte_storage"]
    storage_run([st, "write", root, "codec", "--spec", spec, "--version", "0", "--dense", dense,
                 "--keyframe"])
    cur.astype("<u2").tofile(dense)
    storage_run([st, "write", root, "codec", "--spec", spec, "--version", "1", "--delta", delta,
                 "--dense", dense])
    ls = json.loads(subprocess.run([st, "ls", root, "codec", "--json"], capture_output=True,
                                   text=True, check=True).stdout)
    v1 = next(v for v in ls["versions"] if v["version"] == 1)
    if v1["changed"] != changed:
        raise RuntimeError("dte-storage stored %d changes, torch %d" % (v1["changed"], changed))
    total = int(sum(numel))
    return {"lr": lr, "changed": changed, "elements": total,
            "changed_pct": 100.0 * changed / total,
            "cluster_raw": int(cl["raw_bytes"]), "cluster_zstd": int(cl["zstd_bytes"]),
            "storage": int(v1["delta_bytes"]), "dense": 2 * total,
            "flagged": int(dt["flagged"]), "wire_raw": int(dt["raw_bytes"]),
            "wire_zstd": int(dt["zstd_bytes"]), "zstd_ms": float(dt["zstd_ms"]),
            "unzstd_ms": float(dt["unzstd_ms"]), "dte_flagged": int(dt["dte_flagged"]),
            "dte_bytes": int(dt["dte_bytes"])}


def run(tools, log=print):
    torch.set_num_threads(2)
    m = model()
    base_state = {k: v.clone() for k, v in m.state_dict().items()}
    numel = [p.numel() for p in m.parameters()]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 1024, generator=g)
    y = torch.randn(256, 1024, generator=g)
    rows = []
    with tempfile.TemporaryDirectory(prefix="dte-bench-codec-") as tmp:
        for lr in LRS:
            r = one_lr(lr, base_state, numel, tmp, tools, x, y)
            ch = max(r["changed"], 1)
            r["bpc_cluster_raw"] = r["cluster_raw"] / ch
            r["bpc_cluster_zstd"] = r["cluster_zstd"] / ch
            r["bpc_storage"] = r["storage"] / ch
            r["bpc_wire"] = r["wire_raw"] / ch
            r["bpc_wire_zstd"] = r["wire_zstd"] / ch
            r["bpc_dte"] = r["dte_bytes"] / ch
            # zstd pays off on a link slower than the bits it saves per
            # second of packing and unpacking (one core each, measured).
            zs = (r["zstd_ms"] + r["unzstd_ms"]) / 1e3
            r["zstd_breakeven_gbit"] = ((r["wire_raw"] - r["wire_zstd"]) * 8 / zs / 1e9
                                        if zs > 0 else 0.0)
            log("codec-detail: lr=%g changed=%.3f%% flagged=%.3f%% wire_Bpc=%.3f "
                "wire_zstd_Bpc=%.3f dte_Bpc=%.3f storage_Bpc=%.3f zstd_ms=%.1f unzstd_ms=%.1f "
                "zstd_breakeven_gbit=%.2f" % (
                    lr, r["changed_pct"], 100.0 * r["flagged"] / r["elements"], r["bpc_wire"],
                    r["bpc_wire_zstd"], r["bpc_dte"], r["bpc_storage"], r["zstd_ms"],
                    r["unzstd_ms"], r["zstd_breakeven_gbit"]))
            rows.append(r)
    return {"elements": int(sum(numel)), "tensors": len(numel), "warm": WARM, "rows": rows}

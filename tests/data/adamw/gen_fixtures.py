#!/opt/dted-venv/bin/python
"""Ground truth for the element math: real AdamW steps recorded to disk.

tests/unit/test_elem.c and tests/unit/test_job.c read these files instead of
trusting the product's own forward (gpu/elem.h), so the inverse and the
detector are checked against what the optimizers really computed.

Run from the repo root, once per interpreter (each writes only the flavours
its torch provides; the committed files come from these two runs):

    /opt/dted-venv/bin/python tests/data/adamw/gen_fixtures.py   # torch 2.13
    /usr/bin/python3 tests/data/adamw/gen_fixtures.py            # torch 1.13

Flavours (one file each, tests/data/adamw/<flavour>.bin):
  torch<V>-single   torch.optim.AdamW(foreach=False): _single_tensor_adam
                    (torch/optim/adam.py) -- param.mul_(1 - lr*wd), then
                    param.addcdiv_(exp_avg, exp_avg_sq.sqrt()/bc2**0.5 + eps,
                    value=-lr/bc1)
  torch<V>-foreach  foreach=True: _multi_tensor_adam, the same algebra in
                    torch._foreach_* ops
  torch<V>-fused    fused=True on CPU: aten/src/ATen/native/cpu/
                    FusedAdamKernel.cpp adam_math<float, ADAMW> (torch >= 2.4)
  te-order          Transformer Engine FusedAdam, adam_w_mode=1
                    (transformer_engine/common/multi_tensor/adam.cu
                    adam_update, ADAM_MODE_1) in FP32 numpy, one rounding per
                    operation (as nvcc --fmad=false would compile it):
                    update = (m/bc1)/(sqrt(v/bc2)+eps) + wd*p; p = p - lr*update
  te-fma            the same kernel as nvcc compiles it by default (--fmad=true
                    contracts both): update = fma(wd, p, mhat/denom);
                    p = fma(-lr, update, p); each fma rounded once, exactly
                    (rational arithmetic), so no double rounding creeps in.
The TE flavours need CUDA upstream; they are written from the kernel source,
the torch flavours are torch itself.  Only θ's update order matters to the
inverse (m and v are read after the step), so the TE moments are computed
plainly.

File format (little endian):
  "DTEADW2\\0"  u32 ncases
  per case:
    char name[48]  i32 variant (0 torch, 1 fused/TE)
    f64 lr, beta1, beta2, eps, weight_decay
    u32 n  u32 steps  i64 step0 (the optimizer's count before the first
                                 recorded step; earlier steps ran unrecorded)
    f32 theta0[n]  u16 bf16_0[n]     (θ after step0 and its BF16)
    steps x { i64 step (count after the step)
              f32 grad[n] f32 theta[n] f32 exp_avg[n] f32 exp_avg_sq[n]
              f32 sqrt[n] u16 bf16[n] }
    bf16: theta.to(torch.bfloat16) bits.  sqrt: the square root the
    optimizer took, as that runtime computes it (torch flavours:
    exp_avg_sq.sqrt() with the same torch -- the torch 2.13 CPU wheel on an
    AVX512 machine is off by an ulp from IEEE sqrt in about 20% of inputs,
    torch 1.13 from Debian is IEEE; the CPU fused kernel's in-kernel
    Vectorized<float>::sqrt() is IEEE; TE flavours: IEEE sqrtf of
    exp_avg_sq / bc2).  test_elem.c checks each against torch's θ.
BF16 is always torch's own rounding (the TE flavours round through torch too).
"""
import os
import struct
import sys
from fractions import Fraction

import numpy as np
import torch

N = 192
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)))

# name, lr, betas, eps, weight decay, warm-up steps (unrecorded), recorded
# steps, gradient scale
CASES = [
    ("fresh lr1e-3 wd0.1", 1e-3, (0.9, 0.999), 1e-8, 0.1, 0, 4, 1e-3),
    ("warm200 lr1e-4 wd0 b2=.95", 1e-4, (0.9, 0.95), 1e-8, 0.0, 200, 3, 1e-3),
    ("eps-dominant lr1e-2 wd0.01", 1e-2, (0.9, 0.999), 1e-6, 0.01, 0, 3, 1e-9),
    ("rl lr1e-5 wd0.1", 1e-5, (0.9, 0.999), 1e-8, 0.1, 5, 3, 1e-3),
]


def f32_bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def bits_f32(b):
    return np.asarray(b, dtype=np.uint32).view(np.float32)


def initial_theta(rng):
    """Weights of every kind the detector must get right."""
    th = (rng.standard_normal(N) * 0.02).astype(np.float32)
    q = N // 8
    # near BF16 rounding midpoints, a few ulps either side
    hi = rng.integers(0x3a00, 0x3f80, q).astype(np.uint32) | (rng.integers(0, 2, q).astype(np.uint32) << 15)
    th[q:2 * q] = bits_f32((hi << 16) + 0x8000 + rng.integers(-24, 25, q).astype(np.int64).astype(np.uint32))
    # just below / at powers of two (the ulp halves across the edge)
    e = rng.integers(115, 128, q).astype(np.uint32)
    th[2 * q:3 * q] = bits_f32((e << 23) - rng.integers(0, 40, q).astype(np.uint32))
    th[3 * q:3 * q + q // 2] = 0.0
    # tiny, some subnormal
    tiny = rng.standard_normal(q // 2) * np.float32(10.0) ** -rng.integers(6, 40, q // 2)
    th[3 * q + q // 2:4 * q] = tiny.astype(np.float32)
    # large
    th[4 * q:5 * q] = (rng.standard_normal(q) * 30).astype(np.float32)
    return th


def grads(rng, steps, scale):
    g = (rng.standard_normal((steps, N)) * scale).astype(np.float32)
    heavy = rng.random((steps, N)) < 0.05
    g[heavy] *= np.float32(40)
    idx = np.arange(N)
    g[:, idx % 8 == 0] = 0.0               # never a gradient: θ only decays
    g[2:, idx % 8 == 1] = 0.0              # gradient stops after two steps
    return g


def bf16(a):
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def run_torch(kind, lr, betas, eps, wd, th0, g):
    p = torch.nn.Parameter(torch.from_numpy(th0.copy()))
    kw = {"foreach": kind == "foreach"}
    if kind == "fused":
        kw = {"fused": True}
    opt = torch.optim.AdamW([p], lr=lr, betas=betas, eps=eps, weight_decay=wd, **kw)
    for s in range(g.shape[0]):
        p.grad = torch.from_numpy(g[s].copy())
        opt.step()
        st = opt.state[p]
        step = st["step"]
        step = int(step.item()) if torch.is_tensor(step) else int(step)
        v = st["exp_avg_sq"].clone()
        # the fused CPU kernel takes Vectorized<float>::sqrt() inside the
        # kernel (an IEEE instruction); the others call the sqrt op
        sq = np.sqrt(v.numpy()) if kind == "fused" else v.sqrt().numpy()
        yield step, p.detach().numpy().copy(), st["exp_avg"].numpy().copy(), v.numpy(), sq


def round_f32(q):
    """Exact rational -> float32, round to nearest even."""
    if q == 0:
        return 0.0
    neg = q < 0
    q = -q if neg else q
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if Fraction(2) ** e > q:
        e -= 1
    quantum = Fraction(2) ** (max(e, -126) - 23)
    n = q / quantum
    fl = n.numerator // n.denominator
    rem = n - fl
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and fl % 2):
        fl += 1
    r = fl * quantum
    if r >= Fraction(2) ** 128 - Fraction(2) ** 103:
        v = float("inf")
    else:
        v = float(r)
    return -v if neg else v


def fma32(a, b, c):
    return np.float32(round_f32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))))


def run_te(fma, lr, betas, eps, wd, th0, g):
    f = np.float32
    b1, b2, e, lr32, wd32 = f(betas[0]), f(betas[1]), f(eps), f(lr), f(wd)
    p, m, v = th0.copy(), np.zeros(N, np.float32), np.zeros(N, np.float32)
    for s in range(g.shape[0]):
        t = s + 1
        # fused_adam.py computes the corrections in Python, the kernel gets floats
        bc1, bc2 = f(1 - betas[0] ** t), f(1 - betas[1] ** t)
        m = b1 * m + (f(1) - b1) * g[s]
        v = b2 * v + (f(1) - b2) * g[s] * g[s]
        mhat = m / bc1
        denom = np.sqrt(v / bc2) + e
        q = mhat / denom
        if fma:
            upd = np.array([fma32(wd32, p[i], q[i]) for i in range(N)], np.float32)
            p = np.array([fma32(-lr32, upd[i], p[i]) for i in range(N)], np.float32)
        else:
            upd = q + wd32 * p
            p = p - lr32 * upd
        yield t, p.copy(), m.copy(), v.copy(), np.sqrt(v / bc2)


def write(path, cases):
    with open(path, "wb") as fp:
        fp.write(b"DTEADW2\0" + struct.pack("<I", len(cases)))
        for c in cases:
            fp.write(struct.pack("<48si5d2Iq", c["name"].encode()[:47], c["variant"], c["lr"],
                                 c["betas"][0], c["betas"][1], c["eps"], c["wd"], N,
                                 len(c["steps"]), c["step0"]))
            fp.write(c["th0"].astype("<f4").tobytes() + bf16(c["th0"]).astype("<u2").tobytes())
            for step, gs, th, m, v, sq in c["steps"]:
                fp.write(struct.pack("<q", step))
                for a in (gs, th, m, v, sq):
                    fp.write(np.ascontiguousarray(a, dtype="<f4").tobytes())
                fp.write(bf16(th).astype("<u2").tobytes())
    print(f"{os.path.relpath(path)}: cases={len(cases)} bytes={os.path.getsize(path)}")


def flavour(name, variant, runner):
    cases = []
    for ci, (cname, lr, betas, eps, wd, warm, steps, gscale) in enumerate(CASES):
        rng = np.random.default_rng(1000 + ci)
        th0 = initial_theta(rng)
        g = grads(rng, warm + steps, gscale)
        rec = []
        start = th0
        for k, (step, th, m, v, sq) in enumerate(runner(lr, betas, eps, wd, th0, g)):
            if k == warm - 1:
                start = th
            if k >= warm:
                rec.append((step, g[k], th, m, v, sq))
        cases.append({"name": cname, "variant": variant, "lr": lr, "betas": betas, "eps": eps,
                      "wd": wd, "step0": warm, "th0": start, "steps": rec})
    write(os.path.join(OUT, name + ".bin"), cases)


def main():
    torch.set_num_threads(1)
    ver = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    kinds = ["single", "foreach"]
    major, minor = (int(x) for x in ver.split("."))
    if (major, minor) >= (2, 4):
        kinds.append("fused")        # CPU fused AdamW exists from torch 2.4
    if (major, minor) < (2, 0):
        kinds = ["single"]           # the old torch: its single-tensor form only
    for kind in kinds:
        flavour(f"torch{ver}-{kind}", 0,
                lambda lr, b, e, wd, th0, g, kind=kind: run_torch(kind, lr, b, e, wd, th0, g))
    if (major, minor) >= (2, 0):
        flavour("te-order", 1, lambda lr, b, e, wd, th0, g: run_te(False, lr, b, e, wd, th0, g))
        flavour("te-fma", 1, lambda lr, b, e, wd, th0, g: run_te(True, lr, b, e, wd, th0, g))
    return 0


if __name__ == "__main__":
    sys.exit(main())

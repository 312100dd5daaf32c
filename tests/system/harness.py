"""What the Python system tests share: where the tree and the build are,
the ASan re-exec, starting one dted, dtectl, and the bit-exactness check.

Importing this sets ROOT/B (B made absolute and exported, so daemons and
child processes see the same build) and puts client/python on sys.path.
It must not import torch: the ASan re-exec has to happen before anything
loads libdte, so torch (and dte.*) are imported by the callers afterwards
or lazily here.
"""

import os
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PYDIR = os.path.join(ROOT, "client", "python")
if PYDIR not in sys.path:
    sys.path.insert(0, PYDIR)
B = os.environ.get("B", "build")
if not os.path.isabs(B):
    B = os.path.join(ROOT, B)
os.environ["B"] = B
DTED = os.path.join(B, "bin", "dted")
# The test build (tests/faults/faults.mk): the production daemon plus the
# test hooks.  Only it reads DTE_TEST_HOOK; DTED ignores the variable.
DTED_FAULTS = os.path.join(B, "tests", "dted-faults")
DTECTL = os.path.join(B, "bin", "dtectl")

from dte import demo  # noqa: E402  (stdlib only: safe before the ASan re-exec)


# ------------------------------------------------------------------- ASan
# Two rules, on purpose.  asan_preload_reexec keeps the preload for every
# child (the single-daemon tests spawn sink processes that load libdte
# too, and their dted is sanitized on its own).  asan_reexec remembers the
# caller's ASAN_OPTIONS so child_env can hand daemons and tools the
# caller's environment back without the preload.

VLLM_PY = "/opt/dted-vllm/bin/python"


def venv_reexec(python, what="scripts/install-deps.sh makes it"):
    """Run this script again under `python` (a venv's interpreter) unless
    it already runs there; a missing venv is a failure, never a skip."""
    venv = os.path.dirname(os.path.dirname(python))
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        return
    if not os.access(python, os.X_OK):
        print("FAIL: %s is missing: %s" % (python, what))
        sys.exit(1)
    os.execv(python, [python] + sys.argv)


def asan_preload_reexec(guard):
    """When B is an ASan build, run this script again with the ASan runtime
    preloaded (leak checks off for Python itself); guard names the variable
    that marks the second run."""
    if "asan" not in os.path.basename(B) or os.environ.get(guard):
        return
    rt = subprocess.run(["cc", "-print-file-name=libasan.so"], capture_output=True,
                        text=True).stdout.strip()
    env = dict(os.environ, LD_PRELOAD=rt,
               ASAN_OPTIONS="detect_leaks=0:" + os.environ.get("ASAN_OPTIONS", ""))
    env[guard] = "1"
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


def asan_reexec(argv=None):
    """A sanitizer build's libdte needs the ASan runtime loaded first in
    the Python process that ctypes-loads it: re-exec once (argv, by default
    this script) with the runtime libdte links against preloaded.  The
    demo's rule (dte.demo), so tests and demo cannot drift apart."""
    demo.asan_reexec(argv or [sys.executable] + sys.argv)


# Environment for dted/tools: no preload, the caller's ASAN_OPTIONS.
child_env = demo.child_env


# ------------------------------------------------------------------ daemon
def hook_binary_check(binary, env):
    """A test that sets DTE_TEST_HOOK must run the test build: the
    production dted ignores the variable, so its fault would never land."""
    for var in ("DTE_TEST_HOOK", "DTE_STORAGE_HOOK"):
        if (env or {}).get(var) and os.path.basename(binary) == "dted":
            raise RuntimeError("%s=%s given to the production dted %s, which ignores "
                               "it: run harness.DTED_FAULTS" % (var, env[var], binary))


def start_dted(dirpath, name, log, conf_name="dted.conf", sock_name="dted.sock",
               extra_conf="", env=None, dted=None):
    """Write dirpath/conf_name ([daemon] node_name, log_level = info, then
    extra_conf) and start a foreground dted (the program dted, default
    DTED) on dirpath/sock_name listening for peers on loopback; stdout and
    stderr go to the open file log.  Returns (proc, sock).  The caller
    waits (wait_socket) and stops it."""
    dted = dted or DTED
    hook_binary_check(dted, env)
    sock = os.path.join(dirpath, sock_name)
    conf = os.path.join(dirpath, conf_name)
    with open(conf, "w") as f:
        f.write("[daemon]\nnode_name = %s\nlog_level = info\n%s" % (name, extra_conf))
    proc = subprocess.Popen([dted, "--foreground", "--config", conf, "--socket", sock,
                             "--peer-listen", "127.0.0.1:0"], stdout=log, stderr=log, env=env)
    return proc, sock


def wait_socket(sock, tries=400, proc=None):
    """Wait until the control socket accepts a connection (polled every
    50 ms, for tries * 50 ms of wall time: 20 s by default).  The file alone
    is not enough: it exists from bind(), before listen(), and a connect in
    between is refused.  Raises RuntimeError, naming the socket, when it
    never accepts or when proc (the daemon's Popen, if given) exits first: a
    daemon that never came up stops the test here, loudly."""
    import socket
    deadline = time.time() + tries * 0.05
    while True:
        if os.path.exists(sock):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(sock)
                return
            except OSError:
                pass
            finally:
                s.close()
        if proc is not None and proc.poll() is not None:
            raise RuntimeError("dted exited with status %s before accepting on its socket %s"
                               % (proc.returncode, sock))
        if time.time() >= deadline:
            raise RuntimeError("dted's control socket %s did not accept within %.1f s"
                               % (sock, tries * 0.05))
        time.sleep(0.05)


def dtectl(sock, *args, **kw):
    """dtectl --socket sock args...; the CompletedProcess, text mode."""
    return subprocess.run([DTECTL, "--socket", sock] + list(args), capture_output=True,
                          text=True, **kw)


def parse_metrics(text):
    """`dtectl metrics` output (Prometheus text) as {name{labels}: value}."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
    return out


def arrival_count(m, event):
    """dted_apply_on_arrival_total{event} in a parse_metrics() dict (0 when
    the daemon has not counted any yet)."""
    return m.get('dted_apply_on_arrival_total{event="%s"}' % event, 0.0)


# ---------------------------------------------------------------- checking
def groups_of(rec):
    """A captured step's optimizer groups as the dicts publish takes."""
    return [{"lr": g.lr, "beta1": g.beta1, "beta2": g.beta2, "eps": g.eps,
             "weight_decay": g.weight_decay} for g in rec["groups"]]


def expected_sglang(model, cfg, tp):
    """RNE(θ_t) of the trainer's FP32 weights, converted independently
    (dte.sglang.hf_to_sglang): one dict of BF16 tensors per sink rank."""
    import collections
    import torch
    from dte import sglang
    hf = collections.OrderedDict((n, t.to(torch.bfloat16)) for n, t in model.to_hf().items())
    return sglang.hf_to_sglang(hf, cfg, tp)


def mismatches(want, got, prefix=""):
    """Every tensor of want whose bits differ from got's (compared as int16,
    so -0/+0 and NaN payloads count): "<prefix>name (n of total)"."""
    import torch
    bad = []
    for name, w in want.items():
        g = got[name]
        if not torch.equal(w.view(torch.int16), g.view(torch.int16)):
            n = int((w.view(torch.int16) != g.view(torch.int16)).sum())
            bad.append("%s%s (%d of %d)" % (prefix, name, n, w.numel()))
    return bad

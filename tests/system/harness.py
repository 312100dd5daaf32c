"""What the Python system tests share: where the tree and the build are,
the ASan re-exec, the daemon fixture (Daemon: every test and benchmark
starts its dted through it), dtectl, and the bit-exactness check.

Importing this sets ROOT/B (B made absolute and exported, so daemons and
child processes see the same build) and puts client/python on sys.path.
It must not import torch: the ASan re-exec has to happen before anything
loads libdte, so torch (and dte.*) are imported by the callers afterwards
or lazily here.
"""

import atexit
import json
import os
import signal
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


def vllm_cpu_env():
    """The CPU engine settings the vLLM tests share (defaults: a caller's
    own values win)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "VLLM_RPC_BASE_PATH" not in os.environ:
        # vLLM's ZMQ ipc sockets (utils/network_utils.py get_open_zmq_ipc_path:
        # VLLM_RPC_BASE_PATH, default the temporary directory), about 20 an
        # engine, are never removed: in a directory of the test's own, gone
        # when it ends (its engines' processes inherit the variable).
        import shutil
        import tempfile
        d = tempfile.mkdtemp(prefix="dte-vllm-rpc-")
        os.environ["VLLM_RPC_BASE_PATH"] = d
        atexit.register(shutil.rmtree, d, True)


def vllm_test_env(here):
    """A real-vLLM test's environment: `here` and client/python first on
    PYTHONPATH (vLLM's worker processes import the test's helpers and dte),
    then vllm_cpu_env()."""
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [here, PYDIR] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    vllm_cpu_env()


def vllm_plugin_env(here, omp_bind="auto"):
    """dte's vLLM general plugin entry point, as an installed dte declares
    it (group vllm.general_plugins, name dted), in a fresh dist-info
    directory on sys.path and PYTHONPATH (with `here` and client/python),
    plus the CPU engine settings the vLLM tests share.  Returns the
    directory (the caller removes it)."""
    import tempfile
    plugin = tempfile.mkdtemp(prefix="dte-vllm-plugin-")
    dist = os.path.join(plugin, "dte-0.1.0.dist-info")
    os.makedirs(dist)
    with open(os.path.join(dist, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: dte\nVersion: 0.1.0\n")
    with open(os.path.join(dist, "entry_points.txt"), "w") as f:
        f.write("[vllm.general_plugins]\ndted = dte.integrations.vllm_transfer:register\n")
    sys.path.insert(0, plugin)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [plugin, here, PYDIR] +
        [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    os.environ["VLLM_PLUGINS"] = "dted"
    vllm_cpu_env()
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind
    return plugin


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


# Every key of dted.conf (daemon/conf.c's keytab) the fixture writes from a
# keyword argument, by section.  [peer] listen_address/listen_port are not
# here: the daemon's --peer-listen flag (host, listen_port) sets them.
DAEMON_KEYS = ("node_name", "log_level", "runtime_dir", "socket", "socket_group",
               "allow_uids", "allow_gids", "max_frame_bytes", "max_clients",
               "compute_backend", "metrics_listen", "max_staged_versions",
               "verify_full_every", "job_state_dir", "mark_table_size", "sync_mode")
PEER_KEYS = ("advertise_address", "staging_size", "part_size", "auth", "auth_off_jobs",
             "relay_fanout", "relay_roots", "relay_lag_ms", "relay_shape",
             "relay_rate_max_age_ms")

SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")


def sanitizer_lines(text):
    """Lines of a daemon log that are sanitizer reports."""
    return [x for x in text.splitlines() if any(m in x for m in SANITIZER_MARKS)]


def _accepts(sock):
    """The control socket accepts a connection.  The file alone is not
    enough: it exists from bind(), before listen(), and a connect in
    between is refused (so is one to a stale socket left by a SIGKILL)."""
    import socket
    if not os.path.exists(sock):
        return False
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(sock)
        return True
    except OSError:
        return False
    finally:
        s.close()


_live = []      # every Daemon whose process may still run: killed at exit


def _kill_live():
    for d in list(_live):
        if d.proc is not None and d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


atexit.register(_kill_live)


class Daemon:
    """One real dted for a test: the one place the tests write a dted.conf
    and start the daemon (tests/bench and tests/faults too).

    Files, all in tmp: <name>.conf, <name>.log (appended to, a
    "--- start N ---" line before each start), <name>.sock (sock= gives
    another path) and, with job_state_dir=True, <name>.jobs/, so a
    restart() gets its jobs back (daemon/job_persist.c).

    The config: [daemon] node_name (default name), log_level (default
    info) and runtime_dir (default tmp), then any key of DAEMON_KEYS or
    PEER_KEYS given as a keyword argument (None: not written, dted's
    default), then daemon_conf (more [daemon] lines), then [peer] and
    peer_conf (more [peer] lines), then conf_text: raw text at the end, the
    escape hatch (it may open any section).

    The program: binary, else $B/tests/dted-faults when hook (the
    DTE_TEST_HOOK spec) is set, else $B/bin/dted, looked up at start()
    (B picks the build, build-asan/ included; the environment is
    child_env's: no ASan preload).  wrap (a command prefix: taskset,
    valgrind) runs it, inside `ip netns exec netns` when netns is set.
    It listens for peers on host:listen_port (--peer-listen) unless
    peer_listen is False.  Its environment: the test's (child_env), UCX on
    TCP over dev with a short keepalive (a killed peer is noticed in
    seconds), DTE_TEST_HOOK only when hook is set, then env (a value of
    None removes that variable).  hook_check=False lets a DTE_TEST_HOOK
    through to the production dted (prod_hooks.py checks that it ignores
    it); otherwise that is refused (hook_binary_check).

    start() waits, with a deadline and never a bare sleep, until the
    daemon is ready: ready="address" (the default with a peer listener)
    until `dtectl peers` gives its address, "socket" (the default
    without) until its control socket accepts, "none" not at all (a start
    that is to fail: wait_exit()).  It raises RuntimeError with the log's
    tail when the daemon exits first or the deadline passes, and leaves no
    process behind.  stop() (SIGTERM) and wait_exit() return the exit
    status; kill() is SIGKILL; restart() stops and starts again; close()
    (also `with Daemon(...) as d`) stops a running one; any daemon still
    running when the test's Python exits is SIGKILLed."""

    def __init__(self, tmp, name, host="127.0.0.1", listen_port=0, peer_listen=True,
                 netns=None, dev="lo", env=None, hook=None, binary=None, wrap=(), args=(),
                 sock=None, hook_check=True, daemon_conf="", peer_conf="", conf_text="",
                 **keys):
        self.tmp, self.name = tmp, name
        self.host, self.listen_port, self.peer_listen = host, listen_port, peer_listen
        self.netns, self.dev = netns, dev
        self.extra_env, self.hook, self.binary, self.wrap = dict(env or {}), hook, binary, wrap
        self.args, self.hook_check = list(args), hook_check
        self.sock = sock or os.path.join(tmp, name + ".sock")
        self.conf = os.path.join(tmp, name + ".conf")
        self.logpath = os.path.join(tmp, name + ".log")
        self.keys = {"node_name": name, "log_level": "info", "runtime_dir": tmp}
        self.daemon_conf, self.peer_conf, self.conf_text = daemon_conf, peer_conf, conf_text
        self.configure(**keys)
        self.proc = None
        self.address = None
        self.starts = 0
        self.log_off = 0         # where the current process's log begins
        self.killed = False      # SIGKILLed by the test (kill())
        self.hung = False        # did not exit on SIGTERM in time: SIGKILLed by stop()

    # ---------------------------------------------------------------- config
    def configure(self, daemon_conf=None, peer_conf=None, conf_text=None, **keys):
        """Change config keys (None: back to dted's default) and the extra
        texts; written by the next start() or write_conf()."""
        for k, v in keys.items():
            if k not in DAEMON_KEYS + PEER_KEYS:
                raise TypeError("harness.Daemon: %r is no dted.conf key this fixture knows "
                                "(DAEMON_KEYS, PEER_KEYS; or daemon_conf/peer_conf/conf_text)"
                                % k)
            self.keys[k] = v
        for attr, v in (("daemon_conf", daemon_conf), ("peer_conf", peer_conf),
                        ("conf_text", conf_text)):
            if v is not None:
                setattr(self, attr, v)
        return self

    def conf_body(self):
        def lines(names):
            out = []
            for k in names:
                v = self.keys.get(k)
                if k == "job_state_dir" and v is True:
                    v = os.path.join(self.tmp, self.name + ".jobs")
                if v is not None and v is not False:
                    out.append("%s = %s\n" % (k, v))
            return "".join(out)
        return "".join(["[daemon]\n", lines(DAEMON_KEYS), self.daemon_conf,
                        "[peer]\n", lines(PEER_KEYS), self.peer_conf, self.conf_text])

    def write_conf(self, raw=None, **changes):
        """Write the config file now (changes as configure() takes them);
        raw: write that text instead (a deliberately broken file)."""
        self.configure(**changes)
        with open(self.conf, "w") as f:
            f.write(self.conf_body() if raw is None else raw)
        return self.conf

    # --------------------------------------------------------------- process
    def program(self):
        return self.binary or (DTED_FAULTS if self.hook else DTED)

    def env(self):
        e = child_env({"UCX_TLS": "tcp", "UCX_NET_DEVICES": self.dev,
                       "UCX_KEEPALIVE_INTERVAL": os.environ.get("UCX_KEEPALIVE_INTERVAL",
                                                                "1s")})
        e.pop("DTE_TEST_HOOK", None)
        if self.hook:
            e["DTE_TEST_HOOK"] = self.hook
        for k, v in self.extra_env.items():
            if v is None:
                e.pop(k, None)
            else:
                e[k] = v
        return e

    def command(self):
        cmd = list(self.wrap) + [self.program(), "--foreground", "--config", self.conf,
                                 "--socket", self.sock]
        if self.peer_listen:
            cmd += ["--peer-listen", "%s:%d" % (self.host, self.listen_port)]
        cmd += self.args
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns] + cmd
        return cmd

    def start(self, timeout=20.0, ready=None):
        if self.running():
            raise RuntimeError("dted %s: start() while it runs (pid %d)"
                               % (self.name, self.proc.pid))
        env = self.env()
        if self.hook_check:
            hook_binary_check(self.program(), env)
        self.write_conf()
        with open(self.logpath, "a") as log:
            log.write("--- start %d ---\n" % self.starts)
            log.flush()
            self.log_off = log.tell()
            self.starts += 1
            self.killed = self.hung = False
            self.address = None
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=log, env=env)
        if self not in _live:
            _live.append(self)
        ready = ready or ("address" if self.peer_listen else "socket")
        if ready == "none":
            return self
        end = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("dted %s exited with status %s before it was ready: %s" % (
                    self.name, self.proc.returncode, self.log_tail()))
            if _accepts(self.sock):
                if ready == "socket":
                    return self
                p = self.ctl_json("peers", check=False)
                if p and p.get("address"):
                    self.address = p["address"]
                    return self
            if time.time() >= end:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError("dted %s was not ready (%s) within %.0f s: %s" % (
                    self.name, ready, timeout, self.log_tail()))
            time.sleep(0.05)

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def stop(self, timeout=20.0):
        """SIGTERM and the exit status; one that does not exit within
        timeout is SIGKILLed, marked hung, and -9 returned."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.hung = True
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self, unlink=True):
        """SIGKILL: no goodbye to peers, no socket cleanup (unlink=True
        removes the socket file the daemon leaves).  The exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.killed = True
            self.proc.wait()
        if unlink and os.path.exists(self.sock):
            os.unlink(self.sock)
        return self.proc.returncode

    def wait_exit(self, timeout=20.0):
        """The exit status of a daemon that is to end by itself; None when
        it still runs after timeout."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def restart(self, kill=False, timeout=20.0, ready=None):
        """Stop (SIGTERM, or SIGKILL with kill=True) and start again with
        the same config, socket and log; returns the old exit status."""
        rc = self.kill() if kill else self.stop()
        self.start(timeout, ready)
        return rc

    def hup(self):
        """SIGHUP: dted re-reads its config (write_conf() it first)."""
        self.proc.send_signal(signal.SIGHUP)

    def close(self):
        self.stop()
        if self in _live:
            _live.remove(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---------------------------------------------------------- control, log
    def ctl(self, *args, check=True, timeout=30, env=None):
        """dtectl --socket <sock> args: the CompletedProcess (text); check:
        a non-zero exit raises RuntimeError."""
        r = subprocess.run([DTECTL, "--socket", self.sock] + list(args), capture_output=True,
                           text=True, timeout=timeout, env=env or child_env())
        if check and r.returncode != 0:
            raise RuntimeError("dtectl %s on %s: %s%s" % (" ".join(args), self.name,
                                                          r.stdout, r.stderr))
        return r

    def ctl_json(self, *args, check=True, timeout=30):
        """dtectl --json args, decoded; None when it fails (check=False) or
        does not decode."""
        r = self.ctl("--json", *args, check=check, timeout=timeout)
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None

    def metrics(self):
        """`dtectl metrics` as parse_metrics gives it: {name{labels}: value}."""
        return parse_metrics(self.ctl("metrics").stdout)

    def peer(self, node):
        for x in (self.ctl_json("peers") or {}).get("peers", []):
            if x.get("node") == node:
                return x
        return None

    def log_text(self):
        """The whole log, every start's."""
        try:
            with open(self.logpath, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def log_since(self):
        """The log of the current (last started) process only."""
        try:
            with open(self.logpath, errors="replace") as f:
                f.seek(self.log_off)
                return f.read()
        except OSError:
            return ""

    def log_tail(self, n=30):
        return "\n".join(self.log_text().splitlines()[-n:])

    def wait_log(self, needle, timeout=20.0):
        """Until needle is in the current process's log; False after timeout."""
        end = time.time() + timeout
        while needle not in self.log_since():
            if time.time() >= end:
                return False
            time.sleep(0.05)
        return True

    def sanitizer_reports(self):
        return sanitizer_lines(self.log_text())


def dtectl(sock, *args, **kw):
    """dtectl --socket sock args...; the CompletedProcess, text mode."""
    return subprocess.run([DTECTL, "--socket", sock] + list(args), capture_output=True,
                          text=True, **kw)


def sink_versions(sock, job):
    """{(replica, rank): (version, staged, checksum_failures)} of the job's
    sinks as the daemon reports them (`dtectl --json job`), or {"error":
    ...}: what a test compares with, not through the integration code."""
    st = dtectl(sock, "--json", "job", job)
    if st.returncode != 0:
        return {"error": st.stderr.strip()}
    out = {}
    for p in json.loads(st.stdout).get("participants", []):
        if p.get("role") == "sink":
            out[(int(p.get("replica", 0)), int(p["rank"]))] = (
                int(p.get("version", 0)), int(p.get("staged", 0)),
                int(p.get("checksum_failures", 0)))
    return out


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

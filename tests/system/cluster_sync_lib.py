"""Multi-daemon plumbing for the cluster sync tests: real dted processes on
loopback or in network namespaces joined by a bridge, their control
sockets, logs, SIGKILL and restart, and dte-peer-forge.

Control sockets are filesystem paths, so the test process (in the host
namespace) reaches every daemon and hands it memfds, wherever the daemon's
network lives; only daemon-to-daemon traffic crosses the namespaces.
"""

import os
import shutil
import subprocess
import tempfile

import harness

# One implementation each in harness.py; the names stay here for importers.
B, DTED, DTECTL = harness.B, harness.DTED, harness.DTECTL
DTED_FAULTS = harness.DTED_FAULTS
asan_reexec, child_env = harness.asan_reexec, harness.child_env

FORGE = os.path.abspath(os.path.join(B, "bin", "dte-peer-forge"))


def Daemon(tmp, name, **kw):
    """The daemon fixture (harness.Daemon: config file, control socket,
    log, peer listener, netns, SIGKILL and restart) with the cluster tests'
    one default: jobs kept in <tmp>/<name>.jobs, so a restarted daemon (the
    faults' coord-restart) gets them back (daemon/job_persist.c)."""
    kw.setdefault("job_state_dir", True)
    return harness.Daemon(tmp, name, **kw)


def forge(to, records, node="forge", expect=0, wait_ms=None, netns=None, dev="lo"):
    """Run dte-peer-forge; returns (exit status, stdout lines).  wait_ms:
    how long it stays connected for answers (default 1.5 s; with expect,
    up to 30 s: it leaves as soon as the expected records came).  Once,
    beside two CPU hogs and two other tests, a sink daemon answered none of
    two forged COUNTS within 1.5 s and never logged them: the forge had
    gone, and with its link what it sent."""
    if wait_ms is None:
        wait_ms = 30000 if expect else 1500
    cmd = [FORGE, "--to", to, "--node", node, "--wait-ms", str(wait_ms)]
    if expect:
        cmd += ["--expect", str(expect)]
    cmd += list(records)
    if netns:
        cmd = ["ip", "netns", "exec", netns] + cmd
    env = child_env({"UCX_TLS": "tcp", "UCX_NET_DEVICES": dev})
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    return r.returncode, r.stdout.splitlines() + r.stderr.splitlines()


class Netns:
    """n namespaces, each with a veth into a bridge that lives in a hub
    namespace (nothing is added to the host's own network).  Node i gets
    10.232.<tag>.<i+1>/24 on its veth.  Removed by close(), also after a
    failure (the test calls it from finally)."""

    def __init__(self, n):
        self.tag = os.getpid() % 200 + 20
        base = "dtc%d" % os.getpid()
        self.hub = base + "h"
        self.names = ["%sn%d" % (base, i) for i in range(n)]
        self.devs = ["dtcv%d_%d" % (os.getpid() % 100000, i) for i in range(n)]
        self.addrs = ["10.232.%d.%d" % (self.tag, i + 1) for i in range(n)]
        self.made = []

    @staticmethod
    def available():
        if os.geteuid() != 0 or not shutil.which("ip"):
            return False
        return subprocess.run(["ip", "netns", "list"], capture_output=True).returncode == 0

    def _ip(self, *args):
        subprocess.run(["ip"] + list(args), check=True, capture_output=True, timeout=20)

    def setup(self):
        self._ip("netns", "add", self.hub)
        self.made.append(self.hub)
        self._ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        self._ip("-n", self.hub, "link", "set", "br0", "up")
        for ns, dev, addr in zip(self.names, self.devs, self.addrs):
            peer = dev + "p"
            self._ip("netns", "add", ns)
            self.made.append(ns)
            self._ip("link", "add", dev, "netns", ns, "type", "veth", "peer", "name", peer,
                     "netns", self.hub)
            self._ip("-n", ns, "addr", "add", addr + "/24", "dev", dev)
            self._ip("-n", ns, "link", "set", "lo", "up")
            self._ip("-n", ns, "link", "set", dev, "up")
            self._ip("-n", self.hub, "link", "set", peer, "master", "br0")
            self._ip("-n", self.hub, "link", "set", peer, "up")
        return self

    def close(self):
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.made = []


class Workdir:
    def __init__(self, prefix):
        self.path = tempfile.mkdtemp(prefix=prefix)

    def close(self, keep=False):
        if not keep:
            shutil.rmtree(self.path, ignore_errors=True)


class Tp1Replica:
    """One SGLang TP=1 replica (sglang:tp=1, BF16 memfd arenas in this
    process) on daemon, its job created there with coordinator coord_addr
    and its rank attached as replica k: .cli, .part, .model."""

    LAYOUT = "sglang:tp=1"

    def __init__(self, k, daemon, coord_addr, job, token, cfg, label):
        import json
        from dte import _lib, sglang
        text = json.dumps(cfg)
        self.k, self.daemon = k, daemon
        self.cli = _lib.Client(daemon.sock)
        self.cli.job_create(job, text, token, coord_addr, 1)
        self.model = sglang.SGLangModel(cfg, tp=1, label=label, placement=self.LAYOUT)
        ids = []
        for _bid, length, name in _lib.layout_buffers(text, self.LAYOUT, _lib.SINK, 0):
            loc = self.model.arenas[0].loc(name)
            ids.append(self.cli.register_fd(loc.fd, loc.offset, length, _lib.BF16, name))
        self.part = self.cli.attach(job, token, _lib.SINK, self.LAYOUT, 0, ids, replica=k)

    def close(self):
        try:
            self.cli.close()
        except Exception:
            pass


class Tp1Trainer:
    """dte.megatron's stand-in trainer as megatron:tp=1 (FP32 theta, m, v
    in memfds, real torch AdamW) attached as the job's source on the
    coordinator's daemon, the job created there: .model, .trainer, .task,
    .cli, .src."""

    LAYOUT = "megatron:tp=1"

    def __init__(self, sock, job, token, cfg, label, lr, warmup):
        import json
        import torch
        from dte import _lib, megatron, toy
        text = json.dumps(cfg)
        torch.manual_seed(0)
        self.model = megatron.MegatronModel(cfg, tp=1, seed=0, label=label,
                                            placement=self.LAYOUT)
        self.trainer = megatron.Trainer(self.model, lr=lr, warmup=warmup)
        self.task = toy.ToyTask(cfg["vocab_size"])
        self.cli = _lib.Client(sock)
        self.cli.job_create(job, text, token, "local", 1)
        want = _lib.layout_buffers(text, self.LAYOUT, _lib.SOURCE, 0)
        ids = [self.cli.register_fd(self.model.arenas[0][kind].fd, 0, length, _lib.FP32, kind)
               for (_b, length, _n), kind in zip(want, ("param", "exp_avg", "exp_avg_sq"))]
        self.src = self.cli.attach(job, token, _lib.SOURCE, self.LAYOUT, 0, ids)


def peer_proto_version():
    """PEER_PROTO_VERSION of this tree (proto/peer_protocol.h)."""
    import re
    root = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    with open(os.path.join(root, "proto", "peer_protocol.h")) as f:
        return int(re.search(r"#define PEER_PROTO_VERSION\s+(\d+)u", f.read()).group(1))

"""Multi-daemon plumbing for the cluster sync tests: real dted processes on
loopback or in network namespaces joined by a bridge, their control
sockets, logs, SIGKILL and restart, and dte-peer-forge.

Control sockets are filesystem paths, so the test process (in the host
namespace) reaches every daemon and hands it memfds, wherever the daemon's
network lives; only daemon-to-daemon traffic crosses the namespaces.
"""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

import harness

# One implementation each in harness.py; the names stay here for importers.
B, DTED, DTECTL = harness.B, harness.DTED, harness.DTECTL
DTED_FAULTS = harness.DTED_FAULTS
asan_reexec, child_env = harness.asan_reexec, harness.child_env

FORGE = os.path.abspath(os.path.join(B, "bin", "dte-peer-forge"))


class Daemon:
    """One dted: config file, control socket, log, peer listener."""

    def __init__(self, tmp, name, host="127.0.0.1", netns=None, dev="lo",
                 log_level="info", part_size=None, sync_mode=None, peer_conf=""):
        self.tmp = tmp
        self.part_size = part_size
        self.peer_conf = peer_conf   # more [peer] lines ("auth = off\n")
        self.sync_mode = sync_mode   # None: dted's default (auto)
        self.name = name
        self.host = host
        self.netns = netns
        self.dev = dev
        self.log_level = log_level
        self.sock = os.path.join(tmp, name + ".sock")
        self.conf = os.path.join(tmp, name + ".conf")
        self.logpath = os.path.join(tmp, name + ".log")
        self.proc = None
        self.address = None
        self.starts = 0
        self.listen_port = 0     # 0: any; a fault test pins a restart to its old port

    def env(self):
        # A killed peer must be noticed in seconds, not UCX's default.
        return child_env({"UCX_TLS": "tcp", "UCX_NET_DEVICES": self.dev,
                          "UCX_KEEPALIVE_INTERVAL": os.environ.get("UCX_KEEPALIVE_INTERVAL",
                                                                   "1s")})

    def binary(self):
        """The program to run (DTED looked up now: soak.py may wrap it)."""
        return DTED

    def start(self, timeout=20.0):
        with open(self.conf, "w") as f:
            # Jobs kept in a directory of the daemon's own (daemons of one
            # test share tmp): a restart of it (the faults' coord-restart)
            # gets them back (daemon/job_persist.c).
            f.write("[daemon]\nnode_name = %s\nlog_level = %s\nruntime_dir = %s\n"
                    "job_state_dir = %s/%s.jobs\n%s"
                    "[peer]\nstaging_size = 16M\n" % (
                        self.name, self.log_level, self.tmp, self.tmp, self.name,
                        "sync_mode = %s\n" % self.sync_mode if self.sync_mode else ""))
            if self.part_size:
                f.write("part_size = %s\n" % self.part_size)
            f.write(self.peer_conf)
        env = self.env()
        harness.hook_binary_check(self.binary(), env)
        cmd = [self.binary(), "--foreground", "--config", self.conf, "--socket", self.sock,
               "--peer-listen", "%s:%d" % (self.host, self.listen_port)]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns] + cmd
        log = open(self.logpath, "a")
        log.write("--- start %d ---\n" % self.starts)
        log.flush()
        self.starts += 1
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
        log.close()
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("dted %s exited: %s" % (self.name, self.log_tail()))
            if os.path.exists(self.sock):
                p = self.ctl_json("peers", check=False)
                if p and p.get("address"):
                    self.address = p["address"]
                    return self
            time.sleep(0.05)
        raise RuntimeError("dted %s did not come up: %s" % (self.name, self.log_tail()))

    def kill(self):
        """SIGKILL: no goodbye to peers, no socket cleanup."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        if os.path.exists(self.sock):
            os.unlink(self.sock)

    def stop(self, timeout=20.0):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return -9
        return self.proc.returncode if self.proc else 0

    def ctl(self, *args, check=True):
        r = subprocess.run([DTECTL, "--socket", self.sock] + list(args),
                           capture_output=True, text=True, timeout=30, env=child_env())
        if check and r.returncode != 0:
            raise RuntimeError("dtectl %s on %s: %s%s" % (" ".join(args), self.name,
                                                          r.stdout, r.stderr))
        return r

    def ctl_json(self, *args, check=True):
        r = self.ctl("--json", *args, check=check)
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None

    def peer(self, node):
        p = self.ctl_json("peers") or {}
        for x in p.get("peers", []):
            if x.get("node") == node:
                return x
        return None

    def log_text(self):
        try:
            with open(self.logpath, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def log_tail(self, n=30):
        return "\n".join(self.log_text().splitlines()[-n:])


def forge(to, records, node="forge", expect=0, wait_ms=1500, netns=None, dev="lo"):
    """Run dte-peer-forge; returns (exit status, stdout lines)."""
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


def peer_proto_version():
    """PEER_PROTO_VERSION of this tree (proto/peer_protocol.h)."""
    import re
    root = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    with open(os.path.join(root, "proto", "peer_protocol.h")) as f:
        return int(re.search(r"#define PEER_PROTO_VERSION\s+(\d+)u", f.read()).group(1))

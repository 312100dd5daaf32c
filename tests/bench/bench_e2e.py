"""End-to-end, stall and memory figures: two real dted daemons in two
network namespaces joined by one veth pair, shaped with tc tbf.

As two machines would be (issue 18, "End to end"): the source daemon and
the trainer (this process) are pinned to one core, the sink daemon to
another (taskset / sched_setaffinity; DTC_CPU_THREADS=1, so the daemons'
compute runs one thread on its core).  Versions after a fresh sink's dense
one go as dted chooses (`sync_mode = auto`: sparse or dense per version by
its cost estimates); the sync time is their median.  Its floor is

    min(sparse floor, dense floor)
    sparse floor = max(detect alone, sparse bytes at line rate, sink apply alone)
    dense floor  = max(reading θ and rounding alone, dense bytes at line rate,
                       sink dense write alone)

each stage measured alone in the same run, on the core it runs on:
detect = dted's own dtc_detect (with the checksum) over the trainer's own
θ, m, v right after the step, right before that version's publish
(gpu/bench_detect_once.c, best of three after a warm-up), so every version
has its own floor and floor_ratio is the median over the versions of sync
time / floor (the VM's speed drifts minute to minute; `bench_scan N lr
memfd` over synthetic arrays is also run before the trainer exists and
before each link, for context); reading θ and rounding = torch's FP32 → BF16 copy of the
trainer's θ into BF16 buffers (RNE, one thread); the sink's dense write =
a copy of the model's BF16 bytes into the sink engine's own weights; the
sink's sparse apply = a scatter of the version's changed count of BF16
values (sorted positions) into a model-sized BF16 buffer.  The sink-side
stages run after the link's versions (they overwrite the sink's weights,
and the sink is replaced before the next link).

The source daemon (namespace A) holds a Qwen3-shaped model of 276,836,608
elements (> 2^28) as fsdp:dp=1: FP32 θ, m, v in memfds (3.3 GiB) that torch
AdamW (foreach=False, so no full-size temporaries) updates in place with
synthetic Gaussian gradients.  The sink daemon (namespace B) serves one
SGLang tp=1 sink (BF16, 0.55 GiB).  For each link rate the previous sink
disconnects and a fresh one attaches, so the next version goes dense (what
a broadcast system sends, by dted's own dense path); the version after it
goes sparse.  Timed from the publish call to `wait` returning (every sink
applied, checksum verified); the trainer's stall is the publish call alone.
The sink engine is parked in `wait_staged` from before each publish (as
an engine waiting for its weights is), so the sink daemon applies a sparse
version's parts as they arrive; the per-version detail line shows its
apply-on-arrival counters, and the `bench e2e` line on_arrival=K/N how many
of the N sparse versions were staged in place (BENCH_E2E_PARK=0: the
engine calls apply only after publish returns).

Daemon memory is sampled every 10 ms from /proc/PID/status: RssAnon
(private anonymous memory: the memfds the clients share are RssShmem, not
counted) and VmHWM (peak RSS, shared pages included).
"""

import errno
import os
import select
import statistics
import subprocess
import sys
import signal
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "system"))

import harness  # noqa: E402
from cluster_sync_lib import B  # noqa: E402
from dte import _lib, qwen3, sglang  # noqa: E402
from dte.shm import Arena  # noqa: E402
from dte.sink import Sink  # noqa: E402

JOB, TOKEN = "bench", "bench-token"
LR = 1e-6
# Sparse versions per link (the median counts): the first sparse version
# of a run also pays for mapping the trainer's m and v pages into the
# source daemon (the dense version read only θ), a one-time cost.
SPARSE_PER_LINK = 5
# The sink engine parks in wait_staged before each publish (a real
# engine waiting for its weights), so sparse versions apply on arrival.
# BENCH_E2E_PARK=0: it calls apply after publish returns instead (the
# daemon stages each version whole and applies it after its last part).
PARK = os.environ.get("BENCH_E2E_PARK", "1") != "0"
# The daemons' log level (BENCH_E2E_LOG=debug: the source's per-version
# capture timings, "answered at / worker / reading the source", in its log).
LOG_LEVEL = os.environ.get("BENCH_E2E_LOG", "warning")
# The crossover columns: after the sparse versions at LR, one sparse
# version at each of these rates (one step each), so the changed fraction
# grows towards all of the model.
CROSS_LRS = [3e-6, 1e-5, 3e-5, 1e-4]
# The plain-socket baseline: this many seconds of the link's rate (at least
# 64 MiB, at most 1 GiB), one TCP stream, 4 MiB sends.
TCP_SECONDS = 0.5
TCP_SCRIPT = r"""
import socket, sys, time
mode, addr, nbytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "recv":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 7399))
    s.listen(1)
    print("ready", flush=True)
    c, _ = s.accept()
    mv = memoryview(bytearray(4 << 20))
    got = 0
    while got < nbytes:
        k = c.recv_into(mv)
        if not k:
            break
        got += k
    c.sendall(b"k")
else:
    c = socket.create_connection((addr, 7399))
    buf = bytes(4 << 20)
    sent = 0
    t = time.perf_counter()
    while sent < nbytes:
        c.sendall(buf)
        sent += len(buf)
    c.recv(1)
    print("%d %.6f" % (sent, time.perf_counter() - t))
"""
MODEL = dict(hidden_size=4096, intermediate_size=8192, num_hidden_layers=1,
             num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=32768,
             tie_word_embeddings=True)


def BenchDaemon(work, name, core=None, **kw):
    """The daemon fixture (harness.Daemon) configured as dted ships: only
    node_name, log_level and runtime_dir, conf/dted.conf's defaults for the
    rest.  BENCH_E2E_PART tries another [peer] part_size out and
    BENCH_E2E_AUTH peer auth on (the default) or off, what it costs
    (docs/SYNC.md); the figures use the defaults.  core: pinned to that CPU
    (taskset)."""
    return harness.Daemon(work, name, part_size=os.environ.get("BENCH_E2E_PART") or None,
                          auth=os.environ.get("BENCH_E2E_AUTH") or None,
                          wrap=["taskset", "-c", str(core)] if core is not None else (), **kw)


# BENCH_SMALL=1: a 102,766,848-element model (hidden 2048) for trying the
# bench out; the figures in docs/BENCHMARKS.md come from the full one.
if os.environ.get("BENCH_SMALL"):
    MODEL.update(hidden_size=2048, intermediate_size=4096, num_attention_heads=16,
                 num_key_value_heads=4)


def model_config():
    return qwen3.make_config(None, **MODEL)


def model_elements():
    import math
    return sum(math.prod(s) for s in qwen3.hf_tensor_shapes(model_config()).values())


class Link:
    """Namespaces A and B and one veth pair between them, 10.233.T.1/.2."""

    def __init__(self):
        pid = os.getpid()
        self.ns = ["dtb%da" % pid, "dtb%db" % pid]
        self.dev = ["dtbv%da" % (pid % 100000), "dtbv%db" % (pid % 100000)]
        tag = pid % 200 + 20
        self.addr = ["10.233.%d.1" % tag, "10.233.%d.2" % tag]
        self.made = []
        self.rate = None

    @staticmethod
    def available():
        if os.geteuid() != 0:
            return "needs root (network namespaces)"
        for tool in ("ip", "tc"):
            if subprocess.run(["which", tool], capture_output=True).returncode:
                return "needs %s" % tool
        return None

    def _run(self, *cmd):
        r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
        if r.returncode:
            raise RuntimeError("%s: %s" % (" ".join(cmd), r.stderr.strip()))

    def setup(self):
        for ns in self.ns:
            self._run("ip", "netns", "add", ns)
            self.made.append(ns)
        self._run("ip", "link", "add", self.dev[0], "netns", self.ns[0], "type", "veth", "peer",
                  "name", self.dev[1], "netns", self.ns[1])
        for ns, dev, addr in zip(self.ns, self.dev, self.addr):
            self._run("ip", "-n", ns, "addr", "add", addr + "/24", "dev", dev)
            self._run("ip", "-n", ns, "link", "set", "lo", "up")
            self._run("ip", "-n", ns, "link", "set", dev, "up")
        # UCX refuses a device whose carrier is not up yet.
        end = time.time() + 10
        for ns, dev in zip(self.ns, self.dev):
            while time.time() < end:
                r = subprocess.run(["ip", "-n", ns, "-o", "link", "show", "dev", dev],
                                   capture_output=True, text=True)
                if "state UP" in r.stdout:
                    break
                time.sleep(0.05)
        return self

    def shape(self, gbit):
        """tbf at `gbit` on both directions.  The bucket holds 2 ms of the
        rate (at least 256 KiB, more than a GSO packet), so the long-run
        rate is `gbit` and bursts stay short."""
        burst = max(256 * 1024, int(gbit * 1e9 / 8 * 0.002))
        for ns, dev in zip(self.ns, self.dev):
            self._run("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                      "%dgbit" % gbit, "burst", str(burst), "latency", "50ms")
        self.rate = gbit

    def tcp_rate(self, gbit, cores=None):
        """One plain TCP stream A -> B over the shaped link: Gbit/s.  With
        `cores` (A's, B's), the sender runs on A's core and the receiver on
        B's, as the daemons do: two machines, not one core doing both ends
        (a child inherits the bench's own pinning otherwise)."""
        nbytes = int(min(max(gbit * 1e9 / 8 * TCP_SECONDS, 64 << 20), 1 << 30)) >> 22 << 22
        py = sys.executable

        def pin(k):
            if not cores:
                return None
            return lambda: os.sched_setaffinity(0, {cores[k]})
        rx = subprocess.Popen(["ip", "netns", "exec", self.ns[1], py, "-c", TCP_SCRIPT, "recv",
                               self.addr[1], str(nbytes)], stdout=subprocess.PIPE, text=True,
                              preexec_fn=pin(1))
        try:
            if rx.stdout.readline().strip() != "ready":
                raise RuntimeError("tcp baseline: receiver did not start")
            r = subprocess.run(["ip", "netns", "exec", self.ns[0], py, "-c", TCP_SCRIPT, "send",
                                self.addr[1], str(nbytes)], capture_output=True, text=True,
                               timeout=120, preexec_fn=pin(0))
            if r.returncode:
                raise RuntimeError("tcp baseline: %s" % r.stderr.strip())
            sent, secs = r.stdout.split()
            return int(sent) * 8 / float(secs) / 1e9
        finally:
            rx.wait(timeout=30)

    def commands(self, gbit):
        burst = max(256 * 1024, int(gbit * 1e9 / 8 * 0.002))
        return "tc -n NS qdisc replace dev VETH root tbf rate %dgbit burst %d latency 50ms" % (
            gbit, burst)

    def close(self):
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.made = []


class MemSampler:
    """Peak RssAnon per labelled window and VmHWM, for a set of pids."""

    def __init__(self, pids):
        self.pids = dict(pids)
        self.label = None
        self.peak = {}
        self.hwm = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()

    @staticmethod
    def read(pid):
        out = {}
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("RssAnon", "VmHWM", "RssShmem", "VmRSS"):
                    out[k] = int(v.split()[0]) * 1024
        return out

    @staticmethod
    def anon(pid):
        """RssAnon from /proc/PID/statm (resident minus file and shmem
        pages): far cheaper to read than status, whose walk cost the
        source's core about 0.03 s per dense version at 100 reads/s."""
        with open("/proc/%d/statm" % pid) as f:
            st = f.read().split()
        return (int(st[1]) - int(st[2])) * os.sysconf("SC_PAGE_SIZE")

    def _loop(self):
        n = 0
        while not self._stop.is_set():
            lab = self.label
            for name, pid in self.pids.items():
                try:
                    if n % 20 == 0 or not lab:
                        # the high-water mark needs no fine sampling
                        self.hwm[name] = self.read(pid).get("VmHWM", 0)
                    a = self.anon(pid)
                except (OSError, ValueError):
                    continue
                if lab:
                    key = (lab, name)
                    self.peak[key] = max(self.peak.get(key, 0), a)
            n += 1
            time.sleep(0.01)

    def stop(self):
        self._stop.set()
        self._t.join()
        for name, pid in self.pids.items():
            try:
                self.hwm[name] = self.read(pid).get("VmHWM", 0)
            except (OSError, ValueError):
                pass

    @staticmethod
    def cpu(pid):
        """(CPU seconds user+system, minor page faults) of pid so far."""
        with open("/proc/%d/stat" % pid) as f:
            st = f.read().rsplit(")", 1)[1].split()
        hz = os.sysconf("SC_CLK_TCK")
        return (int(st[11]) + int(st[12])) / hz, int(st[7])

    def window(self, label):
        self.label = label
        time.sleep(0.02)


class Trainer:
    """θ, m, v of every HF tensor in three memfd arenas; torch AdamW."""

    def __init__(self, cfg):
        shapes = qwen3.hf_tensor_shapes(cfg)
        specs = [(n, tuple(s), torch.float32) for n, s in shapes.items()]
        self.arenas = {k: Arena("bench-%s" % k, specs) for k in ("param", "exp_avg", "exp_avg_sq")}
        g = torch.Generator().manual_seed(0)
        self.params = {}
        for n in shapes:
            t = self.arenas["param"].tensor(n)
            if t.dim() == 1:
                t.fill_(1.0)
            else:
                t.normal_(0.0, 0.02, generator=g)
            self.params[n] = torch.nn.Parameter(t)
        mats = [p for p in self.params.values() if p.dim() > 1]
        vecs = [p for p in self.params.values() if p.dim() == 1]
        self.opt = torch.optim.AdamW([{"params": mats, "weight_decay": 0.01},
                                      {"params": vecs, "weight_decay": 0.0}],
                                     lr=LR, betas=(0.9, 0.999), eps=1e-8, foreach=False)
        for n, p in self.params.items():
            st = self.opt.state[p]
            st["step"] = torch.tensor(0.0)
            st["exp_avg"] = self.arenas["exp_avg"].tensor(n)
            st["exp_avg_sq"] = self.arenas["exp_avg_sq"].tensor(n)
        self.gen = torch.Generator().manual_seed(1)
        self.elements = sum(p.numel() for p in self.params.values())

    def step(self, lr=LR):
        for g in self.opt.param_groups:
            g["lr"] = lr
        for p in self.params.values():
            if p.grad is None:
                p.grad = torch.empty_like(p)
            p.grad.normal_(0.0, 1e-3, generator=self.gen)
        self.opt.step()
        step = int(float(self.opt.state[next(iter(self.params.values()))]["step"]))
        groups = [{"lr": float(g["lr"]), "beta1": float(g["betas"][0]),
                   "beta2": float(g["betas"][1]), "eps": float(g["eps"]),
                   "weight_decay": float(g["weight_decay"]), "variant": "torch"}
                  for g in self.opt.param_groups]
        return step, groups

    def attach(self, cli, cfg_text):
        want = _lib.layout_buffers(cfg_text, "fsdp:dp=1", _lib.SOURCE, 0)
        ids = []
        for _bid, length, bname in want:
            base, _, kind = bname.partition(" ")
            loc = self.arenas[kind or "param"].loc(base)
            ids.append(cli.register_fd(loc.fd, loc.offset, length, _lib.FP32, bname))
        return cli.attach(JOB, TOKEN, _lib.SOURCE, "fsdp:dp=1", 0, ids)

    def close(self):
        self.opt = None
        self.params = {}
        for a in self.arenas.values():
            try:
                a.close()
            except BufferError:
                pass


def populate(eng):
    for t in eng.weights(0).values():
        t.fill_(0)


def wait_plan(srcd, sink_part, timeout=60.0):
    """Until the coordinator's plan holds exactly this sink (and is complete)."""
    end = time.time() + timeout
    while time.time() < end:
        j = srcd.ctl_json("job", JOB, check=False) or {}
        sinks = [p for p in j.get("participants", []) if p.get("role") == "sink"]
        if j.get("complete") and len(sinks) == 1 and int(sinks[0].get("id", -1)) == sink_part:
            return j
        time.sleep(0.05)
    raise RuntimeError("plan with sink %x not in place: %s" % (sink_part, j))


def history(srcd, version):
    h = srcd.ctl_json("history", JOB) or {}
    for v in h.get("versions", []):
        if int(v.get("version", -1)) == version:
            return v
    return {}


def metrics(d):
    """The daemon's Prometheus counters and gauges: {series: value}."""
    r = d.ctl("metrics", check=False)
    if r.returncode != 0:
        raise RuntimeError("dtectl metrics on %s failed (rc %d): %s" % (
            d.name, r.returncode, r.stderr))
    return harness.parse_metrics(r.stdout)


arrival = harness.arrival_count


class Parked:
    """The sink engine waiting for its next weights as a real one does:
    a thread parked in `wait_staged` (its safe point) from before the
    publish, so the sink daemon applies a sparse version's parts as they
    arrive (docs/SYNC.md "Apply on arrival").  `start` returns once the
    daemon counts the sink parked (dted_sinks_parked), with a deadline."""

    def __init__(self, sink, snkd, timeout_ms=300000):
        self.sink, self.snkd, self.timeout_ms = sink, snkd, timeout_ms
        self.got, self.err, self.th = None, None, None

    def _wait(self):
        try:
            self.got = self.sink.wait_staged(self.timeout_ms)
        except Exception as e:  # noqa: BLE001 (raised by join)
            self.err = e

    def start(self, deadline_s=10.0):
        base = metrics(self.snkd).get("dted_sinks_parked", 0.0)
        self.th = threading.Thread(target=self._wait, daemon=True)
        self.th.start()
        end = time.monotonic() + deadline_s
        while metrics(self.snkd).get("dted_sinks_parked", 0.0) < base + len(self.sink.parts):
            if time.monotonic() > end or not self.th.is_alive():
                raise RuntimeError("sink not parked in wait_staged within %.0f s (%s)" % (
                    deadline_s, self.err))
            time.sleep(0.01)
        return self

    def join(self, version):
        self.th.join(self.timeout_ms / 1000.0 + 5)
        if self.th.is_alive():
            raise RuntimeError("wait_staged did not return for version %d" % version)
        if self.err is not None:
            raise self.err
        if self.got < version:
            raise RuntimeError("wait_staged returned %d, expected %d" % (self.got, version))


def runq(pid):
    """Seconds pid's threads so far sat runnable but not running
    (/proc/PID/task/*/schedstat): time a daemon lost to other load."""
    wait = 0
    for t in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, t)) as f:
                wait += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return wait / 1e9


class PerfRecord:
    """`perf record -a -g` started with its events disabled and enabled
    through its control fifo (perf record --control): the constructor
    returns once perf acknowledged the enable, so the profile holds the
    version from its first instruction and nothing of perf's own start-up
    (no guessed sleep for perf to come up)."""

    def __init__(self, out, work, timeout=30.0):
        self.ctl = os.path.join(work, "perf-ctl.fifo")
        self.ack = os.path.join(work, "perf-ack.fifo")
        for f in (self.ctl, self.ack):
            if os.path.exists(f):
                os.unlink(f)
            os.mkfifo(f)
        self.proc = subprocess.Popen(
            ["perf", "record", "-a", "-g", "-F", "4000", "-D", "-1",
             "--control", "fifo:%s,%s" % (self.ctl, self.ack), "-o", out],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # A fifo opened for writing without a reader fails with ENXIO:
        # retried until perf opened it, or perf exited, or the deadline.
        end = time.monotonic() + timeout
        while True:
            try:
                self.ctl_fd = os.open(self.ctl, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as e:
                if e.errno != errno.ENXIO:
                    raise
            if self.proc.poll() is not None or time.monotonic() > end:
                self.proc.kill()
                raise RuntimeError("perf record did not open its control fifo (exit %s)"
                                   % self.proc.poll())
            time.sleep(0.01)
        self.ack_fd = os.open(self.ack, os.O_RDONLY | os.O_NONBLOCK)
        os.write(self.ctl_fd, b"enable\n")
        got = b""   # perf 6.1 answers "ack\n\0"
        while b"\n" not in got:
            r, _, _ = select.select([self.ack_fd], [], [], max(0.0, end - time.monotonic()))
            if not r:
                self.proc.kill()
                raise RuntimeError("perf record did not acknowledge 'enable'")
            chunk = os.read(self.ack_fd, 64)
            if not chunk and self.proc.poll() is not None:
                raise RuntimeError("perf record exited before enabling its events")
            got += chunk
        if got.split(b"\n")[0] != b"ack":
            raise RuntimeError("perf record answered %r to 'enable'" % got)

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=120)
        os.close(self.ctl_fd)
        os.close(self.ack_fd)
        for f in (self.ctl, self.ack):
            os.unlink(f)


def pin_cores():
    """(source core, sink core): two CPUs this process may use, or None."""
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[0], cpus[1]) if len(cpus) >= 2 else None


def best_of(fn, reps=3):
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return min(t)


def detect_once(tr, step, lr, core):
    """dted's detect (with the checksum) alone over the trainer's own θ, m,
    v right after its step (gpu/bench_detect_once.c: the three memfds
    passed down, one warm-up round, best of three), one thread on `core`:
    seconds.  Run right before each version's publish, so the version's
    floor is the same memory, step and machine minute as its sync."""
    fds = [tr.arenas[k].fd for k in ("param", "exp_avg", "exp_avg_sq")]
    kv = pinned_tool("bench_detect_once", [str(f) for f in fds] + [repr(lr), str(step), "0.01"],
                     core, "detect-once:", 600, pass_fds=fds)
    return float(kv["best_s"])


def pinned_tool(name, args, core, prefix, timeout, **kw):
    """$B/tests/<name> args, one compute thread, pinned to `core`: the
    key=value pairs of its output line starting with prefix."""
    cmd = [os.path.join(B, "tests", name)] + args
    if core is not None:
        cmd = ["taskset", "-c", str(core)] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, DTC_CPU_THREADS="1"), **kw)
    if r.returncode:
        raise RuntimeError("%s failed: %s" % (name, r.stderr.strip()))
    for line in r.stdout.splitlines():
        if line.startswith(prefix):
            return dict(x.split("=", 1) for x in line.split()[1:] if "=" in x)
    raise RuntimeError("%s printed no %s line" % (name, prefix))


def detect_alone(n, core):
    """dted's detect (dtc_detect with the checksum, the daemon's one-pass
    op) over n elements of FP32 θ, m, v in memfds, one thread on `core`:
    bench_scan's best round, seconds."""
    kv = pinned_tool("bench_scan", [str(n), str(LR), "memfd"], core, "scan-detail:", 1800)
    return float(kv["detect_csum_s"])


def on_core(core):
    if core is not None:
        os.sched_setaffinity(0, {core})


def read_round_alone(tr, core):
    """Reading θ and rounding it to BF16 (torch, RNE, one thread) into
    buffers touched beforehand: the dense capture's floor, seconds."""
    on_core(core)
    dst = {n: torch.zeros(p.shape, dtype=torch.bfloat16) for n, p in tr.params.items()}

    def go():
        for n, p in tr.params.items():
            dst[n].copy_(p.detach())
    secs = best_of(go)
    del dst
    return secs


def sink_alone(eng, n, changed, core):
    """On the sink's core: (dense write s, sparse apply s).  The dense
    write copies n BF16 values into the engine's own weights (this
    overwrites them: run it after the link's versions); the sparse apply
    scatters `changed` BF16 values at sorted random positions into a
    model-sized BF16 buffer (both touched beforehand)."""
    on_core(core)
    src = torch.zeros(n, dtype=torch.bfloat16)
    w = list(eng.weights(0).values())

    def dense():
        off = 0
        for t in w:
            k = t.numel()
            t.view(-1).copy_(src[off:off + k])
            off += k
    d = best_of(dense)
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(0, n, (max(int(changed), 1),), generator=g).sort().values
    val = torch.ones(idx.numel(), dtype=torch.bfloat16)
    sp = best_of(lambda: src.index_copy_(0, idx, val))
    del src, w, idx, val
    return d, sp


def run(work, links, detect="adamw", log=print, mem_only=False, cross=True):
    """One fresh pair of daemons and one job in `detect` mode; per link
    rate in `links`: a dense version to a fresh sink, then SPARSE_PER_LINK
    sparse versions.  Returns the measured rows."""
    cfg = model_config()
    import json
    cfg_text = json.dumps(cfg)
    cores = pin_cores()
    src_core, snk_core = cores if cores else (None, None)
    affinity = os.sched_getaffinity(0)
    out = {"detect": detect, "links": [], "elements": None, "cores": cores}
    if cores:
        # one compute thread per daemon: its core is its machine
        os.environ["DTC_CPU_THREADS"] = "1"
        torch.set_num_threads(1)
    else:
        log("e2e-detail: fewer than 2 CPUs: nothing pinned")
    alone = {}
    floors = not mem_only and detect == "adamw"
    if floors:
        n = model_elements()
        alone["detect_s"] = detect_alone(n, src_core)
        log("e2e-detail: alone: detect %d elements %.3f s (core %s)" % (
            n, alone["detect_s"], src_core))
    net = Link().setup()
    daemons, sampler, tr, cli, sink, eng = [], None, None, None, None, None
    out["alone"] = alone
    try:
        srcd = BenchDaemon(work, "src-" + detect, host=net.addr[0], netns=net.ns[0],
                           dev=net.dev[0], log_level=LOG_LEVEL, core=src_core)
        snkd = BenchDaemon(work, "sink-" + detect, host=net.addr[1], netns=net.ns[1],
                           dev=net.dev[1], log_level=LOG_LEVEL, core=snk_core)
        on_core(src_core)   # the trainer shares the source's core
        for d in (srcd, snkd):
            daemons.append(d)   # stopped in finally even when start() fails
            d.start()
        sampler = MemSampler({"source": srcd.proc.pid, "sink": snkd.proc.pid})
        t = time.time()
        tr = Trainer(cfg)
        out["elements"] = tr.elements
        log("e2e-detail: %s model %d elements ready in %.1f s" % (detect, tr.elements,
                                                                  time.time() - t))
        if floors:
            alone["read_round_s"] = read_round_alone(tr, src_core)
            log("e2e-detail: alone: read θ and round to BF16 %.3f s" % alone["read_round_s"])
        cli = _lib.Client(srcd.sock)
        if detect == "adamw":
            cli.job_create(JOB, cfg_text, TOKEN, "local", 1)
        else:
            cli.job_create(JOB, cfg_text, TOKEN, "local", 1, detect=detect)
        part = tr.attach(cli, cfg_text)
        version = 0
        for k, gbit in enumerate(links):
            net.shape(gbit)
            if sink is not None:
                sink.close()
                eng.close()
            eng = sglang.SGLangModel(cfg, tp=1, label="bench-sink%d" % k)
            # An inference engine holds loaded weights: its memory exists
            # before the first sync (a fresh memfd would make the dense
            # apply pay for allocating and zeroing every page).
            populate(eng)
            sink = Sink.sglang(eng, snkd.sock, JOB, TOKEN, cfg_text, coordinator=srcd.address,
                               replica=k)
            wait_plan(srcd, sink.parts[0])
            row = {"gbit": gbit, "sparse": [], "cross": [], "tcp_gbit": net.tcp_rate(gbit, cores)}
            log("e2e-detail: link=%dGbit plain TCP stream %.2f Gbit/s" % (gbit, row["tcp_gbit"]))
            if floors:
                # The detect alone again, right before this link's versions:
                # this VM's speed drifts minute to minute (shared host), and
                # the floor should be the machine the versions ran on.
                row["detect_alone_s"] = detect_alone(model_elements(), src_core)
                log("e2e-detail: alone: detect %.3f s before the %d Gbit/s versions" % (
                    row["detect_alone_s"], gbit))
            # after the fresh sink's dense version, dted chooses ("auto")
            plan = [("dense", LR)] + [("sparse", LR)] * SPARSE_PER_LINK
            if cross and not mem_only:
                plan += [("cross", lr) for lr in CROSS_LRS]
            for mode, lr in plan:
                on_core(src_core)
                step, groups = tr.step(lr)
                # this version's detect alone, on the memory it will read
                det_v = detect_once(tr, step, lr, src_core) if floors and mode == "sparse" \
                    else None
                version += 1
                m0 = metrics(snkd)
                waiter = Parked(sink, snkd).start() if PARK else None
                sampler.window("%s-%d-%s" % (gbit, version, mode))
                cpu0 = {n: MemSampler.cpu(p) for n, p in sampler.pids.items()}
                rq0 = {n: runq(p) for n, p in sampler.pids.items()}
                perf = None
                # BENCH_E2E_PERF=FILE: a system-wide `perf record -g` of
                # each dense version (where its CPU goes, per thread)
                if os.environ.get("BENCH_E2E_PERF") and mode == "dense":
                    perf = PerfRecord(os.environ["BENCH_E2E_PERF"], work)
                t0 = time.perf_counter()
                info = cli.publish(JOB, part, version, step, groups)
                t1 = time.perf_counter()
                if waiter is not None:
                    waiter.join(version)
                sink.apply(version, timeout_ms=300000)
                cli.wait(JOB, version, 300000)
                t2 = time.perf_counter()
                if perf is not None:
                    perf.stop()
                cpu1 = {n: MemSampler.cpu(p) for n, p in sampler.pids.items()}
                rq1 = {n: runq(p) for n, p in sampler.pids.items()}
                sampler.window(None)
                m1 = metrics(snkd)
                got = "dense" if info["dense"] else "sparse"
                if mode == "dense" and got != "dense":
                    raise RuntimeError("version %d to a fresh sink went %s" % (version, got))
                h = history(srcd, version)
                m = {"version": version, "lr": lr, "total_s": t2 - t0, "publish_s": t1 - t0,
                     "mode": got, "reason": h.get("reason", ""), "detect_alone_s": det_v,
                     "bytes": info["bytes"], "changed": info["changed"],
                     "elements": info["elements"], "capture_ms": h.get("capture_ms"),
                     "transfer_ms": h.get("transfer_ms"), "apply_ms": h.get("apply_ms"),
                     "src_anon": sampler.peak.get(("%s-%d-%s" % (gbit, version, mode),
                                                   "source"), 0),
                     "sink_anon": sampler.peak.get(("%s-%d-%s" % (gbit, version, mode),
                                                    "sink"), 0),
                     # what each daemon itself spent on this version (the
                     # machine's load from elsewhere does not count here)
                     "src_cpu_s": cpu1["source"][0] - cpu0["source"][0],
                     "sink_cpu_s": cpu1["sink"][0] - cpu0["sink"][0],
                     "src_faults": cpu1["source"][1] - cpu0["source"][1],
                     "sink_faults": cpu1["sink"][1] - cpu0["sink"][1],
                     "src_runq_s": rq1["source"] - rq0["source"],
                     "sink_runq_s": rq1["sink"] - rq0["sink"],
                     # the sink daemon's apply-on-arrival counters over
                     # this version: parts swapped in, versions staged in
                     # place, undone, retreated
                     "arrival": {e: arrival(m1, e) - arrival(m0, e)
                                 for e in ("part", "version", "undo", "retreat")}}
                log("e2e-detail: %s link=%dGbit v%d %s lr=%g total_s=%.3f publish_s=%.3f "
                    "bytes=%d changed=%d (%.2f%%) capture_ms=%.0f transfer_ms=%.0f apply_ms=%.0f "
                    "src_anon_mb=%.0f sink_anon_mb=%.0f" % (
                        detect, gbit, version, mode, lr, m["total_s"], m["publish_s"],
                        m["bytes"], m["changed"], 100.0 * m["changed"] / max(m["elements"], 1),
                        m["capture_ms"] or 0, m["transfer_ms"] or 0, m["apply_ms"] or 0,
                        m["src_anon"] / 2**20, m["sink_anon"] / 2**20))
                log("e2e-detail:   cpu_s source=%.3f sink=%.3f runq_s source=%.3f sink=%.3f "
                    "minor_faults source=%d sink=%d" % (
                        m["src_cpu_s"], m["sink_cpu_s"], m["src_runq_s"], m["sink_runq_s"],
                        m["src_faults"], m["sink_faults"]))
                log("e2e-detail:   parked=%d apply_on_arrival part=%d version=%d undo=%d "
                    "retreat=%d" % ((PARK,) + tuple(m["arrival"][e] for e in (
                        "part", "version", "undo", "retreat"))))
                log("e2e-detail:   %s%s" % (m["reason"], "" if det_v is None else
                                              "; detect alone %.3f s" % det_v))
                if mode == "dense":
                    row["dense"] = m
                else:
                    row[mode].append(m)
            if floors:
                chg = statistics.median(m["changed"] for m in row["sparse"] if m["mode"] == "sparse")
                row["alone_dense_write_s"], row["alone_sparse_apply_s"] = sink_alone(
                    eng, tr.elements, chg, snk_core)
                on_core(src_core)
                log("e2e-detail: alone (sink core %s): dense write %.3f s, sparse apply of %d "
                    "values %.4f s" % (snk_core, row["alone_dense_write_s"], chg,
                                       row["alone_sparse_apply_s"]))
            out["links"].append(row)
            if mem_only:
                break
        out["hwm"] = dict(sampler.hwm)
        out["idle_anon"] = {n: MemSampler.read(p)["RssAnon"] for n, p in sampler.pids.items()}
    finally:
        os.sched_setaffinity(0, affinity)
        # Every step runs even when one before it fails (a failed close
        # must not leave daemons and namespaces behind); the first error
        # is raised after all of them.
        errs = []
        steps = [sampler.stop if sampler else None, sink.close if sink is not None else None,
                 eng.close if eng is not None else None, cli.close if cli is not None else None,
                 tr.close if tr is not None else None] + [d.stop for d in daemons] + [net.close]
        for step in steps:
            if step is None:
                continue
            try:
                step()
            except Exception as e:  # noqa: BLE001 (cleanup goes on)
                errs.append(e)
        if errs and sys.exc_info()[0] is None:
            raise errs[0]
    out["shape_cmd"] = net.commands(1)
    return out


def summarize(rows):
    """Per link: the sync time (median of the versions dted chose the mode
    of), the sparse ones' median time and bytes, and the floors."""
    alone = rows.get("alone", {})
    for row in rows["links"]:
        auto = row["sparse"]
        sp = [m for m in auto if m["mode"] == "sparse"] or auto
        row["sync_s"] = statistics.median(m["total_s"] for m in auto)
        row["sync_dense"] = sum(m["mode"] == "dense" for m in auto)
        # sparse versions the sink daemon staged in place (applied on arrival)
        row["on_arrival"] = sum(m["mode"] == "sparse" and m["arrival"]["version"] > 0
                                for m in auto)
        row["sparse_s"] = statistics.median(m["total_s"] for m in sp)
        row["sparse_bytes"] = statistics.median(m["bytes"] for m in sp)
        row["stall_s"] = statistics.median(m["publish_s"] for m in auto)
        row["dense_s"] = row["dense"]["total_s"]
        rate = row["gbit"] * 1e9 / 8
        row["wire_s"] = row["sparse_bytes"] / rate
        row["line_s"] = row["dense"]["bytes"] / rate
        if "detect_s" in alone and "alone_dense_write_s" in row:
            det = row.get("detect_alone_s", alone["detect_s"])
            row["sparse_floor_s"] = max(det, row["wire_s"],
                                        row["alone_sparse_apply_s"])
            row["dense_floor_s"] = max(alone["read_round_s"], row["line_s"],
                                       row["alone_dense_write_s"])
            row["floor_s"] = min(row["sparse_floor_s"], row["dense_floor_s"])
            row["floor_ratio"] = row["sync_s"] / row["floor_s"]
            # Each version against its own floor (its detect alone measured
            # right before its publish, its own bytes at the line rate):
            # the median of those ratios is the figure (the machine's
            # speed drifts between versions; a ratio within one version
            # does not).
            per = []
            for m in auto:
                if m.get("detect_alone_s") is None:
                    continue
                fl = min(max(m["detect_alone_s"], m["bytes"] / rate,
                             row["alone_sparse_apply_s"]), row["dense_floor_s"])
                m["floor_s"] = fl
                per.append(m["total_s"] / fl)
            if per:
                row["floor_s"] = statistics.median(m["floor_s"] for m in auto if "floor_s" in m)
                row["sparse_floor_s"] = statistics.median(
                    max(m["detect_alone_s"], m["bytes"] / rate, row["alone_sparse_apply_s"])
                    for m in auto if "floor_s" in m)
                row["floor_ratio"] = statistics.median(per)
            # The same floors at the rate a plain TCP stream reached over
            # this link in this run, where that is below the setting (on
            # a 2-core VM no TCP sender reaches 100 Gbit/s): what any
            # sender could have done here, next to the floor.
            reached = min(row["gbit"], row.get("tcp_gbit") or row["gbit"]) * 1e9 / 8
            row["floor_reached_s"] = min(
                max(det, row["sparse_bytes"] / reached,
                    row["alone_sparse_apply_s"]),
                max(alone["read_round_s"], row["dense"]["bytes"] / reached,
                    row["alone_dense_write_s"]))
            row["floor_ratio_reached"] = row["sync_s"] / row["floor_reached_s"]
            dense_reached = max(alone["read_round_s"], row["dense"]["bytes"] / reached,
                                row["alone_dense_write_s"])
            per = [m["total_s"] / min(max(m["detect_alone_s"], m["bytes"] / reached,
                                          row["alone_sparse_apply_s"]), dense_reached)
                   for m in auto if m.get("detect_alone_s") is not None]
            if per:
                row["floor_ratio_reached"] = statistics.median(per)
    return rows


def e2e_line(r):
    """The `bench e2e` line of one link (summarize first)."""
    return ("bench e2e link=%d sparse_s=%.3f dense_s=%.3f line_rate_s=%.3f speedup=%.2f "
            "speedup_vs_line_rate=%.2f sync_s=%.3f dense_versions=%d/%d sparse_floor_s=%.3f "
            "dense_floor_s=%.3f floor_ratio=%.2f on_arrival=%d/%d floor_ratio_reached=%.2f" % (
                r["gbit"], r["sparse_s"], r["dense_s"], r["line_s"], r["dense_s"] / r["sparse_s"],
                r["line_s"] / r["sparse_s"], r["sync_s"], r["sync_dense"], len(r["sparse"]),
                r["sparse_floor_s"], r["dense_floor_s"], r["floor_ratio"],
                r["on_arrival"], len(r["sparse"]) - r["sync_dense"],
                r["floor_ratio_reached"]))


def main():
    """BENCH_LINKS (default 1,10,100) Gbit/s; BENCH_SMALL=1 for a smaller
    model; BENCH_E2E_PERF=FILE profiles each dense version system-wide
    into FILE (needs perf).  Needs root.  Prints the detail lines and one
    `bench e2e` line per link."""
    import tempfile
    why = Link.available()
    if why:
        print("SKIP: %s" % why)
        sys.exit(77)
    links = [int(x) for x in os.environ.get("BENCH_LINKS", "1,10,100").split(",")]
    work = tempfile.mkdtemp(prefix="bench-e2e-")
    rows = summarize(run(work, links, cross=False, log=lambda s: print(s, flush=True)))
    for r in rows["links"]:
        print(e2e_line(r), flush=True)


if __name__ == "__main__":
    main()

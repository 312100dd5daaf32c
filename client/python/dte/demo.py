"""`make demo`: real training synced version by version to a real-layout engine.

Two dted daemons on loopback — a trainer node (the job's coordinator) and an
inference node, talking over UCX (tcp on lo) — in a temporary runtime
directory.  The trainer is the embedded default Qwen3-architecture model in
the Megatron-Core TP=2 layout (FP32 θ, m, v in memfds), trained with real
torch AdamW on CPU on the toy task.  The inference side is the SGLang-layout
TP=2 stand-in in its own process, which registers its BF16 arenas with its
own daemon and applies each version when told.

Every version prints: step, loss (of that step's own training batch),
changed %, sent bytes (what that version put on the wire: the sparse payload,
or every element for a dense version), dense bytes (2 bytes per element, what
a dense sync sends), mode, sync ms (publish to every sink applied) and
exact?.  exact? is "yes" only when
  - EVERY element of EVERY stand-in rank (replicated norms and KV heads
    checked on each rank that holds them), read from the stand-in's own
    shared memory, equals bit for bit RNE-BF16 of the trainer's FP32 θ of
    that version, mapped Megatron-Core -> HF -> SGLang by an independent
    converter written for the check from the upstream projects' sharding
    rules (tests/system/sglang_reference.py; it uses none of dted's layout
    code nor dte.sglang's / dte.megatron's converters), and
  - the stand-in's logits on a held-out batch (never trained on) equal the
    logits the same forward code gives on those expected tensors.
Otherwise it prints NO with the number of mismatched elements.

    /usr/bin/python3 -m dte.demo [--versions N] [--nodes 1|2] ...

While it builds, warms up and starts its processes it says what it is
doing, at least every few seconds.

Ends with `demo: versions=N exact=N/N sparse_bytes=S dense_bytes=D ratio=R`
and exits non-zero unless every version is exact and no process it started
is left.  On that line S is every byte the run sent (version 1, dense to a
fresh sink, included), D what a dense sync of every version would send and
R = D / S, named on the line above it; an earlier line gives the ratio over
versions 2..N alone (the sparse steady state, without the dense first).
The loss is reported as the held-out loss of the stand-in's logits after
the first and the last version, and the training loss as the mean over all
the toy task's batches (they cycle) at the start and at the end of the
synced phase: one row's loss is that step's own batch, so rows rise and
fall with the batch.
"""

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
JOB, TOKEN = "demo", "demo-token"


class Progress:
    """Lines for whoever watches: each phase says what it starts, and a long
    loop says where it is once `every` seconds have passed without a line."""

    def __init__(self, every=5.0):
        self.t0 = self.last = time.time()
        self.every = every

    def say(self, msg):
        print("demo: " + msg, flush=True)
        self.last = time.time()

    def tick(self, msg):
        if time.time() - self.last >= self.every:
            self.say("%s (%.0f s so far)" % (msg, time.time() - self.t0))


def build_dir():
    b = os.environ.get("B", "build")
    return b if os.path.isabs(b) else os.path.join(ROOT, b)


def asan_reexec(argv=None):
    """A sanitizer build's libdte needs the ASan runtime loaded first in the
    Python process that ctypes-loads it (and in the stand-in it spawns):
    re-exec once with it preloaded, running argv (by default this demo;
    the system tests pass their own command line).  The daemons get the
    caller's environment back (child_env)."""
    lib = os.path.join(build_dir(), "lib", "libdte.so.0")
    if os.environ.get("DTE_ASAN_REEXEC") or not os.path.exists(lib):
        return
    deps = subprocess.run(["ldd", lib], capture_output=True, text=True).stdout
    m = re.search(r"libasan\.so\S* => (\S+)", deps)
    if not m:
        return
    env = dict(os.environ, DTE_ASAN_REEXEC="1", LD_PRELOAD=m.group(1),
               DTE_ORIG_ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", ""),
               ASAN_OPTIONS="detect_leaks=0")
    argv = argv or [sys.executable, "-m", "dte.demo"] + sys.argv[1:]
    os.execve(argv[0], argv, env)


def child_env(extra=None):
    e = dict(os.environ)
    if e.pop("DTE_ASAN_REEXEC", None):
        e.pop("LD_PRELOAD", None)
        e["ASAN_OPTIONS"] = e.pop("DTE_ORIG_ASAN_OPTIONS", "")
    e.update(extra or {})
    return e


class Daemon:
    """One dted in the demo's runtime directory."""

    def __init__(self, tmp, name):
        self.name = name
        self.tmp = tmp
        self.sock = os.path.join(tmp, name + ".sock")
        self.logpath = os.path.join(tmp, name + ".log")
        self.proc = None
        self.address = None

    def start(self, timeout=30.0):
        conf = os.path.join(self.tmp, self.name + ".conf")
        with open(conf, "w") as f:
            # sync_mode = sparse: the demo shows the sparse path and its
            # bytes against dense.  dted's default (auto) may send a version
            # dense when that is cheaper in time, as it can be over loopback
            # at this size (docs/SYNC.md, the cost model).
            f.write("[daemon]\nnode_name = %s\nlog_level = info\nruntime_dir = %s\n"
                    "sync_mode = sparse\n[peer]\nstaging_size = 16M\n" % (self.name, self.tmp))
        with open(self.logpath, "w") as log:
            self.proc = subprocess.Popen(
                [os.path.join(build_dir(), "bin", "dted"), "--foreground", "--config", conf,
                 "--socket", self.sock, "--peer-listen", "127.0.0.1:0"],
                stdout=log, stderr=log,
                env=child_env({"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo"}))
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("dted %s exited at start:\n%s" % (self.name, self.tail()))
            if os.path.exists(self.sock):
                r = subprocess.run([os.path.join(build_dir(), "bin", "dtectl"), "--socket",
                                    self.sock, "--json", "peers"], capture_output=True,
                                   text=True, env=child_env())
                if r.returncode == 0:
                    try:
                        self.address = json.loads(r.stdout).get("address")
                    except ValueError:
                        self.address = None
                    if self.address:
                        return self
            time.sleep(0.05)
        raise RuntimeError("dted %s did not come up:\n%s" % (self.name, self.tail()))

    def stop(self, timeout=15.0):
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return -9

    def tail(self, n=25):
        try:
            with open(self.logpath, errors="replace") as f:
                return "\n".join(f.read().splitlines()[-n:])
        except OSError:
            return ""


def leftovers(tmp, pids):
    """Processes still alive that this demo started: by pid, and any whose
    command line names the runtime directory."""
    left = []
    for pid in pids:
        if pid and os.path.exists("/proc/%d" % pid):
            try:
                with open("/proc/%d/stat" % pid) as f:
                    if f.read().split(")")[-1].split()[0] != "Z":
                        left.append(pid)
            except OSError:
                pass
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                if tmp.encode() in f.read() and int(d) not in left:
                    left.append(int(d))
        except OSError:
            pass
    return left


CORRUPT_KINDS = ("embed-unused", "norm-replica")


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="dte.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--versions", type=int, default=20, help="synced versions (default 20)")
    ap.add_argument("--warm-steps", type=int, default=12,
                    help="unsynced warm-start steps at --warm-lr (the 'SFT checkpoint')")
    ap.add_argument("--warm-lr", type=float, default=1e-3)
    ap.add_argument("--lr", type=float, default=3e-6, help="lr of the synced RL-like phase")
    ap.add_argument("--nodes", type=int, choices=(1, 2), default=2,
                    help="2: trainer and inference daemons over UCX; 1: one daemon")
    ap.add_argument("--threads", type=int, default=2, help="torch threads for training")
    # Test only (tests/system/demo_short.py): --corrupt V:KIND flips one bit
    # of one sink element behind the daemon's back right after apply(V) and
    # flips it back after that version's check, so the test sees the
    # exactness check fail on exactly that version (corrupt_target: KIND).
    # V:KIND:keep leaves it flipped (what do later applies make of it?).
    ap.add_argument("--corrupt", action="append", default=[], help=argparse.SUPPRESS)
    ap.add_argument("--keep", action="store_true", help="keep the runtime directory")
    a = ap.parse_args(argv)
    if a.versions < 1 or a.warm_steps < 0 or a.lr <= 0 or a.warm_lr <= 0:
        ap.error("versions >= 1, warm-steps >= 0 and positive learning rates")
    corrupt = {}
    for c in a.corrupt:
        m = re.match(r"^(\d+):(%s)(:keep)?$" % "|".join(CORRUPT_KINDS), c)
        if not m or not 1 <= int(m.group(1)) <= a.versions or int(m.group(1)) in corrupt:
            ap.error("--corrupt V:KIND[:keep], V a version (once each), KIND one of %s" % (
                ", ".join(CORRUPT_KINDS)))
        corrupt[int(m.group(1))] = (m.group(2), bool(m.group(3)))
    a.corrupt = corrupt
    return a


def load_reference():
    """tests/system/sglang_reference.py: the independent converter and sink
    reader the exactness check uses (kept out of the dte package on purpose:
    the check must not share code with what it checks)."""
    path = os.path.join(ROOT, "tests", "system", "sglang_reference.py")
    if not os.path.exists(path):
        raise SystemExit("demo: %s is missing: the demo runs from a source tree, whose "
                         "independent checker it needs" % path)
    spec = importlib.util.spec_from_file_location("dte_demo_sglang_reference", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def logits_of(sglang, cfg, tp, want, tokens):
    """The stand-in's forward code on the expected BF16 tensors (want: per
    rank {name: int16 bits}) in a fresh model of this process."""
    m = sglang.SGLangModel(cfg, tp, label="demo-expected")
    try:
        for r in range(tp):
            names = m.arenas[r].names()
            if set(want[r]) != set(names):
                raise RuntimeError("demo: rank %d: expected tensors and the engine's differ: %s"
                                   % (r, sorted(set(want[r]) ^ set(names))[:3]))
            for n, bits in want[r].items():
                _fill(m.arenas[r], n, bits)
        return m.logits(tokens)
    finally:
        m.close()


def _fill(arena, name, bits):
    """Copy BF16 bits into arena tensor `name` (its view dies here, before
    the arena may be closed)."""
    import torch
    dst = arena.tensor(name).view(torch.int16)
    if dst.shape != bits.shape:
        raise RuntimeError("demo: expected %s is %s, the engine's %s" % (
            name, tuple(bits.shape), tuple(dst.shape)))
    dst.copy_(bits)


def _sigterm(signum, frame):
    raise SystemExit(128 + signum)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    asan_reexec()
    signal.signal(signal.SIGTERM, _sigterm)
    prog = Progress()
    prog.say("loading torch and the dte package")

    import torch
    from . import _lib, megatron, qwen3, sglang, toy
    from .sink import StandinSink
    from .source import Source
    ref = load_reference()

    torch.manual_seed(0)
    torch.set_num_threads(max(args.threads, 1))
    cfg = qwen3.make_config(None)
    cfg_text = json.dumps(cfg)
    TP = 2
    tmp = tempfile.mkdtemp(prefix="dte-demo-")
    daemons, standin, src, model, trainer, mem = [], None, None, None, None, None
    pids = []
    failed = True
    rows = []
    print("demo: model Qwen3 (embedded default: hidden %d, %d layers, %d heads / %d KV, "
          "vocab %d), trainer megatron:tp=%d -> stand-in sglang:tp=%d" % (
              cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
              cfg["num_key_value_heads"], cfg["vocab_size"], TP, TP), flush=True)
    print("demo: runtime directory %s" % tmp, flush=True)
    try:
        prog.say("building the trainer: TP=2 Megatron-Core shards, FP32 θ, m, v in memfds")
        model = megatron.MegatronModel(cfg, tp=TP, seed=0, flat=True, label="demo-trainer")
        trainer = megatron.Trainer(model, lr=args.warm_lr)
        task = toy.ToyTask(cfg["vocab_size"])
        held_x, held_y = task.heldout_tokens, task.heldout_targets

        # The "SFT checkpoint": a few unsynced steps at a high lr, so the loss
        # visibly falls; sync starts from there (its version 1 is dense).
        losses = []
        if args.warm_steps:
            prog.say("warm start: %d unsynced AdamW steps at lr %g on CPU (%d torch threads)"
                     % (args.warm_steps, args.warm_lr, max(args.threads, 1)))
        for s in range(args.warm_steps):
            losses.append(trainer.step(*task.batch_at(s))["loss"])
            prog.tick("warm start: step %d/%d, loss %.2f" % (s + 1, args.warm_steps,
                                                              losses[-1]))
        if losses:
            print("demo: warm start (unsynced, lr %g): loss %s" % (
                args.warm_lr, " ".join("%.2f" % x for x in losses)), flush=True)
        for g in trainer.opt.param_groups:
            g["lr"] = args.lr
        trainer.sched.base_lrs = [args.lr] * len(trainer.opt.param_groups)
        print("demo: synced phase: %d versions, one per AdamW step at lr %g (same AdamW "
              "state continued), publish interval 1; loss is that step's batch (8 batches "
              "cycle)" % (args.versions, args.lr), flush=True)

        prog.say("starting the trainer node's dted")
        trainer_d = Daemon(tmp, "trainer").start()
        daemons.append(trainer_d)
        pids.append(trainer_d.proc.pid)
        if args.nodes == 2:
            prog.say("starting the inference node's dted")
            infer_d = Daemon(tmp, "inference").start()
            daemons.append(infer_d)
            pids.append(infer_d.proc.pid)
            coord = trainer_d.address
            print("demo: two daemons over UCX (tcp on lo): trainer node %s (coordinator), "
                  "inference node %s" % (trainer_d.address, infer_d.address), flush=True)
        else:
            infer_d, coord = trainer_d, "local"
            print("demo: one daemon: source and sink on the same node (memory path, no UCX)",
                  flush=True)

        prog.say("attaching the trainer's memory to its daemon (source)")
        src = Source.megatron(model, trainer.opt, trainer_d.sock, JOB, TOKEN)
        prog.say("starting the SGLang-layout stand-in in its own process (it loads torch) "
                 "and attaching its sink ranks")
        standin = sglang.Standin(cfg, tp=TP, label="demo-standin", timeout=120.0)
        pids.append(standin.proc.pid)
        sink = StandinSink(standin, infer_d.sock, JOB, TOKEN, cfg_text, coordinator=coord)
        # The stand-in's weights, read from its own memfds (never through its
        # helpers); writable only for the test-only corruption.
        try:
            mem = ref.SinkMemory(standin.proc.pid, standin.call("locs"),
                                 writable=bool(args.corrupt))
        except OSError as e:
            raise RuntimeError("demo: cannot map the stand-in's memory through /proc/%d/fd "
                               "(%s); the exactness check reads every sink element there"
                               % (standin.proc.pid, e)) from e
        n_elems = sum(mem.bits(r, n).numel() for r in range(TP) for n in mem.names(r))
        print("demo: stand-in pid %d attached %d sink ranks on %s" % (
            standin.proc.pid, len(sink.parts), infer_d.name), flush=True)
        print("demo: exact? = all %d BF16 elements of both stand-in ranks == RNE(θ) through "
              "the independent converter (tests/system/sglang_reference.py), and its logits "
              "on a held-out batch == the same forward on those tensors" % n_elems, flush=True)

        print("demo: columns: loss = that step's own training batch; sent_B = bytes the "
              "version put on the wire (every element for a dense one); dense_B = 2 B per "
              "element, what a dense sync sends; sync_ms = publish to every sink applied",
              flush=True)
        hdr = "%4s %5s %7s %8s %11s %11s %6s %8s  %s" % (
            "ver", "step", "loss", "changed%", "sent_B", "dense_B", "mode", "sync_ms", "exact?")
        print(hdr + "\n" + "-" * len(hdr), flush=True)
        step0 = args.warm_steps
        for v in range(1, args.versions + 1):
            rec = trainer.step(*task.batch_at(step0 + v - 1))
            # θ_v as the trainer holds it (FP32 Megatron-Core shards, every rank).
            theta = [{n: p.detach().clone() for n, p in ps.items()} for ps in model.params]
            t0 = time.perf_counter()
            info = src.publish(v)                 # captured: the trainer may step again
            # A checksum failure at apply (the daemon found the sink's memory
            # not what it wrote: only the test-only --corrupt ...:keep does
            # that here) is that version's verdict; the daemon repairs the
            # sink densely at the next version.  Anything else is fatal.
            apply_failed = None
            try:
                sink.apply(v, 60000)              # the engine's safe point
            except sglang.StandinError as e:
                m = re.search(r"failed its checksum on rank\(s\) \[[\d, ]+\]", str(e))
                if not m:
                    raise
                apply_failed = m.group(0)
            try:
                src.wait(v, 60000)                # every sink applied v
            except _lib.DteError:
                if apply_failed is None:
                    raise
            sync_ms = (time.perf_counter() - t0) * 1e3
            flipped = None
            if v in args.corrupt:
                kind, keep = args.corrupt[v]
                flipped = corrupt_target(kind, task, mem, cfg, TP)
                mem.flip_bit(*flipped, 0)
                print("demo: TEST ONLY: flipped bit 0 of rank %d %s element %d in the "
                      "stand-in's memory after apply(%d)%s" % (
                          flipped + (v, ", left flipped" if keep else "")), flush=True)
                if keep:
                    flipped = None
            want = ref.expected_sink(theta, cfg, TP, TP)
            bad, total, where = ref.compare(want, mem)
            split = ref.replicas_disagree(theta)
            with torch.no_grad():
                got = standin.logits(held_x)
                logits_ok = torch.equal(logits_of(sglang, cfg, TP, want, held_x), got)
                held_loss = float(torch.nn.functional.cross_entropy(
                    got.reshape(-1, got.shape[-1]), held_y.reshape(-1)))
            ok = bad == 0 and total == n_elems and logits_ok and not split and not apply_failed
            dense_b = 2 * info["elements"]
            mode = "dense" if info["dense"] else "sparse"
            pct = 100.0 * info["changed"] / max(info["elements"], 1)
            rows.append((v, rec, info, dense_b, sync_ms, ok, held_loss))
            verdict = "yes" if ok else "NO: %d of %d elements differ%s%s%s" % (
                bad, total, "" if logits_ok else ", held-out logits differ",
                ", trainer replicas disagree %s" % split if split else "",
                ", apply %s (dense repair next)" % apply_failed if apply_failed else "")
            print("%4d %5d %7.4f %8.2f %11d %11d %6s %8.1f  %s" % (
                v, rec["step"], rec["loss"], pct, info["bytes"], dense_b, mode, sync_ms,
                verdict), flush=True)
            for r, name, n in where[:5]:
                print("      rank %d %s: %d elements differ" % (r, name, n), flush=True)
            if flipped:
                mem.flip_bit(*flipped, 0)   # back, before the daemon writes again
        failed = False
    finally:
        if rows or daemons:
            prog.say("stopping the stand-in and the daemons")
        if mem is not None:
            mem.close()
        if standin is not None:
            standin.stop()
        if src is not None:
            src.close()
        if trainer is not None:
            trainer.close()
        if model is not None:
            model.close()
        codes = {d.name: d.stop() for d in daemons}
        left = leftovers(tmp, pids)
        if failed or any(codes.values()) or left:
            for d in daemons:
                print("--- %s log (tail) ---\n%s" % (d.name, d.tail()), file=sys.stderr)
        if not args.keep and not failed:
            shutil.rmtree(tmp, ignore_errors=True)

    n = len(rows)
    exact = sum(1 for r in rows if r[5])
    sparse_b = sum(r[2]["bytes"] for r in rows)     # every byte sent, version 1 included
    dense_b = sum(r[3] for r in rows)
    later = rows[1:]
    if later:
        sb, db = sum(r[2]["bytes"] for r in later), sum(r[3] for r in later)
        pct = [100.0 * r[2]["changed"] / max(r[2]["elements"], 1) for r in later]
        nd = sum(1 for r in later if r[2]["dense"])
        print("demo: versions 2..%d (%s): %.2f%% of BF16 elements changed per step on "
              "average; sent %d bytes where dense syncs would send %d: %.1fx fewer; mean "
              "sync %.1f ms" % (
                  n, "sparse" if not nd else "%d sparse, %d dense" % (len(later) - nd, nd),
                  sum(pct) / len(pct), sb, db, db / max(sb, 1),
                  sum(r[4] for r in later) / len(later)))
    if rows:
        first, last = rows[0], rows[-1]
        print("demo: held-out loss (the stand-in's logits on a batch never trained on): "
              "%.4f after version %d -> %.4f after version %d" % (
                  first[6], first[0], last[6], last[0]))
        print("demo: " + train_loss_line(rows, task.data.shape[0]))
    print("demo: daemons exited %s; processes left: %s" % (
        ", ".join("%s=%s" % kv for kv in codes.items()), left or "none"))
    if rows:
        print("demo: whole run, versions 1..%d (version 1 %s, to a fresh sink): sent %d bytes "
              "against %d for a dense sync of every version: %.1fx fewer (the last line's "
              "sparse_bytes, dense_bytes and ratio)" % (
                  n, "dense" if rows[0][2]["dense"] else "sparse", sparse_b, dense_b,
                  dense_b / max(sparse_b, 1)))
    print("demo: versions=%d exact=%d/%d sparse_bytes=%d dense_bytes=%d ratio=%.1f" % (
        n, exact, n, sparse_b, dense_b, dense_b / max(sparse_b, 1)), flush=True)
    ok = n == args.versions and exact == n and not left and not any(codes.values())
    return 0 if ok else 1


def train_loss_line(rows, nb):
    """The synced phase's training loss in a form that compares: each step's
    loss is on its own batch and the toy task's nb batches cycle, so any nb
    consecutive versions stepped on every batch once, and their means at the
    start and at the end are over the same batches."""
    loss = [r[1]["loss"] for r in rows]
    n = len(loss)
    if n <= nb:
        return ("training loss: the %d synced versions each stepped on a different one of "
                "the task's %d batches (a row's loss is its own batch's), so no two rows "
                "compare; their mean %.4f" % (n, nb, sum(loss) / n))
    return ("training loss, mean over the task's %d batches (a row's loss is its own "
            "batch's): versions 1..%d %.4f -> versions %d..%d %.4f" % (
                nb, nb, sum(loss[:nb]) / nb, n - nb + 1, n, sum(loss[-nb:]) / nb))


def corrupt_target(kind, task, mem, cfg, tp):
    """TEST ONLY: (rank, tensor, flat index) of the element --corrupt flips.

    embed-unused: column 0 of the last rank's embedding row of the highest
      token id the toy chain never uses: never in a batch (zero gradient)
      nor in the held-out batch, so held-out logits cannot see it; only the
      all-weights comparison can.
    norm-replica: element 0 of the last rank's copy of model.norm.weight, a
      replicated tensor (a check that reads replicas from rank 0 only
      misses it; that rank's half of the logits does not)."""
    if kind == "norm-replica":
        return tp - 1, "model.norm.weight", 0
    used = set(int(t) for t in task.alphabet)
    rows = mem.shape(tp - 1, "model.embed_tokens.weight")[0]
    lo = (tp - 1) * rows
    tok = max(t for t in range(lo, min(lo + rows, cfg["vocab_size"])) if t not in used)
    return tp - 1, "model.embed_tokens.weight", (tok - lo) * cfg["hidden_size"]


if __name__ == "__main__":
    sys.exit(main())

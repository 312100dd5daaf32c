"""Processes for the fault matrix (tests/faults/faults.py).

The trainer and, where a scenario kills one, a sink replica run in child
processes so SIGKILL hits a real process; both speak one line per command
on stdin/stdout.  The trainer writes RNE(θ_v) (through the independent
Python converter, sync_local.expected) to <work>/exp_<v>.pt *before* it
publishes v, so whatever version a sink reports can be checked element by
element, even when the trainer dies mid-publish.

Daemons, network namespaces and dte-peer-forge come from
tests/system/cluster_sync_lib.py; the model, layouts and checks from
tests/system/sync_local.py.
"""

import os
import select
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "system"))
B = os.environ.get("B", "build")
if not os.path.isabs(B):
    B = os.path.join(ROOT, B)
os.environ["B"] = B

import cluster_sync_lib as csl  # noqa: E402
import harness  # noqa: E402

# One implementation in harness.py; the names stay here for importers.
SANITIZER_MARKS, sanitizer_lines = harness.SANITIZER_MARKS, harness.sanitizer_lines


class HookDaemon(harness.Daemon):
    """The daemon fixture (harness.Daemon), whose hook= (DTE_TEST_HOOK,
    tests/faults/testhook.h) runs the test build ($B/tests/dted-faults), else the
    production $B/bin/dted, with every exit judged.

    Every process it starts is reaped and its exit checked before the next
    one starts: stop() wants status 0, kill() (the test's SIGKILL) wants
    -SIGKILL from a process that was still running, wait_dead() (a die-in-*
    hook) wants -SIGKILL from the hook's own raise().  Anything else lands
    in self.bad_exits, which the matrix turns into a failure."""

    def __init__(self, *a, **kw):
        kw.setdefault("job_state_dir", True)     # as cluster_sync_lib.Daemon
        super().__init__(*a, **kw)
        self.checked = True      # the current process was reaped and judged
        self.bad_exits = []

    def start(self, timeout=20.0):
        if not self.checked:
            raise RuntimeError("dted %s: the previous process was not reaped and checked"
                               % self.name)
        self.checked = False
        try:
            super().start(timeout)
        except Exception as e:
            rc = self.proc.poll() if self.proc else None
            if self.proc and rc is None:
                self.proc.kill()
                rc = self.proc.wait()
            self.checked = True
            errs = [x for x in self.log_since().splitlines() if " error: " in x]
            raise RuntimeError("dted %s%s did not start (exit %s): %s" % (
                self.name, " with DTE_TEST_HOOK=%s" % self.hook if self.hook else "", rc,
                errs[0].split(" error: ", 1)[1] if errs else str(e).splitlines()[0])) from None
        if self.hook and ("test hook armed: %s" % self.hook) not in self.log_since():
            said = [x for x in self.log_since().splitlines() if "test hook" in x]
            raise RuntimeError("dted %s: DTE_TEST_HOOK=%s not armed (%s)" % (
                self.name, self.hook, said[-1] if said else "the daemon said nothing of it"))
        return self

    def _judge(self, rc, want, how):
        self.checked = True
        if rc != want:
            self.bad_exits.append("%s start %d: %s: exit status %s, wanted %s" % (
                self.name, self.starts - 1, how, rc, want))
        return rc

    def stop(self, timeout=20.0):
        if self.checked:
            return 0
        if self.proc.poll() is not None:
            return self._judge(self.proc.returncode, 0, "exited before the test stopped it")
        return self._judge(super().stop(timeout), 0, "SIGTERM")

    def kill(self):
        """The test's SIGKILL (a sink daemon killed mid-version)."""
        if self.checked:
            raise RuntimeError("dted %s: kill() with no process running" % self.name)
        if self.proc.poll() is not None:
            rc = self._judge(self.proc.returncode, "running", "died before the test killed it")
        else:
            rc = self._judge(super().kill(), -signal.SIGKILL, "SIGKILL by the test")
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        return rc

    def wait_dead(self, timeout=10.0):
        """The daemon is to kill itself (a die-in-* hook): reap it.  Returns
        its exit status, or None when it is still running after timeout (it
        is then stopped and the exit recorded as wrong)."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self._judge(self.proc.wait(), -signal.SIGKILL, "did not die by its hook")
            self.bad_exits.append("%s: the die hook did not kill it within %.0f s" %
                                  (self.name, timeout))
            rc = None
        else:
            self._judge(rc, -signal.SIGKILL, "death by its hook")
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        return rc


QUIT_S = 10.0      # how long a child has to exit after `quit`


class LineProc:
    """A child speaking one line per command."""

    def __init__(self, args):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)] + args,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=ROOT, env=csl.child_env(_py_env()))
        self.buf = ""

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def readline(self, timeout=60.0):
        end = time.time() + timeout
        fd = self.proc.stdout.fileno()
        while "\n" not in self.buf:
            left = end - time.time()
            if left <= 0:
                raise TimeoutError("child %d: no answer" % self.proc.pid)
            r, _, _ = select.select([fd], [], [], left)
            if r:
                chunk = os.read(fd, 65536).decode()
                if not chunk:
                    raise EOFError("child %d exited (%s)" % (self.proc.pid, self.proc.poll()))
                self.buf += chunk
        line, self.buf = self.buf.split("\n", 1)
        return line

    def ask(self, line, timeout=60.0):
        self.send(line)
        return self.readline(timeout)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait()

    def wait_exit(self, timeout):
        """Exit status of a child that is to end by itself; None if it is
        still running after timeout."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self):
        """Ask it to quit; returns its exit status (0 when it did).  One
        still running after QUIT_S has its threads' stacks written to its
        stderr (faulthandler, registered in the child) before it is killed:
        a trainer once took longer than that under load, and nothing said
        where it was."""
        if self.proc.poll() is None:
            try:
                self.send("quit")
                return self.proc.wait(QUIT_S)
            except Exception:
                if self.proc.poll() is None:
                    sys.stderr.write("child %d did not quit within %.0f s; its stacks:\n"
                                     % (self.proc.pid, QUIT_S))
                    sys.stderr.flush()
                    self.proc.send_signal(signal.SIGUSR1)
                    try:
                        self.proc.wait(2)
                    except subprocess.TimeoutExpired:
                        pass
                self.kill()
        return self.proc.returncode


def _py_env():
    # A sanitizer build's libdte.so needs the ASan runtime preloaded in the
    # child Python too (cluster_sync_lib.asan_reexec did it for us).
    e = {}
    if os.environ.get("DTE_ASAN_REEXEC"):
        e = {"LD_PRELOAD": os.environ.get("LD_PRELOAD", ""), "ASAN_OPTIONS": "detect_leaks=0",
             "DTE_ASAN_REEXEC": "1", "DTE_SYNC_ASAN": "1"}
    return e


class TrainerProc(LineProc):
    """Megatron TP=2 trainer (real AdamW) in a child process."""

    def __init__(self, work, seed):
        super().__init__(["--trainer", work, str(seed)])
        assert self.readline(120) == "READY"

    def connect(self, sock, coord_addr):
        r = self.ask("connect %s %s" % (sock, coord_addr))
        if not r.startswith("ok"):
            raise RuntimeError("trainer connect: %s" % r)

    def publish(self, v, timeout=60.0):
        """Returns (ok, dense, sinks, message)."""
        r = self.ask("publish %d" % v, timeout).split(" ", 3)
        if r[0] == "ok":
            return True, int(r[1]), int(r[2]), ""
        return False, 0, 0, " ".join(r[1:])

    def publish_half(self, v):
        """The trainer publishes v on its TP rank 0 only and then waits for
        die() before rank 1 publishes.  Returns the line it printed
        ("half <v> <sinks>" once rank 0's publish was accepted) or the
        error."""
        return self.ask("publish-die %d" % v, 60)

    def die(self, delay_ms):
        """After publish_half: SIGKILL itself delay_ms later."""
        self.send("die %d" % delay_ms)

    def wait(self, v, timeout_ms):
        r = self.ask("wait %d %d" % (v, timeout_ms), timeout_ms / 1000.0 + 30)
        return r == "ok", r


class SinkProc(LineProc):
    """One SGLang TP=2 replica in a child process, applying what is staged."""

    def __init__(self, work, sock, coord_addr, replica, rank):
        super().__init__(["--sink", work, sock, coord_addr, str(replica), str(rank)])
        assert self.readline(120) == "READY"

    def die_at(self, v):
        """Once v (or newer) is staged for it, the process prints "staged
        <v>" and, instead of applying, waits for die()."""
        r = self.ask("die-at %d" % v)
        if r != "ok":
            raise RuntimeError("sink die-at: %s" % r)

    def die(self):
        """After "staged <v>": SIGKILL itself."""
        self.send("die")

    def query(self):
        """(applied version, path of its weights dump)."""
        r = self.ask("query").split()
        return int(r[1]), r[2]


# ------------------------------------------------------------- children
def publish_retry(cli, sl, part, v, rec):
    """A re-attached source waits for the coordinator's new plan: the job
    is `incomplete` until then.  The step is not repeated."""
    end = time.time() + 15
    while True:
        try:
            return cli.publish(sl.JOB, part, v, rec["step"], sl.groups_of(rec))
        except Exception as e:
            if "incomplete" not in str(e) or time.time() > end:
                raise
            time.sleep(0.05)


def _trainer_main(work, seed):
    import torch
    import sync_local as sl
    from dte import _lib, megatron, toy

    torch.manual_seed(seed)
    torch.set_num_threads(1)
    megatron.shard_shapes = getattr(sl, "flat_order_shapes", None) or megatron.flat_buffer_shapes
    model = megatron.MegatronModel(sl.CFG, tp=sl.TP, seed=seed, label="ft-src%d" % seed)
    trainer = megatron.Trainer(model, lr=sl.LR, warmup=sl.WARMUP)
    task = toy.ToyTask(sl.CFG["vocab_size"])
    cli, parts = None, []
    step = 0

    def step_and_record(step, v):
        """One training step; version v's expected sink contents saved
        atomically (written aside, renamed) for the checking side."""
        rec = trainer.step(*task.batch_at(step))
        tmp = os.path.join(work, "exp_%d.pt.tmp" % v)
        torch.save(sl.expected(model), tmp)
        os.rename(tmp, os.path.join(work, "exp_%d.pt" % v))
        return rec

    print("READY", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        try:
            if cmd[0] == "quit":
                break
            if cmd[0] == "connect":
                if cli:
                    try:
                        cli.close()
                    except Exception:
                        pass
                cli = _lib.Client(cmd[1])
                cli.job_create(sl.JOB, sl.CFG_TEXT, sl.TOKEN, cmd[2], 1)
                parts = []
                for r in range(sl.TP):
                    want = _lib.layout_buffers(sl.CFG_TEXT, sl.SRC_LAYOUT, _lib.SOURCE, r)
                    ids = []
                    for (bid, length, bname), kind in zip(want, ("param", "exp_avg",
                                                                 "exp_avg_sq")):
                        a = model.arenas[r][kind]
                        ids.append(cli.register_fd(a.fd, 0, length, _lib.FP32,
                                                   "%s r%d" % (kind, r)))
                    parts.append(cli.attach(sl.JOB, sl.TOKEN, _lib.SOURCE, sl.SRC_LAYOUT, r, ids))
                print("ok", flush=True)
            elif cmd[0] == "publish":
                v = int(cmd[1])
                step += 1
                rec = step_and_record(step, v)
                infos = [publish_retry(cli, sl, p, v, rec) for p in parts]
                print("ok %d %d" % (sum(i["dense"] for i in infos),
                                    sum(i["sinks"] for i in infos)), flush=True)
            elif cmd[0] == "publish-die":
                v = int(cmd[1])
                step += 1
                rec = step_and_record(step, v)
                info = publish_retry(cli, sl, parts[0], v, rec)
                print("half %d %d" % (v, info["sinks"]), flush=True)
                go = sys.stdin.readline().split()
                if go[:1] == ["die"]:
                    time.sleep(int(go[1]) / 1000.0)
                    os.kill(os.getpid(), signal.SIGKILL)
                print("err wanted die, got %s" % go, flush=True)
            elif cmd[0] == "wait":
                cli.wait(sl.JOB, int(cmd[1]), int(cmd[2]))
                print("ok", flush=True)
            else:
                print("err unknown command", flush=True)
        except Exception as e:  # reported to the parent, which decides
            print("err %s" % str(e).replace("\n", " "), flush=True)
    # Asked to quit: the client closed here, while faulthandler still
    # answers SIGUSR1 (LineProc.close), then out without the interpreter's
    # teardown of torch and the arenas.  A trainer once outlived QUIT_S
    # after quit under load, in that teardown (SIGUSR1's handler was gone:
    # it died of the signal, -10).
    if cli:
        cli.close()
    sys.stdout.flush()
    os._exit(0)


def _sink_main(work, sock, coord_addr, replica, rank):
    import torch
    import sync_local as sl
    from dte import _lib, sglang

    torch.set_num_threads(1)
    model = sglang.SGLangModel(sl.CFG, tp=sl.TP, label="fs-%d-%d-%d" % (os.getpid(), replica,
                                                                          rank))
    cli = _lib.Client(sock)
    cli.job_create(sl.JOB, sl.CFG_TEXT, sl.TOKEN, coord_addr, 1)
    part = sl.attach_sink(cli, model.arenas[rank], rank, replica)
    applied = 0
    die_at = 0
    print("READY", flush=True)
    while True:
        r, _, _ = select.select([sys.stdin], [], [], 0.02)
        if r:
            line = sys.stdin.readline()
            if not line or line.startswith("quit"):
                break
            if line.startswith("die-at"):
                die_at = int(line.split()[1])
                print("ok", flush=True)
            elif line.startswith("query"):
                applied = cli.query_version(sl.JOB, part)[0]
                path = os.path.join(work, "sink_%d_%d.pt" % (os.getpid(), applied))
                torch.save({k: t.clone() for k, t in model.weights(rank).items()}, path)
                print("version %d %s" % (applied, path), flush=True)
            continue
        try:
            v = cli.wait_staged(sl.JOB, part, 20)
        except _lib.DteError as e:
            if e.code == _lib.ERR_TIMEOUT:
                continue
            raise
        if die_at and v >= die_at:
            print("staged %d" % v, flush=True)
            if sys.stdin.readline().startswith("die"):
                os.kill(os.getpid(), signal.SIGKILL)
            print("err wanted die", flush=True)
            die_at = 0
        if v > applied:
            cli.apply(sl.JOB, part, v)
            applied = v


if __name__ == "__main__":
    import faulthandler
    faulthandler.register(signal.SIGUSR1, all_threads=True)   # LineProc.close
    if sys.argv[1] == "--trainer":
        _trainer_main(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "--sink":
        _sink_main(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))

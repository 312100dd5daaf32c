#!/usr/bin/python3
"""Cross-cluster sync through a shared directory (DESIGN §5, issue 7).

A writer group (this script + `dte-storage write`, one process per version)
trains a ~1M-element model with real torch AdamW at lr 1e-6 and stores every
version's changed BF16 elements; three reader processes (`dte-storage read`,
inotify, polling, and a late joiner) share only the directory and apply the
versions to their own copies.  Every version a reader applies must hash
(xxh3 of the whole BF16 state) exactly like the trainer's.  On the way:
the writer is SIGKILLed in the middle of a chunk and in the middle of the
manifest commit, and a chunk byte is corrupted, a manifest truncated and a
chunk deleted while the readers are stopped: each is refused with its
reason and repaired from the next keyframe.  Ends with gc/ls/verify.
"""

import ctypes
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
B = os.environ.get("B", "build")
TOOL = os.path.join(ROOT, B, "bin", "dte-storage")
# The test build of dte-storage: the only one that reads DTE_STORAGE_HOOK
# (tests/faults/faults.mk).
TOOL_FAULTS = os.path.join(ROOT, B, "tests", "dte-storage-faults")
JOB = "policy"
LAST = 70
KEYFRAME_EVERY = 10
KILL_CHUNK, KILL_MANIFEST = 15, 25
STOP_AT = 35                   # readers are stopped after this one
CORRUPT, TRUNCATE, DELETE = 38, 45, 57
LATE_JOIN = 31                 # the late reader starts once this is written

_xxh = ctypes.CDLL("libxxhash.so.0")
_xxh.XXH3_64bits.restype = ctypes.c_uint64
_xxh.XXH3_64bits.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def xxh3(a):
    a = np.ascontiguousarray(a)
    return "%016x" % _xxh.XXH3_64bits(a.ctypes.data, a.nbytes)


class Trainer:
    """Real AdamW updates; canonical BF16 state as one uint16 vector."""

    def __init__(self):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(),
                                         torch.nn.Linear(1024, 512))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-6, weight_decay=0.01)
        self.names = [n for n, _ in self.model.named_parameters()]
        self.numel = [p.numel() for p in self.model.parameters()]
        self.x = torch.randn(64, 512)
        self.y = torch.randn(64, 512)

    def bf16(self):
        with torch.no_grad():
            return np.concatenate([p.detach().reshape(-1).to(torch.bfloat16).view(torch.int16)
                                   .numpy().view(np.uint16) for p in self.model.parameters()])

    def step(self):
        self.opt.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(self.x), self.y)
        loss.backward()
        self.opt.step()


def write_delta(path, numel, prev, cur):
    """The changed set by comparing BF16 of consecutive versions."""
    out = [b"DTSD1\0\0\0", struct.pack("<II", len(numel), 0)]
    changed, off = 0, 0
    for n in numel:
        idx = np.nonzero(prev[off:off + n] != cur[off:off + n])[0].astype("<u8")
        out += [struct.pack("<Q", len(idx)), idx.tobytes(), cur[off:off + n][idx].astype("<u2").tobytes()]
        changed += len(idx)
        off += n
    with open(path, "wb") as f:
        f.write(b"".join(out))
    return changed


def proc_state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "?"


def reader_race(root, spec, tr, write):
    """A reader that misses v, then (preempted, or stopped) looks for newer
    versions after the writer committed v and v+1, must read v, not call it
    a gap.  Made certain with the test build's reader, which stops itself
    between the two looks (DTE_STORAGE_HOOK=read-miss-stop).  Under two CPU
    hogs this once cost reader C of the main run versions 36..39."""
    job = "race"
    states = []
    for v in range(2):
        if v:
            tr.step()
        states.append(tr.bf16())
        write(v, states[v], states[v - 1] if v else None, job=job)
    p = subprocess.Popen([TOOL_FAULTS, "read", root, job, "--spec", spec, "--name", "R",
                          "--watch", "inotify", "--interval-ms", "50", "--until", "3",
                          "--timeout", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=dict(os.environ, DTE_STORAGE_HOOK="read-miss-stop"))
    end = time.time() + 30
    while proc_state(p.pid) != "T" and p.poll() is None and time.time() < end:
        time.sleep(0.01)
    stopped = proc_state(p.pid) == "T"
    check(stopped, "reader-race: the reader did not stop at its first miss (state %s)" %
          proc_state(p.pid))
    for v in (2, 3):
        tr.step()
        states.append(tr.bf16())
        write(v, states[v], states[v - 1], job=job)
    os.kill(p.pid, signal.SIGCONT)
    o, e = p.communicate(timeout=60)
    applied = [int(x.split()[1].split("=")[1]) for x in o.splitlines() if x.startswith("applied ")]
    refused = [x for x in o.splitlines() if x.startswith("refused: ")]
    hashes = [x.split("xxh3=")[1] for x in o.splitlines() if x.startswith("applied ")]
    exact = sum(1 for v, h in zip(applied, hashes) if h == xxh3(states[v]))
    check("stopped after a miss" in e, "reader-race: the hook did not fire: %r" % e[-300:])
    check(p.returncode == 0 and applied == [0, 1, 2, 3] and not refused and exact == 4,
          "reader-race: a reader stopped between its miss of v2 and its look for newer versions "
          "applied %s (exact %d), refused %s, rc %s" % (applied, exact, refused, p.returncode))
    return "stopped=%d applied=%d exact=%d refused=%d" % (stopped, len(applied), exact, len(refused))


def main():
    tmp = tempfile.mkdtemp(prefix="storage_basic.")
    root = os.path.join(tmp, "shared")
    os.mkdir(root)
    tr = Trainer()
    spec = os.path.join(tmp, "spec.json")
    with open(spec, "w") as f:
        json.dump({"tensors": [{"name": n, "numel": k} for n, k in zip(tr.names, tr.numel)]}, f)
    total = sum(tr.numel)
    print("model: tensors=%d elements=%d" % (len(tr.numel), total), flush=True)
    ref = {}
    changed = {}

    def write(v, cur, prev, env=None, wait=True, job=JOB):
        dfile, dense = os.path.join(tmp, "delta.bin"), os.path.join(tmp, "dense.bin")
        if prev is not None:
            changed[v] = write_delta(dfile, tr.numel, prev, cur)
        cur.astype("<u2").tofile(dense)
        # A hook (env) needs the test build; the production tool ignores it.
        cmd = [TOOL_FAULTS if env else TOOL, "write", root, job, "--spec", spec,
               "--version", str(v), "--dense", dense,
               "--keyframe-every", str(KEYFRAME_EVERY), "--max-chunk", "262144"]
        if prev is not None:
            cmd += ["--delta", dfile]
        if not wait:
            return subprocess.Popen(cmd, env=dict(os.environ, **env), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("write v%d failed: %s" % (v, r.stderr))
        return r.stdout

    def killed_in(v, cur, prev, hook, what):
        """Start the writer with a pause hook, SIGKILL it there."""
        p = write(v, cur, prev, env={"DTE_STORAGE_HOOK": hook}, wait=False)
        line = p.stderr.readline()
        check("paused in " + what in line, "v%d: writer did not pause in the %s: %r" % (v, what, line))
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        check(p.returncode == -signal.SIGKILL, "v%d: writer not killed" % v)
        check(not os.path.exists(os.path.join(root, JOB, "v%d.manifest" % v)),
              "v%d: a manifest exists after the kill" % v)
        return "%s@v%d" % (what, v)

    def probe(v, what):
        """A one-shot reader (no name, --watch none) drains the directory
        exactly as the kill in the middle of v's `what` left it, and exits:
        a look at the partial state that has provably happened (unlike a
        sleep while the streaming readers may or may not poll).  It must
        stop at v-1, refuse nothing and hash every version it applied like
        the trainer."""
        r = subprocess.run([TOOL, "read", root, JOB, "--spec", spec, "--watch", "none"],
                           capture_output=True, text=True, timeout=120)
        applied = []
        for line in r.stdout.splitlines():
            if line.startswith("applied "):
                kv = dict(x.split("=", 1) for x in line.split()[1:])
                applied.append((int(kv["version"]), kv["xxh3"]))
        last = [x for x in r.stdout.splitlines() if x.startswith("read: ")]
        kv = dict(x.split("=", 1) for x in last[-1].split()[1:]) if last else {}
        bad = [u for u, h in applied if ref.get(u) != h]
        check(r.returncode == 0 and kv.get("position") == str(v - 1) and
              kv.get("refused") == "0" and applied and not bad,
              "v%d killed in the %s: a reader of that state applied %s (not exact: %s), "
              "ended %r, rc %d %s" % (v, what, [u for u, _ in applied], bad, last[-1:],
                                      r.returncode, r.stderr.strip()[-200:]))

    def reader(name, watch):
        cmd = [TOOL, "read", root, JOB, "--spec", spec, "--name", name, "--watch", watch,
               "--interval-ms", "50", "--until", str(LAST), "--timeout", "80"]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def position(name):
        try:
            with open(os.path.join(root, JOB, "readers", name)) as f:
                return json.load(f)["version"]
        except (OSError, ValueError):
            return -1

    def wait_readers(names, v, timeout=20):
        end = time.time() + timeout
        while time.time() < end:
            if all(position(n) >= v for n in names):
                return True
            time.sleep(0.02)
        check(False, "readers %s did not reach v%d (at %s)" % (names, v, [position(n) for n in names]))
        return False

    t0 = time.time()
    readers = {"A": reader("A", "inotify"), "B": reader("B", "poll")}
    prev = None
    kills = []
    for v in range(0, LAST + 1):
        if v:
            tr.step()
        cur = tr.bf16()
        ref[v] = xxh3(cur)
        if v in (KILL_CHUNK, KILL_MANIFEST):
            # The streaming readers are caught up and watching when the
            # partial files appear; a one-shot reader reads them for sure.
            wait_readers(sorted(readers), v - 1)
        if v == KILL_CHUNK:
            kills.append(killed_in(v, cur, prev, "chunk-pause", "chunk"))
            probe(v, "chunk")
        if v == KILL_MANIFEST:
            kills.append(killed_in(v, cur, prev, "manifest-pause", "manifest"))
            tmps = [f for f in os.listdir(os.path.join(root, JOB)) if f.startswith(".v%d.manifest.tmp" % v)]
            check(len(tmps) == 1, "v%d: the half-written temp manifest is not there" % v)
            probe(v, "manifest")
        write(v, cur, prev)
        if v == LATE_JOIN:
            readers["C"] = reader("C", "inotify")
        if v == STOP_AT:
            wait_readers(["A", "B", "C"], STOP_AT)
            for p in readers.values():
                os.kill(p.pid, signal.SIGSTOP)
        vdir = os.path.join(root, JOB, "v%d" % v)
        if v == CORRUPT:
            path = os.path.join(vdir, "d00000.dtc")
            with open(path, "r+b") as f:
                f.seek(os.path.getsize(path) // 2)
                b = f.read(1)
                f.seek(-1, 1)
                f.write(bytes([b[0] ^ 0x10]))
        if v == TRUNCATE:
            path = os.path.join(root, JOB, "v%d.manifest" % v)
            os.truncate(path, os.path.getsize(path) // 2)
        if v == DELETE:
            os.unlink(os.path.join(vdir, "d00000.dtc"))
        if v == LAST - 5:
            for p in readers.values():
                os.kill(p.pid, signal.SIGCONT)
        prev = cur
    t_write = time.time() - t0

    out = {}
    for name, p in readers.items():
        o, e = p.communicate(timeout=85)
        out[name] = o
        check(p.returncode == 0, "reader %s exited %s: %s" % (name, p.returncode, e.strip()[-300:]))

    skipped = set(range(CORRUPT, 40)) | set(range(TRUNCATE, 50)) | set(range(DELETE, 60))
    summary = {}
    for name, o in out.items():
        applied, refused = [], []
        for line in o.splitlines():
            if line.startswith("applied "):
                kv = dict(x.split("=", 1) for x in line.split()[1:])
                applied.append((int(kv["version"]), kv["kind"], kv["xxh3"]))
            elif line.startswith("refused: "):
                refused.append(line)
        vers = [a[0] for a in applied]
        exact = sum(1 for v, _, h in applied if ref.get(v) == h)
        summary[name] = (len(applied), exact)
        check(exact == len(applied), "reader %s: %d of %d versions differ" % (name, len(applied) - exact, len(applied)))
        check(vers == sorted(vers) and len(set(vers)) == len(vers), "reader %s: versions out of order" % name)
        if name != "C":   # C joins later
            check(KILL_CHUNK in vers and KILL_MANIFEST in vers and KILL_CHUNK + 1 in vers,
                  "reader %s: the versions after the kills are missing" % name)
        check(not (set(vers) & skipped), "reader %s applied a version of a broken link" % name)
        for k in (40, 50, 60):
            check((k, "keyframe") in [(a[0], a[1]) for a in applied], "reader %s: no repair at keyframe %d" % (name, k))
        reasons = "\n".join(refused)
        check(len(refused) == 3, "reader %s: %d refusals, expected 3:\n%s" % (name, len(refused), reasons))
        for what in ("v%d chunk d00000.dtc: xxh3 mismatch" % CORRUPT, "v%d: manifest: not valid JSON" % TRUNCATE,
                     "v%d chunk d00000.dtc: file missing" % DELETE):
            check(what in reasons, "reader %s: no refusal saying %r; its refusals:\n%s" %
                  (name, what, reasons))
        print("reader %s: applied=%d exact=%d refused=%d first=v%d" % (name, len(applied), exact, len(refused),
                                                                        vers[0] if vers else -1), flush=True)
    check(out["C"].splitlines()[0].startswith("applied version=30 kind=keyframe"),
          "late reader did not start at keyframe 30: %r" % out["C"].splitlines()[:1])
    check(summary["A"][0] >= 50, "reader A applied only %d versions" % summary["A"][0])

    ls = json.loads(subprocess.run([TOOL, "ls", root, JOB, "--json"], capture_output=True, text=True,
                                   check=True).stdout)
    vs = {v["version"]: v for v in ls["versions"]}
    check(sorted(vs) == list(range(0, LAST + 1)), "ls does not list every version")
    check(ls["keyframes"] == list(range(0, LAST + 1, KEYFRAME_EVERY)), "ls keyframes: %s" % ls["keyframes"])
    check(sorted(r["name"] for r in ls["readers"]) == ["A", "B", "C"] and
          all(r["version"] == LAST for r in ls["readers"]), "ls readers: %s" % ls["readers"])
    delta_v = [v for v in range(1, LAST + 1) if vs[v].get("ok")]
    delta_bytes = sum(vs[v]["delta_bytes"] for v in delta_v)
    n_changed = sum(vs[v]["changed"] for v in delta_v)
    check(all(vs[v]["changed"] == changed[v] for v in delta_v), "manifest changed counts differ from the trainer's")
    key_bytes = sum(vs[v]["keyframe_bytes"] for v in vs if vs[v].get("ok") and vs[v]["kind"] == "keyframe")
    nkey = len(ls["keyframes"])

    verify = subprocess.run([TOOL, "verify", root, JOB, "--spec", spec], capture_output=True, text=True)
    vlines = verify.stdout.splitlines()
    check(verify.returncode == 1 and vlines[-1] == "verify: versions=%d bad=3" % (LAST + 1),
          "verify before gc: %s" % vlines[-1:])
    gc = subprocess.run([TOOL, "gc", root, JOB, "--keep", "5", "--keep-keyframes", "1"], capture_output=True,
                        text=True)
    check(gc.returncode == 0 and gc.stdout.startswith("gc: floor=%d removed=%d " % (LAST - 4, LAST - 4)),
          "gc: %r %r" % (gc.stdout, gc.stderr))
    verify = subprocess.run([TOOL, "verify", root, JOB, "--spec", spec], capture_output=True, text=True)
    check(verify.returncode == 0 and verify.stdout.splitlines()[-1] == "verify: versions=5 bad=0",
          "verify after gc: %r" % verify.stdout[-200:])
    leftovers = [f for f in os.listdir(os.path.join(root, JOB)) if f.startswith(".") or
                 (f.startswith("v") and not f.endswith(".manifest") and not os.path.exists(
                     os.path.join(root, JOB, f + ".manifest")))]
    check(not leftovers, "gc left %s" % leftovers)

    race = reader_race(root, spec, tr, write)

    subprocess.run(["rm", "-rf", tmp])
    print("reader-race: %s" % race, flush=True)
    print("kills: SIGKILL in %s; no partial version applied" % ", ".join(kills), flush=True)
    print("storage-readers: %s write_s=%.1f keyframe_bytes=%d keyframes=%d" % (
        " ".join("%s=%d/%d" % (n, s[1], s[0]) for n, s in sorted(summary.items())), t_write,
        key_bytes // max(nkey, 1), nkey), flush=True)
    if failures:
        print("storage: FAILED %d checks" % len(failures))
        return 1
    print("storage: versions=%d exact=%d/%d bytes_per_changed_element=%.3f sparse_vs_dense=%.5f" % (
        summary["A"][0], summary["A"][1], summary["A"][0], delta_bytes / max(n_changed, 1),
        delta_bytes / (len(delta_v) * total * 2.0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

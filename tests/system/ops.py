#!/usr/bin/python3
"""Operations against one real dted with real versions.

An HF-named model (fsdp:dp=1 source, real torch AdamW) publishes to an
SGLang TP=2 sink in this process.  Then every dtectl command runs in human
and --json form; `dtectl metrics` and the HTTP listener both pass
`promtool check metrics` and show the versions and bytes that went by; the
listener refuses a 1 MiB request line cleanly and keeps serving; verify
reports ok, then mismatch after this test corrupts a sink element, and the
next version repairs it densely (every element exact again); resync makes
the next version dense, for the job and for one sink; log-level get/set;
config shows where each value came from; bash completion offers every
command `dtectl help` lists.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time

import harness  # sets ROOT and B, puts client/python on sys.path
from harness import DTECTL, ROOT, child_env  # noqa: E402

# A sanitized libdte.so needs the ASan runtime loaded first (as demo_short).
if __name__ == "__main__":
    harness.asan_reexec()

import torch  # noqa: E402

from dte import qwen3, sglang  # noqa: E402
from dte.checks import Checks  # noqa: E402
from dte.sink import Sink  # noqa: E402
from dte.source import Source  # noqa: E402

JOB, TOKEN = "ops-job", "ops-token"


class Ctl:
    def __init__(self, sock):
        self.sock = sock

    def run(self, *args, json_out=False, timeout=60):
        argv = [DTECTL, "--socket", self.sock] + (["--json"] if json_out else []) + list(args)
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=child_env())
        return r.returncode, r.stdout, r.stderr

    def human(self, *args):
        """rc, {key: value} of the `key: value` lines."""
        rc, out, err = self.run(*args)
        kv = {}
        for line in out.splitlines():
            k, sep, v = line.partition(": ")
            if sep:
                kv[k] = v
        return rc, kv, out, err

    def js(self, *args):
        rc, out, err = self.run(*args, json_out=True)
        try:
            return rc, json.loads(out), err
        except ValueError:
            return rc, None, err


def http(port, raw):
    """Send raw bytes, read until the server closes; (status, body)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(raw)
        data = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            data += d
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/1\.1 (\d+) ", head)
    return (int(m.group(1)) if m else 0), body


def promtool(text):
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                       text=True)
    return r.returncode, (r.stdout + r.stderr).strip()


def sample(text, name, labels=""):
    """Value of one sample line, None when absent."""
    want = "%s{%s} " % (name, labels) if labels else name + " "
    for line in text.splitlines():
        if line.startswith(want):
            return float(line[len(want):])
    return None


def exact(params, eng, cfg):
    want = sglang.hf_to_sglang({n: p.detach().to(torch.bfloat16) for n, p in params.items()},
                               cfg, 2)
    return [(r, n) for r in range(2) for n, w in want[r].items()
            if not torch.equal(w.view(torch.int16), eng.weights(r)[n].view(torch.int16))]


class Run:
    """Trainer and sink of the job; one optimizer step and version per call."""

    def __init__(self, c, sock, cfg):
        self.c, self.cfg = c, cfg
        cfg_text = json.dumps(cfg)
        self.params = {n: torch.nn.Parameter(t.clone())
                       for n, t in qwen3.init_hf_weights(cfg, seed=5).items()}
        mats = [p for p in self.params.values() if p.dim() > 1]
        vecs = [p for p in self.params.values() if p.dim() == 1]
        self.opt = torch.optim.AdamW([{"params": mats, "weight_decay": 0.05},
                                      {"params": vecs, "weight_decay": 0.0}],
                                     lr=2e-5, betas=(0.9, 0.99), eps=1e-8)
        self.src = Source.hf(self.params, self.opt, sock, JOB, TOKEN, cfg_text)
        self.eng = sglang.SGLangModel(cfg, tp=2, label="ops-sink")
        self.sink = Sink.sglang(self.eng, sock, JOB, TOKEN, cfg_text)
        self.gen = torch.Generator().manual_seed(11)
        self.v = 0

    def version(self):
        self.v += 1
        tokens = torch.randint(0, self.cfg["vocab_size"], (2, 16), generator=self.gen)
        self.opt.zero_grad(set_to_none=True)
        logits = qwen3.forward(self.params, self.cfg, tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 tokens[:, 1:].reshape(-1))
        loss.backward()
        self.opt.step()
        info = self.src.publish(self.v)
        self.sink.apply(self.v)
        self.src.wait(self.v)
        bad = exact(self.params, self.eng, self.cfg)
        self.c.check(not bad, "v%d: every sink element is RNE(theta) %s" % (self.v, bad[:3]))
        return info

    def close(self):
        for x in (self.sink, self.src, self.eng):
            try:
                x.close()
            except Exception as e:  # closing must not hide the checks
                print("close: %s" % e)


def history_modes(ctl):
    rc, j, _ = ctl.js("history", JOB)
    if rc or not j:
        return {}
    return {int(v["version"]): v["mode"] for v in j.get("versions", [])}


def check_metrics(c, ctl, port, run):
    rc, text, err = ctl.run("metrics")
    c.check(rc == 0, "metrics exits 0 (%s)" % err.strip())
    prc, why = promtool(text)
    c.check(prc == 0, "promtool check metrics passes on `dtectl metrics` (%s)" % why)
    pub = sample(text, "dted_versions_published_total")
    app = sample(text, "dted_versions_applied_total")
    c.check(pub is not None and pub >= run.v, "versions published %s >= %d" % (pub, run.v))
    # Two sink ranks, each applies every version.
    c.check(app is not None and app >= 2 * run.v, "versions applied %s >= %d" % (app, 2 * run.v))
    sp = sample(text, "dted_wire_bytes_total", 'mode="sparse"') or 0
    de = sample(text, "dted_wire_bytes_total", 'mode="dense"') or 0
    c.check(sp > 0 and de > 0, "wire bytes sparse %d and dense %d both counted" % (sp, de))
    c.check((sample(text, "dted_elements_changed_total") or 0) > 0, "changed elements counted")
    ratio = sample(text, "dted_changed_ratio")
    c.check(ratio is not None and 0 < ratio < 0.5, "changed ratio of a sparse version %s" % ratio)
    for ph in ("capture", "transfer", "stage", "apply"):
        n = sample(text, "dted_phase_seconds_count", 'phase="%s"' % ph)
        inf = sample(text, "dted_phase_seconds_bucket", 'phase="%s",le="+Inf"' % ph)
        c.check(n and n >= run.v and inf == n, "phase %s histogram: count %s, +Inf %s" % (ph, n, inf))
    c.check((sample(text, "dted_dense_fallbacks_total", 'reason="initial"') or 0) >= 2,
            "initial dense fallbacks counted for both sinks")
    c.check((sample(text, "dted_control_requests_total", 'command="publish"') or 0) >= run.v,
            "control requests counted per command")
    c.check(sample(text, "dted_jobs") == 1, "jobs gauge")
    rc, j, _ = ctl.js("metrics")
    names = {s["name"] for s in (j or {}).get("samples", [])}
    c.check(rc == 0 and "dted_versions_published_total" in names and
            any(s["name"] == "dted_wire_bytes_total" and s["labels"].get("mode") == "dense"
                for s in j["samples"]), "metrics --json: samples with parsed labels")

    st, body = http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    body = body.decode()
    prc, why = promtool(body)
    c.check(st == 200 and prc == 0, "HTTP /metrics: 200 and promtool passes (%s %s)" % (st, why))
    fams = lambda t: sorted(set(re.findall(r"^# TYPE (\S+)", t, re.M)))  # noqa: E731
    c.check(fams(body) == fams(text) and len(fams(body)) >= 15,
            "HTTP serves the same families as dtectl metrics (%d)" % len(fams(body)))
    c.check((sample(body, "dted_versions_published_total") or 0) >= run.v,
            "HTTP metrics show the versions")
    t0 = time.time()
    st, _ = http(port, b"GET /" + b"a" * (1 << 20) + b" HTTP/1.1\r\n\r\n")
    c.check(st == 431 and time.time() - t0 < 5,
            "a 1 MiB request line is refused with 431 and the connection closed (%s)" % st)
    st, _ = http(port, b"GET /other HTTP/1.1\r\n\r\n")
    c.check(st == 404, "another path: 404 (%s)" % st)
    st, _ = http(port, b"POST /metrics HTTP/1.1\r\n\r\n")
    c.check(st == 405, "POST: 405 (%s)" % st)
    st, body = http(port, b"GET /metrics HTTP/1.1\r\n\r\n")
    c.check(st == 200 and b"dted_build_info" in body, "still serving after the refusals")
    c.check(ctl.run("ping")[0] == 0, "the control socket still answers")


def check_commands(c, ctl, tmp, cfg):
    """Every command the table lists, human and --json."""
    rc, kv, out, _ = ctl.human("status")
    c.check(rc == 0 and kv.get("jobs") == "1" and kv.get("node_name") == "ops",
            "status: jobs: 1, node_name: ops")
    rc, j, _ = ctl.js("status")
    c.check(rc == 0 and j and j["jobs"] == 1 and "uptime_s" in j, "status --json")
    for cmd in ("hello", "ping", "peers"):
        rc, kv, _, _ = ctl.human(cmd)
        rcj, j, _ = ctl.js(cmd)
        c.check(rc == 0 and rcj == 0 and j is not None, "%s: human and --json" % cmd)
    rc, kv, _, _ = ctl.human("jobs")
    c.check(rc == 0 and kv.get("jobs[0].name") == JOB, "jobs: jobs[0].name: %s" % JOB)
    rc, j, _ = ctl.js("jobs")
    c.check(rc == 0 and j["jobs"][0]["name"] == JOB and j["jobs"][0]["complete"], "jobs --json")
    rc, kv, _, _ = ctl.human("job", JOB)
    c.check(rc == 0 and kv.get("name") == JOB and "participants[2].role" in kv,
            "job: name and three participants")
    rc, j, _ = ctl.js("job", JOB)
    c.check(rc == 0 and sorted(p["role"] for p in j["participants"]) ==
            ["sink", "sink", "source"], "job --json: one source, two sinks")
    rc, _, out, _ = ctl.human("history", JOB)
    # One `version=V ... mode=M ...` line per version (dtectl(8)).
    rows = [dict(kv.split("=", 1) for kv in ln.split() if "=" in kv) for ln in out.splitlines()]
    c.check(rc == 0 and len(rows) >= 2 and rows[0].get("mode") == "dense" and
            rows[1].get("mode") == "sparse", "history: v1 dense, v2 sparse, one line each")
    rc, j, _ = ctl.js("history", JOB, "2")
    c.check(rc == 0 and len(j["versions"]) == 2 and "changed_pct" in j["versions"][0],
            "history --json with a limit")
    rc, kv, _, _ = ctl.human("wait", JOB, "1", "2000")
    rcj, j, _ = ctl.js("wait", JOB, "1", "2000")
    c.check(rc == 0 and rcj == 0 and j and j["version"] >= 1, "wait: human and --json")
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    plan = ["plan", "--model", path, "--source", "fsdp:dp=1", "--sink", "sglang:tp=2"]
    rc, kv, _, _ = ctl.human(*plan)
    rcj, j, _ = ctl.js(*plan)
    c.check(rc == 0 and kv.get("coverage") == "exact" and rcj == 0 and j is not None,
            "plan: coverage exact, human and --json")
    root = os.path.join(tmp, "storage")
    os.makedirs(root)
    rc, out, err = ctl.run("storage", "ls", root, JOB)
    rcj, j, _ = ctl.js("storage", "ls", root, JOB)
    c.check(rc == 0 and "versions=0" in out and rcj == 0 and j["versions"] == [],
            "storage ls: human and --json (%s)" % err.strip())
    rc, out, _ = ctl.run("help")
    listed = re.findall(r"^  ([a-z][a-z-]*) ", out.split("commands:")[-1], re.M)
    for cmd in ("status", "jobs", "job", "peers", "plan", "history", "verify", "resync",
                "storage", "metrics", "config", "log-level"):
        c.check(cmd in listed, "help lists %s" % cmd)
        rc, out, _ = ctl.run("help", cmd)
        c.check(rc == 0 and out.startswith("usage: dtectl"), "help %s prints its usage" % cmd)
    return listed


def check_verify(c, ctl, run):
    rc, kv, out, err = ctl.human("verify", JOB)
    c.check(rc == 0 and kv.get("sinks") == "2" and kv.get("ok") == "2" and
            kv.get("mismatch") == "0", "verify: both sinks ok (%s)" % out.replace("\n", "; "))
    rc, j, _ = ctl.js("verify", JOB)
    c.check(rc == 0 and [s["result"] for s in j["results"]] == ["ok", "ok"] and
            all(s["version"] == run.v and s["buffers"] > 0 for s in j["results"]),
            "verify --json: ok at version %d" % run.v)
    # Corrupt one element of rank 1's weights behind the daemon's back.
    name = sorted(run.eng.weights(1))[0]
    t = run.eng.weights(1)[name].view(torch.int16).view(-1)
    t[3] ^= 0x0101
    rc, kv, out, _ = ctl.human("verify", JOB)
    c.check(rc == 1 and kv.get("mismatch") == "1" and kv.get("ok") == "1",
            "verify after corruption: one mismatch, exit 1 (%s)" % out.replace("\n", "; "))
    rc, j, _ = ctl.js("verify", JOB)
    bad = [s for s in (j or {}).get("results", []) if s["result"] == "mismatch"]
    c.check(len(bad) == 1 and bad[0]["rank"] == 1 and name in bad[0]["detail"],
            "verify --json names the corrupt buffer of rank 1")
    run.version()   # exact() inside: the repair restored every element
    modes = history_modes(ctl)
    c.check(modes.get(run.v) in ("dense", "mixed"),
            "the version after a mismatch repairs densely (%s)" % modes.get(run.v))
    rc, kv, _, _ = ctl.human("verify", JOB)
    c.check(rc == 0 and kv.get("ok") == "2", "verify after the repair: ok")
    rc, _, err = ctl.run("verify", "no-such-job")
    c.check(rc == 1 and "unknown job" in err, "verify of an unknown job: clear error")


def check_resync(c, ctl, run):
    run.version()
    c.check(history_modes(ctl).get(run.v) == "sparse", "v%d sparse before resync" % run.v)
    rc, kv, out, _ = ctl.human("resync", JOB)
    c.check(rc == 0 and kv.get("pairs") == "2", "resync: 2 pairs forced dense (%s)" %
            out.replace("\n", "; "))
    run.version()
    c.check(history_modes(ctl).get(run.v) == "dense", "after resync v%d dense" % run.v)
    run.version()
    c.check(history_modes(ctl).get(run.v) == "sparse", "then sparse again (v%d)" % run.v)
    # The id as the human output prints it (0x hex, as the log), taken back by resync.
    rc, kv, _, _ = ctl.human("job", JOB)
    sink = [kv[k[:-4] + "id"] for k, v in kv.items() if k.endswith("].role") and v == "sink"][0]
    rc, j, err = ctl.js("resync", JOB, sink)
    c.check(rc == 0 and j and j["pairs"] == 1, "resync of one sink --json: 1 pair (%s)" % err)
    run.version()
    c.check(history_modes(ctl).get(run.v) == "mixed", "one sink resynced: v%d mixed" % run.v)
    rc, _, err = ctl.run("resync", JOB, "12345")
    c.check(rc == 1 and "no sink participant" in err, "resync of an unknown sink: clear error")
    rc, text, _ = ctl.run("metrics")
    c.check((sample(text, "dted_dense_fallbacks_total", 'reason="resync"') or 0) == 3,
            "dense fallbacks with reason resync: 3")
    # Verified twice while corrupt (human, --json): two mismatches.
    c.check(sample(text, "dted_verify_total", 'result="mismatch"') == 2 and
            sample(text, "dted_checksum_failures_total") >= 1,
            "verify mismatch and checksum failure counted")
    c.check(sample(text, "dted_resyncs_total") == 3, "resyncs counted per pair")


def check_log_config(c, ctl):
    rc, kv, _, _ = ctl.human("log-level")
    c.check(rc == 0 and kv.get("level") == "info", "log-level: info (from the file)")
    rc, kv, _, _ = ctl.human("log-level", "debug")
    c.check(rc == 0 and kv.get("level") == "debug" and kv.get("previous") == "info",
            "log-level debug: level debug, previous info")
    rc, j, _ = ctl.js("log-level")
    c.check(rc == 0 and j["level"] == "debug", "log-level --json")
    rc, kv, _, _ = ctl.human("status")
    c.check(kv.get("log_level") == "debug", "status shows the new level")
    rc, _, err = ctl.run("log-level", "loud")
    c.check(rc == 1 and "not one of" in err, "a bad level is refused clearly (%s)" % err.strip())
    rc, kv, out, _ = ctl.human("config")
    lines = [x for x in out.splitlines() if re.match(r"^[a-z]+\.[a-z_]+: .* \((default|file|flag|runtime)\)$", x)]
    c.check(rc == 0 and len(lines) == len(out.splitlines()) >= 15,
            "config: one `section.key: value (source)` line per key (%d)" % len(lines))
    want = {"daemon.log_level": "debug (runtime)", "daemon.node_name": "ops (file)",
            "daemon.max_clients": "1024 (default)", "peer.listen_port": "0 (flag)"}
    for k, v in want.items():
        c.check(kv.get(k) == v, "config %s: %s (%s)" % (k, v, kv.get(k)))
    c.check(kv.get("daemon.socket", "").endswith("(flag)") and
            re.match(r"127\.0\.0\.1:\d+ \(file\)$", kv.get("daemon.metrics_listen", "")),
            "config: socket from the flag, metrics_listen from the file")
    rc, j, _ = ctl.js("config")
    c.check(rc == 0 and j["daemon"]["socket"]["source"] == "flag" and
            j["peer"]["staging_size"] == {"value": "16777216", "source": "file"},
            "config --json: {section: {key: {value, source}}}")
    ctl.run("log-level", "info")
    rc, kv, _, _ = ctl.human("config")
    c.check(kv.get("daemon.log_level") == "info (file)", "back to the file's level: source file")


def check_completion(c, ctl, listed):
    script = os.path.join(ROOT, "packaging", "dtectl.bash-completion")

    def comp(*words):
        w = " ".join("'%s'" % x for x in words)
        r = subprocess.run(["bash", "-c", 'source "$1"; COMP_WORDS=(%s); '
                            'COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _dtectl; '
                            'printf "%%s\\n" "${COMPREPLY[@]}"' % w, "x", script],
                           capture_output=True, text=True, env=child_env())
        return [x for x in r.stdout.splitlines() if x]

    every = comp(DTECTL, "")
    missing = [x for x in listed if x not in every]
    c.check(listed and not missing, "completion offers every command of `dtectl help` %s" % missing)
    c.check(all(comp(DTECTL, x[:-1]).count(x) == 1 for x in listed),
            "each command completes from its prefix")
    c.check(comp(DTECTL, "--socket", ctl.sock, "verify", "ops") == [JOB],
            "verify completes the job name from the daemon")
    c.check(comp(DTECTL, "log-level", "d") == ["debug"], "log-level completes levels")


def main():
    c = Checks("ops")
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="dte-ops-")
    # metrics on port 0: dted binds a free one and `dtectl status` names it.
    # sync_mode = sparse: the checks name which versions go sparse;
    # staging_size from the file: `dtectl config` says where it came from
    d = harness.Daemon(tmp, "ops", metrics_listen="127.0.0.1:0", sync_mode="sparse",
                       staging_size="16M")
    sock = d.sock
    ctl = Ctl(sock)
    run = None
    cfg = qwen3.make_config(None, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                            vocab_size=512)
    try:
        d.start(30)
        c.check(ctl.run("ping")[0] == 0, "dted answers")
        maddr = (ctl.js("status")[1] or {}).get("metrics_address", "")
        port = int(maddr.rpartition(":")[2] or 0)
        c.check(maddr.startswith("127.0.0.1:") and port > 0,
                "status names the metrics listener as bound (%r)" % maddr)
        run = Run(c, sock, cfg)
        infos = [run.version() for _ in range(4)]
        c.check(infos[0]["dense"] and not any(i["dense"] for i in infos[1:]),
                "v1 dense, v2..v4 sparse")
        listed = check_commands(c, ctl, tmp, cfg)
        check_metrics(c, ctl, port, run)
        check_verify(c, ctl, run)
        check_resync(c, ctl, run)
        check_log_config(c, ctl)
        check_completion(c, ctl, listed)
    finally:
        if run:
            run.close()
        rc = d.stop()
        c.check(rc == 0, "dted exits cleanly (%s)" % rc)
        if c.passed != c.total:
            print(d.log_tail(30))
        shutil.rmtree(tmp, ignore_errors=True)
    c.finish(versions=run.v if run else 0)


if __name__ == "__main__":
    main()

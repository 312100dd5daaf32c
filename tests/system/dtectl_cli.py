#!/usr/bin/python3
"""dtectl as scripts meet it, against one real dted (issue 32, item 4).

Exit codes as dtectl(8) says (0 ok, 1 refused or failed, 2 usage, 3 daemon
unreachable, 4 timed out: a real `wait` deadline is 4, not 3); `wait`
refuses a version no sink applied because no sink is fed from the daemon,
and while a sink is behind says which one and by how much on stderr, stdout
clean; `history` one line per version (details under --json); `help CMD`
and `CMD --help` for every command of the command table, `help help`,
`--help` with the command list, usage (exit 2) for `wait`/`history`
without arguments; `jobs` with no jobs says so; errors as a JSON object
{error, code, message} under --json; `--json verify` keeps the daemon's
message; `plan --dump-entries` without --json, an mcore source without
--shards and a missing --model file are named; `storage ls` of a missing
root is an error; `job` and `jobs` list only the participants in the job
now (a source that left makes it incomplete; after the last one left,
none); compute_backend = auto on a node without CUDA logs one info line
naming the backend and no warning (= cuda there still warns).  Prints
`dtectl-cli: checks=N passed=N`.
"""

import json
import os
import re
import shutil
import subprocess
import tempfile
import time

import harness  # sets ROOT and B, puts client/python on sys.path
from harness import DTECTL, ROOT, child_env  # noqa: E402

if __name__ == "__main__":
    harness.asan_reexec()

import torch  # noqa: E402

from dte import qwen3, sglang  # noqa: E402
from dte.checks import Checks  # noqa: E402
from dte.sink import Sink  # noqa: E402
from dte.source import Source  # noqa: E402

TOKEN = "cli-token"


def cmdtab():
    """(name, flags) of every row of proto/cmdtab.h."""
    with open(os.path.join(ROOT, "proto", "cmdtab.h")) as f:
        text = f.read()
    return re.findall(r'X\(\w+,\s*"([a-z_-]+)",\s*\d+,\s*([^,]+),', text)


class Ctl:
    def __init__(self, sock):
        self.sock = sock

    def run(self, *args, sock=None, timeout=60):
        argv = [DTECTL, "--socket", sock or self.sock] + list(args)
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           env=child_env())
        return r.returncode, r.stdout, r.stderr

    def js(self, *args, **kw):
        rc, out, err = self.run("--json", *args, **kw)
        try:
            return rc, json.loads(out), err
        except ValueError:
            return rc, None, err


def json_error(c, ctl, what, args, code, error=None, words=(), **kw):
    rc, j, err = ctl.js(*args, **kw)
    ok = (rc == code and isinstance(j, dict) and j.get("code") == code and
          isinstance(j.get("message"), str) and j["message"] and
          (error is None or j.get("error") == error) and
          all(w in j.get("message", "") for w in words))
    c.check(ok, "--json %s: exit %d and {error%s, code %d, message} on stdout (rc=%s %s)" % (
        what, code, "=" + error if error else "", code, rc, j))


class Trainer:
    """A source (and optionally an SGLang TP=1 sink) of one job."""

    def __init__(self, sock, job, cfg, sink):
        self.cfg = cfg
        text = json.dumps(cfg)
        self.params = {n: torch.nn.Parameter(t.clone())
                       for n, t in qwen3.init_hf_weights(cfg, seed=3).items()}
        self.opt = torch.optim.AdamW(list(self.params.values()), lr=2e-5)
        self.src = Source.hf(self.params, self.opt, sock, job, TOKEN, text)
        self.eng = self.sink = None
        if sink:
            self.eng = sglang.SGLangModel(cfg, tp=1, label=job + "-sink")
            self.sink = Sink.sglang(self.eng, sock, job, TOKEN, text)
        self.gen = torch.Generator().manual_seed(7)

    def step(self, v):
        tokens = torch.randint(0, self.cfg["vocab_size"], (2, 8), generator=self.gen)
        self.opt.zero_grad(set_to_none=True)
        logits = qwen3.forward(self.params, self.cfg, tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                          tokens[:, 1:].reshape(-1)).backward()
        self.opt.step()
        self.src.publish(v)
        self.src.wait_captured()

    def close(self):
        for x in (self.sink, self.src, self.eng):
            if x is not None:
                try:
                    x.close()
                except Exception as e:  # closing must not hide the checks
                    print("close: %s" % e)


def check_help(c, ctl):
    rc, out, err = ctl.run("--help")
    listed = re.findall(r"^  ([a-z][a-z_-]*) ", out.split("commands:")[-1], re.M)
    rows = cmdtab()
    visible = [n for n, fl in rows if "HIDDEN" not in fl]
    c.check(rc == 0 and set(visible) <= set(listed) and "help" in listed,
            "--help lists every command of the table (%s)" % sorted(set(visible) - set(listed)))
    rc, out, _ = ctl.run("help", "help")
    c.check(rc == 0 and out.startswith("usage: dtectl help"), "help help")
    rc, out, _ = ctl.run("help", "--help")
    c.check(rc == 0 and out.startswith("usage: dtectl help"), "help --help")
    bad = []
    for name, _ in rows:
        rc1, out1, _ = ctl.run("help", name)
        rc2, out2, _ = ctl.run(name, "--help")
        rc3, out3, _ = ctl.run(name, "-h")
        own = name in ("plan", "storage")      # their own, longer usage
        if not (rc1 == 0 and out1.startswith("usage: dtectl") and name in out1.split("\n")[0]):
            bad.append("help " + name)
        want = "usage: dtectl " + name if own else "usage: dtectl"
        if not (rc2 == 0 and out2.startswith(want) and rc3 == 0 and out3 == out2):
            bad.append(name + " --help")
    c.check(not bad, "help CMD and CMD --help/-h for all %d commands of the table %s" % (
        len(rows), bad))
    rc, out, err = ctl.run("status", "--help")
    c.check(rc == 0 and out.startswith("usage: dtectl [--socket PATH] [--json] status"),
            "status --help prints status's usage, not an error")
    rc, out, _ = ctl.run("storage", "--help")
    c.check(rc == 0 and "dte-storage" not in out, "storage --help says dtectl storage")
    for name in ("wait", "history", "job", "verify"):
        rc, out, err = ctl.run(name)
        c.check(rc == 2 and "usage: dtectl %s" % name in err and not out,
                "%s without arguments: its usage on stderr, exit 2 (%d %r)" % (name, rc, err))
    rc, out, err = ctl.run("help", "no-such")
    c.check(rc == 2 and "unknown command" in err, "help of an unknown command: exit 2")


def check_backend_log(c, tmp, logged):
    """compute_backend = auto on a node without CUDA is no fault: one info
    line naming the backend chosen, no warning.  Asked for cuda by name on
    such a node, it stays a warning."""
    lines = logged.splitlines()
    chosen = [ln for ln in lines if re.search(r" info: compute backend: (cpu|cuda) \(", ln)]
    warned = [ln for ln in lines if re.search(r" (warn|error): .*(cuda unavailable|compute "
                                              r"backend)", ln, re.I)]
    c.check(len(chosen) == 1, "auto: one info line naming the compute backend (%s)" % chosen)
    c.check(not warned, "auto: no warning about CUDA (%s)" % warned)
    if not chosen or " compute backend: cpu (" not in chosen[0]:
        return
    # This node has no usable CUDA: compute_backend = cuda must say so.
    sub = os.path.join(tmp, "cuda")
    os.makedirs(sub)
    d = harness.Daemon(sub, "cli-cuda", compute_backend="cuda")
    try:
        d.start()
    finally:
        d.stop()
    text = d.log_text()
    c.check(re.search(r" warn: compute backend: ", text) and
            " info: compute backend:" not in text,
            "compute_backend = cuda without CUDA: a warning, as before (%s)" %
            [ln for ln in text.splitlines() if "compute backend" in ln])


def job_view(ctl, job):
    """(rc, text kv, text, json) of `dtectl job JOB`."""
    rc, out, _ = ctl.run("job", job)
    kv = dict(ln.split(": ", 1) for ln in out.splitlines() if ": " in ln)
    _, j, _ = ctl.js("job", job)
    return rc, kv, out, j or {}


def check_departures(c, ctl, cfg):
    """`job` lists the participants in the job now: a source that left is
    gone from it (and the job is no longer complete); once the last one
    left, none is listed, in text, --json and `jobs`."""
    t = Trainer(ctl.sock, "gone", cfg, sink=True)
    try:
        t.step(1)
        rc, kv, out, j = job_view(ctl, "gone")
        c.check(rc == 0 and kv.get("complete") == "true" and
                sorted(p["role"] for p in j.get("participants", [])) == ["sink", "source"],
                "departures: source and sink in the job, complete (%s)" % j.get("participants"))
        t.src.close()
        t.src = None
        end = time.time() + 10
        while True:
            rc, kv, out, j = job_view(ctl, "gone")
            roles = [p["role"] for p in j.get("participants", [])]
            if roles == ["sink"] or time.time() > end:
                break
            time.sleep(0.1)
        c.check(roles == ["sink"] and j.get("complete") is False,
                "the source left: --json lists the sink only, complete false (%s %s)" %
                (roles, j.get("complete")))
        c.check(kv.get("complete") == "false" and
                [v for k, v in kv.items() if k.endswith("].role")] == ["sink"],
                "the source left: the text lists the sink only, complete: false (%r)" % out)
        t.sink.close()
        t.sink = None
        end = time.time() + 10
        while True:
            rc, kv, out, j = job_view(ctl, "gone")
            if not j.get("participants") or time.time() > end:
                break
            time.sleep(0.1)
        c.check(rc == 0 and j.get("participants", []) == [] and j.get("complete") is False and
                j.get("members") in (None, []),
                "all left: --json lists no participant and no member, complete false (%s)" % j)
        c.check(kv.get("complete") == "false" and "participants[" not in out,
                "all left: the text lists no participant, complete: false (%r)" % out)
        rc, js, _ = ctl.js("jobs")
        g = [x for x in (js or {}).get("jobs", []) if x.get("name") == "gone"]
        c.check(len(g) == 1 and not g[0].get("participants") and not g[0].get("complete"),
                "all left: jobs says participants 0, complete false (%s)" % g)
    finally:
        t.close()


def main():
    c = Checks("dtectl-cli")
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="dte-cli-")
    d = harness.Daemon(tmp, "cli", compute_backend="auto")
    sock = d.sock
    ctl = Ctl(sock)
    cfg = qwen3.make_config(None, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                            vocab_size=256)
    solo = pair = None
    try:
        d.start()
        check_backend_log(c, tmp, d.log_text())
        check_help(c, ctl)

        # Exit codes without jobs.
        rc, out, _ = ctl.run("jobs")
        c.check(rc == 0 and out.strip() == "no jobs on this daemon", "jobs with none says so")
        rc, j, _ = ctl.js("jobs")
        c.check(rc == 0 and j == {"jobs": []}, "--json jobs with none: an empty list")
        rc, _, err = ctl.run("status", sock=os.path.join(tmp, "nobody.sock"))
        c.check(rc == 3, "no daemon at the socket: exit 3 (%d %s)" % (rc, err.strip()))
        json_error(c, ctl, "status with no daemon", ["status"], 3, "unreachable",
                   sock=os.path.join(tmp, "nobody.sock"))
        rc, _, err = ctl.run("job", "no-such-job")
        c.check(rc == 1 and "unknown job" in err, "unknown job: exit 1 (%s)" % err.strip())
        json_error(c, ctl, "job of an unknown job", ["job", "no-such-job"], 1, "not_found",
                   ["no-such-job"])
        json_error(c, ctl, "wait without arguments", ["wait"], 2, "usage", ["usage"])
        json_error(c, ctl, "an unknown command", ["frobnicate"], 2, "usage", ["frobnicate"])
        rc, _, err = ctl.run("--frob")
        c.check(rc == 2, "an unknown option: exit 2")

        # A job with a source and no sink: three versions.
        solo = Trainer(sock, "solo", cfg, sink=False)
        for v in (1, 2, 3):
            solo.step(v)
        rc, out, err = ctl.run("wait", "solo", "99")
        c.check(rc == 1 and not out and "no sink" in err,
                "wait with no sink: exit 1 and says so (%d %r)" % (rc, err.strip()))
        rc, out, err = ctl.run("wait", "solo", "2", "1000")
        c.check(rc == 1 and "no sink" in err, "wait of a published version, no sink: exit 1")
        json_error(c, ctl, "wait with no sink", ["wait", "solo", "3"], 1, "no_sinks", ["no sink"])
        rc, out, err = ctl.run("history", "solo")
        lines = out.splitlines()
        c.check(rc == 0 and len(lines) == 3 and
                [ln.split()[0] for ln in lines] == ["version=1", "version=2", "version=3"] and
                all("mode=" in ln and "bytes=" in ln for ln in lines),
                "history: one line per version (%d lines)" % len(lines))
        rc, j, _ = ctl.js("history", "solo")
        c.check(rc == 0 and j and len(j["versions"]) == 3 and
                all("reason" in v and "changed_pct" in v for v in j["versions"]),
                "history --json: every field of the 3 versions")
        rc, out, _ = ctl.run("history", "solo", "2")
        c.check(rc == 0 and len(out.splitlines()) == 2, "history with a limit: 2 lines")
        rc, j, _ = ctl.js("verify", "solo")
        c.check(rc == 0 and j and "no sink on this daemon" in j.get("message", ""),
                "--json verify keeps the daemon's message (%s)" % (j or {}).get("message"))

        # A job with a sink that applies version 1 only.
        pair = Trainer(sock, "pair", cfg, sink=True)
        pair.step(1)
        pair.sink.apply(1)
        rc, out, err = ctl.run("wait", "pair", "1", "10000")
        c.check(rc == 0 and out == "version: 1\nsinks: 1\n", "wait for an applied version: "
                "exit 0, version and sinks on stdout (%d %r %r)" % (rc, out, err))
        pair.step(2)
        pair.sink.wait_staged()
        t0 = time.time()
        # 4 s: a progress line comes after each 1 s round with the daemon,
        # so the first must be back before the timeout even on a loaded
        # machine (one run beside two CPU hogs at a higher priority than
        # the daemon's had its first round back after 2.5 s).
        rc, out, err = ctl.run("wait", "pair", "2", "4000")
        took = time.time() - t0
        progress = [ln for ln in err.splitlines() if ln.startswith("dtectl wait:")]
        c.check(rc == 4 and not out, "a real wait timeout: exit 4, not 3 (%d %r)" % (rc, out))
        c.check(3.8 < took < 17, "the wait lasted its timeout (%.1f s)" % took)
        c.check(len(progress) >= 1 and all("1 behind" in ln and "rank 0 replica 0" in ln
                                           for ln in progress),
                "progress on stderr names the sink behind and by how much (%s)" % progress)
        c.check("not applied by every sink within 4000 ms" in err and "1 behind" in err,
                "the timeout's message names the sink behind (%s)" % err.strip().splitlines()[-1:])
        rc, out, err = ctl.run("wait", "pair", "2", "1500", "--quiet")
        c.check(rc == 4 and not [ln for ln in err.splitlines() if ln.startswith("dtectl wait:")],
                "wait --quiet: no progress lines")
        json_error(c, ctl, "wait timeout", ["wait", "pair", "2", "1200"], 4, "timeout",
                   ["1 behind"])
        rc, out, err = ctl.run("wait", "pair", "2")
        c.check(rc == 4, "wait without TIMEOUT_MS polls once: exit 4 while behind")
        # Ids and epochs: hex in text (the log's digits, 0x), numbers in JSON.
        rc, out, _ = ctl.run("job", "pair")
        kv = dict(ln.split(": ", 1) for ln in out.splitlines() if ": " in ln)
        rcj, j, _ = ctl.js("job", "pair")
        sink_id = [kv[k[:-4] + "id"] for k, v in kv.items() if k.endswith("].role") and v == "sink"]
        hexes = [kv.get("epoch", "")] + [v for k, v in kv.items() if k.endswith("].id")]
        c.check(rc == 0 and rcj == 0 and all(re.match(r"^0x[0-9a-f]+$", h) for h in hexes) and
                int(kv["epoch"], 16) == j["epoch"] and
                sorted(int(v, 16) for k, v in kv.items() if k.endswith("].id")) ==
                sorted(p["id"] for p in j["participants"]),
                "job: epoch and participant ids in 0x hex, the same numbers as --json (%s)" % hexes)
        c.check(sink_id and all(sink_id[0] in ln for ln in progress),
                "wait's progress names the sink by the id `job` prints (%s)" % sink_id)
        logged = d.log_text()
        c.check(sink_id and re.search(r"\bsink %s:" % sink_id[0][2:], logged),
                "the log prints the same hex digits for the sink")
        rc, out, _ = ctl.run("jobs")
        c.check(rc == 0 and all(re.match(r"^0x[0-9a-f]+$", ln.split(": ")[1])
                                for ln in out.splitlines() if ln.split(": ")[0].endswith(".epoch")),
                "jobs: epochs in 0x hex")
        rc, out, err = ctl.run("resync", "pair", sink_id[0])
        c.check(rc == 0 and "pairs: 1" in out, "resync takes the sink id as printed (%s)" %
                (out + err).strip())
        pair.sink.apply(2)
        rc, out, err = ctl.run("wait", "pair", "2", "10000")
        c.check(rc == 0 and out == "version: 2\nsinks: 1\n", "after the apply: exit 0")
        check_departures(c, ctl, cfg)

        # Local commands: plan and storage.
        model = os.path.join(tmp, "config.json")
        with open(model, "w") as f:
            json.dump(cfg, f)
        plan = ["plan", "--model", model, "--source", "fsdp:dp=1", "--sink", "sglang:tp=1"]
        rc, out, err = ctl.run(*plan, "--dump-entries")
        c.check(rc == 2 and "--dump-entries needs --json" in err,
                "plan --dump-entries without --json says it needs --json")
        rc, j, _ = ctl.js(*plan, "--dump-entries")
        c.check(rc == 0 and j and "entries" in json.dumps(j), "plan --json --dump-entries works")
        rc, out, err = ctl.run("plan", "--model", model, "--source", "mcore:tp=1,dp=1",
                               "--sink", "sglang:tp=1")
        c.check(rc == 2 and "--shards" in err.splitlines()[0],
                "plan of an mcore source without --shards names the option (%s)" %
                err.splitlines()[:1])
        rc, out, err = ctl.run("plan", "--model", "/nonexist.json", "--source", "fsdp:dp=1",
                               "--sink", "sglang:tp=1")
        c.check(rc == 1 and "/nonexist.json" in err and "No such file" in err and
                "malformed" not in err, "--model of a missing file: the path and the OS error "
                "(%s)" % err.strip())
        json_error(c, ctl, "plan of a missing model", plan[:1] + ["--model", "/nonexist.json"] +
                   plan[3:], 1, None, ["/nonexist.json"])
        missing = os.path.join(tmp, "no-such-root")
        rc, out, err = ctl.run("storage", "ls", missing, "solo")
        c.check(rc == 1 and missing in err and "No such file" in err,
                "storage ls of a missing root: an error naming it (%d %s)" % (rc, err.strip()))
        json_error(c, ctl, "storage ls of a missing root", ["storage", "ls", missing, "solo"], 1,
                   None, [missing])
        os.makedirs(os.path.join(tmp, "root"))
        rc, out, err = ctl.run("storage", "ls", os.path.join(tmp, "root"), "solo")
        c.check(rc == 0 and "versions=0" in out, "storage ls of a root without the job: 0")
    finally:
        for t in (pair, solo):
            if t:
                t.close()
        rc = d.stop()
        c.check(rc == 0, "dted exits cleanly (%s)" % rc)
        if c.passed != c.total:
            print(d.log_tail(20))
        shutil.rmtree(tmp, ignore_errors=True)
    c.finish()


if __name__ == "__main__":
    main()

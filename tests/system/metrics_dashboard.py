#!/usr/bin/python3
"""The Grafana dashboard against what dted really exports (issue 32 item 5).

Two real daemons over UCX: "coord" (the job's coordinator, a Megatron TP=2
trainer's sources, its HTTP metrics listener on) and "sinkd" (an SGLang
TP=2 replica's sinks).  Versions 1..3 go to both sink ranks; 4 and 5 are
published while rank 1 is held at 3 (rank 0 applies them).  Checked:
- every metric name a panel of conf/grafana/dted-dashboard.json queries
  (read out of its PromQL) is in coord's scrape of GET /metrics;
- dted_sink_versions_behind{job_name,sink,sink_node}: 2 for the held rank,
  0 for the other; 0 for both once the held one applied 5;
  dted_job_published_version is 5;
- a sink that leaves (its client closes) has no lag series any more;
- `dtectl metrics` prints uptime as `dted_uptime_seconds 7.617` (at most
  milliseconds), no value with more digits than it needs, and passes
  `promtool check metrics` where promtool is installed.
Final line: `dashboard: panels=N metrics=M missing=0 lag=ok`.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import harness  # sets ROOT and B, puts client/python on sys.path

B = harness.B

import cluster_sync_lib as csl  # noqa: E402

csl.asan_reexec([sys.executable] + sys.argv)

import torch  # noqa: E402

import sync_local as sl  # noqa: E402
from cluster_sync import JOB, TOKEN, SinkRank  # noqa: E402
from dte import _lib, megatron, sglang, toy  # noqa: E402
from dte.checks import Checks  # noqa: E402

TP = sl.TP
DASHBOARD = os.path.join(harness.ROOT, "conf", "grafana", "dted-dashboard.json")

# PromQL words that are not metric names: aggregations and functions (those
# are followed by "(" anyway), keywords, and grouping modifiers.
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                "offset", "and", "or", "unless", "inf", "nan", "atan2", "start", "end"}


def metric_names(expr):
    """The metric names a PromQL expression selects."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # strings
    e = re.sub(r"\{[^}]*\}", " ", e)                   # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)                  # ranges, subqueries
    # label lists of by/without/on/ignoring/group_left/group_right
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        rest = e[m.end():].lstrip()
        if rest.startswith("("):
            continue                                    # a function or an aggregation
        if word.lower() in PROMQL_WORDS or word.startswith("$"):
            continue
        if m.start() > 0 and e[m.start() - 1] in "$.0123456789":
            continue                                    # $__var, 1e3, 0.99
        names.add(word)
    return names


def sig_digits(num):
    """Significant digits of a number as printed ("7.617": 4; Python's
    repr() of a float is the shortest string that reads back as it)."""
    mant = re.split(r"[eE]", num)[0]
    if mant.endswith(".0"):
        mant = mant[:-2]
    return len(re.sub(r"^0+", "", re.sub(r"[^0-9]", "", mant)))


def dashboard_exprs(path):
    with open(path) as f:
        d = json.load(f)
    panels, exprs = [], []

    def walk(ps):
        for p in ps:
            if p.get("type") == "row":
                walk(p.get("panels", []))
                continue
            panels.append(p)
            for t in p.get("targets", []):
                if t.get("expr"):
                    exprs.append((p.get("title", "?"), t["expr"]))
    walk(d.get("panels", []))
    for v in d.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.match(r"\s*label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)", q or "")
        if m:
            exprs.append(("variable " + v.get("name", "?"), m.group(1)))
    return panels, exprs


def scrape(port):
    """GET /metrics of coord: the body as text."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            data += d
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200 "):
        raise RuntimeError("GET /metrics: %r" % head[:80])
    return body.decode()


def samples(text):
    """[(name, {label: value}, value string)] of an exposition."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})? (\S+)$", line)
        if not m:
            raise RuntimeError("not a sample line: %r" % line)
        labels = dict(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        out.append((m.group(1), labels, m.group(4)))
    return out


def lag_of(text):
    """{sink id: versions behind} of dted_sink_versions_behind{job_name=JOB}."""
    return {lb["sink"]: float(v) for n, lb, v in samples(text)
            if n == "dted_sink_versions_behind" and lb.get("job_name") == JOB}


def lag_until(port, cond, timeout=20.0):
    """lag_of() of coord's scrape once cond(it) holds (or the last one
    read when timeout passed first)."""
    end = time.time() + timeout
    lag = lag_of(scrape(port))
    while not cond(lag) and time.time() < end:
        time.sleep(0.1)
        lag = lag_of(scrape(port))
    return lag


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    c = Checks("metrics-dashboard")
    panels, exprs = dashboard_exprs(DASHBOARD)
    want = set()
    for title, e in exprs:
        names = metric_names(e)
        c.check(names, "panel %r queries a metric (%s)" % (title, e))
        want |= names
    c.check(len(panels) >= 10, "the dashboard has panels (%d)" % len(panels))
    print("dashboard: %d panels query %d metrics: %s" % (len(panels), len(want),
                                                        " ".join(sorted(want))), flush=True)

    work = csl.Workdir("dte-dash-")
    # Port 0: the daemon binds a free port and `dtectl status` says which
    # (a port picked here and released could be taken before dted binds
    # it, by this very daemon's UCX listener, which then never answers).
    coord = csl.Daemon(work.path, "coord", part_size="64K", sync_mode="sparse",
                       metrics_listen="127.0.0.1:0")
    sinkd = csl.Daemon(work.path, "sinkd", part_size="64K", sync_mode="sparse")
    daemons = [coord, sinkd]
    missing = sorted(want)
    lag_ok = False
    ok = False
    try:
        coord.start()
        st = coord.ctl_json("status") or {}
        maddr = st.get("metrics_address", "")
        c.check(re.fullmatch(r"127\.0\.0\.1:[1-9]\d*", maddr) and not st.get("metrics_error"),
                "status names the metrics listener as bound (%r, error %r)" %
                (maddr, st.get("metrics_error")))
        port = int(maddr.rpartition(":")[2])
        txt = coord.ctl("status").stdout
        c.check("metrics: http://%s/metrics\n" % maddr in txt,
                "dtectl status prints the metrics URL: %s" %
                [ln for ln in txt.splitlines() if ln.startswith("metrics")])
        # A second daemon asked for the same port: it serves on without
        # metrics and says why, in status as in its log.
        sinkd.configure(metrics_listen=maddr)
        sinkd.start()
        sst = sinkd.ctl_json("status") or {}
        c.check(not sst.get("metrics_address") and
                "address already in use" in sst.get("metrics_error", "").lower(),
                "a taken metrics port is reported by status (%r)" % sst.get("metrics_error"))
        txt = sinkd.ctl("status").stdout
        c.check(re.search(r"^metrics: not served: cannot listen on %s: " % re.escape(maddr),
                          txt, re.M), "dtectl status says metrics are not served: %s" %
                [ln for ln in txt.splitlines() if ln.startswith("metrics")])
        megatron.shard_shapes = getattr(sl, "flat_order_shapes", None) or \
            megatron.flat_buffer_shapes
        model = megatron.MegatronModel(sl.CFG, tp=TP, seed=0, label="dash-src")
        trainer = megatron.Trainer(model, lr=sl.LR, warmup=sl.WARMUP)
        task = toy.ToyTask(sl.CFG["vocab_size"])
        tcli = _lib.Client(coord.sock)
        tcli.job_create(JOB, sl.CFG_TEXT, TOKEN, "local", 1)
        src_parts = sl.attach_sources(tcli, model)
        rep = sglang.SGLangModel(sl.CFG, tp=TP, label="dash-rep")
        sinks = [SinkRank(rep, 0, r, sinkd) for r in range(TP)]
        for s in sinks:
            s.attach(coord.address, 1)
        sid = ["0x%x" % s.part for s in sinks]

        def publish(v):
            rec = trainer.step(*task.batch_at(v))
            for p in src_parts:
                tcli.publish(JOB, p, v, rec["step"], sl.groups_of(rec))

        for v in (1, 2, 3):
            publish(v)
            for s in sinks:
                c.check(s.apply(v)["checksum_ok"], "v%d applied on %s" % (v, s.label()))
            tcli.wait(JOB, v, 30000)
        # Rank 1 is held at 3 while 4 and 5 go by; rank 0 keeps up.
        for v in (4, 5):
            publish(v)
            sinks[0].apply(v)
        held = lag_until(port, lambda m: m.get(sid[1]) == 2 and m.get(sid[0]) == 0)
        text = scrape(port)
        names = {n for n, _lb, _v in samples(text)}
        missing = sorted(want - names)
        c.check(not missing, "every metric the dashboard queries is exported (missing: %s)" %
                " ".join(missing))
        c.check(held.get(sid[1]) == 2, "held sink %s is 2 versions behind (%s)" % (sid[1], held))
        c.check(held.get(sid[0]) == 0, "sink %s that kept up is 0 behind (%s)" % (sid[0], held))
        pub = [float(v) for n, lb, v in samples(text)
               if n == "dted_job_published_version" and lb.get("job_name") == JOB]
        c.check(pub == [5.0], "dted_job_published_version{job_name=%s} is 5 (%s)" % (JOB, pub))
        lab = [lb for n, lb, _v in samples(text) if n == "dted_sink_versions_behind"]
        c.check(all(lb.get("sink_node") == "sinkd" for lb in lab) and len(lab) == TP,
                "one lag series per sink, sink_node=sinkd (%s)" % lab)

        sinks[1].apply(5)
        tcli.wait(JOB, 5, 30000)
        caught = lag_until(port, lambda m: m.get(sid[1]) == 0)
        c.check(caught.get(sid[0]) == 0 and caught.get(sid[1]) == 0,
                "both sinks 0 behind once the held one applied 5 (%s)" % caught)
        lag_ok = held.get(sid[1]) == 2 and held.get(sid[0]) == 0 and \
            caught.get(sid[0]) == 0 and caught.get(sid[1]) == 0

        # dtectl metrics: numbers as a person reads them.
        r = coord.ctl("metrics")
        up = [ln for ln in r.stdout.splitlines() if ln.startswith("dted_uptime_seconds ")]
        c.check(len(up) == 1 and re.fullmatch(r"dted_uptime_seconds \d+(\.\d{1,3})?", up[0]),
                "uptime prints cleanly: %s" % up)
        long_vals = [ln for ln in r.stdout.splitlines() if not ln.startswith("#") and
                     sig_digits(ln.rpartition(" ")[2]) >
                     sig_digits(repr(float(ln.rpartition(" ")[2])))]
        c.check(not long_vals, "no value printed with more digits than it needs: %s" %
                long_vals[:3])
        js = coord.ctl_json("metrics") or {}
        upj = [s["value"] for s in js.get("samples", []) if s["name"] == "dted_uptime_seconds"]
        c.check(len(upj) == 1 and isinstance(upj[0], (int, float)), "--json uptime %s" % upj)
        if shutil.which("promtool"):
            for what, t in (("dtectl metrics", r.stdout), ("GET /metrics", scrape(port))):
                p = subprocess.run(["promtool", "check", "metrics"], input=t, capture_output=True,
                                   text=True)
                c.check(p.returncode == 0, "promtool check metrics passes on %s (%s)" %
                        (what, (p.stdout + p.stderr).strip()))

        # A sink that leaves: its series goes.
        sinks[1].drop()
        gone = lag_until(port, lambda m: sid[1] not in m)
        c.check(sid[1] not in gone, "the lag series of sink %s that left is gone (%s)" %
                (sid[1], gone))
        lag_ok = lag_ok and sid[1] not in gone
        sinks[0].drop()
        tcli.close()
        trainer.close()
        ok = True
    finally:
        rcs = [d.stop() for d in daemons]
        if ok:
            c.check(all(r_ == 0 for r_ in rcs), "daemons exit cleanly (%s)" % rcs)
        if c.passed != c.total or not ok:
            for d in daemons:
                print("--- %s log (tail) ---\n%s" % (d.name, d.log_tail(25)))
        work.close(keep=c.passed != c.total)
    print("metrics-dashboard: checks=%d passed=%d (%.1fs)" % (c.total, c.passed,
                                                              time.time() - c.start))
    print("dashboard: panels=%d metrics=%d missing=%d lag=%s" % (
        len(panels), len(want), len(missing), "ok" if lag_ok else "FAIL"), flush=True)
    sys.exit(0 if ok and c.total and c.passed == c.total and not missing and lag_ok else 1)


if __name__ == "__main__":
    main()

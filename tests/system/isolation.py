#!/usr/bin/python3
"""Isolation and access (issue 9): who may talk to dted, and about what.

Two real daemons ("a" is the job's coordinator, "b" a peer).  Checked:
- the control socket is 0660 in a 0750 runtime directory the daemon made;
- a client under another uid (setpriv, uid 65534) is refused by the
  SO_PEERCRED check even with the file permissions opened, and that is
  logged and counted (status `refused`, and `dted_refused_total` in
  `dtectl metrics` where that command exists);
- a second client cannot use the first one's buffers or participants:
  attach with its buffer ids, unregister, detach, publish, mark, apply,
  wait_staged, query_version are all refused, and it cannot join the job
  with another job's token, nor re-create the job with another token;
- a peer daemon's records without the job token (dte-peer-forge: wrong
  token, no token, unknown job) are refused with the reason sent back,
  logged, and counted in the job's `refused` counter and in metrics;
- after all of it the first client's job still works.
Final line: `isolation: checks=N passed=N ...`.
"""

import json
import os
import subprocess
import sys
import time

import harness  # sets ROOT and B, puts client/python on sys.path

B = harness.B

import cluster_sync_lib as csl  # noqa: E402

csl.asan_reexec([sys.executable] + sys.argv)

import sync_local as sl  # noqa: E402
from dte import _lib, megatron  # noqa: E402
from dte.checks import Checks  # noqa: E402

JOB, TOKEN = sl.JOB, sl.TOKEN


def metrics(d):
    """dtectl metrics (Prometheus text) as {name{labels}: value}; None
    (with dtectl's reason printed) when the command fails: this tree's
    dtectl has the command, so that is a failure, not a skip."""
    r = d.ctl("metrics", check=False)
    if r.returncode != 0:
        print("dtectl metrics failed (rc %d): %s" % (r.returncode, r.stderr.strip()), flush=True)
        return None
    return harness.parse_metrics(r.stdout)


def refused_total(m):
    return sum(v for k, v in m.items() if k.startswith("dted_refused_total"))


def main():
    c = Checks("isolation")
    work = csl.Workdir("dte-iso-")
    a = csl.Daemon(work.path, "a")
    a.sock = os.path.join(work.path, "run-a", "dted.sock")
    b = csl.Daemon(work.path, "b")
    E = _lib.DteError
    clis = []
    try:
        a.start()
        b.start()
        st = os.stat(a.sock)
        c.check(st.st_mode & 0o777 == 0o660, "socket mode 0660 (%o)" % (st.st_mode & 0o777))
        dmode = os.stat(os.path.dirname(a.sock)).st_mode & 0o777
        c.check(dmode == 0o750, "runtime dir mode 0750 (%o)" % dmode)
        m0 = metrics(a)

        # Another uid, with the file permissions opened: only SO_PEERCRED.
        before = (a.ctl_json("status") or {}).get("refused", 0)
        os.chmod(work.path, 0o755)
        os.chmod(os.path.dirname(a.sock), 0o755)
        os.chmod(a.sock, 0o666)
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            csl.DTECTL, "--socket", a.sock, "status"], capture_output=True,
                           text=True, env=csl.child_env())
        c.check(r.returncode != 0 and "not allowed" in r.stderr,
                "uid 65534 refused: rc=%d %s" % (r.returncode, r.stderr.strip()))
        after = (a.ctl_json("status") or {}).get("refused", 0)
        c.check(after == before + 1, "credential refusal counted in status (%s -> %s)" %
                (before, after))
        c.check("65534" in a.log_text(), "credential refusal logged with the uid")
        os.chmod(a.sock, 0o660)

        # The owner: a trainer with two source ranks on daemon a.
        megatron.shard_shapes = getattr(sl, "flat_order_shapes", None) or \
            megatron.flat_buffer_shapes
        model = megatron.MegatronModel(sl.CFG, tp=sl.TP, seed=0, label="iso-src")
        owner = _lib.Client(a.sock)
        clis.append(owner)
        owner.job_create(JOB, sl.CFG_TEXT, TOKEN, "local", 1)
        ids, parts = [], []
        for r_ in range(sl.TP):
            want = _lib.layout_buffers(sl.CFG_TEXT, sl.SRC_LAYOUT, _lib.SOURCE, r_)
            rid = [owner.register_fd(model.arenas[r_][k].fd, 0, n, _lib.FP32, k)
                   for (_b, n, _n), k in zip(want, ("param", "exp_avg", "exp_avg_sq"))]
            ids.append(rid)
            parts.append(owner.attach(JOB, TOKEN, _lib.SOURCE, sl.SRC_LAYOUT, r_, rid))

        # Another client of the same daemon (same uid: allowed to connect).
        other = _lib.Client(a.sock)
        clis.append(other)
        grp = [{"lr": 1e-5, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0}]
        for what, fn in (
                ("attach naming another client's buffers",
                 lambda: other.attach(JOB, TOKEN, _lib.SOURCE, sl.SRC_LAYOUT, 0, ids[0])),
                ("unregister another client's buffer", lambda: other.unregister(ids[0][0])),
                ("detach another client's participant", lambda: other.detach(JOB, parts[0])),
                ("publish on another client's participant",
                 lambda: other.publish(JOB, parts[0], 1, 1, grp)),
                ("mark on another client's participant",
                 lambda: other.mark(JOB, parts[0], 1, grp)),
                ("apply on another client's participant", lambda: other.apply(JOB, parts[0], 1)),
                ("wait_staged on another client's participant",
                 lambda: other.wait_staged(JOB, parts[0], 10)),
                ("query_version of another client's participant",
                 lambda: other.query_version(JOB, parts[0])),
                ("re-creating the job with another token",
                 lambda: other.job_create(JOB, sl.CFG_TEXT, "other-token", "local", 1)),
                ("attach to the job with another job's token",
                 lambda: (other.job_create("job2", sl.CFG_TEXT, "tok2", "local", 1),
                          other.attach(JOB, "tok2", _lib.SINK, sl.SINK_LAYOUT, 0, []))),
                ("publish into a job the client is not in",
                 lambda: other.publish("job2", parts[0], 1, 1, grp))):
            c.raises(E, fn, what + " refused")
        j = a.ctl_json("job", JOB) or {}
        srcs = [x for x in j.get("participants", []) if x.get("role") == "source"]
        c.check(len(srcs) == 2 and j.get("complete"),
                "the owner's participants are untouched (%d sources)" % len(srcs))

        # A peer without the job token.
        jr0 = j.get("refused", 0)
        rec = ("counts job=%s token=%%s epoch=%d version=5 base=4 mode=sparse src=1 dst=2 "
               "counts=0 payload_bytes=0" % (JOB, j.get("epoch", 1)))
        rc, out = csl.forge(a.address, [rec % "bad", rec % "",
                                        rec.replace("job=" + JOB, "job=nojob") % TOKEN],
                            expect=3)
        refused = [x for x in out if x.startswith("recv REFUSED")]
        c.check(len(refused) == 3, "forged peer records refused, reasons sent back: %s" % refused)
        c.check(sum("wrong token" in x for x in refused) == 2 and
                any("unknown job" in x for x in refused), "reasons name the token and the job")
        end = time.time() + 3
        while time.time() < end and a.log_text().count("wrong token") < 2:
            time.sleep(0.05)
        c.check(a.log_text().count("wrong token") >= 2, "token refusals logged")
        jr1 = (a.ctl_json("job", JOB) or {}).get("refused", 0)
        c.check(jr1 == jr0 + 2, "job's refused counter counts the token refusals (%s -> %s)" %
                (jr0, jr1))
        # A real peer with the wrong token: daemon b joining with a sink.
        sink_model = __import__("dte.sglang", fromlist=["sglang"]).SGLangModel(
            sl.CFG, tp=sl.TP, label="iso-sink")
        bc = _lib.Client(b.sock)
        clis.append(bc)
        bc.job_create(JOB, sl.CFG_TEXT, "not-the-token", a.address, 1)
        try:
            sl.TOKEN = "not-the-token"
            part = sl.attach_sink(bc, sink_model.arenas[0], 0, 0)
            ok_join = True
        except E as e:
            ok_join = False
            c.check("token" in e.msg, "daemon b's sink with the wrong token refused: %s" % e.msg)
        finally:
            sl.TOKEN = TOKEN
        if ok_join:
            end = time.time() + 5
            while time.time() < end and a.log_text().count("wrong token") < 3:
                time.sleep(0.05)
            j2 = a.ctl_json("job", JOB) or {}
            c.check(not any(x.get("role") == "sink" for x in j2.get("participants", [])),
                    "a JOIN with the wrong token never reaches the plan (part %s)" % part)
            c.check(a.log_text().count("wrong token") >= 3, "the JOIN's refusal logged on a")
        m1 = metrics(a)
        c.check(m0 is not None and m1 is not None and any(
            k.startswith("dted_refused_total") for k in m1),
            "dtectl metrics answers with dted_refused_total (before: %s, after: %s)" %
            (m0 is not None, m1 is not None))
        if m0 is not None and m1 is not None:
            c.check(refused_total(m1) >= refused_total(m0) + 4,
                    "dted_refused_total grew by the refusals (%s -> %s)" %
                    (refused_total(m0), refused_total(m1)))
        st = a.ctl_json("status")
        c.check(st is not None and a.proc.poll() is None, "daemon a still serving")
        for x in clis:
            x.close()
        clis = []
        model.close()
    finally:
        for x in clis:
            try:
                x.close()
            except Exception:
                pass
        rcs = [a.stop(), b.stop()]
        c.check(rcs == [0, 0], "daemons exit cleanly (%s)" % rcs)
        if c.passed != c.total:
            print("--- a log ---\n" + a.log_tail(25))
        work.close(keep=c.passed != c.total)
    c.finish()
    sys.exit(0 if c.total and c.passed == c.total else 1)


if __name__ == "__main__":
    main()

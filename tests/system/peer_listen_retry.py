#!/usr/bin/python3
"""A dted whose peer port is held by another process at start: it still
serves clients, reports the missing listener (dtectl peers: address "",
listen_error, listen_retries growing; metrics: dted_peer_listener 0; the
log: one line that names the port, says another process holds it and
gives the fix (--peer-listen HOST:0, listen_port in [peer], or stop the
other daemon), then one debug line per failed retry and nothing louder,
not even UCX's own bind() error), and binds the port on its own once it
is free (the retry timer in daemon/main.c), never staying silently
without one.

Prints `peer-listen-retry: held_retries=N bound_after_s=S`.
"""
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

import harness  # sets ROOT and B
from harness import B, DTECTL


def fail(msg, log=None):
    print("FAIL: %s" % msg)
    if log and os.path.exists(log):
        with open(log, errors="replace") as f:
            print(f.read()[-3000:])
    sys.exit(1)


def ctl(sock, *args):
    r = subprocess.run([DTECTL, "--socket", sock, "--json"] + list(args), capture_output=True,
                       text=True, timeout=30)
    if r.returncode != 0:
        return None
    try:
        return json.loads(r.stdout)
    except ValueError:
        return r.stdout


def wait_for(what, cond, wait_s, log):
    end = time.time() + wait_s
    while True:
        v = cond()
        if v:
            return v
        if time.time() > end:
            fail("%s within %.0f s" % (what, wait_s), log)
        time.sleep(0.05)


def check_said_once(port, retries, log):
    """The clash is explained once, at error level, with the fix; each
    retry is one debug line; nothing else above debug names the port."""
    with open(log, errors="replace") as f:
        lines = f.read().splitlines()
    where = "127.0.0.1:%d" % port
    loud = [ln for ln in lines if where in ln and " debug: " not in ln and
            "listening on" not in ln]
    said = [ln for ln in loud if " error: peers: cannot listen on %s: " % where in ln]
    if len(said) != 1 or len(loud) != 1:
        fail("wanted the clash said exactly once above debug, got %d lines naming %s:\n%s" %
             (len(loud), where, "\n".join(loud)), log)
    for words in ("another process holds that port", "--peer-listen 127.0.0.1:0",
                  "listen_port in [peer] of dted.conf", "stop the other daemon"):
        if words not in said[0]:
            fail("the clash's line does not say %r: %s" % (words, said[0]), log)
    quiet = [ln for ln in lines if " debug: peers: listener retry " in ln]
    per = {}
    for ln in lines:
        m = re.search(r" debug: .*\b(retry (\d+))\b", ln)
        if m and where in ln:
            per[m.group(2)] = per.get(m.group(2), 0) + 1
    if len(quiet) < retries or any(n > 1 for n in per.values()):
        fail("wanted one debug line per failed retry (%d retries): %s" % (retries, per), log)


def main():
    tmp = tempfile.mkdtemp(prefix="dte-listen-")
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    # --peer-listen 127.0.0.1:<the held port>; ready once the control socket
    # accepts (there is no peer address to wait for: that is the point)
    d = harness.Daemon(tmp, "lr", log_level="debug", listen_port=port)
    sock, log = d.sock, d.logpath
    try:
        d.start(ready="socket")
        wait_for("dted serving its control socket", lambda: ctl(sock, "peers"), 20, log)
        p = ctl(sock, "peers")
        if p.get("address"):
            fail("dted claims listener %s on a port another process holds" % p["address"], log)
        if "cannot bind 127.0.0.1:%d" % port not in p.get("listen_error", ""):
            fail("dtectl peers does not say why there is no listener: %s" % p, log)
        m = ctl(sock, "metrics")
        text = m if isinstance(m, str) else json.dumps(m)
        if "dted_peer_listener" not in text:
            fail("no dted_peer_listener metric: %s" % text[:300], log)
        # The retry goes on (and is logged) while the port stays held.
        held = wait_for("two failed bind retries, shown by dtectl peers",
                        lambda: (ctl(sock, "peers") or {}).get("listen_retries", 0) >= 2 and
                        (ctl(sock, "peers") or {}).get("listen_retries"), 20, log)
        check_said_once(port, held, log)
        t0 = time.time()
        holder.close()
        addr = wait_for("dted binding the freed port",
                        lambda: (ctl(sock, "peers") or {}).get("address"), 30, log)
        took = time.time() - t0
        if addr != "127.0.0.1:%d" % port:
            fail("bound %s, wanted 127.0.0.1:%d" % (addr, port), log)
        p = ctl(sock, "peers")
        if p.get("listen_error"):
            fail("listen_error still set once bound: %s" % p, log)
        with open(log, errors="replace") as f:
            if "peers: listening on 127.0.0.1:%d after" % port not in f.read():
                fail("the bind is not logged", log)
        # It listens now: a peer connects and gets an answer (REFUSED:
        # the job it names does not exist here).
        r = subprocess.run([os.path.join(B, "bin", "dte-peer-forge"), "--to", addr, "--node",
                            "prober", "--expect", "1", "staged job=nojob token=t version=1 "
                            "src=1 dst=2"], capture_output=True, text=True, timeout=60,
                           env=d.env())
        if r.returncode != 0 or "recv REFUSED from lr" not in r.stdout:
            fail("a peer got no answer from the listener: %s %s" % (r.stdout[-300:],
                                                                   r.stderr[-300:]), log)
        rc = d.stop(20)
        if rc != 0:
            fail("dted exited %s after SIGTERM" % rc, log)
    finally:
        d.kill()
        holder.close()
    print("peer-listen-retry: held_retries=%d bound_after_s=%.2f" % (held, took))
    subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()

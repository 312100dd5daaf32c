#!/usr/bin/python3
"""Fault matrix against real daemons (issue 9, DESIGN §2 invariants 3–5).

Four dted daemons: "coord" (the job's coordinator), "src" (a Megatron TP=2
trainer in a child process, real AdamW), "sink1" and "sink2" (two SGLang
TP=2 replicas, each with one rank on either sink daemon).  Every scenario
runs T trials; a trial is one faulted version followed by two clean
publishes.  After every version each sink reports the version it applied
and its memory is compared element by element with RNE(θ) of *that*
version (written by the trainer before it published):

  landed     the trial proved its fault fired (the hook logged, the test
             did what it does; below);
  effects    the trial proved what the fault did where it was aimed, seen
             by the receiver itself, apart from the hook's own word (its
             log lines and counters, a process's exit status, what the
             other daemons saw; "effect:" below and in each function);
  torn       a sink's content differs from the version it reports, checked
             right after the faulted version (a half-applied version);
  wrong      the same at any other time;
  recovered  within two publishes after the fault every sink reports the
             newest version and is exact (counted only for a landed fault);
  detected   a sink's apply answered checksum_ok=0 (the daemon's own check
             caught a wrong version): filed apart, never as torn nor as a
             clean version, and no scenario here expects one.

Scenarios, and what each trial must show for its fault to have landed
(and, where it says "effect:", for its effect to count):

  src-die-counts, src-die-payload  the source daemon SIGKILLs itself at the
      second remote COUNTS / PAYLOAD of v (DTE_TEST_HOOK die-in-*,
      tests/faults/testhook.h): its log says the hook fired at v and raised
      SIGKILL; effect: the process (which the test never signals) ended
      by SIGKILL.
  sink-daemon-kill  sink2's daemon SIGKILLed by the test after v was
      published and before its sinks applied it, while it was running;
      effect: it ended by that SIGKILL.
  trainer-kill  the trainer process SIGKILLs itself mid-publish: src's
      dtectl job shows TP rank 0 at v and rank 1 before it; effect: the
      process ended by its SIGKILL and src released its clients and
      sources.
  sink-proc-kill  a sink process SIGKILLs itself with v staged for it and
      not applied (sink1's dtectl job shows applied < v <= staged);
      effect: it ended by its SIGKILL and sink1 released its client.
  link-cut  sink2's veth goes down mid-transfer and up 0.3 s or 2.5 s
      later: the bridge port into sink2 is shaped (tbf, 1 Mbit/s) for the
      faulted publish; at least 8 KB reached sink2 before the cut, sink2
      had staged nothing of v after it, the link was down and the source
      published v; effect: not one byte came into sink2's veth during the
      outage and sink2 had still staged nothing of v at its end.
  skip-write  one element of sink1's apply of v left unwritten inside the
      apply (DTE_TEST_HOOK skip-write): sink1 logs the hook at v; effect:
      sink1's own verify (the read-back of what it wrote) failed the
      check and it logged the undo, an apply of v there answered
      checksum_ok=0, and those sinks hold a version before v, which must
      be exact (bit for bit, else torn) until the repair lands.
  corrupt-payload, dup, reorder  router hooks on the receiving daemons
      (corrupt-payload with auth = off: with peer auth the tampered part
      is refused for its MAC before the sink's checks, peer_auth.py):
      each armed daemon logs the hook firing at v.  Those daemons log at
      debug level each record off the wire (before the hook) and each
      the job layer takes (after it), under one key (daemon/route.h);
      effect: corrupt-payload: sink1 refused v as corrupt (log line, its
      job's refused counter) and src heard the refusal; dup: each armed
      daemon's job layer took records of v twice that came off the wire
      once, at least once per firing, and sink1's sinks logged dropping
      or refusing a duplicate; reorder: each armed daemon's job layer
      took a record of v after one that came off the wire later, and
      every record of v off the wire reached it.
  disk-full  a real storage job whose root is a small tmpfs (its own
      writer and reader groups, see sc_disk_full): the tmpfs had no free
      block; effect: the writer logged v not written for lack of space
      and its storage_broken counter moved.
  coord-restart  the coordinator's daemon SIGKILLed and restarted on its
      fixed peer port with sockets in TIME_WAIT there (it restores the job
      from its job_state_dir; nothing done to it, members or sinks): every
      member logged its coordinator going down and its re-plan under the
      new boot, all converged on one new term, and v reached every sink
      (effect: all but the kill and the restart).
  fixed-port-restart  sink2's daemon SIGKILLed and restarted on its fixed
      peer port with sockets in TIME_WAIT there; its sinks attach again;
      effect: the others reach it at the same address, v reaches every
      sink.
  drop-join  sink1 restarted with drop-join@1: the hook logged the lost
      JOIN; effect: sink1 logged sending it again, its sinks attached.
  drop-plan  the coordinator's hook drops the first PLAN of a plan nothing
      supersedes: logged; effect: sent again, every member converged on
      it.
  forged-plan  a non-coordinator holding the token sends sink1 a PLAN with
      a huge epoch; effect: REFUSED with the reason, a warning logged,
      sink1's plan term unchanged.
  These five run at most 3 trials each (TRIALS_MAX).

A trial whose fault did not land fails the run (it is not skipped, and not
counted as recovered); so does one whose fault landed without its effect
(a hook that logs but does not act), and a detected failure.  So do: a daemon exit other than the intended one
(every process is reaped and judged before its successor starts: SIGTERM
wants 0, a kill wants SIGKILL), a DTE_TEST_HOOK the daemon did not arm (dted
refuses an unknown or malformed one at start), a sanitizer report in a
daemon log, a setup or harness exception, a scenario that ran fewer trials
than asked, and the scenario checks listed in each function.

  faults.py [--trials N] [--only a,b]      default 10 trials per scenario
Final line: `faults: scenarios=S trials=T landed=T effects=T/T torn=0 wrong=0
recovered=T detected=0` (exit 0 only then, with no failure listed).
"""

import argparse
import json
import os
import random
import re
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import faults_lib as fl  # noqa: E402  (sets up sys.path and B)
import cluster_sync_lib as csl  # noqa: E402

csl.asan_reexec([sys.executable] + sys.argv)

import torch  # noqa: E402

import sync_local as sl  # noqa: E402
from dte import _lib, sglang  # noqa: E402

JOB, TOKEN, TP = sl.JOB, sl.TOKEN, sl.TP
FAULT_WAIT_S = 3.0      # how long a faulted version gets to arrive
CLEAN_WAIT_S = 20.0


class Sink:
    """One SGLang rank of one replica, in this process, on one daemon."""

    def __init__(self, replica, rank, daemon):
        self.replica, self.rank, self.daemon = replica, rank, daemon
        self.model = sglang.SGLangModel(sl.CFG, tp=TP, label="f-%d-%d" % (replica, rank))
        self.cli = None
        self.part = None
        self.failed = {}     # version -> apply's answer, where its checksum failed

    def attach(self, coord_addr):
        self.cli = _lib.Client(self.daemon.sock)
        self.cli.job_create(JOB, sl.CFG_TEXT, TOKEN, coord_addr, 1)
        self.part = sl.attach_sink(self.cli, self.model.arenas[self.rank], self.rank,
                                   self.replica)

    def drop(self):
        if self.cli:
            try:
                self.cli.close()
            except Exception:
                pass
        self.cli = self.part = None

    def applied(self):
        return self.cli.query_version(JOB, self.part)[0]

    def catch_up(self, v, wait_s):
        """Apply whatever is staged until v is applied or time is up."""
        end = time.time() + wait_s
        while True:
            a, s = self.cli.query_version(JOB, self.part)
            if s > a:
                r = self.cli.apply(JOB, self.part, s)
                if not r.get("checksum_ok", 1):
                    # The daemon's own check failed: a detected failure,
                    # never a clean version (check_sinks).
                    self.failed[s] = r
                a = s
            left = end - time.time()
            if a >= v or left <= 0:
                return a
            try:
                self.cli.wait_staged(JOB, self.part, max(1, min(int(left * 1000), 500)))
            except _lib.DteError as e:
                if e.code != _lib.ERR_TIMEOUT:
                    raise

    def tensors(self):
        return self.model.weights(self.rank)

    def label(self):
        return "replica %d rank %d on %s" % (self.replica, self.rank, self.daemon.name)


class Cluster:
    def __init__(self, work, netns=False, hooks=None, debug=(), peer_conf=""):
        self.work = work
        self.peer_conf = peer_conf   # more [peer] lines for every daemon
        self.hooks = hooks or {}
        self.debug = debug       # daemons that log at debug level (receipts())
        self.net = csl.Netns(4) if netns else None
        self.daemons = {}
        self.trainer = None
        self.sinks = []
        self.sinkprocs = []
        self.exp = {}
        self.seed = 0
        self.ccli = None

    def start(self):
        if self.net:
            self.net.setup()
        for i, n in enumerate(("coord", "src", "sink1", "sink2")):
            lv = "debug" if n in self.debug else "info"
            if self.net:
                d = fl.HookDaemon(self.work, n, host=self.net.addrs[i], netns=self.net.names[i],
                                  dev=self.net.devs[i], hook=self.hooks.get(n), log_level=lv,
                                  peer_conf=self.peer_conf)
            else:
                d = fl.HookDaemon(self.work, n, hook=self.hooks.get(n), log_level=lv,
                                  peer_conf=self.peer_conf)
            self.daemons[n] = d.start()
        self.coord = self.daemons["coord"]
        self.ccli = _lib.Client(self.coord.sock)
        self.ccli.job_create(JOB, sl.CFG_TEXT, TOKEN, "local", 1)
        self.start_trainer()
        d1, d2 = self.daemons["sink1"], self.daemons["sink2"]
        self.sinks = [Sink(0, 0, d1), Sink(0, 1, d2), Sink(1, 0, d2), Sink(1, 1, d1)]
        for s in self.sinks:
            s.attach(self.coord.address)
        return self

    def start_trainer(self):
        self.trainer = fl.TrainerProc(self.work, self.seed)
        self.seed += 1
        self.trainer.connect(self.daemons["src"].sock, self.coord.address)

    def expected(self, v):
        if v not in self.exp:
            path = os.path.join(self.work, "exp_%d.pt" % v)
            if not os.path.exists(path):
                return None
            self.exp[v] = torch.load(path)
        return self.exp[v]

    def forget(self, v):
        """A version the trainer is known to have redone (a new trainer)."""
        self.exp.pop(v, None)

    def close(self):
        """Stops everything; returns what went wrong on the way: a daemon's
        exit other than the one the test intended (every process it started
        was reaped and judged, see faults_lib.HookDaemon), a sanitizer
        report in a daemon's log, a trainer that did not exit 0."""
        problems = []
        for s in self.sinks:
            s.drop()
        for p in self.sinkprocs:
            p.kill()
        if self.trainer:
            rc = self.trainer.close()
            if rc != 0:
                problems.append("the trainer exited %s, wanted 0" % rc)
        try:
            self.ccli.close()
        except Exception:
            pass
        for d in self.daemons.values():
            d.stop()
        for d in self.daemons.values():
            problems += d.bad_exits
            problems += ["sanitizer report in %s's log: %s" % (d.name, x)
                         for x in d.sanitizer_reports()[:3]]
        if self.net:
            self.net.close()
        return problems


class Tally:
    """Counts per scenario and for the run, and the failures that are not
    counts (a fault that did not land, a bad daemon exit, a sanitizer
    report, a harness error, a check of the scenario that failed)."""

    KEYS = ("trials", "landed", "effects", "torn", "wrong", "recovered", "detected")

    def __init__(self, log):
        self.log = log
        self.per = {}
        self.failures = []

    def scenario(self, name):
        return self.per.setdefault(name, dict.fromkeys(self.KEYS, 0))

    def total(self, key):
        return sum(t[key] for t in self.per.values())

    def fail(self, msg):
        self.failures.append(msg)
        self.log("FAIL: " + msg)


class Proof:
    """What one trial shows about its fault, in two parts.  need(): the
    fault fired (the hook logged, the test did what it does); every one
    must hold for the fault to count as landed.  effect(): what the fault
    did where it was aimed, seen by the receiver itself (its own log lines
    or counters, a process's exit status, what the other daemons saw):
    at least one, and every one must hold, for the trial's effect to
    count.  A hook that logs but does not act lands and has no effect,
    which fails the run."""

    def __init__(self):
        self.seen, self.missing = [], []
        self.effects, self.no_effect = [], []

    def need(self, cond, what):
        (self.seen if cond else self.missing).append(what)
        return cond

    def effect(self, cond, what):
        (self.effects if cond else self.no_effect).append(what)
        return cond


def check_sinks(cl, sinks, when):
    """Each sink against RNE(θ) of the version it reports.  A sink whose
    apply of that version answered checksum_ok=0 is a detected failure
    (the daemon's own check caught it): listed apart, neither torn nor a
    clean version.  Returns (mismatches, reported versions, detected)."""
    bad, got, det = [], [], []
    for s in sinks:
        a = s.applied()
        got.append(a)
        if a == 0:
            continue
        if a in s.failed:
            det.append("%s at v%d (%s): the daemon's checksum failed (its failures: %s)" % (
                s.label(), a, when, s.failed[a].get("checksum_failures")))
            continue
        want = cl.expected(a)
        if want is None:
            bad.append("%s reports v%d that no trainer wrote" % (s.label(), a))
            continue
        diff = sl.exact(want[s.rank], s.tensors())
        if diff:
            bad.append("%s at v%d (%s): %s" % (s.label(), a, when, ", ".join(diff[:3])))
    return bad, got, det


def check_procs(cl, target=0, wait_s=0.0):
    """Sink processes apply on their own: give them until target."""
    bad, got = [], []
    for p in cl.sinkprocs:
        end = time.time() + wait_s
        a, path = p.query()
        while a < target and time.time() < end:
            os.unlink(path)
            time.sleep(0.05)
            a, path = p.query()
        got.append(a)
        if a == 0:
            continue
        want = cl.expected(a)
        mine = torch.load(path)
        os.unlink(path)
        diff = sl.exact(want[p.rank], mine) if want is not None else ["no such version"]
        if diff:
            bad.append("sink process replica %d at v%d: %s" % (p.replica, a, diff[:3]))
    return bad, got


def publish(cl, v, wait_s, live=None):
    ok, dense, fed, msg = cl.trainer.publish(v)
    catch_up_all(live if live is not None else cl.sinks, v, wait_s)
    return ok, msg


def trial(cl, tally, name, v, fault, log):
    """fault(v, proof) publishes v with the fault, records in proof what
    shows the fault landed and returns the sinks alive after it; then two
    clean publishes must bring every sink to exact.  A trial counts once
    its fault ran; one whose fault did not land fails the run and is not
    counted as recovered."""
    proof = Proof()
    live = fault(v, proof)
    t = tally.scenario(name)
    t["trials"] += 1
    landed = not proof.missing
    if landed:
        t["landed"] += 1
        log("%s v%d: landed: %s" % (name, v, "; ".join(proof.seen)))
    else:
        tally.fail("%s v%d: the fault did not land: %s (seen: %s)" % (
            name, v, "; ".join(proof.missing), "; ".join(proof.seen) or "nothing"))
    if landed and proof.effects and not proof.no_effect:
        t["effects"] += 1
        log("%s v%d: effect: %s" % (name, v, "; ".join(proof.effects)))
    elif landed:
        tally.fail("%s v%d: the fault fired but its effect was not seen at the receiver: %s "
                   "(seen: %s)" % (name, v, "; ".join(proof.no_effect) or "nothing checked",
                                   "; ".join(proof.effects) or "nothing"))
    bad, got, det = check_sinks(cl, [s for s in live if s.cli], "faulted")
    pb, pg = check_procs(cl) if cl.sinkprocs else ([], [])
    bad += pb
    if bad:
        t["torn"] += 1
        log("%s v%d TORN: %s" % (name, v, "; ".join(bad)))
    rec = False
    wrong = []
    for k in (1, 2):
        ok, msg = publish(cl, v + k, CLEAN_WAIT_S)
        bad, got, d2 = check_sinks(cl, cl.sinks, "recovery")
        det += d2
        pb, pg = check_procs(cl, v + k, CLEAN_WAIT_S) if cl.sinkprocs else ([], [])
        wrong += bad + pb
        if not ok:
            log("%s v%d: publish failed: %s" % (name, v + k, msg))
        if ok and not bad and not pb and not d2 and all(a == v + k for a in got + pg):
            rec = True     # still publish the second: it must stay exact
    if det:
        # The daemon caught it (apply said checksum_ok=0): not torn, not a
        # clean version, and no scenario here expects one.
        t["detected"] += 1
        log("%s v%d DETECTED: %s" % (name, v, "; ".join(det[:4])))

    if wrong:
        t["wrong"] += 1
        log("%s v%d WRONG: %s" % (name, v, "; ".join(wrong[:4])))
    if rec and landed:
        t["recovered"] += 1
    elif not rec:
        log("%s v%d: not recovered within two publishes (sinks at %s)" % (name, v, got + pg))
    return v + 3       # every trial is three versions: hooks fire every third


# ----------------------------------------------------------- scenarios
def sc_skip_write(cl, tally, trials, v, log):
    """A write silently skipped inside sink1's apply of v (skip-write,
    tests/faults/testhook.c through job_ext.apply_select/apply_skip: one element
    keeps its old value while the apply goes on).  Lands when the hook
    logged it at v.  Its effect, seen by sink1 itself: its own verify (the
    read-back of what it wrote) failed the check, it logged the undo, an
    apply of v there answered checksum_ok=0, and every sink of sink1 holds
    a version before v; check_sinks then compares each with RNE(θ) of the
    version it reports, bit for bit (v-1 after the undo: torn otherwise),
    and the next versions repair it."""
    d = cl.daemons["sink1"]
    for i in range(trials):
        def fault(fv, proof):
            off = len(d.log_since())
            on = [s for s in cl.sinks if s.daemon is d]
            for s in on:
                s.failed.pop(fv, None)
            ok, msg = publish(cl, fv, FAULT_WAIT_S)
            text = d.log_since()[off:]
            proof.need("test hook: skip-write: version %d:" % fv in text,
                       "the hook skipped a write of v%d on sink1" % fv)
            # Two places verify: the apply (it answers checksum_ok=0) and,
            # when v's parts were swapped in as they arrived, the arrival
            # (its sums fail and the parts are undone; v is never staged).
            undone = re.findall(r"version %d: .*dense repair requested; undone: the sink holds "
                                r"version %d until it lands" % (fv, fv - 1), text)
            arrival = re.findall(r"version %d applied on arrival fails \(.*checksum.*\): undone"
                                 % fv, text)
            proof.effect(undone or arrival, "sink1 caught its own skipped write of v%d and undid "
                         "it (%d apply, %d on-arrival log lines)" % (fv, len(undone),
                                                                    len(arrival)))
            caught = [s for s in on if fv in s.failed]
            proof.effect(arrival or caught, "an apply of v%d on sink1 answered checksum_ok=0 "
                         "(%d sinks), or its arrival was undone" % (fv, len(caught)))
            at = {s.label(): s.applied() for s in on}
            proof.effect(any(a < fv for a in at.values()),
                         "a sink of sink1 holds a version before v%d: %s" % (fv, at))
            for s in on:
                s.failed.pop(fv, None)   # answered and undone: not a detected torn version
            return cl.sinks
        v = trial(cl, tally, "skip-write", v, fault, log)
    return v


def sc_src_die(kind):
    """The source daemon SIGKILLs itself at a precise point of version v
    (die-in-counts / die-in-payload, tests/faults/testhook.c): the trial lands
    when the hook logged that it fired at v, logged its SIGKILL, and the
    process ended by that SIGKILL (nothing in the test signals it)."""
    def run(cl, tally, trials, v, log):
        src = cl.daemons["src"]
        for i in range(trials):
            def fault(fv, proof):
                src.stop()                        # reaped, exit 0 checked
                src.hook = "die-in-%s@%d" % (kind, fv)
                src.start()                       # refuses a hook that is not armed
                cl.trainer.connect(src.sock, cl.coord.address)
                ok, dense, fed, msg = cl.trainer.publish(fv)
                proof.need(ok, "the trainer published v%d%s" % (fv, "" if ok else ": " + msg))
                rc = src.wait_dead(10)
                text = src.log_since()
                proof.need("test hook: die-in-%s at version %d:" % (kind, fv) in text,
                           "the hook fired at v%d" % fv)
                proof.need("test hook: SIGKILL now" in text, "the hook logged its SIGKILL")
                proof.effect(rc == -signal.SIGKILL, "src died of SIGKILL (exit %s)" % rc)
                catch_up_all(cl.sinks, fv, FAULT_WAIT_S)
                src.hook = None
                src.start()
                cl.trainer.connect(src.sock, cl.coord.address)
                return cl.sinks
            v = trial(cl, tally, "src-die-" + kind, v, fault, log)
        return v
    return run


def sc_sink_daemon(cl, tally, trials, v, log):
    """sink2's daemon SIGKILLed by the test once v is published and before
    its sinks applied v: lands when the daemon was running at the kill and
    ended by that SIGKILL."""
    d = cl.daemons["sink2"]
    for i in range(trials):
        def fault(fv, proof):
            ok, dense, fed, msg = cl.trainer.publish(fv)
            proof.need(ok, "the trainer published v%d%s" % (fv, "" if ok else ": " + msg))
            time.sleep(random.uniform(0, 0.01))
            on = [s for s in cl.sinks if s.daemon is d]
            at = [s.cli.query_version(JOB, s.part) for s in on]    # (applied, staged)
            proof.need(all(a < fv for a, _ in at),
                       "sink2's sinks had not applied v%d at the kill (applied/staged %s)" %
                       (fv, at))
            proof.need(d.proc.poll() is None, "sink2 was running at the kill")
            rc = d.kill()                         # reaped, -SIGKILL checked
            proof.effect(rc == -signal.SIGKILL, "sink2 died of the SIGKILL (exit %s)" % rc)
            for s in on:
                s.drop()
            live = [s for s in cl.sinks if s.cli]
            catch_up_all(live, fv, FAULT_WAIT_S)
            d.start()
            for s in on:
                s.attach(cl.coord.address)
            return live
        v = trial(cl, tally, "sink-daemon-kill", v, fault, log)
    return v


def clients(d):
    """Connections the daemon holds besides dtectl's own; a client's buffers
    and participants go with its connection."""
    st = d.ctl_json("status") or {}
    return st.get("clients", 0) - 1


def sources_on(d):
    j = d.ctl_json("job", JOB) or {}
    return [x for x in j.get("participants", []) if x.get("role") == "source" and x.get("local")]


def catch_up_all(sinks, v, wait_s):
    end = time.time() + wait_s
    for s in sinks:
        if s.cli:
            s.catch_up(v, max(0.0, end - time.time()))


def publish_reaches_all(cl, fv, proof, what=""):
    """The control-plane scenarios' last step: the trainer publishes fv and
    every sink must apply it exactly (`what` says which version it is)."""
    ok, dense, fed, msg = cl.trainer.publish(fv)
    proof.need(ok, "the trainer published v%d%s" % (fv, "" if ok else ": " + msg))
    catch_up_all(cl.sinks, fv, CLEAN_WAIT_S)
    got = [s.applied() for s in cl.sinks]
    proof.effect(all(a == fv for a in got), "every sink applied v%d%s (%s)" % (fv, what, got))


def sc_trainer_kill(cl, tally, trials, v, log):
    """The trainer process SIGKILLs itself mid-publish: TP rank 0 has
    published v, rank 1 has not and never will.  Lands when src's daemon
    shows exactly that before the trainer is told to die and the process
    then ended by its own SIGKILL; src must then release the dead
    client's buffers and sources."""
    src = cl.daemons["src"]
    for i in range(trials):
        def fault(fv, proof):
            r = cl.trainer.publish_half(fv)
            proof.need(r.startswith("half %d " % fv), "the trainer published v%d on TP rank 0 "
                       "(%s)" % (fv, r))
            pub = {x.get("rank"): int(x.get("version", 0)) for x in sources_on(src)}
            proof.need(pub.get(0) == fv and pub.get(1, fv) < fv,
                       "src shows rank 0 at v%d, rank 1 before it (%s)" % (fv, pub))
            cl.trainer.die(random.randint(0, 20))
            rc = cl.trainer.wait_exit(10)
            proof.effect(rc == -signal.SIGKILL, "the trainer died of its SIGKILL (exit %s)" % rc)
            if rc is None:
                cl.trainer.kill()
            catch_up_all(cl.sinks, fv, FAULT_WAIT_S)
            end = time.time() + 5
            while time.time() < end and (clients(src) or sources_on(src)):
                time.sleep(0.05)
            held = (clients(src), sources_on(src))
            proof.effect(not held[0] and not held[1], "src released the dead trainer (clients "
                         "%d, sources %s)" % held)
            # A new trainer (another seed: fresh weights) takes over; the
            # versions it publishes overwrite the expectations.
            for k in (1, 2):
                cl.forget(fv + k)
            cl.start_trainer()
            return cl.sinks
        v = trial(cl, tally, "trainer-kill", v, fault, log)
    return v


class SinkP:
    def __init__(self, cl, replica, rank, daemon):
        self.proc = fl.SinkProc(cl.work, daemon.sock, cl.coord.address, replica, rank)
        self.replica, self.rank, self.daemon = replica, rank, daemon

    def query(self):
        return self.proc.query()

    def kill(self):
        self.proc.kill()


def sc_sink_proc(cl, tally, trials, v, log):
    """A sink process (a third replica's rank 0 on sink1) SIGKILLs itself
    with v staged for it and not applied.  Lands when sink1's daemon shows
    exactly that before the process is told to die and it then ended by its
    own SIGKILL; sink1 must then release its client."""
    d = cl.daemons["sink1"]
    base = clients(d)
    cl.sinkprocs = [SinkP(cl, 2, 0, d)]
    # It joins densely at the next version.
    publish(cl, v, CLEAN_WAIT_S)
    v += 1
    for i in range(trials):
        def fault(fv, proof):
            p = cl.sinkprocs[0].proc
            p.die_at(fv)
            ok, dense, fed, msg = cl.trainer.publish(fv)
            proof.need(ok, "the trainer published v%d%s" % (fv, "" if ok else ": " + msg))
            try:
                said = p.readline(CLEAN_WAIT_S)
            except (EOFError, TimeoutError) as e:
                said = str(e)
            mine = [x for x in (d.ctl_json("job", JOB) or {}).get("participants", [])
                    if x.get("local") and x.get("role") == "sink" and x.get("replica") == 2]
            at = [(int(x.get("version", 0)), int(x.get("staged", 0))) for x in mine]
            proof.need(said == "staged %d" % fv and len(at) == 1 and at[0][0] < fv <= at[0][1],
                       "the sink process had v%d staged, not applied (it said %r; sink1 shows "
                       "applied/staged %s)" % (fv, said, at))
            p.die()
            rc = p.wait_exit(10)
            if rc is None:
                p.kill()
            cl.sinkprocs = []
            proof.effect(rc == -signal.SIGKILL, "it died of its SIGKILL (exit %s)" % rc)
            catch_up_all(cl.sinks, fv, FAULT_WAIT_S)
            end = time.time() + 5
            while time.time() < end and clients(d) != base:
                time.sleep(0.05)
            now = clients(d)
            proof.effect(now == base, "sink1 released the dead process's client (%s clients, %s "
                         "before it)" % (now, base))
            cl.sinkprocs = [SinkP(cl, 2, 0, d)]
            return cl.sinks
        v = trial(cl, tally, "sink-proc-kill", v, fault, log)
    for p in cl.sinkprocs:
        rc = p.proc.close()
        if rc != 0:
            tally.fail("sink-proc-kill: the last sink process exited %s, wanted 0" % rc)
    cl.sinkprocs = []
    return v


CUT_AFTER_BYTES = 8192   # of v, into sink2, before its link is cut
SHAPE_RATE = "1mbit"     # v's ~100 KB to sink2 take about a second


def rx_bytes(ns, dev):
    r = subprocess.run(["ip", "-n", ns, "-s", "-j", "link", "show", "dev", dev],
                       capture_output=True, text=True, check=True)
    return int(json.loads(r.stdout)[0]["stats64"]["rx"]["bytes"])


def link_up(ns, dev):
    r = subprocess.run(["ip", "-n", ns, "-j", "link", "show", "dev", dev],
                       capture_output=True, text=True, check=True)
    return "UP" in json.loads(r.stdout)[0].get("flags", [])


def sc_link_cut(cl, tally, trials, v, log):
    """sink2's link is cut mid-transfer and restored 0.3 s or 2.5 s later.
    The bridge port into sink2 is shaped (tbf) during the faulted publish so
    the transfer lasts about a second; the link goes down once 8 KB of v
    reached sink2.  Lands when those bytes arrived before the cut, sink2
    had staged nothing of v after it (so v was in flight at the cut), the
    link was down and the source published v."""
    d = cl.daemons["sink2"]
    port = d.dev + "p"          # its veth's end on the hub's bridge (csl.Netns)
    for i in range(trials):
        down_s = (0.3, 2.5)[i % 2]

        def fault(fv, proof):
            on = [s for s in cl.sinks if s.daemon is d]
            subprocess.run(["tc", "-n", cl.net.hub, "qdisc", "add", "dev", port, "root", "tbf",
                            "rate", SHAPE_RATE, "burst", "16kb", "limit", "8mb"], check=True)
            try:
                base = rx_bytes(d.netns, d.dev)
                cl.trainer.send("publish %d" % fv)
                moved, end = 0, time.time() + CLEAN_WAIT_S
                while moved < CUT_AFTER_BYTES and time.time() < end:
                    moved = rx_bytes(d.netns, d.dev) - base
                subprocess.run(["ip", "-n", d.netns, "link", "set", d.dev, "down"], check=True)
            finally:
                subprocess.run(["tc", "-n", cl.net.hub, "qdisc", "del", "dev", port, "root"],
                               check=True)
            staged = [s.cli.query_version(JOB, s.part)[1] for s in on]
            down = not link_up(d.netns, d.dev)
            proof.need(moved >= CUT_AFTER_BYTES, "%d bytes reached sink2 before the cut" % moved)
            proof.need(all(x < fv for x in staged),
                       "sink2 had not staged v%d after the cut (staged %s)" % (fv, staged))
            proof.need(down, "sink2's link was down")
            r = cl.trainer.readline(60)
            proof.need(r.startswith("ok"), "the source published v%d (%s)" % (fv, r))
            rx0 = rx_bytes(d.netns, d.dev)
            time.sleep(down_s)
            # What sink2 saw while its link was down: no byte came in, and
            # v, in flight, stayed unstaged there to the end of the outage.
            rx1 = rx_bytes(d.netns, d.dev)
            staged = [s.cli.query_version(JOB, s.part)[1] for s in on]
            still = not link_up(d.netns, d.dev)
            proof.effect(still and rx1 == rx0, "sink2 received %d bytes in its %.1f s outage "
                         "(link still down: %s)" % (rx1 - rx0, down_s, still))
            proof.effect(all(x < fv for x in staged), "sink2 had staged nothing of v%d at the "
                         "end of the outage (staged %s)" % (fv, staged))
            subprocess.run(["ip", "-n", d.netns, "link", "set", d.dev, "up"], check=True)
            catch_up_all(cl.sinks, fv, FAULT_WAIT_S)
            return cl.sinks
        v = trial(cl, tally, "link-cut", v, fault, log)
    return v


# The armed daemons of the router hooks run at log level debug, where
# route_deliver logs each remote record as it comes off the wire (before
# any decorator) and job_peer_recv each record the job layer takes, under
# the same key (a hash of the record's header, daemon/route.h): what the
# receiver's protocol code got, against what the wire carried.
WIRE_RX = re.compile(r"route: off the wire: record type (\d+) from (\S+) key ([0-9a-f]{16})")
TOOK_RX = re.compile(r"job layer took: record type (\d+) from (\S+) version (\d+) "
                     r"key ([0-9a-f]{16})")


def receipts(text):
    """(keys off the wire in order, [(key, version)] the job layer took in
    order), the latter only for records that came off the wire."""
    wire = [m.group(3) for m in WIRE_RX.finditer(text)]
    seen = set(wire)
    took = [(m.group(4), int(m.group(3))) for m in TOOK_RX.finditer(text)
            if m.group(4) in seen]
    return wire, took


def dup_effect(text, v):
    """Records of v the job layer took more often than they came off the
    wire (the extra deliveries)."""
    wire, took = receipts(text)
    keys = {k for k, ver in took if ver == v}
    return sum(1 for k, _ in took if k in keys) - sum(1 for k in wire if k in keys)


def reorder_effect(text, v):
    """(records of v the job layer took after a record that came off the
    wire later, records of v off the wire that never reached it)."""
    wire, took = receipts(text)
    pos, nth = {}, {}
    for i, k in enumerate(wire):
        pos.setdefault(k, []).append(i)
    order = []
    for k, ver in took:
        n = nth.get(k, 0)
        nth[k] = n + 1
        if n < len(pos[k]):
            order.append((pos[k][n], ver))
    overtaken = sum(1 for i in range(1, len(order))
                    if order[i][1] == v and order[i][0] < order[i - 1][0])
    keys = {k for k, ver in took if ver == v}
    lost = sum(len(pos[k]) - nth.get(k, 0) for k in keys)
    return overtaken, lost


SINK_SAW_DUP = r"(COUNTS from \S+ for version %(v)d duplicated|" \
               r"PAYLOAD part \d+ of v%(v)d from \S+ came twice; the copy dropped|" \
               r"refuses version %(v)d: .*part \d+ twice|" \
               r"for version %(v)d but sink \S+ holds \d+ \(dropped\))"


SINK_REFUSED_CORRUPT = (r"sink \S+(?: refuses version %(v)d: |: version %(v)d applied on arrival "
                        r"fails \().*payload corrupt")
SRC_HEARD_CORRUPT = r"reports version %d refused: .*payload corrupt"
EFFECT_WAIT_S = 30.0    # how long a fault's effect may take to show in the logs


def await_log(d, off, pattern, timeout):
    """d's log of its current process from off, once the regex pattern is
    in it or at the deadline (then without it)."""
    end = time.time() + timeout
    while True:
        text = d.log_since()[off:]
        if re.search(pattern, text) or time.time() >= end:
            return text
        time.sleep(0.05)


def sc_hooked(name):
    """Receiver-side router hooks (tests/faults/testhook.c) fire every third
    version from 3 on, on every daemon main() armed them on: lands when
    each of those logged that its hook fired at v.  Its effect, seen by
    the receiver's own code:
      corrupt-payload  sink1 refused v as corrupt (its log, and its job's
          refused counter moved) and src heard that refusal;
      dup  on each armed daemon the job layer took records of v more often
          than they came off the wire, at least once per firing, and
          sink1's sink code logged the duplicate it dropped or refused;
      reorder  on each armed daemon the job layer took a record of v after
          one that came off the wire later, and every record of v off the
          wire reached it."""
    def run(cl, tally, trials, v, log):
        armed = [d for d in cl.daemons.values() if d.hook]
        for i in range(trials):
            def fault(fv, proof):
                before = {d.name: len(d.log_since()) for d in armed}
                offs = {n: len(d.log_since()) for n, d in cl.daemons.items()}
                refused0 = (cl.daemons["sink1"].ctl_json("job", JOB) or {}).get("refused", 0)
                ok, msg = publish(cl, fv, FAULT_WAIT_S)
                marker = r"test hook: %s: version %d " % (re.escape(name), fv)
                fired = {}
                for d in armed:
                    fired[d.name] = len(re.findall(marker, d.log_since()[before[d.name]:]))
                    proof.need(fired[d.name] > 0, "the hook fired on %s at v%d (%d records)" %
                               (d.name, fv, fired[d.name]))
                text = {n: d.log_since()[offs[n]:] for n, d in cl.daemons.items()}
                if name == "corrupt-payload":
                    # sink1 refuses the version in staging ("refuses
                    # version"), or, parked, undoes it on arrival ("applied
                    # on arrival fails"): both say "payload corrupt".  (Two
                    # loaded runs failed here when the pattern knew only the
                    # first and the arrival path worded it otherwise.)  The
                    # lines are awaited with a deadline, not read once.
                    for n, pat in (("sink1", SINK_REFUSED_CORRUPT % {"v": fv}),
                                   ("src", SRC_HEARD_CORRUPT % fv)):
                        text[n] = await_log(cl.daemons[n], offs[n], pat, EFFECT_WAIT_S)
                    refused = (cl.daemons["sink1"].ctl_json("job", JOB) or {}).get("refused", 0)
                    said = re.findall(SINK_REFUSED_CORRUPT % {"v": fv}, text["sink1"])
                    proof.effect(said and refused > refused0,
                                 "sink1 refused v%d as corrupt (%d log lines, job refused %s -> "
                                 "%s)" % (fv, len(said), refused0, refused))
                    proof.effect(re.search(SRC_HEARD_CORRUPT % fv, text["src"]) is not None,
                                 "src heard sink1's refusal of v%d" % fv)
                elif name == "dup":
                    for d in armed:
                        extra = dup_effect(text[d.name], fv)
                        proof.effect(extra >= fired[d.name] > 0,
                                     "%s's job layer took %d records of v%d twice (%d firings)" %
                                     (d.name, extra, fv, fired[d.name]))
                    n = len(re.findall(SINK_SAW_DUP % {"v": fv}, text["sink1"]))
                    proof.effect(n > 0, "sink1's sinks saw %d duplicates of v%d and dropped or "
                                 "refused them" % (n, fv))
                else:
                    for d in armed:
                        over, lost = reorder_effect(text[d.name], fv)
                        proof.effect(over > 0 and lost == 0,
                                     "%s's job layer took %d records of v%d after a later one "
                                     "(%d off the wire never reached it)" % (d.name, over, fv,
                                                                            lost))
                return cl.sinks
            v = trial(cl, tally, name, v, fault, log)
        return v
    return run


HOOKED = ("corrupt-payload", "dup", "reorder")


# ------------------------------------------------- control plane (issue 17)
CONVERGE_S = 30.0


def port_of(addr):
    return int(addr.rsplit(":", 1)[1])


def time_wait_on(port, wait_s=1.0):
    """Sockets in TIME_WAIT on the local port, polled up to wait_s (the
    killed side's socket gets there once the peer's FIN came back; a
    reset one never does, which is the kernel's call)."""
    end = time.time() + wait_s
    while True:
        r = subprocess.run(["ss", "-Htan", "state", "time-wait", "( sport = :%d )" % port],
                           capture_output=True, text=True)
        n = len([x for x in r.stdout.splitlines() if x.strip()])
        if n or time.time() > end:
            return n
        time.sleep(0.05)


def ensure_time_wait(port):
    """(sockets in TIME_WAIT on the port, who left them).  A killed
    daemon's sockets end in TIME_WAIT only when it closed first with
    nothing unread (else the kernel resets them): when the kill left none,
    the test leaves one itself, a connection from that local port that it
    closes first, so the restart always binds within TIME_WAIT."""
    n = time_wait_on(port)
    if n:
        return n, "the killed daemon"
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    c.bind(("127.0.0.1", port))
    c.connect(srv.getsockname())
    a, _ = srv.accept()
    c.close()                   # active close: this side ends in TIME_WAIT
    a.close()
    srv.close()
    return time_wait_on(port), "the test"


def members_converged(cl, old_boot=None):
    """Every member daemon holds the same plan term, of a boot other than
    old_boot, and the coordinator's plan has all three members and is
    complete.  Returns (ok, what was seen)."""
    cj = cl.coord.ctl_json("job", JOB) or {}
    eps, comp = {}, {}
    for n in ("src", "sink1", "sink2"):
        j = cl.daemons[n].ctl_json("job", JOB) or {}
        eps[n], comp[n] = j.get("epoch", 0), j.get("complete", False)
    boots = {n: e >> 24 for n, e in eps.items()}
    ok = (sorted(cj.get("members", [])) == ["sink1", "sink2", "src"] and all(comp.values()) and
          len(set(eps.values())) == 1 and all(eps.values()) and
          (old_boot is None or all(b != old_boot for b in boots.values())))
    return ok, "coordinator members %s; member terms %s complete %s" % (
        sorted(cj.get("members", [])), {n: "%x" % e for n, e in eps.items()}, comp)


def await_converged(cl, old_boot, wait_s):
    end = time.time() + wait_s
    while True:
        ok, seen = members_converged(cl, old_boot)
        if ok or time.time() > end:
            return ok, seen
        time.sleep(0.1)


def sc_coord_restart(cl, tally, trials, v, log):
    """The coordinator's daemon SIGKILLed by the test and restarted on its
    fixed peer port, within TIME_WAIT (ensure_time_wait).  Nothing is done
    to it, the members or the sinks: it restores the job from its
    job_state_dir.  Lands when: the daemon died of the SIGKILL, the restart
    bound the same port with TIME_WAIT there, it restored the job, every
    member logged that its coordinator went down and that it re-planned
    under the new boot, all members converged on one new term, and a sink
    attached anew; v (the first version after the restart) must then reach
    every sink exact."""
    d = cl.coord
    for i in range(trials):
        def fault(fv, proof):
            _, before = members_converged(cl)
            port = port_of(d.address)
            d.listen_port = port
            offs = {n: len(cl.daemons[n].log_text()) for n in ("src", "sink1", "sink2")}
            off_coord = len(d.log_text())
            old_boot = (cl.daemons["src"].ctl_json("job", JOB) or {}).get("epoch", 0) >> 24
            try:
                cl.ccli.close()
            except Exception:
                pass
            rc = d.kill()
            proof.need(rc == -signal.SIGKILL, "coord died of the SIGKILL (exit %s)" % rc)
            tw, by = ensure_time_wait(port)
            d.start()
            proof.need(port_of(d.address) == port and tw > 0, "coord restarted on its port %d "
                       "with %d sockets in TIME_WAIT there (left by %s)" % (port, tw, by))
            cl.ccli = _lib.Client(d.sock)
            # Nobody creates the job again: the restarted daemon restores
            # it from its job_state_dir (daemon/job_persist.c).
            proof.effect("job %s restored from" % JOB in d.log_text()[off_coord:],
                         "coord restored job %s from its job_state_dir" % JOB)
            ok, seen = await_converged(cl, old_boot, CONVERGE_S)
            proof.effect(ok, "members converged on a new term within %.0f s (before: %s; now: "
                         "%s)" % (CONVERGE_S, before, seen))
            for n in ("src", "sink1", "sink2"):
                text = cl.daemons[n].log_text()[offs[n]:]
                proof.effect("the coordinator coord" in text and "went down; rejoining" in text,
                             "%s noticed its coordinator go down" % n)
                proof.effect("plans under a new boot" in text,
                             "%s re-planned under the new boot" % n)
            # A new attach after the restart is planned by the new
            # coordinator (it timed out before peer protocol 4).
            s = cl.sinks[i % len(cl.sinks)]
            s.drop()
            try:
                s.attach(d.address)
                proof.effect(True, "a sink attached anew after the restart")
            except Exception as e:
                proof.effect(False, "a sink attached anew after the restart: %s" % e)
                s.drop()
                s.attach(d.address)
            publish_reaches_all(cl, fv, proof, ", the first version after the restart")
            return cl.sinks
        v = trial(cl, tally, "coord-restart", v, fault, log)
    return v


def sc_fixed_port_restart(cl, tally, trials, v, log):
    """sink2's daemon SIGKILLed and restarted on its fixed peer port with
    sockets in TIME_WAIT there (ensure_time_wait); its sinks attach again.
    Lands when the daemon died of the SIGKILL, the restart bound the same
    port with TIME_WAIT there, the members converged, and v reached every
    sink exact: the other daemons reach it again at the address they
    know."""
    d = cl.daemons["sink2"]
    for i in range(trials):
        def fault(fv, proof):
            port = port_of(d.address)
            d.listen_port = port
            on = [s for s in cl.sinks if s.daemon is d]
            for s in on:
                s.drop()
            rc = d.kill()
            proof.need(rc == -signal.SIGKILL, "sink2 died of the SIGKILL (exit %s)" % rc)
            tw, by = ensure_time_wait(port)
            d.start()
            proof.need(port_of(d.address) == port and tw > 0, "sink2 restarted on its port %d "
                       "with %d sockets in TIME_WAIT there (left by %s)" % (port, tw, by))
            for s in on:
                s.attach(cl.coord.address)
            ok, seen = await_converged(cl, None, CONVERGE_S)
            proof.effect(ok, "members converged (%s)" % seen)
            publish_reaches_all(cl, fv, proof)
            return cl.sinks
        v = trial(cl, tally, "fixed-port-restart", v, fault, log)
    return v


def sc_drop_join(cl, tally, trials, v, log):
    """sink1's daemon restarted (SIGTERM) with drop-join@1: its sinks
    attach again and their first JOIN is lost on the way.  Lands when the
    hook logged the drop, the daemon logged the JOIN's retry, and every
    attach succeeded (within the attach deadline) with v then exact."""
    d = cl.daemons["sink1"]
    for i in range(trials):
        def fault(fv, proof):
            on = [s for s in cl.sinks if s.daemon is d]
            for s in on:
                s.drop()
            rc = d.stop()
            proof.need(rc == 0, "sink1 stopped (exit %s)" % rc)
            d.hook = "drop-join@1"
            d.start()
            err = None
            try:
                for s in on:
                    s.attach(cl.coord.address)
            except Exception as e:       # an attach that timed out: the fault won
                err = e
            proof.effect(err is None, "sink1's sinks attached again%s" % (
                "" if err is None else ": %s" % err))
            for s in on:
                if not s.part:           # the fault won: attach again so the run goes on
                    s.drop()
                    s.attach(cl.coord.address)
            text = d.log_since()
            proof.need("test hook: drop-join: JOIN #1 dropped" in text, "the first JOIN was dropped")
            proof.effect(re.search(r"JOIN \d+ not acknowledged; sent again", text) is not None,
                         "sink1 sent the JOIN again")
            ok, seen = await_converged(cl, None, CONVERGE_S)
            proof.effect(ok, "members converged (%s)" % seen)
            publish_reaches_all(cl, fv, proof)
            d.hook = None
            return cl.sinks
        v = trial(cl, tally, "drop-join", v, fault, log)
    return v


# The coordinator's plans at the start: one per attach (2 trainer ranks, 4
# sinks).  A drop-plan trial makes two more (a sink leaves, attaches again)
# and the hook drops the first PLAN of the second: DROP_PLAN_HOOK.
START_PLANS = 6
DROP_PLAN_HOOK = "drop-plan@%d/2" % (START_PLANS + 2)


def sc_drop_plan(cl, tally, trials, v, log):
    """A sink on sink1 leaves and attaches again: the coordinator makes two
    plans, and its hook (DROP_PLAN_HOOK) drops the first PLAN of the
    second, which nothing newer supersedes.  Lands when the hook logged
    that drop, the coordinator logged the PLAN sent again (its retry, or
    its answer to the member's JOIN retry), and all members converged on
    that plan's term; v must then reach every sink exact."""
    d = cl.daemons["sink1"]
    for i in range(trials):
        def fault(fv, proof):
            want = START_PLANS + 2 * i + 2
            before = (d.ctl_json("job", JOB) or {}).get("epoch", 0) & 0xffffff
            off = len(cl.coord.log_since())
            s = next(x for x in cl.sinks if x.daemon is d)
            s.drop()
            s.attach(cl.coord.address)
            ok, seen = await_converged(cl, None, CONVERGE_S)
            now = (d.ctl_json("job", JOB) or {}).get("epoch", 0) & 0xffffff
            text = cl.coord.log_since()[off:]
            proof.need(before == want - 2, "the coordinator had made %d plans before the trial "
                       "(members hold plan %d)" % (want - 2, before))
            proof.need("test hook: drop-plan: PLAN of plan %d " % want in text,
                       "the first PLAN of plan %d was dropped" % want)
            proof.effect(re.search(r"sent again", text) is not None,
                         "the coordinator sent the lost PLAN again")
            proof.effect(ok and now == want, "members converged on plan %d (%s)" % (want, seen))
            publish_reaches_all(cl, fv, proof)
            return cl.sinks
        v = trial(cl, tally, "drop-plan", v, fault, log)
    return v


def sc_forged_plan(cl, tally, trials, v, log):
    """A daemon that is not the coordinator but holds the job's token
    (dte-peer-forge, greeting as "forger") sends sink1 a PLAN with a huge
    epoch.  Lands when sink1 answered REFUSED with the reason, logged the
    refusal at warning level, and kept its plan term; v must then reach
    every sink exact (the member was unaffected)."""
    d = cl.daemons["sink1"]
    for i in range(trials):
        def fault(fv, proof):
            ep = (d.ctl_json("job", JOB) or {}).get("epoch", 0)
            huge = (1 << 62) + fv
            rc, out = csl.forge(d.address, ["plan job=%s token=%s epoch=%d" % (JOB, TOKEN, huge)],
                                node="forger", expect=1)
            refused = [x for x in out if x.startswith("recv REFUSED")]
            sent = [x for x in out if x.startswith("sent PLAN")]
            proof.need(len(sent) == 1, "the forger sent sink1 the PLAN (%s)" % (sent or out[-2:]))
            proof.effect(rc == 0 and len(refused) == 1 and
                       "plans come from the job's coordinator" in refused[0],
                       "sink1 answered the forged PLAN with REFUSED (%s)" % (refused or out[-2:]))
            proof.effect(re.search(r"warn: .*PLAN epoch %x from forger refused: not the job's "
                                 r"coordinator" % huge, d.log_since()) is not None,
                       "sink1 logged the refusal at warning level")
            after = (d.ctl_json("job", JOB) or {}).get("epoch", 0)
            proof.effect(after == ep and ep, "sink1 kept its plan term %x (now %x)" % (ep, after))
            publish_reaches_all(cl, fv, proof)
            return cl.sinks
        v = trial(cl, tally, "forged-plan", v, fault, log)
    return v


# Scenarios that restart daemons cost seconds a trial: at most this many
# trials each, so the matrix stays within minutes on two busy cores.
TRIALS_MAX = {"coord-restart": 3, "fixed-port-restart": 3, "drop-join": 3, "drop-plan": 3,
              "forged-plan": 3}


# ------------------------------------------------------------ disk full
DISK_MB = 32


def fill(mnt, path):
    """Take every free block of the tmpfs: the next write there is ENOSPC."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in (1 << 20, 1 << 16, 4096, 512, 1):
            buf = b"\0" * chunk
            while True:
                try:
                    if os.write(fd, buf) < chunk:
                        break
                except OSError:
                    break
    finally:
        os.close(fd)
    return os.statvfs(mnt).f_bavail


class StoreReaders:
    """The reader group (storage_sync.Readers) keeping each rank's applied
    version across calls, so `applied` is what the sinks really hold."""

    def __init__(self, ss, daemon, store):
        self.g = ss.Readers(daemon, store, "f-disk")
        self.held = [0] * ss.TP

    def catch_up(self, version, wait_s):
        end = time.time() + wait_s
        while min(self.held) < version and time.time() < end:
            for i, p in enumerate(self.g.parts):
                try:
                    v = self.g.cli.wait_staged(JOB_DISK, p, 100)
                except _lib.DteError as e:
                    if e.code == _lib.ERR_TIMEOUT:
                        continue
                    raise
                self.held[i] = self.g.cli.apply(JOB_DISK, p, v)["version"]
        return self.applied()

    def applied(self):
        return min(self.held) if self.held[0] == self.held[-1] else -1


JOB_DISK = "qwen-store"


def sc_disk_full(tally, trials, work, log):
    """A real storage job whose root is a small tmpfs: a writer group
    (coordinator daemon + Megatron TP=2 trainer, real AdamW) and a reader
    group (SGLang TP=2 sinks on another daemon) sharing only that directory.
    Each trial fills the tmpfs, publishes v: the writer daemon's commit
    fails with ENOSPC, says so (log, dtectl history) and keeps serving; the
    readers apply nothing of v and stay exact at what they hold.  With the
    space back, two clean publishes must bring them exactly to the newest.
    A trial counts once its setup ran and the disk was filled; it lands
    when the tmpfs had no free block and the writer logged v's write as
    failed for lack of space.  A setup that cannot run fails the run."""
    name = "disk-full"
    if os.geteuid() != 0:
        tally.fail("disk-full: cannot run: needs root to mount a tmpfs")
        return
    mnt = os.path.join(work, "small")
    os.mkdir(mnt)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dm" % DISK_MB, "tmpfs", mnt],
                       capture_output=True, text=True)
    if r.returncode != 0:
        tally.fail("disk-full: cannot mount a tmpfs: %s" % r.stderr.strip())
        return
    daemons, cleanups = [], []
    try:
        _disk_full(tally, trials, mnt, work, log, daemons, cleanups)
    except Exception as e:
        import traceback
        traceback.print_exc()
        tally.fail("disk-full: harness error: %s" % e)
    finally:
        for c in cleanups:            # clients go before the daemons stop
            c()
        rcs = [(d.name, d.stop()) for d in daemons]
        for n, rc in rcs:
            if rc != 0:
                tally.fail("disk-full: daemon %s exited %s, wanted 0" % (n, rc))
        for d in daemons:
            for x in d.sanitizer_reports()[:3]:
                tally.fail("disk-full: sanitizer report in %s's log: %s" % (d.name, x))
        t = tally.per.get(name)
        if not t or t["trials"] != t["landed"] or t["landed"] != t["recovered"] or \
                t["effects"] != t["landed"] or \
                any(rc != 0 for _, rc in rcs):
            for d in daemons:
                print("--- %s log (tail) ---\n%s" % (d.name, d.log_tail(20)))
        subprocess.run(["umount", mnt], capture_output=True)


def _disk_full(tally, trials, mnt, work, log, daemons, cleanups):
    name = "disk-full"
    os.environ.setdefault("DTE_STORAGE_ASAN", "1")   # faults.py already re-exec'd for ASan
    import storage_sync as ss
    from dte import megatron, toy

    store = os.path.join(mnt, "root")
    os.mkdir(store)
    filler = os.path.join(mnt, "filler")
    wants = {}
    model = megatron.MegatronModel(ss.CFG, tp=ss.TP, seed=0, label="f-disk-src",
                                   placement=ss.SRC_LAYOUT)
    trainer = megatron.Trainer(model, lr=ss.LR, warmup=ss.WARMUP)
    task = toy.ToyTask(ss.CFG["vocab_size"])
    st = {"step": 0}
    hold = {}

    def publish(v):
        """One AdamW step published as v; True when the job completed it."""
        st["step"] += 1
        rec = trainer.step(*task.batch_at(st["step"]))
        wants[v] = ss.expected(model)
        try:
            hold["w"].publish(v, rec, wait=True)
            return True, ""
        except _lib.DteError as e:
            return False, str(e)

    def exact_at(v):
        if v <= 0:
            return []
        if v not in wants:
            return ["readers report v%d that no trainer published" % v]
        return ss.exact(wants[v], rd.g)

    def history_note(d, v):
        h = (d.ctl_json("history", JOB_DISK, check=False) or {}).get("versions", [])
        return next((x.get("note", "") for x in h if int(x.get("version", -1)) == v), None)

    def close():
        if "w" in hold:
            hold.pop("w").close()
        if "rd" in hold:
            try:
                hold.pop("rd").g.cli.close()
            except Exception:
                pass
        trainer.close()

    cleanups.append(close)
    a = ss.Daemon(work, "grp-a")          # serving: the fixture waited for dtectl
    daemons.append(a)
    hold["w"] = ss.Writer(model, a, store)
    b = ss.Daemon(work, "grp-b")
    daemons.append(b)
    rd = hold["rd"] = StoreReaders(ss, b, store)
    for v in (1, 2):                        # warm: a keyframe, then a delta
        publish(v)
        rd.catch_up(v, CLEAN_WAIT_S)
    bad = exact_at(rd.applied())
    if rd.applied() != 2 or bad:
        tally.fail("disk-full: not exact before the faults (at v%d): %s" % (rd.applied(),
                                                                          bad[:2]))
        return
    t = tally.scenario(name)      # the setup ran: from here on trials count
    v = 3
    for i in range(trials):
        before = rd.applied()
        left = fill(mnt, filler)
        ok, msg = publish(v)
        at = rd.catch_up(v, FAULT_WAIT_S)
        t["trials"] += 1
        alive = a.proc.poll() is None
        man = os.path.exists(os.path.join(store, JOB_DISK, "v%d.manifest" % v))
        note = history_note(a, v) or ""
        line = next((x for x in a.log_text().splitlines()
                     if "storage v%d not written" % v in x), "")
        j = a.ctl_json("job", JOB_DISK, check=False) or {}
        # Landed: the disk was full.  Its effect, at the writer: it logged
        # v not written for lack of space and counted the lost version.
        landed = left == 0
        effect = landed and "no space left" in line.lower() and \
            int(j.get("storage_broken", 0)) == i + 1
        if landed:
            t["landed"] += 1
            log("disk-full v%d: landed: 0 free blocks" % v)
        else:
            tally.fail("disk-full v%d: the fault did not land (free blocks %d, publish %s %s)" %
                       (v, left, ok, msg))
        if effect:
            t["effects"] += 1
            log("disk-full v%d: effect: writer: %s; storage_broken %s" % (
                v, line.split("job ", 1)[-1], j.get("storage_broken")))
        elif landed:
            tally.fail("disk-full v%d: the disk was full but the writer did not say v%d was lost "
                       "for lack of space (log %r, storage_broken %s, publish %s %s)" % (
                           v, v, line, j.get("storage_broken"), ok, msg))
        torn = []
        if at != before or man:
            torn.append("readers moved v%d -> v%d on a failed write (manifest %s)" %
                        (before, at, man))
        torn += exact_at(at)
        if torn:
            t["torn"] += 1
            log("disk-full v%d TORN: %s" % (v, "; ".join(torn[:3])))
        jerr = j.get("storage_error", "")
        # The cause, not just "failed": in the history note and dtectl job
        # (whose counter moves once per lost version).
        clear = ("storage write failed" in note and "space" in note.lower() and
                 ("v%d" % v) in jerr and "space" in jerr.lower() and
                 int(j.get("storage_broken", 0)) == i + 1)
        if not alive or not clear:
            tally.fail("disk-full v%d: failure not reported clearly (alive=%s history=%r "
                       "job=%r broken=%s publish=%s %s)" % (
                           v, alive, note, jerr, j.get("storage_broken"), ok, msg))
        if i == 0:
            print("  disk-full v%d: dtectl history note: %s" % (v, note))
            print("  disk-full v%d: dtectl job storage_error: %s" % (v, jerr), flush=True)
        os.unlink(filler)
        rec, wrong = False, []
        for k in (1, 2):
            ok, msg = publish(v + k)
            at = rd.catch_up(v + k, CLEAN_WAIT_S)
            bad = exact_at(at)
            wrong += bad
            if not ok:
                log("disk-full v%d: publish with space back failed: %s" % (v + k, msg))
            if ok and not bad and at == v + k:
                rec = True     # still publish the second: it must stay exact
        if wrong:
            t["wrong"] += 1
            log("disk-full v%d WRONG: %s" % (v, "; ".join(wrong[:4])))
        if rec and landed:
            t["recovered"] += 1
        elif not rec:
            log("disk-full v%d: not recovered within two publishes (readers at v%d)" %
                (v, rd.applied()))
        v += 3
    j = a.ctl_json("job", JOB_DISK, check=False) or {}
    if int(j.get("storage_head", -1)) != v - 1:
        tally.fail("disk-full: writer head v%s, wanted v%d" % (j.get("storage_head"), v - 1))


# ----------------------------------------------------------------- main
SCENARIOS = ["src-die-counts", "src-die-payload", "sink-daemon-kill", "trainer-kill",
             "sink-proc-kill", "link-cut", "corrupt-payload", "dup", "reorder", "disk-full",
             "coord-restart", "fixed-port-restart", "drop-join", "drop-plan", "forged-plan",
             "skip-write"]


def main():
    ap = argparse.ArgumentParser(description="fault matrix (see the module docstring)")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--only", default="", help="comma-separated scenarios: " + ",".join(SCENARIOS))
    args = ap.parse_args()
    only = [x for x in args.only.split(",") if x] or SCENARIOS
    unknown = [x for x in only if x not in SCENARIOS]
    if unknown or args.trials < 1:
        ap.error("unknown scenario %s (known: %s)" % (",".join(unknown), ",".join(SCENARIOS))
                 if unknown else "--trials must be at least 1")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    random.seed(1)
    t0 = time.time()

    def log(msg):
        print("  " + msg, flush=True)

    tally = Tally(log)
    for name in only:
        ts = time.time()
        work = tempfile.mkdtemp(prefix="dte-faults-")
        if name == "disk-full":
            try:
                sc_disk_full(tally, args.trials, work, log)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            _report(tally, name, ts)
            continue
        netns = name == "link-cut"
        if netns and not csl.Netns.available():
            tally.fail("%s: cannot run: needs root and ip netns" % name)
            continue
        hooks = {}
        first = 3
        if name in HOOKED:
            # Receivers: sink1 for COUNTS/PAYLOAD, src for STAGED/APPLIED.
            hooks = {"sink1": "%s@%d/3" % (name, first), "src": "%s@%d/3" % (name, first)}
            if name == "corrupt-payload":
                hooks.pop("src")
        if name == "drop-plan":
            hooks = {"coord": DROP_PLAN_HOOK}
        if name == "skip-write":
            hooks = {"sink1": "skip-write@%d/3" % first}
        # corrupt-payload tests the sink's own payload checks (chunk xxh3,
        # element checksum), which a job with peer auth (the default) never
        # reaches: the part's MAC fails first and is refused as forged
        # (tests/system/peer_auth.py).  Its daemons run the job with
        # auth = off, as a fabric the operator trusts does.
        cl = Cluster(work, netns=netns, hooks=hooks,
                     debug=tuple(hooks) if name in HOOKED else (),
                     peer_conf="auth = off\n" if name == "corrupt-payload" else "")
        nfail = len(tally.failures)
        try:
            cl.start()
            v = 1
            for v in range(1, first):     # warm: dense, then sparse
                publish(cl, v, CLEAN_WAIT_S)
            v = first
            bad, _, det = check_sinks(cl, cl.sinks, "warm-up")
            bad += det
            if bad:
                tally.fail("%s: not exact before the faults: %s" % (name, bad[:2]))
            run = {"src-die-counts": sc_src_die("counts"), "src-die-payload": sc_src_die("payload"),
                   "sink-daemon-kill": sc_sink_daemon, "trainer-kill": sc_trainer_kill,
                   "sink-proc-kill": sc_sink_proc, "link-cut": sc_link_cut,
                   "coord-restart": sc_coord_restart, "drop-join": sc_drop_join,
                   "fixed-port-restart": sc_fixed_port_restart,
                   "drop-plan": sc_drop_plan, "forged-plan": sc_forged_plan,
                   "skip-write": sc_skip_write}.get(name)
            if run is None:
                run = sc_hooked(name)
            run(cl, tally, min(args.trials, TRIALS_MAX.get(name, args.trials)), v, log)
        except Exception as e:
            import traceback
            traceback.print_exc()
            tally.fail("%s: harness error: %s" % (name, e))
        finally:
            for problem in cl.close():
                tally.fail("%s: %s" % (name, problem))
            t = tally.per.get(name)
            keep = len(tally.failures) != nfail or not t or t["recovered"] != t["trials"] or \
                t["torn"] or t["wrong"]
            if keep:
                for d in cl.daemons.values():
                    print("--- %s log (tail) ---\n%s" % (d.name, d.log_tail(15)))
                print("  (work dir kept: %s)" % work)
            else:
                shutil.rmtree(work, ignore_errors=True)
        _report(tally, name, ts)
    tot = {k: tally.total(k) for k in Tally.KEYS}
    for name in only:
        t = tally.per.get(name)
        want = min(args.trials, TRIALS_MAX.get(name, args.trials))
        if not t or t["trials"] != want:
            tally.fail("%s: ran %d of %d trials" % (name, t["trials"] if t else 0, want))
    print("faults: %.0f s" % (time.time() - t0))
    print("faults: scenarios=%d trials=%d landed=%d effects=%d/%d torn=%d wrong=%d recovered=%d "
          "detected=%d" % (len(tally.per), tot["trials"], tot["landed"], tot["effects"],
                           tot["trials"], tot["torn"], tot["wrong"], tot["recovered"],
                           tot["detected"]), flush=True)
    good = (not tally.failures and tot["trials"] > 0 and tot["torn"] == 0 and
            tot["wrong"] == 0 and tot["landed"] == tot["trials"] and
            tot["effects"] == tot["landed"] and tot["detected"] == 0 and
            tot["recovered"] == tot["trials"] and len(tally.per) == len(only))
    if not good:
        print("faults: FAILED (%d problems besides the counts)" % len(tally.failures))
        for f in tally.failures:
            print("  - " + f)
    sys.exit(0 if good else 1)


def _report(tally, name, ts):
    t = tally.per.get(name)
    if t:
        print("fault %-17s trials=%d landed=%d effects=%d/%d torn=%d wrong=%d recovered=%d "
              "detected=%d (%.1fs)" % (name, t["trials"], t["landed"], t["effects"], t["trials"],
                                       t["torn"], t["wrong"], t["recovered"], t["detected"],
                                       time.time() - ts), flush=True)


if __name__ == "__main__":
    main()

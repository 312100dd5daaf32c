"""Fakes of SGLang 0.5.23 and vLLM 0.33.0 that call dte.integrations the way
the engines do (tests/system/engines.py drives them against real daemons).

Neither engine's weight-loading modules import on a CPU without most of
its server stack (sglang.srt.layers.linear pulls orjson, psutil, pybase64,
requests, triton, PIL, ...; vllm.model_executor.layers.linear pulls zmq,
pydantic, cbor2, transformers, aiohttp, openai_harmony, ...), so every
piece here is built from the upstream source, cited per piece:

SGLang
  * a TP worker is a process; its TP CPU group is a gloo group of the
    engine's workers (get_parallel().tp_group.cpu_group,
    sglang/srt/runtime_context.py), installed as a stub
    sglang.srt.runtime_context whose get_parallel() has the fields
    dte.integrations.sglang reads (tp_rank, tp_size, attn_tp_size,
    moe_ep_size, moe_dp_size, tp_group.cpu_group);
  * the target model's parameters: Qwen3ForCausalLM's names and per-rank
    shapes (models/qwen3.py; QKVParallelLinear: heads/tp, and one KV head
    replicated when tp >= kv heads; MergedColumnParallelLinear [gate; up];
    RowParallelLinear o_proj/down_proj; VocabParallelEmbedding and
    ParallelLMHead padded to a multiple of 64 and split evenly), the norms
    FP32 under --rl-on-policy-target (RMSNorm(weight_dtype=torch.float32));
    a draft model of class LlamaForCausalLMEagle3 (models/llama_eagle3.py);
  * SchedulerWeightUpdaterManager.update_weights_from_tensor: for each
    runner of _select_runners(selector) (target, then draft; older
    versions: draft first) WeightUpdater.update_weights_from_tensor, which
    calls dynamic_import(load_format)(model, named_tensors) when
    load_format is allow-listed (an exception is not caught: the worker
    dies), then flush_cache_after_weight_update, then a barrier on the TP
    CPU group; one answer per DP rank (rank 0's);
  * the scheduler's queues and radix cache (Scheduler.pause_generation
    modes in_place/retract, TokenizerManager.pause_generation abort,
    Scheduler.flush_cache: only when is_fully_idle(ignore_waiting=
    _engine_paused), begin/end_weight_update sessions), served over the
    HTTP endpoints of entrypoints/http_server.py and /v1/loads.
vLLM
  * WorkerWrapperBase.init_worker (v1/worker/worker_base.py) appends
    worker_extension_cls to the worker class's __bases__ after checking
    that no attribute conflicts; collective_rpc(method, timeout, args,
    kwargs) runs getattr(worker, method)(*args) on every worker and
    returns the results in rank order, raising TimeoutError when a worker
    does not answer in time; the worker's model is model_runner.get_model();
    TP rank/size from vllm.distributed.parallel_state (stubbed);
  * AsyncLLM.pause_generation(mode abort|wait|keep, clear_cache),
    resume_generation, reset_prefix_cache (v1/engine/async_llm.py,
    v1/engine/core.py pause_scheduler).
"""

import asyncio
import base64
import io
import json
import multiprocessing
import os
import sys
import threading
import time
import traceback
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.reduction import ForkingPickler

import torch

VOCAB_PAD = 64  # DEFAULT_VOCAB_PADDING_SIZE (vocab_parallel_embedding.py, both engines)


def target_shapes(cfg, tp, ep=1):
    """{name: (shape, is_norm)} of one TP rank of Qwen3ForCausalLM, or of
    Qwen3MoeForCausalLM when cfg has num_experts (every layer sparse):
    mlp.gate (ReplicatedLinear [E, H]) and FusedMoE's w13_weight
    [E/ep, 2*Im/mtp, H] and w2_weight [E/ep, H, Im/mtp], mtp = tp/ep
    (FusedMoE.create_weights via the quant method; vLLM's EP: ep = tp)."""
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nH, nKV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    q = nH // tp
    kv = 1 if tp >= nKV else nKV // tp  # QKVParallelLinear.__init__
    Vp = (V + VOCAB_PAD - 1) // VOCAB_PAD * VOCAB_PAD
    s = {"model.embed_tokens.weight": ((Vp // tp, H), False)}
    for n in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % n
        s[p + "input_layernorm.weight"] = ((H,), True)
        s[p + "self_attn.qkv_proj.weight"] = (((q + 2 * kv) * hd, H), False)
        s[p + "self_attn.o_proj.weight"] = ((H, q * hd), False)
        s[p + "self_attn.q_norm.weight"] = ((hd,), True)
        s[p + "self_attn.k_norm.weight"] = ((hd,), True)
        s[p + "post_attention_layernorm.weight"] = ((H,), True)
        if cfg.get("num_experts"):
            E, Im, mtp = cfg["num_experts"], cfg["moe_intermediate_size"], tp // ep
            s[p + "mlp.gate.weight"] = ((E, H), False)
            s[p + "mlp.experts.w13_weight"] = ((E // ep, 2 * Im // mtp, H), False)
            s[p + "mlp.experts.w2_weight"] = ((E // ep, H, Im // mtp), False)
            continue
        s[p + "mlp.gate_up_proj.weight"] = ((2 * I // tp, H), False)
        s[p + "mlp.down_proj.weight"] = ((H, I // tp), False)
    s["model.norm.weight"] = ((H,), True)
    if not cfg.get("tie_word_embeddings", False):
        s["lm_head.weight"] = ((Vp // tp, H), False)
    return s


def make_model(cls_name, shapes, fp32_norms, seed):
    cls = type(cls_name, (torch.nn.Module,), {})
    m = cls()
    g = torch.Generator().manual_seed(seed)
    for name, (shape, norm) in shapes.items():
        dt = torch.float32 if (norm and fp32_norms) else torch.bfloat16
        p = torch.nn.Parameter(torch.randn(shape, generator=g).to(dt), requires_grad=False)
        # nn.Module attribute names cannot hold dots: register flat, name as SGLang does.
        m._parameters[name] = p
    return m


def loaded_padding(model, cfg, tp, rank):
    """What the engine's startup load leaves in the padded vocab rows:
    VocabParallelEmbedding.weight_loader copies the rank's rows and
    fill_(0)s the rest (layers/vocab_parallel_embedding.py, both engines)."""
    V = cfg["vocab_size"]
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        p = dict(model.named_parameters()).get(name)
        if p is None:
            continue
        per = p.shape[0]
        start = rank * per
        if start + per > V:
            p.data[max(0, V - start):].fill_(0)
    return model


def draft_shapes(cfg):
    """LlamaForCausalLMEagle3 (models/llama_eagle3.py): one midlayer, fc, lm_head."""
    H = cfg["hidden_size"]
    return {"model.midlayer.self_attn.qkv_proj.weight": ((3 * H, 2 * H), False),
            "model.fc.weight": ((H, 3 * H), False),
            "lm_head.weight": ((64, H), False)}


def _module(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def pack(t):
    t = t.detach().contiguous()
    raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
    return (str(t.dtype), tuple(t.shape), raw.numpy().tobytes())


def unpack(p):
    dt, shape, raw = p
    if dt == "torch.bfloat16":
        return torch.frombuffer(bytearray(raw), dtype=torch.int16).view(shape).view(torch.bfloat16)
    return torch.frombuffer(bytearray(raw), dtype=torch.float32).view(shape)


# ---------------------------------------------------------------- SGLang worker

def sglang_worker(conn, rank, tp, cfg, fp32_norms, draft, init_file, attn_tp=None, ep=1):
    torch.set_num_threads(1)
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=tp)
    par = types.SimpleNamespace(tp_rank=rank, tp_size=tp, attn_tp_size=attn_tp or tp,
                                moe_ep_size=ep, moe_dp_size=1,
                                tp_group=types.SimpleNamespace(cpu_group=dist.group.WORLD))
    _module("sglang")
    _module("sglang.srt")
    _module("sglang.srt.runtime_context", get_parallel=lambda: par)
    import importlib
    shapes = target_shapes(cfg, tp, ep)
    target = loaded_padding(make_model("Qwen3ForCausalLM", shapes, fp32_norms, seed=100 + rank),
                            cfg, tp, rank)
    runners = [("target", target)]
    if draft:
        runners.append(("draft", make_model("LlamaForCausalLMEagle3", draft_shapes(cfg), False,
                                            seed=200 + rank)))
    draft_before = {n: p.detach().clone() for _r, m in runners[1:] for n, p in m.named_parameters()}
    # Observe every attach the loader attempts: a draft model's parameters
    # (model.fc.weight) must never be offered to a sink.
    from dte.integrations import _engine
    attempts = []
    orig_init = _engine.EngineSink.__init__

    def observed_init(self, named_params, *a, **kw):
        named_params = list(named_params)
        attempts.append(sorted(n for n, _p in named_params))
        return orig_init(self, named_params, *a, **kw)
    _engine.EngineSink.__init__ = observed_init
    custom_weight_loaders = ["dte.integrations.sglang.load"]  # --custom-weight-loader
    log = []

    def weight_updater(model, named_tensors, load_format):
        # WeightUpdater.update_weights_from_tensor
        if load_format in custom_weight_loaders:
            mod, fn = load_format.rsplit(".", 1)
            getattr(importlib.import_module(mod), fn)(model, named_tensors)
        elif load_format is None:
            model.load_weights(named_tensors)
        else:
            raise NotImplementedError("Unknown load_format=%s" % load_format)
        return True, "Success"

    while True:
        try:
            cmd, *args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if cmd == "update":
                payload, load_format, order = args
                named = ForkingPickler.loads(base64.b64decode(payload))
                roles = dict(runners)
                for role in order:
                    if role in roles:
                        ok, msg = weight_updater(roles[role], named, load_format)
                        log.append(role)
                dist.barrier(group=par.tp_group.cpu_group)
                conn.send(("ok", (True, "Success")))
            elif cmd == "weights":
                conn.send(("ok", {n: pack(p) for n, p in target.named_parameters()}))
            elif cmd == "draft_untouched":
                now = {n: p for _r, m in runners[1:] for n, p in m.named_parameters()}
                conn.send(("ok", all(torch.equal(draft_before[n].view(torch.int16),
                                                  now[n].detach().view(torch.int16))
                                     for n in draft_before) and
                           getattr(runners[-1][1], "_dte_sink", None) is None and
                           len(attempts) == 1 and "model.fc.weight" not in attempts[0]))
            elif cmd == "version":
                es = getattr(target, "_dte_sink", None)
                conn.send(("ok", es.version if es is not None else 0))
            elif cmd == "inject":
                _inject(args[0])
                conn.send(("ok", None))
            elif cmd == "stop":
                conn.send(("ok", None))
                return
            else:
                conn.send(("error", "unknown command %r" % cmd))
        except Exception as e:
            # An exception out of the loader kills SGLang's scheduler: so here.
            conn.send(("dead", "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc())))
            return


def _inject(what):
    """Make this worker fail its next stage (a worker that cannot apply)."""
    from dte.integrations import _engine
    orig = _engine.EngineSink.stage
    if what == "stage_raises":
        def stage(self, version, timeout_ms):
            _engine.EngineSink.stage = orig
            raise RuntimeError("injected: worker fails to stage version %d" % version)
    elif what.startswith("stage_hangs"):
        secs = float(what.split(":")[1])

        def stage(self, version, timeout_ms):
            _engine.EngineSink.stage = orig
            time.sleep(secs)
            raise RuntimeError("injected: worker hung for %.1fs" % secs)
    elif what == "commit_raises":
        orig_commit = _engine.EngineSink.commit

        def commit(self, version, timeout_ms):
            _engine.EngineSink.commit = orig_commit
            raise RuntimeError("injected: commit of version %d lost (daemon gone mid-apply)"
                               % version)
        _engine.EngineSink.commit = commit
        return
    else:
        raise ValueError(what)
    _engine.EngineSink.stage = stage


class Workers:
    """Worker processes of one engine, commands sent to all at once."""

    def __init__(self, target, n, args_of):
        ctx = multiprocessing.get_context("spawn")
        self.conns, self.procs = [], []
        for r in range(n):
            a, b = ctx.Pipe()
            p = ctx.Process(target=target, args=(b,) + args_of(r), daemon=True)
            p.start()
            b.close()
            self.conns.append(a)
            self.procs.append(p)
        self.dead = {}

    def send(self, r, *cmd):
        self.conns[r].send(cmd)

    def recv(self, r, timeout=None):
        if timeout is not None and not self.conns[r].poll(timeout):
            raise TimeoutError("worker %d did not answer in %.1fs" % (r, timeout))
        st, res = self.conns[r].recv()
        if st == "dead":
            self.dead[r] = res
            raise RuntimeError("worker %d died: %s" % (r, res))
        if st != "ok":
            raise RuntimeError("worker %d: %s" % (r, res))
        return res

    def all(self, *cmd, timeout=120):
        for r in range(len(self.conns)):
            self.send(r, *cmd)
        return [self.recv(r, timeout) for r in range(len(self.conns))]

    def stop(self):
        for r, c in enumerate(self.conns):
            try:
                if r not in self.dead:
                    c.send(("stop",))
                    c.poll(5) and c.recv()
            except (OSError, EOFError):
                pass
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join(5)


class FakeSGLangServer:
    """One SGLang engine: TP worker processes plus the scheduler state and
    HTTP endpoints the controller talks to."""

    def __init__(self, cfg, tp, tmp, label, fp32_norms=False, draft=False,
                 order=("target", "draft"), flush_ignores_paused_waiting=True, attn_tp=None,
                 sessions=True, ep=1):
        """sessions=False: an SGLang before 0.5.23's weight-update sessions
        (no begin/end_weight_update endpoints, no runner selector: every
        runner gets the call)."""
        self.tp, self.order, self.sessions = tp, list(order), sessions
        init = os.path.join(tmp, "gloo-%s" % label)
        self.workers = Workers(sglang_worker, tp, lambda r: (r, tp, cfg, fp32_norms, draft, init,
                                                             attn_tp, ep))
        self.flush_ignores_paused_waiting = flush_ignores_paused_waiting
        self.lock = threading.Lock()
        self.running, self.waiting = [], []   # requests: {"id", "prefix", "kv"}
        self.tree = {}                        # radix cache: prefix -> weights version of its KV
        self.is_pause = self.engine_paused = False
        self.session = None
        self.weights = 0                      # version the workers hold (rank 0 asks)
        self.served = []                      # (request id, KV version used, weights version)
        self.calls = []                       # endpoints hit, in order
        srv = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _reply(self, code, body):
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the controller gave up waiting (its timeout)

            def do_GET(self):
                code, body = srv.handle("GET", self.path, None)
                self._reply(code, body)

            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(n) or b"{}")
                code, body = srv.handle("POST", self.path, body)
                self._reply(code, body)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = "http://127.0.0.1:%d" % self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    # -- scheduler --
    def _is_fully_idle(self, ignore_waiting):
        return not self.running and (ignore_waiting or not self.waiting)

    def _flush(self):
        # Scheduler.flush_cache: is_fully_idle(ignore_waiting=self._engine_paused)
        # (0.5.23; older versions counted the waiting queue while paused too)
        ignore = self.engine_paused and self.flush_ignores_paused_waiting
        if self._is_fully_idle(ignore):
            self.tree.clear()
            return True
        return False

    def submit(self, rid, prefix, running):
        """A request whose prefix KV exists (computed with the current weights)."""
        with self.lock:
            req = {"id": rid, "prefix": prefix, "kv": self.weights}
            self.tree.setdefault(prefix, self.weights)
            (self.running if running else self.waiting).append(req)

    def run_until_idle(self):
        """Generation while not paused: waiting requests reuse the radix
        cache (their KV is whatever version it was computed with), running
        ones keep theirs; all finish."""
        with self.lock:
            if self.is_pause or self.engine_paused:
                return
            for req in self.waiting:
                req["kv"] = self.tree.setdefault(req["prefix"], self.weights)
                self.running.append(req)
            self.waiting = []
            for req in self.running:
                self.served.append((req["id"], req["kv"], self.weights))
            self.running = []

    def handle(self, method, path, body):
        with self.lock:
            self.calls.append(path.split("?")[0])
            return self._handle(method, path.split("?")[0], body)

    def _handle(self, method, path, body):
        if path == "/v1/loads":
            return 200, {"loads": [{"num_running_reqs": len(self.running),
                                    "num_waiting_reqs": len(self.waiting)}]}
        if path == "/server_info":
            return 200, {"tp_size": self.tp}
        if path == "/pause_generation":
            mode = body.get("mode", "abort")
            self.is_pause = True
            if mode == "abort":   # TokenizerManager: abort_request(abort_all=True)
                self.running, self.waiting = [], []
            elif mode == "retract":
                self.waiting = self.running + self.waiting
                self.running = []
                self.engine_paused = True
            elif mode == "in_place":
                self.engine_paused = True
            else:
                return 400, "bad mode"
            return 200, {"message": "Generation paused successfully.", "status": "ok"}
        if path == "/continue_generation":
            self.is_pause = self.engine_paused = False
            return 200, {"message": "Generation continued successfully.", "status": "ok"}
        if path == "/abort_request":
            if body.get("abort_all"):
                self.running, self.waiting = [], []
            return 200, ""
        if path == "/flush_cache":
            if self._flush():
                return 200, "Cache flushed.\n"
            return 400, "Flush cache failed.\n"
        if path in ("/begin_weight_update", "/end_weight_update") and not self.sessions:
            return 404, "not found"
        if path == "/begin_weight_update":
            if self.session is not None:
                return 400, {"success": False, "message": "a weight-update session is already open"}
            self.session = body.get("selector", "all")
            return 200, {"success": True, "message": "Success"}
        if path == "/end_weight_update":
            if self.session is None:
                return 400, {"success": False, "message": "no weight-update session is open"}
            self.session = None
            return 200, {"success": True, "message": "Success"}
        if path == "/update_weights_from_tensor":
            if self.session is None and self.sessions:
                return 400, {"success": False, "message": "update_weights_from_tensor must run "
                             "between begin_weight_update() and end_weight_update()"}
            sel = body.get("selector", "all") if self.sessions else "all"
            order = [r for r in self.order if sel == "all" or r == sel]
            payloads = body["serialized_named_tensors"]
            if len(payloads) != self.tp:
                return 400, {"success": False, "message": "one payload per TP rank"}
            for r in range(self.tp):
                self.workers.send(r, "update", payloads[r], body.get("load_format"), order)
            results = []
            for r in range(self.tp):
                try:
                    results.append(self.workers.recv(r, timeout=300))
                except Exception as e:
                    return 500, {"success": False, "message": str(e)}
            ok, msg = results[0]
            self.weights = self.workers.all("version")[0]
            if ok and body.get("flush_cache", True) and not self._flush():
                ok, msg = False, ("Weights were updated, but the cache was not flushed because "
                                  "requests are still running or queued. Retract or finish "
                                  "them, then call /flush_cache.")
            return 200 if ok else 400, {"success": ok, "message": msg}
        return 404, "not found"

    def stale_served(self):
        """Requests that ran on KV computed with other weights than those served."""
        return [s for s in self.served if s[1] != s[2]]

    def stop(self):
        self.http.shutdown()
        self.workers.stop()


class FakeEngine:
    """sglang.Engine (entrypoints/engine.py, 0.5.23) over a FakeSGLangServer's
    scheduler: begin/end_weight_update, update_weights_from_tensor (one
    serialized payload per TP rank, _serialize_tensors_per_rank; its
    request has no selector, so every runner gets the call: target, then
    draft), flush_cache returning FlushCacheReqOutput, and the
    TokenizerManager the controller pauses through (Engine has no pause
    wrapper)."""

    def __init__(self, srv):
        self.srv = srv
        self.loop = asyncio.new_event_loop()
        self.tokenizer_manager = _TokenizerManager(srv)

    def begin_weight_update(self, selector="all"):
        _c, body = self.srv.handle("POST", "/begin_weight_update", {"selector": selector})
        return body["success"], body["message"]

    def end_weight_update(self):
        _c, body = self.srv.handle("POST", "/end_weight_update", {})
        return body["success"], body["message"]

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        buf = io.BytesIO()
        ForkingPickler(buf).dump(named_tensors)
        payload = base64.b64encode(buf.getvalue()).decode()
        _c, body = self.srv.handle("POST", "/update_weights_from_tensor", {
            "serialized_named_tensors": [payload] * self.srv.tp, "load_format": load_format,
            "flush_cache": flush_cache})
        return body["success"], body["message"]

    def flush_cache(self):
        code, body = self.srv.handle("POST", "/flush_cache", {})
        return types.SimpleNamespace(success=code == 200, message=body)


class _TokenizerManager:
    def __init__(self, srv):
        self.srv = srv

    async def pause_generation(self, obj):
        self.srv.handle("POST", "/pause_generation", {"mode": obj.mode})

    async def continue_generation(self, obj):
        self.srv.handle("POST", "/continue_generation", {})

    async def get_loads(self, include=None, dp_rank=None):
        _c, body = self.srv.handle("GET", "/v1/loads", None)
        return [types.SimpleNamespace(**d) for d in body["loads"]]

    def abort_request(self, rid="", abort_all=False):
        self.srv.handle("POST", "/abort_request", {"abort_all": abort_all})


def install_io_struct():
    """sglang.srt.managers.io_struct's two pause requests (msgspec structs
    upstream: PauseGenerationReqInput(mode="abort"),
    ContinueGenerationReqInput(torch_empty_cache=True)), for the
    controller's Engine path in a process without SGLang."""
    class PauseGenerationReqInput:
        def __init__(self, mode="abort"):
            self.mode = mode

    class ContinueGenerationReqInput:
        def __init__(self, torch_empty_cache=True):
            self.torch_empty_cache = torch_empty_cache
    for name in ("sglang", "sglang.srt", "sglang.srt.managers"):
        sys.modules.setdefault(name, types.ModuleType(name))
    _module("sglang.srt.managers.io_struct", PauseGenerationReqInput=PauseGenerationReqInput,
            ContinueGenerationReqInput=ContinueGenerationReqInput)


# ---------------------------------------------------------------- vLLM worker

class Worker:
    """vLLM's GPU worker, for what the extension touches."""

    def __init__(self, rank, model, vllm_config):
        self.rank = rank
        self.vllm_config = vllm_config
        self.model_runner = types.SimpleNamespace(model=model, get_model=lambda: model)


def vllm_moe_name(name):
    """Where vLLM's model holds an expert tensor SGLang's holds at
    mlp.experts.w13_weight: MoERunner (model_executor/layers/fused_moe/
    runner/moe_runner.py) keeps the weights in its child routed_experts
    (a RoutedExperts), so vLLM 0.33's named_parameters() says
    mlp.experts.routed_experts.w13_weight."""
    head, _, leaf = name.rpartition(".")
    return head + ".routed_experts." + leaf if head.endswith(".mlp.experts") else name


def vllm_experts(model):
    """The expert tensors moved under the module structure vLLM has:
    mlp.experts is a module (MoERunner) whose child routed_experts holds
    w13_weight and w2_weight."""
    for name in [n for n in list(model._parameters) if vllm_moe_name(n) != n]:
        head, _, leaf = name.rpartition(".")
        runner = model._modules.get(head)
        if runner is None:
            runner = type("MoERunner", (torch.nn.Module,), {})()
            runner.routed_experts = type("RoutedExperts", (torch.nn.Module,), {})()
            model._modules[head] = runner
        runner.routed_experts._parameters[leaf] = model._parameters.pop(name)
    return model


def vllm_worker(conn, rank, tp, cfg, dp_rank, ext_qualname, ep=False):
    torch.set_num_threads(1)
    _module("vllm")
    _module("vllm.distributed")
    _module("vllm.distributed.parallel_state",
            get_tensor_model_parallel_rank=lambda: rank,
            get_tensor_model_parallel_world_size=lambda: tp)
    import importlib
    mod, name = ext_qualname.rsplit(".", 1)
    ext = getattr(importlib.import_module(mod), name)
    worker_class = type("Worker", (Worker,), {})
    # WorkerWrapperBase.init_worker
    if ext not in worker_class.__bases__:
        for attr in dir(ext):
            if attr.startswith("__"):
                continue
            assert not hasattr(worker_class, attr), "conflict: %s" % attr
        worker_class.__bases__ = worker_class.__bases__ + (ext,)
    pc = types.SimpleNamespace(tensor_parallel_size=tp, data_parallel_size=1,
                               data_parallel_rank=dp_rank, enable_expert_parallel=ep,
                               worker_extension_cls=ext_qualname)
    model = vllm_experts(loaded_padding(make_model(
        "Qwen3ForCausalLM", target_shapes(cfg, tp, tp if ep else 1), False, seed=300 + rank),
        cfg, tp, rank))
    w = worker_class(rank, model, types.SimpleNamespace(parallel_config=pc))
    while True:
        try:
            cmd, *args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if cmd == "rpc":
                method, a, kw = args
                conn.send(("ok", getattr(w, method)(*a, **(kw or {}))))
            elif cmd == "weights":
                conn.send(("ok", {n: pack(p) for n, p in model.named_parameters()}))
            elif cmd == "inject":
                _inject(args[0])
                conn.send(("ok", None))
            elif cmd == "stop":
                conn.send(("ok", None))
                return
        except Exception as e:
            conn.send(("error", "%s: %s" % (type(e).__name__, e)))


class FakeLLM:
    """vllm.LLM: collective_rpc over worker processes, reset_prefix_cache."""

    EXT = "dte.integrations.vllm.DteWorkerExtension"

    def __init__(self, cfg, tp, dp_rank=0, ep=False):
        self.tp = tp
        self.workers = Workers(vllm_worker, tp, lambda r: (r, tp, cfg, dp_rank, self.EXT, ep))
        self.rpcs = []
        self.prefix_resets = 0
        self._pending = [0] * tp   # answers still owed by a worker after a timeout

    def _drain(self):
        for r, n in enumerate(self._pending):
            while n:
                self.workers.recv(r)
                n -= 1
            self._pending[r] = 0

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self._drain()
        self.rpcs.append(method)
        for r in range(self.tp):
            self.workers.send(r, "rpc", method, tuple(args), kwargs)
        out = []
        t_end = None if timeout is None else time.monotonic() + timeout
        for r in range(self.tp):
            left = None if t_end is None else max(0.0, t_end - time.monotonic())
            if left is not None and not self.workers.conns[r].poll(left):
                for q in range(r, self.tp):
                    self._pending[q] += 1
                raise TimeoutError("RPC call to %s timed out." % method)
            out.append(self.workers.recv(r))
        return out

    def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        self.prefix_resets += 1
        return True

    def weights(self):
        return [{n: unpack(p) for n, p in d.items()} for d in self.workers.all("weights")]

    def stop(self):
        try:
            self._drain()
        except Exception:
            pass
        self.workers.stop()


class FakeAsyncLLM(FakeLLM):
    """vllm.v1.engine.async_llm.AsyncLLM: async collective_rpc, pause modes."""

    def __init__(self, cfg, tp, dp_rank=0):
        super().__init__(cfg, tp, dp_rank)
        self.paused = False
        self.in_flight = []     # (id, weights version its KV was computed with)
        self.served = []        # (id, KV version, weights version at the time)
        self.weights_version = 0
        self.pauses = []

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        out = await asyncio.get_running_loop().run_in_executor(
            None, lambda: FakeLLM.collective_rpc(self, method, timeout, args, kwargs))
        if method == "dte_apply" and args[1] == "commit" and all(r.get("ok") for r in out):
            self.weights_version = int(args[0])
        return out

    async def pause_generation(self, *, mode="abort", clear_cache=True):
        if mode not in ("abort", "wait", "keep"):
            raise ValueError("Invalid pause mode: %s" % mode)
        self.pauses.append((mode, clear_cache))
        if mode == "abort":
            self.in_flight = []
        elif mode == "wait":   # drain: they finish on the weights they started with
            for rid, kv in self.in_flight:
                self.served.append((rid, kv, self.weights_version))
            self.in_flight = []
        self.paused = True

    async def resume_generation(self):
        self.paused = False

    async def is_paused(self):
        return self.paused

    async def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        self.prefix_resets += 1
        return not self.in_flight

    def submit(self, rid):
        self.in_flight.append((rid, self.weights_version))

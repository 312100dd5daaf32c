#!/usr/bin/python3
"""Megatron-Core's optimizer memory as it really is, into an SGLang sink.

For Qwen3-8B, Qwen3-30B-A3B and Llama-3.1-8B structures at small dims,
several TP/DP/EP layouts, every rank of a trainer is modelled on the CPU
from upstream facts (tests/system/mcore_cpu.py: buckets of a small bucket
size, 64-element start padding, lcm(dp, 128) bucket padding, one FP32
allocation per shard, FusedAdam-style state and param groups with a
decoupled lr, experts in the dense buffer (ep=1) or their own (ep>1, a
ChainedOptimizer), both MoE namings, a padded vocab that is not
config.json's).  megatron-core's own _ParamAndGradBuffer layout and
DistributedOptimizer._build_model_gbuf_range (the upstream venv) produce the
shard ranges, checked against the model; where megatron-core does not
import the test prints SKIP and exits 77 (a skip is never a pass).  Each rank attaches
with Source.megatron_core (layout mcore:, registered shards).  After every
version every sink element must equal RNE(θ_t), θ_t gathered from the
shards and converted to canonical space by index maps built with plain
torch ops (the HF -> Megatron direction, here) and the sink by
layout_reference.py's converter.

Without the distributed optimizer (Float16OptimizerWithFloat16Params) every
DP replica holds whole FP32 copies and the source takes the first replica:
of dense params the ranks of DP rank 0, of experts those of the first
expert-data-parallel group (ep > 1, dp > 1: the two differ).

moe-unrouted: an MoE run where some experts get no tokens on some steps
(grad None; TE FusedAdam and torch AdamW skip them): exact, and no version
after the first goes dense.

Prints `real-trainers: configs=N exact=N/N` and `moe-unrouted: versions=N exact=N/N`.
"""

import json
import os
import sys
import tempfile
import time
import zlib

VENV_PY = os.environ.get("DTE_UPSTREAM_PYTHON", "/opt/dted-venv/bin/python")
VENV = os.path.dirname(os.path.dirname(VENV_PY))
if __name__ == "__main__" and os.path.realpath(sys.prefix) != os.path.realpath(VENV) \
        and os.access(VENV_PY, os.X_OK) and not os.environ.get("DTE_MCORE_NO_VENV"):
    os.execv(VENV_PY, [VENV_PY] + sys.argv)


def skip_without_megatron_core():
    """Without megatron-core (or torch) the shard ranges would be this
    test's own model of its layout only: nothing upstream checked, so it
    skips (77), never passes."""
    try:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBuffer  # noqa
            from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer  # noqa
    except Exception as e:  # noqa: BLE001 - any failure to import is a skip
        print("SKIP: megatron-core does not import in %s (%s: %s; DTE_UPSTREAM_PYTHON, default "
              "%s)" % (sys.executable, type(e).__name__, e, VENV_PY), flush=True)
        sys.exit(77)


if __name__ == "__main__":
    skip_without_megatron_core()

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

import torch  # noqa: E402

import mcore_cpu as mc  # noqa: E402
import trainers_lib as tl  # noqa: E402

MODELS = os.path.join(HERE, "..", "data", "layout", "models")
VERSIONS = 3
BUCKET = 3000            # elements: several buckets per buffer
GROUP_HP = [  # decay, no decay, decoupled lr (embedding/output), lr multiplier 0.5 (router)
    dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1),
    dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0),
    dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1),
    dict(lr=5e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1),
]

SMALL = {
    "qwen3-8b.json": dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2,
                          head_dim=16, intermediate_size=96, num_hidden_layers=2, vocab_size=300),
    "llama-3.1-8b.json": dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2,
                              head_dim=8, intermediate_size=96, num_hidden_layers=2,
                              vocab_size=300),
    "qwen3-30b-a3b.json": dict(hidden_size=64, num_attention_heads=16, num_key_value_heads=2,
                               head_dim=8, intermediate_size=96, moe_intermediate_size=16,
                               num_experts=8, num_experts_per_tok=2, num_hidden_layers=2,
                               vocab_size=300),
    "qwen3-30b-a3b.json+kv4": dict(hidden_size=64, num_attention_heads=16, num_key_value_heads=4,
                                   head_dim=8, intermediate_size=96, moe_intermediate_size=16,
                                   num_experts=8, num_experts_per_tok=2, num_hidden_layers=2,
                                   vocab_size=300),
}

# (model, tp, dp, ep, etp, MoE naming, padded vocab per TP rank or None, inner optimizer,
#  distributed optimizer, sink tp, sink ep)
CONFIGS = [
    ("qwen3-8b.json", 1, 1, 1, None, None, None, "fused", True, 2, 1),
    ("qwen3-8b.json", 2, 2, 1, None, None, None, "fused", True, 2, 1),
    ("qwen3-8b.json", 2, 4, 1, None, None, 192, "fused", True, 4, 1),
    ("qwen3-8b.json", 1, 4, 1, None, None, None, "torch", True, 2, 1),
    ("llama-3.1-8b.json", 2, 1, 1, None, None, None, "fused", True, 2, 1),
    ("llama-3.1-8b.json", 2, 2, 1, None, None, 160, "fused", True, 1, 1),
    ("llama-3.1-8b.json", 1, 4, 1, None, None, None, "fused", False, 2, 1),
    # Experts without the distributed optimizer: the expert replicas are
    # the expert-data-parallel groups (rank // (ep * etp)), not DP.
    ("qwen3-30b-a3b.json", 1, 4, 2, None, "grouped", None, "fused", False, 2, 2),
    ("qwen3-30b-a3b.json", 2, 2, 2, None, "sequential", None, "torch", False, 2, 1),
    ("qwen3-30b-a3b.json", 2, 2, 1, None, "sequential", None, "fused", True, 2, 1),
    ("qwen3-30b-a3b.json", 2, 2, 2, None, "grouped", None, "fused", True, 2, 2),
    ("qwen3-30b-a3b.json", 1, 4, 2, None, "grouped", 320, "fused", True, 2, 1),
    ("qwen3-30b-a3b.json", 1, 2, 2, None, "sequential", None, "torch", True, 2, 2),
    ("qwen3-30b-a3b.json", 2, 4, 2, 1, "grouped", None, "fused", True, 4, 2),
    # Qwen3-30B-A3B's 4 KV heads at TP=8: two ranks share each query group.
    ("qwen3-30b-a3b.json+kv4", 8, 1, 1, None, "sequential", None, "fused", True, 8, 1),
]


def grad_for(name, step, numel):
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()) * 1009 + step)
    x = torch.randn(numel, generator=g) * 1e-3
    heavy = torch.rand(numel, generator=g) < 0.02
    return torch.where(heavy, x * 20, x)


class Rank:
    """One Megatron rank: model params (BF16), its optimizer(s), index maps."""

    def __init__(self, cfg, w_idx, w_init, tp, dp, ep, etp, rank, naming, vp, inner, dist,
                 use_upstream, checks, aware=None):
        self.rank = rank
        t, d = rank % tp, rank // tp
        eg = rank % (ep * etp)
        self.tp_idx = t
        edp, e_idx = tp * dp // (ep * etp), rank // (ep * etp)
        dense, experts = mc.local_params(cfg, w_idx, tp, t, vp, eg // etp, ep, eg % etp, etp,
                                         naming or "grouped")
        self.index = dict(dense + experts)
        self.experts = {name for name, _ in experts}
        self.eg = ep * etp              # ranks per expert-data-parallel replica
        flat_init = w_init
        self.params = {}
        for name, idx in dense + experts:
            v = torch.where(idx >= 0, flat_init[idx.clamp(min=0).long()], torch.zeros(()))
            self.params[name] = torch.nn.Parameter(v.to(torch.bfloat16))
        self.module = mc.module_of(self.params)
        if aware:
            def inner_cls(groups):
                return mc.FusedAdamCPU(groups, master_weights=True, use_decoupled_grad=True,
                                       store_param_remainders=aware == "remainders")
        elif inner == "fused":
            inner_cls = mc.FusedAdamCPU
        else:
            def inner_cls(groups):
                return torch.optim.AdamW(groups, foreach=False)
        groups_of = {n: mc.param_group_index(n, n in dict(experts)) for n in self.params}
        if not dist:
            self.opt = CpuFloat16Opt(self.params, groups_of, inner_cls)
            return
        bufs = [(dense + experts, dp, d)] if ep == 1 else [(dense, dp, d), (experts, edp, e_idx)]
        opts = []
        for plist, n, di in bufs:
            if not plist:
                continue
            numels = [(name, x.numel()) for name, x in plist]
            index, buckets = mc.buffer_layout(numels, n, BUCKET)
            ranges = mc.shard_ranges(index, buckets, n, di)
            if use_upstream:
                up, _uidx, _ub = mc.upstream_layout(numels, n, di, BUCKET)
                same = {k: (r.start, r.end) for k, r in up.items()} == \
                    {k: (r.start, r.end) for k, r in ranges.items()}
                checks["upstream_agree"] = checks.get("upstream_agree", True) and same
                ranges = up
            opts.append(mc.CpuDistOpt({nm: self.params[nm] for nm, _ in plist}, ranges,
                                      groups_of, inner_cls, GROUP_HP, aware=bool(aware)))
        self.opt = opts[0] if len(opts) == 1 else mc.CpuChained(opts)

    def shards(self):
        """[(name, lo, hi, the tensor the optimizer steps, its FP32 values)]."""
        out = []
        for o in getattr(self.opt, "chained_optimizers", [self.opt]):
            if isinstance(o, CpuFloat16Opt):
                for name, main in o.main_of.items():
                    out.append((name, 0, main.numel(), main, main))
                continue
            for name, key in o.main_of.items():
                r = o._get_model_param_range_map(self.params[name])["param"]
                out.append((name, r.start, r.end, key, o.master(name)))
        return out

    def mains(self):
        return [(n, lo, hi, theta) for n, lo, hi, _k, theta in self.shards()]

    def inner_optimizers(self):
        return [o.optimizer for o in getattr(self.opt, "chained_optimizers", [self.opt])]


class CpuFloat16Opt:
    """Float16OptimizerWithFloat16Params (optimizer.py): whole FP32 copies of
    the BF16 params (float16_groups / fp32_from_float16_groups)."""

    def __init__(self, params, groups_of, inner_cls):
        n = max(groups_of.values()) + 1
        self.float16_groups = [[] for _ in range(n)]
        self.fp32_from_float16_groups = [[] for _ in range(n)]
        self.fp32_from_fp32_groups = [[] for _ in range(n)]
        self.main_of = {}
        for name, p in params.items():
            main = p.detach().clone().float()
            gi = groups_of[name]
            self.float16_groups[gi].append(p)
            self.fp32_from_float16_groups[gi].append(main)
            self.main_of[name] = main
        groups = []
        for gi in range(n):
            d = dict(GROUP_HP[gi])
            d["params"] = list(self.fp32_from_float16_groups[gi])
            groups.append(d)
        self.optimizer = inner_cls(groups)

    def step(self):
        self.optimizer.step()


def canonical(cfg, ranks, w_idx, total, tp=1, dist=True):
    """θ in canonical space (flat float32), from every rank's shards; the
    replicated copies of TP rank 0 (and their equality elsewhere)."""
    out = torch.full((total,), float("nan"), dtype=torch.float32)
    seen = torch.zeros(total, dtype=torch.int32)
    replicas = {}
    for rk in ranks:
        for name, lo, hi, main in rk.mains():
            idx = rk.index[name].reshape(-1)[lo:hi]
            main = main.reshape(-1)
            if not dist:
                # Whole copies on every DP replica: identical, DP rank 0's
                # counts; of experts, every expert-DP replica's (the ranks
                # rank % (ep * etp) hold the same experts), the first's count.
                if name in rk.experts:
                    key, first = ("edp", rk.rank % rk.eg, name), rk.rank // rk.eg == 0
                else:
                    key, first = ("dp", rk.tp_idx, name), rk.rank // tp == 0
                prev = replicas.setdefault(key, main)
                if not torch.equal(prev.view(torch.int32), main.view(torch.int32)):
                    raise AssertionError("%s differs across DP replicas" % name)
                if not first:
                    continue
            if mc.replicated(name):
                key = (name, lo, hi)
                prev = replicas.setdefault(key, main)
                if not torch.equal(prev.view(torch.int32), main.view(torch.int32)):
                    raise AssertionError("replicated %s differs across TP ranks" % name)
                if rk.tp_idx != 0:
                    continue
            keep = idx >= 0
            out[idx[keep].long()] = main[keep]
            seen[idx[keep].long()] += 1
    if not bool((seen == 1).all()):
        raise AssertionError("canonical elements covered %s times" % sorted(set(seen.tolist())))
    hf, base = {}, 0
    for name, t in w_idx.items():
        n = t.numel()
        hf[name] = out[base:base + n].reshape(t.shape)
        base += n
    return hf


def run_config(ref, sock, cfg, model, tp, dp, ep, etp, naming, vp_local, inner, dist, sink_tp,
               sink_ep, job, versions, unrouted=False, aware=None, every=1, route=None):
    from dte import sink as dsink
    from dte.source import Source
    etp = etp or tp
    cfg_text = json.dumps(cfg)
    w_idx = ref.hf_weights(cfg)
    total = sum(t.numel() for t in w_idx.values())
    w_init = (torch.randn(total, generator=torch.Generator().manual_seed(7)) * 0.02)
    V = cfg["vocab_size"]
    # Megatron pads config.json's vocab to 128 * TP unless the tokenizer or
    # --padded-vocab-size says otherwise (vp_local rows per TP rank).
    vp = vp_local * tp if vp_local else -(-V // (128 * tp)) * 128 * tp
    checks = {}
    ranks = [Rank(cfg, w_idx, w_init, tp, dp, ep, etp, r, naming, vp, inner, dist,
                  mc.upstream_available(), checks, aware) for r in range(tp * dp)]
    arenas = tl.SglangSinkArenas(cfg_text, sink_tp, sink_ep, label=job + "-sink")
    srcs = []
    sink = None
    res = {"versions": 0, "exact": 0, "dense_after_first": 0, "unstepped": 0,
           "upstream": checks.get("upstream_agree"), "bad": []}
    try:
        for rk in ranks:
            # route(rank) -> (socket, coordinator): ranks on other daemons.
            rsock, coord = route(rk.rank) if route else (sock, "local")
            srcs.append(Source.megatron_core([rk.module], rk.opt, rsock, job, "tok", cfg_text, tp,
                                             dp, rk.rank, ep=ep, etp=None if etp == tp else etp,
                                             coordinator=coord, label=job))
        sink = dsink.Sink(sock, job, "tok", cfg_text, arenas.layout)
        arenas.attach(sink)
        for step in range(versions * every):
            skipped = set()
            for rk in ranks:
                for inner_opt in rk.inner_optimizers():
                    for gi, g in enumerate(inner_opt.param_groups):
                        # The scheduler's lr for this step, set before it.
                        g["lr"] = GROUP_HP[gi]["lr"] * min(1.0, (step + 1) / 2.0)
                for name, lo, hi, key, _theta in rk.shards():
                    g = grad_for(name, step, rk.params[name].numel())[lo:hi].clone()
                    if unrouted and ".mlp.experts." in name \
                            and (zlib.crc32(name.encode()) + step) % 3 == 0:
                        g = None                  # no token reached this expert
                        skipped.add(name)
                    if aware:
                        key.decoupled_grad = g    # FP32 grads beside BF16 params
                    else:
                        key.grad = None if g is None else g.view_as(key)
                rk.opt.step()
            res["unstepped"] += len(skipped)
            if (step + 1) % every:
                # Publishing every K > 1 steps: mark the steps between.
                for s in srcs:
                    s.mark()
                continue
            v = (step + 1) // every
            info = [s.publish(v) for s in srcs]
            sink.apply(v, timeout_ms=60000)
            res["versions"] += 1
            if v > 1 and any(i["dense"] for i in info):
                res["dense_after_first"] += 1
            hf = canonical(cfg, ranks, w_idx, total, tp, dist)
            bad, n = tl.sink_mismatches(ref, cfg, arenas, hf, sink_tp, sink_ep)
            if bad == 0 and n > 0:
                res["exact"] += 1
            else:
                res["bad"].append("v%d: %d of %d differ" % (v, bad, n))
    finally:
        if sink is not None:
            sink.close()
        for s in srcs:
            s.close()
        arenas.close()
    res["upstream"] = checks.get("upstream_agree")
    return res


def main():
    harness.asan_reexec()
    skip_without_megatron_core()
    ref = tl.layout_reference()
    tmp = tempfile.mkdtemp(prefix="dte-mcore-")
    # Every version after the first must go sparse: this checks the
    # inversion and the sparse path for each layout, so dted may not pick
    # dense for cost (sync_mode = auto would, on these small models at
    # training learning rates; tests/system/sync_mode.py covers that).
    daemon = harness.Daemon(tmp, "mcore", sync_mode="sparse")
    sock = daemon.sock
    ok = True
    n = exact = 0
    try:
        daemon.start()
        for i, (model, tp, dp, ep, etp, naming, vpl, inner, dist, stp, sep) in enumerate(CONFIGS):
            cfg = tl.load_cfg(os.path.join(MODELS, model.split("+")[0]), **SMALL[model])
            t0 = time.time()
            desc = "%s tp=%d dp=%d ep=%d%s%s%s %s%s -> sglang:tp=%d,ep=%d" % (
                model, tp, dp, ep, ",etp=%d" % etp if etp else "", " " + naming if naming else "",
                " vocab/rank=%d" % vpl if vpl else "", inner, "" if dist else " non-distributed",
                stp, sep)
            try:
                r = run_config(ref, sock, cfg, model, tp, dp, ep, etp, naming, vpl, inner, dist,
                               stp, sep, "mcore-%d" % i, VERSIONS)
                # Every config that shards goes through megatron-core's own ranges.
                good = r["exact"] == r["versions"] == VERSIONS and not r["dense_after_first"] \
                    and r["upstream"] is not False and (r["upstream"] or not dist)
                why = "; ".join(r["bad"][:2])
            except Exception as e:   # noqa: BLE001 - reported as this config's failure
                good, why, r = False, "%s: %s" % (type(e).__name__, e), {}
            n += 1
            exact += good
            ok &= good
            print("%s %s: versions=%s exact=%s upstream_ranges=%s (%.1fs)%s" % (
                "ok  " if good else "FAIL", desc, r.get("versions"), r.get("exact"),
                {True: "agree", False: "DIFFER", None: "n/a"}[r.get("upstream")],
                time.time() - t0, "" if good else " " + why))
        print("real-trainers: configs=%d exact=%d/%d upstream=megatron-core" % (n, exact, n))
        # Unrouted experts.
        uv = ue = 0
        for j, (inner, every) in enumerate((("fused", 1), ("torch", 1), ("torch", 2))):
            cfg = tl.load_cfg(os.path.join(MODELS, "qwen3-30b-a3b.json"),
                              **SMALL["qwen3-30b-a3b.json"])
            r = run_config(ref, sock, cfg, "qwen3-30b-a3b.json", 2, 2, 2, None, "grouped", None,
                           inner, True, 2, 2, "unrouted-%d" % j, 6 // every, unrouted=True,
                           every=every)
            good = r["exact"] == r["versions"] and not r["dense_after_first"] and r["unstepped"]
            ok &= bool(good)
            uv += r["versions"]
            ue += r["exact"]
            print("%s unrouted %s publish every %d: versions=%d exact=%d unstepped_shards=%d "
                  "dense_after_first=%d%s"
                  % ("ok  " if good else "FAIL", inner, every, r["versions"], r["exact"],
                     r["unstepped"], r["dense_after_first"],
                     "" if good else " " + "; ".join(r["bad"][:2])))
        print("moe-unrouted: versions=%d exact=%d/%d" % (uv, ue, uv))
        # Two daemons: half the ranks on a member daemon, whose JOIN carries
        # their shard tables to the coordinator (the sink's daemon) over UCX.
        from cluster_sync_lib import Daemon
        member = coordd = None
        try:
            # sparse after the first version is checked: no dense for cost
            coordd = Daemon(tmp, "mc-coord", sync_mode="sparse").start()
            member = Daemon(tmp, "mc-member", sync_mode="sparse").start()
            cfg = tl.load_cfg(os.path.join(MODELS, "qwen3-30b-a3b.json"),
                              **SMALL["qwen3-30b-a3b.json"])

            def route(rank):
                return (coordd.sock, "local") if rank < 2 else (member.sock, coordd.address)
            r = run_config(ref, coordd.sock, cfg, "qwen3-30b-a3b.json", 2, 2, 2, None, "grouped",
                           None, "fused", True, 2, 2, "two-daemons", VERSIONS, unrouted=True,
                           route=route)
            good = r["exact"] == r["versions"] == VERSIONS and not r["dense_after_first"]
        except Exception as e:  # noqa: BLE001
            good, r = False, {"versions": 0, "exact": 0, "bad": ["%s: %s" % (type(e).__name__, e)]}
        finally:
            for d in (member, coordd):
                if d is not None:
                    d.stop()
        ok &= bool(good)
        print("two-daemons: versions=%d exact=%d/%d%s" % (r["versions"], r["exact"], r["versions"],
                                                          "" if good else " " + "; ".join(r["bad"][:2])))
        # Precision-aware optimizer: FusedAdam holds the FP32 masters
        # (master_param) of BF16 shards: supported; with
        # store_param_remainders there is no FP32 master: refused by name.
        cfg = tl.load_cfg(os.path.join(MODELS, "qwen3-8b.json"), **SMALL["qwen3-8b.json"])
        r = run_config(ref, sock, cfg, "qwen3-8b.json", 2, 2, 1, None, None, None, "fused", True,
                       2, 1, "aware", VERSIONS, aware="master")
        good = r["exact"] == r["versions"] == VERSIONS and not r["dense_after_first"]
        ok &= bool(good)
        try:
            run_config(ref, sock, cfg, "qwen3-8b.json", 2, 2, 1, None, None, None, "fused", True,
                       2, 1, "remainders", 1, aware="remainders")
            refused = "no"
        except Exception as e:  # noqa: BLE001
            refused = "yes" if "store_param_remainders" in str(e) else str(e)
        ok &= refused == "yes"
        print("precision-aware: fp32_master versions=%d exact=%d/%d remainders_refused=%s" % (
            r["versions"], r["exact"], r["versions"], refused))
    finally:
        daemon.stop(30)
    if not ok:
        sys.stderr.write(daemon.log_text()[-3000:])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

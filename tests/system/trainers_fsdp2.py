#!/usr/bin/python3
"""Real FSDP2 into an SGLang-layout sink, exact after every version.

torch 2.x FSDP2 (torch.distributed.fsdp.fully_shard, one group per decoder
layer and one for the rest) on a gloo process group of several CPU ranks
(spawned processes), a Qwen3-structured model under HF names, real torch.optim.AdamW in its foreach and fused forms.
Every rank attaches its local DTensor shards and AdamW states with
Source.fsdp2 (layout fsdp2:dp=N, registered shards); rank 0 also holds an
SGLang-layout TP=2 sink.  After every step all ranks publish; rank 0
applies and compares every sink element with RNE(θ) of the full FP32
parameters (DTensor.full_tensor) converted by layout_reference.py's plain
HF -> SGLang converter.  Some steps drop some tensors' gradients (grad None,
as for a frozen module or an expert no token reached): those tensors do not
step, keep their own step count, and the version is still exact and sparse.

Runs with the upstream venv (/opt/dted-venv/bin/python, torch 2.13 CPU);
skips where that interpreter or FSDP2 is missing.
"""

import json
import os
import sys
import tempfile
import time

VENV_PY = os.environ.get("DTE_UPSTREAM_PYTHON", "/opt/dted-venv/bin/python")
VENV = os.path.dirname(os.path.dirname(VENV_PY))
if __name__ == "__main__" and os.path.realpath(sys.prefix) != os.path.realpath(VENV) \
        and not os.environ.get("DTE_FSDP2_CHILD"):
    if not os.access(VENV_PY, os.X_OK):
        print("SKIP: %s (torch 2.x with FSDP2) is not installed; scripts/install-deps.sh" % VENV_PY)
        sys.exit(77)
    os.execv(VENV_PY, [VENV_PY] + sys.argv)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import torch  # noqa: E402

STEPS = 6
LR = 2e-3
SINK_TP = 2


def hf_model(cfg, seed):
    """nn.Module tree whose named_parameters() are the HF names."""
    from dte import qwen3
    nn = torch.nn
    w = qwen3.init_hf_weights(cfg, seed=seed, norm_jitter=0.1)

    class Node(nn.Module):
        pass

    root = Node()
    for name, t in w.items():
        mod = root
        parts = name.split(".")
        for p in parts[:-1]:
            if not hasattr(mod, p):
                mod.add_module(p, Node())
            mod = getattr(mod, p)
        mod.register_parameter(parts[-1], nn.Parameter(t.clone().float()))

    eps, hd = cfg["rms_norm_eps"], cfg["head_dim"]
    nH, nKV = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def layer_forward(layer):
        # One decoder layer reading its own parameters, so a fully_shard on
        # the layer all-gathers them around this call (HF Qwen3DecoderLayer).
        def fwd(x, cos, sin):
            a, m = layer.self_attn, layer.mlp
            B, T = x.shape[0], x.shape[1]
            y = qwen3.rms_norm(x, layer.input_layernorm.weight, eps)
            q = (y @ a.q_proj.weight.T).view(B, T, nH, hd)
            k = (y @ a.k_proj.weight.T).view(B, T, nKV, hd)
            v = (y @ a.v_proj.weight.T).view(B, T, nKV, hd)
            o = qwen3.attention_heads(q, k, v, a.q_norm.weight, a.k_norm.weight, cos, sin, eps)
            x = x + o @ a.o_proj.weight.T
            y = qwen3.rms_norm(x, layer.post_attention_layernorm.weight, eps)
            h = torch.nn.functional.silu(y @ m.gate_proj.weight.T) * (y @ m.up_proj.weight.T)
            return x + h @ m.down_proj.weight.T
        return fwd

    for i in range(cfg["num_hidden_layers"]):
        getattr(root.model.layers, str(i)).forward = layer_forward(getattr(root.model.layers, str(i)))

    def forward(tokens):
        T = tokens.shape[1]
        cos, sin = qwen3.rope_tables(T, hd, cfg["rope_theta"])
        x = root.model.embed_tokens.weight[tokens]
        for i in range(cfg["num_hidden_layers"]):
            x = getattr(root.model.layers, str(i))(x, cos, sin)
        x = qwen3.rms_norm(x, root.model.norm.weight, eps)
        return x @ root.lm_head.weight.T

    root.forward = forward
    return root


def child(rank, world, store, sock, cfg_text, form, result_path):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from dte import _lib, sink as dsink, toy
    from dte.source import Source
    import trainers_lib as tl

    torch.set_num_threads(1)
    # A file store, not a TCP port: nothing another test can take meanwhile.
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    cfg = json.loads(cfg_text)
    job = "fsdp2-%s-%d" % (form, world)
    out = {"versions": 0, "exact": 0, "dense_after_first": 0, "unstepped": 0, "bad": []}
    model = hf_model(cfg, seed=3)
    # An FSDP2 group per decoder layer and one for the rest (the usual
    # recipe): every group keeps its own padded flat shard buffers.
    for i in range(cfg["num_hidden_layers"]):
        fully_shard(getattr(model.model.layers, str(i)))
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.05, foreach=form == "foreach", fused=form == "fused")
    src = Source.fsdp2(model, opt, sock, job, "tok", cfg_text, rank, world, label=job)
    sink = arenas = None
    if rank == 0:
        arenas = tl.SglangSinkArenas(cfg_text, SINK_TP, label=job + "-sink")
        sink = dsink.Sink(sock, job, "tok", cfg_text, arenas.layout)
        arenas.attach(sink)
        ref = tl.layout_reference()
    task = toy.ToyTask(cfg["vocab_size"], batch=4, seq_len=16)
    names = [n for n, _ in model.named_parameters()]
    losses = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        tokens, targets = task.batch_at(step)
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1))
        loss.backward()
        losses.append(float(loss.detach()))
        dropped = []
        if step % 2 == 1:
            # A frozen or unrouted tensor: grad None, so AdamW skips it.
            for n, p in model.named_parameters():
                if ".mlp." in n and n.startswith("model.layers.%d." % (step % cfg["num_hidden_layers"])):
                    p.grad = None
                    dropped.append(n)
        opt.step()
        info = src.publish(step + 1)
        full = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
        dist.barrier()
        if rank == 0:
            out["versions"] += 1
            if step and info["dense"]:
                out["dense_after_first"] += 1
            out["unstepped"] += len(dropped)
            sink.apply(step + 1, timeout_ms=60000)
            bad, total = tl.sink_mismatches(ref, cfg, arenas, full, SINK_TP)
            if bad == 0 and total > 0:
                out["exact"] += 1
            else:
                out["bad"].append("v%d: %d of %d elements differ" % (step + 1, bad, total))
        dist.barrier()
    # The dropped tensors kept their own step count: one behind the others.
    steps = {n: int(float(opt.state[p]["step"])) for n, p in model.named_parameters()}
    out["own_steps"] = sorted(set(steps.values()))
    out["losses"] = losses
    out["in_shm"] = all(any(a.contains(p._local_tensor) for a in src.arenas)
                        for p in model.parameters() if p._local_tensor.numel())
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(out, f)
        sink.close()
    src.close()
    dist.barrier()
    dist.destroy_process_group()
    del names


def run(tmp, sock, cfg_text, form, world):
    import torch.multiprocessing as mp
    path = os.path.join(tmp, "result-%s-%d.json" % (form, world))
    os.environ["DTE_FSDP2_CHILD"] = "1"
    store = os.path.join(tmp, "store-%s-%d" % (form, world))
    mp.start_processes(child, args=(world, store, sock, cfg_text, form, path),
                       nprocs=world, join=True, start_method="spawn")
    with open(path) as f:
        return json.load(f)


def main():
    harness.asan_reexec()
    try:
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard  # noqa: F401
        if not dist.is_gloo_available():
            raise ImportError("no gloo")
    except ImportError as e:
        print("SKIP: FSDP2 unavailable in this torch (%s): %s" % (torch.__version__, e))
        return 77
    from dte import qwen3
    cfg = qwen3.make_config(dict(qwen3.make_config(), hidden_size=64, intermediate_size=96,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=16, vocab_size=200))
    cfg_text = json.dumps(cfg)
    tmp = tempfile.mkdtemp(prefix="dte-fsdp2-")
    # Every version after the first must go sparse: this checks the
    # inversion and the sparse path for each layout, so dted may not pick
    # dense for cost (sync_mode = auto would, on these small models at
    # training learning rates; tests/system/sync_mode.py covers that).
    daemon = harness.Daemon(tmp, "fsdp2", sync_mode="sparse")
    sock = daemon.sock
    configs = exact = versions = vexact = 0
    ok = True
    try:
        daemon.start()
        for form, world in (("foreach", 2), ("fused", 3), ("foreach", 3), ("fused", 2)):
            t0 = time.time()
            r = run(tmp, sock, cfg_text, form, world)
            configs += 1
            versions += r["versions"]
            vexact += r["exact"]
            good = (r["exact"] == r["versions"] == STEPS and not r["dense_after_first"] and
                    r["unstepped"] > 0 and len(r["own_steps"]) > 1 and r["in_shm"] and
                    r["losses"][-1] < r["losses"][0])
            exact += good
            ok &= good
            print("%s fsdp2 %s dp=%d: versions=%d exact=%d dense_after_first=%d unstepped=%d "
                  "own_steps=%s in_shm=%s loss %.3f -> %.3f (%.1fs)%s" % (
                      "ok  " if good else "FAIL", form, world, r["versions"], r["exact"],
                      r["dense_after_first"], r["unstepped"], r["own_steps"], r["in_shm"],
                      r["losses"][0], r["losses"][-1], time.time() - t0,
                      "" if good else " " + "; ".join(r["bad"][:3])))
    finally:
        daemon.stop(30)
    print("fsdp2: configs=%d exact=%d/%d versions=%d exact_versions=%d/%d" % (
        configs, exact, configs, versions, vexact, versions))
    if not ok:
        sys.stderr.write(daemon.log_text()[-4000:])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

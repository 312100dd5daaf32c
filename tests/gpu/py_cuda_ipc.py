#!/usr/bin/python3
"""GPU path of the Python helpers: CUDA tensors registered through IPC handles.

A trainer's FP32 params and AdamW moments live on the GPU (an HF-named
model, fsdp:dp=1: three CUDA tensors per canonical tensor); a sink's BF16
weights live on the GPU in the SGLang TP=2 layout.  Both register through
dte.source.register_cuda_tensor (IPC handle of the allocation + byte offset,
and the Source's interprocess event recorded after every step) with a dted
on the cuda backend ($B/lib/dte-cuda.so).  Real AdamW steps on the GPU (a
linear loss with fresh random directions, so no model code mixes devices);
after every version each sink element must equal RNE(θ_t) bit for bit.
Publish is async (protocol 2): the trainer's stream waits on the event
dted records after its capture kernels before the next step writes θ.

Without a CUDA device it says so and exits 1: `make test-gpu` is meant for
GPU machines and must fail loudly anywhere else.
"""

import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
B = os.environ.get("B", "build")
if not os.path.isabs(B):
    B = os.path.join(ROOT, B)
os.environ["B"] = B

import torch  # noqa: E402

from dte import demo, qwen3, sglang  # noqa: E402
from dte.checks import Checks  # noqa: E402
from dte.sink import Sink  # noqa: E402
from dte.source import Source, cuda_ipc_region  # noqa: E402

VERSIONS = 6


def main():
    if not torch.cuda.is_available():
        print("py-cuda-ipc: no CUDA device (torch %s, cuda available: no); this test "
              "runs only on a GPU machine" % torch.__version__)
        sys.exit(1)
    c = Checks("py-cuda-ipc")
    dev = torch.device("cuda", 0)
    cfg = qwen3.make_config(None, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                            vocab_size=512)
    cfg_text = json.dumps(cfg)

    # The IPC region of a view is its storage's handle plus its byte offset.
    base = torch.zeros(1024, device=dev)
    h0, off0, d0 = cuda_ipc_region(base)
    h1, off1, _ = cuda_ipc_region(base[256:])
    c.check(h0 == h1 and off1 == off0 + 256 * 4 and d0 == 0,
            "a view shares its allocation's handle, offset moves by its bytes")

    tmp = tempfile.mkdtemp(prefix="dte-gpu-ipc-")
    d = demo.Daemon(tmp, "gpu")
    os.environ.setdefault("DTE_CUDA_PLUGIN", os.path.join(B, "lib", "dte-cuda.so"))
    src = sink = None
    try:
        d.start()
        params = {n: torch.nn.Parameter(t.to(dev))
                  for n, t in qwen3.init_hf_weights(cfg, seed=5).items()}
        opt = torch.optim.AdamW(
            [{"params": [p for p in params.values() if p.dim() > 1], "weight_decay": 0.01},
             {"params": [p for p in params.values() if p.dim() == 1], "weight_decay": 0.0}],
            lr=1e-4, foreach=False)
        # Moments created up front, so the registered memory is the memory torch updates.
        for p in params.values():
            opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                            "exp_avg_sq": torch.zeros_like(p)}
        src = Source(d.sock, "gpu-job", "tok", cfg_text, "fsdp:dp=1")
        kinds = {"": "param", "exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}
        tensors = []
        for _bid, _length, name in src.expected(0):
            base_name, _, kind = name.partition(" ")
            p = params[base_name]
            tensors.append(p.data if kinds[kind] == "param" else opt.state[p][kinds[kind]])
        src.attach_cuda(0, tensors)
        src.track(opt)
        c.check(src.event is not None, "an interprocess event was registered")

        eng = [{n: t.to(dev, torch.bfloat16).contiguous() for n, t in r.items()}
               for r in sglang.hf_to_sglang({n: torch.zeros_like(t.detach().cpu())
                                             for n, t in params.items()}, cfg, 2)]
        sink = Sink(d.sock, "gpu-job", "tok", cfg_text, "sglang:tp=2")
        for r in range(2):
            sink.attach_cuda(r, eng[r])

        gen = torch.Generator().manual_seed(9)
        for v in range(1, VERSIONS + 1):
            # A linear loss with fresh random directions: real gradients for
            # every element, no model code that might mix devices.
            opt.zero_grad(set_to_none=True)
            loss = sum((p * torch.randn(p.shape, generator=gen).to(dev)).sum()
                       for p in params.values())
            loss.backward()
            opt.step()
            info = src.publish(v)
            sink.apply(v)
            src.wait(v)
            torch.cuda.synchronize()
            want = sglang.hf_to_sglang({n: p.detach().cpu().to(torch.bfloat16)
                                        for n, p in params.items()}, cfg, 2)
            bad = [(r, n) for r in range(2) for n, w in want[r].items()
                   if not torch.equal(w.view(torch.int16), eng[r][n].cpu().view(torch.int16))]
            c.check(not bad, "v%d (%s): every CUDA sink element is RNE(theta) %s" % (
                v, "dense" if info["dense"] else "sparse", bad[:3]))
        # The two-way handshake (issue 18): publish answered before the
        # capture; dted exported the event it records after its capture
        # kernels, and the trainer's stream waited on it before each later
        # step (Source._before_step, cudaStreamWaitEvent).
        c.check(len(src.cap_events) == len(src.parts) and src.stream_waits >= VERSIONS - 1,
                "the trainer's stream waits on dted's capture event (%d events, %d waits)"
                % (len(src.cap_events), src.stream_waits))
    except Exception as e:
        c.check(False, "GPU sync path: %s: %s" % (type(e).__name__, e))
        print(d.tail())
    finally:
        if sink:
            sink.close()
        if src:
            src.close()
        rc = d.stop()
        c.check(rc == 0, "dted exits cleanly (%s)" % rc)
        shutil.rmtree(tmp, ignore_errors=True)
    c.finish(versions=VERSIONS)


if __name__ == "__main__":
    main()

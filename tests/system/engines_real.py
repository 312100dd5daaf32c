#!/usr/bin/python3
"""engines.py against the real engines: SGLang's Engine with
--custom-weight-loader dte.integrations.sglang.load, and vLLM's LLM with
worker_extension_cls=dte.integrations.vllm.DteWorkerExtension.

Runs when this interpreter (or $DTE_ENGINE_PYTHON, which the script re-runs
itself with) imports sglang and/or vllm, a CUDA device is present, dted was
built with its CUDA backend, and $DTE_TEST_MODEL names a local Qwen3
checkpoint directory (config.json + *.safetensors, BF16).  Otherwise it
prints SKIP and exits 77: a skip is never a pass.

Per engine present: TP=1 from the checkpoint; a trainer on the CPU holding
the same weights in FP32 (Source.hf, fsdp:dp=1, torch AdamW on a random
quadratic loss); 10 versions, each published, synced by the controller,
and read back from the engine (SGLang: Engine.get_weights_by_name; vLLM:
collective_rpc of a function over model_runner.get_model()) and compared
bit for bit with RNE-BF16(theta) through dte.sglang.hf_to_sglang.
"""

import glob
import json
import os
import sys
import tempfile

import harness

ENGINES = ("sglang", "vllm")
VERSIONS = 10


def skip(why):
    print("SKIP: %s" % why)
    sys.exit(77)


def available():
    import importlib.util
    return [e for e in ENGINES if importlib.util.find_spec(e) is not None]


def main():
    py = os.environ.get("DTE_ENGINE_PYTHON")
    if py and os.path.abspath(py) != os.path.abspath(sys.executable) and \
            not os.environ.get("DTE_ENGINES_REAL_CHILD"):
        env = dict(os.environ, DTE_ENGINES_REAL_CHILD="1")
        os.execve(py, [py] + sys.argv, env)
    have = available()
    if not have:
        skip("neither sglang nor vllm imports in %s (engines.py covers them through fakes)"
             % sys.executable)
    import torch
    if not torch.cuda.is_available():
        skip("%s import but no CUDA device is present" % "/".join(have))
    model_dir = os.environ.get("DTE_TEST_MODEL")
    if not model_dir or not os.path.exists(os.path.join(model_dir, "config.json")):
        skip("set DTE_TEST_MODEL to a local Qwen3 checkpoint directory")
    if not os.path.exists(os.path.join(harness.B, "lib", "dte-cuda.so")):
        skip("dted has no CUDA backend in %s" % harness.B)
    from safetensors.torch import load_file

    from dte import qwen3, sglang as conv
    from dte.checks import Checks
    from dte.integrations._engine import SyncError
    from dte.source import Source

    c = Checks("engines-real")
    cfg_text = open(os.path.join(model_dir, "config.json")).read()
    cfg = qwen3.make_config(json.loads(cfg_text))
    hf = {}
    for f in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        hf.update(load_file(f))
    if cfg["tie_word_embeddings"]:
        hf.pop("lm_head.weight", None)
    tmp = tempfile.mkdtemp(prefix="dte-engines-real-")
    daemon = harness.Daemon(tmp, "engines-real")
    sock = daemon.sock
    exact = {}
    try:
        daemon.start()
        params = {n: torch.nn.Parameter(t.float().clone()) for n, t in hf.items()
                  if n in qwen3.hf_tensor_shapes(cfg)}
        opt = torch.optim.AdamW(params.values(), lr=1e-4, weight_decay=0.0)
        src = Source.hf(params, opt, sock, "real", "tok", cfg_text)
        engines = {}
        if "sglang" in have:
            import sglang
            from dte.integrations.sglang import LOAD_FORMAT, SGLangController
            eng = sglang.Engine(model_path=model_dir, tp_size=1, dtype="bfloat16",
                                custom_weight_loader=[LOAD_FORMAT])
            ctl = SGLangController(eng, "real", "tok", cfg_text, socket=sock, replica=0)
            ctl.attach()

            def read_sglang(eng=eng):
                return {n: torch.tensor(eng.get_weights_by_name(n, truncate_size=1 << 40),
                                        dtype=torch.float32)
                        for n in conv.shard_shapes(cfg, 1)}
            engines["sglang"] = (ctl, read_sglang, eng.shutdown)
        if "vllm" in have:
            from vllm import LLM
            from dte.integrations.vllm import VLLMController
            llm = LLM(model=model_dir, tensor_parallel_size=1, dtype="bfloat16",
                      enforce_eager=True,
                      worker_extension_cls="dte.integrations.vllm.DteWorkerExtension")
            ctl = VLLMController(llm, "real", "tok", cfg_text, socket=sock, replica=1)
            ctl.attach()

            def read_vllm(llm=llm):
                got = llm.collective_rpc(lambda self: {
                    n: p.detach().float().cpu()
                    for n, p in self.model_runner.get_model().named_parameters()})[0]
                return got
            engines["vllm"] = (ctl, read_vllm, lambda: None)
        g = torch.Generator().manual_seed(0)
        targets = {n: torch.randn(p.shape, generator=g) for n, p in params.items()}
        for v in range(1, VERSIONS + 1):
            opt.zero_grad()
            loss = sum(((p - targets[n]) ** 2).mean() for n, p in params.items())
            loss.backward()
            opt.step()
            src.publish(v)
            want = conv.hf_to_sglang({n: p.detach().to(torch.bfloat16) for n, p in params.items()},
                                     cfg, 1)[0]
            for name, (ctl, read, _stop) in engines.items():
                try:
                    rep = ctl.sync(v)
                except SyncError as e:
                    rep = e.report
                c.check(rep.ok, "v%d %s: %s" % (v, name, rep.summary()))
                got = read()
                bad = [n for n, w in want.items()
                       if n not in got or not torch.equal(w.float(), got[n].reshape(w.shape))]
                exact[name] = exact.get(name, 0) + (not bad)
                c.check(not bad, "v%d %s exact (%s)" % (v, name, bad[:3]))
        for _n, (_c, _r, stop) in engines.items():
            stop()
        src.close()
    finally:
        daemon.stop(10)
    print("engines-real: %s" % " ".join("%s=%d/%d" % (e, exact.get(e, 0), VERSIONS)
                                        for e in have))
    c.finish()


if __name__ == "__main__":
    main()

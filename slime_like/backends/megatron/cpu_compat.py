"""Make megatron-core train on CPU (gloo): a few patches, each fixing one concrete error.

Applied by `apply()` only when CUDA is absent (it refuses to run otherwise), idempotent, and never
imported on GPU code paths (callers import it lazily behind `torch.cuda.is_available()`).
Verified against megatron-core 0.16.1; tests/megatron/test_cpu_compat.py shows
the error each patch prevents. Every patch is keyed by name so a test can leave one out.

Patch (name)             error without it
-----------------------  -----------------------------------------------------------------------------
current_device           `torch.cuda.current_device()` used as a device: RotaryEmbedding's inv_freq, DDP's
                         grad buffers, optimizer state: "AssertionError: Torch not compiled with CUDA enabled".
rng_tracker              model_parallel_cuda_manual_seed / CudaRNGStatesTracker store CUDA generator
                         states (`torch.cuda.get_rng_state`): "Torch not compiled with CUDA enabled".
cuda_device_calls        ~40 hard-coded `device="cuda"` / `.cuda()` / `pin_memory=True` in optimizer, grad
                         scaler, clip-grad, schedules, the default causal mask; and `param.type() ==
                         'torch.cuda.FloatTensor'` checks in the (distributed) optimizer and clip-grad:
                         "AssertionError: Torch not compiled with CUDA enabled" (get_megatron_optimizer).
                         The mcore modules that hard-code CUDA (`_CUDA_MODULES`) see a `torch` whose factory
                         functions send CUDA devices to CPU; `Tensor.cuda()` / `Module.cuda()` return
                         their object, and a no-argument `Tensor.type()` reports CPU tensors under their
                         CUDA names. No other torch call is touched: an earlier version used a process-wide
                         TorchFunctionMode, which sent every torch op through Python (~11 % of a tiny
                         model's train step). The factories are not replaced in `torch` itself: torch's
                         `torch.device(...)` context, which transformers uses to build models on the meta
                         device, finds constructors by identity and would silently ignore wrapped ones.
cuda_sync                pipeline p2p `_communicate` calls torch.cuda.synchronize(): CUDA assertion (PP>1).
cuda_stream              MoE alltoall token dispatcher creates `torch.cuda.Stream()` for async D2H copies:
                         "RuntimeError: torch.cuda.Stream requires CUDA support"; mcore >= 0.19 DDP
                         start_grad_sync also waits on torch.cuda.current_stream() events. CPU work is
                         synchronous, so streams/events become no-op objects.
moe_te_gemm              moe_utils.router_gating_linear reads the global `te_general_gemm`, which is only
                         defined when TransformerEngine imports: "NameError: name 'te_general_gemm' is not
                         defined" (MoE router forward). Defining it as None selects the torch.mm path.
moe_splits               the alltoall dispatcher turns its split sizes into numpy arrays only for CUDA
                         tensors (maybe_move_tensor_to_cpu); on CPU they stay tensors and gloo's
                         all_to_all_single fails: "TypeError: all_to_all_single(): incompatible function
                         arguments" (expert parallel > 1).
"""
from __future__ import annotations

import functools
import types

import torch

_applied: set[str] = set()


def _is_cuda(device) -> bool:
    return (isinstance(device, str) and device.startswith("cuda")) or (
        isinstance(device, torch.device) and device.type == "cuda")


def _patch_current_device():
    # Any `torch.cuda.current_device()` result is used as a device argument, so "cpu" is a valid answer.
    torch.cuda.current_device = lambda: "cpu"



def _patch_rng_tracker():
    import megatron.core.tensor_parallel.random as rnd

    # The tracker forks named generator states around dropout/init; back them by CPU generator states.
    rnd._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    rnd._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)

    def add(self, name, seed):
        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")
        if name in self.states_:
            raise Exception(f"cuda rng state {name} already exists")
        self._is_initialized = True
        self.seeds_.add(seed)
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    rnd.CudaRNGStatesTracker.add = add


# mcore modules (0.16) with hard-coded CUDA devices or pinned memory on the paths we run; each is imported by
# apply() so the proxy is in place before first use. A module missing here fails loudly (CUDA assertion).
_CUDA_MODULES = ("utils", "rerun_state_machine", "pipeline_parallel.schedules", "pipeline_parallel.utils",
                 "optimizer.optimizer", "optimizer.clip_grads", "optimizer.grad_scaler", "transformer.utils",
                 "transformer.moe.moe_utils", "models.common.embeddings.rope_utils",
                 "distributed.param_and_grad_buffer", "tensor_parallel.data",
                 "dist_checkpointing.strategies.state_dict_saver", "dist_checkpointing.exchange_utils")
# torch functions that take a `device` (or `pin_memory`) keyword
_FACTORIES = ("tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "zeros_like", "ones_like",
              "empty_like", "full_like", "rand", "randn", "randint", "empty_strided", "eye", "linspace")


def _to_cpu_kwargs(fn):
    """`fn` with a CUDA `device=` sent to CPU and `pin_memory=True` dropped (pinning needs a CUDA driver)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = "cpu"
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        return fn(*args, **kwargs)

    return wrapper


class _TorchOnCpu(types.ModuleType):
    """`torch` as the modules in _CUDA_MODULES see it: the factories rewrite CUDA devices, the rest is torch."""

    def __init__(self):
        super().__init__("torch")
        for name in _FACTORIES:
            setattr(self, name, _to_cpu_kwargs(getattr(torch, name)))

    def __getattr__(self, name):  # everything else, looked up live (later patches to torch stay visible)
        return getattr(torch, name)


def _patch_cuda_device_calls():
    import importlib

    proxy = _TorchOnCpu()
    for name in _CUDA_MODULES:
        module = importlib.import_module(f"megatron.core.{name}")
        if getattr(module, "torch", None) is torch:
            module.torch = proxy
    type_ = torch.Tensor.type

    @functools.wraps(type_)
    def tensor_type(self, *args, **kwargs):
        name = type_(self, *args, **kwargs)
        if args or kwargs or self.device.type != "cpu":
            return name
        # mcore validates parameter types by their CUDA names; report CPU tensors under those names.
        return name.replace("torch.", "torch.cuda.", 1)

    torch.Tensor.type = tensor_type
    # On a CPU-only build these can only raise; mcore calls them on tensors and modules it means to keep.
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self


def _patch_cuda_sync():
    torch.cuda.synchronize = lambda *a, **k: None


class _NullStream:
    """Stands in for a CUDA stream / event: every method is a no-op returning the null object."""

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        return lambda *a, **k: _NULL


_NULL = _NullStream()


def _patch_cuda_stream():
    import contextlib

    torch.cuda.Stream = _NullStream
    torch.cuda.Event = _NullStream
    torch.cuda.current_stream = lambda *a, **k: _NULL  # one object, so `current_stream() != s` compares work
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()


def _patch_moe_te_gemm():
    import megatron.core.transformer.moe.moe_utils as moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _patch_moe_splits():
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import megatron.core.transformer.moe.token_dispatcher as dispatcher

    original = moe_utils.maybe_move_tensor_to_cpu

    def maybe_move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):
        if as_numpy and torch.is_tensor(tensor) and tensor.device.type == "cpu":
            return tensor.numpy()
        return original(tensor, as_numpy=as_numpy, record_stream=record_stream)

    moe_utils.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu
    dispatcher.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu  # imported by name


PATCHES = {
    "current_device": _patch_current_device,
    "rng_tracker": _patch_rng_tracker,
    "cuda_device_calls": _patch_cuda_device_calls,
    "cuda_sync": _patch_cuda_sync,
    "cuda_stream": _patch_cuda_stream,
    "moe_te_gemm": _patch_moe_te_gemm,
    "moe_splits": _patch_moe_splits,
}


def apply(skip: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Apply every CPU patch not in `skip` (once each); return the names applied so far.

    Raises if CUDA is available: these patches would break a GPU run.
    """
    if torch.cuda.is_available():
        raise RuntimeError("slime_like.backends.megatron.cpu_compat is for CPU-only runs; CUDA is available here")
    unknown = [s for s in skip if s not in PATCHES]
    if unknown:
        import difflib

        hints = [f"{u!r} (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(u, PATCHES, n=1)) else repr(u)
                 for u in unknown]
        raise ValueError(f"cpu_compat.apply(skip=...): unknown patch name(s) {', '.join(hints)}; "
                         f"known: {sorted(PATCHES)}")
    for name, patch in PATCHES.items():
        if name not in skip and name not in _applied:
            patch()
            _applied.add(name)
    return sorted(_applied)

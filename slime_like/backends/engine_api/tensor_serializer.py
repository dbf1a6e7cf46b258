"""SGLang's ``MultiprocessingSerializer`` wire format for ``/update_weights_from_tensor``.

SGLang pickles the payload with ``multiprocessing.reduction.ForkingPickler`` (so torch tensors travel as
shared-memory handles -- CUDA IPC handles on GPU) and, for JSON over HTTP, base64-encodes the bytes.
Each entry of ``serialized_named_tensors`` is one such string per TP rank; with the default load format the
payload is a list of ``(name, tensor)`` pairs.

On CPU the handle is a torch shared-memory segment. Across *unrelated* processes only the ``file_system``
sharing strategy works (the default ``file_descriptor`` strategy passes fds over a socket authenticated
with the sending process tree's authkey), so ``serialize`` switches the sender to ``file_system`` and
moves the tensors into shared memory. The sender must keep the tensors alive until the engine has
answered the HTTP request (the receiver copies them into its parameters before answering).
"""
from __future__ import annotations

import base64
import functools
import io
import pickle
from collections import OrderedDict
from multiprocessing.reduction import ForkingPickler
from types import SimpleNamespace

import torch
import torch.multiprocessing as tmp  # registers torch's ForkingPickler reductions
import torch.multiprocessing.reductions  # noqa: F401  (tmp.reductions)

from slime_like.backends.engine_api import protocol


def _file_system_strategy() -> None:
    if torch.multiprocessing.get_sharing_strategy() != "file_system":
        torch.multiprocessing.set_sharing_strategy("file_system")


def shared_buffer(nbytes: int) -> torch.Tensor:
    """A uint8 CPU tensor allocated straight in shared memory (``file_system`` strategy), to be filled and sent.

    Serializing a tensor that is already shared sends its handle without copying; serializing an ordinary tensor
    first moves it into a new shared-memory segment (one per tensor: allocation, page faults, a copy -- seconds
    for a few hundred MB). Filling one such buffer per sync costs one copy."""
    _file_system_strategy()
    return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(nbytes))


def serialize(obj, output_str: bool = True):
    """Pickle `obj` with ForkingPickler; base64 text when `output_str` (what goes into the JSON body)."""
    _file_system_strategy()
    buf = io.BytesIO()
    ForkingPickler(buf).dump(obj)
    data = buf.getvalue()
    return base64.b64encode(data).decode("utf-8") if output_str else data


class PayloadRefused(pickle.UnpicklingError):
    """A payload that names a global outside the allow-list or a size beyond the engine's model (HTTP 400). The
    message starts with protocol.PAYLOAD_REFUSED, so a server that only sees the text (vLLM relays a worker's
    error) can tell."""

    def __init__(self, message: str):
        super().__init__(protocol.PAYLOAD_REFUSED + message)


class _ClassRef:
    """A class named by the payload, handed to the rebuild functions but never callable by the pickle itself:
    `torch.Tensor(N)` / `UntypedStorage(N)` as a pickle REDUCE would allocate N elements from a 70-byte body."""

    __slots__ = ("cls",)

    def __init__(self, cls):
        self.cls = cls


_TENSOR_CLASSES = {("torch", "Tensor"): torch.Tensor, ("torch._tensor", "Tensor"): torch.Tensor,
                   ("torch.nn.parameter", "Parameter"): torch.nn.Parameter}
_STORAGE_CLASSES = {("torch.storage", "UntypedStorage"): torch.UntypedStorage,
                    ("torch", "UntypedStorage"): torch.UntypedStorage,
                    ("torch.storage", "TypedStorage"): torch.TypedStorage,
                    ("torch", "TypedStorage"): torch.TypedStorage}
# Called by the pickle, and harmless whatever their arguments (bounded by the body's own size).
_PLAIN_CALLABLES = {("torch", "Size"): torch.Size, ("types", "SimpleNamespace"): SimpleNamespace,
                    ("collections", "OrderedDict"): OrderedDict}
_REDUCTIONS = "torch.multiprocessing.reductions"


def _int(value, what: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise PayloadRefused(f"{what} must be an integer >= {low}, got {value!r}")
    return value


def _shape(value, what: str) -> tuple:
    if not isinstance(value, (tuple, list)) or len(value) > 64:
        raise PayloadRefused(f"{what} must be a tuple of at most 64 integers, got {type(value).__name__}")
    return tuple(_int(v, what) for v in value)


def _cls(ref, allowed: set, what: str):
    if not isinstance(ref, _ClassRef) or ref.cls not in allowed:
        raise PayloadRefused(f"{what} must be one of {sorted(c.__name__ for c in allowed)}, got {ref!r}")
    return ref.cls


class _Budget:
    """Bytes a payload may map (`max_bytes`, the engine's model) and bytes mapped so far. Held by the rebuild
    wrappers, not the unpickler: the unpickler's memo holds the wrappers, and a cycle through it would keep every
    mapping of the payload alive until the garbage collector runs (a shared-memory segment outliving its sender)."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.mapped = int(max_bytes), 0

    def count(self, nbytes: int, what: str) -> None:
        self.mapped += nbytes
        if nbytes > self.max_bytes or self.mapped > self.max_bytes:
            raise PayloadRefused(f"{what} of {nbytes} bytes ({self.mapped} in this payload) exceeds the engine "
                                 f"model's {self.max_bytes} bytes")


def _check_view(size, stride, offset, itemsize: int, storage_bytes: int) -> None:
    size, stride = _shape(size, "tensor size"), _shape(stride, "tensor stride")
    offset = _int(offset, "tensor storage offset")
    if len(size) != len(stride):
        raise PayloadRefused(f"tensor size {size} and stride {stride} differ in length")
    span = offset + 1 + sum((d - 1) * s for d, s in zip(size, stride)) if all(size) else 0
    if span * itemsize > storage_bytes:
        raise PayloadRefused(f"tensor of size {size}, stride {stride}, offset {offset} reaches beyond its "
                             f"storage of {storage_bytes} bytes")


def _rebuild_tensor(budget, cls, storage, metadata):
    cls = _cls(cls, {torch.Tensor, torch.nn.Parameter}, "rebuild_tensor's class")
    if not isinstance(storage, torch.TypedStorage) or not isinstance(metadata, tuple) or len(metadata) != 4:
        raise PayloadRefused("rebuild_tensor needs a storage rebuilt by this payload and (offset, size, stride, "
                             "requires_grad)")
    offset, size, stride, requires_grad = metadata
    _check_view(size, stride, offset, storage.dtype.itemsize, storage._untyped_storage.nbytes())
    return tmp.reductions.rebuild_tensor(cls, storage, (offset, torch.Size(size), tuple(stride), bool(requires_grad)))


def _rebuild_typed_storage(budget, storage, dtype):
    if not isinstance(storage, torch.UntypedStorage) or not isinstance(dtype, torch.dtype):
        raise PayloadRefused("rebuild_typed_storage needs an untyped storage and a dtype")
    return tmp.reductions.rebuild_typed_storage(storage, dtype)


def _rebuild_storage_filename(budget, cls, manager, handle, size, dtype=None):
    cls = _cls(cls, {torch.UntypedStorage, torch.TypedStorage}, "rebuild_storage_filename's class")
    if not isinstance(manager, (bytes, str)) or not isinstance(handle, (bytes, str)):
        raise PayloadRefused("rebuild_storage_filename needs a manager and handle name")
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise PayloadRefused(f"rebuild_storage_filename's dtype must be a torch dtype, got {dtype!r}")
    budget.count(_int(size, "shared-memory storage size") * (dtype.itemsize if dtype is not None else 1),
                 "a shared-memory storage")
    return tmp.reductions.rebuild_storage_filename(cls, manager, handle, size, dtype)


def _rebuild_storage_empty(budget, cls):
    return _cls(cls, {torch.UntypedStorage, torch.TypedStorage}, "rebuild_storage_empty's class")()


def _rebuild_cuda_tensor(budget, tensor_cls, size, stride, offset, storage_cls, dtype, device, handle, storage_bytes,
                         storage_offset_bytes, requires_grad, ref_counter_handle, ref_counter_offset, event_handle,
                         event_sync_required):
    tensor_cls = _cls(tensor_cls, {torch.Tensor, torch.nn.Parameter}, "rebuild_cuda_tensor's tensor class")
    storage_cls = _cls(storage_cls, {torch.UntypedStorage, torch.TypedStorage}, "rebuild_cuda_tensor's storage class")
    if not isinstance(dtype, torch.dtype):
        raise PayloadRefused(f"rebuild_cuda_tensor's dtype must be a torch dtype, got {dtype!r}")
    for value, what in ((handle, "IPC handle"), (ref_counter_handle, "ref-counter handle"),
                        (event_handle, "event handle")):
        if value is not None and not isinstance(value, bytes):
            raise PayloadRefused(f"rebuild_cuda_tensor's {what} must be bytes, got {type(value).__name__}")
    storage_bytes = _int(storage_bytes, "CUDA storage size")
    for value, what in ((device, "CUDA device index"), (storage_offset_bytes, "CUDA storage offset"),
                        (ref_counter_offset, "ref-counter offset")):
        _int(value, what)
    budget.count(storage_bytes, "a CUDA IPC storage")
    _check_view(size, stride, offset, dtype.itemsize, storage_bytes)
    return tmp.reductions.rebuild_cuda_tensor(
        tensor_cls, torch.Size(size), tuple(stride), offset, storage_cls, dtype, device, handle, storage_bytes,
        storage_offset_bytes, bool(requires_grad), ref_counter_handle, ref_counter_offset, event_handle,
        bool(event_sync_required))


_REBUILDS = {"rebuild_tensor": _rebuild_tensor, "rebuild_typed_storage": _rebuild_typed_storage,
             "rebuild_storage_filename": _rebuild_storage_filename, "rebuild_storage_empty": _rebuild_storage_empty,
             "rebuild_cuda_tensor": _rebuild_cuda_tensor}


class _TensorOnlyUnpickler(pickle.Unpickler):
    """Admits only the rebuilds of shared-memory (CPU) and CUDA IPC (GPU) tensors that ForkingPickler writes, each
    checked before it runs: the classes it names, and every size against the budget (the engine's model), alone
    and summed over the payload. Nothing else is callable: os.system, eval, torch.Tensor(N), ... are refused."""

    def __init__(self, file, max_bytes: int):
        super().__init__(file)
        self._budget = _Budget(max_bytes)

    def find_class(self, module, name):
        key = (module, name)
        if module == _REDUCTIONS and name in _REBUILDS:
            return functools.partial(_REBUILDS[name], self._budget)
        if key in _TENSOR_CLASSES:
            return _ClassRef(_TENSOR_CLASSES[key])
        if key in _STORAGE_CLASSES:
            return _ClassRef(_STORAGE_CLASSES[key])
        if key in _PLAIN_CALLABLES:
            return _PLAIN_CALLABLES[key]
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise PayloadRefused(f"serialized_named_tensors may only hold shared-memory / CUDA IPC tensors and their "
                             f"metadata; refusing {module}.{name}")


def model_bytes(numels) -> int:
    """The bound of one payload from the numel of every weight the engine accepts (tied copies included): 4 bytes
    each (a sender's fp32 copy; an fp32 trainer may push to a bf16 engine) plus the sender's 64-byte alignment."""
    return sum(4 * int(n) + 64 for n in numels)


def deserialize(data, max_bytes: int):
    """Inverse of `serialize`; accepts the base64 text or the raw bytes. Only tensor payloads are admitted
    (`_TensorOnlyUnpickler`), no storage beyond `max_bytes` (`model_bytes` of the engine's model), and the engine
    calls this only for a caller that sent the run's API key. Refusals raise `PayloadRefused` (HTTP 400).

    The receiver should drop the result (and so its mappings) once it has copied the tensors: a segment that is
    still mapped when its processes are killed stays in /dev/shm. (Keeping the last payload mapped would save
    re-mapping a reused sender buffer -- measured 2-2.5x -> 1.1x a plain copy for the engine's side at 100M --
    but then every run ended by Ray's kill leaked one bucket of /dev/shm.)"""
    if isinstance(data, str):
        data = base64.b64decode(data, validate=True)
    if not isinstance(data, (bytes, bytearray)):
        raise PayloadRefused(f"a serialized entry must be base64 text or bytes, got {type(data).__name__}")
    try:
        return _TensorOnlyUnpickler(io.BytesIO(data), max_bytes).load()
    except TypeError as e:  # a refused class called by the pickle, wrong argument counts, ...
        raise PayloadRefused(f"serialized_named_tensors is not a tensor payload: {e}") from None

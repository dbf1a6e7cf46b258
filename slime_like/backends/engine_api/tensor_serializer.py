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
import io
import pickle
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing as tmp  # noqa: F401  (registers torch's ForkingPickler reductions)


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


# The only globals a payload of (name, tensor) pairs or a flattened bucket needs: torch's shared-memory
# rebuild functions, tensor/storage/size types, dtypes, and the bucket metadata's SimpleNamespace. Anything
# else (os.system, builtins.eval, ...) is refused before it is called, so a crafted body cannot run code.
_ALLOWED_GLOBALS = {
    ("torch.multiprocessing.reductions", "rebuild_tensor"),
    ("torch.multiprocessing.reductions", "rebuild_typed_storage"),
    ("torch.multiprocessing.reductions", "rebuild_storage_filename"),
    ("torch.multiprocessing.reductions", "rebuild_storage_empty"),
    ("torch", "Tensor"), ("torch", "Size"), ("torch.storage", "UntypedStorage"), ("torch.storage", "TypedStorage"),
    ("types", "SimpleNamespace"), ("collections", "OrderedDict"),
}


class _TensorOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _ALLOWED_GLOBALS or (module == "torch" and isinstance(getattr(torch, name, None),
                                                                                  torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"serialized_named_tensors may only hold tensors and their metadata; "
                                     f"refusing {module}.{name}")


def deserialize(data):
    """Inverse of `serialize`; accepts the base64 text or the raw bytes. Only tensor payloads are admitted
    (`_TensorOnlyUnpickler`), and the engine calls this only for a caller that sent the run's API key.

    The receiver should drop the result (and so its mappings) once it has copied the tensors: a segment that is
    still mapped when its processes are killed stays in /dev/shm. (Keeping the last payload mapped would save
    re-mapping a reused sender buffer -- measured 2-2.5x -> 1.1x a plain copy for the engine's side at 100M --
    but then every run ended by Ray's kill leaked one bucket of /dev/shm.)"""
    if isinstance(data, str):
        data = base64.b64decode(data, validate=True)
    return _TensorOnlyUnpickler(io.BytesIO(data)).load()

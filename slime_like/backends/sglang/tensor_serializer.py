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
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing as tmp  # noqa: F401  (registers torch's ForkingPickler reductions)


def _file_system_strategy() -> None:
    if torch.multiprocessing.get_sharing_strategy() != "file_system":
        torch.multiprocessing.set_sharing_strategy("file_system")


def shared_buffer(nbytes: int) -> torch.Tensor:
    """A uint8 CPU tensor in shared memory (``file_system`` strategy), to be filled and sent many times.

    Serializing a tensor that is already shared sends its handle without copying; serializing a fresh tensor
    first moves it into a new shared-memory segment (allocation, page faults, a copy: seconds for a few hundred
    MB). A sender that reuses one such buffer pays that once."""
    _file_system_strategy()
    return torch.empty(nbytes, dtype=torch.uint8).share_memory_()


def serialize(obj, output_str: bool = True):
    """Pickle `obj` with ForkingPickler; base64 text when `output_str` (what goes into the JSON body)."""
    _file_system_strategy()
    buf = io.BytesIO()
    ForkingPickler(buf).dump(obj)
    data = buf.getvalue()
    return base64.b64encode(data).decode("utf-8") if output_str else data


_kept: list = [None]  # the last payload deserialized with keep_mapped=True


def deserialize(data, keep_mapped: bool = False):
    """Inverse of `serialize`; accepts the base64 text or the raw bytes.

    keep_mapped (the receiving engine): hold the result until the next such call. Torch looks a received
    shared-memory handle up among the segments this process still has mapped, so a sender that reuses its buffer
    (TensorWeightSender) is then neither re-mapped nor page-faulted again on every request (measured at 100M:
    the engine's side of a sync 2-2.5x -> ~1.1x a plain copy). Cost: after the sender frees that buffer, up to
    one payload's segments stay in /dev/shm until the next payload arrives."""
    if isinstance(data, str):
        data = base64.b64decode(data, validate=True)
    out = ForkingPickler.loads(data)
    if keep_mapped:
        _kept[0] = out
    return out

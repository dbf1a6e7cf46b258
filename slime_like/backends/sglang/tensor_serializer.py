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


def serialize(obj, output_str: bool = True):
    """Pickle `obj` with ForkingPickler; base64 text when `output_str` (what goes into the JSON body)."""
    if torch.multiprocessing.get_sharing_strategy() != "file_system":
        torch.multiprocessing.set_sharing_strategy("file_system")
    buf = io.BytesIO()
    ForkingPickler(buf).dump(obj)
    data = buf.getvalue()
    return base64.b64encode(data).decode("utf-8") if output_str else data


def deserialize(data):
    """Inverse of `serialize`; accepts the base64 text or the raw bytes."""
    if isinstance(data, str):
        data = base64.b64decode(data, validate=True)
    return ForkingPickler.loads(data)

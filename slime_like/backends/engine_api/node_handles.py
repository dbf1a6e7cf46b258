"""Colocated weight push across nodes: each engine rank gets a handle made on its own node.

SGLang's ``/update_weights_from_tensor`` takes one serialized entry per engine TP rank, and engine rank i opens
entry i: a CUDA IPC handle (GPU) or a shared-memory segment (CPU), both of which only a process on the node that
made them can open. One sender rank per pipeline stage holds the full HF tensors (``iter_hf_weights``), so for an
engine rank on another node (an engine spanning nodes, or a single-node engine on another node of the cluster) a
trainer rank on that node -- a *relay* -- receives a copy of the flattened bucket, keeps it in a buffer of its own
and serializes handles to it; the sender orders every engine's list so each entry comes from its rank's node
(slime gathers one handle per GPU from the colocated trainer rank with ``gather_object``; here the relays answer
the sender through Ray). With every engine rank on the sender's node nothing here runs: the push is unchanged.

Ray-free: the sender reaches its relays through an object with ``start(flat, counts) -> wait() -> {node: blobs}``
(ray/weight_relay.py implements it with Ray actors).
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from slime_like.backends.engine_api import tensor_serializer


def rank_nodes(node_groups: list, ranks: int) -> list:
    """The node of each of an engine's `ranks` weight-receiving ranks, given the nodes its GPUs sit on in plan
    order. SGLang gives node k of an engine over n nodes the TP ranks k*t/n .. (k+1)*t/n - 1; an engine with fewer
    ranks than nodes (the CPU engine: one rank, its node 0 process) has them on its first nodes."""
    per = max(1, ranks // len(node_groups))
    return [node_groups[min(r // per, len(node_groups) - 1)] for r in range(ranks)]


def relay_counts(engine_rank_nodes: list, own_node) -> dict:
    """{node: how many entries its relay serializes per bucket} for the engine ranks not on `own_node`."""
    counts: dict = {}
    for nodes in engine_rank_nodes:
        for node in nodes or ():
            if node is not None and node != own_node:
                counts[node] = counts.get(node, 0) + 1
    return counts


def order_entries(engine_rank_nodes: list, own_node, local_blob, remote: dict) -> list:
    """Per engine, its serialized_named_tensors: entry i made on engine rank i's node. `local_blob()` serializes
    one more handle to the sender's own buffer; `remote`: {node: that node's relay's blobs} (each used once: one
    rebuild gives back the reference one serialization took)."""
    pending = {node: iter(blobs) for node, blobs in remote.items()}
    return [[local_blob() if node == own_node or node is None else next(pending[node]) for node in nodes]
            for nodes in engine_rank_nodes]


class BucketRelay:
    """A relay rank's copy of one sender's bucket: a buffer of this process (shared memory on CPU, reused; a fresh
    CUDA tensor per bucket on GPU, as the sender's), kept until that sender's next bucket replaces it -- the
    sender moves on only after every engine answered, i.e. copied the weights out."""

    def __init__(self):
        self._buf: torch.Tensor | None = None

    def handles(self, data: np.ndarray, metadata: list, count: int) -> list:
        """Copy the bucket's bytes in; `count` serialized flattened-bucket entries pointing at them."""
        n = int(data.nbytes)
        if torch.cuda.is_available():
            self._buf = None
            self._buf = torch.empty(n, dtype=torch.uint8, device=torch.device("cuda", torch.cuda.current_device()))
        elif self._buf is None or self._buf.numel() < n:
            self._buf = None   # free the old segment before mapping a bigger one
            self._buf = tensor_serializer.shared_buffer(n)
        with warnings.catch_warnings():   # Ray hands the bytes over read-only; they are only read here
            warnings.simplefilter("ignore", UserWarning)
            self._buf[:n].copy_(torch.from_numpy(data.reshape(-1).view(np.uint8)))
        flat = {"flattened_tensor": self._buf[:n], "metadata": metadata}
        return [tensor_serializer.serialize(flat, output_str=True) for _ in range(count)]

    def close(self) -> None:
        self._buf = None


def segment_owner(blob: str) -> int | None:
    """The pid of the process that created the CPU shared-memory segment a serialized entry points at (torch names
    its file_system segments /torch_<pid>_...): which process, hence which node, made the handle; None on GPU."""
    import base64
    import re

    found = re.search(rb"torch_(\d+)_", base64.b64decode(blob))
    return int(found.group(1)) if found else None

"""SGLang's `meta_info.routed_experts` wire form (return_routed_experts): base64 of an int32 array
`[tokens - 1, moe_layers, top_k]`, C order. Shared by the engines that write it and the trainer that replays it."""
from __future__ import annotations

import base64

import torch


def encode(rows: list[torch.Tensor]) -> str:
    array = torch.cat(rows, dim=0).to(torch.int32).contiguous() if rows else torch.zeros(0, dtype=torch.int32)
    return base64.b64encode(array.numpy().tobytes()).decode("ascii")


def decode(value, rows: int) -> torch.Tensor:
    """`[rows, layers * top_k]` int32 from a base64 string or a flat list (slime accepts both)."""
    if isinstance(value, str):
        flat = torch.frombuffer(bytearray(base64.b64decode(value.encode("ascii"), validate=True)), dtype=torch.int32)
    else:
        flat = torch.as_tensor(value, dtype=torch.int32).reshape(-1)
    if rows <= 0 or flat.numel() % rows:
        raise ValueError(f"routed_experts: {flat.numel()} expert ids do not split into {rows} token rows")
    return flat.reshape(rows, -1)

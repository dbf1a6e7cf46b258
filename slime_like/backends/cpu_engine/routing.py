"""The experts the CPU engine routed each token to (SGLang's `return_routed_experts`, slime's rollout routing replay
R3): forward hooks on the MoE routers of the HF model collect each layer's top-k expert ids per processed token;
the engine hands every request the rows of its own tokens.

A request's answer carries `meta_info.routed_experts`: base64 of an int32 array `[len(input_ids) + len(output_ids)
- 1, num_moe_layers, top_k]` in C order (SGLang's wire form: the last generated token is never fed back, so it has
no routing), and `routed_experts_start_len` 0 (the whole sequence, every call).

Supported: routers that return their top-k indices (transformers' `*TopKRouter` modules: Qwen3-MoE, Qwen2-MoE,
Mixtral, ...). A model without such routers refuses the field (`unsupported_reason`).
"""
from __future__ import annotations

import torch

from slime_like.backends.engine_api.routed_experts import encode  # noqa: F401  (the engine's answers)


def _router_modules(model) -> list:
    return [m for name, m in model.named_modules() if type(m).__name__.endswith("TopKRouter")]


class RoutingRecorder:
    """Installed once per model; `capture()` returns the routing of the last forward as `[N, L, k]` int32."""

    def __init__(self, model):
        self.routers = _router_modules(model)
        self._last: list = [None] * len(self.routers)
        for i, m in enumerate(self.routers):
            m.register_forward_hook(self._hook(i))

    @property
    def supported(self) -> bool:
        return bool(self.routers)

    def _hook(self, i: int):
        def record(module, inputs, output):
            indices = [o for o in (output if isinstance(output, tuple) else (output,))
                       if torch.is_tensor(o) and not o.is_floating_point()]
            self._last[i] = indices[-1].detach().to(torch.int32) if indices else None
        return record

    def capture(self) -> torch.Tensor:
        """`[N, L, k]`: the top-k expert ids of every token of the last forward (N = batch x sequence, row-major)."""
        if any(t is None for t in self._last):
            raise RuntimeError("a MoE router of this model returned no expert indices")
        out = torch.stack(self._last, dim=1)
        self._last = [None] * len(self.routers)
        return out


def prefill_rows(routing: torch.Tensor, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Each prompt's `[P, L, k]` rows from a prefill's routing: the prompts were left-padded to the longest
    distinct prompt and identical prompts computed once (kv_batch.prefill)."""
    index: dict[tuple, int] = {}
    which = [index.setdefault(tuple(p), len(index)) for p in prompts]
    T = max(len(p) for p in index)
    grid = routing.reshape(len(index), T, *routing.shape[1:])
    return [grid[w, T - len(p):] for w, p in zip(which, prompts)]

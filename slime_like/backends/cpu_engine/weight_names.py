"""Checkpoint weight name -> the tensor of the live model it writes, by transformers' own conversion mapping.

transformers 5 changes some layouts at load time: Qwen2.5-VL's checkpoint 'model.embed_tokens.*' lives in the module
'model.language_model.*' (a WeightRenaming), and every MoE family (qwen2_moe / qwen3_moe / deepseek_v3 / glm4_moe /
qwen3_next / mixtral ...) holds its experts fused, 'mlp.experts.gate_up_proj' [E, 2I, H] and 'mlp.experts.down_proj'
[E, H, I], built from the per-expert checkpoint keys 'mlp.experts.<e>.gate_proj.weight' ... by a WeightConverter whose
operations say how (MergeModulelist(dim) stacks the experts, Concatenate(dim) joins gate and up). A weight push sends
the checkpoint (per-expert) names, as SGLang / vLLM take them, so each such name resolves here to a view of its slice of
the fused parameter: the layout is read from the converter's operations, never hard-coded per family.
"""
from __future__ import annotations

import re
import weakref

import torch

from slime_like.backends.engine_api.protocol import BadRequest

_TRANSFORMS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _transforms(model) -> tuple[list, list]:
    """(renamings, converters) of transformers' conversion mapping for this model, computed once per model."""
    if model not in _TRANSFORMS:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming

        mapping = get_model_conversion_mapping(model)
        _TRANSFORMS[model] = ([t for t in mapping if isinstance(t, WeightRenaming)],
                              [t for t in mapping if isinstance(t, WeightConverter)])
    return _TRANSFORMS[model]


def resolve(model, params: dict[str, torch.Tensor], name: str) -> torch.Tensor | None:
    """The tensor `name` writes: a parameter / persistent buffer itself, the one transformers' renamings map it to,
    or a view (sharing storage) of its slice of a fused parameter; None when the name is none of these. A name that
    maps to a fused parameter by operations that have no in-place slice is refused, naming them."""
    p = params.get(name)
    if p is not None:
        return p.data
    from transformers.core_model_loading import apply_converters, apply_renamings

    renamings, converters = _transforms(model)
    renamed = apply_renamings(name, renamings)
    if renamed in params:
        return params[renamed].data
    target, pattern = apply_converters(renamed, converters)
    if pattern is None or target not in params:
        return None
    converter = next(c for c in converters if pattern in c.source_patterns)
    return _fused_slice(name, renamed, params[target].data, target, converter, pattern)


def _fused_slice(name: str, renamed: str, fused: torch.Tensor, target: str, converter, pattern: str) -> torch.Tensor:
    """The slice of `fused` that checkpoint key `renamed` (matched by `pattern` of `converter`) becomes at load time.

    Supported operations are the MoE ones: MergeModulelist(dim=m) (expert e is index e along m), optionally followed
    by Concatenate(dim=c) of the converter's source patterns in order (pattern i is the i-th of n equal chunks along c
    of the stacked tensor; equal chunks are also what transformers' reverse op, Chunk, assumes when it saves)."""
    from transformers.core_model_loading import Concatenate, MergeModulelist

    ops = converter.operations
    supported = (ops and isinstance(ops[0], MergeModulelist)
                 and (len(ops) == 1 and len(converter.source_patterns) == 1
                      or len(ops) == 2 and isinstance(ops[1], Concatenate) and ops[1].dim != ops[0].dim))
    if not supported:
        raise BadRequest(f"weight {name!r} maps to {target!r} by transformers' conversion {ops}, which the CPU engine "
                         "cannot write in place; push the model's own parameter name instead")
    before, _, after = pattern.partition("*")
    index = re.search(re.escape(before) + r"(\d+)" + re.escape(after) + r"(?!\w)", renamed)
    if index is None:
        raise BadRequest(f"weight {name!r}: no expert index where transformers' pattern {pattern!r} has '*'")
    expert, merge_dim = int(index.group(1)), ops[0].dim
    if expert >= fused.shape[merge_dim]:
        raise BadRequest(f"weight {name!r}: expert {expert} does not exist; {target!r} holds "
                         f"{fused.shape[merge_dim]} experts (0..{fused.shape[merge_dim] - 1})")
    if len(ops) == 2:
        n, cat_dim = len(converter.source_patterns), ops[1].dim
        size = fused.shape[cat_dim] // n
        fused = fused.narrow(cat_dim, converter.source_patterns.index(pattern) * size, size)
    return fused.select(merge_dim, expert)


"""Vision-language models in the FSDP trainer: which HF class, the vision tower, and the forward inputs.

A checkpoint whose config.json has a `vision_config` is trained as the Hugging Face model it is
(`AutoModelForImageTextToText`: Qwen2_5_VLForConditionalGeneration, Qwen3VLForConditionalGeneration).
- The vision tower is the model's `visual` submodule (patch embedding, vision blocks, and the merger that
  projects into the language model's hidden size; Qwen3-VL's deepstack mergers too). `--freeze-vision-tower`
  freezes all of it; the language model and the LM head always train.
- Forward: each micro-batch row is one sample (the FSDP trainer never packs rows), so the M-RoPE positions are
  the ones transformers itself computes (`get_rope_index`) from the row's image tokens and `image_grid_thw`.
  transformers 5 computes them only when `mm_token_type_ids` is passed (the processor returns it): without it
  Qwen2.5-VL silently falls back to 1-D positions (log-probs off by 3e-3 on the tiny model) and Qwen3-VL
  raises. We build it from the token ids (image token -> 1), as the processor does (no videos).
"""
from __future__ import annotations

import torch
from torch import nn

# model_type -> what the trainer was checked with (log-prob agreement with transformers, tests/fsdp/test_vlm_*)
VISION_LANGUAGE_TYPES = ("qwen2_5_vl", "qwen3_vl")
VISION_MODULE = "visual"  # the vision tower's attribute in both families (model.model.visual)


def is_vision_language(config) -> bool:
    return getattr(config, "vision_config", None) is not None


def check_supported(config, source: str) -> None:
    model_type = getattr(config, "model_type", None)
    if model_type not in VISION_LANGUAGE_TYPES:
        raise ValueError(f"{source}: vision-language model_type {model_type!r} is not supported by the FSDP trainer "
                         f"(supported: {', '.join(VISION_LANGUAGE_TYPES)})")


def text_config(config):
    """The language model's config (the top-level one for text models)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def vision_tower(model: nn.Module) -> nn.Module | None:
    """The `visual` submodule (through peft's wrappers too); None for a text model."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == VISION_MODULE:
            return module
    return None


def vision_prefixes(model: nn.Module) -> tuple[str, ...]:
    """Dotted names of the vision tower's parameters' prefix, e.g. ('model.visual.',)."""
    return tuple(f"{name}." for name, _ in model.named_modules() if name.rsplit(".", 1)[-1] == VISION_MODULE)


def freeze(model: nn.Module) -> int:
    """requires_grad False on every vision-tower parameter; returns how many were frozen."""
    tower = vision_tower(model)
    params = list(tower.parameters()) if tower is not None else []
    for p in params:
        p.requires_grad_(False)
    return len(params)


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The vision tower's own FSDP units: each vision block, then the tower (patch embedding, mergers). A frozen
    tower then sits in units of its own, never sharing a unit (and its reduce-scatter) with trainable weights."""
    tower = vision_tower(model)
    if tower is None:
        return []
    blocks = getattr(tower, "blocks", None)
    return [*(blocks if isinstance(blocks, nn.ModuleList) else []), tower]


def linear_names(model: nn.Module) -> list[str]:
    """Full names of the vision tower's linear layers (LoRA excludes them when the tower is frozen)."""
    prefixes = vision_prefixes(model)
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear) and name.startswith(prefixes)]


def forward_kwargs(config, mb, device=None) -> dict:
    """Keyword arguments of the HF VLM's forward on micro-batch `mb`: the images and `mm_token_type_ids` (every
    image token -> 1: the prompt's placeholders, and a multi-turn observation's inside the response, whose pixels
    the rollout appended to the sample's multimodal_train_inputs), no position_ids (transformers computes the
    M-RoPE positions), no KV cache. The rollout ends a response before a sampled placeholder (generate_group.py),
    so every image token has an image behind it."""
    tokens, multimodal = mb.tokens, mb.multimodal
    placeholders = tokens == config.image_token_id
    out = {"input_ids": tokens, "mm_token_type_ids": placeholders.to(torch.int32), "use_cache": False}
    n_tokens = int(placeholders.sum())
    merge = int(config.vision_config.spatial_merge_size) ** 2
    expected = int(multimodal["image_grid_thw"].prod(-1).sum()) // merge if multimodal is not None else 0
    if n_tokens != expected:  # HF's own check says only "do not match" (or nothing, without images): name the cause
        raise ValueError(f"micro-batch has {n_tokens} image tokens but its image_grid_thw describes {expected} "
                         "(t*h*w / merge_size^2 per image): the samples' tokens and multimodal_train_inputs "
                         "disagree")
    if multimodal is not None:
        out.update({k: v.to(device) if device is not None else v for k, v in multimodal.items()})
    return out

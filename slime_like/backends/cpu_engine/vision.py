"""Vision-language serving in the CPU engine: Qwen2.5-VL and Qwen3-VL through transformers.

A request's images come in SGLang's `image_data` field: PNG/JPEG data URLs or raw base64 only (a path or an http
URL would make the engine read files or fetch on a client's behalf; refused). They are decoded and run through
the checkpoint's image processor off the scheduler thread (with the request's parsing), and the prompt must hold
the expanded image placeholders (`<|image_pad|>` x t*h*w/merge^2 per image, as the HF processor and our data
stage write them): a mismatch is a 400 before any model work.

In the model, positions are M-RoPE: the prefill's 3-axis positions come from the model's own get_rope_index over
the (left-padded) prompt, and every later token of a row sits at (tokens so far + that row's rope delta) on all
three axes, as transformers' generate does.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import torch

from slime_like.backends.engine_api.protocol import BadRequest

MAX_IMAGES_PER_PROMPT = 64


@dataclass
class PromptImages:
    """One prompt's processed images."""
    pixel_values: torch.Tensor      # [patches, C*T*P*P]
    image_grid_thw: torch.Tensor    # [n_images, 3]
    token_counts: list[int]         # image tokens each image takes in the prompt
    key: str                        # identity of the pixel data: identical prompts with identical images share KV


def is_vision_checkpoint(model_path: str) -> bool:
    """config.json describes a vision-language model (has a vision_config)."""
    with open(os.path.join(model_path, "config.json")) as f:
        return "vision_config" in json.load(f)


class VisionServing:
    """The served VLM's image processor and image token; turns image_data into PromptImages."""

    def __init__(self, model_path: str):
        from slime_like.multimodal.processor import load_processor

        self.processor = load_processor(model_path)
        self.image_token_id = self.processor.image_token_id

    def prompt_images(self, image_data, where: str) -> PromptImages | None:
        """Decode and process one prompt's image_data (a list of data URLs / base64, or one); None: no image."""
        from slime_like.multimodal.images import ImageLoadError, load_embedded_image
        from slime_like.multimodal.processor import image_token_counts, process_images

        items = image_data if isinstance(image_data, list) else [image_data]
        if not items:
            return None
        if len(items) > MAX_IMAGES_PER_PROMPT:
            raise BadRequest(f"{where}: {len(items)} images, more than {MAX_IMAGES_PER_PROMPT} per prompt")
        images = []
        for i, item in enumerate(items):
            try:
                images.append(load_embedded_image(item, where=f"{where}: image_data[{i}]"))
            except ImageLoadError as e:
                raise BadRequest(str(e)) from None
        out = process_images(self.processor, images)
        digest = hashlib.sha1(out["pixel_values"].numpy().tobytes())
        digest.update(out["image_grid_thw"].numpy().tobytes())
        return PromptImages(out["pixel_values"], out["image_grid_thw"],
                            image_token_counts(self.processor, out["image_grid_thw"]), digest.hexdigest())

    def check_placeholders(self, input_ids: list[int], images: PromptImages | None, where: str) -> None:
        """The prompt holds exactly the image tokens its images need (BadRequest otherwise)."""
        have = sum(1 for t in input_ids if t == self.image_token_id)
        want = sum(images.token_counts) if images else 0
        if have != want:
            raise BadRequest(f"{where}: the prompt has {have} image token(s) (id {self.image_token_id}) but its "
                             f"{len(images.token_counts) if images else 0} image(s) need {want} "
                             f"({images.token_counts if images else []} each); expand each image placeholder as the "
                             "model's processor does")


def prefill_inputs(model, image_token_id: int, ids: torch.Tensor, mask: torch.Tensor,
                   images: list[PromptImages | None]) -> tuple[dict, torch.Tensor]:
    """(extra forward kwargs of a VLM prefill: 3-axis position_ids, pixel_values, image_grid_thw; each row's rope
    delta [B]) for left-padded `ids` / `mask` whose row i has `images[i]`."""
    with_images = [im for im in images if im is not None]
    grids = torch.cat([im.image_grid_thw for im in with_images]) if with_images else None
    type_ids = (ids == image_token_id).to(torch.int32) * mask.to(torch.int32)
    position_ids, deltas = model.model.get_rope_index(ids, type_ids, image_grid_thw=grids, attention_mask=mask)
    kwargs = {"position_ids": position_ids}
    if with_images:
        kwargs.update(pixel_values=torch.cat([im.pixel_values for im in with_images]).to(model.dtype),
                      image_grid_thw=grids)
    return kwargs, deltas.reshape(-1).to(torch.long)


def score_inputs(image_token_id: int, input_ids: list[int], images: PromptImages | None) -> dict:
    """Forward kwargs of one unpadded prompt (the model computes its M-RoPE positions from mm_token_type_ids)."""
    from slime_like.multimodal.processor import hf_model_inputs

    train = None if images is None else {"pixel_values": images.pixel_values, "image_grid_thw": images.image_grid_thw}
    return hf_model_inputs(image_token_id, input_ids, train)

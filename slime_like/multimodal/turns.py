"""Multi-turn rollouts with images: append an environment turn that shows new images to a Sample.

slime's multi-turn VLM example (examples/geo3k_vlm_multi_turn) appends each observation as non-trainable
response tokens (loss mask 0, log-prob 0.0), sends the engine every image so far as image_data, and trains on the
concatenation of each turn's processor output. `append_observation` does that for one turn:

- the turn's text is what the chat template writes for it after earlier turns (rendered after two fixed messages
  and cut after them, so a template's default system prompt is not repeated), image placeholders expanded;
- Sample.multimodal_inputs["image"] grows by the turn's PNG data URLs;
- Sample.multimodal_train_inputs becomes the old pixel_values / image_grid_thw with the turn's appended (a new
  dict: the group's samples may share the old one).
"""
from __future__ import annotations

from slime_like.multimodal.images import image_to_data_url
from slime_like.multimodal.processor import VisionProcessor, encode_prompt

# Fixed turns the observation is rendered after, then cut off (slime's DUMMY_MESSAGES idea)
_BEFORE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]


def observation_text(processor: VisionProcessor, message: dict) -> str:
    """The template's text of one more user/tool turn, followed by the assistant's generation prompt."""
    head = processor.apply_chat_template(_BEFORE, add_generation_prompt=False)
    full = processor.apply_chat_template(_BEFORE + [message], add_generation_prompt=True)
    if not full.startswith(head):
        raise ValueError("the chat template renders earlier turns differently once a turn follows them; cannot "
                         "cut out one observation turn")
    return full[len(head):]


def append_observation(sample, processor: VisionProcessor, message: dict, images: list) -> list[int]:
    """Append one environment turn (`message`, whose content has one {"type": "image"} item per image of
    `images`, PIL) to `sample` as non-trainable tokens; returns the appended ids."""
    import torch

    enc = encode_prompt(processor, observation_text(processor, message), list(images))
    sample.append_response_tokens(tokens=enc.token_ids, trainable=False)
    if not images:
        return enc.token_ids
    media = dict(sample.multimodal_inputs or {})
    media["image"] = list(media.get("image") or []) + [image_to_data_url(im) for im in images]
    sample.multimodal_inputs = media
    new, old = enc.multimodal_train_inputs, sample.multimodal_train_inputs
    sample.multimodal_train_inputs = new if not old else {k: torch.cat([old[k], new[k]]) for k in new}
    return enc.token_ids

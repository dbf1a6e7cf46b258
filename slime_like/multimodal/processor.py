"""The vision-language model's processor: chat template, image pre-processing and image-placeholder expansion.

transformers builds the Qwen-VL processor classes (Qwen2_5_VLProcessor, Qwen3VLProcessor) only with torchvision
installed (their video processor needs it; torch is pinned to a CPU build here and no CPU torchvision matches it),
while their image processors load without it (the PIL backend; the fast torchvision one where installed). So a
`VisionProcessor` is composed from the checkpoint's own files: its tokenizer, its image processor
(AutoImageProcessor) and its chat template, and expands each image placeholder as the HF processor does: the
image token repeated t*h*w / merge_size^2 times, at the text level, then tokenized
(tests/multimodal/test_processor.py checks the ids and pixel values against transformers' processor class).
"""
from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass


@dataclass
class VisionProcessor:
    """What the data stage, the rollout and the engines need of a vision-language checkpoint's processor."""

    tokenizer: object
    image_processor: object
    chat_template: str | None
    image_token: str
    image_token_id: int
    merge_size: int

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, **kwargs) -> str:
        """The prompt text of `messages`, one `<|vision_start|><|image_pad|><|vision_end|>` per image item."""
        return self.tokenizer.apply_chat_template(messages, chat_template=self.chat_template, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt, **kwargs)


def load_processor(hf_checkpoint: str, trust_remote_code: bool = False) -> VisionProcessor:
    """The VisionProcessor of a local checkpoint (local files only; remote code only when the user asked)."""
    from transformers import AutoImageProcessor, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf_checkpoint, local_files_only=True,
                                              trust_remote_code=trust_remote_code)
    image_processor = AutoImageProcessor.from_pretrained(hf_checkpoint, local_files_only=True,
                                                         trust_remote_code=trust_remote_code)
    image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
    image_token_id = tokenizer.convert_tokens_to_ids(image_token)
    if image_token_id is None or image_token_id == tokenizer.unk_token_id:
        raise ValueError(f"--hf-checkpoint {hf_checkpoint}: its tokenizer has no image token {image_token!r}; "
                         "give a vision-language checkpoint (Qwen2.5-VL, Qwen3-VL)")
    return VisionProcessor(tokenizer=tokenizer, image_processor=image_processor,
                           chat_template=_chat_template(hf_checkpoint, tokenizer), image_token=image_token,
                           image_token_id=int(image_token_id), merge_size=int(image_processor.merge_size))


def _chat_template(hf_checkpoint: str, tokenizer) -> str | None:
    """The processor's chat template where the HF processor finds it (chat_template.jinja, then the legacy
    chat_template.json), else the tokenizer's."""
    jinja = os.path.join(hf_checkpoint, "chat_template.jinja")
    if os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as f:
            return f.read()
    legacy = os.path.join(hf_checkpoint, "chat_template.json")
    if os.path.isfile(legacy):
        with open(legacy, encoding="utf-8") as f:
            return json.load(f)["chat_template"]
    return getattr(tokenizer, "chat_template", None)


def process_images(processor: VisionProcessor, images: list) -> dict:
    """{"pixel_values": float32 Tensor[n_patches, C*T*P*P], "image_grid_thw": LongTensor[n_images, 3]}."""
    import torch

    out = processor.image_processor(images=list(images), return_tensors="pt")
    return {"pixel_values": out["pixel_values"].to(torch.float32),
            "image_grid_thw": out["image_grid_thw"].to(torch.long)}


def image_token_counts(processor: VisionProcessor, image_grid_thw) -> list[int]:
    """Placeholder tokens per image: t*h*w / merge_size^2 (the HF processor's replace_image_token)."""
    merge = processor.merge_size ** 2
    return [int(t) * int(h) * int(w) // merge for t, h, w in image_grid_thw.tolist()]


def image_token_counts_of(processor: VisionProcessor, images: list) -> list[int]:
    """image_token_counts of PIL images from their sizes alone (the image processor's own resize arithmetic,
    get_number_of_image_patches), without computing any pixel: what the data stage needs for prompt lengths."""
    merge = processor.merge_size ** 2
    return [processor.image_processor.get_number_of_image_patches(img.height, img.width, {}) // merge
            for img in images]


def expand_image_placeholders(processor: VisionProcessor, text: str, image_grid_thw=None,
                              counts: list[int] | None = None) -> str:
    """`text` with its i-th image token repeated counts[i] times (from the grids when not given); the number of
    placeholders must equal the number of images."""
    if counts is None:
        counts = image_token_counts(processor, image_grid_thw)
    parts = text.split(processor.image_token)
    if len(parts) - 1 != len(counts):
        raise ValueError(f"the prompt has {len(parts) - 1} image placeholder(s) {processor.image_token!r} for "
                         f"{len(counts)} image(s); give one placeholder per image")
    pieces = [parts[0]]
    for count, rest in zip(counts, parts[1:]):
        pieces.append(processor.image_token * count + rest)
    return "".join(pieces)


@functools.lru_cache(maxsize=4)
def cached_processor(hf_checkpoint: str, trust_remote_code: bool = False) -> VisionProcessor:
    """One VisionProcessor per checkpoint and process (the data source, the rollout and eval share it)."""
    return load_processor(hf_checkpoint, trust_remote_code)


def prompt_token_ids(processor: VisionProcessor, prompt_text: str, images: list) -> list[int]:
    """encode_prompt's token ids without the pixel values (the counts come from the image sizes)."""
    text = expand_image_placeholders(processor, prompt_text, counts=image_token_counts_of(processor, images))
    return list(processor.tokenizer(text, add_special_tokens=False)["input_ids"])


@dataclass
class EncodedPrompt:
    """A prompt's ids with the image placeholders expanded, and its images' processor output (None: no image)."""

    text: str
    token_ids: list[int]
    multimodal_train_inputs: dict | None


def encode_prompt(processor: VisionProcessor, prompt_text: str, images: list) -> EncodedPrompt:
    """Tokenize a templated prompt with its images: what the HF processor's __call__ returns as input_ids,
    pixel_values and image_grid_thw (the text is tokenized without special tokens added, as the processor does)."""
    if not images:
        if processor.image_token in prompt_text:
            raise ValueError(f"the prompt has image placeholder(s) {processor.image_token!r} but no image")
        ids = processor.tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
        return EncodedPrompt(prompt_text, list(ids), None)
    train_inputs = process_images(processor, images)
    text = expand_image_placeholders(processor, prompt_text, train_inputs["image_grid_thw"])
    ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
    return EncodedPrompt(text, list(ids), train_inputs)


def mm_token_type_ids(image_token_id: int, input_ids):
    """Per-token modality ids of `input_ids` (a LongTensor of any shape): 1 at image tokens, 0 elsewhere (the HF
    processor's create_mm_token_type_ids). transformers' Qwen-VL models compute M-RoPE positions only when
    given these (Qwen3-VL refuses without them; Qwen2.5-VL silently falls back to text positions)."""
    import torch

    return (input_ids == image_token_id).to(torch.int32)


def hf_model_inputs(image_token_id: int, token_ids: list[int], multimodal_train_inputs: dict | None) -> dict:
    """The keyword arguments of one sequence's HF VLM forward / generate: input_ids [1, L], and with images
    mm_token_type_ids, pixel_values and image_grid_thw."""
    import torch

    ids = torch.tensor([list(token_ids)], dtype=torch.long)
    if not multimodal_train_inputs:
        return {"input_ids": ids}
    return {"input_ids": ids, "mm_token_type_ids": mm_token_type_ids(image_token_id, ids),
            "pixel_values": multimodal_train_inputs["pixel_values"],
            "image_grid_thw": multimodal_train_inputs["image_grid_thw"]}


def train_inputs_of(processor: VisionProcessor, multimodal_inputs: dict | None) -> dict | None:
    """Sample.multimodal_train_inputs of a Sample.multimodal_inputs ({"image": [data URL, ...]}); None: no image."""
    urls = (multimodal_inputs or {}).get("image") or []
    if not urls:
        return None
    if processor is None:
        raise ValueError("a sample carries images but the run has no image processor; set --multimodal-keys")
    from slime_like.multimodal.images import load_image

    return process_images(processor, [load_image(u, where=f"sample image {i}") for i, u in enumerate(urls)])

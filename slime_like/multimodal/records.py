"""slime's multimodal prompt records: `--multimodal-keys '{"image": "images"}'` maps a media type to the record key
holding that row's list of images; the prompt places them with `<image>` placeholders (slime's
MultimodalTypes.IMAGE.placeholder), one per image, in order.

    {"prompt": "<image>How many squares?", "images": ["imgs/0.png"], "label": "3"}
    {"prompt": [{"role": "user", "content": "<image>Compare <image>"}], "images": ["a.png", "b.png"], ...}
    {"prompt": [{"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "?"}]}]}

As slime's data.py: a string prompt becomes one user message; each message's string content is split on the
placeholders into a Qwen-VL content list ([{"type": "image", "image": ref}, {"type": "text", "text": ...}]); a
content that is already such a list is taken as is, its image items' `image` values being the images. An image
list item may also be a dict (Qwen-VL's rich form, {"image": ref, ...}). Torch-free: the preflight uses it.
"""
from __future__ import annotations

import os
import re

from slime_like.multimodal.images import ImageLoadError, image_to_data_url, load_image

IMAGE_PLACEHOLDER = "<image>"
MEDIA_TYPES = ("image",)           # video / audio: refused by the config check, naming the media type
MAX_IMAGES_PER_PROMPT = 64


class PromptImagesError(ValueError):
    """A record's prompt and its images do not fit together (counts, types); the message names the row."""


def multimodal_keys_problems(value) -> list[str]:
    """Why a --multimodal-keys value cannot be used (empty when it can)."""
    if not isinstance(value, dict) or not value:
        return [f"--multimodal-keys {value!r}: expected a JSON object mapping a media type to the record key of "
                "its list, e.g. '{\"image\": \"images\"}'"]
    problems = []
    for media, key in value.items():
        if media not in MEDIA_TYPES:
            problems.append(f"--multimodal-keys: media type {media!r} is not supported (supported: "
                            f"{', '.join(MEDIA_TYPES)}); drop it")
        if not isinstance(key, str) or not key:
            problems.append(f"--multimodal-keys: {media!r} maps to {key!r}; give the record key (a string) holding "
                            "the list of images")
    return problems


def _ref(item):
    """An image list item: a reference (path, URL, base64, parquet struct) or Qwen-VL's {"image": ref, ...}."""
    if isinstance(item, dict) and "image" in item:
        return item["image"]
    return item


def prompt_messages(prompt, images: list, where: str) -> tuple[list[dict], list]:
    """(chat messages with image items, image references in placeholder order) of one record."""
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list) and all(isinstance(m, dict) and "content" in m for m in prompt):
        messages = [dict(m) for m in prompt]
    else:
        raise PromptImagesError(f"{where}: the prompt is a {type(prompt).__name__}; multimodal prompts are a string "
                                "or a list of chat messages")
    pending, ordered, placeholders = list(images), [], 0
    for m in messages:
        content = m["content"]
        if isinstance(content, str):
            items = []
            for piece in re.split(f"({re.escape(IMAGE_PLACEHOLDER)})", content):
                if piece == IMAGE_PLACEHOLDER:
                    placeholders += 1
                    if pending:
                        ref = _ref(pending.pop(0))
                        ordered.append(ref)
                        items.append({"type": "image", "image": ref})
                elif piece:
                    items.append({"type": "text", "text": piece})
            m["content"] = items
        elif isinstance(content, list):
            for item in content:
                if isinstance(item, dict) and item.get("type") == "image":
                    ordered.append(_ref(item))
        else:
            raise PromptImagesError(f"{where}: a message's content is a {type(content).__name__}; expected text or "
                                    "a list of content items")
    if placeholders != len(images):
        raise PromptImagesError(f"{where}: the prompt has {placeholders} '{IMAGE_PLACEHOLDER}' placeholder(s) for "
                                f"{len(images)} image(s); write one '{IMAGE_PLACEHOLDER}' per image where it goes")
    if len(ordered) > MAX_IMAGES_PER_PROMPT:
        raise PromptImagesError(f"{where}: {len(ordered)} images in one prompt, more than {MAX_IMAGES_PER_PROMPT}")
    return messages, ordered


def record_images(row: dict, multimodal_keys: dict, input_key: str, where: str, base_dir: str | None):
    """(messages, RGB PIL images) of one record; raises PromptImagesError / ImageLoadError naming the row."""
    key = multimodal_keys.get("image")
    messages, refs = prompt_messages(row[input_key], _image_list(row, multimodal_keys, where), where)
    loaded = [load_image(ref, where=f"{where}: image {i} ({_source(key, i)})", base_dir=base_dir)
              for i, ref in enumerate(refs)]
    return messages, loaded


def _source(key, i: int) -> str:
    return f"key '{key}'[{i}]" if key else "in the prompt's messages"


def record_problems(row: dict, multimodal_keys: dict, input_key: str, where: str, base_dir: str | None) -> list[str]:
    """Every problem of one record's images (each image checked, not only the first bad one)."""
    try:
        _, refs = prompt_messages(row[input_key], _image_list(row, multimodal_keys, where), where)
    except PromptImagesError as e:
        return [str(e)]
    problems = []
    key = multimodal_keys.get("image")
    for i, ref in enumerate(refs):
        try:
            load_image(ref, where=f"{where}: image {i} ({_source(key, i)})", base_dir=base_dir)
        except ImageLoadError as e:
            problems.append(str(e))
    return problems


def _image_list(row: dict, multimodal_keys: dict, where: str) -> list:
    """The record's list of images (none when the key is absent or null: a text-only row)."""
    key = multimodal_keys.get("image")
    images = row.get(key) if key else None
    if images is None:
        return []
    images = images.tolist() if hasattr(images, "tolist") else images  # a numpy array (pandas' parquet reader)
    if not isinstance(images, list):
        raise PromptImagesError(f"{where}: key {key!r} holds a {type(images).__name__}; expected a list of images")
    return images


def data_urls(images: list) -> list[str]:
    return [image_to_data_url(img) for img in images]


def data_dir(path: str) -> str:
    """Relative image paths are read from the data file's folder."""
    return os.path.dirname(os.path.abspath(path))

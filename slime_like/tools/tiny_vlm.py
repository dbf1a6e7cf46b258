"""Build tiny Qwen-VL checkpoints locally: a random-init HF vision-language model + char tokenizer + processor files.

The vision-language twin of tools/tiny_model.py, for Qwen2.5-VL and Qwen3-VL. The tokenizer is the same
character-level one plus the Qwen-VL special tokens (`<|im_start|>`, `<|im_end|>`, `<|vision_start|>`,
`<|vision_end|>`, `<|image_pad|>`, `<|video_pad|>`), `<|im_end|>` being the end-of-sequence token as in the
Qwen-VL instruct models. The chat template writes one `<|vision_start|><|image_pad|><|vision_end|>` per image
item of a message (the processor expands the pad to one token per merged patch). The image processor is saved with
tiny min / max pixels, so a 56x56 image becomes a 4x4 patch grid = 4 image tokens.

Files written, as the published Qwen-VL checkpoints lay them out: config.json, model.safetensors,
generation_config.json, tokenizer.json / tokenizer_config.json, preprocessor_config.json (the image processor),
chat_template.jinja and processor_config.json (processor_class, so AutoProcessor finds the family's processor where
torchvision is installed).

    python -m slime_like.tools.tiny_vlm OUT_DIR [--family qwen2_5_vl|qwen3_vl] [--hidden-size 64] ...
"""
from __future__ import annotations

import argparse
import json
import os

from slime_like.tools.tiny_model import DEFAULT_ALPHABET, _round_up, build_char_tokenizer

FAMILIES = ("qwen2_5_vl", "qwen3_vl")
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
VL_SPECIAL_TOKENS = (IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
# Qwen-VL's chat layout: a message's content is a string or a list of {"type": "image"} / {"type": "text", "text"}
# items (slime's multimodal prompts are such lists); every image item becomes one vision block.
VL_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' or 'image' in item %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Per family: the HF processor class, the vision patch size and the image normalisation the published
# checkpoints use (Qwen2.5-VL: CLIP's mean/std, patch 14; Qwen3-VL: 0.5/0.5, patch 16).
_FAMILY_VISION = {
    "qwen2_5_vl": dict(processor="Qwen2_5_VLProcessor", patch=14,
                       mean=[0.48145466, 0.4578275, 0.40821073], std=[0.26862954, 0.26130258, 0.27577711]),
    "qwen3_vl": dict(processor="Qwen3VLProcessor", patch=16, mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5]),
}
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2


def build_vl_tokenizer(alphabet: str = DEFAULT_ALPHABET):
    """The char tokenizer of tools/tiny_model.py + the Qwen-VL special tokens; eos = `<|im_end|>`."""
    tok = build_char_tokenizer(alphabet)
    tok.add_special_tokens({"additional_special_tokens": list(VL_SPECIAL_TOKENS)})
    tok.eos_token = IM_END
    tok.chat_template = VL_CHAT_TEMPLATE
    return tok


def build_tiny_vlm_checkpoint(out_dir: str, family: str = "qwen2_5_vl", hidden_size: int = 64, num_layers: int = 2,
                              num_heads: int = 4, num_kv_heads: int = 2, ffn_hidden_size: int = 128,
                              vision_hidden_size: int = 32, vision_depth: int = 2, vision_heads: int = 2,
                              min_image_side: int | None = None, max_image_side: int | None = None,
                              tie_embeddings: bool = True, alphabet: str = DEFAULT_ALPHABET, vocab_multiple: int = 64,
                              max_position_embeddings: int = 1024, seed: int = 0, init_std: float = 0.02) -> str:
    """Write a randomly initialised Qwen2.5-VL / Qwen3-VL model, its tokenizer and processor to `out_dir`.

    Image sizes are bounded by min/max pixels = side^2 (defaults: 2 and 4 merged patches a side, i.e. 28 and 56
    pixels for Qwen2.5-VL, 32 and 64 for Qwen3-VL), so an image costs 1 to 16 image tokens. Deterministic per seed.
    """
    import torch

    if family not in FAMILIES:
        raise ValueError(f"unknown tiny VLM family {family!r}; choose {', '.join(FAMILIES)}")
    vis = _FAMILY_VISION[family]
    unit = vis["patch"] * MERGE_SIZE  # one merged patch, in pixels
    min_side, max_side = min_image_side or 2 * unit, max_image_side or 4 * unit
    tok = build_vl_tokenizer(alphabet)
    cfg, cls = _config_and_class(family, tok, hidden_size, num_layers, num_heads, num_kv_heads, ffn_hidden_size,
                                 vision_hidden_size, vision_depth, vision_heads, tie_embeddings, vocab_multiple,
                                 max_position_embeddings, init_std)
    torch.manual_seed(seed)
    model = cls(cfg).to(torch.float32)
    os.makedirs(out_dir, exist_ok=True)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    _save_processor_files(out_dir, family, min_side * min_side, max_side * max_side)
    return out_dir


def _config_and_class(family, tok, hidden_size, num_layers, num_heads, num_kv_heads, ffn_hidden_size,
                      vision_hidden_size, vision_depth, vision_heads, tie_embeddings, vocab_multiple,
                      max_position_embeddings, init_std):
    """(transformers config, model class) of a tiny Qwen-VL `family`."""
    import transformers

    head_dim = hidden_size // num_heads
    # M-RoPE splits the head's rotary half over (temporal, height, width): the published ratios, scaled down
    # (Qwen2.5-VL [16, 24, 24] of 64, Qwen3-VL [24, 20, 20] of 64).
    half = head_dim // 2
    spatial = 3 * half // 8 if family == "qwen2_5_vl" else 5 * half // 16
    mrope = [half - 2 * spatial, spatial, spatial]
    ids = {name: tok.convert_tokens_to_ids(name) for name in VL_SPECIAL_TOKENS}
    text = dict(vocab_size=_round_up(len(tok), vocab_multiple), hidden_size=hidden_size,
                intermediate_size=ffn_hidden_size, num_hidden_layers=num_layers, num_attention_heads=num_heads,
                num_key_value_heads=num_kv_heads, max_position_embeddings=max_position_embeddings, rms_norm_eps=1e-6,
                initializer_range=init_std, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                bos_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                    "mrope_section": mrope})
    vision = dict(depth=vision_depth, hidden_size=vision_hidden_size, intermediate_size=2 * vision_hidden_size,
                  num_heads=vision_heads, patch_size=_FAMILY_VISION[family]["patch"], spatial_merge_size=MERGE_SIZE,
                  temporal_patch_size=TEMPORAL_PATCH_SIZE, out_hidden_size=hidden_size, initializer_range=init_std)
    tokens = dict(image_token_id=ids[IMAGE_PAD], video_token_id=ids[VIDEO_PAD],
                  vision_start_token_id=ids[VISION_START], vision_end_token_id=ids[VISION_END],
                  tie_word_embeddings=tie_embeddings)
    if family == "qwen2_5_vl":
        # window attention over 2x2 merged patches, the last block full attention (as the published 7B's pattern)
        vision.update(window_size=2 * MERGE_SIZE * vision["patch_size"], fullatt_block_indexes=[vision_depth - 1])
        cfg = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **tokens)
        return cfg, transformers.Qwen2_5_VLForConditionalGeneration
    text.update(head_dim=head_dim)
    text["rope_parameters"]["mrope_interleaved"] = True
    # learned position embeddings over a 8x8 patch grid; deepstack features from the first block
    vision.update(num_position_embeddings=64, deepstack_visual_indexes=[0])
    cfg = transformers.Qwen3VLConfig(text_config=text, vision_config=vision, **tokens)
    return cfg, transformers.Qwen3VLForConditionalGeneration


def _save_processor_files(out_dir: str, family: str, min_pixels: int, max_pixels: int) -> None:
    """preprocessor_config.json (the image processor), chat_template.jinja and processor_config.json.

    Written as JSON, not through the HF processor class: transformers builds the Qwen-VL processors only with
    torchvision installed (their video processor needs it), the image processor alone loads without it.
    """
    vis = _FAMILY_VISION[family]
    image_processor = {
        "image_processor_type": "Qwen2VLImageProcessor", "do_convert_rgb": True, "do_normalize": True,
        "do_rescale": True, "do_resize": True, "rescale_factor": 1 / 255, "resample": 3,
        "image_mean": vis["mean"], "image_std": vis["std"], "patch_size": vis["patch"], "merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "size": {"shortest_edge": min_pixels, "longest_edge": max_pixels},
        "min_pixels": min_pixels, "max_pixels": max_pixels,
    }
    with open(os.path.join(out_dir, "preprocessor_config.json"), "w") as f:
        json.dump(dict(image_processor, processor_class=vis["processor"]), f, indent=2)
    with open(os.path.join(out_dir, "processor_config.json"), "w") as f:
        json.dump({"processor_class": vis["processor"]}, f, indent=2)
    with open(os.path.join(out_dir, "chat_template.jinja"), "w") as f:
        f.write(VL_CHAT_TEMPLATE)
    cfg_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(cfg_path) as f:
        tok_cfg = json.load(f)
    tok_cfg["processor_class"] = vis["processor"]
    with open(cfg_path, "w") as f:
        json.dump(tok_cfg, f, indent=2)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Build a tiny random Qwen-VL checkpoint (HF format).")
    p.add_argument("out_dir")
    p.add_argument("--family", choices=FAMILIES, default="qwen2_5_vl")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--num-kv-heads", type=int, default=2)
    p.add_argument("--ffn-hidden-size", type=int, default=128)
    p.add_argument("--vision-hidden-size", type=int, default=32)
    p.add_argument("--vision-depth", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    print(build_tiny_vlm_checkpoint(a.out_dir, family=a.family, hidden_size=a.hidden_size, num_layers=a.num_layers,
                                    num_heads=a.num_heads, num_kv_heads=a.num_kv_heads,
                                    ffn_hidden_size=a.ffn_hidden_size, vision_hidden_size=a.vision_hidden_size,
                                    vision_depth=a.vision_depth, seed=a.seed))


if __name__ == "__main__":
    main()

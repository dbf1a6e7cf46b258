"""Tiny random Qwen2.5-VL / Qwen3-VL checkpoints (tools/tiny_vlm.py) and multimodal samples for the Megatron VLM
tests: token ids with expanded image placeholders and random pixel_values, fed to the models directly."""
import functools
import json
import os

import torch


def build_tiny_vlm(out_dir, family: str, tie: bool) -> str:
    """tools/tiny_vlm.py's checkpoint with weights of std 0.1 (logits far from zero: parity is meaningful);
    Qwen3-VL with 3 decoder layers and 3 vision blocks, DeepStack from block 0."""
    from slime_like.tools.tiny_vlm import build_tiny_vlm_checkpoint

    deep = dict(num_layers=3, vision_depth=3) if family == "qwen3_vl" else {}
    return build_tiny_vlm_checkpoint(str(out_dir), family=family, tie_embeddings=tie, init_std=0.1, **deep)


@functools.lru_cache(maxsize=None)
def token_ids(ckpt: str) -> dict:
    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    return {k: cfg[k + "_token_id"] for k in ("image", "vision_start", "vision_end")}


def patch_dim(ckpt: str) -> int:
    with open(os.path.join(ckpt, "config.json")) as f:
        patch = json.load(f)["vision_config"]["patch_size"]
    return 3 * 2 * patch * patch


def sample(ckpt: str, grids: list, text_before: int, text_after: int, seed: int):
    """(token ids, {"pixel_values", "image_grid_thw"}) of one prompt with the images of `grids` (t, h, w patches);
    text tokens are random characters of the tiny tokenizer (ids 3..60)."""
    gen, special = torch.Generator().manual_seed(seed), token_ids(ckpt)
    ids = torch.randint(3, 60, (text_before,), generator=gen).tolist()
    for t, h, w in grids:
        ids += [special["vision_start"]] + [special["image"]] * (t * h * w // 4) + [special["vision_end"]]
    ids += torch.randint(3, 60, (text_after,), generator=gen).tolist()
    patches = sum(t * h * w for t, h, w in grids)
    pixels = torch.randn(patches, patch_dim(ckpt), generator=gen)
    return ids, {"pixel_values": pixels, "image_grid_thw": torch.tensor(grids, dtype=torch.long)}


def hf_logits(hf_dir, ids, mm):
    """transformers' logits [L, V] of one sample (batch of 1), its 3-D positions from mm_token_type_ids."""
    import transformers

    model = transformers.AutoModelForImageTextToText.from_pretrained(hf_dir, dtype=torch.float32).eval()
    x = torch.tensor([ids])
    kw = {}
    if mm is not None:
        kw = dict(pixel_values=mm["pixel_values"], image_grid_thw=mm["image_grid_thw"],
                  mm_token_type_ids=(x == token_ids(hf_dir)["image"]).int())
    with torch.no_grad():
        return model(input_ids=x, **kw).logits[0]

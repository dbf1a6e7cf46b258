"""Prepare everything the visual CPU demo trains on; idempotent (work whose outputs exist is skipped).

    python -m slime_like.demo.vlm_prepare OUT_DIR

OUT_DIR/
  data/train.jsonl, data/heldout.jsonl   {"prompt": "<image>How many shapes?", "images": ["images/train_00000.png"],
                                          "label": "7"}; the 200 held-out pictures are never trained on
  data/images/*.png                      the 84x84 pictures (shapes.py)
  base_model/                            random-init tiny Qwen2.5-VL (tools/tiny_vlm.py), char tokenizer, processor
  sft_model/                             base_model after the SFT warm-up (vlm_sft.py), sft_result.json
Every output is written under a temporary name and renamed when complete, so an interrupted run never leaves a
half-written output that the next run would skip.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import string
import time

from slime_like.demo.shapes import QUESTION, read_jsonl, write_data

# Only the characters the chat template and the question use (vocabulary 48 with the 6 Qwen-VL special tokens):
# as in the text demo (prepare.py), every never-seen token the output layer must first push down slows the warm-up.
ALPHABET = "".join(sorted(set(string.digits + QUESTION + "userassistant\n")))
# Qwen2.5-VL: 128 hidden, 2 layers; vision tower 64 hidden, 2 blocks; 84x84 pictures = a 6x6 patch grid =
# 9 image tokens (min = max image side 84, so every picture is exactly that).
MODEL_SHAPE = dict(family="qwen2_5_vl", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=4,
                   ffn_hidden_size=512, vision_hidden_size=64, vision_depth=2, vision_heads=4, min_image_side=84,
                   max_image_side=84, tie_embeddings=True, alphabet=ALPHABET, vocab_multiple=16)
SFT_RESULT = "sft_result.json"
SFT_DEFAULTS = dict(target=0.25, lr=1e-3, batch_size=32, eval_every=5, max_steps=400)


def _fresh_tmp(path: str) -> str:
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    return tmp


def prepare(out_dir: str, *, seed: int = 0, threads: int = 1, log=print, **sft) -> dict:
    """Build what is missing in out_dir; return the paths and the SFT result. `sft` overrides SFT_DEFAULTS."""
    t0 = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    data_dir = os.path.join(out_dir, "data")
    paths = {"train": os.path.join(data_dir, "train.jsonl"), "heldout": os.path.join(data_dir, "heldout.jsonl")}
    if all(os.path.exists(p) for p in paths.values()):
        log(f"data: {data_dir} exists, skipped")
    else:
        write_data(data_dir)
        log(f"data: wrote {len(read_jsonl(paths['train']))} train / {len(read_jsonl(paths['heldout']))} held-out "
            f"pictures and prompts to {data_dir}")
    base = _base_model(os.path.join(out_dir, "base_model"), seed, log)
    sft_dir = os.path.join(out_dir, "sft_model")
    if os.path.exists(os.path.join(sft_dir, SFT_RESULT)):
        with open(os.path.join(sft_dir, SFT_RESULT)) as f:
            result = json.load(f)
        log(f"sft: {sft_dir} exists (held-out accuracy {result['heldout_accuracy']:.3f}), skipped")
    else:
        from slime_like.demo.vlm_sft import sft_warmup

        tmp = _fresh_tmp(sft_dir)
        result = sft_warmup(base, paths["train"], paths["heldout"], tmp, seed=seed, threads=threads, log=log,
                            **{**SFT_DEFAULTS, **sft})
        with open(os.path.join(tmp, SFT_RESULT), "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, sft_dir)
        log(f"sft: saved the warmed-up checkpoint to {sft_dir}")
    log(f"prepare: done in {time.perf_counter() - t0:.1f}s")
    return {"data_dir": data_dir, **paths, "base_model": base, "sft_model": sft_dir, "sft": result}


def _base_model(path: str, seed: int, log) -> str:
    from slime_like.tools.tiny_vlm import build_tiny_vlm_checkpoint

    if os.path.exists(os.path.join(path, "model.safetensors")):
        log(f"model: {path} exists, skipped")
        return path
    tmp = _fresh_tmp(path)
    build_tiny_vlm_checkpoint(tmp, seed=seed, **MODEL_SHAPE)
    os.replace(tmp, path)
    log(f"model: built a random-init Qwen2.5-VL ({MODEL_SHAPE['hidden_size']} hidden, {MODEL_SHAPE['num_layers']} "
        f"layers; vision tower {MODEL_SHAPE['vision_hidden_size']} hidden, {MODEL_SHAPE['vision_depth']} blocks) "
        f"in {path}")
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--seed", type=int, default=0, help="model init and SFT batch order")
    p.add_argument("--sft-target", type=float, default=SFT_DEFAULTS["target"],
                   help="stop SFT at the first eval with this held-out greedy accuracy")
    p.add_argument("--sft-lr", type=float, default=SFT_DEFAULTS["lr"])
    p.add_argument("--sft-eval-every", type=int, default=SFT_DEFAULTS["eval_every"])
    p.add_argument("--sft-max-steps", type=int, default=SFT_DEFAULTS["max_steps"])
    p.add_argument("--threads", type=int, default=1, help="torch threads for SFT (results depend on it)")
    a = p.parse_args(argv)
    out = prepare(a.out_dir, seed=a.seed, threads=a.threads, target=a.sft_target, lr=a.sft_lr,
                  eval_every=a.sft_eval_every, max_steps=a.sft_max_steps)
    print(f"train with: --hf-checkpoint {out['sft_model']} --prompt-data {out['train']} --input-key prompt "
          f"--label-key label --multimodal-keys '{json.dumps({'image': 'images'})}' "
          f"--eval-prompt-data shapes {out['heldout']} --custom-rm-path slime_like.demo.shapes.reward "
          "--train-backend fsdp")


if __name__ == "__main__":
    main()

"""Prepare everything the CPU demo trains on; idempotent (work whose outputs exist is skipped).

    python -m slime_like.demo.prepare OUT_DIR

OUT_DIR/
  data/train.jsonl, data/heldout.jsonl   {"prompt": "37+45=", "label": "82"}; the 200 held-out pairs are never trained on
  base_model/                            random-init Qwen2 (hidden 128, 2 layers, 4 heads, ffn 512, tied), char tokenizer
  sft_model/                             base_model after the SFT warm-up (safetensors + tokenizer), sft_result.json
Every output is written under a temporary name and renamed when complete, so an interrupted run never leaves a
half-written output that the next run would skip.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import time

from slime_like.demo.arith import ALPHABET, read_jsonl, split_pairs, write_data

# vocab_multiple=16: 14 real tokens -> vocab 16. With the default 64 the SFT warm-up needed 2.5-5x more steps
# (measured: 530 and >1000 steps to 15 % vs 200 and 160 with 16, seeds 0 and 1): the output layer has to learn to
# push 50 never-seen tokens down first. Megatron pads the vocabulary itself and masks the padding logits.
MODEL_SHAPE = dict(arch="qwen2", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=4, ffn_hidden_size=512,
                   tie_embeddings=True, vocab_multiple=16)
SFT_RESULT = "sft_result.json"


def _fresh_tmp(path: str) -> str:
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    return tmp


def prepare(out_dir: str, *, seed: int = 0, sft_target: float = 0.15, sft_lr: float = 1e-3, sft_eval_every: int = 10,
            sft_max_steps: int = 3000, threads: int = 1, teacher_target: float | None = None, log=print) -> dict:
    """Build what is missing in out_dir; return the paths and the SFT result."""
    from slime_like.demo.sft import sft_warmup
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    t0 = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    data_dir = os.path.join(out_dir, "data")
    paths = {"train": os.path.join(data_dir, "train.jsonl"), "heldout": os.path.join(data_dir, "heldout.jsonl")}
    if all(os.path.exists(p) for p in paths.values()):
        log(f"data: {data_dir} exists, skipped")
    else:
        write_data(data_dir)
        log(f"data: wrote {len(read_jsonl(paths['train']))} train / {len(read_jsonl(paths['heldout']))} held-out "
            f"prompts to {data_dir}")

    base = os.path.join(out_dir, "base_model")
    if os.path.exists(os.path.join(base, "model.safetensors")):
        log(f"model: {base} exists, skipped")
    else:
        tmp = _fresh_tmp(base)
        build_tiny_checkpoint(tmp, alphabet=ALPHABET, seed=seed, **MODEL_SHAPE)
        os.replace(tmp, base)
        log(f"model: built a random-init Qwen2 ({MODEL_SHAPE['hidden_size']} hidden, {MODEL_SHAPE['num_layers']} "
            f"layers) with a {len(ALPHABET) + 2}-token char tokenizer in {base}")

    sft = os.path.join(out_dir, "sft_model")
    if os.path.exists(os.path.join(sft, SFT_RESULT)):
        with open(os.path.join(sft, SFT_RESULT)) as f:
            result = json.load(f)
        log(f"sft: {sft} exists (held-out accuracy {result['heldout_accuracy']:.3f}), skipped")
    else:
        train_pairs, heldout_pairs = split_pairs()
        tmp = _fresh_tmp(sft)
        result = sft_warmup(base, train_pairs, heldout_pairs, tmp, target=sft_target, lr=sft_lr,
                            eval_every=sft_eval_every, max_steps=sft_max_steps, seed=seed, threads=threads, log=log)
        with open(os.path.join(tmp, SFT_RESULT), "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, sft)
        log(f"sft: saved the warmed-up checkpoint to {sft}")
    out = {"data_dir": data_dir, **paths, "base_model": base, "sft_model": sft, "sft": result}
    if teacher_target is not None:  # a stronger model of the same architecture: the on-policy distillation teacher
        out["teacher_model"], out["teacher"] = _warmed_up(
            base, os.path.join(out_dir, "teacher_model"), "teacher", log, target=teacher_target, lr=sft_lr,
            eval_every=sft_eval_every, max_steps=sft_max_steps, seed=seed, threads=threads)
    log(f"prepare: done in {time.perf_counter() - t0:.1f}s")
    return out


def _warmed_up(base: str, path: str, what: str, log, **sft) -> tuple[str, dict]:
    """The SFT warm-up of `base` into `path` (skipped when it exists); (path, its result)."""
    from slime_like.demo.sft import sft_warmup

    if os.path.exists(os.path.join(path, SFT_RESULT)):
        with open(os.path.join(path, SFT_RESULT)) as f:
            result = json.load(f)
        log(f"{what}: {path} exists (held-out accuracy {result['heldout_accuracy']:.3f}), skipped")
        return path, result
    train_pairs, heldout_pairs = split_pairs()
    tmp = _fresh_tmp(path)
    result = sft_warmup(base, train_pairs, heldout_pairs, tmp, log=log, **sft)
    with open(os.path.join(tmp, SFT_RESULT), "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, path)
    log(f"{what}: saved the warmed-up checkpoint to {path}")
    return path, result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--seed", type=int, default=0, help="model init and SFT batch order")
    p.add_argument("--sft-target", type=float, default=0.15, help="stop SFT at the first eval with this held-out accuracy")
    p.add_argument("--sft-lr", type=float, default=1e-3)
    p.add_argument("--sft-eval-every", type=int, default=10)
    p.add_argument("--sft-max-steps", type=int, default=3000)
    p.add_argument("--threads", type=int, default=1, help="torch threads for SFT (results depend on it)")
    p.add_argument("--teacher-target", type=float, default=None,
                   help="also warm up a stronger copy to this held-out accuracy into teacher_model/ (the on-policy "
                        "distillation teacher, docs/demo.md)")
    a = p.parse_args(argv)
    out = prepare(a.out_dir, seed=a.seed, sft_target=a.sft_target, sft_lr=a.sft_lr, sft_eval_every=a.sft_eval_every,
                  sft_max_steps=a.sft_max_steps, threads=a.threads, teacher_target=a.teacher_target)
    print(f"train with: --hf-checkpoint {out['sft_model']} --prompt-data {out['train']} --input-key prompt "
          f"--label-key label --eval-prompt-data arith {out['heldout']} --custom-rm-path slime_like.demo.arith.reward")


if __name__ == "__main__":
    main()

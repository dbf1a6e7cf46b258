"""The visual CPU demo end to end, from the installed package (bash scripts/run-demo-vlm.sh calls it):

    slime-like demo-vlm [RUN_DIR [train flags ...]]          (default RUN_DIR runs/demo_vlm)

1. builds the shape-counting task (84x84 pictures, "<image>How many shapes?" -> the count), a tiny random
   Qwen2.5-VL and its SFT warm-up in RUN_DIR/task (demo/vlm_prepare.py; skipped when they exist);
2. runs GRPO with the synchronous loop (the same code as `train.py`): Ray places the FSDP trainer (the HF model,
   vision tower trained) and the embedded CPU engine (SGLang's HTTP API with `image_data`) colocated on one
   declared GPU slot; the held-out greedy accuracy before the first update and every 10 rollouts;
3. ends with the run's summary block (metrics, RUN_DIR/learning_curve.png, first vs last eval) and the verdict.
Flags after RUN_DIR go to the trainer after the demo's own, so they override them (e.g. --num-rollout 20).
"""
from __future__ import annotations

import json
import os
import sys

from slime_like.demo.shapes import MAX_NEW_TOKENS, MULTIMODAL_KEYS

NUM_ROLLOUT = 60
LR = "1e-3"
EVAL_NAME = "shapes"


def demo_flags(task: dict, run_dir: str) -> list:
    """The visual demo's train flags (docs/demo.md "The visual demo" explains each choice)."""
    return ["--hf-checkpoint", task["sft_model"], "--train-backend", "fsdp",
            "--prompt-data", task["train"], "--input-key", "prompt", "--label-key", "label",
            "--multimodal-keys", json.dumps(MULTIMODAL_KEYS), "--rollout-shuffle",
            "--custom-rm-path", "slime_like.demo.shapes.reward",
            "--num-rollout", str(NUM_ROLLOUT), "--rollout-batch-size", "64", "--n-samples-per-prompt", "8",
            "--rollout-max-response-len", str(MAX_NEW_TOKENS), "--rollout-temperature", "1",
            "--advantage-estimator", "grpo", "--lr", LR, "--lr-warmup-iters", "5", "--lr-decay-style", "cosine",
            "--min-lr", "1e-4", "--adam-beta2", "0.98", "--weight-decay", "0", "--clip-grad", "1.0",
            "--micro-batch-size", "128",
            "--eval-prompt-data", EVAL_NAME, task["heldout"], "--eval-interval", "10",
            "--n-samples-per-eval-prompt", "1", "--eval-temperature", "0",
            "--eval-max-response-len", str(MAX_NEW_TOKENS),
            "--colocate", "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--num-gpus-per-node", "1",
            "--run-dir", run_dir]


def main(argv=None, prog: str = "slime-like demo-vlm") -> int:
    from slime_like.demo.run import run_demo
    from slime_like.demo.vlm_prepare import prepare

    return run_demo(argv, prog=prog, default_run_dir=os.path.join("runs", "demo_vlm"), prepare=prepare,
                    flags=demo_flags, eval_name=EVAL_NAME, doc=__doc__)

if __name__ == "__main__":
    sys.exit(main())

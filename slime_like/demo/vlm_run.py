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
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    run_dir = argv.pop(0) if argv and not argv[0].startswith("-") else os.path.join("runs", "demo_vlm")
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_PROGRESS_BARS"):
        os.environ.setdefault(var, "1")  # no download; no per-file progress bars for a 3 MB model
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from slime_like.demo.summary import verdict
    from slime_like.demo.vlm_prepare import prepare
    from slime_like.loops.train import main as train

    task = prepare(os.path.join(run_dir, "task"), log=lambda line: print(f"[demo] {line}", flush=True))
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)  # a fresh curve each run (the task and warm-up are reused)
    rc = train([*demo_flags(task, run_dir), *argv], prog=prog)
    if rc == 0 and "--dry-run" not in argv:
        print(verdict(run_dir, EVAL_NAME))
    return rc


if __name__ == "__main__":
    sys.exit(main())

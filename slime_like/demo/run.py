"""The CPU demo end to end, from the installed package (no checkout needed):

    slime-like demo [RUN_DIR [train flags ...]]       (default RUN_DIR runs/demo; bash scripts/run-demo.sh calls it)

1. builds the task, the tiny Qwen2-architecture model and its SFT warm-up in RUN_DIR/task (demo/prepare.py;
   skipped when they exist);
2. runs GRPO with the synchronous loop (the same code as `train.py`): Ray places a megatron-core trainer and the
   embedded CPU engine colocated on one declared GPU slot; held-out greedy accuracy before the first update and
   every 10 rollouts;
3. ends with the run's summary block (metrics, curve, first vs last eval) and the demo's verdict.
Flags after RUN_DIR go to the trainer after the demo's own, so they override them (e.g. --num-rollout 20).
"""
from __future__ import annotations

import os
import sys

NUM_ROLLOUT = 160
LR = "2e-4"
EVAL_NAME = "arith"


def demo_flags(task: dict, run_dir: str) -> list:
    """The demo's train flags (docs/demo.md explains each choice)."""
    return ["--hf-checkpoint", task["sft_model"],
            "--prompt-data", task["train"], "--input-key", "prompt", "--label-key", "label", "--rollout-shuffle",
            "--custom-rm-path", "slime_like.demo.arith.reward",
            "--num-rollout", str(NUM_ROLLOUT), "--rollout-batch-size", "64", "--n-samples-per-prompt", "8",
            "--rollout-max-response-len", "5", "--rollout-temperature", "1",
            "--advantage-estimator", "grpo", "--lr", LR, "--lr-decay-style", "cosine", "--min-lr", "5e-5",
            "--clip-grad", "1.0", "--micro-batch-size", "128",
            "--eval-prompt-data", EVAL_NAME, task["heldout"], "--eval-interval", "10",
            "--n-samples-per-eval-prompt", "1", "--eval-temperature", "0", "--eval-max-response-len", "5",
            "--colocate", "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--num-gpus-per-node", "1",
            "--run-dir", run_dir]


def run_demo(argv, *, prog: str, default_run_dir: str, prepare, flags, eval_name: str, doc: str) -> int:
    """One demo command (text or visual): prepare its task and warm-up in RUN_DIR/task, train with its flags plus
    the user's, and print the verdict."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(doc)
        return 0
    run_dir = argv.pop(0) if argv and not argv[0].startswith("-") else default_run_dir
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_PROGRESS_BARS"):
        os.environ.setdefault(var, "1")  # no download; no per-file progress bars for a 3 MB model
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from slime_like.demo.summary import verdict
    from slime_like.loops.train import main as train

    task = prepare(os.path.join(run_dir, "task"), log=lambda line: print(f"[demo] {line}", flush=True))
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)  # a fresh curve each run (the task and warm-up are reused)
    rc = train([*flags(task, run_dir), *argv], prog=prog)
    if rc == 0 and "--dry-run" not in argv:
        print(verdict(run_dir, eval_name))
    return rc


def main(argv=None, prog: str = "slime-like demo") -> int:
    from slime_like.demo.prepare import prepare

    return run_demo(argv, prog=prog, default_run_dir=os.path.join("runs", "demo"), prepare=prepare,
                    flags=demo_flags, eval_name=EVAL_NAME, doc=__doc__)

if __name__ == "__main__":
    sys.exit(main())

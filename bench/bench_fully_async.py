"""The demo task in three loop modes, one after the other in one invocation: train.py (synchronous, trainer
and engine on separate slots), train_async.py one-step-off, and train_async.py fully async (--max-staleness 1).

    python bench/bench_fully_async.py [--rollouts 30] [--work /tmp/bench_fa] [--modes sync,one_step_off,fully_async]

Same flags as scripts/run-demo.sh (SFT-warmed tiny model, 64 prompts x 8 samples, 5 new tokens, lr 2e-4
cosine), disaggregated (--rollout-num-gpus 1), --use-tis everywhere, held-out greedy eval before training and
after the last rollout. Per mode: the loop's wall seconds per rollout (median of the gaps between consecutive
metrics lines, rollout 0 excluded: it includes start-up), the first and last held-out accuracy, the mean
staleness. Writes bench/results/bench_fully_async.json with each mode's ratio to `sync`. On a 2-core machine the
engine and the trainer compete for the same cores, so overlap gains little here; the numbers say how much.
Timings never decide pass/fail.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FN = "slime.rollout.fully_async_rollout.generate_rollout_fully_async"
MODES = {"sync": ("train.py", []), "one_step_off": ("train_async.py", []),
         "fully_async": ("train_async.py", ["--rollout-function-path", FN, "--max-staleness", "1"])}


def demo_flags(task: str, rollouts: int, run_dir: str) -> list[str]:
    return ["--hf-checkpoint", f"{task}/sft_model", "--prompt-data", f"{task}/data/train.jsonl",
            "--input-key", "prompt", "--label-key", "label", "--rollout-shuffle",
            "--custom-rm-path", "slime_like.demo.arith.reward", "--num-rollout", str(rollouts),
            "--rollout-batch-size", "64", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "5",
            "--rollout-temperature", "1", "--advantage-estimator", "grpo", "--lr", "2e-4", "--lr-decay-style",
            "cosine", "--min-lr", "5e-5", "--clip-grad", "1.0", "--micro-batch-size", "128", "--use-tis",
            "--eval-prompt-data", "arith", f"{task}/data/heldout.jsonl", "--eval-interval", str(rollouts),
            "--n-samples-per-eval-prompt", "1", "--eval-temperature", "0", "--eval-max-response-len", "5",
            "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--rollout-num-gpus", "1",
            "--num-gpus-per-node", "2", "--run-dir", run_dir]


def watch_lines(path: str, stamps: list, stop: threading.Event):
    """Append (line count, time) whenever metrics.jsonl grows."""
    seen = 0
    while not stop.is_set():
        try:
            with open(path) as f:
                n = sum(1 for _ in f)
        except FileNotFoundError:
            n = 0
        if n > seen:
            stamps.extend([(i, time.perf_counter()) for i in range(seen + 1, n + 1)])
            seen = n
        stop.wait(0.05)


def run_mode(mode: str, task: str, rollouts: int, work: str) -> dict:
    script, extra = MODES[mode]
    run_dir = os.path.join(work, mode)
    os.makedirs(run_dir, exist_ok=True)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    stamps, stop = [], threading.Event()
    watcher = threading.Thread(target=watch_lines, args=(metrics, stamps, stop), daemon=True)
    watcher.start()
    t0 = time.perf_counter()
    with open(os.path.join(run_dir, "log.txt"), "w") as log:
        rc = subprocess.call([sys.executable, script, *demo_flags(task, rollouts, run_dir), *extra], cwd=ROOT,
                             stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    stop.set()
    watcher.join()
    if rc != 0:
        raise RuntimeError(f"{mode}: {script} exited {rc}; see {run_dir}/log.txt")
    rows = [json.loads(line) for line in open(metrics)]
    # line 1: the baseline eval; line 2: rollout 0 (start-up included); the gaps after it are steady-state steps
    gaps = [b[1] - a[1] for a, b in zip(stamps[1:], stamps[2:])][:rollouts - 1]
    evals = [r["eval/arith/accuracy"] for r in rows if "eval/arith/accuracy" in r]
    train = [r for r in rows if r["rollout_id"] >= 0 and "rollout/reward" in r]
    return {"script": script, "extra": extra, "wall_s": round(wall, 1), "s_per_rollout": statistics.median(gaps),
            "heldout_accuracy_first": evals[0], "heldout_accuracy_last": evals[-1],
            "train_reward_last5": statistics.mean(r["rollout/reward"] for r in train[-5:]),
            "staleness_mean": statistics.mean(r.get("rollout/staleness/mean", 0.0) for r in train),
            # how long the loop waited for its batch (train.py: the whole generation, time/generate)
            "wait_for_batch_median_s": statistics.median(r.get("time/wait_generate", r.get("time/generate", 0.0))
                                                         for r in train[1:])}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rollouts", type=int, default=30)
    p.add_argument("--work", default="/tmp/bench_fully_async")
    p.add_argument("--modes", default=",".join(MODES))
    a = p.parse_args()
    from slime_like.demo.prepare import prepare

    task = os.path.join(a.work, "task")
    prepare(task)
    results = {m: run_mode(m, task, a.rollouts, a.work) for m in a.modes.split(",")}
    base = results.get("sync")
    if base:
        for r in results.values():
            r["s_per_rollout_vs_sync"] = r["s_per_rollout"] / base["s_per_rollout"]
    out = {"rollouts": a.rollouts, "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "modes": results}
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "bench_fully_async.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

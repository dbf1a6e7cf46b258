"""How long `train.py --dry-run` takes, end to end (fresh interpreter), and what parse_args costs in-process.

    python bench/bench_dry_run.py [--repeat 5]

Prints one JSON line (wall time, and the children's CPU time, which stays meaningful on a busy machine). Not a test: timings never decide pass/fail. The aim is under one second for the
subprocess on this machine; the recipe used is scripts/run-qwen2.5-7B-grpo.sh with placeholder paths.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN25_7B = {"model_type": "qwen2", "hidden_act": "silu", "hidden_size": 3584, "intermediate_size": 18944,
             "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
             "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "tie_word_embeddings": False}


def placeholders(tmp: str) -> dict:
    os.makedirs(os.path.join(tmp, "hf"))
    os.makedirs(os.path.join(tmp, "ref", "iter_0000001"))  # a torch_dist checkpoint's layout (the preflight looks)
    with open(os.path.join(tmp, "ref", "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("1")
    with open(os.path.join(tmp, "hf", "config.json"), "w") as f:
        json.dump(QWEN25_7B, f)
    for name in ("tokenizer.json", "model.safetensors"):  # names only: a dry run never loads them
        open(os.path.join(tmp, "hf", name), "w").close()
    for name in ("train.jsonl", "aime.jsonl"):
        with open(os.path.join(tmp, name), "w") as f:
            f.write('{"prompt": "1+1=", "label": "2"}\n')
    return dict(os.environ, PYTHON=sys.executable, HF_CKPT=os.path.join(tmp, "hf"), REF_LOAD=os.path.join(tmp, "ref"),
                SAVE_DIR=os.path.join(tmp, "save"), PROMPT_DATA=os.path.join(tmp, "train.jsonl"),
                EVAL_DATA=os.path.join(tmp, "aime.jsonl"))


def _preflight_data_rate(tmp: str, argv: list, megabytes: int) -> dict:
    """Seconds the preflight takes on a `megabytes` JSONL (every line parsed), vs parse_args without it."""
    from slime_like.args import parse_args

    path = os.path.join(tmp, "big.jsonl")
    line = json.dumps({"prompt": "What is 12 + 30? Answer with a number. " * 3, "label": "42"}) + "\n"
    with open(path, "w") as f:
        f.write(line * (megabytes * 1024 ** 2 // len(line)))
    full = argv + ["--prompt-data", path, "--input-key", "prompt", "--label-key", "label"]
    # CPU time of this process: meaningful on a shared, loaded machine, where wall time is not
    t = time.process_time()
    parse_args(full, exit_on_error=False)
    plain = time.process_time() - t
    t = time.process_time()
    parse_args(full, exit_on_error=False, preflight=True)
    checked = time.process_time() - t
    return {"preflight_data_mb": megabytes, "preflight_cpu_s": round(checked - plain, 3),
            "preflight_mb_per_cpu_s": round(megabytes / max(checked - plain, 1e-9), 1),
            "parse_with_preflight_over_without_cpu": round(checked / plain, 2)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--data-mb", type=int, default=16, help="size of the JSONL file the preflight streams")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = placeholders(tmp)
        recipe = ["bash", os.path.join(ROOT, "scripts", "run-qwen2.5-7B-grpo.sh"), "--dry-run"]
        python_only = [sys.executable, "-c", "pass"]
        walls, baseline, cpu = [], [], []
        for _ in range(a.repeat):
            t, c = time.perf_counter(), os.times()
            subprocess.run(recipe, env=env, cwd=ROOT, check=True, capture_output=True)
            walls.append(time.perf_counter() - t)
            c2 = os.times()  # CPU time of the children: robust when other jobs load the machine
            cpu.append(c2.children_user + c2.children_system - c.children_user - c.children_system)
            t = time.perf_counter()
            subprocess.run(python_only, check=True)
            baseline.append(time.perf_counter() - t)
        sys.path.insert(0, ROOT)
        os.environ.update(env)
        from slime_like.args import parse_args
        argv = subprocess.run(["bash", "-c", f'source {ROOT}/scripts/models/qwen2.5-7B.sh; printf "%s\\n" "${{MODEL_ARGS[@]}}"'],
                              capture_output=True, text=True, check=True).stdout.split()
        argv += ["--hf-checkpoint", env["HF_CKPT"], "--rollout-batch-size", "32", "--n-samples-per-prompt", "8",
                 "--num-rollout", "10", "--colocate", "--tensor-model-parallel-size", "2"]
        t = time.perf_counter()
        for _ in range(a.repeat):
            parse_args(argv, exit_on_error=False)
        in_process = (time.perf_counter() - t) / a.repeat
        preflight = _preflight_data_rate(tmp, argv, a.data_mb)
    result = {**preflight, "dry_run_subprocess_s_median": round(statistics.median(walls), 3),
              "bare_python_startup_s_median": round(statistics.median(baseline), 3),
              "dry_run_over_bare_python": round(statistics.median(walls) / statistics.median(baseline), 2),
              "dry_run_cpu_s_median": round(statistics.median(cpu), 3),
              "parse_args_in_process_s": round(in_process, 4), "goal_s": 1.0,
              "meets_goal": statistics.median(walls) < 1.0, "repeat": a.repeat}
    print(json.dumps(result))


if __name__ == "__main__":
    main()

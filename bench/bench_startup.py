"""Start-up: `train.py --dry-run` on the qwen2.5-7B recipe, and launch -> first generated token on the tiny demo.

    python bench/bench_startup.py [--repeat 3]

1. dry run: bench/bench_dry_run.py (placeholder checkpoint/data dirs, like tests/config) -- its JSON is kept as is.
2. first token, two ways, both from a fresh launch:
   * train.py: the demo's flags with --rollout-max-response-len 1 and --num-rollout 1, and a reward function
     (`first_token_reward` below, via --custom-rm-path) that appends time.time() to a file on every call. With
     one new token per sample, the first reward call happens right after the first generated token (plus one
     HTTP answer), so launch -> first stamp covers Python + Ray start, the trainer's megatron-core init and HF
     weight load, the engine start, the first weight push, and the first token.
   * the engine alone: `launcher.start_engine(kind="cpu")` then one /generate of one token.
Writes bench/results/bench_startup.json.
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
STAMP_ENV = "BENCH_FIRST_TOKEN_STAMPS"


async def first_token_reward(args, sample) -> float:
    """The demo reward, plus a wall-clock stamp per call (the file named by $BENCH_FIRST_TOKEN_STAMPS)."""
    from slime_like.demo.arith import reward

    path = os.environ.get(STAMP_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{time.time()}\n")
    return await reward(args, sample)


def train_first_token(model_dir: str, data_dir: str, work: str) -> dict:
    stamps = os.path.join(work, "stamps.txt")
    if os.path.exists(stamps):
        os.remove(stamps)
    run_dir = os.path.join(work, "run")
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--hf-checkpoint", model_dir,
           "--prompt-data", os.path.join(data_dir, "train.jsonl"), "--input-key", "prompt", "--label-key", "label",
           "--custom-rm-path", "bench_startup.first_token_reward", "--num-rollout", "1",
           "--rollout-batch-size", "64", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "1",
           "--rollout-temperature", "1", "--advantage-estimator", "grpo", "--lr", "5e-5",
           "--lr-decay-style", "constant", "--clip-grad", "1.0", "--micro-batch-size", "128", "--colocate",
           "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--num-gpus-per-node", "1",
           "--run-dir", run_dir]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", **{STAMP_ENV: stamps},
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "bench"), ROOT, os.environ.get("PYTHONPATH", "")]))
    t0 = time.time()
    with open(os.path.join(work, "train.log"), "w") as log:
        subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    total = time.time() - t0
    with open(stamps) as f:
        first = min(float(x) for x in f if x.strip())
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        row = json.loads(f.readline())
    return {"launch_to_first_token_s": first - t0, "launch_to_exit_s": total,
            "first_rollout_time_generate_s": row.get("time/generate")}


def engine_first_token(model_dir: str) -> dict:
    sys.path.insert(0, ROOT)
    from types import SimpleNamespace

    from bench_weight_sync import free_port
    from slime_like.backends.engine_api.launcher import start_engine
    from slime_like.backends.engine_api.client import post

    args = SimpleNamespace(hf_checkpoint=model_dir, sglang_server_args={}, seed=0, save=tempfile.mkdtemp())
    t0 = time.perf_counter()
    eng = start_engine(args, kind="cpu", port=free_port(), env={"OMP_NUM_THREADS": "1"})
    healthy = time.perf_counter() - t0
    try:
        post(eng.url, "/generate", {"text": "12+34=", "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
        first = time.perf_counter() - t0
    finally:
        eng.stop()
    return {"engine_launch_to_healthy_s": healthy, "engine_launch_to_first_token_s": first}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--work-dir", default=os.path.join(ROOT, "runs", "bench_e2e"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "bench_startup.json"))
    a = p.parse_args()
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    sys.path.insert(0, ROOT)
    from bench_e2e import prepare

    paths = prepare(a.work_dir)
    res = {"nproc": os.cpu_count(), "loadavg_start": os.getloadavg()}
    dry = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "bench_dry_run.py"), "--repeat", str(a.repeat)],
                         capture_output=True, text=True, check=True)
    res["dry_run"] = json.loads(dry.stdout.strip().splitlines()[-1])
    runs = []
    for i in range(a.repeat):
        work = os.path.join(a.work_dir, f"startup_{i}")
        os.makedirs(work, exist_ok=True)
        runs.append({**train_first_token(paths["tiny"], paths["data"], work), **engine_first_token(paths["tiny"]),
                     "loadavg": os.getloadavg()})
    res["first_token_runs"] = runs
    for k in ("launch_to_first_token_s", "engine_launch_to_first_token_s", "engine_launch_to_healthy_s"):
        res[k + "_median"] = statistics.median(r[k] for r in runs)
    res["loadavg_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    d = res["dry_run"]
    print(f"{'what':48} {'median':>8}")
    print(f"{'train.py --dry-run, qwen2.5-7B recipe (wall)':48} {d['dry_run_subprocess_s_median']:7.2f}s")
    print(f"{'  same, CPU time of the children':48} {d['dry_run_cpu_s_median']:7.2f}s")
    print(f"{'  bare python start (wall)':48} {d['bare_python_startup_s_median']:7.2f}s")
    print(f"{'train.py launch -> first generated token (tiny)':48} {res['launch_to_first_token_s_median']:7.2f}s")
    print(f"{'CPU engine launch -> first token (tiny)':48} {res['engine_launch_to_first_token_s_median']:7.2f}s")
    print(f"(medians of {a.repeat}; load {res['loadavg_start'][0]:.1f} -> {res['loadavg_end'][0]:.1f}; wrote {a.out})")


if __name__ == "__main__":
    main()

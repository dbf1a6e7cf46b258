"""End to end against TRL: our train.py (colocated, CPU engine, megatron-core) vs TRL's GRPOTrainer, same task.

    python bench/bench_e2e.py [--sizes tiny,100m] [--steps-tiny 12] [--steps-100m 3] [--rounds 1]

Both sides get the same model directory and char tokenizer, the demo's 2-digit addition prompts in file order
(train.jsonl), the same reward code (slime_like.demo.arith), the same batch shape (prompts x samples x max new
tokens), lr, temperature, grad clip and no KL. They run one after the other, alternating, in one invocation,
so the machine's load hits both alike.

Sizes: `tiny` is the demo's SFT-warmed 0.53M Qwen2 (64 x 8 x 5, like scripts/run-demo.sh); `100m` is a
random-init Qwen2 of hidden 768, 12 layers, FFN 3072 over the same tokenizer (~113M parameters) with a smaller
batch (16 x 4 x 5) and fewer steps: a 2-core machine cannot do more in a benchmark's time. Its reward stays ~0
(random init); at that size only the times are meaningful.

How the CPU time of train.py is measured: train.py is one driver process plus Ray's processes (GCS, raylet,
workers: the trainer actor, the rollout manager) and the CPU engine server; all of them descend from the driver.
A sampler thread (psutil) walks the driver's process tree every 0.2 s and keeps, per pid, the last seen
user+system CPU seconds (so a process that exits keeps its share). The tree total is read again when a new line
lands in metrics.jsonl; step i's CPU time = total at line i - total at line i-1, its wall time likewise. Rollout
0 includes start-up and is excluded from the medians (TRL's first step is excluded too). TRL is one process:
its per-step process_time comes from bench/trl_peer/run_trl_grpo.py.

Writes bench/results/bench_e2e.json. Timings never decide pass/fail.
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

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRL_PY = os.path.join(ROOT, "bench", ".venv-trl", "bin", "python")
SIZES = {  # batch shape and steps per size; the model comes from model_dir()
    "tiny": dict(prompts=64, samples=8, max_new=5),
    "100m": dict(prompts=16, samples=4, max_new=5),
}
SHAPE_100M = dict(arch="qwen2", hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=12, ffn_hidden_size=3072,
                  tie_embeddings=True, vocab_multiple=16)
ENV = dict(RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
           OMP_NUM_THREADS="1", WANDB_DISABLED="true")


def prepare(work: str) -> dict:
    """The demo task + SFT model (idempotent), and the ~100M model over the demo's tokenizer."""
    from slime_like.demo.arith import ALPHABET
    from slime_like.demo.prepare import prepare as demo_prepare
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    demo = os.path.join(work, "demo_prep")
    demo_prepare(demo)
    big = os.path.join(work, "qwen2_100m")
    if not os.path.exists(os.path.join(big, "config.json")):
        build_tiny_checkpoint(big, alphabet=ALPHABET, **SHAPE_100M)
    return {"tiny": os.path.join(demo, "sft_model"), "100m": big, "data": os.path.join(demo, "data")}


def count_params(model_dir: str) -> int:
    from safetensors import safe_open

    n = 0
    for f in os.listdir(model_dir):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(model_dir, f), "pt") as s:
                n += sum(_prod(s.get_slice(k).get_shape()) for k in s.keys())
    return n


def _prod(shape) -> int:
    p = 1
    for d in shape:
        p *= d
    return p


class TreeCPU:
    """Sum of user+system CPU seconds of a process and all its descendants, dead ones included (last seen)."""

    def __init__(self, pid: int, interval: float = 0.2):
        self.root, self.interval, self.seen, self.stop = pid, interval, {}, threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def sample(self) -> float:
        try:
            procs = [psutil.Process(self.root)]
            procs += procs[0].children(recursive=True)
        except psutil.Error:
            procs = []
        with self.lock:
            for p in procs:
                try:
                    c = p.cpu_times()
                    self.seen[(p.pid, p.create_time())] = c.user + c.system
                except psutil.Error:
                    pass
            return sum(self.seen.values())

    def _loop(self):
        while not self.stop.wait(self.interval):
            self.sample()


def run_ours(model_dir, data_dir, shape, steps, lr, temperature, run_dir, log_path) -> dict:
    """train.py with scripts/run-demo.sh's flags (no eval, prompts in file order); per-step wall and tree CPU."""
    os.makedirs(run_dir, exist_ok=True)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--hf-checkpoint", model_dir,
           "--prompt-data", os.path.join(data_dir, "train.jsonl"), "--input-key", "prompt", "--label-key", "label",
           "--custom-rm-path", "slime_like.demo.arith.reward", "--num-rollout", str(steps),
           "--rollout-batch-size", str(shape["prompts"]), "--n-samples-per-prompt", str(shape["samples"]),
           "--rollout-max-response-len", str(shape["max_new"]), "--rollout-temperature", str(temperature),
           "--advantage-estimator", "grpo", "--lr", str(lr), "--lr-decay-style", "constant", "--clip-grad", "1.0",
           "--micro-batch-size", "128", "--colocate", "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1",
           "--num-gpus-per-node", "1", "--run-dir", run_dir]
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, **ENV))
    tree = TreeCPU(proc.pid)
    marks, rows = [(t0, 0.0)], []
    while True:
        done = proc.poll() is not None
        if os.path.exists(metrics):
            with open(metrics) as f:
                lines = [json.loads(x) for x in f if x.strip()]
            for row in lines[len(rows):]:
                marks.append((time.perf_counter(), tree.sample()))
                rows.append(row)
        if done:
            break
        time.sleep(0.1)
    tree.stop.set()
    if proc.returncode != 0:
        raise RuntimeError(f"train.py exited {proc.returncode}; log {log_path}")
    steps_out = []
    for i, row in enumerate(rows):
        steps_out.append({"step": row["rollout_id"] + 1, "wall_s": marks[i + 1][0] - marks[i][0],
                          "cpu_s": marks[i + 1][1] - marks[i][1], "reward_mean": row.get("rollout/reward"),
                          **{k: row[k] for k in row if k.startswith("time/")}})
    steady = steps_out[1:] or steps_out
    stages = {k: statistics.median(s[k] for s in steady) for k in steady[0] if k.startswith("time/")}
    return {"peer": "ours", "steps": steps_out, "step_wall_median_s": statistics.median(s["wall_s"] for s in steady),
            "step_cpu_median_s": statistics.median(s["cpu_s"] for s in steady), "stage_wall_median_s": stages,
            "launch_to_rollout0_logged_s": steps_out[0]["wall_s"] if steps_out else None,
            "total_wall_s": time.perf_counter() - t0, "process_count_seen": len(tree.seen)}


def run_trl(model_dir, data_dir, shape, steps, lr, temperature, out, log_path) -> dict:
    if not os.path.exists(TRL_PY):
        raise RuntimeError(f"{TRL_PY} missing: run bash bench/trl_peer/setup_env.sh first")
    cmd = [TRL_PY, os.path.join(ROOT, "bench", "trl_peer", "run_trl_grpo.py"), "--model-dir", model_dir,
           "--data-dir", data_dir, "--steps", str(steps), "--prompts", str(shape["prompts"]),
           "--samples", str(shape["samples"]), "--max-new-tokens", str(shape["max_new"]), "--lr", str(lr),
           "--temperature", str(temperature), "--threads", "1", "--out", out]
    with open(log_path, "w") as log:
        subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, **ENV), check=True)
    with open(out) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="tiny,100m")
    p.add_argument("--steps-tiny", type=int, default=12)
    p.add_argument("--steps-100m", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1, help="alternations ours/TRL per size (order flips each round)")
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--work-dir", default=os.path.join(ROOT, "runs", "bench_e2e"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "bench_e2e.json"))
    a = p.parse_args()
    sizes = [s.strip() for s in a.sizes.split(",") if s.strip()]
    bad = [s for s in sizes if s not in SIZES]
    if bad:
        sys.exit(f"--sizes: unknown {bad}; choose from {sorted(SIZES)}")
    sys.path.insert(0, ROOT)
    paths = prepare(a.work_dir)
    result = {"machine": {"nproc": os.cpu_count(), "loadavg_start": os.getloadavg()}, "sizes": {}}
    for size in sizes:
        steps = a.steps_tiny if size == "tiny" else a.steps_100m
        shape = SIZES[size]
        entry = {"model_dir": paths[size], "params": count_params(paths[size]), "shape": shape, "steps": steps,
                 "rounds": []}
        for r in range(a.rounds):
            order = ["ours", "trl"] if r % 2 == 0 else ["trl", "ours"]
            rnd = {"loadavg_before": os.getloadavg()}
            for who in order:
                tag = f"{size}_r{r}_{who}"
                log = os.path.join(a.work_dir, tag + ".log")
                print(f"[bench_e2e] {tag} ... (log {log})", flush=True)
                if who == "ours":
                    rnd[who] = run_ours(paths[size], paths["data"], shape, steps, a.lr, a.temperature,
                                        os.path.join(a.work_dir, tag), log)
                else:
                    rnd[who] = run_trl(paths[size], paths["data"], shape, steps, a.lr, a.temperature,
                                       os.path.join(a.work_dir, tag + ".json"), log)
                rnd[who]["loadavg_after"] = os.getloadavg()
            entry["rounds"].append(rnd)
        ours = [x for rnd in entry["rounds"] for x in rnd["ours"]["steps"][1:]]
        trl = [x for rnd in entry["rounds"] for x in rnd["trl"]["steps"][1:]]
        med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
        entry["summary"] = {
            "ours_wall_median_s": med(ours, "wall_s"), "ours_cpu_median_s": med(ours, "cpu_s"),
            "trl_wall_median_s": med(trl, "wall_s"), "trl_cpu_median_s": med(trl, "cpu_s"),
            "ours_stage_wall_median_s": entry["rounds"][0]["ours"]["stage_wall_median_s"]}
        s = entry["summary"]
        s["wall_ratio_ours_over_trl"] = s["ours_wall_median_s"] / s["trl_wall_median_s"]
        s["cpu_ratio_ours_over_trl"] = s["ours_cpu_median_s"] / s["trl_cpu_median_s"]
        s["reward_ours"] = [x["reward_mean"] for x in entry["rounds"][0]["ours"]["steps"]]
        s["reward_trl"] = [x.get("reward_mean") for x in entry["rounds"][0]["trl"]["steps"]]
        result["sizes"][size] = entry
    result["machine"]["loadavg_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\n{'size':6} {'params':>8} {'shape':>9} {'ours wall':>10} {'TRL wall':>9} {'ratio':>6} "
          f"{'ours cpu':>9} {'TRL cpu':>8} {'ratio':>6}  reward ours / TRL (first -> last)")
    for size, e in result["sizes"].items():
        s, sh = e["summary"], e["shape"]
        print(f"{size:6} {e['params'] / 1e6:7.2f}M {sh['prompts']}x{sh['samples']}x{sh['max_new']:<3} "
              f"{s['ours_wall_median_s']:9.2f}s {s['trl_wall_median_s']:8.2f}s {s['wall_ratio_ours_over_trl']:6.2f} "
              f"{s['ours_cpu_median_s']:8.2f}s {s['trl_cpu_median_s']:7.2f}s {s['cpu_ratio_ours_over_trl']:6.2f}  "
              f"{s['reward_ours'][0]:.3f}->{s['reward_ours'][-1]:.3f} / {s['reward_trl'][0]:.3f}->"
              f"{s['reward_trl'][-1]:.3f}")
    print(f"(step medians exclude step 1; ratio = ours / TRL, < 1 means we are faster; wrote {a.out})")


if __name__ == "__main__":
    main()

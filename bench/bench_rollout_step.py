"""One training step's rollout, as the RolloutManager does it: controller.generate + to_train_batch + DP split,
against one embedded CPU engine process. Reports wall time and the CPU time of both processes per rollout.

    python bench/bench_rollout_step.py [--model DIR] [--prompts 64] [--n 8] [--new-tokens 5] [--rollouts 5]
    python bench/bench_rollout_step.py --compare OTHER_CODE_ROOT [--pairs 3]    # A/B, alternating, medians
    python bench/bench_rollout_step.py --throughput --model DIR --new-tokens 128 [--compare ...]  # engine vs generate

Default workload = the demo's (``scripts/run-demo.sh``): 64 prompts x 8 samples of "a+b=", <= 5 new tokens,
temperature 1, the demo's reward. ``--compare`` runs this tree and another checkout (e.g. ``git archive`` of an
older commit) one after the other, ``--pairs`` times, each in fresh processes (engine included), and prints
the medians side by side: on a shared machine only back-to-back comparisons mean anything. Not a test.
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


def _proc_cpu(pid: int) -> float:
    """utime + stime of one process (all its threads), seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker(a) -> dict:
    """Runs inside the code tree under test (sys.path[0] = that tree)."""
    import torch

    from slime_like.args import parse_args
    from slime_like.backends.engine_api.launcher import start_engine
    from slime_like.rollout.batch import split_for_dp, to_train_batch
    from slime_like.rollout.controller import RolloutController
    from slime_like.utils.net import free_port

    torch.set_num_threads(a.threads)
    data = os.path.join(os.path.dirname(a.model.rstrip("/")), "data", "train.jsonl")
    argv = ["--hf-checkpoint", a.model, "--prompt-data", data, "--input-key", "prompt", "--label-key", "label",
            "--rollout-shuffle", "--custom-rm-path", "slime_like.demo.arith.reward",
            "--num-rollout", "100", "--rollout-batch-size", str(a.prompts), "--n-samples-per-prompt", str(a.n),
            "--rollout-max-response-len", str(a.new_tokens), "--rollout-temperature", "1",
            "--advantage-estimator", "grpo", "--colocate", "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1",
            "--num-gpus-per-node", "1", "--disable-tqdm"] + a.extra
    args = parse_args(argv)
    env = {"OMP_NUM_THREADS": str(a.threads), "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": sys.path[0]}
    proc = start_engine(args, kind="cpu", port=free_port(), log_dir=tempfile.gettempdir(), env=env)
    try:
        ctl = RolloutController(args, [proc.url])
        rows = []
        for rid in range(a.rollouts + 1):          # rollout 0 warms up
            e0, c0, t0 = _proc_cpu(proc.popen.pid), time.process_time(), time.perf_counter()
            samples, metrics = ctl.generate(rid)
            split_for_dp(to_train_batch(args, samples), 1)
            rows.append({"wall_s": time.perf_counter() - t0, "manager_cpu_s": time.process_time() - c0,
                         "engine_cpu_s": _proc_cpu(proc.popen.pid) - e0,
                         "tokens": sum(s.response_length for s in samples), "reward": metrics["rollout/reward"]})
        rows = rows[1:]
        out = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        out["tok_per_s"] = out["tokens"] / out["wall_s"]
        return out
    finally:
        proc.stop()


def throughput(a) -> dict:
    """bench_rollout.py's workload (random 16-32-token prompts, exactly --new-tokens sampled tokens each, one
    request per prompt) on the engine and on plain transformers `generate`, in wall AND CPU seconds: on a shared
    machine wall time swings several-fold between runs, CPU time much less."""
    import asyncio
    import random

    import torch
    from transformers import AutoModelForCausalLM

    from slime_like.backends.engine_api.client import EngineClient
    from slime_like.backends.engine_api.launcher import start_engine
    from slime_like.utils.net import free_port

    torch.set_num_threads(a.threads)
    rng = random.Random(0)
    ps = [[rng.randrange(2, 97) for _ in range(rng.randint(16, 32))] for _ in range(a.prompts)]
    from slime_like.args import make_args

    args = make_args(hf_checkpoint=a.model, seed=0)
    env = {"OMP_NUM_THREADS": str(a.threads), "PYTHONPATH": sys.path[0]}
    proc = start_engine(args, kind="cpu", port=free_port(), log_dir=tempfile.gettempdir(), env=env)
    sp = {"temperature": 1.0, "max_new_tokens": a.new_tokens, "ignore_eos": True}
    try:
        async def go():
            async with EngineClient(proc.url) as c:
                await c.generate(ps[0][:4], dict(sp, max_new_tokens=4))
                e0, c0, t0 = _proc_cpu(proc.popen.pid), time.process_time(), time.perf_counter()
                outs = await asyncio.gather(*[c.generate(p, sp) for p in ps])
                return (sum(len(o["output_ids"]) for o in outs), time.perf_counter() - t0,
                        time.process_time() - c0, _proc_cpu(proc.popen.pid) - e0)
        tokens, wall, client_cpu, engine_cpu = asyncio.run(go())
    finally:
        proc.stop()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    T = max(map(len, ps))
    ids, mask = torch.zeros(len(ps), T, dtype=torch.long), torch.zeros(len(ps), T, dtype=torch.long)
    for i, p in enumerate(ps):
        ids[i, T - len(p):], mask[i, T - len(p):] = torch.tensor(p), 1
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=a.new_tokens,
              min_new_tokens=a.new_tokens, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids[:2], attention_mask=mask[:2], **dict(kw, max_new_tokens=4, min_new_tokens=4))
        c0, t0 = time.process_time(), time.perf_counter()
        out = model.generate(ids, attention_mask=mask, **kw)
        hf_wall, hf_cpu = time.perf_counter() - t0, time.process_time() - c0
    hf_tokens = (out.shape[1] - T) * len(ps)
    return {"engine_tok_s": tokens / wall, "engine_tok_per_cpu_s": tokens / (engine_cpu + client_cpu),
            "engine_cpu_s": engine_cpu, "client_cpu_s": client_cpu, "hf_tok_s": hf_tokens / hf_wall,
            "hf_tok_per_cpu_s": hf_tokens / hf_cpu, "engine_over_hf_wall": (tokens / wall) / (hf_tokens / hf_wall),
            "engine_over_hf_cpu": (tokens / (engine_cpu + client_cpu)) / (hf_tokens / hf_cpu)}


def run_tree(root: str, a) -> dict:
    cmd = [sys.executable, os.path.join(ROOT, "bench", "bench_rollout_step.py"), "--worker", "--model", a.model,
           "--prompts", str(a.prompts), "--n", str(a.n), "--new-tokens", str(a.new_tokens),
           "--rollouts", str(a.rollouts), "--threads", str(a.threads)] + (["--throughput"] if a.throughput else []) \
        + ["--", *a.extra]
    env = dict(os.environ, PYTHONPATH=root, SLIME_LIKE_NO_TQDM="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    res = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"{root}: worker failed\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "runs", "demo", "task", "sft_model"))
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=5)
    ap.add_argument("--rollouts", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--compare", default=None, help="another code tree to run alternately with this one")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--throughput", action="store_true",
                    help="bench_rollout.py's engine-vs-generate workload instead of the rollout step (use "
                         "--prompts 64 --new-tokens 128 --model DIR, e.g. a model bench_rollout.py built)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("extra", nargs="*", help="extra train.py flags (after --)")
    a = ap.parse_args()
    a.model = os.path.abspath(a.model)
    if not os.path.exists(os.path.join(a.model, "config.json")):  # (--throughput: any HF model dir)
        raise SystemExit(f"{a.model}: no model; run `python -m slime_like.demo.prepare runs/demo/task` first")
    if a.worker:
        sys.path.insert(0, os.getcwd())
        print(json.dumps(throughput(a) if a.throughput else worker(a)))
        return
    trees = {"this": ROOT} | ({"other": os.path.abspath(a.compare)} if a.compare else {})
    runs = {k: [] for k in trees}
    for _ in range(a.pairs if a.compare else 1):
        for name, root in trees.items():
            runs[name].append(run_tree(root, a))
            print(name, json.dumps({k: round(v, 4) for k, v in runs[name][-1].items()}), flush=True)
    summary = {name: {k: round(statistics.median(r[k] for r in rs), 4) for k in rs[0]} for name, rs in runs.items()}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

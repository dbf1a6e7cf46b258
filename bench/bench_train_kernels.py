"""CPU proxies of the GPU train step (issue 26), two code trees side by side in one run (not a test).

Per shape and trainer (Megatron, FSDP), each in a fresh child process whose PYTHONPATH is one code tree
(`--trees before=/tmp/base,after=.`: a `git worktree add --detach /tmp/base main`; the trees alternate, so both see the same machine load):
  aten_per_mb_train   aten ops (torch.profiler CPU events named aten::*, nested ones included) of one
                      train_step, divided by its micro-batches: deterministic, the kernel launches a GPU would see
  aten_per_mb_score   the same for one scoring pass (compute_log_probs: the old-policy log-probs)
  host_share          CPU time inside the trainer's _micro_batches (building model inputs from the batch)
                      over the CPU time of the train step (median of --steps)
  step_cpu_s          median process CPU seconds of a train step
  peak_step_mb        peak RSS during one train step above the RSS before it (Linux VmHWM, reset through
                      /proc/self/clear_refs): what the step's activations, logits and gradients cost
Shapes: demo (the demo's Qwen2: hidden 128, 2 layers, vocab 16; 512 samples of ~9 tokens, micro-batch 128),
100m (hidden 768, 12 layers, vocab 16: 64 samples of ~9 tokens, micro-batch 64), 100m_vocab (hidden 768, 6
layers, Qwen's vocabulary 151,936, tied: 16 samples of 64 tokens, 32 of them response, micro-batch 8: the
logits path dominates the step's memory). Samples come in GRPO groups sharing a prompt (8 per prompt at the demo
shapes, 4 at the 100m ones), as the rollout sends them (--shared-prompt-training needs them).

    python bench/bench_train_kernels.py [--trees main=/work/main,branch=.] [--shapes demo,100m,100m_vocab]
        [--backends megatron,fsdp] [--steps 3] [--out bench/results/bench_train_kernels.json]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

DEMO = dict(arch="qwen2", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=4, ffn_hidden_size=512,
            tie_embeddings=True, vocab_multiple=16)
M100 = dict(DEMO, hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=12, ffn_hidden_size=3072,
            max_position_embeddings=1024)
M100_VOCAB = dict(M100, num_layers=6, vocab_multiple=151936)
SHAPES = {  # name -> (model, samples, micro-batch, (prompt min, max), (response min, max), extra flags)
    "demo": (DEMO, 512, 128, (4, 6), (2, 5), ()),
    "demo_packed": (DEMO, 512, 128, (4, 6), (2, 5), ("--use-dynamic-batch-size", "--max-tokens-per-gpu", "1024")),
    "100m": (M100, 64, 64, (4, 6), (2, 5), ()),
    "100m_packed": (M100, 64, 64, (4, 6), (2, 5), ("--use-dynamic-batch-size", "--max-tokens-per-gpu", "512")),
    "100m_vocab": (M100_VOCAB, 16, 8, (32, 32), (32, 32), ()),
}


GROUP = {"demo": 8, "demo_packed": 8, "100m": 4, "100m_packed": 4, "100m_vocab": 4}  # samples per prompt (GRPO)


def make_batch(n, prompt, response, vocab, seed=0, group=1):
    """n samples in GRPO groups of `group` consecutive samples sharing one prompt (as the rollout sends them)."""
    rng = random.Random(seed)
    toks, lens = [], []
    for i in range(n):
        if i % group == 0:
            shared = [rng.randint(2, vocab - 1) for _ in range(rng.randint(*prompt))]
        r = rng.randint(*response)
        toks.append(shared + [rng.randint(2, vocab - 1) for _ in range(r)])
        lens.append(r)
    return {"tokens": toks, "response_lengths": lens, "loss_masks": [[1] * r for r in lens],
            "rewards": [float(rng.random() < 0.5) for _ in range(n)]}


# ----------------------------------------------------------------------------- child (one tree, one trainer)
def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _peak_mb(fn) -> float:
    import gc

    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    before = _rss_kb("VmRSS")
    fn()
    return (_rss_kb("VmHWM") - before) / 1024


def _aten_ops(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as p:
        fn()
    return sum(1 for e in p.events() if e.name.startswith("aten::"))


def child(spec: dict) -> dict:
    import torch

    from slime_like.args import parse_args
    from slime_like.backends.megatron.parallel import free_port

    torch.set_num_threads(1)
    batch, micro, backend = spec["batch"], spec["micro"], spec["backend"]
    n = len(batch["tokens"])
    flags = ["--hf-checkpoint", spec["ckpt"], "--rollout-batch-size", str(n // spec["group"]), "--n-samples-per-prompt", str(spec["group"]),
             "--num-rollout", "100", "--colocate", "--actor-num-gpus-per-node", "1", "--global-batch-size", str(n),
             "--micro-batch-size", str(micro), "--lr", "1e-5", "--lr-decay-style", "constant", "--clip-grad", "1.0",
             "--advantage-estimator", "grpo", "--moe-token-dispatcher-type", "alltoall", *spec["flags"]]
    if backend == "fsdp":
        from slime_like.backends.fsdp.trainer import FSDPTrainer as T
        flags += ["--train-backend", "fsdp"]
    else:
        from slime_like.backends.megatron.trainer import MegatronTrainer as T
    t = T(parse_args(flags, exit_on_error=False), role="actor", master_port=free_port())
    b = dict(batch)
    b.update(t.compute_advantages(b))
    build_cpu = [0.0]
    # the micro-batch builder: RLTrainerBase.batcher.split on main since the trainer base refactor,
    # RLTrainerBase._micro_batches before it (so a "before" tree of either age runs)
    owner, name = (t.batcher, "split") if hasattr(t, "batcher") else (t, "_micro_batches")
    inner = getattr(owner, name)

    def timed_micro_batches(*a, **k):  # instrumentation: CPU time spent building model inputs
        c = time.process_time()
        try:
            return inner(*a, **k)
        finally:
            build_cpu[0] += time.process_time() - c

    setattr(owner, name, timed_micro_batches)
    n_mb = len(inner(b, list(range(n)), field_keys=("advantages",)))
    calls = iter(range(10 ** 6))
    step = lambda: t.train_step(next(calls), b)  # noqa: E731
    score = lambda: t.compute_log_probs(b)  # noqa: E731
    step(), score()  # warm-up
    cpu, share = [], []
    for _ in range(spec["steps"]):
        build_cpu[0] = 0.0
        c = time.process_time()
        step()
        cpu.append(time.process_time() - c)
        share.append(build_cpu[0] / cpu[-1])
    return {"micro_batches": n_mb, "aten_per_mb_train": _aten_ops(step) / n_mb,
            "aten_per_mb_score": _aten_ops(score) / n_mb, "step_cpu_s": statistics.median(cpu),
            "host_share": statistics.median(share), "peak_step_mb": _peak_mb(step),
            "peak_score_mb": _peak_mb(score)}


# ----------------------------------------------------------------------------- parent
def run_child(tree: str, spec: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), OMP_WAIT_POLICY="PASSIVE", HF_HUB_OFFLINE="1",
               OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    # glibc hands large blocks back to the OS on free (mmap'd), so the RSS high-water mark of a step is its peak
    # of live tensors, not the allocator's retained arena from the warm-up
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    try:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", f.name], env=env,
                             capture_output=True, text=True, cwd=os.path.abspath(tree), timeout=3000)
    finally:
        os.unlink(f.name)
    if out.returncode:
        raise RuntimeError(f"child ({tree}, {spec['backend']}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trees", default="main=/work/main,branch=.",
                   help="name=path[:extra train flags], ...: e.g. 'before=/tmp/base,after=.,after_local=.:"
                   "--attention-backend local' (flags apply to the megatron runs only)")
    p.add_argument("--shapes", default="demo,100m,100m_vocab")
    p.add_argument("--backends", default="megatron,fsdp")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default=os.path.join("bench", "results", "bench_train_kernels.json"))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        with open(a.child) as f:
            print(json.dumps(child(json.load(f))), flush=True)
        return 0
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from slime_like.demo.arith import ALPHABET
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    trees = dict(kv.split("=", 1) for kv in a.trees.split(","))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in a.shapes.split(","):
            model, n, micro, prompt, response, shape_flags = SHAPES[shape]
            ckpt = build_tiny_checkpoint(os.path.join(tmp, shape), alphabet=ALPHABET, **model)
            vocab = json.load(open(os.path.join(ckpt, "config.json")))["vocab_size"]
            batch = make_batch(n, prompt, response, vocab, group=GROUP[shape])
            for backend in a.backends.split(","):
                for name, tree in trees.items():  # alternate the trees under the same load
                    tree, _, tree_flags = tree.partition(":")
                    if backend == "fsdp" and tree_flags:
                        continue  # the per-tree flags select megatron variants
                    spec = {"ckpt": ckpt, "batch": batch, "micro": micro, "backend": backend, "steps": a.steps,
                            "group": GROUP[shape], "flags": [*shape_flags, *tree_flags.split()]}
                    r = {"shape": shape, "backend": backend, "tree": name, **run_child(tree, spec)}
                    rows.append(r)
                    print(f"{shape:>10} {backend:>8} {name:>7}: aten/mb train {r['aten_per_mb_train']:8.0f} "
                          f"score {r['aten_per_mb_score']:7.0f} | step {r['step_cpu_s']:.3f} CPU-s, build share "
                          f"{r['host_share']:.1%} | peak step {r['peak_step_mb']:.0f} MB score "
                          f"{r['peak_score_mb']:.0f} MB", flush=True)
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            json.dump({"bench": "train_kernels", "load_avg": os.getloadavg(), "trees": trees, "results": rows}, f,
                      indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU cost of MegatronTrainer.train_step and FSDPTrainer.train_step (full and LoRA) next to a plain
transformers step on the same batch (not a test).

Shapes (model + batch):
  demo   the demo's Qwen2 (hidden 128, 2 layers, vocab 16; random init, same cost as the SFT-warmed one),
         512 samples (64 prompts x 8) of 4-6 prompt + 2-5 response tokens, --micro-batch-size 128
  100m   Qwen2 hidden 768, 12 layers, 12 heads, FFN 3072, tied embeddings, same tokenizer (~100M params),
         64 samples (16 x 4) of the same lengths, --micro-batch-size 64
  long   the 100m model on 8 samples of 128 tokens (64 response), one micro-batch (the shape of the
         first version of this bench, which measured megatron at 0.64x transformers)
Both sides do one optimizer step over the whole batch per step:
  megatron      MegatronTrainer.train_step: GRPO policy loss, on-policy (no separate old-log-prob pass,
                as train.py runs it), mcore DDP + Adam + clip-grad
  fsdp          FSDPTrainer.train_step (--train-backend fsdp, world size 1): the same GRPO step on the HF model
  fsdp_lora     the same with --lora-rank 16 --lora-alpha 32 on all linear layers (only adapters in AdamW)
  transformers  the HF model in micro-batches of the same size, right-padded with an attention mask,
                the same token-mean PPO surrogate at ratio 1, backward, clip_grad_norm_, torch AdamW
The two alternate step by step in this one process and the table shows medians of process CPU seconds
and wall seconds per step, and tokens/s (real prompt + response tokens / CPU s), and the model FLOPs per
CPU second (6 x params x tokens) as a fraction of the machine's roofline, a fp32 torch.mm measured first by
this script at the same thread count, and each side's training state after its steps: parameters + optimizer
state in MB (LoRA: the frozen base + adapters, and Adam moments of the adapters only).
The machine is shared: read the ratios, not the absolute numbers.

    python bench/bench_train_step.py [--shapes demo,100m,long] [--steps 5] [--threads 1]
        [--out bench/results/bench_train_step.json] [--profile DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # what the Ray actors run with (slime_like/ray/placement.py)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

DEMO_MODEL = dict(arch="qwen2", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=4, ffn_hidden_size=512,
                  tie_embeddings=True, vocab_multiple=16)  # slime_like/demo/prepare.py MODEL_SHAPE
MODEL_100M = dict(arch="qwen2", hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=12, ffn_hidden_size=3072,
                  tie_embeddings=True, vocab_multiple=16, max_position_embeddings=1024)  # bench_e2e.py SHAPE_100M
SHAPES = {  # name -> (model, samples, micro-batch, (prompt min, max), (response min, max))
    "demo": (DEMO_MODEL, 512, 128, (4, 6), (2, 5)),
    "100m": (MODEL_100M, 64, 64, (4, 6), (2, 5)),
    "long": (MODEL_100M, 8, 8, (64, 64), (64, 64)),
}


GROUP = {"demo": 8, "100m": 4, "long": 1}  # samples per prompt (GRPO groups: --shared-prompt-training shares them)


def make_batch(n, prompt, response, vocab, seed=0, group=1):
    """n samples in groups of `group` consecutive samples with the same prompt (as a GRPO rollout delivers them)."""
    rng = random.Random(seed)
    toks, lens, head = [], [], []
    for i in range(n):
        if i % group == 0:
            head = [rng.randint(2, vocab - 1) for _ in range(rng.randint(*prompt))]
        r = rng.randint(*response)
        toks.append(head + [rng.randint(2, vocab - 1) for _ in range(r)])
        lens.append(r)
    return {"tokens": toks, "response_lengths": lens, "loss_masks": [[1] * r for r in lens],
            "rewards": [float(rng.random() < 0.5) for _ in range(n)]}


def _trainer_args(ckpt, batch, micro, extra=()):
    from slime_like.args import parse_args

    n = len(batch["tokens"])
    return parse_args(["--hf-checkpoint", ckpt, "--rollout-batch-size", str(n), "--n-samples-per-prompt", "1",
                       "--num-rollout", "100", "--colocate", "--actor-num-gpus-per-node", "1",
                       "--global-batch-size", str(n), "--micro-batch-size", str(micro), "--lr", "1e-5",
                       "--lr-decay-style", "constant", "--clip-grad", "1.0", "--advantage-estimator", "grpo",
                       "--moe-token-dispatcher-type", "alltoall", *extra], exit_on_error=False)


def _stepper(t, batch):
    assert not t.old_log_probs_needed()  # on-policy, as train.py runs the demo
    b = dict(batch)
    b.update(t.compute_advantages(b))
    calls = iter(range(10 ** 6))
    return lambda: t.train_step(next(calls), b)


def megatron_step(ckpt, batch, micro, port, extra=()):
    from slime_like.backends.megatron.trainer import MegatronTrainer

    t = MegatronTrainer(_trainer_args(ckpt, batch, micro, extra), role="actor", master_port=port)
    state = lambda: _mb(t.chunks, t.optimizer)  # noqa: E731
    return _stepper(t, batch), sum(p.numel() for c in t.chunks for p in c.parameters()), state


def fsdp_step(ckpt, batch, micro, port, extra=()):
    """FSDPTrainer in this process (world size 1; it joins the process group megatron_step opened)."""
    from slime_like.backends.fsdp.trainer import FSDPTrainer

    t = FSDPTrainer(_trainer_args(ckpt, batch, micro, ("--train-backend", "fsdp", *extra)), role="actor",
                    master_port=port)
    return _stepper(t, batch), lambda: _mb([t.model], t.optimizer)


def _tensor_mb(tensors) -> float:
    seen, total = set(), 0
    for x in tensors:
        x = x.to_local() if hasattr(x, "to_local") else x
        if torch.is_tensor(x) and x.data_ptr() not in seen:
            seen.add(x.data_ptr())
            total += x.numel() * x.element_size()
    return total / 2 ** 20


def _mb(modules, optimizer) -> dict:
    """Parameters and optimizer state (Adam moments, fp32 main copies when there are any) in MB."""
    inner = [getattr(o, "optimizer", o) for o in getattr(optimizer, "chained_optimizers", [optimizer])]
    states = [v for o in inner for st in o.state.values() for v in st.values()]
    mains = [p for o in getattr(optimizer, "chained_optimizers", [optimizer])
             for g in getattr(o, "fp32_from_float16_groups", []) for p in g]
    return {"params_mb": _tensor_mb(p for m in modules for p in m.parameters()),
            "optimizer_state_mb": _tensor_mb(states + mains)}


def transformers_step(ckpt, batch, micro):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    n, rmax = len(batch["tokens"]), max(batch["response_lengths"])
    adv = torch.tensor(batch["rewards"]) - sum(batch["rewards"]) / n
    mbs = []
    for s in range(0, n, micro):
        rows = range(s, min(s + micro, n))
        width = max(len(batch["tokens"][i]) for i in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        attn = torch.zeros(len(rows), width, dtype=torch.long)
        pos = torch.zeros(len(rows), rmax, dtype=torch.long)  # logit position scoring response token j
        mask = torch.zeros(len(rows), rmax)
        for k, i in enumerate(rows):
            t, r = batch["tokens"][i], batch["response_lengths"][i]
            ids[k, :len(t)], attn[k, :len(t)] = torch.tensor(t), 1
            pos[k, :r], mask[k, :r] = torch.arange(len(t) - r - 1, len(t) - 1), 1
        targets = ids.gather(1, (pos + 1).clamp(max=width - 1))
        mbs.append((ids, attn, pos, targets, mask, adv[list(rows)][:, None]))
    total = sum(float(m[4].sum()) for m in mbs)

    def step():
        for ids, attn, pos, targets, mask, a in mbs:
            logits = model(input_ids=ids, attention_mask=attn).logits
            logits = logits.gather(1, pos[..., None].expand(-1, -1, logits.shape[-1]))
            logp = torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None])[..., 0]
            loss = (-(a * torch.exp(logp - logp.detach())) * mask).sum() / total  # PPO surrogate at ratio 1
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, lambda: _mb([model], opt)


def measure(steps: dict, n: int) -> dict:
    """Alternate the step functions `n` times after one warm-up each; medians of CPU and wall seconds."""
    for fn in steps.values():
        fn()
    times = {k: ([], []) for k in steps}
    for _ in range(n):
        for k, fn in steps.items():
            c, w = time.process_time(), time.perf_counter()
            fn()
            times[k][0].append(time.process_time() - c)
            times[k][1].append(time.perf_counter() - w)
    return {k: (statistics.median(c), statistics.median(w)) for k, (c, w) in times.items()}


def matmul_peak_flops(n: int = 1024, repeat: int = 5) -> float:
    """The machine's roofline at these threads: best of `repeat` fp32 torch.mm of two n x n matrices."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # warm-up (thread pool, caches)
    best = min(_timed(lambda: torch.mm(a, b)) for _ in range(repeat))
    return 2 * n ** 3 / best


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def model_flops(n_params: int, tokens: int) -> float:
    """Forward + backward matmul FLOPs of a step: 6 x parameters x tokens (attention scores are negligible at
    these lengths; padding tokens are not counted, so this is the useful work)."""
    return 6.0 * n_params * tokens


def profile(steps: dict, out_dir: str, shape: str):
    """torch.profiler op table (self CPU time) of one step of each side, written to out_dir."""
    from torch.profiler import ProfilerActivity, profile as prof

    os.makedirs(out_dir, exist_ok=True)
    for k, fn in steps.items():
        with prof(activities=[ProfilerActivity.CPU]) as p:
            fn()
        with open(os.path.join(out_dir, f"{shape}_{k}.txt"), "w") as f:
            f.write(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=60))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="demo,100m")
    p.add_argument("--steps", type=int, default=5, help="timed steps per side (after one warm-up)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the colocated demo's trainer: 1-2)")
    p.add_argument("--out", default=os.path.join("bench", "results", "bench_train_step.json"))
    p.add_argument("--profile", default=None, help="also write torch.profiler op tables here")
    p.add_argument("--megatron-flags", default="", help="extra train.py flags for the megatron side, e.g. "
                   "'--use-dynamic-batch-size --max-tokens-per-gpu 4096'")
    argv = list(sys.argv[1:] if argv is None else argv)
    for i, arg in enumerate(argv[:-1]):  # "--megatron-flags --flag": argparse would take the value for an option
        if arg == "--megatron-flags":
            argv[i:i + 2] = [f"--megatron-flags={argv[i + 1]}"]
            break
    a = p.parse_args(argv)
    from slime_like.backends.megatron.parallel import free_port
    from slime_like.demo.arith import ALPHABET
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    torch.set_num_threads(a.threads)
    peak = matmul_peak_flops()
    print(f"roofline: torch.mm 1024^3 fp32 at {a.threads} thread(s) = {peak / 1e9:.1f} GFLOP/s", flush=True)
    results, port = [], free_port()
    with tempfile.TemporaryDirectory() as tmp:
        for shape in a.shapes.split(","):
            model, n, micro, prompt, response = SHAPES[shape]
            ckpt = os.path.join(tmp, f"{model['hidden_size']}_{model['num_layers']}")
            if not os.path.exists(os.path.join(ckpt, "config.json")):
                build_tiny_checkpoint(ckpt, alphabet=ALPHABET, **model)
            vocab = json.load(open(os.path.join(ckpt, "config.json")))["vocab_size"]
            batch = make_batch(n, prompt, response, vocab, group=GROUP[shape])
            tokens = sum(len(t) for t in batch["tokens"])
            mc, n_params, m_state = megatron_step(ckpt, batch, micro, port, a.megatron_flags.split())
            fc, f_state = fsdp_step(ckpt, batch, micro, port)
            lc, l_state = fsdp_step(ckpt, batch, micro, port, ("--lora-rank", "16", "--lora-alpha", "32"))
            tc, t_state = transformers_step(ckpt, batch, micro)
            steps = {"megatron": mc, "fsdp": fc, "fsdp_lora": lc, "transformers": tc}
            med = measure(steps, a.steps)
            memory = {k: fn() for k, fn in (("megatron", m_state), ("fsdp", f_state), ("fsdp_lora", l_state),
                                            ("transformers", t_state))}
            if a.profile:
                profile(steps, a.profile, shape)
            row = {"shape": shape, "params": n_params, "samples": n, "micro_batch": micro, "tokens_per_step": tokens,
                   "threads": a.threads, "steps": a.steps, "megatron_flags": a.megatron_flags,
                   **{f"{k}_{m}_s": v[i] for k, v in med.items() for i, m in enumerate(("cpu", "wall"))},
                   "ratio_megatron_over_transformers_tokens_per_cpu_s": med["transformers"][0] / med["megatron"][0],
                   "ratio_fsdp_over_transformers_tokens_per_cpu_s": med["transformers"][0] / med["fsdp"][0],
                   "ratio_fsdp_lora_over_fsdp_tokens_per_cpu_s": med["fsdp"][0] / med["fsdp_lora"][0],
                   "ratio_lora_over_full_optimizer_state": memory["fsdp_lora"]["optimizer_state_mb"]
                   / memory["fsdp"]["optimizer_state_mb"],
                   **{f"{k}_{m}": v for k, d in memory.items() for m, v in d.items()}}
            for k, (cpu_s, _) in med.items():  # model FLOPs per CPU second against the torch.mm roofline
                row[f"{k}_model_gflops_per_cpu_s"] = model_flops(n_params, tokens) / cpu_s / 1e9
                row[f"{k}_fraction_of_matmul_peak"] = model_flops(n_params, tokens) / cpu_s / peak
            results.append(row)
            print(f"{shape:>5} {n_params / 1e6:6.1f}M {n:4d}x~{tokens // n} tok, roofline fraction in ()", flush=True)
            for k, (cpu_s, wall_s) in med.items():
                print(f"   {k:>12}: {cpu_s:.3f} s CPU {wall_s:.3f} s wall | {tokens / cpu_s:8.0f} tokens/CPU-s "
                      f"({row[f'{k}_fraction_of_matmul_peak']:.0%}) | params {memory[k]['params_mb']:.1f} MB + "
                      f"optimizer state {memory[k]['optimizer_state_mb']:.1f} MB", flush=True)
            print(f"   LoRA optimizer state / full: {row['ratio_lora_over_full_optimizer_state']:.4f}", flush=True)
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            json.dump({"bench": "train_step", "load_avg": os.getloadavg(), "matmul_peak_gflops": peak / 1e9,
                       "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

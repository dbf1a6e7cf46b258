"""Training throughput of MegatronTrainer.train_step on CPU next to plain transformers (not a test).

For each model size (a tiny one and a ~100M-parameter Qwen2 built locally with the char tokenizer) it
times, on the same fixed batch and from the same HF checkpoint:
  - megatron: MegatronTrainer.train_step (GRPO policy loss, one optimizer step, megatron Adam, one
    micro-batch holding the whole batch), and
  - transformers: the HF model's forward, the same token-level policy-gradient loss on the response
    tokens, backward, torch AdamW step,
and prints tokens/s of each (prompt + response tokens per step / seconds per step) and their ratio
from this one run, plus a JSON result (also written to --out). Timings on a shared 2-core machine
are noisy; read the ratio, not the absolute numbers.

    python bench/bench_train_step.py [--sizes tiny,100m] [--batch 8] [--seq 128] [--steps 2]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

SIZES = {  # name -> build_tiny_checkpoint kwargs
    "tiny": dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_hidden_size=128),
    "100m": dict(hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=4, ffn_hidden_size=3072,
                 max_position_embeddings=1024),
}


def make_batch(n, seq, response, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(2, 90, (n, seq), generator=g).tolist()
    return {"tokens": tokens, "response_lengths": [response] * n, "loss_masks": [[1] * response] * n,
            "rewards": [1.0 if i % 2 else -1.0 for i in range(n)]}


def time_megatron(ckpt, batch, steps, port):
    from slime_like.args import parse_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    n = len(batch["tokens"])
    args = parse_args(["--hf-checkpoint", ckpt, "--rollout-batch-size", str(n), "--n-samples-per-prompt", "1",
                       "--num-rollout", "100", "--colocate", "--actor-num-gpus-per-node", "1",
                       "--global-batch-size", str(n), "--micro-batch-size", str(n), "--lr", "1e-5",
                       "--lr-decay-style", "constant", "--hidden-dropout", "0", "--attention-dropout", "0",
                       "--moe-token-dispatcher-type", "alltoall"], exit_on_error=False)
    t = MegatronTrainer(args, role="actor", master_port=port)
    b = dict(batch)
    b.update(t.compute_log_probs(b))
    b.update(t.compute_advantages(b))
    t.train_step(0, b)  # warm-up
    start = time.perf_counter()
    for i in range(steps):
        t.train_step(i + 1, b)
    return (time.perf_counter() - start) / steps, sum(p.numel() for c in t.chunks for p in c.parameters())


def time_transformers(ckpt, batch, steps):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    tokens = torch.tensor(batch["tokens"])
    r = batch["response_lengths"][0]
    adv = torch.tensor(batch["rewards"])[:, None].expand(-1, r)

    def step():
        logits = model(tokens).logits[:, -r - 1:-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, tokens[:, -r:, None])[..., 0]
        loss = -(adv * torch.exp(logp - logp.detach())).mean()  # PPO surrogate at ratio 1
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="tiny,100m")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--response", type=int, default=64)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--out", default=os.path.join("runs", "bench", "bench_train_step.json"),
                   help="JSON result path (runs/ is git-ignored)")
    a = p.parse_args(argv)
    from slime_like.backends.megatron.parallel import free_port
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    torch.manual_seed(0)
    batch = make_batch(a.batch, a.seq, a.response)
    tokens = a.batch * a.seq
    port, results = free_port(), []
    with tempfile.TemporaryDirectory() as tmp:
        for size in a.sizes.split(","):
            ckpt = build_tiny_checkpoint(os.path.join(tmp, size), **SIZES[size])
            mc_s, n_params = time_megatron(ckpt, batch, a.steps, port)
            hf_s = time_transformers(ckpt, batch, a.steps)
            row = {"size": size, "params": n_params, "tokens_per_step": tokens, "threads": torch.get_num_threads(),
                   "megatron_tokens_per_s": tokens / mc_s, "transformers_tokens_per_s": tokens / hf_s,
                   "ratio_megatron_over_transformers": hf_s / mc_s}
            results.append(row)
            print(f"{size:>5} ({n_params / 1e6:.1f}M params, {tokens} tokens/step): megatron "
                  f"{row['megatron_tokens_per_s']:.0f} tok/s, transformers {row['transformers_tokens_per_s']:.0f} "
                  f"tok/s, ratio {row['ratio_megatron_over_transformers']:.2f}", flush=True)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"bench": "train_step", "results": results}, f, indent=2)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

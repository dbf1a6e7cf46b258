"""SFT warm-up for the demo: plain PyTorch AdamW on the HF model until held-out greedy accuracy reaches a target.

Why warm up at all: from random weights every sampled answer is wrong, every GRPO group has zero variance and
RL has nothing to learn from. At ~15 % greedy accuracy about 40 % of 8-sample groups contain a right answer
(pass@8), which is the signal GRPO climbs on. Why stop so early: the demo is about RL doing the rest, so SFT
stops at the first eval >= target, and evaluates often so it does not overshoot (an eval costs ~0.1 s).

The loss covers only the answer and eos (labels -100 on the prompt and padding), so the model learns to
answer and to stop, not to write prompts.
"""
from __future__ import annotations

import random
import time

from slime_like.demo.arith import EOS_ID, PAD_ID, answer_text, evaluate_greedy, prompt_text, to_records, token_ids


def make_batch(pairs):
    """(input_ids, attention_mask, labels) right-padded; labels only on the answer tokens and eos."""
    import torch

    ids, labels = [], []
    for a, b in pairs:
        p, c = token_ids(prompt_text(a, b)), token_ids(answer_text(a, b)) + [EOS_ID]
        ids.append(p + c)
        labels.append([-100] * len(p) + c)
    width = max(map(len, ids))
    mask = [[1] * len(x) + [0] * (width - len(x)) for x in ids]
    ids = [x + [PAD_ID] * (width - len(x)) for x in ids]
    labels = [x + [-100] * (width - len(x)) for x in labels]
    return torch.tensor(ids), torch.tensor(mask), torch.tensor(labels)


def sft_warmup(base_dir: str, train_pairs, heldout_pairs, out_dir: str, *, target: float = 0.15, lr: float = 1e-3,
               batch_size: int = 64, eval_every: int = 10, max_steps: int = 3000, seed: int = 0,
               threads: int = 1, log=print) -> dict:
    """Train the checkpoint in base_dir, save the first one with held-out accuracy >= target to out_dir.

    Returns {"steps", "seconds", "heldout_accuracy", "history": [(step, loss, acc), ...]}. Raises if the
    target is not reached within max_steps (the run would otherwise start RL from a useless model).
    Deterministic for a given seed and thread count.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not 0.0 < target < 1.0:
        raise ValueError(f"SFT target accuracy must be in (0, 1), got {target}")
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(base_dir).float()
        heldout = to_records(heldout_pairs)
        rng = random.Random(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
        model.train()
        t0, history, acc = time.perf_counter(), [], 0.0
        for step in range(1, max_steps + 1):
            ids, mask, labels = make_batch(rng.sample(train_pairs, batch_size))
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if step % eval_every == 0:
                acc = evaluate_greedy(model, heldout)
                history.append((step, round(loss.item(), 4), acc))
                if acc >= target:
                    break
        else:
            raise RuntimeError(f"SFT warm-up did not reach held-out accuracy {target} in {max_steps} steps "
                               f"(last {acc:.3f}); raise --sft-max-steps or --sft-lr, or lower --sft-target")
        seconds = time.perf_counter() - t0
        log(f"sft: {step} steps in {seconds:.1f}s, loss {history[-1][1]:.3f}, held-out greedy accuracy {acc:.3f}")
        model.save_pretrained(out_dir, safe_serialization=True)
        AutoTokenizer.from_pretrained(base_dir).save_pretrained(out_dir)
        return {"steps": step, "seconds": round(seconds, 2), "heldout_accuracy": acc, "history": history,
                "target": target, "lr": lr, "batch_size": batch_size, "eval_every": eval_every, "seed": seed,
                "threads": threads}
    finally:
        torch.set_num_threads(previous_threads)

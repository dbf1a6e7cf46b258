"""Why on-policy distillation stops short of the teacher's greedy accuracy on the demo task (docs/demo.md).

    python bench/probe_opd_teacher.py TASK_DIR [--compare DIR ...] [--samples 16]

TASK_DIR is what `python -m slime_like.demo.prepare TASK_DIR --teacher-target 0.6` wrote. For the teacher, the
student's warm-up and each --compare checkpoint (an HF dir) it prints one JSON line: held-out greedy accuracy,
T = 1 sampled accuracy (held-out and 200 train prompts), the smallest top-1 minus top-2 probability along each
greedy answer (how fragile the greedy answers are), the sampled reverse KL to the teacher per response token
(eos included) on the model's own T = 1 samples, and the share of greedy held-out answers equal to the teacher's.
Plain transformers, independent of our engines and trainers. A probe, not a test.
"""
from __future__ import annotations

import argparse
import json
import os

import torch
from transformers import AutoModelForCausalLM

from slime_like.demo import arith


def load(path):
    model = AutoModelForCausalLM.from_pretrained(path)
    return model.eval()


def sample(model, prompt_ids, k, greedy):
    """k responses (ids, cut after the first eos) of one prompt."""
    ids = torch.tensor([prompt_ids]).repeat(k, 1)
    kw = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=1.0, top_k=0, top_p=None)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=arith.MAX_NEW_TOKENS, eos_token_id=arith.EOS_ID,
                             pad_token_id=arith.EOS_ID, **kw)
    rows = out[:, len(prompt_ids):].tolist()
    return [row[:row.index(arith.EOS_ID) + 1] if arith.EOS_ID in row else row for row in rows]


def token_log_probs(model, prompt_ids, response):
    """Log-probs (full vocabulary) at the positions that score each response token."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + response])).logits[0]
    return logits[len(prompt_ids) - 1:len(prompt_ids) - 1 + len(response)].log_softmax(-1)


def accuracy(records, responses):
    return sum(arith.score(None, r["label"], response_ids=x) for r, x in zip(records, responses)) / len(records)


def sampled_stats(model, teacher, records, k):
    """(T = 1 accuracy, reverse KL to the teacher per token on the model's own samples)."""
    hits, kl, tokens = 0.0, 0.0, 0
    for r in records:
        prompt = arith.token_ids(r["prompt"])
        for response in sample(model, prompt, k, greedy=False):
            hits += arith.score(None, r["label"], response_ids=response)
            idx = torch.tensor(response)[:, None]
            diff = token_log_probs(model, prompt, response).gather(1, idx) \
                - token_log_probs(teacher, prompt, response).gather(1, idx)
            kl, tokens = kl + float(diff.sum()), tokens + len(response)
    return hits / (k * len(records)), kl / max(tokens, 1)


def greedy_margins(model, records, responses):
    """Per prompt: min over the greedy answer's tokens of p(top-1) - p(top-2)."""
    out = []
    for r, response in zip(records, responses):
        top = token_log_probs(model, arith.token_ids(r["prompt"]), response).exp().topk(2, -1).values
        out.append(float((top[:, 0] - top[:, 1]).min()))
    return torch.tensor(out)


def probe(name, model, teacher, heldout, train, teacher_greedy, k):
    torch.manual_seed(0)
    greedy = [sample(model, arith.token_ids(r["prompt"]), 1, greedy=True)[0] for r in heldout]
    held_t1, _ = sampled_stats(model, teacher, heldout, k)
    train_t1, kl = sampled_stats(model, teacher, train, k)
    margins = greedy_margins(model, heldout, greedy)
    return {"model": name, "heldout_greedy": accuracy(heldout, greedy), "heldout_T1": round(held_t1, 3),
            "train_T1": round(train_t1, 3), "reverse_kl_to_teacher": round(kl, 4),
            "greedy_agree_with_teacher": sum(a == b for a, b in zip(greedy, teacher_greedy)) / len(heldout),
            "margin_median": round(float(margins.median()), 3),
            "margin_lt_0.1": float((margins < 0.1).float().mean()), "margin_lt_0.2": float((margins < 0.2).float().mean())}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("task_dir")
    p.add_argument("--compare", nargs="*", default=[], help="more HF checkpoints to probe against the teacher")
    p.add_argument("--samples", type=int, default=16, help="T = 1 samples per prompt")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    heldout = arith.read_jsonl(os.path.join(a.task_dir, "data", "heldout.jsonl"))
    train = arith.read_jsonl(os.path.join(a.task_dir, "data", "train.jsonl"))[:200]
    teacher = load(os.path.join(a.task_dir, "teacher_model"))
    teacher_greedy = [sample(teacher, arith.token_ids(r["prompt"]), 1, greedy=True)[0] for r in heldout]
    paths = [os.path.join(a.task_dir, "teacher_model"), os.path.join(a.task_dir, "sft_model")] + a.compare
    for path in paths:
        model = teacher if path == paths[0] else load(path)
        print(json.dumps(probe(path, model, teacher, heldout, train, teacher_greedy, a.samples)), flush=True)


if __name__ == "__main__":
    main()

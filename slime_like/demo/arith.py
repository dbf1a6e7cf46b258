"""The demo task: 2-digit addition, "a+b=" -> "c" then eos, with a, b in 10..99 (8100 pairs).

A fixed 200 pairs (seed 1234) are held out and never trained on, by SFT or by RL. The reward is strict exact
match: 1.0 iff the response before eos is exactly the sum, and the response did end with eos (trailing digits,
a missing eos, or any token outside the task's alphabet score 0). No partial credit: the feasibility probe
(shared/probes/demo-arith) showed GRPO learns this task from a ~15 % SFT warm-up without it.

Use as the reward of a run:   --custom-rm-path slime_like.demo.arith.reward
"""
from __future__ import annotations

import json
import os
import random

from slime_like.sample import Status

LO, HI = 10, 99
ALPHABET = "0123456789+="          # the char tokenizer's characters, after <pad>=0 and <eos>=1
PAD_ID, EOS_ID = 0, 1
EOS_TEXT = "<eos>"
SPLIT_SEED = 1234
N_HELDOUT = 200
TRAIN_SHUFFLE_SEED = 0
# The longest answer (3 digits) + eos + one spare token: enough to finish, short enough that a rambling
# response is cut quickly (the probe's advice).
MAX_NEW_TOKENS = 5


def prompt_text(a: int, b: int) -> str:
    return f"{a}+{b}="


def answer_text(a: int, b: int) -> str:
    return str(a + b)


def split_pairs(seed: int = SPLIT_SEED, n_heldout: int = N_HELDOUT) -> tuple[list, list]:
    """(train pairs, held-out pairs): one fixed shuffle of all pairs; the first n_heldout are held out."""
    pairs = [(a, b) for a in range(LO, HI + 1) for b in range(LO, HI + 1)]
    random.Random(seed).shuffle(pairs)
    return pairs[n_heldout:], pairs[:n_heldout]


def to_records(pairs) -> list[dict]:
    return [{"prompt": prompt_text(a, b), "label": answer_text(a, b)} for a, b in pairs]


def write_data(data_dir: str) -> dict[str, str]:
    """Write train.jsonl (shuffled with a fixed seed) and heldout.jsonl; keys `prompt` and `label`."""
    train, heldout = split_pairs()
    train = list(train)
    random.Random(TRAIN_SHUFFLE_SEED).shuffle(train)
    os.makedirs(data_dir, exist_ok=True)
    paths = {}
    for name, pairs in (("train", train), ("heldout", heldout)):
        path = os.path.join(data_dir, f"{name}.jsonl")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            for rec in to_records(pairs):
                f.write(json.dumps(rec) + "\n")
        os.replace(tmp, path)  # never leave a half-written file that a later run would take as done
        paths[name] = path
    return paths


def read_jsonl(path: str) -> list[dict]:
    out = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                rec = json.loads(line)
                if "prompt" not in rec or "label" not in rec:
                    raise ValueError(f"{path}:{lineno}: a record needs keys 'prompt' and 'label', got {sorted(rec)}")
                out.append(rec)
    return out


def token_ids(text: str) -> list[int]:
    """The char tokenizer's ids for text over ALPHABET (id = 2 + position in ALPHABET)."""
    bad = [c for c in text if c not in ALPHABET]
    if bad:
        raise ValueError(f"{text!r} has characters {bad} outside the demo alphabet {ALPHABET!r}")
    return [2 + ALPHABET.index(c) for c in text]


def score(response: str, label, truncated: bool = False, response_ids: list[int] | None = None) -> float:
    """1.0 iff the response is exactly `label` followed by eos, else 0.0.

    With `response_ids` (the generated token ids) the ids decide: the ids before the first eos must be exactly
    the answer's. Deciding on ids also rejects padded-vocabulary ids, which the tokenizer decodes to nothing
    and so would be invisible in the text. Without ids the text decides. Either may still contain the eos, or
    not (engines trim the matched stop token from the text, some rollouts from the ids too); without it the
    response counts as ended unless `truncated` (it hit the max-new-tokens limit).
    """
    answer = str(label)
    if response_ids is not None:
        ids, ended = list(response_ids), not truncated
        if EOS_ID in ids:
            ids, ended = ids[:ids.index(EOS_ID)], True
        try:
            return 1.0 if ended and ids == token_ids(answer) else 0.0
        except ValueError:  # a label outside the alphabet can never be matched
            return 0.0
    text, ended = response or "", not truncated
    if EOS_TEXT in text:
        text, ended = text[:text.index(EOS_TEXT)], True
    return 1.0 if ended and text == answer else 0.0


async def reward(args, sample) -> float:
    """slime's custom reward signature (`--custom-rm-path slime_like.demo.arith.reward`): exact match."""
    response_ids = None
    if sample.response_length and len(sample.tokens) >= sample.response_length:
        response_ids = sample.tokens[len(sample.tokens) - sample.response_length:]
    return score(sample.response, sample.label, truncated=sample.status == Status.TRUNCATED,
                 response_ids=response_ids)


def evaluate_greedy(model_or_dir, heldout, max_new_tokens: int = MAX_NEW_TOKENS, batch_size: int = 200) -> float:
    """Greedy exact-match accuracy of an HF model (or checkpoint dir) on held-out records (or a jsonl path).

    Plain transformers `generate`, so it checks a checkpoint independently of our engines.
    """
    import torch
    from transformers import AutoModelForCausalLM

    records = read_jsonl(heldout) if isinstance(heldout, str) else list(heldout)
    model = AutoModelForCausalLM.from_pretrained(model_or_dir) if isinstance(model_or_dir, str) else model_or_dir
    was_training = model.training
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(records), batch_size):
            chunk = records[i:i + batch_size]
            prompts = [token_ids(r["prompt"]) for r in chunk]
            width = max(map(len, prompts))
            # left padding so every row's last prompt token sits at the same position
            ids = torch.tensor([[PAD_ID] * (width - len(p)) + p for p in prompts])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                 do_sample=False, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
            for row, rec in zip(out[:, width:].tolist(), chunk):
                # generate() pads finished rows with PAD_ID; a row without eos ran out of tokens
                correct += int(score("", rec["label"], truncated=True, response_ids=row))
    if was_training:
        model.train()
    return correct / max(len(records), 1)


def distill_only_rewards(args, samples) -> tuple[list[float], list[float]]:
    """`--custom-reward-post-process-path slime_like.demo.arith.distill_only_rewards`: pure on-policy distillation
    (slime's OPD recipe trains on zero task reward): the exact-match rewards are kept for the logs, the rewards
    trained on are 0, so with --use-opd the teacher's reverse KL is the only learning signal."""
    return [float(s.reward) for s in samples], [0.0] * len(samples)

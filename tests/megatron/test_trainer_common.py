"""Shared builders for the MegatronTrainer tests (imported by test_trainer_*.py and their spawned ranks).

Args come from the real parser (`slime_like.args.parse_args`), so flag names are the ones users type.
A "rollout" here is a fixed random batch over the tiny checkpoint's character vocabulary.
"""
import random

import torch

from slime_like.args import make_args as parsed_args

BASE_FLAGS = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--num-rollout", "10",
              "--colocate", "--actor-num-gpus-per-node", "1", "--hidden-dropout", "0", "--attention-dropout", "0",
              "--lr-decay-style", "constant", "--weight-decay", "0", "--clip-grad", "0", "--seed", "1234",
              # the parser keeps Megatron's default "allgather", which mcore rejects with variable_seq_lengths
              "--moe-token-dispatcher-type", "alltoall"]


def make_args(ckpt, *flags):
    """Parsed args for the tiny checkpoint; later flags override BASE_FLAGS (argparse keeps the last)."""
    return parsed_args("--hf-checkpoint", ckpt, *BASE_FLAGS, *flags, validate=True)


def make_batch(n=8, seed=0, low=2, high=90, with_holes=False):
    """n samples: 2..7 prompt tokens, 1..6 response tokens; rewards alternate -1 / +1 (group-normalised)."""
    g = random.Random(seed)
    b = {k: [] for k in ("tokens", "response_lengths", "loss_masks", "rewards", "raw_rewards",
                         "rollout_log_probs", "sample_indices", "truncated")}
    for i in range(n):
        p, r = g.randint(2, 7), g.randint(1, 6)
        b["tokens"].append([g.randint(low, high) for _ in range(p + r)])
        b["response_lengths"].append(r)
        mask = [1] * r
        if with_holes and r > 2:
            mask[1] = 0  # a tool token inside the response
        b["loss_masks"].append(mask)
        b["rewards"].append(1.0 if i % 2 else -1.0)
        b["raw_rewards"].append(float(i % 2))
        b["rollout_log_probs"].append([-4.0 - 0.1 * g.random() for _ in range(r)])
        b["sample_indices"].append(i)
        b["truncated"].append(0)
    return b


def shard(batch, dp, rank):
    """This DP rank's share: the rank-th contiguous slice of every column (whole samples)."""
    n = len(batch["tokens"])
    per = n // dp
    return {k: v[rank * per:(rank + 1) * per] for k, v in batch.items()}


def concat_lists(parts):
    """Per-sample tensor lists from DP ranks back into batch order."""
    return [x for part in parts for x in part]


def response_logprob_sums(log_probs, batch):
    """(sum over positive-reward samples, sum over negative-reward samples) of response log-probs."""
    pos = sum(float(lp.sum()) for lp, r in zip(log_probs, batch["rewards"]) if r > 0)
    neg = sum(float(lp.sum()) for lp, r in zip(log_probs, batch["rewards"]) if r < 0)
    return pos, neg


def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def test_builders_are_deterministic_and_consistent():
    a, b = make_batch(seed=3), make_batch(seed=3)
    assert a == b
    for toks, r, m, lp in zip(a["tokens"], a["response_lengths"], a["loss_masks"], a["rollout_log_probs"]):
        assert 0 < r < len(toks) and len(m) == r == len(lp)
    halves = [shard(a, 2, r) for r in range(2)]
    assert concat_lists([h["tokens"] for h in halves]) == a["tokens"]

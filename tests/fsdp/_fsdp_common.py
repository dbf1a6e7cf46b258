"""Shared builders for the FSDP trainer tests (and their spawned ranks): the Megatron tests' tiny batches and
real-parser args, plus `--train-backend fsdp`."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # spawned ranks import this module by name
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "megatron"))

from _dist import run_ranks  # noqa: E402,F401
from test_trainer_common import concat_lists, flat, make_batch, shard  # noqa: E402,F401
from test_trainer_common import make_args as _megatron_args  # noqa: E402


def make_args(ckpt, *flags):
    return _megatron_args(ckpt, "--train-backend", "fsdp", *flags)


def hf_log_probs(ckpt, batch, temperature=1.0):
    """Reference: transformers' own forward of the checkpoint, one sample at a time (no padding at all)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for toks, r in zip(batch["tokens"], batch["response_lengths"]):
            logits = model(torch.tensor([toks])).logits[0].float() / temperature
            lp = torch.log_softmax(logits[len(toks) - r - 1:len(toks) - 1], -1)
            out.append(lp.gather(-1, torch.tensor(toks[len(toks) - r:])[:, None])[:, 0])
    return out

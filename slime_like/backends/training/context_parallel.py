"""slime's context-parallel helpers for custom TIS / loss functions (slime.backends.megatron_utils.cp_utils).

A custom TIS / loss function runs with context parallelism 1 only (with --context-parallel-size > 1 the launch
refuses --custom-tis-function-path and the other whole-response hooks: config/trainer_megatron.py) and is handed
whole responses (backends/training/hooks.custom_tis), so gathering a response's CP shards and slicing this rank's
shard out of a whole response are both the identity -- what slime's own helpers do at CP size 1. The lengths are
still checked, as slime checks them."""
from __future__ import annotations


def all_gather_with_cp(tensor, total_length: int, response_length: int):
    if len(tensor) != response_length:
        raise ValueError(f"all_gather_with_cp: {len(tensor)} values for a response of {response_length} tokens")
    return tensor


def slice_log_prob_with_cp(log_prob, total_length: int, response_length: int):
    if len(log_prob) != response_length:
        raise ValueError(f"slice_log_prob_with_cp: {len(log_prob)} log-probs for a response of {response_length} "
                         f"tokens (total length {total_length})")
    return log_prob

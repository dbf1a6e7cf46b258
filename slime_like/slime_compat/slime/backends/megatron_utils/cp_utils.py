"""slime.backends.megatron_utils.cp_utils: the context-parallel helpers custom TIS functions call
(slime_like/backends/training/context_parallel.py: CP is 1 here, so both are the identity)."""
from slime_like.backends.training.context_parallel import all_gather_with_cp, slice_log_prob_with_cp

__all__ = ["all_gather_with_cp", "slice_log_prob_with_cp"]

"""Start-up checks of the Megatron trainer's settings (kept out of trainer.py, which stays one screen per job)."""
from __future__ import annotations

import logging

from slime_like.backends.megatron.kernels import local_cp_problems

log = logging.getLogger("slime_like.backends.megatron.trainer")


def check_supported(args, role) -> None:
    """Settings the Megatron trainer cannot run (or ignores), checked when a trainer rank starts."""
    problems = local_cp_problems(args) if args.context_parallel_size > 1 and not _uses_te(args) else []
    if problems:
        raise NotImplementedError("; ".join(problems))
    loss_type = args.loss_type
    if role == "actor" and loss_type not in ("policy_loss", "sft_loss", "custom_loss"):
        raise NotImplementedError(f"--loss-type {loss_type} is not supported by the Megatron trainer; "
                                  "use policy_loss, sft_loss or custom_loss")
    for dest, flag in (("log_probs_chunk_size", "--log-probs-chunk-size"),
                       ("recompute_loss_function", "--recompute-loss-function")):
        value = getattr(args, dest)
        if value not in (None, False, -1):  # memory knobs only: results are the same without them
            log.warning("%s %s has no effect in the Megatron trainer yet (memory optimisation only)", flag, value)
    if args.use_dynamic_batch_size and not args.max_tokens_per_gpu:
        raise ValueError("--use-dynamic-batch-size needs --max-tokens-per-gpu (e.g. 4096)")
    if not args.rollout_temperature > 0:
        raise ValueError(f"--rollout-temperature must be > 0, got {args.rollout_temperature}")


def _uses_te(args) -> bool:
    from slime_like.backends.megatron.model import uses_te_spec

    return uses_te_spec(args)

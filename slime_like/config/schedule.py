"""The learning-rate schedule's arithmetic (warm-up vs decay horizon), shared by the trainer and the preflight.

Pure arithmetic over the namespace: the preflight runs it per role before Ray starts (naming the YAML entry a
value came from), the Megatron optimizer builds its scheduler from the same numbers.
"""
from __future__ import annotations

DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")


def schedule_steps(args) -> tuple[int, int]:
    """(warm-up steps, decay steps) in optimizer steps.

    decay steps = --lr-decay-iters, else --train-iters, else --num-rollout x --num-steps-per-rollout;
    warm-up = --lr-warmup-iters, or --lr-warmup-fraction x decay steps. The constant style needs no
    horizon, so an unknown one is fine there; linear / cosine without one is an error.
    """
    style = args.lr_decay_style
    if style not in DECAY_STYLES:
        import difflib

        close = difflib.get_close_matches(str(style), DECAY_STYLES, n=1)
        raise ValueError(f"--lr-decay-style {style!r} is unknown" + (f"; did you mean {close[0]!r}?" if close else
                                                                     f"; choose one of {DECAY_STYLES}"))
    decay = args.lr_decay_iters or args.train_iters
    if not decay and args.num_rollout:
        decay = int(args.num_rollout) * int(args.num_steps_per_rollout)
    fraction = args.lr_warmup_fraction
    if fraction is not None and args.lr_warmup_iters:
        raise ValueError("set only one of --lr-warmup-fraction and --lr-warmup-iters")
    if fraction is not None:
        if not decay:
            raise ValueError("--lr-warmup-fraction needs a schedule length: set --lr-decay-iters or --num-rollout")
        warmup = int(float(fraction) * decay)
    else:
        warmup = int(args.lr_warmup_iters)
    if not decay:
        if style != "constant":
            raise ValueError(f"--lr-decay-style {style} needs a schedule length: set --lr-decay-iters "
                             "(optimizer steps) or --num-rollout")
        decay = warmup + 1  # constant after warm-up: the horizon is never reached in a meaningful way
    if warmup >= decay:
        raise ValueError(f"LR warm-up ({warmup} steps) must be shorter than the decay horizon ({decay} steps); "
                         "lower --lr-warmup-iters / --lr-warmup-fraction or raise --lr-decay-iters")
    return warmup, int(decay)

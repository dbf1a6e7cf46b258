"""Where a MegatronTrainer's weights come from: --load / --ref-load / --hf-checkpoint, the OPD teacher, and the
frozen forward-only copies (reference, teacher) built from them. Functions of the trainer's args."""
from __future__ import annotations

import os

from slime_like.backends.megatron import optimizer as O


def frozen_model(args, M, load) -> tuple[list, list]:
    """(chunks, wrapped model) of a forward-only copy of the architecture (reference, OPD teacher); `load(args,
    chunks)` fills its weights."""
    chunks = M.build_model(args, "ref")
    load(args, chunks)
    for chunk in chunks:
        chunk.requires_grad_(False)
        chunk.eval()
    return chunks, O.wrap_for_training(args, chunks, trainable=False)


def has_megatron_checkpoint(path) -> bool:
    """A --load directory with a published iteration marker (Megatron's latest_checkpointed_iteration.txt)."""
    return bool(path) and os.path.isfile(os.path.join(path, "latest_checkpointed_iteration.txt"))


def load_teacher_weights(args, chunks):
    """--opd-teacher-load at --opd-teacher-ckpt-step (default: its latest published iteration), or an HF dir."""
    from slime_like.backends.megatron import checkpoint

    path, step = args.opd_teacher_load, args.opd_teacher_ckpt_step
    if has_megatron_checkpoint(path) or step is not None:
        if checkpoint.load_checkpoint(path, chunks, load_optim=False, args=args, iteration=step) is None \
                and not checkpoint.release_dir(path):
            raise FileNotFoundError(f"--opd-teacher-load {path}: no published checkpoint in it")
    else:
        load_weights_from(args, chunks, path)


def load_weights_from(args, chunks, path):
    """Weights only, from a Megatron checkpoint (has the iteration marker) or else an HF directory."""
    if has_megatron_checkpoint(path):
        from slime_like.backends.megatron import checkpoint

        checkpoint.load_checkpoint(path, chunks, optimizer=None, scheduler=None, load_optim=False)
    else:
        from slime_like.backends.megatron import hf_weights

        hf_weights.load_hf_weights(chunks, path, args)  # names the path if it is not an HF dir


def load_initial_weights(args, chunks, role):
    """--load when it is an HF directory, else --ref-load (torch_dist or HF dir), else --hf-checkpoint.

    A --load without a published Megatron checkpoint (a fresh run whose --load is its --save) falls
    back the same way, as in slime.
    """
    source = initial_source(args)
    if not source:
        raise ValueError(f"{role}: no weights to start from: set --load, --ref-load or --hf-checkpoint")
    load_weights_from(args, chunks, source)


def initial_source(args):
    """The weights a fresh (not resumed) run starts from: --load when it is an HF directory, else --ref-load,
    else --hf-checkpoint (None when none is set)."""
    from slime_like.backends.megatron import checkpoint

    load = args.load
    source = load if load and checkpoint.is_hf_dir(load) else None
    return source or args.ref_load or args.hf_checkpoint


def load_ref_weights(args, chunks):
    source = args.ref_load or args.hf_checkpoint
    if not source:
        raise ValueError("the reference model (--use-kl-loss / --kl-coef) needs --ref-load or --hf-checkpoint")
    load_weights_from(args, chunks, source)

"""Where a MegatronTrainer's weights come from: --load / --ref-load / --hf-checkpoint, the OPD teacher, and the
frozen forward-only copies (reference, teacher) built from them."""
from __future__ import annotations

import os

from slime_like.backends.megatron import optimizer as O


class WeightSourcesMixin:
    """Weight loading for MegatronTrainer (needs `self.args`)."""

    def _frozen_model(self, M, load):
        """(chunks, wrapped model) of a forward-only copy of the architecture (reference, OPD teacher)."""
        chunks = M.build_model(self.args, "ref")
        load(chunks)
        for chunk in chunks:
            chunk.requires_grad_(False)
            chunk.eval()
        return chunks, O.wrap_for_training(self.args, chunks, trainable=False)

    def _load_teacher_weights(self, chunks):
        """--opd-teacher-load at --opd-teacher-ckpt-step (default: its latest published iteration), or an HF dir."""
        from slime_like.backends.megatron import checkpoint

        path, step = self.args.opd_teacher_load, self.args.opd_teacher_ckpt_step
        if self._has_megatron_checkpoint(path) or step is not None:
            if checkpoint.load_checkpoint(path, chunks, load_optim=False, args=self.args, iteration=step) is None \
                    and not checkpoint.release_dir(path):
                raise FileNotFoundError(f"--opd-teacher-load {path}: no published checkpoint in it")
        else:
            self._load_weights_from(chunks, path)

    @staticmethod
    def _has_megatron_checkpoint(path) -> bool:
        """A --load directory with a published iteration marker (Megatron's latest_checkpointed_iteration.txt)."""
        return bool(path) and os.path.isfile(os.path.join(path, "latest_checkpointed_iteration.txt"))

    def _load_weights_from(self, chunks, path):
        """Weights only, from a Megatron checkpoint (has the iteration marker) or else an HF directory."""
        if self._has_megatron_checkpoint(path):
            from slime_like.backends.megatron import checkpoint

            checkpoint.load_checkpoint(path, chunks, optimizer=None, scheduler=None, load_optim=False)
        else:
            from slime_like.backends.megatron import hf_weights

            hf_weights.load_hf_weights(chunks, path, self.args)  # names the path if it is not an HF dir

    def _load_initial_weights(self, chunks, role):
        """--load when it is an HF directory, else --ref-load (torch_dist or HF dir), else --hf-checkpoint.

        A --load without a published Megatron checkpoint (a fresh run whose --load is its --save) falls
        back the same way, as in slime.
        """
        from slime_like.backends.megatron import checkpoint

        load = self.args.load
        source = load if load and checkpoint.is_hf_dir(load) else None
        source = source or self.args.ref_load or self.args.hf_checkpoint
        if not source:
            raise ValueError(f"{role}: no weights to start from: set --load, --ref-load or --hf-checkpoint")
        self._load_weights_from(chunks, source)

    def _load_ref_weights(self, chunks):
        source = self.args.ref_load or self.args.hf_checkpoint
        if not source:
            raise ValueError("the reference model (--use-kl-loss / --kl-coef) needs --ref-load or --hf-checkpoint")
        self._load_weights_from(chunks, source)

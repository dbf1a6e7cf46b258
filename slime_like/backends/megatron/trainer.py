"""MegatronTrainer: one trainer rank of the actor or the critic (what the Ray layer calls).

    t = MegatronTrainer(role_args, role="actor", rank=r, world_size=w, master_addr=..., master_port=...,
                        resume_iteration=N)
    batch.update(t.compute_log_probs(batch))      # actor: log_probs (+ ref_log_probs with a reference model)
    batch.update(critic.compute_values(batch))    # critic: values
    batch.update(t.compute_advantages(batch))     # advantages, returns (slime_like.algorithms estimators)
    metrics = t.train_step(rollout_id, batch)     # num_steps_per_rollout optimizer steps
    t.save(rollout_id); t.offload(); t.onload(); t.iter_hf_weights()

The RL logic behind these calls is RLTrainerBase's (backends/training/base.py, shared with the FSDP trainer); this
class supplies megatron-core's model, schedule and optimizer step and the Megatron-only hooks.
Every collective-bearing call must be made on every rank of the trainer group. All per-sample outputs
are 1-D float32 CPU tensors over the response tokens, in batch order, identical on every rank of a
TP/PP group (computed on the last pipeline stage and broadcast over the pipeline group).

Reference model (KL): a second, frozen copy of the model (no grads, no optimizer, no DDP), built when
--use-kl-loss or --kl-coef > 0. Memory cost: one extra set of weights in the training dtype
(2 bytes/param in bf16, 4 in fp32), i.e. about +1/8 of the actor's Adam training state
(weights + fp32 main weights + grads + two Adam moments = 16-18 bytes/param in bf16). On GPU it is
moved to CPU by offload() together with the actor.
"""
from __future__ import annotations

import logging
import os

import torch

from slime_like.backends.megatron.checks import check_supported
from slime_like.backends.megatron import optimizer as O
from slime_like.backends.megatron import trainer_dist as TD
from slime_like.backends.megatron import weight_sources as W
from slime_like.backends.megatron import mtp as MTP
from slime_like.backends.megatron.hf_weights import unwrap
from slime_like.backends.megatron.old_actor import OldActorWeights
from slime_like.backends.megatron.response_rows import projecting
from slime_like.backends.megatron.routing_replay import RoutingReplay
from slime_like.backends.megatron.shared_prompt import launch_problems, per_token_rope
from slime_like.backends.megatron.transformer_config import virtual_pipeline_size
from slime_like.backends.training.base import RLTrainerBase, StepResult
from slime_like.backends.training import data as D
from slime_like.backends.training import loss as L
from slime_like.config.hf_config import fill_args_from_hf
from slime_like.config.hf_families import family_of

log = logging.getLogger(__name__)


def interleave_group(num_microbatches: int, ps) -> int:
    """Micro-batches a chunk runs in a row under megatron-core's interleaved schedule: the pipeline size (its
    default) when that divides the count, else all of them (the schedule accepts a group in [PP, M] that leaves no
    remainder below PP; a rollout's micro-batch count varies). MicroBatcher keeps the count >= PP."""
    pp = ps.get_pipeline_model_parallel_world_size()
    return pp if num_microbatches % pp == 0 else num_microbatches


class MegatronTrainer(RLTrainerBase):
    """Implements `slime_like.backends.trainer_api.TrainerBackend` (`--train-backend megatron`).

    The RL logic (scoring passes, advantages, loss kind, the step loop) and the constructor's order are
    RLTrainerBase's; here its hooks for megatron-core: the model chunks, forward_backward_func, the optimizer step,
    slime's --custom-megatron-* hooks and --keep-old-actor (old_actor.OldActorWeights)."""

    checkpoint_format = "torch_dist"
    old_actor = None  # --keep-old-actor: old_actor.OldActorWeights of the actor's chunks
    push_frozen_tower = True  # whether weight pushes carry a --freeze-vision-tower tower (_build_model decides)

    @property
    def min_micro_batches(self) -> int:
        """megatron-core's interleaved schedule runs at least PP micro-batches (interleave_group)."""
        return self.args.pipeline_model_parallel_size if virtual_pipeline_size(self.args) else 1

    # ----------------------------------------------------------------- setup (RLTrainerBase's constructor hooks)
    def _prepare_args(self, args, role):
        if args.hf_checkpoint:
            args = fill_args_from_hf(args, args.hf_checkpoint)
        check_supported(args, role)
        return args

    def _init_parallel(self, rank, world_size, master_addr, master_port):
        from slime_like.backends.megatron import parallel

        args = self.args
        return parallel.init_distributed(
            rank, world_size, master_addr, master_port, tp=args.tensor_model_parallel_size,
            pp=args.pipeline_model_parallel_size, cp=args.context_parallel_size,
            ep=args.expert_model_parallel_size, etp=args.expert_tensor_parallel_size,
            seed=args.seed, timeout_minutes=args.distributed_timeout_minutes,
            vpp=virtual_pipeline_size(args))

    def _distributed_ready(self):
        from slime_like.backends.megatron import model as M

        self.hooks.call("custom_megatron_init_path", self.args)
        self.use_te = M.uses_te_spec(self.args)
        # a vision-language model: an HF vision tower + M-RoPE (vision.py)
        self.vision = family_of({"model_type": self.args.hf_model_type}).vision_language
        if self.vision and self.use_te:
            self.pack_rows = False  # TE's THD rotary indexes 1-D positions; M-RoPE's are per sample: padded rows
        self.routing = RoutingReplay(self.args, [])   # the actor's, once its model is built
        problems = launch_problems(self.args, self.use_te, self.vision) if self.args.shared_prompt_training else []
        if problems:
            raise NotImplementedError("; ".join(problems))

    def _sequence_split(self) -> tuple[int, int, int]:
        """Context parallelism (cp_layout.py); sequence parallelism splits a CP rank's row over TP, and the row's
        padding stays even (a rank holds two chunks of every sample, the padding included)."""
        multiple = 2 * self.args.tensor_model_parallel_size if self.args.sequence_parallel else 1
        return self.ps.get_context_parallel_world_size(), self.ps.get_context_parallel_rank(), multiple

    def _has_checkpoint(self, path) -> bool:
        return W.has_megatron_checkpoint(path)

    def _build_model(self, resume):
        """mcore's chunks of this role (self.chunks), their initial weights unless resuming, then mixed precision
        and DDP (the model the optimizer and the schedule drive)."""
        from slime_like.backends.megatron import model as M

        self.chunks = M.build_model(self.args, self.role)
        if not resume:
            W.load_initial_weights(self.args, self.chunks, self.role)
        # --freeze-vision-tower from --hf-checkpoint: the engines loaded the same tower, so pushes leave it out
        self.push_frozen_tower = resume or os.path.realpath(W.initial_source(self.args) or "") != \
            os.path.realpath(self.args.hf_checkpoint or "")
        if self.role == "actor" and self.args.keep_old_actor:
            self.old_actor = OldActorWeights(self.chunks, self.args.max_staleness)
        self.routing = RoutingReplay(self.args, self.chunks)   # --use-(rollout-)routing-replay (routing_replay.py)
        return O.wrap_for_training(self.args, self.chunks)

    def _build_optimizer(self):
        return O.build_optimizer(self.args, self.model)

    def _build_scheduler(self):
        return O.build_scheduler(self.args, self.optimizer)  # megatron-core's own: Megatron-LM's checkpoints

    def _load_checkpoint(self, load_dir, load_optim, iteration):
        from slime_like.backends.megatron import checkpoint

        if checkpoint.release_dir(load_dir) is not None:
            load_optim = False  # Megatron-LM's release checkpoint holds weights only: a fresh start from them
        loaded = checkpoint.load_checkpoint(
            load_dir, self.chunks, optimizer=self.optimizer if load_optim else None,
            scheduler=self.scheduler if load_optim else None, load_optim=load_optim, iteration=iteration)
        if not load_optim:
            self.optimizer.reload_model_params()  # fp32 main copies follow the loaded weights
        return loaded

    def _build_reference(self):
        """A frozen copy of --ref-load (or --hf-checkpoint): self.ref_chunks; the whole model of role reference."""
        from slime_like.backends.megatron import model as M

        self.ref_chunks, model = W.frozen_model(self.args, M, W.load_ref_weights)
        if self.role == "reference":
            self.chunks = self.ref_chunks
        return model

    def _build_teacher(self):
        """slime's with_opd_teacher: a frozen copy of --opd-teacher-load (self.teacher_chunks)."""
        from slime_like.backends.megatron import model as M

        self.teacher_chunks, model = W.frozen_model(self.args, M, W.load_teacher_weights)
        return model

    def parallel_info(self) -> dict:
        ps = self.ps
        return dict(dp_rank=ps.get_data_parallel_rank(), dp_size=ps.get_data_parallel_world_size(),
                    tp_rank=ps.get_tensor_model_parallel_rank(), pp_rank=ps.get_pipeline_model_parallel_rank(),
                    cp_rank=ps.get_context_parallel_rank())

    # ----------------------------------------------------------------- mcore's schedule (RLTrainerBase's hooks)
    def _run(self, model, mbs, make_loss_func, forward_only):
        """mcore's forward_backward_func over the micro-batches (1F1B under PP); loss dicts of the last stage."""
        from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
        from megatron.core.utils import get_model_config

        actor = model is getattr(self, "model", None) and self.role == "actor"

        def forward_step(data_iterator, chunk):
            mb = next(data_iterator)
            self.routing.before_forward(actor, mb)
            mtp_inputs = MTP.forward_kwargs(mb, self.args.mtp_num_layers) if self._has_mtp(chunk) else {}
            # the LM head over the scored positions only; --shared-prompt-training's per-token RoPE positions
            with projecting(chunk, mb.logit_positions), per_token_rope(chunk, mb):
                out = chunk(mb.tokens, mb.position_ids, mb.attention_mask, packed_seq_params=mb.packed_seq_params,
                            **self._image_inputs(mb), **mtp_inputs)
            if mtp_inputs:  # given labels GPTModel returns the main cross entropy: the loss reads the logits
                out = MTP.policy_logits(unwrap(chunk), out)
            self.routing.after_forward(actor, mb)
            return out, make_loss_func(mb)

        data = iter(mbs)
        if len(model) > 1:  # interleaved schedule: each chunk walks the micro-batches itself
            data = [iter(mbs) for _ in model]
            get_model_config(model[0]).microbatch_group_size_per_vp_stage = interleave_group(len(mbs), self.ps)
        return get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=data, model=model, num_microbatches=len(mbs),
            seq_length=max(mb.tokens.shape[1] for mb in mbs), micro_batch_size=mbs[0].tokens.shape[0],
            forward_only=forward_only)

    @staticmethod
    def _has_mtp(chunk) -> bool:
        """Whether this model chunk holds MTP layers (--enable-mtp-training's actor): its forward needs labels."""
        return bool(getattr(unwrap(chunk), "mtp_process", False))

    def _teacher_output(self, mb):
        """--opd-kl-mode full: the frozen teacher's logits for the micro-batch, called inside the actor's loss
        function on every TP rank (one pipeline stage: the config check refuses PP > 1 with this mode)."""
        (chunk,) = self.teacher_model
        # the student's positions: the loss reads both at mb.cols
        with projecting(chunk, mb.logit_positions), per_token_rope(chunk, mb):
            return chunk(mb.tokens, mb.position_ids, mb.attention_mask, packed_seq_params=mb.packed_seq_params,
                         **self._image_inputs(mb))

    def _image_inputs(self, mb) -> dict:
        """A vision-language model's extra forward input: the micro-batch's images (None for text samples)."""
        return {"multimodal": mb.multimodal} if self.vision else {}

    def _forward_only(self, model, batch, kind):
        """Per-sample response log-probs (kind "logp", temperature-scaled) or values (kind "values")."""
        n = D.num_samples(batch)
        mbs = [self._responses_only(mb, kind) for mb in self.batcher.for_scoring(batch)]
        temperature = float(self.args.rollout_temperature)
        modes = [chunk.training for chunk in model]
        for chunk in model:
            chunk.eval()  # no dropout when scoring; the frozen reference model stays in eval mode
        vocab, gather = self.args.vocab_size, None
        if self.ps.get_context_parallel_world_size() > 1:  # each CP rank scored part of every response
            from slime_like.backends.training.cp_layout import gather_response_rows

            group = self.ps.get_context_parallel_group()
            gather = lambda values, mb: gather_response_rows(values, mb, group)  # noqa: E731
        with torch.no_grad():
            outs = self._run(model, mbs, lambda mb: L.forward_only_func(kind, mb, temperature, vocab, gather),
                             forward_only=True)
        for chunk, mode in zip(model, modes):
            chunk.train(mode)
        result = None
        if self.ps.is_pipeline_last_stage():
            result = [None] * n
            for out in outs:
                for sample, row in zip(out["ids"], D.unpad_rows(out["out"], out["lengths"])):
                    result[sample] = row
        return self.comm.from_last_stage(result)

    def _train_micro_batches(self, mbs, kind, scale, weights, step, where) -> StepResult:
        """One optimizer step through mcore's forward_backward_func, after slime's before-train-step hook."""
        args, (rollout_id, step_id) = self.args, where
        self.hooks.call("custom_megatron_before_train_step_hook_path", args, rollout_id, step_id,
                        self.chunks, self.optimizer, self.scheduler)
        for chunk in self.model:
            chunk.train()
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        teacher = self._opd_teacher(kind)
        projected = [self._responses_only(mb, kind) for mb in mbs]
        weights = {id(p): weights[id(mb)] for mb, p in zip(mbs, projected) if id(mb) in weights}
        outs = self._run(self.model, projected, lambda mb: L.make_loss_func(
            kind, args, mb, scale, step.per_token, weights.get(id(mb)), self.hooks, step, teacher,
            estimator=self.estimator), forward_only=False)
        lr = O.current_lr(self.optimizer)
        finite, ok, grad_norm = self._apply_gradients(rollout_id)
        extra = {}
        if any(self._has_mtp(chunk) for chunk in self.model):  # --enable-mtp-training: slime's mtp_loss metric
            group = self.ps.get_data_parallel_group(with_context_parallel=True)
            extra = MTP.take_step_loss(len(mbs), lambda t: self.comm.all_reduce(t, group),
                                       self.ps.get_data_parallel_world_size(with_context_parallel=True))
        return StepResult(outs, lr, finite=finite, stepped=ok, grad_norm=grad_norm, extra=extra)

    def _reset_optimizer_states(self):
        O.reset_optimizer_states(self.optimizer)

    def compute_log_probs(self, batch: dict, old_policy: bool = True) -> dict:
        """The base's passes; with --use-routing-replay the actor's recorded routing comes back as
        `replay_routing` (per sample), which train_step replays."""
        if self.role == "actor" and old_policy:
            self.routing.begin(batch, scoring=True)
        try:
            out = super().compute_log_probs(batch, old_policy)
        finally:
            recorded = self.routing.end() if self.role == "actor" and old_policy else None
        if recorded is not None:
            out["replay_routing"] = recorded
        return out

    def train_step(self, rollout_id: int, batch: dict) -> dict:
        if self.role == "actor":
            self.routing.begin(batch, scoring=False)
        try:
            return super().train_step(rollout_id, batch)
        finally:
            if self.role == "actor":
                self.routing.end()

    def _before_scoring(self, store_prefix: str) -> None:
        """slime's --custom-megatron-before-log-prob-hook-path gets the chunks of the model about to score."""
        chunks = {"": "chunks", "ref_": "ref_chunks", "teacher_": "teacher_chunks"}[store_prefix]
        self.hooks.call("custom_megatron_before_log_prob_hook_path", self.args, getattr(self, chunks), store_prefix)

    def _old_policy_log_probs(self, batch: dict) -> list:
        """--keep-old-actor: each sample scored with the pushed weights that generated it (old_actor.py)."""
        if self.old_actor is not None:
            return self.old_actor.log_probs(batch, lambda b: self._forward_only(self.model, b, "logp"))
        return super()._old_policy_log_probs(batch)

    def _after_train_step(self) -> None:
        if self.old_actor is not None:
            self.old_actor.keep_trained()

    def remember_pushed_weights(self, version) -> None:
        """--keep-old-actor: called by the Ray layer after every weight push, with the version the engines report."""
        self.old_actor.remember_pushed(version)

    def _update_reference(self):
        TD.copy_weights(self.chunks, self.ref_chunks)

    def _apply_gradients(self, rollout_id: int) -> tuple[bool, bool, float | None]:
        """One optimizer + LR-schedule step unless a gradient is NaN/inf: (finite, stepped, grad_norm)."""
        # a non-finite gradient is never applied: the step is skipped and counted (Megatron's skipped iteration)
        if not TD.grads_finite(self.model, self.ps, self.comm):
            self.optimizer.zero_grad()
            log.warning("%s rollout %d: non-finite gradient, optimizer step skipped", self.role, rollout_id)
            return False, False, None
        if self.args.use_stateless_adam:  # slime's stateless Adam: each step is a fresh Adam's first step
            O.reset_optimizer_states(self.optimizer)
        ok, grad_norm, _ = self.optimizer.step()
        if ok:
            self.scheduler.step(increment=1)
        return True, ok, grad_norm

    def _save_checkpoint(self, save_dir, rollout_id):
        """torch_dist checkpoint of this role (the critic's role view has its own --save)."""
        from slime_like.backends.megatron import checkpoint

        if not TD.weights_finite(self.model, self.comm):
            raise RuntimeError(f"{self.role}: refusing to save rollout {rollout_id}: the weights hold NaN/inf values "
                               f"(the last good checkpoint in {save_dir} stays the latest)")
        with_optim = not self.args.no_save_optim
        checkpoint.save_checkpoint(save_dir, rollout_id, self.chunks,
                                   optimizer=self.optimizer if with_optim else None,
                                   scheduler=self.scheduler if with_optim else None,
                                   extra_state={"role": self.role})

    def iter_hf_weights(self):
        """(hf_name, full tensor) pairs for weight sync; every rank must iterate (TP gathers are collectives)."""
        from slime_like.backends.megatron import hf_weights

        yield from hf_weights.iter_hf_weights(self.chunks, self.args, frozen_vision=self.push_frozen_tower)

    def _frozen_models(self) -> list:
        return (self.ref_model or []) + (self.teacher_model or [])

    def _release_accelerator_memory(self):
        TD.release_memory(self.model, self.optimizer, self._frozen_models())

    def _restore_accelerator_memory(self):
        TD.restore_memory(self.model, self.optimizer, self._frozen_models(), self.device)

"""RLTrainerBase: the backend-neutral half of a trainer rank (the one copy of the RL logic every backend shares).

    batch.update(t.compute_log_probs(batch))      # actor: log_probs (+ ref_log_probs, teacher_log_probs)
    batch.update(critic.compute_values(batch))    # critic: values
    batch.update(t.compute_advantages(batch))     # advantages, returns (slime_like.algorithms estimators)
    metrics = t.train_step(rollout_id, batch)     # num_steps_per_rollout optimizer steps

Here: which forward passes a rollout needs, the estimator's token step (or --custom-advantage-function-path),
the OPD term, whitening, the loss kind and its fields, the step split, token counts, loss aggregation weights,
--rollout-data-postprocess-path, the step metrics and the reference refresh. Both backends subclass it (FSDP,
Megatron) and provide the model-specific part:
  self.args, self.role, self.estimator, self.device (None on CPU), self.use_te, self.model, self.ref_model,
  self.hooks (hooks.TrainerHooks of args), self.teacher_model (None unless the backend builds an OPD teacher),
  self.ps  -- a parallel-state view: get_data_parallel_group / _world_size, is_pipeline_last_stage,
              get_pipeline_model_parallel_world_size / _group / _last_rank (megatron's parallel_state, or
              a pure data-parallel view for FSDP),
  _forward_only(model, batch, kind) -> per-sample 1-D tensors (kind "logp" or "values"),
  _teacher_output(mb) -> the OPD teacher's logits for one micro-batch (--opd-kl-mode full),
  _train_micro_batches(mbs, kind, scale, weights, step, where) -> StepResult: one optimizer step
  (`weights`: id(mb) -> per-token loss weights replacing `scale`, for --loss-agg-mode / micro-batch means;
  `step`: custom_loss.Step, the loss units; `where`: (rollout_id, step_id)),
  _update_reference() for --ref-update-interval, _reset_optimizer_states() for --reset-optimizer-states.
Hook points a backend may override (the base's versions do the plain thing): _old_policy_log_probs (the
Megatron trainer's --keep-old-actor scores with the pushed weights), _before_scoring (slime's
--custom-megatron-before-log-prob-hook-path), _after_train_step (--keep-old-actor keeps the trained weights).
Every collective-bearing call must be made on every rank of the trainer group. All per-sample outputs
are 1-D float32 CPU tensors over the response tokens, in batch order.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from slime_like import algorithms as alg
from slime_like.backends.training import ci_checks
from slime_like.backends.training.collectives import CollectivesMixin
from slime_like.backends.training import data as D
from slime_like.backends.training import loss as L
from slime_like.backends.training.custom_loss import Step
from slime_like.backends.training.hooks import custom_advantages
from slime_like.backends.training.opd import apply_opd

POLICY_FIELDS = ("log_probs", "advantages", "ref_log_probs", "rollout_log_probs", "teacher_log_probs")
VALUE_FIELDS = ("values", "returns")


class StepResult(NamedTuple):
    """What one optimizer step of a backend reports (grad_norm None: the backend did not compute one)."""
    outs: list        # the micro-batches' loss dicts (metric sums), last pipeline stage
    lr: float         # the learning rate the step used
    finite: bool      # every gradient was finite
    stepped: bool     # the optimizer applied the step (never with a non-finite gradient)
    grad_norm: float | None


class RLTrainerBase(CollectivesMixin):
    use_te = False
    teacher_model = None  # --opd-type megatron: a frozen teacher, where the backend builds one
    # --use-dynamic-batch-size: pack a token budget's samples into one row (needs attention that does not cross
    # samples: mcore's block mask / THD). False: the same token-budget groups, each as right-padded rows.
    pack_rows = True

    # ----------------------------------------------------------------- micro-batches
    def _micro_batches(self, batch, indices, field_keys=(), max_tokens=None):
        args = self.args
        packed = bool(args.use_dynamic_batch_size)
        if packed:
            lengths = [len(t) for t in batch["tokens"]]
            groups = D.packed_micro_batches(indices, lengths, max_tokens or args.max_tokens_per_gpu)
        else:
            # Similar lengths share a micro-batch, so rows carry less padding (demo shape: ~16% fewer tokens).
            # The step's loss is a token sum over all its micro-batches: grouping changes only float rounding.
            by_length = sorted(indices, key=lambda i: len(batch["tokens"][i]))
            groups = D.fixed_micro_batches(by_length, args.micro_batch_size)
        # One tensor conversion per column for every micro-batch of every pass over this call's batch (the
        # actor's, reference's and teacher's scoring; each optimizer step of train_step).
        packed_batch = getattr(self, "_packed_batch", None)  # reset by each public call (validate_batch)
        if packed_batch is None or not packed_batch.packs(batch):
            packed_batch = self._packed_batch = D.PackedBatch(batch)
        return [D.build_micro_batch(packed_batch, g, packed=packed and self.pack_rows, use_te=self.use_te,
                                    field_keys=field_keys, device=self.device) for g in groups]

    def _scoring_micro_batches(self, batch):
        max_tokens = self.args.log_probs_max_tokens_per_gpu or self.args.max_tokens_per_gpu
        return self._micro_batches(batch, list(range(D.num_samples(batch))), max_tokens=max_tokens)

    # ----------------------------------------------------------------- public API
    def old_log_probs_needed(self) -> bool:
        """Whether train_step needs the old policy's log-probs from a separate forward pass.

        Not when the weights that scored the batch are exactly the ones the first (only) optimizer step
        starts from and nothing else reads them: one step per rollout, no reward-side KL (--kl-coef reads
        them in compute_advantages), no dropout (train-mode forwards would differ from the scoring one).
        The loss then takes the current log-probs, detached, as the old ones: the same values without a
        second forward pass. With --use-rollout-logprobs the engine's log-probs are the old policy anyway.
        """
        args = self.args
        if self.role != "actor":
            return False
        sampled_opd = args.use_opd and args.opd_kl_mode == "sampled"
        if self._reward_kl_coef() or ((sampled_opd or args.keep_old_actor) and not args.use_rollout_logprobs):
            return True  # compute_advantages reads them (reward KL, OPD's student side); the pushed weights' copy
        if args.use_rollout_logprobs or args.loss_type == "sft_loss":
            return False
        return int(args.num_steps_per_rollout) > 1 or self._has_dropout()

    def _reward_kl_coef(self) -> float:
        """--kl-coef where the estimator folds KL into the reward; 0 where it ignores it (grpo, gspo).
        Needs `self.estimator` (algorithms.get_estimator(--advantage-estimator)), set by the backend."""
        return float(self.args.kl_coef) if self.estimator.uses_reward_kl else 0.0

    def _has_dropout(self) -> bool:
        return bool(self.args.attention_dropout or self.args.hidden_dropout)

    def compute_log_probs(self, batch: dict, old_policy: bool = True) -> dict:
        """Actor: old-policy `log_probs`, `ref_log_probs` with a reference model, `teacher_log_probs` with an OPD
        teacher model; all logits / temperature.

        `old_policy=False` skips the actor's own forward pass (see old_log_probs_needed). A reference worker
        (role "reference", --placement reference:...) returns `ref_log_probs` of its frozen model."""
        if self.role == "reference":
            D.validate_batch(batch)
            self._packed_batch = None  # this call's batch is packed afresh (a hook may have edited it)
            return {"ref_log_probs": self._forward_only(self.model, batch, "logp")}
        if self.role != "actor":
            raise RuntimeError("compute_log_probs is an actor call; the critic has compute_values")
        D.validate_batch(batch)
        self._packed_batch = None  # this call's batch is packed afresh (a hook may have edited it)
        out = {}
        if old_policy:
            self._before_scoring("")
            out["log_probs"] = self._old_policy_log_probs(batch)
        if self.ref_model is not None:
            self._before_scoring("ref_")
            out["ref_log_probs"] = self._forward_only(self.ref_model, batch, "logp")
        if self.teacher_model is not None and self.args.opd_kl_mode == "sampled":  # full: scored in the loss
            self._before_scoring("teacher_")
            out["teacher_log_probs"] = self._forward_only(self.teacher_model, batch, "logp")
        return out

    def _old_policy_log_probs(self, batch: dict) -> list:
        """The actor's old-policy log-probs: its current weights (hook: --keep-old-actor's pushed weights)."""
        return self._forward_only(self.model, batch, "logp")

    def _opd_teacher(self, kind: str):
        """--opd-kl-mode full, policy loss: mb -> the frozen teacher's response logits / temperature, computed
        without gradients on the micro-batch being trained (make_loss_func's `teacher`); None otherwise.
        Needs the backend's _teacher_output(mb): the teacher's whole output for the micro-batch's tokens."""
        if kind != "policy" or self.teacher_model is None or self.args.opd_kl_mode != "full":
            return None
        temperature = float(self.args.rollout_temperature)

        def teacher_logits(mb):
            with torch.no_grad():
                return L.response_logits(self._teacher_output(mb), mb, temperature)

        return teacher_logits

    def _before_scoring(self, store_prefix: str) -> None:
        """Hook: before a scoring pass ("" actor, "ref_" reference, "teacher_" OPD teacher). Nothing here."""

    def _after_train_step(self) -> None:
        """Hook: after a rollout's optimizer steps (the weights the next push sends). Nothing here."""

    def compute_values(self, batch: dict) -> dict:
        """Critic: per-token `values` from the value head, at the positions scoring each response token."""
        if self.role != "critic":
            raise RuntimeError("compute_values is a critic call; build the trainer with role='critic'")
        D.validate_batch(batch)
        self._packed_batch = None  # this call's batch is packed afresh (a hook may have edited it)
        return {"values": self._forward_only(self.model, batch, "values")}

    def compute_advantages(self, batch: dict) -> dict:
        """`advantages`, `returns` per sample: the estimator's token step (`EstimatorSpec.token_step`).

        Reward-side KL (--kl-coef) uses kl_penalty(log_probs, ref_log_probs, --kl-loss-type). Whitening
        (--normalize-advantages, and REINFORCE++'s built-in whitening of its returns) uses the moments of
        every valid token on every DP rank (all-reduced), so it equals whitening the whole rollout at once.
        """
        args, spec = self.args, self.estimator
        kl_coef = self._reward_kl_coef()
        need = ("rewards",) + (("log_probs", "ref_log_probs") if kl_coef else ()) \
            + (("values",) if spec.needs_critic else ())
        D.validate_batch(batch, need)
        self._packed_batch = None  # this call's batch is packed afresh (a hook may have edited it)
        lengths = [int(r) for r in batch["response_lengths"]]
        width = max(lengths)
        mask = D.pad_rows(batch["loss_masks"], width)
        pad = lambda key: D.pad_rows(batch[key], width) if key in batch else None  # noqa: E731
        custom = self.hooks.get("custom_advantage_function_path")
        if custom:  # slime: the user's function replaces the estimator (whitening below still applies)
            adv_rows, ret_rows = custom_advantages(custom, args, batch)
            adv, ret = D.pad_rows(adv_rows, width), D.pad_rows(ret_rows, width)
        else:
            kl = alg.kl_penalty(pad("log_probs"), pad("ref_log_probs"), args.kl_loss_type) \
                if kl_coef else None
            adv, ret = spec.token_step(
                rewards=torch.tensor([float(r) for r in batch["rewards"]]), mask=mask,
                values=pad("values") if spec.needs_critic else None, kl=kl, kl_coef=kl_coef,
                gamma=float(args.gamma), lam=float(args.lambd), whiten=False)
        if args.use_opd and args.opd_kl_mode == "sampled":  # after the estimator, before whitening (slime's order)
            adv = apply_opd(args, batch, adv, mask)
        if args.normalize_advantages or spec.whitens_returns:
            moments = alg.masked_moments(adv, mask)
            moments = self._all_reduce(moments, self.ps.get_data_parallel_group())
            adv = torch.where(mask > 0, alg.whiten_from_moments(adv, moments), torch.zeros(()))
        return {"advantages": D.unpad_rows(adv, lengths), "returns": D.unpad_rows(ret, lengths)}

    def _loss_kind(self, batch):
        """(loss kind, per-sample fields the loss reads, fields that must be present, batch to train on)."""
        args = self.args
        if self.role == "critic":
            return "value", VALUE_FIELDS, VALUE_FIELDS, batch
        if args.loss_type == "sft_loss":
            return "sft", (), (), batch
        # the policy loss, or slime's --loss-type custom_loss on the same fields
        kind = "custom" if args.loss_type == "custom_loss" else "policy"
        rollout_lp = args.use_tis or args.use_rollout_logprobs or args.get_mismatch_metrics
        need = (("advantages",) if args.compute_advantages_and_returns else ()) \
            + (("ref_log_probs",) if args.use_kl_loss else ()) + (("rollout_log_probs",) if rollout_lp else ())
        if args.use_rollout_logprobs:  # the engine's log-probs are the old policy
            batch = dict(batch, log_probs=batch["rollout_log_probs"])
        return kind, POLICY_FIELDS, need, batch

    def train_step(self, rollout_id: int, batch: dict) -> dict:
        """`--num-steps-per-rollout` optimizer steps over this rank's batch; metrics averaged over DP ranks.

        Each step takes `global_batch_size / dp` consecutive samples as micro-batches, then one optimizer
        step and one LR-schedule step (the backend's _train_micro_batches). The returned dict averages the
        steps' metrics (token-weighted losses), except `lr` (the last step's LR) and `tokens` / `num_steps`
        (totals). Every rank returns the same dict.
        """
        args = self.args
        kind, fields, need, batch = self._loss_kind(batch)
        if self.role == "actor":  # slime's --rollout-data-postprocess-path sees the actor's data
            self.hooks.call("rollout_data_postprocess_path", args, rollout_id, batch)
        D.validate_batch(batch, need)
        self._packed_batch = None  # this call's batch is packed afresh (a hook may have edited it)
        dp = self.ps.get_data_parallel_world_size()
        steps = D.split_steps(D.num_samples(batch), int(args.num_steps_per_rollout), args.global_batch_size, dp,
                              exact=not args.custom_generate_function_path)  # it may fan a prompt out
        if args.reset_optimizer_states:  # slime resets at the start of each rollout's training
            self._reset_optimizer_states()
        history = []
        for indices in steps:
            step = self._one_step(batch, indices, kind, fields, (rollout_id, len(history)))
            ci_checks.check_step(args, self.role, rollout_id, len(history), len(steps), step,
                                 writer=not dist.is_initialized() or dist.get_rank() == 0)
            history.append(step)
        interval = args.ref_update_interval
        if self.ref_model is not None and interval and (rollout_id + 1) % interval == 0:
            self._update_reference()
        self._after_train_step()
        return self._average_steps(history)

    def _one_step(self, batch, indices, kind, fields, where) -> dict:
        """One optimizer step over the samples `indices`: its metrics, DP-reduced (same dict on every rank)."""
        args = self.args
        dp = self.ps.get_data_parallel_world_size()
        mbs = self._micro_batches(batch, indices, field_keys=fields)
        local_tokens = torch.tensor(float(sum(mb.loss_mask.sum().item() for mb in mbs)), dtype=torch.float64)
        global_tokens = max(self._all_reduce(local_tokens, self.ps.get_data_parallel_group()).item(), 1.0)
        scale = len(mbs) * dp / global_tokens
        weights = L.aggregation_weights(args, mbs, dp, global_tokens,
                                        lambda t: self._all_reduce(t, self.ps.get_data_parallel_group()))
        units = Step(factor=len(mbs) * dp, samples=len(indices) * dp, global_tokens=global_tokens,
                     per_token=bool(args.calculate_per_token_loss))  # slime's loss units (custom loss / reducer)
        result = self._train_micro_batches(mbs, kind, scale, weights, units, where)
        step = self._reduce_step_metrics(result.outs, global_tokens)
        # a NaN/inf gradient is never applied (the backend skips the step); counted like Megatron's skips
        step.update(lr=result.lr, grad_norm=float(result.grad_norm) if result.grad_norm is not None else float("nan"),
                    skipped=0.0 if result.stepped else 1.0, nonfinite_steps=0.0 if result.finite else 1.0)
        return step

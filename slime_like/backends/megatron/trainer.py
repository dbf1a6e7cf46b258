"""MegatronTrainer: one trainer rank of the actor or the critic (what the Ray layer calls).

    t = MegatronTrainer(role_args, role="actor", rank=r, world_size=w, master_addr=..., master_port=...)
    batch.update(t.compute_log_probs(batch))      # actor: log_probs (+ ref_log_probs with a reference model)
    batch.update(critic.compute_values(batch))    # critic: values
    batch.update(t.compute_advantages(batch))     # advantages, returns (slime_like.algorithms estimators)
    metrics = t.train_step(rollout_id, batch)     # num_steps_per_rollout optimizer steps
    t.save(rollout_id); t.offload(); t.onload(); t.iter_hf_weights()

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

import copy
import logging

import torch

from slime_like import algorithms as alg
from slime_like.backends.megatron import hooks as H
from slime_like.backends.megatron.checks import check_supported
from slime_like.backends.megatron import optimizer as O
from slime_like.backends.megatron.old_actor import OldActorMixin
from slime_like.backends.megatron.weight_sources import WeightSourcesMixin
from slime_like.backends.megatron.trainer_dist import TrainerDistMixin
from slime_like.backends.training import ci_checks
from slime_like.backends.training.base import POLICY_FIELDS, VALUE_FIELDS
from slime_like.backends.training import data as D
from slime_like.backends.training import loss as L
from slime_like.backends.training.custom_loss import Step
from slime_like.backends.training.opd import apply_opd
from slime_like.config.hf_config import fill_args_from_hf
from slime_like.backends.trainer_api import TRAINER_ROLES

log = logging.getLogger(__name__)



class MegatronTrainer(TrainerDistMixin, OldActorMixin, WeightSourcesMixin):
    """Implements `slime_like.backends.trainer_api.TrainerBackend` (`--train-backend megatron`)."""

    checkpoint_format = "torch_dist"

    def __init__(self, args, role: str = "actor", rank: int = 0, world_size: int = 1,
                 master_addr: str = "127.0.0.1", master_port: int = 29500):
        if role not in TRAINER_ROLES:
            raise ValueError(f"MegatronTrainer role must be one of {TRAINER_ROLES}, got {role!r}")
        from slime_like.backends.megatron import model as M
        from slime_like.backends.megatron import parallel

        args = copy.copy(args)  # our view; the caller's namespace is never mutated
        if args.hf_checkpoint:
            args = fill_args_from_hf(args, args.hf_checkpoint)
        check_supported(args, role)
        self.args, self.role = args, role
        self.estimator = alg.get_estimator(args.advantage_estimator)
        self.ps = parallel.init_distributed(
            rank, world_size, master_addr, master_port, tp=args.tensor_model_parallel_size,
            pp=args.pipeline_model_parallel_size, cp=args.context_parallel_size,
            ep=args.expert_model_parallel_size, etp=args.expert_tensor_parallel_size,
            seed=args.seed, timeout_minutes=args.distributed_timeout_minutes)
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        self.hooks = H.TrainerHooks(args)  # slime's --custom-megatron-*/advantage/TIS/... paths, checked now
        self.hooks.call("custom_megatron_init_path", args)
        self.use_te = M._use_te()

        if role == "reference":  # a frozen copy on GPUs of its own (--placement reference:...): forward only
            self._init_reference_worker(args, M)
            return
        # Model, then the weights it starts from, then DDP / optimizer / schedule, then a resume.
        self.chunks = M.build_model(args, role)
        resume = self._has_megatron_checkpoint(args.load)
        if not resume:
            self._load_initial_weights(self.chunks, role)
        self.model = O.wrap_for_training(args, self.chunks)
        self.optimizer = O.build_optimizer(args, self.model)
        self.scheduler = O.build_scheduler(args, self.optimizer)
        self.loaded_rollout_id = None
        if resume:
            from slime_like.backends.megatron import checkpoint

            load_optim = not args.no_load_optim and not args.finetune
            self.loaded_rollout_id = checkpoint.load_checkpoint(
                args.load, self.chunks, optimizer=self.optimizer if load_optim else None,
                scheduler=self.scheduler if load_optim else None, load_optim=load_optim,
                iteration=getattr(args, "resume_iteration", None))  # the run's iteration, same for every role
            if not load_optim:
                self.optimizer.reload_model_params()  # fp32 main copies follow the loaded weights
            if args.finetune:
                self.loaded_rollout_id = None

        self.ref_model = self.teacher_model = None
        reference_apart = args.reference_worker  # then the reference worker sends ref_log_probs
        if role == "actor" and not reference_apart and (args.use_kl_loss or self._reward_kl_coef()):
            self.ref_chunks, self.ref_model = self._frozen_model(M, self._load_ref_weights)
        if role == "actor" and args.use_opd and args.opd_type == "megatron":  # slime's with_opd_teacher
            self.teacher_chunks, self.teacher_model = self._frozen_model(M, self._load_teacher_weights)
        self._offloaded = False

    def _init_reference_worker(self, args, M):
        """The reference model alone: --ref-load (or --hf-checkpoint) weights, frozen, no optimizer."""
        self.chunks, self.model = self._frozen_model(M, self._load_ref_weights)
        self.optimizer = self.scheduler = self.ref_model = self.teacher_model = None
        self.loaded_rollout_id = None
        self._offloaded = False

    # ----------------------------------------------------------------- setup helpers
    def _reward_kl_coef(self) -> float:
        """--kl-coef where the estimator folds KL into the reward; 0 where it ignores it (grpo, gspo)."""
        return float(self.args.kl_coef) if self.estimator.uses_reward_kl else 0.0

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
        return [D.build_micro_batch(batch, g, packed=packed, use_te=self.use_te, field_keys=field_keys,
                                    device=self.device) for g in groups]

    def _run(self, model, mbs, make_loss_func, forward_only):
        """mcore's forward_backward_func over the micro-batches (1F1B under PP); loss dicts of the last stage."""
        from megatron.core.pipeline_parallel.schedules import get_forward_backward_func

        def forward_step(data_iterator, chunk):
            mb = next(data_iterator)
            out = chunk(mb.tokens, mb.position_ids, mb.attention_mask, packed_seq_params=mb.packed_seq_params)
            return out, make_loss_func(mb)

        return get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(mbs), model=model, num_microbatches=len(mbs),
            seq_length=max(mb.tokens.shape[1] for mb in mbs), micro_batch_size=mbs[0].tokens.shape[0],
            forward_only=forward_only)

    def _forward_only(self, model, batch, kind):
        """Per-sample response log-probs (kind "logp", temperature-scaled) or values (kind "values")."""
        n = D.num_samples(batch)
        max_tokens = self.args.log_probs_max_tokens_per_gpu or self.args.max_tokens_per_gpu
        mbs = self._micro_batches(batch, list(range(n)), max_tokens=max_tokens)
        temperature = float(self.args.rollout_temperature)
        modes = [chunk.training for chunk in model]
        for chunk in model:
            chunk.eval()  # no dropout when scoring; the frozen reference model stays in eval mode
        vocab = self.args.vocab_size
        with torch.no_grad():
            outs = self._run(model, mbs, lambda mb: L.forward_only_func(kind, mb, temperature, vocab),
                             forward_only=True)
        for chunk, mode in zip(model, modes):
            chunk.train(mode)
        result = None
        if self.ps.is_pipeline_last_stage():
            result = [None] * n
            for out in outs:
                for sample, row in zip(out["ids"], D.unpad_rows(out["out"], out["lengths"])):
                    result[sample] = row
        return self._from_last_stage(result)

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
        if self._reward_kl_coef() or ((args.use_opd or args.keep_old_actor) and not args.use_rollout_logprobs):
            return True  # compute_advantages reads them (reward KL, OPD's student side); the pushed weights' copy
        if args.use_rollout_logprobs or args.loss_type == "sft_loss":
            return False
        dropout = args.attention_dropout or args.hidden_dropout
        return int(args.num_steps_per_rollout) > 1 or bool(dropout)

    def compute_log_probs(self, batch: dict, old_policy: bool = True) -> dict:
        """Actor: old-policy `log_probs` (and `ref_log_probs` with a reference model), logits / temperature.

        `old_policy=False` skips the actor's own forward pass (see old_log_probs_needed)."""
        if self.role == "reference":
            D.validate_batch(batch)
            return {"ref_log_probs": self._forward_only(self.model, batch, "logp")}
        if self.role != "actor":
            raise RuntimeError("compute_log_probs is an actor call; the critic has compute_values")
        D.validate_batch(batch)
        out, hook = {}, "custom_megatron_before_log_prob_hook_path"
        if old_policy:
            self.hooks.call(hook, self.args, self.chunks, "")
            out["log_probs"] = self.old_actor_log_probs(batch) if self.args.keep_old_actor else \
                self._forward_only(self.model, batch, "logp")
        if self.ref_model is not None:
            self.hooks.call(hook, self.args, self.ref_chunks, "ref_")
            out["ref_log_probs"] = self._forward_only(self.ref_model, batch, "logp")
        if self.teacher_model is not None:
            self.hooks.call(hook, self.args, self.teacher_chunks, "teacher_")
            out["teacher_log_probs"] = self._forward_only(self.teacher_model, batch, "logp")
        return out

    def compute_values(self, batch: dict) -> dict:
        """Critic: per-token `values` from the value head, at the positions scoring each response token."""
        if self.role != "critic":
            raise RuntimeError("compute_values is a critic call; build the trainer with role='critic'")
        D.validate_batch(batch)
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
        lengths = [int(r) for r in batch["response_lengths"]]
        width = max(lengths)
        mask = D.pad_rows(batch["loss_masks"], width)
        pad = lambda key: D.pad_rows(batch[key], width) if key in batch else None  # noqa: E731
        custom = self.hooks.get("custom_advantage_function_path")
        if custom:  # slime: the user's function replaces the estimator (whitening below still applies)
            adv_rows, ret_rows = H.custom_advantages(custom, args, batch)
            adv, ret = D.pad_rows(adv_rows, width), D.pad_rows(ret_rows, width)
        else:
            kl = alg.kl_penalty(pad("log_probs"), pad("ref_log_probs"), args.kl_loss_type) \
                if kl_coef else None
            adv, ret = spec.token_step(
                rewards=torch.tensor([float(r) for r in batch["rewards"]]), mask=mask,
                values=pad("values") if spec.needs_critic else None, kl=kl, kl_coef=kl_coef,
                gamma=float(args.gamma), lam=float(args.lambd), whiten=False)
        if args.use_opd:  # after the estimator, before whitening (slime's order)
            adv = apply_opd(args, batch, adv, mask)
        if args.normalize_advantages or spec.whitens_returns:
            moments = alg.masked_moments(adv, mask)
            moments = self._all_reduce(moments, self.ps.get_data_parallel_group())
            adv = torch.where(mask > 0, alg.whiten_from_moments(adv, moments), torch.zeros(()))
        return {"advantages": D.unpad_rows(adv, lengths), "returns": D.unpad_rows(ret, lengths)}

    def train_step(self, rollout_id: int, batch: dict) -> dict:
        """`--num-steps-per-rollout` optimizer steps over this rank's batch; metrics averaged over DP ranks.

        Each step takes `global_batch_size / dp` consecutive samples, runs them as micro-batches through
        mcore's forward_backward_func, then one optimizer step and one LR-schedule step. The returned dict
        averages the steps' metrics (token-weighted losses), except `lr` (the last step's LR) and `tokens`
        / `num_steps` (totals). Every rank returns the same dict.
        """
        args = self.args
        kind, fields, need = self._loss_kind_and_fields()
        if kind in ("policy", "custom") and args.use_rollout_logprobs:  # the engine's log-probs are the old policy
            batch = dict(batch, log_probs=batch["rollout_log_probs"])
        if self.role == "actor":  # slime's --rollout-data-postprocess-path sees the actor's data
            self.hooks.call("rollout_data_postprocess_path", args, rollout_id, batch)
        D.validate_batch(batch, need)
        dp = self.ps.get_data_parallel_world_size()
        steps = D.split_steps(D.num_samples(batch), int(args.num_steps_per_rollout), args.global_batch_size, dp,
                              exact=not args.custom_generate_function_path)  # it may fan a prompt out
        per_token = bool(args.calculate_per_token_loss)
        if args.reset_optimizer_states:  # slime resets at the start of each rollout's training
            O.reset_optimizer_states(self.optimizer)
        history = []
        for indices in steps:
            mbs = self._micro_batches(batch, indices, field_keys=fields)
            local_tokens = torch.tensor(float(sum(mb.loss_mask.sum().item() for mb in mbs)), dtype=torch.float64)
            global_tokens = max(self._all_reduce(local_tokens, self.ps.get_data_parallel_group()).item(), 1.0)
            scale = len(mbs) * dp / global_tokens
            weights = L.aggregation_weights(args, mbs, dp, global_tokens,
                                            lambda t: self._all_reduce(t, self.ps.get_data_parallel_group()))
            self.hooks.call("custom_megatron_before_train_step_hook_path", args, rollout_id, len(history),
                            self.chunks, self.optimizer, self.scheduler)
            for chunk in self.model:
                chunk.train()
                chunk.zero_grad_buffer()
            self.optimizer.zero_grad()
            step_info = Step(factor=len(mbs) * dp, samples=len(indices) * dp, global_tokens=global_tokens,
                             per_token=per_token)  # slime's loss units (custom loss / pg-loss reducer)
            outs = self._run(self.model, mbs, lambda mb: L.make_loss_func(kind, args, mb, scale, per_token,
                                                                          weights.get(id(mb)), self.hooks, step_info),
                             forward_only=False)
            lr = O.current_lr(self.optimizer)
            finite, ok, grad_norm = self._apply_gradients(rollout_id)
            step = self._reduce_step_metrics(outs, global_tokens)
            step.update(lr=lr, grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),
                        skipped=0.0 if ok else 1.0, nonfinite_steps=0.0 if finite else 1.0)
            ci_checks.check_step(args, self.role, rollout_id, len(history), len(steps), step,
                                 writer=torch.distributed.get_rank() == 0)
            history.append(step)
        interval = args.ref_update_interval
        if self.ref_model is not None and interval and (rollout_id + 1) % interval == 0:
            self._update_reference()
        if args.keep_old_actor and self.role == "actor":
            self.keep_trained_weights()
        return self._average_steps(history)

    def _loss_kind_and_fields(self) -> tuple[str, tuple, tuple]:
        """(loss kind, micro-batch fields, batch keys that must be present) for this role and --loss-type."""
        args = self.args
        if self.role == "critic":
            return "value", VALUE_FIELDS, VALUE_FIELDS
        if args.loss_type == "sft_loss":
            return "sft", (), ()
        # the policy loss, or slime's --loss-type custom_loss on the same fields
        kind = "custom" if args.loss_type == "custom_loss" else "policy"
        rollout_lp = args.use_tis or args.use_rollout_logprobs or args.get_mismatch_metrics
        need = (("advantages",) if args.compute_advantages_and_returns else ()) \
            + (("ref_log_probs",) if args.use_kl_loss else ()) + (("rollout_log_probs",) if rollout_lp else ())
        return kind, POLICY_FIELDS, need

    def _apply_gradients(self, rollout_id: int) -> tuple[bool, bool, float | None]:
        """One optimizer + LR-schedule step unless a gradient is NaN/inf: (finite, stepped, grad_norm)."""
        if not self._grads_finite():  # never applied: the step is skipped and counted (Megatron's skipped iter)
            self.optimizer.zero_grad()
            log.warning("%s rollout %d: non-finite gradient, optimizer step skipped", self.role, rollout_id)
            return False, False, None
        if self.args.use_stateless_adam:  # slime's stateless Adam: each step is a fresh Adam's first step
            O.reset_optimizer_states(self.optimizer)
        ok, grad_norm, _ = self.optimizer.step()
        if ok:
            self.scheduler.step(increment=1)
        return True, ok, grad_norm

    def save(self, rollout_id: int) -> str:
        """torch_dist checkpoint of this role into its --save directory (the critic's role view has its own)."""
        from slime_like.backends.megatron import checkpoint

        save_dir = self.args.save
        if not save_dir:
            raise ValueError(f"{self.role}: save() needs --save (critic: its role's save dir, e.g. --critic-save "
                             "or a YAML override)")
        if not self._weights_finite():
            raise RuntimeError(f"{self.role}: refusing to save rollout {rollout_id}: the weights hold NaN/inf values "
                               f"(the last good checkpoint in {save_dir} stays the latest)")
        with_optim = not self.args.no_save_optim
        checkpoint.save_checkpoint(save_dir, rollout_id, self.chunks,
                                   optimizer=self.optimizer if with_optim else None,
                                   scheduler=self.scheduler if with_optim else None,
                                   extra_state={"role": self.role})
        return save_dir

    def iter_hf_weights(self):
        """(hf_name, full tensor) pairs for weight sync; every rank must iterate (TP gathers are collectives)."""
        from slime_like.backends.megatron import hf_weights

        yield from hf_weights.iter_hf_weights(self.chunks, self.args)

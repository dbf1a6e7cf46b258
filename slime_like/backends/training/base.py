"""RLTrainerBase: the trainer contract every backend implements, and the one copy of the RL logic they share.

    t = Backend(args, role="actor", rank=r, world_size=w, master_addr=..., master_port=..., resume_iteration=N)
    batch.update(t.compute_log_probs(batch))      # actor: log_probs (+ ref_log_probs, teacher_log_probs)
    batch.update(critic.compute_values(batch))    # critic: values
    batch.update(t.compute_advantages(batch))     # advantages, returns (slime_like.algorithms estimators)
    metrics = t.train_step(rollout_id, batch)     # num_steps_per_rollout optimizer steps
    t.save(rollout_id); t.offload(); t.onload(); t.iter_hf_weights()

The constructor is a template: the steps every backend takes, in order (our view of args, the estimator, process
groups and seeds, the device, the slime hooks, the micro-batcher, then for a trainable role model, optimizer,
LR schedule, the resume, the KL reference and the OPD teacher; for role "reference" the frozen model alone).
A backend supplies the abstract hooks below (a missing one is a TypeError naming it when the class is
instantiated) and may override the optional ones. Shared helpers are composed objects: `self.comm`
(collectives.Collectives), `self.hooks` (hooks.TrainerHooks), `self.batcher` (data.MicroBatcher).

Here as well: which forward passes a rollout needs, the step split, token counts, loss aggregation weights,
--rollout-data-postprocess-path, the step metrics and the reference refresh; the advantage pass (the estimator's
token step or --custom-advantage-function-path, the OPD term, whitening) is advantages.py's, the loss kind and its
fields loss.py's.
Every collective-bearing call must be made on every rank of the trainer group. All per-sample outputs are 1-D
float32 CPU tensors over the response tokens, in batch order.
"""
from __future__ import annotations

import abc
import copy
from typing import NamedTuple

import torch
import torch.distributed as dist

from slime_like import algorithms as alg
from slime_like.backends.trainer_api import TRAINER_ROLES
from slime_like.backends.training import ci_checks
from slime_like.backends.training.advantages import advantages_and_returns, needed_fields
from slime_like.backends.training.collectives import Collectives
from slime_like.backends.training import data as D
from slime_like.backends.training import loss as L
from slime_like.backends.training.custom_loss import Step
from slime_like.backends.training.hooks import TrainerHooks
from slime_like.backends.training.micro_batch import response_positions_only
from slime_like.backends.training.lr_schedule import LRSchedule, schedule_kwargs


class StepResult(NamedTuple):
    """What one optimizer step of a backend reports (grad_norm None: the backend did not compute one)."""
    outs: list        # the micro-batches' loss dicts (metric sums), last pipeline stage
    lr: float         # the learning rate the step used
    finite: bool      # every gradient was finite
    stepped: bool     # the optimizer applied the step (never with a non-finite gradient)
    grad_norm: float | None
    extra: dict = {}  # backend-only metrics of the step, identical on every rank (e.g. the Megatron MTP loss)


class RLTrainerBase(abc.ABC):
    checkpoint_format = ""  # what save() writes: "torch_dist", "dcp", ...
    roles = TRAINER_ROLES   # the roles the backend runs
    reference_worker_refusal: str | None = None  # why role "reference" is refused, where it is
    use_te = False
    # --use-dynamic-batch-size: pack a token budget's samples into one row (needs attention that does not cross
    # samples: mcore's block mask / THD). False: the same token-budget groups, each as right-padded rows.
    pack_rows = True
    min_micro_batches = 1  # per pass; the Megatron trainer's interleaved pipeline schedule needs >= PP
    # Project only the response-scoring positions through the LM head (issue 26: a [b, S, V] fp32 output is the
    # peak at a 151,936-token vocabulary); False restores the whole output (the equality tests' reference path).
    project_responses_only = True

    def __init__(self, args, role: str = "actor", rank: int = 0, world_size: int = 1,
                 master_addr: str = "127.0.0.1", master_port: int = 29500, *, resume_iteration: int | None = None):
        """`resume_iteration`: the run's checkpoint iteration, the same for every role (the driver decides it
        from the run marker); None loads the backend's latest published iteration of --load, if any."""
        if role == "reference" and self.reference_worker_refusal:
            raise NotImplementedError(self.reference_worker_refusal)
        if role not in self.roles:
            raise ValueError(f"{type(self).__name__} role must be one of {self.roles}, got {role!r}")
        args = self._prepare_args(copy.copy(args), role)  # our view; the caller's namespace is never mutated
        self.args, self.role = args, role
        self.estimator = alg.get_estimator(args.advantage_estimator)  # looked up once per run
        self.ps = self._init_parallel(rank, world_size, master_addr, master_port)
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        self.comm = Collectives(self.ps, self.device)
        self.hooks = TrainerHooks(args)  # slime's --custom-*-path hooks, imported and checked now
        self._distributed_ready()
        cp_size, cp_rank, row_multiple = self._sequence_split()
        self.batcher = D.MicroBatcher(args, pack_rows=self.pack_rows, use_te=self.use_te, device=self.device,
                                      min_micro_batches=self.min_micro_batches, cp=(cp_size, cp_rank),
                                      row_multiple=row_multiple)
        self.optimizer = self.scheduler = self.ref_model = self.teacher_model = None
        self.loaded_rollout_id = None
        self._offloaded = False
        if role == "reference":  # a frozen copy on GPUs of its own (--placement reference:...): forward only
            self.model = self._build_reference()
            return
        resume = self._has_checkpoint(args.load)
        self.model = self._build_model(resume)  # the weights it starts from, unless a checkpoint replaces them
        self.optimizer = self._build_optimizer()
        self.scheduler = self._build_scheduler()
        if resume:
            load_optim = not args.no_load_optim and not args.finetune
            loaded = self._load_checkpoint(args.load, load_optim, resume_iteration)
            self.loaded_rollout_id = None if args.finetune else loaded
        if role == "actor" and not args.reference_worker and (args.use_kl_loss or self._reward_kl_coef()):
            self.ref_model = self._build_reference()  # else the reference worker sends ref_log_probs
        if role == "actor" and args.use_opd and args.opd_type == "megatron":  # slime's name: a teacher in the trainer
            self.teacher_model = self._build_teacher()

    # ----------------------------------------------------------------- what a backend must supply
    @abc.abstractmethod
    def _init_parallel(self, rank: int, world_size: int, master_addr: str, master_port: int):
        """Process groups and seeds; returns the parallel-state view: get_data_parallel_group / _world_size,
        is_pipeline_last_stage, get_pipeline_model_parallel_world_size / _group / _last_rank."""

    @abc.abstractmethod
    def _has_checkpoint(self, path) -> bool:
        """Whether --load holds a published training checkpoint of this backend (then the run resumes)."""

    @abc.abstractmethod
    def _build_model(self, resume: bool):
        """The trainable model of self.role (the critic: a value head), with its initial weights unless `resume`."""

    @abc.abstractmethod
    def _build_optimizer(self):
        """The optimizer over the trainable parameters (Megatron's decay rules: no weight decay on biases, norms)."""

    @abc.abstractmethod
    def _load_checkpoint(self, load_dir: str, load_optim: bool, iteration: int | None) -> int | None:
        """Restore model (+ optimizer, schedule, RNG when load_optim) from `iteration` (None: the latest published)
        of load_dir; returns the iteration loaded."""

    @abc.abstractmethod
    def _build_reference(self):
        """The frozen KL reference (--ref-load, else --hf-checkpoint): also the whole model of role "reference"."""

    @abc.abstractmethod
    def _build_teacher(self):
        """The frozen OPD teacher (--opd-type megatron, --opd-teacher-load)."""

    @abc.abstractmethod
    def _forward_only(self, model, batch: dict, kind: str) -> list:
        """Per-sample 1-D tensors of a scoring pass: kind "logp" (temperature-scaled log-probs) or "values"."""

    def _responses_only(self, mb, kind: str):
        """`mb` re-pointed for a response-positions-only forward (micro_batch.response_positions_only); the critic's
        value head keeps its whole output (it is [b, S, 1])."""
        if not self.project_responses_only or kind in ("value", "values") or self.role == "critic":
            return mb
        return response_positions_only(mb)

    @abc.abstractmethod
    def _teacher_output(self, mb):
        """--opd-kl-mode full: the OPD teacher's whole output for one micro-batch's tokens."""

    @abc.abstractmethod
    def _train_micro_batches(self, mbs: list, kind: str, scale: float, weights: dict, step: Step,
                             where: tuple) -> StepResult:
        """One optimizer step (and one LR-schedule step) over the micro-batches. `weights`: id(mb) -> per-token loss
        weights replacing `scale` (--loss-agg-mode / micro-batch means); `step`: custom_loss.Step, the loss units;
        `where`: (rollout_id, step_id). The loss is L.make_loss_func(..., estimator=self.estimator)."""

    @abc.abstractmethod
    def _reset_optimizer_states(self) -> None:
        """--reset-optimizer-states / stateless Adam: the next step is a fresh optimizer's first."""

    @abc.abstractmethod
    def _update_reference(self) -> None:
        """--ref-update-interval: the reference becomes a copy of the current actor weights."""

    @abc.abstractmethod
    def _save_checkpoint(self, save_dir: str, rollout_id: int) -> None:
        """Collective: write and publish iteration `rollout_id` of this role in save_dir."""

    @abc.abstractmethod
    def iter_hf_weights(self):
        """(HF name, full tensor) pairs for weight sync; every rank iterates (gathers are collectives)."""

    @abc.abstractmethod
    def _release_accelerator_memory(self) -> None:
        """offload() on an accelerator: weights, gradients, optimizer state (and frozen models) to host memory."""

    @abc.abstractmethod
    def _restore_accelerator_memory(self) -> None:
        """onload() on an accelerator: the inverse of _release_accelerator_memory."""

    @abc.abstractmethod
    def parallel_info(self) -> dict:
        """This rank's place: dp_rank, dp_size, tp_rank, pp_rank (and cp_rank where context parallelism exists)."""

    # ----------------------------------------------------------------- what a backend may override
    def _prepare_args(self, args, role: str):
        """Our copy of args, before anything starts: the backend's own checks and derived values."""
        return args

    def _distributed_ready(self) -> None:
        """After process groups, device and hooks exist, before any model is built."""

    def _sequence_split(self) -> tuple[int, int, int]:
        """(CP size, CP rank, row multiple): with a CP size > 1 sequences are split over CP ranks (cp_layout.py),
        a rank's packed row padded to a multiple of the row multiple. No context parallelism here."""
        return 1, 0, 1

    def _build_scheduler(self):
        """The LR schedule, stepped once per optimizer step (lr_schedule.py; Megatron: megatron-core's own)."""
        return LRSchedule(self.optimizer, **schedule_kwargs(self.args))

    def _before_scoring(self, store_prefix: str) -> None:
        """Before a scoring pass ("" actor, "ref_" reference, "teacher_" OPD teacher). Nothing here."""

    def _old_policy_log_probs(self, batch: dict) -> list:
        """The actor's old-policy log-probs: its current weights (Megatron: --keep-old-actor's pushed weights)."""
        return self._forward_only(self.model, batch, "logp")

    def _after_train_step(self) -> None:
        """After a rollout's optimizer steps (the weights the next push sends). Nothing here."""

    # ----------------------------------------------------------------- checkpoints and memory: the shared half
    def save(self, rollout_id: int) -> str:
        """Checkpoint this role into its --save directory (the critic's role view has its own); returns it."""
        save_dir = self.args.save
        if not save_dir:
            raise ValueError(f"{self.role}: save() needs --save (critic: its role's save dir, e.g. --critic-save "
                             "or a YAML override)")
        self._save_checkpoint(save_dir, rollout_id)
        return save_dir

    def offload(self) -> None:
        """Release accelerator memory while colocated engines generate. On CPU there is none to release, so this
        only records the state; the Ray layer calls the same method either way."""
        if self._offloaded:
            return
        self._offloaded = True
        if self.device is not None:
            self._release_accelerator_memory()

    def onload(self) -> None:
        """Inverse of offload()."""
        if not self._offloaded:
            return
        self._offloaded = False
        if self.device is not None:
            self._restore_accelerator_memory()

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
        """--kl-coef where the estimator folds KL into the reward; 0 where it ignores it (grpo, gspo)."""
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
            self.batcher.reset()  # this call's batch is packed afresh (a hook may have edited it)
            return {"ref_log_probs": self._forward_only(self.model, batch, "logp")}
        if self.role != "actor":
            raise RuntimeError("compute_log_probs is an actor call; the critic has compute_values")
        D.validate_batch(batch)
        self.batcher.reset()  # this call's batch is packed afresh (a hook may have edited it)
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

    def compute_values(self, batch: dict) -> dict:
        """Critic: per-token `values` from the value head, at the positions scoring each response token."""
        if self.role != "critic":
            raise RuntimeError("compute_values is a critic call; build the trainer with role='critic'")
        D.validate_batch(batch)
        self.batcher.reset()  # this call's batch is packed afresh (a hook may have edited it)
        return {"values": self._forward_only(self.model, batch, "values")}

    def compute_advantages(self, batch: dict) -> dict:
        """`advantages`, `returns` per sample: the estimator's token step (`EstimatorSpec.token_step`), the OPD
        term and whitening over every DP rank (advantages.py). Reward-side KL (--kl-coef) uses
        kl_penalty(log_probs, ref_log_probs, --kl-loss-type).
        """
        kl_coef = self._reward_kl_coef()
        D.validate_batch(batch, needed_fields(self.estimator, kl_coef))
        self.batcher.reset()  # this call's batch is packed afresh (a hook may have edited it)
        ps, comm = self.ps, self.comm
        return advantages_and_returns(self.args, self.estimator, batch, kl_coef=kl_coef,
                                      custom=self.hooks.get("custom_advantage_function_path"),
                                      dp_all_reduce=lambda t: comm.all_reduce(t, ps.get_data_parallel_group()))

    def train_step(self, rollout_id: int, batch: dict) -> dict:
        """`--num-steps-per-rollout` optimizer steps over this rank's batch; metrics averaged over DP ranks.

        Each step takes `global_batch_size / dp` consecutive samples as micro-batches, then one optimizer
        step and one LR-schedule step (the backend's _train_micro_batches). The returned dict averages the
        steps' metrics (token-weighted losses), except `lr` (the last step's LR) and `tokens` / `num_steps`
        (totals). Every rank returns the same dict.
        """
        args = self.args
        kind, fields, need, batch = L.loss_kind(args, self.role, batch)
        if self.role == "actor":  # slime's --rollout-data-postprocess-path sees the actor's data
            self.hooks.call("rollout_data_postprocess_path", args, rollout_id, batch)
        D.validate_batch(batch, need)
        self.batcher.reset()  # this call's batch is packed afresh (a hook may have edited it)
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
        return self.comm.average_steps(history)

    def _one_step(self, batch, indices, kind, fields, where) -> dict:
        """One optimizer step over the samples `indices`: its metrics, DP-reduced (same dict on every rank)."""
        args = self.args
        dp = self.ps.get_data_parallel_world_size()
        mbs = self.batcher.split(batch, indices, field_keys=fields)
        # CP ranks hold parts of every response: token counts and metric sums are summed over DP x CP (mcore's
        # schedule multiplies a micro-batch loss by CP, DDP averages over DP x CP: the scale stays CP 1's)
        group, cp_group = self.ps.get_data_parallel_group(with_context_parallel=True), None
        if self.batcher.cp[0] > 1:
            cp_group = self.ps.get_context_parallel_group()
        local_tokens = torch.tensor(float(sum(mb.loss_mask.sum().item() for mb in mbs)), dtype=torch.float64)
        global_tokens = max(self.comm.all_reduce(local_tokens, group).item(), 1.0)
        scale = len(mbs) * dp / global_tokens
        weights = L.aggregation_weights(args, mbs, dp, global_tokens, lambda t: self.comm.all_reduce(t, group),
                                        cp_all_reduce=None if cp_group is None else
                                        (lambda t: self.comm.all_reduce(t, cp_group)))
        units = Step(factor=len(mbs) * dp, samples=len(indices) * dp, global_tokens=global_tokens,
                     per_token=bool(args.calculate_per_token_loss))  # slime's loss units (custom loss / reducer)
        result = self._train_micro_batches(mbs, kind, scale, weights, units, where)
        step = self.comm.reduce_step_metrics(result.outs, global_tokens)
        # a NaN/inf gradient is never applied (the backend skips the step); counted like Megatron's skips
        step.update(lr=result.lr, grad_norm=float(result.grad_norm) if result.grad_norm is not None else float("nan"),
                    skipped=0.0 if result.stepped else 1.0, nonfinite_steps=0.0 if result.finite else 1.0,
                    **result.extra)
        return step

"""FSDPTrainer: one trainer rank of the actor or the critic on the FSDP2 backend (`--train-backend fsdp`).

Same public API and semantics as MegatronTrainer (the shared half is backends/training/base.py): the
micro-batches, losses, estimators, advantage hooks, OPD term, metrics and LR schedule are the same code; what
differs is the model (transformers from --hf-checkpoint, sharded by `fully_shard`), the optimizer (torch AdamW
over the sharded fp32 params, Megatron's decay rules), checkpoints (DCP, checkpoint.py) and weight export
(weights.py).

FSDP is data parallelism: each rank holds 1/world of every parameter, gradient and Adam moment (full_shard). A
step's loss is the token-mean over every DP rank's micro-batches: each micro-batch's backward gets
sum_t l_t * dp / N_step, and FSDP's reduce-scatter averages over ranks. With --context-parallel-size N > 1 every N
consecutive ranks are one DP rank running Ulysses sequence parallelism inside the model (ulysses.py).
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
from datetime import timedelta
from functools import cached_property

import torch
import torch.distributed as dist

from slime_like.backends.fsdp import model as M
from slime_like.backends.fsdp import vision
from slime_like.backends.training import data as D
from slime_like.backends.training import loss as L
from slime_like.backends.training.base import RLTrainerBase, StepResult
from slime_like.config.role_overrides import ROLES
from slime_like.utils import rendezvous

log = logging.getLogger(__name__)


class DataParallelView:
    """The parallel-state questions RLTrainerBase asks, answered for data parallelism, with Ulysses sequence
    parallelism (ulysses.py) inside each data-parallel replica: ranks [d x sp, (d + 1) x sp) are DP rank d's SP group
    (slime's FSDP layout: dp_rank = rank // sp, cp_rank = rank % sp). Every SP rank holds the DP rank's whole
    micro-batches and its loss sees whole responses, so the loss side has no context parallelism: the token counts
    and metrics are reduced over the DP group only (the ranks sharing this SP rank)."""

    def __init__(self, rank: int, world_size: int, sp_size: int = 1):
        self.rank, self.world_size, self.sp_size = rank, world_size, sp_size
        self.dp_rank, self.sp_rank = rank // sp_size, rank % sp_size
        self.dp_group, self.sp_group = dist.group.WORLD, None
        if sp_size > 1:  # every rank creates every group, in the same order (torch's rule)
            for first in range(0, world_size, sp_size):
                group = dist.new_group(list(range(first, first + sp_size)))
                if first == self.dp_rank * sp_size:
                    self.sp_group = group
            for sp_rank in range(sp_size):
                group = dist.new_group(list(range(sp_rank, world_size, sp_size)))
                if sp_rank == self.sp_rank:
                    self.dp_group = group

    def get_data_parallel_group(self, with_context_parallel=False):
        return self.dp_group

    def get_context_parallel_group(self):
        return None

    def get_data_parallel_world_size(self, with_context_parallel=False):
        return self.world_size // self.sp_size

    def get_data_parallel_rank(self, with_context_parallel=False):
        return self.dp_rank

    def is_pipeline_last_stage(self):
        return True

    def get_pipeline_model_parallel_world_size(self):
        return 1


class AdaptersDisabled:
    """The LoRA reference model: the actor's own sharded module, called with its adapters switched off (peft's
    disable_adapter), i.e. the frozen base, without a second copy of the weights."""

    def __init__(self, model):
        self.model = model

    def __call__(self, **inputs):
        with self.model.disable_adapter():
            return self.model(**inputs)

    @property
    def training(self):
        return self.model.training

    def train(self, mode: bool = True):
        self.model.train(mode)

    def eval(self):
        self.model.eval()


def init_process_group(rank, world_size, master_addr, master_port, timeout_minutes=10):
    if dist.is_initialized():
        return
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count())))
    rendezvous.init_process_group("nccl" if cuda else "gloo", rank, world_size, master_addr, master_port,
                                  timedelta(minutes=timeout_minutes))


class FSDPTrainer(RLTrainerBase):
    """Implements `slime_like.backends.trainer_api.TrainerBackend` (`--train-backend fsdp`): RLTrainerBase's hooks
    for a transformers model sharded by FSDP2."""

    checkpoint_format = "dcp"
    roles = ROLES
    reference_worker_refusal = ("a reference model on GPUs of its own (--placement reference:...) is not built for "
                                "--train-backend fsdp; place it with the actor (LoRA: it is the actor)")
    pack_rows = False  # HF attention takes padded rows; token-budget groups still bound each micro-batch

    # ----------------------------------------------------------------- setup (RLTrainerBase's constructor hooks)
    def _prepare_args(self, args, role):
        self._check_supported(args, role)
        return args

    def _init_parallel(self, rank, world_size, master_addr, master_port):
        init_process_group(rank, world_size, master_addr, master_port, self.args.distributed_timeout_minutes)
        sp = int(self.args.context_parallel_size)
        if dist.get_world_size() % sp:
            raise ValueError(f"--context-parallel-size {sp} (Ulysses sequence parallelism) must divide the trainer "
                             f"world size {dist.get_world_size()}")
        ps = DataParallelView(dist.get_rank(), dist.get_world_size(), sp)
        if ps.sp_group is not None:
            from slime_like.backends.fsdp import ulysses

            ulysses.register(ps.sp_group)
        torch.manual_seed(self.args.seed)
        return ps

    @property
    def lora(self) -> bool:
        return int(self.args.lora_rank) > 0

    def _has_checkpoint(self, path) -> bool:
        from slime_like.backends.fsdp import checkpoint

        return checkpoint.has_checkpoint(path)

    def _build_model(self, resume):
        """The HF model of --load (an HF dir) / --ref-load / --hf-checkpoint, LoRA adapters, sharded. A resume
        still needs it: the frozen LoRA base (and full fine-tuning's shapes) are the weights it started from."""
        args = self.args
        self.mesh = M.device_mesh(args, self.ps.world_size, "cuda" if self.device is not None else "cpu")
        module = self._sequence_sharded(M.load_hf_model(args, self.role, self._initial_source()))
        args.vocab_size = vision.text_config(M.hf_config(args)).vocab_size
        if self.lora:
            module = M.add_lora(args, module, self.role)
        return M.shard_model(args, module.to(self.device) if self.device else module, self.mesh)

    def _load_checkpoint(self, load_dir, load_optim, iteration):
        from slime_like.backends.fsdp import checkpoint

        return checkpoint.load(self, load_dir, load_optim=load_optim, iteration=iteration)

    @staticmethod
    def _check_supported(args, role):
        loss_type = args.loss_type
        if role == "actor" and loss_type not in ("policy_loss", "sft_loss"):
            raise NotImplementedError(f"--loss-type {loss_type} is not supported by the FSDP trainer; "
                                      "use policy_loss or sft_loss")
        if not args.hf_checkpoint:
            raise ValueError("--train-backend fsdp builds the model from --hf-checkpoint DIR; set it")
        if int(args.lora_rank) and args.ref_update_interval:
            raise ValueError("--ref-update-interval with --lora-rank: the LoRA reference is the frozen base model "
                             "(adapters disabled); drop --ref-update-interval or train without LoRA")
        if not args.rollout_temperature > 0:
            raise ValueError(f"--rollout-temperature must be > 0, got {args.rollout_temperature}")


    def _initial_source(self):
        """--load when it is an HF directory, else --ref-load, else --hf-checkpoint (the Megatron order). With
        LoRA this is also the frozen base, and so the KL reference (adapters disabled)."""
        from slime_like.backends.training.publish import is_hf_dir

        load = self.args.load
        if load and is_hf_dir(load):
            return load
        return self.args.ref_load or self.args.hf_checkpoint

    def _sequence_sharded(self, module):
        """Under Ulysses sequence parallelism: the decoder body runs this rank's shard of every sequence."""
        if self.ps.sp_group is None:
            return module
        from slime_like.backends.fsdp import ulysses

        return ulysses.install(module, self.ps.sp_group, M.decoder_layers(module))

    def _build_optimizer(self):
        """AdamW (Megatron's "adam" is decoupled weight decay) or SGD over the trainable sharded params;
        biases and 1-D params (norms) get no weight decay, as in Megatron."""
        args = self.args
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        no_decay = [p for n, p in named if p.ndim == 1 or n.endswith(".bias")]
        decay = [p for n, p in named if not (p.ndim == 1 or n.endswith(".bias"))]
        groups = [{"params": decay, "wd_mult": 1.0}, {"params": no_decay, "wd_mult": 0.0}]
        groups = [g for g in groups if g["params"]]
        if args.lr is None:
            raise ValueError("--lr is required for a trainable role (e.g. --lr 1e-6)")
        name = args.optimizer
        if name == "sgd":
            return torch.optim.SGD(groups, lr=float(args.lr), momentum=float(args.sgd_momentum),
                                   weight_decay=float(args.weight_decay), foreach=True)
        if name != "adam":
            raise ValueError(f"--optimizer {name!r} is not supported by the FSDP trainer; use adam or sgd")
        # torch's fused kernel (CPU and CUDA, DTensor shards too): transformers' default, ~4x foreach's speed on CPU
        return torch.optim.AdamW(groups, lr=float(args.lr), betas=(float(args.adam_beta1),
                                 float(args.adam_beta2)), eps=float(args.adam_eps),
                                 weight_decay=float(args.weight_decay), fused=True)

    def _build_reference(self):
        """LoRA: the same sharded model with adapters disabled (no second copy). Else a frozen sharded copy."""
        if self.lora:
            return AdaptersDisabled(self.model)
        return self._frozen_copy(self.args.ref_load or self.args.hf_checkpoint)

    def _build_teacher(self):
        return self._frozen_copy(self.args.opd_teacher_load)

    def _frozen_copy(self, source):
        """The HF model at `source`, frozen, sharded like the actor (the reference, or the --opd-type megatron
        teacher, which must share the actor's architecture as in slime)."""
        frozen = self._sequence_sharded(M.load_hf_model(self.args, "actor", source))
        frozen.requires_grad_(False)
        frozen.eval()
        return M.shard_model(self.args, frozen.to(self.device) if self.device else frozen, self.mesh, trainable=False)

    # ----------------------------------------------------------------- forward / backward
    def _autocast(self):
        dtype = self.args.fsdp_autocast
        if not dtype:
            return contextlib.nullcontext()
        return torch.autocast("cuda" if self.device is not None else "cpu", dtype=M.DTYPES[dtype])

    @cached_property
    def vlm_config(self):
        """The HF config of a vision-language --hf-checkpoint (None for a text model)."""
        config = M.hf_config(self.args)
        return config if vision.is_vision_language(config) else None

    def _forward(self, model, mb):
        if self.vlm_config is not None:  # images in; HF computes the M-RoPE positions (vision.py)
            inputs = vision.forward_kwargs(self.vlm_config, mb, self.device)
        else:
            inputs = dict(input_ids=mb.tokens, position_ids=mb.position_ids)
        if mb.logit_positions is not None:
            inputs["logits_to_keep"] = mb.logit_positions
        with self._autocast():
            out = model(**inputs)
        return out if torch.is_tensor(out) else out.logits

    def _teacher_output(self, mb):
        """--opd-kl-mode full: the frozen teacher's logits for the micro-batch (RLTrainerBase._opd_teacher)."""
        return self._forward(self.teacher_model, mb)

    def _forward_only(self, model, batch, kind):
        """Per-sample response log-probs (kind "logp", temperature-scaled) or values (kind "values")."""
        n = D.num_samples(batch)
        temperature = float(self.args.rollout_temperature)
        mode = model.training
        model.eval()  # no dropout when scoring
        result = [None] * n
        with torch.no_grad():
            for mb in self.batcher.for_scoring(batch):
                mb = self._responses_only(mb, kind)
                _, out = L.forward_only_func(kind, mb, temperature, self.args.vocab_size)(self._forward(model, mb))
                for sample, row in zip(out["ids"], D.unpad_rows(out["out"], out["lengths"])):
                    result[sample] = row
        model.train(mode)
        return result

    def _train_micro_batches(self, mbs, kind, scale, weights, step, where) -> StepResult:
        """One optimizer step. `step.per_token` (--calculate-per-token-loss) is Megatron's route to the same step
        token-mean, so it changes nothing here; `where` (rollout_id, step_id) is for the Megatron hooks."""
        model, args = self.model, self.args
        model.train()
        self.optimizer.zero_grad(set_to_none=True)
        defer = bool(args.fsdp_defer_grad_sync)
        outs = []
        teacher = self._opd_teacher(kind)
        for i, mb in enumerate(mbs):
            if defer:  # reduce-scatter once, after the last micro-batch (gradients accumulate unsharded)
                model.set_requires_gradient_sync(i == len(mbs) - 1)
            w = weights.get(id(mb))
            mb = self._responses_only(mb, kind)
            loss, sums = L.make_loss_func(kind, args, mb, scale, False, w, teacher=teacher,
                                          estimator=self.estimator)(self._forward(model, mb))
            (loss / len(mbs)).backward()
            outs.append(sums)
        params = [p for p in model.parameters() if p.requires_grad]
        clip = float(args.clip_grad or 0.0)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf, foreach=True)
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        lr = float(self.optimizer.param_groups[0]["lr"])
        ok = math.isfinite(grad_norm)  # a non-finite gradient never reaches the weights
        if ok:
            if args.use_stateless_adam:  # slime's stateless Adam: each step is a fresh Adam's first (no moments kept)
                self._reset_optimizer_states()
            self.optimizer.step()
            self.scheduler.step(increment=1)
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(outs, lr, finite=ok, stepped=ok, grad_norm=grad_norm)

    def _reset_optimizer_states(self):
        """--reset-optimizer-states: drop Adam's moments and step; the next step is a fresh Adam's first."""
        self.optimizer.state.clear()

    def _update_reference(self):
        """--ref-update-interval: the reference becomes a copy of the current actor (same sharding: local copy)."""
        with torch.no_grad():
            ref_params = dict(self.ref_model.named_parameters())
            for name, p in self.model.named_parameters():
                ref_params[name].copy_(p)

    # ----------------------------------------------------------------- checkpoints, weights, memory
    def _save_checkpoint(self, save_dir, rollout_id):
        from slime_like.backends.fsdp import checkpoint

        checkpoint.save(self, save_dir, rollout_id, with_optim=not self.args.no_save_optim)
        if self.args.save_hf and self.role == "actor":
            from slime_like.backends.fsdp import weights

            weights.save_hf(self, str(self.args.save_hf).replace("{rollout_id}", str(rollout_id)))

    def iter_hf_weights(self):
        """(hf_name, full tensor) pairs; every rank must iterate (all-gathers); rank 0 yields. LoRA: merged.
        A frozen vision tower is left out when the engines hold it already (they loaded the trainer's source)."""
        from slime_like.backends.fsdp import weights

        skip = vision.vision_prefixes(self.model) if self._engines_hold_frozen_tower() else ()
        yield from weights.iter_hf_weights(self.model, merged=True, skip_prefixes=skip)

    def _engines_hold_frozen_tower(self) -> bool:
        """--freeze-vision-tower, and the trainer started from --hf-checkpoint, the engines' weights: the tower
        never changes, so no push carries it. From another --load / --ref-load every push carries it."""
        if self.vlm_config is None or not self.args.freeze_vision_tower:
            return False
        return os.path.realpath(self._initial_source()) == os.path.realpath(self.args.hf_checkpoint)

    def parallel_info(self) -> dict:
        return dict(dp_rank=self.ps.dp_rank, dp_size=self.ps.get_data_parallel_world_size(), tp_rank=0, pp_rank=0,
                    cp_rank=self.ps.sp_rank)

    def _release_accelerator_memory(self):
        """Colocated runs on GPUs: sharded params (reference, OPD teacher included) and optimizer state to CPU while
        the engines generate."""
        self._move(torch.device("cpu"))

    def _restore_accelerator_memory(self):
        self._move(self.device)

    def _move(self, device):
        models = (self.model, self.ref_model, self.teacher_model)
        for model in {id(m): m for m in models if isinstance(m, torch.nn.Module)}.values():
            model.to(device)
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if torch.is_tensor(value) and key != "step":
                    state[key] = value.to(device, non_blocking=True)
        if device.type == "cpu":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

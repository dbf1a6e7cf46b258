"""The learning-rate and weight-decay schedule every trainer backend steps once per optimizer step.

Our own implementation of the semantics of megatron-core's OptimizerParamScheduler (value for value: a test
compares the two over whole runs of every decay style), so a backend without megatron-core (FSDP) schedules its
LR exactly as the Megatron trainer does. `schedule_kwargs(args)` maps our flags (Megatron-LM's names) onto the
constructor arguments both classes share; the Megatron trainer hands them to mcore's class (its checkpoints stay
Megatron-LM's), the others to `LRSchedule`.

    warm-up     init_lr -> max_lr linearly over lr_warmup_steps (steps 0..warmup inclusive)
    decay       constant (max_lr after warm-up), linear, cosine, inverse-square-root, WSD (constant, then a
                linear / cosine / exponential / minus_sqrt anneal over the last wsd_decay_steps); min_lr after
                lr_decay_steps
    weight decay start_wd -> end_wd over wd_incr_steps (constant, linear or cosine), times each param group's
                `wd_mult` (0 for biases and norms)
A param group's own `max_lr` / `min_lr` / `start_wd` / `end_wd` keys override the schedule's, as in mcore.
"""
from __future__ import annotations

import math

from slime_like.config.schedule import schedule_steps


def schedule_kwargs(args) -> dict:
    """The schedule of --lr / --min-lr / --lr-warmup-* / --lr-decay-* / --*-weight-decay* / --lr-wsd-* flags:
    keyword arguments of `LRSchedule` and of megatron-core's OptimizerParamScheduler alike.

    The constant style with a warm-up keeps the max LR after warm-up (Megatron's rule); an unset start / end
    weight decay is --weight-decay (Megatron's rule), constant unless --start/--end-weight-decay say otherwise.
    """
    warmup, decay = schedule_steps(args)
    wd = float(args.weight_decay)
    start_wd = wd if args.start_weight_decay is None else float(args.start_weight_decay)
    end_wd = wd if args.end_weight_decay is None else float(args.end_weight_decay)
    wd_style = args.weight_decay_incr_style
    if wd_style == "constant" and start_wd != end_wd:
        raise ValueError("--start-weight-decay and --end-weight-decay differ but --weight-decay-incr-style is "
                         "constant; use linear or cosine")
    return dict(init_lr=float(args.lr_warmup_init), max_lr=float(args.lr), min_lr=float(args.min_lr),
                lr_warmup_steps=warmup, lr_decay_steps=decay, lr_decay_style=args.lr_decay_style,
                start_wd=start_wd, end_wd=end_wd, wd_incr_steps=decay, wd_incr_style=wd_style,
                use_checkpoint_opt_param_scheduler=bool(args.use_checkpoint_opt_param_scheduler),
                override_opt_param_scheduler=bool(args.override_opt_param_scheduler),
                wsd_decay_steps=args.lr_wsd_decay_iters, lr_wsd_decay_style=args.lr_wsd_decay_style)


def _anneal(style: str, ratio: float) -> float:
    """The decay coefficient (1 at the start, 0 at the end) of a named anneal at `ratio` in [0, 1]."""
    if style == "linear":
        return 1.0 - ratio
    if style == "cosine":
        return 0.5 * (math.cos(math.pi * ratio) + 1.0)
    if style == "exponential":
        return 2.0 * math.pow(0.5, ratio) - 1.0
    if style == "minus_sqrt":
        return 1.0 - math.sqrt(ratio)
    raise ValueError(f"LR anneal style {style!r} is not supported")


class LRSchedule:
    """Sets every param group's `lr` and `weight_decay` for the current optimizer step count (`num_steps`)."""

    def __init__(self, optimizer, *, init_lr: float, max_lr: float, min_lr: float, lr_warmup_steps: int,
                 lr_decay_steps: int, lr_decay_style: str, start_wd: float, end_wd: float, wd_incr_steps: int,
                 wd_incr_style: str, use_checkpoint_opt_param_scheduler: bool = True,
                 override_opt_param_scheduler: bool = False, wsd_decay_steps: int | None = None,
                 lr_wsd_decay_style: str | None = None):
        if not 0.0 <= min_lr <= max_lr or init_lr > max_lr:
            raise ValueError(f"LR schedule needs 0 <= min_lr ({min_lr}) <= max_lr ({max_lr}) and init_lr "
                             f"({init_lr}) <= max_lr")
        if not 0 <= lr_warmup_steps < lr_decay_steps:
            raise ValueError(f"LR schedule needs 0 <= warm-up ({lr_warmup_steps}) < decay steps ({lr_decay_steps})")
        if lr_decay_style == "WSD" and wsd_decay_steps is None:
            raise ValueError("--lr-decay-style WSD needs --lr-wsd-decay-iters")
        if not 0.0 <= start_wd <= end_wd:
            raise ValueError(f"weight decay schedule needs 0 <= start ({start_wd}) <= end ({end_wd})")
        if override_opt_param_scheduler and use_checkpoint_opt_param_scheduler:
            raise ValueError("--override-opt-param-scheduler and --use-checkpoint-opt-param-scheduler are both set")
        self.optimizer = optimizer
        self.init_lr, self.max_lr, self.min_lr = init_lr, float(max_lr), min_lr
        self.lr_warmup_steps, self.lr_decay_steps, self.lr_decay_style = lr_warmup_steps, lr_decay_steps, lr_decay_style
        self.wsd_decay_steps, self.lr_wsd_decay_style = wsd_decay_steps, lr_wsd_decay_style
        self.start_wd, self.end_wd, self.wd_incr_steps, self.wd_incr_style = start_wd, end_wd, wd_incr_steps, \
            wd_incr_style
        self.use_checkpoint = use_checkpoint_opt_param_scheduler
        self.override = override_opt_param_scheduler
        self.num_steps = 0
        self.step(0)

    def get_wd(self, group: dict | None = None) -> float:
        group = group or {}
        start_wd, end_wd = group.get("start_wd", self.start_wd), group.get("end_wd", self.end_wd)
        if self.num_steps > self.wd_incr_steps or self.wd_incr_style == "constant":
            return end_wd
        ratio = float(self.num_steps) / float(self.wd_incr_steps)
        if self.wd_incr_style == "linear":
            coeff = ratio
        elif self.wd_incr_style == "cosine":
            coeff = 0.5 * (math.cos(math.pi * (1 - ratio)) + 1.0)
        else:
            raise ValueError(f"--weight-decay-incr-style {self.wd_incr_style!r} is not supported")
        return start_wd + coeff * (end_wd - start_wd)

    def get_lr(self, group: dict) -> float:
        max_lr, min_lr = group.get("max_lr", self.max_lr), group.get("min_lr", self.min_lr)
        steps, warmup = self.num_steps, self.lr_warmup_steps
        if warmup > 0 and steps <= warmup:
            return self.init_lr + (max_lr - self.init_lr) * float(steps) / float(warmup)
        style = self.lr_decay_style
        if style == "constant":
            return max_lr
        if steps > self.lr_decay_steps:
            return min_lr
        if style == "inverse-square-root":
            return max(min_lr, max_lr * max(warmup, 1) ** 0.5 / (max(steps, 1) ** 0.5))
        if style in ("linear", "cosine"):
            coeff = _anneal(style, float(steps - warmup) / float(self.lr_decay_steps - warmup))
        elif style == "WSD":
            anneal_start = self.lr_decay_steps - self.wsd_decay_steps
            coeff = 1.0 if steps <= anneal_start else \
                _anneal(self.lr_wsd_decay_style, float(steps - anneal_start) / float(self.wsd_decay_steps))
        else:
            raise ValueError(f"--lr-decay-style {style!r} is not supported")
        return min_lr + coeff * (max_lr - min_lr)

    def step(self, increment: int) -> None:
        self.num_steps += increment
        for group in self.optimizer.param_groups:
            group["lr"] = self.get_lr(group)
            group["weight_decay"] = self.get_wd(group) * group.get("wd_mult", 1.0)

    # ----------------------------------------------------------------- checkpoints (mcore's keys)
    def state_dict(self) -> dict:
        return {"max_lr": self.max_lr, "lr_warmup_steps": self.lr_warmup_steps, "num_steps": self.num_steps,
                "lr_decay_style": self.lr_decay_style, "lr_decay_steps": self.lr_decay_steps, "min_lr": self.min_lr,
                "start_wd": self.start_wd, "end_wd": self.end_wd, "wd_incr_style": self.wd_incr_style,
                "wd_incr_steps": self.wd_incr_steps}

    def _checked(self, ours, saved, name: str):
        """--override-opt-param-scheduler: ours; --use-checkpoint-opt-param-scheduler: the checkpoint's; neither:
        they must agree."""
        if self.override:
            return ours
        if not self.use_checkpoint and ours != saved:
            raise ValueError(f"LR schedule: this run's {name} {ours} differs from the checkpoint's {saved}; pass "
                             "--use-checkpoint-opt-param-scheduler or --override-opt-param-scheduler")
        return saved

    def load_state_dict(self, state: dict) -> None:
        self.max_lr = self._checked(self.max_lr, state["max_lr"], "learning rate")
        self.min_lr = self._checked(self.min_lr, state["min_lr"], "minimum learning rate")
        self.lr_warmup_steps = self._checked(self.lr_warmup_steps, state["lr_warmup_steps"], "warm-up steps")
        self.lr_decay_steps = self._checked(self.lr_decay_steps, state["lr_decay_steps"], "decay steps")
        self.lr_decay_style = self._checked(self.lr_decay_style, state["lr_decay_style"], "decay style")
        self.step(increment=state["num_steps"])
        if "start_wd" in state:
            self.start_wd = self._checked(self.start_wd, state["start_wd"], "start weight decay")
            self.end_wd = self._checked(self.end_wd, state["end_wd"], "end weight decay")
            self.wd_incr_steps = self._checked(self.wd_incr_steps, state["wd_incr_steps"], "weight decay steps")
            self.wd_incr_style = self._checked(self.wd_incr_style, state["wd_incr_style"], "weight decay style")

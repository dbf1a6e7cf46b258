"""backends/training/lr_schedule.py equals megatron-core's OptimizerParamScheduler value for value.

Both schedulers drive their own copy of the same two-group torch optimizer (weight decay multiplier 1 and 0, as
the trainers' decay / no-decay groups) through a whole run and past its end; every step's lr and weight decay of
every group must be equal (==, not approximately), and so must the checkpointed state and a resume from it.
"""
import pytest
import torch

from slime_like.backends.training.lr_schedule import LRSchedule, schedule_kwargs

core = pytest.importorskip("megatron.core.optimizer_param_scheduler")

STEPS = 14  # the decay horizon is 10: the last steps check the min-lr tail

CASES = {
    "constant": dict(lr_decay_style="constant"),
    "constant-warmup": dict(lr_decay_style="constant", lr_warmup_steps=3, init_lr=1e-5),
    "linear": dict(lr_decay_style="linear", lr_warmup_steps=2),
    "cosine": dict(lr_decay_style="cosine", lr_warmup_steps=3, init_lr=2e-5, wd_incr_style="cosine"),
    "inverse-square-root": dict(lr_decay_style="inverse-square-root", lr_warmup_steps=2),
    "inverse-square-root-no-warmup": dict(lr_decay_style="inverse-square-root"),
    **{f"WSD-{s}": dict(lr_decay_style="WSD", lr_warmup_steps=1, wsd_decay_steps=4, lr_wsd_decay_style=s)
       for s in ("linear", "cosine", "exponential", "minus_sqrt")},
}


def _kwargs(case):
    kw = dict(init_lr=0.0, max_lr=3e-3, min_lr=1e-4, lr_warmup_steps=0, lr_decay_steps=10, start_wd=0.01,
              end_wd=0.1, wd_incr_steps=10, wd_incr_style="linear", use_checkpoint_opt_param_scheduler=False,
              override_opt_param_scheduler=False, wsd_decay_steps=None, lr_wsd_decay_style=None)
    return kw | case


def _optimizer():
    decay, no_decay = torch.nn.Parameter(torch.ones(3, 3)), torch.nn.Parameter(torch.ones(3))
    return torch.optim.AdamW([{"params": [decay], "wd_mult": 1.0}, {"params": [no_decay], "wd_mult": 0.0}], lr=1.0)


def _values(optimizer):
    return [(g["lr"], g["weight_decay"]) for g in optimizer.param_groups]


@pytest.mark.parametrize("name", sorted(CASES))
def test_schedule_equals_megatron_core_value_for_value(name):
    kw = _kwargs(CASES[name])
    ours_opt, theirs_opt = _optimizer(), _optimizer()
    ours, theirs = LRSchedule(ours_opt, **kw), core.OptimizerParamScheduler(theirs_opt, **kw)
    seen = [_values(ours_opt)]
    assert _values(ours_opt) == _values(theirs_opt)
    for _ in range(STEPS):
        ours.step(increment=1)
        theirs.step(increment=1)
        assert _values(ours_opt) == _values(theirs_opt), (name, ours.num_steps)
        seen.append(_values(ours_opt))
    assert len({lr for (lr, _), _ in seen}) > 1 or kw["lr_decay_style"] == "constant"  # the schedule did move
    assert ours.state_dict() == theirs.state_dict()
    # a resume from step 6 of either continues identically
    half_ours, half_theirs = LRSchedule(_optimizer(), **kw), core.OptimizerParamScheduler(_optimizer(), **kw)
    for s in (half_ours, half_theirs):
        s.step(increment=6)
    resumed_ours_opt, resumed_theirs_opt = _optimizer(), _optimizer()
    LRSchedule(resumed_ours_opt, **kw).load_state_dict(half_theirs.state_dict())
    core.OptimizerParamScheduler(resumed_theirs_opt, **kw).load_state_dict(half_ours.state_dict())
    assert _values(resumed_ours_opt) == _values(resumed_theirs_opt) == seen[6]


def test_a_checkpoint_of_another_schedule_is_refused_unless_overridden():
    kw = _kwargs(CASES["cosine"])
    saved = LRSchedule(_optimizer(), **kw).state_dict()
    with pytest.raises(ValueError, match="--use-checkpoint-opt-param-scheduler or --override-opt-param-scheduler"):
        LRSchedule(_optimizer(), **(kw | dict(max_lr=1e-3))).load_state_dict(saved)
    overridden = LRSchedule(_optimizer(), **(kw | dict(max_lr=1e-3, override_opt_param_scheduler=True)))
    overridden.load_state_dict(saved)
    assert overridden.max_lr == 1e-3  # this run's
    from_checkpoint = LRSchedule(_optimizer(), **(kw | dict(max_lr=1e-3, use_checkpoint_opt_param_scheduler=True)))
    from_checkpoint.load_state_dict(saved)
    assert from_checkpoint.max_lr == 3e-3  # the checkpoint's

def test_schedule_kwargs_from_the_flags_build_both():
    from slime_like.args import make_args

    args = make_args("--lr", "2e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "2",
                     "--lr-decay-iters", "8", "--weight-decay", "0.1", "--start-weight-decay", "0.05",
                     "--weight-decay-incr-style", "linear")
    kw = schedule_kwargs(args)
    assert (kw["lr_warmup_steps"], kw["lr_decay_steps"], kw["start_wd"], kw["end_wd"]) == (2, 8, 0.05, 0.1)
    ours_opt, theirs_opt = _optimizer(), _optimizer()
    ours, theirs = LRSchedule(ours_opt, **kw), core.OptimizerParamScheduler(theirs_opt, **kw)
    for _ in range(10):
        ours.step(1)
        theirs.step(1)
        assert _values(ours_opt) == _values(theirs_opt)

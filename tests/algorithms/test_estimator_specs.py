"""Estimator specs: one registration per name, traits read from slime_like/registry.py, a new estimator in a few lines."""
import ast
import pathlib

import pytest
import torch

from slime_like import algorithms as alg
from slime_like.algorithms import registry
from slime_like.registry import ADVANTAGE_ESTIMATORS

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_estimator_of_the_table_has_its_steps_and_reads_its_traits_there():
    assert ADVANTAGE_ESTIMATORS.names() == alg.estimator_names()
    for name in alg.estimator_names():
        spec = alg.get_estimator(name)
        assert {t for t in registry.TRAITS if getattr(spec, t)} == set(ADVANTAGE_ESTIMATORS.get(name).capabilities)
        assert spec.policy_loss_kind == ADVANTAGE_ESTIMATORS.fact(name, "policy_loss_kind")
    with pytest.raises(ValueError, match="traits are slime_like/registry.py's entry"):
        alg.register_estimator("ppo", group_step=alg.raw_rewards, needs_critic=False)


def test_double_registration_is_refused():
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        alg.register_estimator("grpo", group_step=alg.raw_rewards)(lambda **kw: None)
    with pytest.raises(ValueError, match="policy_loss_kind"):
        alg.register_estimator("x_new", group_step=alg.raw_rewards, policy_loss_kind="seq")


def test_a_registered_estimator_is_all_it_takes():
    """The docs/algorithms.md example: the spec reaches compute_advantages_and_returns and the group step."""
    @alg.register_estimator("test_signed_reward", group_step=alg.group_mean_subtracted_rewards)
    def signed_reward(*, rewards, mask, values=None, kl=None, kl_coef=0.0, gamma=1.0, lam=1.0, whiten=True):
        adv = torch.sign(torch.as_tensor(rewards, dtype=torch.float32))[:, None] * mask
        return adv, adv.clone()

    try:
        spec = alg.get_estimator("test_signed_reward")
        assert spec.token_step is signed_reward and not spec.uses_reward_kl and spec.policy_loss_kind == "ppo"
        assert spec.group_step([1.0, 3.0], 2).tolist() == [-1.0, 1.0]
        adv, _ = alg.compute_advantages_and_returns("test_signed_reward", rewards=[-1.0, 2.0], mask=torch.ones(2, 2))
        assert adv.tolist() == [[-1.0, -1.0], [1.0, 1.0]]
    finally:
        alg.unregister_estimator("test_signed_reward")


def test_no_estimator_name_is_compared_as_a_string_outside_algorithms():
    """Rollout, trainer, loss and config read the spec (or config's trait table), never `est == "ppo"`."""
    names = set(ADVANTAGE_ESTIMATORS.names())
    offenders = []
    for f in ROOT.glob("slime_like/**/*.py"):
        if "slime_like/algorithms/" in f.as_posix():
            continue
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Compare):
                consts = [c for c in ast.walk(node) if isinstance(c, ast.Constant) and c.value in names]
                offenders += [f"{f.relative_to(ROOT)}:{c.lineno} {c.value!r}" for c in consts]
    assert offenders == []

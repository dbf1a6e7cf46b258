"""compute_advantages_and_returns per --advantage-estimator, the rollout-side group step, and the registries."""
import math

import pytest
import torch
from torch.testing import assert_close

import slime_like.algorithms as algos
from slime_like.algorithms import (
    UnknownChoiceError,
    compute_advantages_and_returns,
    estimator_names,
    get_estimator,
    get_kl_estimator,
    kl_penalty,
)

F64 = torch.float64


def loop_token_rewards(reward, kl_row, mask_row, kl_coef):
    """-kl_coef * kl on valid tokens, + reward on the last valid token."""
    out = [(-kl_coef * k if m else 0.0) for k, m in zip(kl_row, mask_row)]
    valid = [t for t, m in enumerate(mask_row) if m]
    if valid:
        out[valid[-1]] += reward
    return out


def loop_returns(token_rewards, mask_row, gamma):
    out, g = [0.0] * len(mask_row), 0.0
    for t in reversed([t for t, m in enumerate(mask_row) if m]):
        g = token_rewards[t] + gamma * g
        out[t] = g
    return out


def loop_gae_row(token_rewards, values, mask_row, gamma, lam):
    out, a, v_next = [0.0] * len(mask_row), 0.0, 0.0
    for t in reversed([t for t, m in enumerate(mask_row) if m]):
        a = token_rewards[t] + gamma * v_next - values[t] + gamma * lam * a
        v_next = values[t]
        out[t] = a
    return out


@pytest.fixture
def data(randn, make_mask):
    b, t = 5, 7
    mask = make_mask(b, t, holes=True)
    mask[:, 0] = 1.0
    return dict(rewards=randn(b), mask=mask, kl=randn(b, t).abs() * 0.1, values=randn(b, t))


@pytest.mark.parametrize("estimator", ["grpo", "gspo"])
def test_grpo_gspo_broadcast_the_reward(data, estimator):
    adv, ret = compute_advantages_and_returns(estimator, rewards=data["rewards"], mask=data["mask"], kl=data["kl"])
    assert_close(adv, data["rewards"][:, None] * data["mask"])
    assert_close(ret, adv)


def test_reinforce_plus_plus_baseline(data):
    adv, ret = compute_advantages_and_returns("reinforce_plus_plus_baseline", rewards=data["rewards"],
                                              mask=data["mask"], kl=data["kl"], kl_coef=0.05)
    assert_close(adv, (data["rewards"][:, None] - 0.05 * data["kl"]) * data["mask"])
    assert_close(ret, adv)


@pytest.mark.parametrize("whiten", [True, False])
def test_reinforce_plus_plus(data, whiten):
    gamma, kl_coef = 0.9, 0.1
    adv, ret = compute_advantages_and_returns("reinforce_plus_plus", rewards=data["rewards"], mask=data["mask"],
                                              kl=data["kl"], kl_coef=kl_coef, gamma=gamma, whiten=whiten)
    mask = data["mask"].tolist()
    want_ret = [loop_returns(loop_token_rewards(r, k, m, kl_coef), m, gamma)
                for r, k, m in zip(data["rewards"].tolist(), data["kl"].tolist(), mask)]
    assert_close(ret, torch.tensor(want_ret, dtype=F64))
    if whiten:
        vals = [v for row, mrow in zip(want_ret, mask) for v, m in zip(row, mrow) if m]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1) + 1e-8)
        want_adv = [[(v - mean) / std if m else 0.0 for v, m in zip(row, mrow)] for row, mrow in zip(want_ret, mask)]
        assert_close(adv, torch.tensor(want_adv, dtype=F64))
    else:
        assert_close(adv, ret)


def test_ppo_gae_with_kl_shaped_rewards(data):
    gamma, lam, kl_coef = 0.99, 0.95, 0.2
    adv, ret = compute_advantages_and_returns("ppo", rewards=data["rewards"], mask=data["mask"], values=data["values"],
                                              kl=data["kl"], kl_coef=kl_coef, gamma=gamma, lam=lam)
    want = [loop_gae_row(loop_token_rewards(r, k, m, kl_coef), v, m, gamma, lam)
            for r, k, m, v in zip(data["rewards"].tolist(), data["kl"].tolist(), data["mask"].tolist(),
                                  data["values"].tolist())]
    assert_close(adv, torch.tensor(want, dtype=F64))
    assert_close(ret, adv + data["values"])


def test_ppo_hand_case_reward_lands_on_the_last_loss_token():
    # the response's last token is a masked tool token: the reward goes to the last *trained* token
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=F64)
    values = torch.tensor([[0.5, 0.25, 9.0]], dtype=F64)
    adv, ret = compute_advantages_and_returns("ppo", rewards=[2.0], mask=mask, values=values, gamma=1.0, lam=1.0)
    # A1 = 2 - 0.25 = 1.75; A0 = 0 + 0.25 - 0.5 + 1.75 = 1.5
    assert_close(adv, torch.tensor([[1.5, 1.75, 0.0]], dtype=F64))
    assert_close(ret[:, :2], torch.tensor([[2.0, 2.0]], dtype=F64))


def test_estimators_are_padding_invariant(data):
    pad = torch.zeros(data["mask"].shape[0], 3, dtype=F64)
    for estimator in estimator_names():
        base = compute_advantages_and_returns(estimator, rewards=data["rewards"], mask=data["mask"],
                                              values=data["values"], kl=data["kl"], kl_coef=0.1, gamma=0.9, lam=0.9)
        padded = compute_advantages_and_returns(
            estimator, rewards=data["rewards"], mask=torch.cat([data["mask"], pad], 1),
            values=torch.cat([data["values"], pad + 5], 1), kl=torch.cat([data["kl"], pad + 7], 1),
            kl_coef=0.1, gamma=0.9, lam=0.9)
        assert_close(padded[0][:, :-3], base[0])
        assert torch.equal(padded[0][:, -3:], pad)


def test_estimator_input_errors(data):
    with pytest.raises(ValueError, match="--use-critic"):
        compute_advantages_and_returns("ppo", rewards=data["rewards"], mask=data["mask"])
    with pytest.raises(ValueError, match="kl_coef"):
        compute_advantages_and_returns("reinforce_plus_plus", rewards=data["rewards"], mask=data["mask"], kl_coef=0.1)
    with pytest.raises(ValueError, match="rewards for a batch of"):
        compute_advantages_and_returns("grpo", rewards=[1.0], mask=data["mask"])


def test_group_steps_of_the_specs():
    r = torch.tensor([1.0, 0.0, 3.0, 3.0])
    step = lambda name, *a, **kw: get_estimator(name).group_step(*a, **kw)  # noqa: E731
    assert_close(step("grpo", r, 2, normalize_std=True), algos.group_advantages(r, 2))
    assert_close(step("gspo", r, 2, normalize_std=False), torch.tensor([0.5, -0.5, 0.0, 0.0]))
    assert_close(step("reinforce_plus_plus_baseline", r, 2), torch.tensor([0.5, -0.5, 0.0, 0.0]))
    assert torch.equal(step("ppo", r, 2), r)
    assert torch.equal(step("reinforce_plus_plus", [1, 2], 2), torch.tensor([1.0, 2.0]))


# ---------------------------------------------------------------- registries

def test_registries_cover_the_flag_values():
    assert set(estimator_names()) == {"grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
                                      "ppo"}
    assert set(algos.KL_ESTIMATORS) == {"k1", "k2", "k3", "low_var_kl"}
    assert get_estimator("gspo").policy_loss_kind == "gspo" and get_estimator("grpo").policy_loss_kind == "ppo"
    x, y = torch.tensor([0.3]), torch.tensor([-0.2])
    for name in algos.KL_ESTIMATORS:
        assert_close(get_kl_estimator(name)(x, y), kl_penalty(x, y, name))


@pytest.mark.parametrize("lookup,flag,bad,suggestion", [
    (get_estimator, "--advantage-estimator", "reinforce_plus_plus_basline", "reinforce_plus_plus_baseline"),
    (get_estimator, "--advantage-estimator", "gpro", "grpo"),
    (get_kl_estimator, "--kl-loss-type", "low_var", "low_var_kl"),
])
def test_registry_typo_names_the_flag_choices_and_did_you_mean(lookup, flag, bad, suggestion):
    with pytest.raises(UnknownChoiceError) as info:
        lookup(bad)
    msg = str(info.value)
    assert flag in msg and repr(bad) in msg and "Did you mean" in msg
    assert repr(suggestion) in msg.split("Did you mean")[1]
    assert "valid choices" in msg
    assert isinstance(info.value, ValueError) and isinstance(info.value, KeyError)


def test_registry_unrelated_key_has_no_suggestion():
    with pytest.raises(ValueError) as info:
        kl_penalty(torch.zeros(1), torch.zeros(1), "zzzzzz")
    assert "Did you mean" not in str(info.value) and "k1, k2, k3, low_var_kl" in str(info.value)
    with pytest.raises(KeyError):
        compute_advantages_and_returns("dapo", rewards=[1.0], mask=torch.ones(1, 2))


def test_dtypes_and_bool_masks():
    """float32 inputs give float32 outputs; a bool mask works like a 0/1 float mask."""
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    values = torch.tensor([[0.1, 0.2, 0.0], [0.3, 0.0, 0.0]])
    for estimator in estimator_names():
        adv, ret = compute_advantages_and_returns(estimator, rewards=[1.0, -1.0], mask=mask, values=values)
        adv_f, ret_f = compute_advantages_and_returns(estimator, rewards=[1.0, -1.0], mask=mask.float(), values=values)
        assert adv.dtype == ret.dtype == torch.float32
        assert torch.equal(adv, adv_f) and torch.equal(ret, ret_f)

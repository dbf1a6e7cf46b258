"""group_advantages, reinforce_baseline_advantages, discounted_returns, gae, masked_whiten:
against plain loops, hand-computed cases, and padding invariance."""
import math
import statistics

import pytest
import torch
from torch.testing import assert_close

from slime_like.algorithms import (
    discounted_returns,
    gae,
    group_advantages,
    masked_moments,
    masked_whiten,
    reinforce_baseline_advantages,
    whiten_from_moments,
)


# ---------------------------------------------------------------- plain-loop references

def loop_group_advantages(rewards, group_size, normalize_std=True, eps=1e-6):
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start:start + group_size]
        mean = sum(group) / len(group)
        for r in group:
            if len(group) == 1:
                out.append(0.0)
            elif normalize_std:
                out.append((r - mean) / (statistics.stdev(group) + eps))
            else:
                out.append(r - mean)
    return out


def loop_valid_positions(mask_row):
    return [t for t, m in enumerate(mask_row) if m]


def loop_discounted_returns(rewards, mask, gamma):
    out = [[0.0] * len(row) for row in rewards]
    for b, (r_row, m_row) in enumerate(zip(rewards, mask)):
        g = 0.0
        for t in reversed(loop_valid_positions(m_row)):
            g = r_row[t] + gamma * g
            out[b][t] = g
    return out


def loop_gae(rewards, values, mask, gamma, lam):
    adv = [[0.0] * len(row) for row in rewards]
    for b in range(len(rewards)):
        pos = loop_valid_positions(mask[b])
        a_next, v_next = 0.0, 0.0
        for t in reversed(pos):
            delta = rewards[b][t] + gamma * v_next - values[b][t]
            a_next = delta + gamma * lam * a_next
            v_next = values[b][t]
            adv[b][t] = a_next
    return adv


def loop_whiten(x, mask, shift_mean=True, eps=1e-8):
    vals = [v for row, mrow in zip(x, mask) for v, m in zip(row, mrow) if m]
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    return [[(v - mean) / math.sqrt(var + eps) + (0.0 if shift_mean else mean) for v in row] for row in x]


# ---------------------------------------------------------------- group advantages

@pytest.mark.parametrize("group_size", [1, 2, 4, 8])
@pytest.mark.parametrize("normalize_std", [True, False])
def test_group_advantages_matches_loop(randn, group_size, normalize_std):
    rewards = randn(32)
    got = group_advantages(rewards, group_size, normalize_std=normalize_std)
    want = torch.tensor(loop_group_advantages(rewards.tolist(), group_size, normalize_std), dtype=torch.float64)
    assert_close(got, want)


def test_group_advantages_hand_case():
    # group [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(1/3); group [1, 1, 1, 1]: all zero
    got = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]), 4)
    s = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert_close(got, torch.tensor([s, -s, -s, s, 0.0, 0.0, 0.0, 0.0]))
    dr = group_advantages([3.0, 1.0], 2, normalize_std=False)
    assert_close(dr, torch.tensor([1.0, -1.0]))
    assert torch.equal(group_advantages([5.0, -2.0], 1), torch.zeros(2))


def test_group_advantages_rejects_partial_group():
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(torch.ones(6), 4)


def test_reinforce_baseline_advantages(randn):
    rewards = randn(12)
    want = torch.tensor(loop_group_advantages(rewards.tolist(), 3, normalize_std=False), dtype=torch.float64)
    assert_close(reinforce_baseline_advantages(rewards, 3), want)
    assert_close(reinforce_baseline_advantages([2.0, 0.0, 1.0], 3), torch.tensor([1.0, -1.0, 0.0]))


# ---------------------------------------------------------------- discounted returns

@pytest.mark.parametrize("holes", [False, True])
@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.0])
def test_discounted_returns_matches_loop(randn, make_mask, holes, gamma):
    rewards, mask = randn(6, 9), make_mask(6, 9, holes=holes)
    got = discounted_returns(rewards, mask, gamma)
    want = torch.tensor(loop_discounted_returns(rewards.tolist(), mask.tolist(), gamma), dtype=torch.float64)
    assert_close(got, want)


def test_discounted_returns_hand_case():
    r = torch.tensor([[1.0, 2.0, 3.0, 99.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    # G2 = 3, G1 = 2 + 0.5*3 = 3.5, G0 = 1 + 0.5*3.5 = 2.75; the padded 99 is ignored
    assert_close(discounted_returns(r, m, 0.5), torch.tensor([[2.75, 3.5, 3.0, 0.0]]))


def test_discounted_returns_padding_invariance(randn, make_mask):
    rewards, mask = randn(5, 7), make_mask(5, 7)
    base = discounted_returns(rewards, mask, 0.95)
    padded = discounted_returns(torch.cat([rewards, randn(5, 4)], 1), torch.cat([mask, torch.zeros(5, 4).double()], 1), 0.95)
    assert_close(padded[:, :7], base)
    assert torch.equal(padded[:, 7:], torch.zeros(5, 4, dtype=torch.float64))


# ---------------------------------------------------------------- GAE

@pytest.mark.parametrize("holes", [False, True])
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.5, 0.0)])
def test_gae_matches_loop(randn, make_mask, holes, gamma, lam):
    rewards, values, mask = randn(6, 10), randn(6, 10), make_mask(6, 10, holes=holes)
    adv, ret = gae(rewards, values, mask, gamma, lam)
    want = torch.tensor(loop_gae(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam), dtype=torch.float64)
    assert_close(adv, want)
    assert_close(ret, adv + values)


def test_gae_three_tokens_by_hand():
    # r = [0, 0, 1], V = [0.5, 0.6, 0.7], gamma = 0.9, lam = 0.8
    # delta2 = 1 - 0.7 = 0.3                 A2 = 0.3
    # delta1 = 0.9*0.7 - 0.6 = 0.03          A1 = 0.03 + 0.72*0.3 = 0.246
    # delta0 = 0.9*0.6 - 0.5 = 0.04          A0 = 0.04 + 0.72*0.246 = 0.21712
    r = torch.tensor([[0.0, 0.0, 1.0, 5.0, 5.0]], dtype=torch.float64)
    v = torch.tensor([[0.5, 0.6, 0.7, 9.0, 9.0]], dtype=torch.float64)
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    adv, ret = gae(r, v, m, 0.9, 0.8)
    assert_close(adv, torch.tensor([[0.21712, 0.246, 0.3, 0.0, 0.0]], dtype=torch.float64))
    assert_close(ret[:, :3], torch.tensor([[0.71712, 0.846, 1.0]], dtype=torch.float64))


def test_gae_skips_a_masked_tool_token():
    # the masked middle token is transparent: token 0 bootstraps from token 2's value
    r = torch.tensor([[0.0, 7.0, 1.0]], dtype=torch.float64)
    v = torch.tensor([[0.2, 3.0, 0.4]], dtype=torch.float64)
    m = torch.tensor([[1.0, 0.0, 1.0]], dtype=torch.float64)
    adv, _ = gae(r, v, m, 1.0, 1.0)
    assert_close(adv, torch.tensor([[1.0 - 0.2, 0.0, 1.0 - 0.4]], dtype=torch.float64))


def test_gae_padding_invariance(randn, make_mask):
    rewards, values, mask = randn(4, 6), randn(4, 6), make_mask(4, 6)
    adv, ret = gae(rewards, values, mask, 0.99, 0.95)
    z = torch.zeros(4, 3, dtype=torch.float64)
    adv_p, ret_p = gae(torch.cat([rewards, randn(4, 3)], 1), torch.cat([values, randn(4, 3)], 1),
                       torch.cat([mask, z], 1), 0.99, 0.95)
    assert_close(adv_p[:, :6], adv)
    assert_close(ret_p[:, :6], ret)
    assert torch.equal(adv_p[:, 6:], z)


# ---------------------------------------------------------------- whitening

@pytest.mark.parametrize("shift_mean", [True, False])
def test_masked_whiten_matches_loop(randn, make_mask, shift_mean):
    x, mask = randn(5, 8) * 3 + 2, make_mask(5, 8, min_len=2, holes=True)
    mask[0, 0] = mask[0, 1] = 1.0  # at least two valid entries
    got = masked_whiten(x, mask, shift_mean=shift_mean)
    want = torch.tensor(loop_whiten(x.tolist(), mask.tolist(), shift_mean), dtype=torch.float64)
    assert_close(got, want)
    valid = mask.bool()
    if shift_mean:
        assert abs(got[valid].mean().item()) < 1e-10
        assert abs(got[valid].std().item() - 1.0) < 1e-6


def test_masked_whiten_hand_case_and_padding():
    x = torch.tensor([[1.0, 3.0, 100.0]], dtype=torch.float64)
    m = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    # mean 2, unbiased var 2: (x - 2) / sqrt(2)
    got = masked_whiten(x, m, eps=0.0)
    assert_close(got[:, :2], torch.tensor([[-1.0, 1.0]], dtype=torch.float64) / math.sqrt(2))
    with pytest.raises(ValueError, match="no entries"):
        masked_whiten(x, torch.zeros_like(m))


def test_whiten_from_moments_equals_masked_whiten_split_across_ranks(randn, make_mask):
    """Two 'ranks' summing their moments whiten exactly like one rank holding the whole batch."""
    x, mask = randn(6, 5), make_mask(6, 5, min_len=2)
    moments = masked_moments(x[:3], mask[:3]) + masked_moments(x[3:], mask[3:])  # the all_reduce(SUM)
    joined = torch.cat([whiten_from_moments(x[:3], moments), whiten_from_moments(x[3:], moments)])
    assert_close(joined, masked_whiten(x, mask))

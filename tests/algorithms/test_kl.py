"""KL estimators: formulas against plain loops, hand values, sign properties, unbiasedness."""
import math

import pytest
import torch
from torch.testing import assert_close

from slime_like.algorithms import kl_penalty


def loop_kl(logp, ref, kind):
    out = []
    for a, b in zip(logp, ref):
        d = a - b
        if kind == "k1":
            out.append(d)
        elif kind == "k2":
            out.append(0.5 * d * d)
        elif kind == "k3":
            out.append(math.exp(-d) + d - 1)
        else:  # low_var_kl
            c = min(max(b - a, -20.0), 20.0)
            out.append(min(max(math.exp(c) - c - 1, -10.0), 10.0))
    return out


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "low_var_kl"])
def test_kl_matches_loop(randn, kind):
    logp, ref = randn(4, 7) - 1, randn(4, 7) - 1
    got = kl_penalty(logp, ref, kind)
    want = torch.tensor(loop_kl(logp.flatten().tolist(), ref.flatten().tolist(), kind), dtype=torch.float64)
    assert got.shape == logp.shape
    assert_close(got.flatten(), want)


def test_kl_hand_values():
    logp = torch.tensor([math.log(0.5)], dtype=torch.float64)
    ref = torch.tensor([math.log(0.25)], dtype=torch.float64)
    # log_ratio = log 2; k3 = 1/2 + log 2 - 1
    assert_close(kl_penalty(logp, ref, "k1"), torch.tensor([math.log(2)], dtype=torch.float64))
    assert_close(kl_penalty(logp, ref, "k2"), torch.tensor([0.5 * math.log(2) ** 2], dtype=torch.float64))
    assert_close(kl_penalty(logp, ref, "k3"), torch.tensor([0.5 + math.log(2) - 1], dtype=torch.float64))


def test_low_var_kl_clamps():
    logp = torch.tensor([0.0, 0.0, 0.0], dtype=torch.float64)
    ref = torch.tensor([50.0, 3.0, -100.0], dtype=torch.float64)
    got = kl_penalty(logp, ref, "low_var_kl")
    # ref - logp = 50 -> clamp 20 -> huge -> 10; = 3 -> e^3 - 4 = 16.08 -> 10; = -100 -> -20 -> e^-20 + 19 -> 10
    assert torch.equal(got, torch.full((3,), 10.0, dtype=torch.float64))
    assert torch.isfinite(kl_penalty(torch.zeros(1), torch.tensor([1e4]), "low_var_kl")).all()


@pytest.mark.parametrize("kind", ["k2", "k3", "low_var_kl"])
def test_kl_nonnegative(randn, kind):
    logp, ref = randn(64, 33) * 3, randn(64, 33) * 3
    logp[0, :3] = ref[0, :3]  # exact zeros of the log-ratio
    got = kl_penalty(logp, ref, kind)
    assert (got >= 0).all()
    assert torch.equal(got[0, :3], torch.zeros(3, dtype=torch.float64))


def test_k1_can_be_negative(randn):
    assert (kl_penalty(randn(100), randn(100), "k1") < 0).any()


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_unbiased_estimators_match_true_kl_on_a_sampled_categorical(kind):
    """E_{x ~ pi}[k(x)] = KL(pi || ref) for k1 and k3: the sample mean is within 5 standard errors."""
    gen = torch.Generator().manual_seed(7)
    logits_p, logits_q = torch.randn(12, generator=gen, dtype=torch.float64), torch.randn(12, generator=gen, dtype=torch.float64)
    logp_all, logq_all = torch.log_softmax(logits_p, -1), torch.log_softmax(logits_q, -1)
    true_kl = (logp_all.exp() * (logp_all - logq_all)).sum()
    x = torch.multinomial(logp_all.exp(), 200_000, replacement=True, generator=gen)
    k = kl_penalty(logp_all[x], logq_all[x], kind)
    stderr = k.std() / math.sqrt(k.numel())
    assert abs(k.mean() - true_kl) < 5 * stderr, (k.mean().item(), true_kl.item(), stderr.item())
    assert true_kl > 0.1  # the two distributions really differ, so the check has teeth


def test_kl_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="must match"):
        kl_penalty(torch.zeros(2, 3), torch.zeros(2, 4), "k1")

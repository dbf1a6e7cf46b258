"""policy_loss (ppo / gspo, asymmetric + dual clip), tis_weights, value_loss, sft_loss, aggregate_loss:
plain loops, hand cases, clipping gradients, GSPO == PPO at equal ratios, padding invariance, gradcheck."""
import math

import pytest
import torch
from torch.testing import assert_close

from slime_like import algorithms as alg
from slime_like.algorithms import aggregate_loss, policy_loss, sft_loss, tis_weights, value_loss

F64 = torch.float64


# ---------------------------------------------------------------- plain-loop references

def loop_token_loss(ratio, adv, eps, eps_high, eps_c):
    l1 = -adv * ratio
    l2 = -adv * min(max(ratio, 1 - eps), 1 + eps_high)
    loss = max(l1, l2)
    if eps_c is not None and adv < 0:
        loss = min(loss, -adv * eps_c)
    return loss


def loop_policy_loss(logp, old, adv, mask, eps, eps_high, eps_c, kind):
    out = [[0.0] * len(row) for row in logp]
    for b in range(len(logp)):
        valid = [t for t, m in enumerate(mask[b]) if m]
        if kind == "gspo" and valid:
            seq_ratio = math.exp(sum(logp[b][t] - old[b][t] for t in valid) / len(valid))
        for t in valid:
            ratio = seq_ratio if kind == "gspo" else math.exp(logp[b][t] - old[b][t])
            out[b][t] = loop_token_loss(ratio, adv[b][t], eps, eps_high, eps_c)
    return out


def loop_aggregate(loss, mask, mode):
    if mode in ("token-mean", "sum"):
        total = sum(l for row, mrow in zip(loss, mask) for l, m in zip(row, mrow) if m)
        count = sum(m for mrow in mask for m in mrow)
        return total if mode == "sum" else total / count
    per_seq = []
    for row, mrow in zip(loss, mask):
        vals = [l for l, m in zip(row, mrow) if m]
        if vals:
            per_seq.append(sum(vals) / len(vals) if mode == "seq-mean-token-mean" else sum(vals))
    return sum(per_seq) / len(per_seq)


def batch(randn, make_mask, b=6, t=9, spread=0.3, holes=False):
    logp = -torch.rand(b, t, dtype=F64) * 3
    old = logp + randn(b, t) * spread
    return logp, old, randn(b, t), make_mask(b, t, holes=holes)


# ---------------------------------------------------------------- policy loss

@pytest.mark.parametrize("kind", ["ppo", "gspo"])
@pytest.mark.parametrize("eps,eps_high,eps_c", [(0.2, None, None), (0.2, 0.28, None), (0.1, 0.3, 3.0)])
def test_policy_loss_matches_loop(randn, make_mask, kind, eps, eps_high, eps_c):
    logp, old, adv, mask = batch(randn, make_mask, spread=0.5 if kind == "ppo" else 0.1, holes=True)
    loss, metrics = policy_loss(logp, old, adv, mask, eps, eps_high, eps_c, kind=kind)
    want = loop_policy_loss(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), eps,
                            eps if eps_high is None else eps_high, eps_c, kind)
    assert_close(loss, torch.tensor(want, dtype=F64))
    valid = mask.bool()
    assert_close(metrics["approx_kl"], (old - logp)[valid].mean())
    if kind == "ppo":
        ratio = (logp - old).exp()
        assert_close(metrics["ratio_max"], ratio[valid].max())
        hi = 1 + (eps if eps_high is None else eps_high)
        clipped = ((adv > 0) & (ratio > hi)) | ((adv < 0) & (ratio < 1 - eps))
        assert_close(metrics["clipfrac"], clipped[valid].double().mean())


def test_policy_loss_hand_case():
    # ratios e^0 = 1, e^0.5 = 1.6487, e^-0.5 = 0.6065, e^2 = 7.389 (for the dual clip)
    logp = torch.tensor([[0.0, 0.5, -0.5, 2.0]], dtype=F64)
    old = torch.zeros(1, 4, dtype=F64)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=F64)
    mask = torch.ones(1, 4, dtype=F64)
    loss, m = policy_loss(logp, old, adv, mask, eps_clip=0.2, eps_clip_high=0.3, eps_clip_c=3.0)
    # tok0: -1; tok1: max(-1.6487, -1.3) = -1.3; tok2: max(0.6065, 0.8) = 0.8; tok3: min(max(7.389, 1.3), 3) = 3
    assert_close(loss, torch.tensor([[-1.0, -1.3, 0.8, 3.0]], dtype=F64))
    assert_close(m["clipfrac"], torch.tensor(0.5, dtype=F64))
    assert_close(m["clipfrac_dual"], torch.tensor(0.25, dtype=F64))
    assert_close(m["ratio_max"], torch.tensor(math.exp(2.0), dtype=F64))


@pytest.mark.parametrize("eps_c", [None, 3.0])
def test_gradient_vanishes_exactly_where_clipping_is_active(randn, make_mask, eps_c):
    logp, old, adv, mask = batch(randn, make_mask, b=8, t=16, spread=1.5, holes=True)
    logp.requires_grad_(True)
    loss, _ = policy_loss(logp, old, adv, mask, 0.2, 0.28, eps_c)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    ratio = (logp - old).exp().detach()
    active = ((adv > 0) & (ratio > 1.28)) | ((adv < 0) & (ratio < 0.8))
    if eps_c is not None:
        active |= (adv < 0) & (ratio > eps_c)
    valid = mask.bool()
    assert active[valid].any() and (~active)[valid].any()  # both regimes are exercised
    assert torch.equal(grad[active | ~valid], torch.zeros_like(grad[active | ~valid]))
    free = valid & ~active
    assert_close(grad[free], (-adv * ratio)[free])  # d(-A r)/d logp = -A r where unclipped


@pytest.mark.parametrize("per_token_adv", [True, False])
def test_gspo_equals_ppo_when_every_token_has_the_same_ratio(randn, make_mask, per_token_adv):
    logp, _, adv, mask = batch(randn, make_mask, holes=True)
    old = logp.detach() - randn(logp.shape[0], 1) * 0.3         # one log-ratio per sequence
    if not per_token_adv:
        adv = randn(logp.shape[0], 1).expand_as(logp).contiguous()  # one advantage per sequence
    logp_ppo, logp_gspo = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    loss_ppo, m_ppo = policy_loss(logp_ppo, old, adv, mask, 0.2, 0.25, 3.0, kind="ppo")
    loss_gspo, m_gspo = policy_loss(logp_gspo, old, adv, mask, 0.2, 0.25, 3.0, kind="gspo")
    assert_close(loss_gspo, loss_ppo)
    for key in ("clipfrac", "approx_kl", "ratio_max"):
        assert_close(m_gspo[key], m_ppo[key])
    for mode in ("token-mean", "seq-mean-token-mean"):
        g_ppo = torch.autograd.grad(aggregate_loss(policy_loss(logp_ppo, old, adv, mask, 0.2, kind="ppo")[0], mask, mode), logp_ppo)[0]
        g_gspo = torch.autograd.grad(aggregate_loss(policy_loss(logp_gspo, old, adv, mask, 0.2, kind="gspo")[0], mask, mode), logp_gspo)[0]
        assert_close(g_gspo, g_ppo)


def test_gspo_gradient_equals_the_sequence_level_objective(randn, make_mask):
    """With one advantage per sequence, GSPO-token's gradient is that of -min(s A, clip(s) A),
    s = exp(mean_t(logp - old)) differentiated through the mean (GSPO paper)."""
    logp, old, _, mask = batch(randn, make_mask, spread=0.1)
    adv = randn(logp.shape[0], 1).expand_as(logp).contiguous()
    x1, x2 = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    g_impl = torch.autograd.grad(aggregate_loss(policy_loss(x1, old, adv, mask, 0.05, kind="gspo")[0], mask,
                                                "seq-mean-token-mean"), x1)[0]
    n = mask.sum(-1)
    s = torch.exp(((x2 - old) * mask).sum(-1) / n)
    a = adv[:, 0]
    direct = torch.maximum(-a * s, -a * s.clamp(0.95, 1.05)).mean()
    g_direct = torch.autograd.grad(direct, x2)[0]
    assert_close(g_impl, g_direct)


@pytest.mark.parametrize("kind", ["ppo", "gspo"])
def test_policy_loss_padding_invariance(randn, make_mask, kind):
    logp, old, adv, mask = batch(randn, make_mask)
    pad = lambda x, fill: torch.cat([x, fill], 1)  # noqa: E731
    garbage = randn(logp.shape[0], 4) * 50  # anything in padded slots, even huge log-ratios
    loss, m = policy_loss(logp, old, adv, mask, 0.2, kind=kind)
    loss_p, m_p = policy_loss(pad(logp, garbage), pad(old, -garbage), pad(adv, garbage),
                              pad(mask, torch.zeros_like(garbage)), 0.2, kind=kind)
    assert_close(loss_p[:, :-4], loss)
    assert torch.equal(loss_p[:, -4:], torch.zeros_like(garbage))
    for key in m:
        assert_close(m_p[key], m[key])


def test_policy_loss_bad_arguments():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="eps-clip-c"):
        policy_loss(x, x, x, torch.ones(2, 3), 0.2, eps_clip_c=0.5)
    with pytest.raises(ValueError, match="'ppo', 'gspo'"):
        policy_loss(x, x, x, torch.ones(2, 3), 0.2, kind="grpo")
    with pytest.raises(ValueError, match="shape"):
        policy_loss(x, x, torch.zeros(2, 4), torch.ones(2, 3), 0.2)


# ---------------------------------------------------------------- TIS, value, SFT

def test_tis_weights_match_loop(randn, make_mask):
    old, rollout, mask = randn(4, 6) * 0.5, randn(4, 6) * 0.5, make_mask(4, 6)
    old.requires_grad_(True)
    w = tis_weights(old, rollout, mask, clip_high=2.0, clip_low=0.5)
    assert not w.requires_grad
    for b in range(4):
        for t in range(6):
            want = min(max(math.exp(old[b, t].item() - rollout[b, t].item()), 0.5), 2.0) if mask[b, t] else 0.0
            assert w[b, t].item() == pytest.approx(want, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("value_clip", [None, 0.2])
def test_value_loss_matches_loop(randn, make_mask, value_clip):
    values, old, returns, mask = randn(5, 7), randn(5, 7), randn(5, 7), make_mask(5, 7)
    loss, metrics = value_loss(values, old, returns, mask, value_clip, with_metrics=True)
    want, n_clipped = torch.zeros(5, 7, dtype=F64), 0
    for b in range(5):
        for t in range(7):
            if not mask[b, t]:
                continue
            v, o, r = values[b, t].item(), old[b, t].item(), returns[b, t].item()
            un = (v - r) ** 2
            if value_clip is None:
                want[b, t] = 0.5 * un
            else:
                vc = o + min(max(v - o, -value_clip), value_clip)
                want[b, t] = 0.5 * max(un, (vc - r) ** 2)
                n_clipped += (vc - r) ** 2 > un
    assert_close(loss, want)
    assert_close(metrics["value_clipfrac"], torch.tensor(n_clipped / mask.sum().item(), dtype=F64))
    # hand case: v=1, old=0, R=0, clip 0.5: max(1, 0.25) -> 0.5 * 1;  v=-1, old=0, R=-2: max(1, 2.25) -> 1.125
    hand = value_loss(torch.tensor([1.0, -1.0]), torch.zeros(2), torch.tensor([0.0, -2.0]), torch.ones(2), 0.5)
    assert_close(hand, torch.tensor([0.5, 1.125]))


def test_sft_loss(randn, make_mask):
    logp, mask = -randn(3, 5).abs(), make_mask(3, 5)
    got = sft_loss(logp, mask)
    assert_close(got, -logp * mask)
    assert_close(aggregate_loss(got, mask, "token-mean"), -(logp * mask).sum() / mask.sum())


# ---------------------------------------------------------------- aggregation

@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "sum"])
def test_aggregate_loss_matches_loop_and_ignores_padding(randn, make_mask, mode):
    loss, mask = randn(6, 8), make_mask(6, 8, holes=True)
    mask[0] = 0.0  # an empty row: no contribution, not counted as a sequence
    mask[1, 0] = 1.0
    got = aggregate_loss(loss, mask, mode)
    assert_close(got, torch.tensor(loop_aggregate(loss.tolist(), mask.tolist(), mode), dtype=F64))
    padded = aggregate_loss(torch.cat([loss, randn(6, 3) * 1e3], 1), torch.cat([mask, torch.zeros(6, 3, dtype=F64)], 1), mode)
    assert_close(padded, got)


def test_aggregate_loss_hand_case_and_bad_mode():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate_loss(loss, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate_loss(loss, mask, "sum").item() == pytest.approx(10)
    with pytest.raises(ValueError, match="Did you mean 'token-mean'"):
        aggregate_loss(loss, mask, "token_mean")


# ---------------------------------------------------------------- gradcheck

@pytest.mark.parametrize("kind", ["ppo", "gspo"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_policy_loss_gradcheck(make_mask, kind, mode):
    """GSPO gets one advantage per sequence (as grpo-style rewards arrive): only then is the
    GSPO-token gradient the derivative of the loss value, see losses._gspo_log_ratio."""
    gen = torch.Generator().manual_seed(3)
    logp = (-torch.rand(3, 5, generator=gen, dtype=F64) * 2).requires_grad_(True)
    # ratios inside (1 - eps, 1 + eps) or far outside: no kink within gradcheck's finite-difference step
    shift = torch.tensor([0.05, -0.05, 0.6, -0.6, 0.0], dtype=F64)
    old = (logp.detach() + shift)
    adv = torch.randn(3, 5, generator=gen, dtype=F64)
    if kind == "gspo":
        adv = adv[:, :1].expand(3, 5).contiguous()
        old = logp.detach() + torch.tensor([[0.05], [-0.6], [0.6]], dtype=F64)  # sequence ratios off the kinks
    mask = make_mask(3, 5, min_len=2)
    fn = lambda x: aggregate_loss(policy_loss(x, old, adv, mask, 0.2, 0.3, 3.0, kind=kind)[0], mask, mode)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (logp,))


def test_value_and_sft_loss_gradcheck(randn, make_mask):
    values = randn(3, 4).requires_grad_(True)
    old, returns, mask = randn(3, 4), randn(3, 4), make_mask(3, 4)
    assert torch.autograd.gradcheck(lambda v: aggregate_loss(value_loss(v, old, returns, mask, 10.0), mask, "sum"), (values,))
    logp = randn(3, 4).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: aggregate_loss(sft_loss(x, mask), mask, "seq-mean-token-sum"), (logp,))


# ---------------------------------------------------------------- CISPO and OPSM (slime / verl parity)
def _ragged(seed=0, lengths=(5, 3, 7)):
    g = torch.Generator().manual_seed(seed)
    n, T = len(lengths), max(lengths)
    mask = torch.zeros(n, T)
    for i, L in enumerate(lengths):
        mask[i, :L] = 1
    logp = -torch.rand(n, T, generator=g) * 2
    old = logp + torch.randn(n, T, generator=g) * 0.6            # ratios well outside [0.8, 1.28]
    adv = torch.randn(n, 1, generator=g).expand(n, T).clone()     # one advantage per sequence (GRPO)
    return logp, old, adv, mask, lengths


def test_cispo_matches_slimes_flat_formula_and_keeps_clipped_gradients():
    logp, old, adv, mask, lengths = _ragged()
    logp = logp.requires_grad_(True)
    loss, metrics = alg.cispo_loss(logp, old, adv, mask, eps_clip=0.2, eps_clip_high=0.28)
    # slime's layout: the valid tokens concatenated; ppo_kl = old - new; weight = clamp(exp(-ppo_kl)) detached
    flat = lambda t: torch.cat([t[i, :L] for i, L in enumerate(lengths)])
    ref_kl = flat(old) - flat(logp.detach())
    ref_w = torch.clamp(torch.exp(-ref_kl), 1 - 0.2, 1 + 0.28)
    ref = -ref_w * flat(adv) * flat(logp.detach())
    assert torch.allclose(flat(loss.detach()), ref, atol=1e-6)
    assert torch.all(loss.detach()[mask == 0] == 0)
    clipped = (ref_w != torch.exp(-ref_kl)).float().mean()
    assert 0 < float(clipped) < 1 and torch.isclose(metrics["clipfrac"], clipped)
    loss.sum().backward()
    # d/dlogp = -sg(w) * A on every valid token: clipped tokens keep their gradient (PPO's clip would zero it)
    expected = torch.zeros_like(logp)
    for i, L in enumerate(lengths):
        expected[i, :L] = -torch.clamp(torch.exp(logp.detach()[i, :L] - old[i, :L]), 0.8, 1.28) * adv[i, :L]
    assert torch.allclose(logp.grad, expected, atol=1e-6)
    assert torch.all(logp.grad[mask.bool()] != 0)


def test_cispo_single_sided_and_through_policy_loss_kind():
    logp, old, adv, mask, _ = _ragged(1)
    one_sided, _ = alg.cispo_loss(logp, old, adv, mask, eps_clip=1.0, eps_clip_high=4.0)
    w = torch.clamp(torch.exp(logp - old), max=5.0) * mask        # no lower bound: 1 - 1.0 = 0
    assert torch.allclose(one_sided, -w * adv * logp * mask, atol=1e-6)
    via_kind, _ = alg.policy_loss(logp, old, adv, mask, 1.0, eps_clip_high=4.0, kind="cispo")
    assert torch.equal(via_kind, one_sided)
    assert alg.get_estimator("cispo").policy_loss_kind == "cispo"
    assert alg.get_estimator("cispo").group_step([1.0, 0.0], 2).tolist() == \
        alg.get_estimator("grpo").group_step([1.0, 0.0], 2).tolist()          # GRPO's advantages, as slime


def test_opsm_matches_slimes_per_sequence_rule():
    logp, old, adv, mask, lengths = _ragged(2, lengths=(6, 4, 5, 2))
    adv[0], adv[1], adv[2], adv[3] = -1.0, -1.0, 1.0, -0.5
    old[1, :4] = logp[1, :4] - 0.5 * 0     # sequence 1: on-policy (KL 0)
    old[0, :6] = logp[0, :6] + 0.3          # sequence 0: KL 0.3 > delta and A < 0 -> dropped
    old[2, :5] = logp[2, :5] + 0.3          # sequence 2: off-policy but A > 0 -> kept
    old[3, :2] = logp[3, :2] + 0.3          # sequence 3: dropped
    keep, dropped = alg.opsm_mask(logp, old, adv, mask, delta=1e-4)
    for i, L in enumerate(lengths):        # slime: seq_kl = sum((old - new) * m) / max(sum(m), 1)
        seq_kl = ((old[i, :L] - logp[i, :L]).sum() / L)
        want = 0.0 if (adv[i, 0] < 0 and seq_kl > 1e-4) else 1.0
        assert keep[i, :L].tolist() == [want] * L and torch.all(keep[i, L:] == 0), i
    assert torch.isclose(dropped, torch.tensor(8 / 17))
    # through the loss: the dropped sequences contribute nothing
    pg, _ = alg.policy_loss(logp, old, adv, mask, 0.2)
    assert torch.all((pg * keep)[0] == 0) and torch.all((pg * keep)[2, :5] == pg[2, :5])

"""--loss-agg-mode / --loss-micro-batch-mean / --early-stop-imp-ratio / --reward-scale against plain references."""
import torch

from slime_like import algorithms as alg


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = [3, 7, 1, 5, 4, 6]
    loss = torch.randn(len(lengths), 8, generator=g)
    mask = torch.zeros(len(lengths), 8)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    mask[1, 2] = 0  # a tool token inside a response
    return loss, mask


def _reference(loss, mask, mode):
    """Plain Python over the responses of the whole step."""
    rows = [[loss[i, t].item() for t in range(loss.shape[1]) if mask[i, t]] for i in range(loss.shape[0])]
    rows = [r for r in rows if r]
    if mode == "token-mean":
        return sum(sum(r) for r in rows) / sum(len(r) for r in rows)
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    if mode == "seq-mean-token-sum-norm":  # Dr. GRPO: token sums over the fixed horizon 8, averaged
        return sum(sum(r) / 8 for r in rows) / len(rows)
    return sum(sum(r) for r in rows) / len(rows)


def test_step_weights_split_over_micro_batches_equal_the_whole_step():
    loss, mask = _batch()
    tokens, seqs = mask.sum().item(), (mask.sum(-1) > 0).sum().item()
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        parts = [(loss[a:b], mask[a:b]) for a, b in ((0, 2), (2, 5), (5, 6))]  # uneven micro-batches
        total = sum((l * alg.step_token_weights(m, mode, tokens, seqs, horizon=8)).sum().item() for l, m in parts)
        assert abs(total - _reference(loss, mask, mode)) < 1e-5, mode
        if mode != "seq-mean-token-sum-norm":
            assert abs(total - alg.aggregate_loss(loss, mask, mode).item()) < 1e-5, mode


def test_micro_batch_mean_weighs_micro_batches_equally():
    """RLinf use_valid_token_scale false: mean over micro-batches of each one's own aggregate."""
    loss, mask = _batch(1)
    parts = [(loss[:2], mask[:2]), (loss[2:], mask[2:])]
    for mode in ("token-mean", "seq-mean-token-mean"):
        ours = sum((l * alg.step_token_weights(m, mode, m.sum().item(), (m.sum(-1) > 0).sum().item())).sum().item()
                   for l, m in parts) / len(parts)
        assert abs(ours - sum(_reference(l, m, mode) for l, m in parts) / 2) < 1e-5
    assert abs(ours - _reference(loss, mask, "seq-mean-token-mean")) > 1e-3  # a different objective indeed


def test_importance_ratio_early_stop():
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    old = torch.zeros(1, 3)
    logp = torch.tensor([[0.0, 1.0, 50.0]])  # ratios 1 and e; the masked 50 must not count
    assert alg.importance_ratio_exceeds(logp, old, mask, 1.8)            # mean (1 + e) / 2 = 1.86
    assert not alg.importance_ratio_exceeds(logp, old, mask, 1.9)
    assert not alg.importance_ratio_exceeds(logp, old, mask, None)
    assert not alg.importance_ratio_exceeds(logp, old, torch.zeros(1, 3), 0.5)


def test_reward_scale_maps_binary_rewards_to_plus_minus_scale():
    from slime_like.args import make_args
    from slime_like.rollout.batch import _rewards
    from slime_like.sample import Sample

    args = make_args(reward_scale=5.0, advantage_estimator="reinforce_plus_plus", reward_key=None,
                           custom_reward_post_process_path=None, rewards_normalization=False,
                           grpo_std_normalization=False, n_samples_per_prompt=2, kl_coef=0.0)
    group = [Sample(prompt="p", reward=1.0, group_index=0), Sample(prompt="p", reward=0.0, group_index=0)]
    raw, shaped = _rewards(args, [group])
    assert raw == [1.0, 0.0] and shaped == [5.0, -5.0]

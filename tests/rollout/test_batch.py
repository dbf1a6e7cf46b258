"""The trainer batch: group step per estimator, dict rewards, DP split (strided and token-balanced)."""

import pytest
import torch

from slime_like.args import make_args
from slime_like.rollout.batch import BATCH_KEYS, split_for_dp, to_train_batch
from slime_like.sample import Sample, Status


def _samples(rewards, group_size, lengths=None):
    out = []
    for i, r in enumerate(rewards):
        n = (lengths or [2] * len(rewards))[i]
        out.append(Sample(index=i, group_index=i // group_size, tokens=[7, 8] + [3] * n, response_length=n,
                          loss_mask=[1] * n, rollout_log_probs=[-0.5] * n, reward=r,
                          status=Status.TRUNCATED if i == 0 else Status.COMPLETED))
    return out


def _args(est, **kw):
    return make_args(advantage_estimator=est, grpo_std_normalization=kw.pop("std", True), rewards_normalization=True,
                     reward_key=kw.pop("reward_key", None))


def test_grpo_group_normalisation():
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    b = to_train_batch(_args("grpo"), _samples(rewards, 3))
    assert set(b) == set(BATCH_KEYS) and b["raw_rewards"] == rewards
    g = torch.tensor(rewards).view(2, 3)
    expected = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-6)).view(-1)
    assert b["rewards"] == pytest.approx(expected.tolist())
    assert b["truncated"] == [1, 0, 0, 0, 0, 0] and b["sample_indices"] == list(range(6))
    assert b["tokens"][0] == [7, 8, 3, 3] and b["loss_masks"][0] == [1, 1]
    no_std = to_train_batch(_args("gspo", std=False), _samples(rewards, 3))
    assert no_std["rewards"] == pytest.approx((g - g.mean(1, keepdim=True)).view(-1).tolist())


def test_baseline_and_raw_estimators():
    rewards = [2.0, 0.0, 5.0, 5.0]
    assert to_train_batch(_args("reinforce_plus_plus_baseline"), _samples(rewards, 2))["rewards"] == [1.0, -1.0, 0, 0]
    for est in ("ppo", "reinforce_plus_plus"):
        assert to_train_batch(_args(est), _samples(rewards, 2))["rewards"] == rewards


def test_dict_rewards_use_reward_key():
    rewards = [{"score": 1.0, "acc": True}, {"score": -1.0, "acc": False}]
    b = to_train_batch(_args("ppo", reward_key="score"), _samples(rewards, 2))
    assert b["raw_rewards"] == [1.0, -1.0]
    with pytest.raises(ValueError, match="--reward-key"):
        to_train_batch(_args("ppo"), _samples(rewards, 2))


def test_inconsistent_sample_rejected():
    s = _samples([1.0, 0.0], 2)
    s[1].loss_mask = [1]
    with pytest.raises(ValueError, match="sample 1"):
        to_train_batch(_args("grpo"), s)


def test_split_whole_samples_strided_and_balanced():
    lengths = [10, 1, 1, 1, 9, 2, 1, 7]
    b = to_train_batch(_args("ppo"), _samples([0.0] * 8, 2, lengths))
    shards = split_for_dp(b, 2)
    assert shards[0]["sample_indices"] == [0, 2, 4, 6] and shards[1]["sample_indices"] == [1, 3, 5, 7]
    balanced = split_for_dp(b, 2, balance=True)
    assert sorted(i for sh in balanced for i in sh["sample_indices"]) == list(range(8))
    assert all(len(sh["tokens"]) == 4 for sh in balanced)
    loads = [sum(len(t) for t in sh["tokens"]) for sh in balanced]
    strided = [sum(len(t) for t in sh["tokens"]) for sh in shards]
    assert max(loads) - min(loads) <= max(strided) - min(strided) and max(loads) - min(loads) <= 10
    for sh in balanced:                      # every column moved together
        for i, idx in enumerate(sh["sample_indices"]):
            assert len(sh["tokens"][i]) == 2 + lengths[idx]
    with pytest.raises(ValueError, match="multiple of the DP size"):
        split_for_dp(b, 3)


def test_custom_reward_post_process_hook():
    args = _args("grpo")
    args.custom_reward_post_process_path = "rollout.hooks_for_tests.post_process_double"
    b = to_train_batch(args, _samples([1.0, 0.0, 3.0, 3.0], 2))
    assert b["raw_rewards"] == [1.0, 0.0, 3.0, 3.0] and b["rewards"] == [2.0, 0.0, 6.0, 6.0]


def test_reward_category_shares():
    from slime_like.rollout.controller import category_metrics

    samples = _samples([{"score": 1.0, "why": "ok"}, {"score": -1.0, "why": "format"},
                        {"score": -1.0, "why": "format"}, {"score": 1.0, "why": "ok"}], 2)
    m = category_metrics(make_args(log_reward_category="why"), samples)
    assert m == {"rollout/why/format": 0.5, "rollout/why/ok": 0.5}


def test_samples_without_rollout_log_probs():
    """slime's tau-bench returns no log-probs: the batch leaves the column out (the trainer scores the samples
    itself); a batch mixing both, or a flag reading them, is an error naming why."""
    samples = _samples([1.0, 0.0], 2)
    for s in samples:
        s.rollout_log_probs = []
    b = to_train_batch(_args("grpo"), samples)
    assert "rollout_log_probs" not in b and b["loss_masks"] == [[1, 1], [1, 1]]
    samples[0].rollout_log_probs = [-0.5, -0.5]
    with pytest.raises(ValueError, match="sample 1 .* has no rollout_log_probs while other samples of the batch do"):
        to_train_batch(_args("grpo"), samples)
    samples[0].rollout_log_probs = None
    args = _args("grpo")
    args.use_tis = True
    with pytest.raises(ValueError, match="--use-tis read the engine's log-probs, but the samples have no"):
        to_train_batch(args, samples)

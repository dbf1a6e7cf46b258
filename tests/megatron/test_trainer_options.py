"""slime's trainer options that change an update: --reset-optimizer-states and --use-unbiased-kl.

Each case runs in a fresh spawned process (mcore's parallel state is global); the effect is checked on
what the option is for: the size of Adam's step after a reset, the value of the KL term off-policy.
"""
import pytest
import torch
from _dist import run_ranks
from test_trainer_common import make_args, make_batch

LR = 1e-3


def _trainer(ckpt, rank, world_size, port, *flags):
    from slime_like.args import role_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    return MegatronTrainer(role_args(make_args(ckpt, *flags), "actor"), role="actor", rank=rank,
                           world_size=world_size, master_port=port)


def _params(t):
    return [p.detach().clone() for chunk in t.chunks for p in chunk.parameters()]


def reset_case(rank, world_size, port, ckpt, reset):
    """Two rollouts of one Adam step each; the relative size of the second step's parameter changes."""
    flags = ["--lr", str(LR), "--global-batch-size", "8", "--micro-batch-size", "4", "--adam-eps", "1e-12"]
    t = _trainer(ckpt, rank, world_size, port, *flags, *(["--reset-optimizer-states"] if reset else []))
    for rollout in range(2):
        batch = make_batch(8, seed=40 + rollout)
        batch.update(t.compute_advantages(batch))
        before = _params(t)
        t.train_step(rollout, batch)
    delta = torch.cat([(a - b).abs().reshape(-1) for a, b in zip(_params(t), before)])
    moved = delta[delta > LR * 1e-3]
    # A fresh Adam's first step moves every parameter with a gradient by exactly lr (m/sqrt(v) = sign(g)).
    return float(((moved - LR).abs() < LR * 1e-2).float().mean())


def test_reset_optimizer_states_makes_each_rollout_start_a_fresh_adam(tiny_ckpt):
    fresh_like = run_ranks(reset_case, 1, tiny_ckpt, True)[0]
    carried = run_ranks(reset_case, 1, tiny_ckpt, False)[0]
    assert fresh_like > 0.99, fresh_like      # after the reset: the first-step size lr everywhere
    assert carried < 0.5, carried             # with the history kept, Adam's second step is not sign(g) * lr


def kl_case(rank, world_size, port, ckpt, unbiased):
    flags = ["--lr", "3e-3", "--global-batch-size", "8", "--micro-batch-size", "4",
             "--use-kl-loss", "--kl-loss-coef", "0.1", "--kl-loss-type", "k3", "--ref-load", ckpt]
    t = _trainer(ckpt, rank, world_size, port, *flags, *(["--use-unbiased-kl"] if unbiased else []))
    batch = make_batch(8, seed=5)
    batch["rewards"] = [1.0 if i % 4 else -1.0 for i in range(8)]  # both steps see nonzero advantages
    batch.update(t.compute_log_probs(batch))
    batch.update(t.compute_advantages(batch))
    first = t.train_step(0, batch)
    second = t.train_step(1, batch)   # a second rollout on the same old log-probs: pi != pi_old now
    return first["kl_loss"], second["kl_loss"]


def test_unbiased_kl_weights_the_kl_term_by_the_importance_ratio(tiny_ckpt):
    plain = run_ranks(kl_case, 1, tiny_ckpt, False)[0]
    unbiased = run_ranks(kl_case, 1, tiny_ckpt, True)[0]
    # step 1 of rollout 0 runs on the weights that scored the batch (ratio 1): the same KL value
    assert unbiased[0] == pytest.approx(plain[0], rel=1e-4, abs=1e-9)
    assert plain[1] > 0
    # later steps are off-policy: the ratio-weighted estimate differs
    assert abs(unbiased[1] - plain[1]) > 1e-3 * plain[1], (plain, unbiased)


def old_actor_case(rank, world_size, port, ckpt):
    """--keep-old-actor: log-probs of each sample from the pushed weights of its version, not the current ones."""
    t = _trainer(ckpt, rank, world_size, port, "--lr", "1e-2", "--global-batch-size", "8", "--micro-batch-size", "4",
                 "--keep-old-actor")
    batch = make_batch(8, seed=70)
    v0 = t.compute_log_probs(batch)["log_probs"]            # nothing pushed yet: the current weights
    t.remember_pushed_weights(0)                              # the engines now generate with these
    batch.update(t.compute_advantages(batch))
    t.train_step(0, batch)                                    # the trainer moves on
    assert t.old_log_probs_needed()
    stale = dict(batch, weight_versions=[0] * 8)
    from_v0 = t.compute_log_probs(stale)["log_probs"]
    t.remember_pushed_weights(1)
    mixed = dict(batch, weight_versions=[0, 1] * 4)
    from_mixed = t.compute_log_probs(mixed)["log_probs"]
    current = t._forward_only(t.model, batch, "logp")         # the trainer's own weights are back in place
    return v0, from_v0, from_mixed, current


def test_keep_old_actor_scores_each_sample_with_the_weights_that_generated_it(tiny_ckpt):
    v0, from_v0, mixed, current = run_ranks(old_actor_case, 1, tiny_ckpt)[0]
    for a, b in zip(from_v0, v0):
        torch.testing.assert_close(a, b)                      # exactly the pushed version-0 weights
    assert max(float((a - b).abs().max()) for a, b in zip(current, v0)) > 1e-3  # the trainer did move
    for i, lp in enumerate(mixed):                            # per sample: version 0 or the version-1 push
        torch.testing.assert_close(lp, v0[i] if i % 2 == 0 else current[i])

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

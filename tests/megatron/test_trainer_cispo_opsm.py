"""--advantage-estimator cispo and --use-opsm in the Megatron trainer (one spawned rank each): CISPO moves
probabilities by the advantage's sign with GRPO's advantages; OPSM drops exactly the negative-advantage sequences
whose mean log-ratio to the old policy exceeds --opsm-delta (here the engine's log-probs are the old policy)."""
import pytest
from _dist import run_ranks
from test_trainer_common import make_args, make_batch, response_logprob_sums

FLAGS = ["--lr", "3e-3", "--global-batch-size", "8", "--micro-batch-size", "4"]


def _trainer(ckpt, rank, world_size, port, *flags):
    from slime_like.args import role_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    return MegatronTrainer(role_args(make_args(ckpt, *FLAGS, *flags), "actor"), role="actor", rank=rank,
                           world_size=world_size, master_port=port)


def cispo_case(rank, world_size, port, ckpt):
    t = _trainer(ckpt, rank, world_size, port, "--advantage-estimator", "cispo", "--eps-clip", "1.0",
                 "--eps-clip-high", "4.0")
    batch = make_batch(8, seed=11)
    batch.update(t.compute_log_probs(batch))
    before = response_logprob_sums(batch["log_probs"], batch)
    batch.update(t.compute_advantages(batch))
    metrics = t.train_step(0, batch)
    after = response_logprob_sums(t.compute_log_probs(batch)["log_probs"], batch)
    return before, after, metrics, sorted({round(float(a[0]), 4) for a in batch["advantages"]})


def test_cispo_follows_the_advantage_sign(tiny_ckpt):
    before, after, metrics, adv = run_ranks(cispo_case, 1, tiny_ckpt)[0]
    assert adv == [-1.0, 1.0]                                   # GRPO's group-normalised advantages
    assert after[0] > before[0] + 1e-3 and after[1] < before[1] - 1e-3
    assert metrics["clipfrac"] == 0.0 and metrics["grad_norm"] > 0   # on-policy: ratio 1, nothing clipped


def opsm_case(rank, world_size, port, ckpt, delta):
    t = _trainer(ckpt, rank, world_size, port, "--use-opsm", "--opsm-delta", str(delta), "--use-rollout-logprobs")
    batch = make_batch(8, seed=12)     # engine log-probs near -4.0; the tiny model's near log(1/vocab) = -4.85
    batch.update(t.compute_advantages(batch))
    metrics = t.train_step(0, batch)
    negative = sum(len(m) for m, r in zip(batch["loss_masks"], batch["rewards"]) if r < 0)
    return metrics, negative / sum(len(m) for m in batch["loss_masks"])


@pytest.mark.parametrize("delta, dropped_all_negative", [(1e-4, True), (100.0, False)])
def test_opsm_drops_the_off_policy_negative_sequences(tiny_ckpt, delta, dropped_all_negative):
    metrics, negative_share = run_ranks(opsm_case, 1, tiny_ckpt, delta)[0]
    want = negative_share if dropped_all_negative else 0.0
    assert metrics["opsm_clipfrac"] == pytest.approx(want, abs=1e-6)

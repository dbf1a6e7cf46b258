"""--use-stateless-adam (slime's): Adam without moments kept between steps, so every step is a fresh Adam's first,
lr * g / (|g| + eps) per element: each weight that has a gradient moves by (almost exactly) the learning rate.
Ordinary Adam's second step moves by lr * m_hat / (sqrt(v_hat) + eps), which is not lr for most weights."""
import pytest
import torch
from _dist import run_ranks
from test_trainer_common import make_batch
from test_trainer_single import _trainer

LR = 1e-3


def steps_case(rank, world_size, port, ckpt, stateless):
    flags = ["--lr", str(LR), "--global-batch-size", "8", "--micro-batch-size", "4", "--num-steps-per-rollout", "1",
             "--weight-decay", "0", "--no-save-optim"] + (["--use-stateless-adam"] if stateless else [])
    t = _trainer(ckpt, rank, world_size, port, *flags)
    batch = make_batch(8, seed=1)
    batch.update(t.compute_log_probs(batch))
    batch.update(t.compute_advantages(batch))
    at_lr = []
    for step in range(2):
        before = [p.detach().clone() for c in t.chunks for p in c.parameters()]
        t.train_step(step, batch)
        moved = torch.cat([(p.detach() - b).abs().flatten() for c in t.chunks for p, b in zip(c.parameters(), before)])
        moved = moved[moved > 0]
        at_lr.append(((moved - LR).abs() < 0.01 * LR).float().mean().item())  # share moving by lr (+-1 %)
    return at_lr


@pytest.mark.slow
def test_stateless_adam_moves_every_weight_by_the_learning_rate(tiny_ckpt):
    stateless = run_ranks(steps_case, 1, tiny_ckpt, True)[0]
    adam = run_ranks(steps_case, 1, tiny_ckpt, False)[0]
    assert stateless[0] > 0.9 and adam[0] > 0.9, (stateless, adam)  # the first step is the same for both
    assert stateless[1] > 0.9, stateless  # and so is every later one without moments
    assert adam[1] < 0.5, adam  # Adam's second step carries the first step's moments

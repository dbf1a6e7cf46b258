"""Issue 19, finding 6 (trainer side): a non-finite gradient is never applied, and no checkpoint is written
from non-finite weights. One real CPU megatron-core rank in a spawned process."""
import math

import torch
from _dist import run_ranks
from test_trainer_common import make_args, make_batch


def nonfinite_case(rank, world_size, port, ckpt, save_dir):
    from slime_like.args import role_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    # slime's recipes pass --no-check-for-nan-in-loss-and-grad: megatron-core's own check (which stops the run)
    # is off, and our check skips the step instead
    args = make_args(ckpt, "--lr", "1e-2", "--global-batch-size", "8", "--micro-batch-size", "4",
                     "--num-steps-per-rollout", "1", "--save", save_dir, "--no-check-for-nan-in-loss-and-grad")
    t = MegatronTrainer(role_args(args, "actor"), role="actor", rank=rank, world_size=world_size, master_port=port)
    batch = make_batch(8, seed=1)
    batch.update(t.compute_log_probs(batch))
    batch.update(t.compute_advantages(batch))
    before = [p.detach().clone() for c in t.model for p in c.parameters()]
    poisoned = dict(batch, advantages=[a.clone() for a in batch["advantages"]])
    poisoned["advantages"][0][0] = float("nan")
    bad = t.train_step(0, poisoned)
    unchanged = all(torch.equal(b, p) for b, p in zip(before, (p for c in t.model for p in c.parameters())))
    good = t.train_step(1, batch)
    moved = not all(torch.equal(b, p) for b, p in zip(before, (p for c in t.model for p in c.parameters())))
    with torch.no_grad():
        next(p for c in t.model for p in c.parameters()).view(-1)[0] = float("inf")
    try:
        t.save(2)
        refused = ""
    except RuntimeError as e:
        refused = str(e)
    return {"bad": bad, "good": good, "unchanged": unchanged, "moved": moved, "refused": refused}


def test_nonfinite_gradient_step_is_skipped_and_nonfinite_weights_are_not_saved(tiny_ckpt, tmp_path):
    out = run_ranks(nonfinite_case, 1, tiny_ckpt, str(tmp_path / "ckpt"))[0]
    assert out["bad"]["nonfinite_steps"] == 1.0 and out["bad"]["skipped"] == 1.0
    assert out["unchanged"], "a NaN gradient step changed the weights"
    assert out["good"]["nonfinite_steps"] == 0.0 and math.isfinite(out["good"]["grad_norm"]) and out["moved"]
    assert "refusing to save rollout 2" in out["refused"]
    assert not (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").exists()

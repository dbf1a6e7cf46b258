"""The FSDP trainer projects only the response-scoring positions through lm_head (issue 26, memory): log-probs,
the step's metrics (loss, entropy, KL) and the update equal the whole-output path, padded rows and packed rows,
with a KL loss against the reference (scored the same way) and an entropy term."""
import pytest
from _fsdp_common import flat, make_args, make_batch, run_ranks

pytestmark = pytest.mark.slow
# SGD: the update is lr x gradient, so equal weights after a step mean equal gradients
FLAGS = ["--lr", "1e-2", "--micro-batch-size", "2", "--global-batch-size", "8", "--optimizer", "sgd",
         "--use-kl-loss", "--kl-loss-coef", "0.1", "--entropy-coef", "0.01"]
PACKED = ["--use-dynamic-batch-size", "--max-tokens-per-gpu", "64"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("resp_tiny")
    # a reference other than the actor, so the KL term and its gradient are not zero
    return (build_tiny_checkpoint(str(root / "actor"), init_std=0.1),
            build_tiny_checkpoint(str(root / "ref"), seed=1, init_std=0.1))


def step_rank(rank, world_size, port, ckpt, responses_only, flags):
    from slime_like.backends.fsdp.trainer import FSDPTrainer

    FSDPTrainer.project_responses_only = responses_only
    actor, ref = ckpt
    t = FSDPTrainer(make_args(actor, *FLAGS, "--load", actor, "--ref-load", ref, *flags), "actor", rank, world_size, master_port=port)
    batch = make_batch(8, seed=3)
    batch.update(t.compute_log_probs(batch, old_policy=True))
    batch.update(t.compute_advantages(batch))
    out = {"log_probs": batch["log_probs"], "ref_log_probs": batch.get("ref_log_probs")}
    out["metrics"] = t.train_step(0, batch)
    out["weights"] = {n: w.clone() for n, w in t.iter_hf_weights()}
    return out


@pytest.mark.parametrize("flags", [[], PACKED], ids=["padded", "packed"])
def test_response_positions_only_equal_the_whole_output(ckpt, flags):
    only = run_ranks(step_rank, 1, ckpt, True, flags)[0]
    whole = run_ranks(step_rank, 1, ckpt, False, flags)[0]
    assert (flat(only["log_probs"]) - flat(whole["log_probs"])).abs().max().item() < 1e-6
    assert only["ref_log_probs"] is not None
    assert (flat(only["ref_log_probs"]) - flat(whole["ref_log_probs"])).abs().max().item() < 1e-6
    for key in ("loss", "pg_loss", "entropy", "kl_loss", "grad_norm"):
        assert only["metrics"][key] == pytest.approx(whole["metrics"][key], rel=1e-6, abs=1e-7), key
    assert abs(only["metrics"]["kl_loss"]) > 1e-3 and only["metrics"]["entropy"] > 0.1
    worst = max((only["weights"][n] - whole["weights"][n]).abs().max().item() for n in whole["weights"])
    assert worst < 1e-8, worst  # SGD lr 1e-2: gradients equal to 1e-6


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_re_pointed_micro_batch_keeps_the_sequence_positions(packed):
    """response_positions_only: output[rows, cols] of the kept positions is output[rows, cols] of the whole output,
    and the hooks' total_lengths (read from the positions) do not change."""
    import torch
    from slime_like.backends.training import data as D
    from slime_like.backends.training.micro_batch import response_positions_only
    from slime_like.backends.training.hooks import total_lengths

    batch = make_batch(6, seed=2)
    mb = D.build_micro_batch(batch, list(range(6)), packed)
    only = response_positions_only(mb)
    whole = torch.randn(*mb.tokens.shape, 5)
    kept = torch.take_along_dim(whole, only.logit_positions[..., None], dim=1)  # what transformers' lm_head sees
    # a packed row keeps its valid scoring positions (sum of the response lengths), padded rows Rmax each
    assert kept.shape[1] == (int(mb.valid.sum()) if packed else mb.cols.shape[1])
    valid = mb.valid.bool()  # padding slots point at any kept position (their loss mask is 0)
    assert torch.equal(kept[only.rows, only.cols][valid], whole[mb.rows, mb.cols][valid])
    assert total_lengths(only) == total_lengths(mb) == [len(t) for t in batch["tokens"]]

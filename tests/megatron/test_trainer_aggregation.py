"""--loss-agg-mode, --loss-micro-batch-mean and --early-stop-imp-ratio in the real Megatron trainer (one CPU rank).

The step-level aggregate does not depend on how the step is cut into micro-batches; seq-mean-token-mean is a
different objective than token-mean; an early-stopped micro-batch leaves the weights where they were."""
import pytest
import torch
from _dist import run_ranks
from test_trainer_common import flat, make_args, make_batch


def _one_update(ckpt, rank, world_size, port, batch, *flags):
    from slime_like.args import role_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    args = make_args(ckpt, "--lr", "1e-2", "--global-batch-size", "8", "--optimizer", "sgd", "--sgd-momentum", "0",
                     *flags)
    t = MegatronTrainer(role_args(args, "actor"), role="actor", rank=rank, world_size=world_size, master_port=port)
    b = dict(batch)
    b.update(t.compute_log_probs(b))
    b.update(t.compute_advantages(b))
    metrics = t.train_step(0, b)
    return {"metrics": metrics, "log_probs": t.compute_log_probs(batch)["log_probs"], "old": b["log_probs"]}


def aggregation_case(rank, world_size, port, ckpt):
    batch = make_batch(8, seed=5, with_holes=True)
    runs = {"seq_mb4": ("--loss-agg-mode", "seq-mean-token-mean", "--micro-batch-size", "4"),
            "seq_mb1": ("--loss-agg-mode", "seq-mean-token-mean", "--micro-batch-size", "1"),
            "token_mb4": ("--micro-batch-size", "4"),
            "mbmean_mb4": ("--loss-micro-batch-mean", "--micro-batch-size", "4"),
            "stopped": ("--micro-batch-size", "4", "--early-stop-imp-ratio", "0.5")}
    return {name: _one_update(ckpt, rank, world_size, port, batch, *flags) for name, flags in runs.items()}


def test_aggregation_modes_and_early_stop(tiny_ckpt):
    out = run_ranks(aggregation_case, 1, tiny_ckpt)[0]
    seq4, seq1, tok = out["seq_mb4"], out["seq_mb1"], out["token_mb4"]
    torch.testing.assert_close(flat(seq4["log_probs"]), flat(seq1["log_probs"]), atol=2e-5, rtol=1e-5)
    assert seq4["metrics"]["grad_norm"] == pytest.approx(seq1["metrics"]["grad_norm"], rel=1e-4)
    assert abs(seq4["metrics"]["grad_norm"] - tok["metrics"]["grad_norm"]) > 1e-4  # another objective
    assert abs(out["mbmean_mb4"]["metrics"]["grad_norm"] - tok["metrics"]["grad_norm"]) > 1e-6
    assert tok["metrics"]["early_stopped_frac"] == 0.0
    stopped = out["stopped"]  # the first step's ratio is exactly 1 > 0.5: every micro-batch is dropped
    assert stopped["metrics"]["early_stopped_frac"] == pytest.approx(1.0)
    assert stopped["metrics"]["grad_norm"] == pytest.approx(0.0, abs=1e-9)
    torch.testing.assert_close(flat(stopped["log_probs"]), flat(stopped["old"]), atol=1e-6, rtol=0)
    assert (flat(tok["log_probs"]) - flat(tok["old"])).abs().max() > 1e-3


def reference_case(rank, world_size, port, ckpt):
    """The reference as its own worker (placed apart) gives the ref log-probs the actor computes inside itself."""
    from slime_like.args import role_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    batch = make_batch(8, seed=7)
    args = make_args(ckpt, "--use-kl-loss", "--kl-loss-coef", "0.01", "--ref-load", ckpt, "--micro-batch-size", "4",
                     "--global-batch-size", "8")
    inside = MegatronTrainer(role_args(args, "actor"), role="actor", rank=rank, world_size=world_size,
                             master_port=port).compute_log_probs(batch)["ref_log_probs"]
    worker = MegatronTrainer(role_args(args, "actor"), role="reference", rank=rank, world_size=world_size,
                             master_port=port)
    args.reference_worker = True
    actor = MegatronTrainer(role_args(args, "actor"), role="actor", rank=rank, world_size=world_size, master_port=port)
    return {"inside": inside, "worker": worker.compute_log_probs(batch), "worker_opt": worker.optimizer,
            "actor_ref": actor.ref_model, "actor_out": sorted(actor.compute_log_probs(batch))}


def test_reference_worker_matches_the_in_actor_reference(tiny_ckpt):
    out = run_ranks(reference_case, 1, tiny_ckpt)[0]
    assert set(out["worker"]) == {"ref_log_probs"} and out["worker_opt"] is None
    torch.testing.assert_close(flat(out["worker"]["ref_log_probs"]), flat(out["inside"]), atol=0, rtol=0)
    assert out["actor_ref"] is None and out["actor_out"] == ["log_probs"]  # the actor no longer builds one

"""TP=2, DP=2 (distributed optimizer) and PP=2 trainers match the single-rank trainer (2 gloo ranks each).

The same 8-sample rollout, the same flags: old log-probs, DP-global advantage whitening, two Adam steps
(metrics and the resulting log-probs). Under DP each rank holds half the samples; the token-mean loss
and the all-reduced whitening moments make the update identical to one rank holding all of them.
"""
import pytest
import torch
from _dist import run_ranks
from test_trainer_common import concat_lists, flat, make_args, make_batch, shard

pytestmark = pytest.mark.slow

REWARDS = [0.5, 1.0, 1.5, 2.0, -1.0, -2.0, 0.0, 3.0]  # the two DP halves have different statistics


def parallel_case(rank, world_size, port, ckpt, tp, pp, extra):
    from slime_like.args import role_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    args = make_args(ckpt, "--actor-num-gpus-per-node", world_size, "--tensor-model-parallel-size", tp,
                     "--pipeline-model-parallel-size", pp, "--global-batch-size", 8, "--micro-batch-size", 2,
                     "--lr", "2e-3", "--normalize-advantages", "--clip-grad", "1.0", *extra)
    t = MegatronTrainer(role_args(args, "actor"), role="actor", rank=rank, world_size=world_size, master_port=port)
    dp, dp_rank = t.ps.get_data_parallel_world_size(), t.ps.get_data_parallel_rank()
    full = make_batch(8, seed=5, with_holes=True)
    full["rewards"] = list(REWARDS)
    batch = shard(full, dp, dp_rank)
    batch.update(t.compute_log_probs(batch))
    batch.update(t.compute_advantages(batch))
    metrics = [t.train_step(i, batch) for i in range(2)]
    return {"dp": dp, "dp_rank": dp_rank, "tp_rank": t.ps.get_tensor_model_parallel_rank(),
            "pp_rank": t.ps.get_pipeline_model_parallel_rank(), "old": batch["log_probs"],
            "adv": batch["advantages"], "metrics": metrics, "new": t.compute_log_probs(batch)["log_probs"]}


def _gather_dp(results):
    """Batch-order per-sample lists from the DP shares (one representative rank per DP rank)."""
    reps = sorted({r["dp_rank"]: r for r in results}.values(), key=lambda r: r["dp_rank"])
    return {key: concat_lists([r[key] for r in reps]) for key in ("old", "adv", "new")}


@pytest.fixture(scope="module")
def single(tiny_ckpt):
    return run_ranks(parallel_case, 1, tiny_ckpt, 1, 1, ())[0]


# PP=2 also packs (variable-length micro-batches between stages: mcore's variable_seq_lengths p2p path)
@pytest.mark.parametrize("tp,pp,extra", [(2, 1, ()), (1, 1, ("--use-distributed-optimizer",)),
                                         (1, 2, ("--use-dynamic-batch-size", "--max-tokens-per-gpu", "30"))],
                         ids=["tp2", "dp2-distopt", "pp2-packed"])
def test_parallel_matches_single_rank(tiny_ckpt, single, tp, pp, extra):
    results = run_ranks(parallel_case, 2, tiny_ckpt, tp, pp, extra)
    assert results[0]["dp"] == 2 // (tp * pp)
    got = _gather_dp(results)
    torch.testing.assert_close(flat(got["old"]), flat(single["old"]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(flat(got["adv"]), flat(single["adv"]), atol=1e-5, rtol=1e-5)
    for step, ref in enumerate(single["metrics"]):
        for r in results:  # every rank returns the same, DP-averaged dict
            for key in ("loss", "pg_loss", "entropy", "grad_norm", "tokens", "lr", "clipfrac"):
                assert r["metrics"][step][key] == pytest.approx(ref[key], rel=1e-4, abs=1e-5), (step, key)
    torch.testing.assert_close(flat(got["new"]), flat(single["new"]), atol=1e-4, rtol=1e-4)
    assert (flat(single["new"]) - flat(single["old"])).abs().max() > 1e-3  # the two steps did move the model


def test_dp_global_whitening_is_not_local(single):
    """With --normalize-advantages the advantages are whitened over all 8 samples' valid tokens."""
    from slime_like import algorithms as alg

    full = make_batch(8, seed=5, with_holes=True)
    pad = lambda rows: torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)  # noqa: E731  right-padded [B, T]
    mask = pad([torch.tensor(m, dtype=torch.float32) for m in full["loss_masks"]])
    raw = torch.tensor(REWARDS)[:, None] * mask
    expected = alg.masked_whiten(raw, mask) * mask
    got = pad(single["adv"])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)

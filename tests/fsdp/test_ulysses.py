"""Ulysses sequence parallelism in the FSDP trainer (--context-parallel-size 2 with --train-backend fsdp,
backends/fsdp/ulysses.py): two real gloo ranks, each running half of every sequence through the decoder, give the
log-probs, reference log-probs, loss, entropy, KL, grad norm and weights after one optimizer step of one rank
without it (fp32, 1e-5), on samples of different lengths (odd lengths: the rows are padded to a multiple of 2).
Also: fewer KV heads than ranks (the KV heads are repeated), recompute / token budgets / Adam, DP 2 x SP 2, LoRA
and the critic. The refusals and ROLL's ulysses_size: tests/config/test_fsdp_ulysses.py; the whole loop:
tests/loop/test_fsdp_loop.py::test_fsdp_ulysses_sequence_parallel_scores_like_the_engine."""
import pytest
from _fsdp_common import concat_lists, flat, make_args, make_batch, run_ranks, shard

pytestmark = pytest.mark.slow
# SGD: the update is lr x gradient, so equal weights after a step mean equal gradients (Adam's first step would
# hide a gradient scale); a KL reference other than the actor and an entropy term, so every loss term has a gradient
FLAGS = ["--lr", "1e-2", "--micro-batch-size", "2", "--global-batch-size", "8", "--optimizer", "sgd",
         "--use-kl-loss", "--kl-loss-coef", "0.1", "--entropy-coef", "0.01"]
TOL = 1e-5


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("ulysses_tiny")
    return {"gqa": (build_tiny_checkpoint(str(root / "actor"), init_std=0.1),  # 4 query heads, 2 KV heads
                    build_tiny_checkpoint(str(root / "ref"), seed=1, init_std=0.1)),
            "one_kv_head": (build_tiny_checkpoint(str(root / "actor1"), arch="qwen3", num_kv_heads=1, init_std=0.1),
                            build_tiny_checkpoint(str(root / "ref1"), arch="qwen3", num_kv_heads=1, seed=1,
                                                  init_std=0.1))}


def actor_rank(rank, world_size, port, ckpt, sp, flags=()):
    from slime_like.backends.fsdp.trainer import FSDPTrainer

    actor, ref = ckpt
    args = make_args(actor, *FLAGS, "--load", actor, "--ref-load", ref, "--context-parallel-size", str(sp),
                     "--actor-num-gpus-per-node", str(world_size), *flags)
    t = FSDPTrainer(args, "actor", rank, world_size, master_port=port)
    batch = shard(make_batch(8, seed=3), world_size // sp, rank // sp)  # the SP ranks of a DP rank share its data
    batch.update(t.compute_log_probs(batch, old_policy=True))
    batch.update(t.compute_advantages(batch))
    out = {"log_probs": batch["log_probs"], "ref_log_probs": batch["ref_log_probs"], "info": t.parallel_info()}
    out["metrics"] = t.train_step(0, batch)
    out["weights"] = {n: w.clone() for n, w in t.iter_hf_weights()}  # rank 0 yields
    out["after"] = t.compute_log_probs(batch)["log_probs"]
    return out


@pytest.mark.parametrize("name", ["gqa", "one_kv_head"])
def test_sp2_equals_sp1_log_probs_loss_and_one_step(ckpts, name):
    one = run_ranks(actor_rank, 1, ckpts[name], 1)[0]
    two = run_ranks(actor_rank, 2, ckpts[name], 2)
    assert [r["info"]["dp_rank"] for r in two] == [0, 0] and [r["info"]["cp_rank"] for r in two] == [0, 1]
    for rank in two:
        for key in ("log_probs", "ref_log_probs", "after"):
            assert (flat(rank[key]) - flat(one[key])).abs().max().item() < TOL, key
    for key in ("loss", "pg_loss", "entropy", "kl_loss", "grad_norm"):
        assert two[0]["metrics"][key] == pytest.approx(one["metrics"][key], rel=TOL, abs=TOL), key
    assert two[1]["metrics"] == two[0]["metrics"]
    assert abs(one["metrics"]["kl_loss"]) > 1e-3 and one["metrics"]["grad_norm"] > 1e-2
    assert two[0]["weights"].keys() == one["weights"].keys() and not two[1]["weights"]
    worst = max((two[0]["weights"][n] - one["weights"][n]).abs().max().item() for n in one["weights"])
    assert worst < TOL * 1e-2, worst  # SGD lr 1e-2: gradients equal to 1e-5
    assert (flat(one["after"]) - flat(one["log_probs"])).abs().max().item() > 1e-3  # the step moved the policy


def test_sp2_equals_sp1_with_recompute_token_budgets_and_adam(ckpts):
    """Activation recompute (the all-to-alls run again in backward), token-budget micro-batches, a reduce-scatter per
    micro-batch and Adam: still one rank's step."""
    flags = ["--recompute-granularity", "full", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "32",
             "--no-fsdp-defer-grad-sync", "--optimizer", "adam"]
    one = run_ranks(actor_rank, 1, ckpts["gqa"], 1, flags)[0]
    two = run_ranks(actor_rank, 2, ckpts["gqa"], 2, flags)
    for key in ("log_probs", "after"):
        assert (flat(two[1][key]) - flat(one[key])).abs().max().item() < TOL, key
    for key in ("loss", "kl_loss", "grad_norm"):
        assert two[0]["metrics"][key] == pytest.approx(one["metrics"][key], rel=TOL, abs=TOL), key
    worst = max((two[0]["weights"][n] - one["weights"][n]).abs().max().item() for n in one["weights"])
    assert worst < TOL, worst  # Adam's first step is lr x sign-like: near-zero gradients amplify rounding


def test_dp2_x_sp2_equals_dp2(ckpts):
    """Four ranks: two data-parallel replicas of two sequence-parallel ranks each, against two plain DP ranks."""
    dp = run_ranks(actor_rank, 2, ckpts["gqa"], 1)
    both = run_ranks(actor_rank, 4, ckpts["gqa"], 2)
    assert [(r["info"]["dp_rank"], r["info"]["cp_rank"], r["info"]["dp_size"]) for r in both] == \
        [(0, 0, 2), (0, 1, 2), (1, 0, 2), (1, 1, 2)]
    for key in ("log_probs", "ref_log_probs", "after"):
        for sp_rank in (0, 1):
            got = concat_lists([both[2 * d + sp_rank][key] for d in (0, 1)])
            assert (flat(got) - flat(concat_lists([r[key] for r in dp]))).abs().max().item() < TOL, key
    for key in ("loss", "entropy", "kl_loss", "grad_norm"):
        assert both[0]["metrics"][key] == pytest.approx(dp[0]["metrics"][key], rel=TOL, abs=TOL), key
    worst = max((both[0]["weights"][n] - dp[0]["weights"][n]).abs().max().item() for n in dp[0]["weights"])
    assert worst < TOL * 1e-2, worst


def test_sp2_lora_equals_sp1(ckpts):
    """LoRA: the adapters train under SP as without it (the reference is the base, adapters disabled)."""
    lora = ["--lora-rank", "4", "--lora-alpha", "8", "--ref-load", ckpts["gqa"][0]]
    one = run_ranks(actor_rank, 1, ckpts["gqa"], 1, lora)[0]
    two = run_ranks(actor_rank, 2, ckpts["gqa"], 2, lora)
    for key in ("log_probs", "ref_log_probs", "after"):
        assert (flat(two[1][key]) - flat(one[key])).abs().max().item() < TOL, key
    for key in ("loss", "grad_norm"):
        assert two[0]["metrics"][key] == pytest.approx(one["metrics"][key], rel=TOL, abs=TOL), key
    worst = max((two[0]["weights"][n] - one["weights"][n]).abs().max().item() for n in one["weights"])
    assert worst < TOL * 1e-2 and one["metrics"]["grad_norm"] > 1e-3, worst


def critic_rank(rank, world_size, port, ckpt, sp):
    from slime_like.backends.fsdp.trainer import FSDPTrainer

    args = make_args(ckpt[0], "--lr", "1e-2", "--micro-batch-size", "2", "--global-batch-size", "8", "--optimizer",
                     "sgd", "--advantage-estimator", "ppo", "--use-critic", "--context-parallel-size", str(sp),
                     "--actor-num-gpus-per-node", str(world_size))
    t = FSDPTrainer(args, "critic", rank, world_size, master_port=port)
    batch = make_batch(8, seed=5)
    batch.update(t.compute_values(batch))
    batch.update(t.compute_advantages(batch))
    return {"values": batch["values"], "metrics": t.train_step(0, batch), "after": t.compute_values(batch)["values"]}


def test_sp2_critic_equals_sp1(ckpts):
    one = run_ranks(critic_rank, 1, ckpts["gqa"], 1)[0]
    two = run_ranks(critic_rank, 2, ckpts["gqa"], 2)
    for rank in two:
        for key in ("values", "after"):
            assert (flat(rank[key]) - flat(one[key])).abs().max().item() < TOL, key
    for key in ("value_loss", "grad_norm"):
        assert two[0]["metrics"][key] == pytest.approx(one["metrics"][key], rel=TOL, abs=TOL), key
    assert (flat(one["after"]) - flat(one["values"])).abs().max().item() > 1e-4  # the step changed the values

"""--shared-prompt-training (issue 26, speed; backends/training/shared_prompt.py, backends/megatron/shared_prompt.py):
each group's prompt computed once per micro-batch gives the same old / reference log-probs, the same step metrics and
the same weights after an SGD step (so the same gradients) as ordinary rows, on real megatron-core with the tiny
Qwen2 checkpoint, with fewer input tokens (fixed micro-batches of whole or half groups, packed rows, TP=2, PP=2; PPO's
critic: values and its step); a group whose prompts differ stays unshared. The layout's mask and
positions are checked directly, and the flag's refusals at parse time and at launch."""
import random

import pytest
import torch
from _dist import run_ranks
from test_trainer_common import flat, make_args

# SGD without momentum: equal weights after a step mean equal gradients
FLAGS = ("--lr", "1e-2", "--optimizer", "sgd", "--sgd-momentum", "0", "--global-batch-size", "16",
         "--micro-batch-size", "4", "--use-kl-loss", "--kl-loss-coef", "0.1", "--entropy-coef", "0.01",
         "--normalize-advantages", "--n-samples-per-prompt", "4")
PACKED = ("--use-dynamic-batch-size", "--max-tokens-per-gpu", "40")


def grouped_batch(seed=7, n=4):
    """4 groups of n samples: three share their prompt (2, 5 and 7 tokens), the last one's prompts differ
    (each sample its own); responses of 1..6 tokens, a tool token (loss mask 0) in some."""
    g = random.Random(seed)
    b = {k: [] for k in ("tokens", "response_lengths", "loss_masks", "rewards", "raw_rewards", "rollout_log_probs",
                         "sample_indices", "truncated")}
    for group, p in enumerate((5, 2, 7, 4)):
        prompt = [g.randint(2, 90) for _ in range(p)]
        for k in range(n):
            if group == 3:
                prompt = [g.randint(2, 90) for _ in range(p)]  # a prompt of its own: stays an ordinary row
            r = g.randint(1, 6)
            b["tokens"].append(prompt + [g.randint(2, 90) for _ in range(r)])
            b["response_lengths"].append(r)
            b["loss_masks"].append([0 if (j == 1 and r > 2) else 1 for j in range(r)])
            b["rewards"].append(float(g.random() - 0.5))
            b["raw_rewards"].append(float(k % 2))
            b["rollout_log_probs"].append([-4.0 - 0.1 * g.random() for _ in range(r)])
            b["sample_indices"].append(len(b["sample_indices"]))
            b["truncated"].append(0)
    return b


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("shared_prompt_tiny")
    return (build_tiny_checkpoint(str(root / "actor"), init_std=0.1),
            build_tiny_checkpoint(str(root / "ref"), seed=1, init_std=0.1))


def step_rank(rank, world_size, port, ckpts, flags, split_groups=False):
    from slime_like.args import role_args
    from slime_like.backends.megatron import sdpa_attention
    from slime_like.backends.megatron.trainer import MegatronTrainer

    if split_groups:  # these rows are short: take the per-group attention calls that long rows take
        sdpa_attention.MIN_TOKENS_TO_SPLIT_GROUPS = 0

    actor, ref = ckpts
    args = make_args(actor, "--load", actor, "--ref-load", ref, *FLAGS, *flags)
    t = MegatronTrainer(role_args(args, "actor"), role="actor", rank=rank, world_size=world_size, master_port=port)
    tokens = []  # input tokens of every forward (embedding calls; rank 0 holds the first stage)
    if t.chunks[0].pre_process:
        t.chunks[0].embedding.register_forward_pre_hook(lambda m, a, kw: tokens.append(kw["input_ids"].numel()),
                                                        with_kwargs=True)
    batch = grouped_batch()
    batch.update(t.compute_log_probs(batch))
    batch.update(t.compute_advantages(batch))
    out = {"log_probs": batch["log_probs"], "ref_log_probs": batch["ref_log_probs"], "metrics": t.train_step(0, batch)}
    out["weights"] = {n: w.clone() for n, w in t.iter_hf_weights()}
    out["tokens"] = sum(tokens)
    return out


# name -> (ranks, flags, attention split at the groups as long rows do)
CASES = {"fixed": (1, (), False), "packed": (1, PACKED, False), "groups-split": (1, ("--micro-batch-size", "2"), False),
         "attention-per-group": (1, (), True),
         "tp2": (2, ("--actor-num-gpus-per-node", "2", "--tensor-model-parallel-size", "2"), False),
         "pp2-packed": (2, ("--actor-num-gpus-per-node", "2", "--pipeline-model-parallel-size", "2", *PACKED), False)}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_shared_prompt_step_equals_ordinary_rows(ckpts, case):
    world, extra, split = CASES[case]
    shared = run_ranks(step_rank, world, ckpts, ("--shared-prompt-training", *extra), split, timeout=480.0)[0]
    plain = run_ranks(step_rank, world, ckpts, extra, timeout=480.0)[0]
    for key in ("log_probs", "ref_log_probs"):
        assert (flat(shared[key]) - flat(plain[key])).abs().max().item() < 1e-5, key
    for key in ("loss", "pg_loss", "entropy", "kl_loss", "grad_norm"):
        assert shared["metrics"][key] == pytest.approx(plain["metrics"][key], rel=1e-5, abs=1e-6), key
    assert abs(plain["metrics"]["kl_loss"]) > 1e-4 and plain["metrics"]["entropy"] > 0.1
    worst = max((shared["weights"][n] - plain["weights"][n]).abs().max().item() for n in plain["weights"])
    assert worst < 1e-6, worst
    assert shared["tokens"] < plain["tokens"] * 0.8, (shared["tokens"], plain["tokens"])


def critic_rank(rank, world_size, port, ckpt, flags):
    """PPO's critic (the value head reads the same scoring columns): values and one SGD step."""
    from slime_like.args import role_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    args = make_args(ckpt, "--advantage-estimator", "ppo", "--use-critic", "--critic-num-gpus-per-node", 1,
                     "--gamma", 1.0, "--lambd", 1.0, "--value-clip", 0.5, *FLAGS[:6], "--global-batch-size", "16",
                     "--micro-batch-size", "4", "--n-samples-per-prompt", "4", *flags)
    critic = MegatronTrainer(role_args(args, "critic"), role="critic", rank=rank, world_size=world_size,
                             master_port=port)
    tokens = []
    critic.chunks[0].embedding.register_forward_pre_hook(lambda m, a, kw: tokens.append(kw["input_ids"].numel()),
                                                         with_kwargs=True)
    batch = grouped_batch()
    batch["rewards"] = list(batch["raw_rewards"])
    batch.update(critic.compute_values(batch))
    batch["log_probs"] = [torch.zeros(r) for r in batch["response_lengths"]]
    batch.update(critic.compute_advantages(batch))
    metrics = critic.train_step(0, batch)
    return {"values": batch["values"], "metrics": metrics, "tokens": sum(tokens),
            "weights": {n: w.clone() for n, w in critic.iter_hf_weights()}}


@pytest.mark.slow
def test_shared_prompt_critic_equals_ordinary_rows(ckpts):
    shared = run_ranks(critic_rank, 1, ckpts[0], ("--shared-prompt-training",), timeout=480.0)[0]
    plain = run_ranks(critic_rank, 1, ckpts[0], (), timeout=480.0)[0]
    assert (flat(shared["values"]) - flat(plain["values"])).abs().max().item() < 1e-5
    for key in ("value_loss", "grad_norm"):
        assert shared["metrics"][key] == pytest.approx(plain["metrics"][key], rel=1e-5, abs=1e-6), key
    assert plain["metrics"]["value_loss"] > 1e-4
    assert shared["tokens"] < plain["tokens"] * 0.8, (shared["tokens"], plain["tokens"])
    worst = max((shared["weights"][n] - plain["weights"][n]).abs().max().item() for n in plain["weights"])
    assert worst < 1e-6, worst


def test_layout_mask_positions_and_scoring_columns():
    from slime_like.backends.training.data import PackedBatch, build_micro_batch
    from slime_like.backends.training.shared_prompt import build_shared_micro_batch, prompt_units

    batch = {"tokens": [[1, 2, 3, 10, 11], [1, 2, 3, 20], [1, 2, 4, 30, 31]], "response_lengths": [2, 1, 2],
             "loss_masks": [[1, 1], [1], [1, 1]]}
    pb = PackedBatch(batch)
    assert prompt_units(pb, [0, 1, 2]) == [[0, 1], [2]]
    mb = build_shared_micro_batch(pb, [0, 1, 2])
    # row: prompt 1 2 3 | 10 11 | 20 || 1 2 4 | 30 31
    assert mb.tokens.tolist() == [[1, 2, 3, 10, 11, 20, 1, 2, 4, 30, 31]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 0, 1, 2, 3, 4]] and mb.per_token_positions
    allowed = ~mb.attention_mask[0, 0]
    assert allowed[5].nonzero().flatten().tolist() == [0, 1, 2, 5]  # sample 1's token: prompt + itself
    assert allowed[4].nonzero().flatten().tolist() == [0, 1, 2, 3, 4]
    assert allowed[9].nonzero().flatten().tolist() == [6, 7, 8, 9]  # the unshared sample: its own row part
    assert mb.cols.tolist() == [[2, 3], [2, 2], [8, 9]] and mb.targets.tolist() == [[10, 11], [20, 0], [30, 31]]
    plain = build_micro_batch(pb, [0, 1, 2], packed=True)
    assert torch.equal(mb.targets, plain.targets) and torch.equal(mb.loss_mask, plain.loss_mask)


def test_config_refusals_name_the_flag(tmp_path):
    from slime_like.config.errors import ConfigError
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    ckpt = build_tiny_checkpoint(str(tmp_path / "tiny"))
    with pytest.raises(ConfigError) as err:
        make_args(ckpt, "--shared-prompt-training", "--train-backend", "fsdp")
    assert "--shared-prompt-training with --train-backend fsdp" in str(err.value)
    with pytest.raises(ConfigError) as err:
        make_args(ckpt, "--shared-prompt-training", "--actor-num-gpus-per-node", "2", "--context-parallel-size", "2",
                  "--use-dynamic-batch-size", "--max-tokens-per-gpu", "64")
    assert "--context-parallel-size 2" in str(err.value)
    assert make_args(ckpt, "--shared-prompt-training").shared_prompt_training
    assert not make_args(ckpt).shared_prompt_training


def test_launch_refuses_transformer_engine():
    from types import SimpleNamespace

    from slime_like.backends.megatron.shared_prompt import launch_problems

    args = SimpleNamespace(multi_latent_attention=False, position_embedding_type="rope", hf_sparse_attention=None,
                           hf_linear_attention=None, spec=None)
    assert launch_problems(args, use_te=False, vision=False) == []
    problems = launch_problems(args, use_te=True, vision=False)
    assert len(problems) == 1 and "TransformerEngine" in problems[0] and "--shared-prompt-training" in problems[0]
    args.position_embedding_type = "yarn"
    assert "yarn" in launch_problems(args, use_te=False, vision=False)[0]


def test_sdpa_runs_a_shared_row_block_by_block():
    """The SDPA core attention splits a shared-prompt row at its groups (diagonal_blocks) and gets the same output
    as one masked call over the row."""
    import torch.nn.functional as F

    from slime_like.backends.megatron.sdpa_attention import diagonal_blocks
    from slime_like.backends.training.data import PackedBatch
    from slime_like.backends.training.micro_batch import block_causal_mask
    from slime_like.backends.training.shared_prompt import build_shared_micro_batch

    batch = grouped_batch()
    mb = build_shared_micro_batch(PackedBatch(batch), list(range(16)))
    blocks = diagonal_blocks(mb.attention_mask)
    units = [p + sum(batch["response_lengths"][4 * g:4 * g + 4]) for g, p in enumerate((5, 2, 7))]
    assert blocks[:3] == units and len(blocks) == 3 + 4  # 3 shared groups, then 4 ordinary samples
    assert diagonal_blocks(block_causal_mask([3, 2])) == [3, 2]
    crossing = block_causal_mask([3, 2]).clone()
    crossing[0, 0, 4, 1] = False
    assert diagonal_blocks(crossing) == [5]
    from types import SimpleNamespace

    from slime_like.backends.megatron.sdpa_attention import SDPADotProductAttention

    torch.manual_seed(0)
    s = mb.tokens.shape[1]
    q, k, v = (torch.randn(1, 2, s, 8) for _ in range(3))
    fake = SimpleNamespace(softmax_scale=None, _sdpa=lambda *a: SDPADotProductAttention._sdpa(fake, *a))
    whole = F.scaled_dot_product_attention(q, k, v, attn_mask=~mb.attention_mask)
    split = SDPADotProductAttention._blockwise(fake, q, k, v, mb.attention_mask, blocks, False)
    assert (whole - split).abs().max().item() < 1e-6

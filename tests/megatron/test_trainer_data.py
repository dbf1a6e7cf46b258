"""The trainer's batch plumbing and LR schedule, no processes: optimizer-step split, micro-batching, packing,
gather indices, the vocab-parallel log-prob / entropy math at TP=1, megatron's LR schedule from our flags."""
import math
import random

import pytest
import torch

from slime_like import args as A
from slime_like.backends.training import data as D
from slime_like.backends.training import loss as L
from slime_like.backends.megatron import optimizer as O


def _batch(n=6, seed=0, vocab=50):
    g = random.Random(seed)
    b = {"tokens": [], "response_lengths": [], "loss_masks": [], "rewards": []}
    for _ in range(n):
        p, r = g.randint(1, 6), g.randint(1, 5)
        b["tokens"].append([g.randint(2, vocab - 1) for _ in range(p + r)])
        b["response_lengths"].append(r)
        b["loss_masks"].append([g.choice([0, 1, 1]) for _ in range(r)])
        b["rewards"].append(g.random())
    return b


def test_validate_batch_names_the_problem():
    b = _batch()
    D.validate_batch(b)
    with pytest.raises(ValueError, match="advantages.*compute_advantages"):
        D.validate_batch(b, ("advantages",))
    bad = dict(b, loss_masks=[m + [1] for m in b["loss_masks"]])
    with pytest.raises(ValueError, match=r"sample 0: batch\['loss_masks'\] has"):
        D.validate_batch(bad)
    bad = dict(b, response_lengths=[len(t) for t in b["tokens"]])
    with pytest.raises(ValueError, match="response_length"):
        D.validate_batch(bad)


def test_split_steps_and_flag_mismatch():
    assert D.split_steps(8, 2, 8, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert D.split_steps(6, 3, None, 1) == [[0, 1], [2, 3], [4, 5]]
    # a custom generate may fan a prompt out into several samples: any count splits into near-equal steps
    assert D.split_steps(7, 2, 8, 1, exact=False) == [[0, 1, 2, 3], [4, 5, 6]]
    assert D.split_steps(8, 2, 8, 1, exact=False) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="--global-batch-size"):
        D.split_steps(8, 2, 6, 2)
    with pytest.raises(ValueError, match="not divisible by the data-parallel"):
        D.split_steps(8, 1, 7, 2)


def test_packing_never_splits_and_respects_budget():
    g = random.Random(1)
    lengths = [g.randint(1, 30) for _ in range(40)]
    bins = D.packed_micro_batches(list(range(40)), lengths, 40)
    assert sorted(i for b in bins for i in b) == list(range(40))  # every sample exactly once
    assert all(sum(lengths[i] for i in b) <= 40 for b in bins)
    assert len(bins) <= math.ceil(sum(lengths) / 40) + 3           # first-fit-decreasing is near-optimal
    with pytest.raises(ValueError, match="--max-tokens-per-gpu 40"):
        D.packed_micro_batches([0, 1], [10, 41], 40)


def test_block_causal_mask():
    m = D.block_causal_mask([2, 3])[0, 0]
    allowed = ~m
    assert allowed[1, 0] and allowed[4, 2] and allowed[4, 4]
    assert not allowed[2, 1] and not allowed[0, 1] and not allowed[3, 4]  # no cross-sample, no future


@pytest.mark.parametrize("packed", [False, True])
def test_gather_indices_point_at_the_logits_of_response_tokens(packed):
    b = _batch()
    ids = [1, 3, 4]
    mb = D.build_micro_batch(b, ids, packed=packed, field_keys=("rewards",))
    # a fake "model output" whose value at position p is the *next* input token: gathers must return targets
    nxt = torch.roll(mb.tokens, -1, dims=1)
    got = nxt[mb.rows, mb.cols]
    assert torch.equal(got * mb.valid.long(), mb.targets)
    for k, i in enumerate(ids):
        r = b["response_lengths"][i]
        assert mb.targets[k, :r].tolist() == b["tokens"][i][-r:]
        assert mb.loss_mask[k, :r].tolist() == b["loss_masks"][i]
    if packed:
        assert mb.tokens.shape == (1, sum(len(b["tokens"][i]) for i in ids))  # no padding at all
        assert mb.position_ids[0, len(b["tokens"][1])] == 0                  # positions restart per sample


@pytest.mark.parametrize("packed", [False, True])
def test_micro_batch_is_the_same_from_lists_tensors_or_both(packed):
    """Rollout columns arrive as python lists (tokens, masks) or per-sample tensors (log-probs, advantages);
    the vectorised builder must give identical inputs for any mix, and pad fields per sample."""
    b = _batch(n=9, seed=3)
    b["advantages"] = [torch.randn(r, generator=torch.Generator().manual_seed(r)) for r in b["response_lengths"]]
    as_tensors = dict(b, tokens=[torch.tensor(t) for t in b["tokens"]],
                      loss_masks=[torch.tensor(m, dtype=torch.float32) for m in b["loss_masks"]])
    mixed = dict(b, tokens=[torch.tensor(t) if i % 2 else t for i, t in enumerate(b["tokens"])])
    ids = [0, 2, 3, 7, 8]
    ref = D.build_micro_batch(b, ids, packed=packed, field_keys=("advantages", "rewards"))
    for other in (as_tensors, mixed):
        mb = D.build_micro_batch(other, ids, packed=packed, field_keys=("advantages",))
        for name in ("tokens", "position_ids", "rows", "cols", "targets", "valid", "loss_mask"):
            assert torch.equal(getattr(mb, name), getattr(ref, name)), name
        assert torch.equal(mb.fields["advantages"], ref.fields["advantages"])
    for k, i in enumerate(ids):
        r = b["response_lengths"][i]
        assert torch.equal(ref.fields["advantages"][k, :r], b["advantages"][i])
        assert not ref.fields["advantages"][k, r:].any()


def _torch_logprobs_entropy(logits, targets):
    """The plain torch reference: log softmax at the target, and the entropy of the whole distribution."""
    logp_all = torch.log_softmax(logits, -1)
    return logp_all.gather(-1, targets[..., None])[..., 0], -(logp_all.exp() * logp_all).sum(-1)


def test_vocab_parallel_math_equals_torch_at_tp1():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 40, generator=g, dtype=torch.float64) * 3
    targets = torch.randint(0, 40, (3, 7), generator=g)
    logp, ent = L.vocab_parallel_logprobs_entropy(logits, targets)
    ref_logp, ref_ent = _torch_logprobs_entropy(logits, targets)
    torch.testing.assert_close(logp, ref_logp.to(logp.dtype), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent.to(ent.dtype), atol=1e-5, rtol=1e-5)


def _sched_args(**kw):
    base = dict(lr=1e-3, min_lr=1e-4, lr_decay_style="linear", lr_warmup_iters=2, lr_decay_iters=10,
                lr_warmup_init=0.0, weight_decay=0.0, num_rollout=None, train_iters=None, lr_warmup_fraction=None)
    base.update(kw)
    return A.make_args(**base)


def _lrs(args, n=13):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    sched = O.build_scheduler(args, opt)
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        sched.step(increment=1)
    return out


@pytest.mark.parametrize("style", ["constant", "linear", "cosine"])
def test_lr_schedule_values(style):
    lr, lo, w, d = 1e-3, 1e-4, 2, 10

    def expected(step):
        if step <= w:
            return lr * step / w
        if style == "constant":
            return lr
        if step > d:
            return lo
        ratio = (step - w) / (d - w)
        coeff = 1 - ratio if style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1)
        return lo + coeff * (lr - lo)

    got = _lrs(_sched_args(lr_decay_style=style))
    assert got == pytest.approx([expected(s) for s in range(13)], rel=1e-9, abs=1e-15)


def test_lr_schedule_horizon_from_fraction_and_num_rollout():
    args = _sched_args(lr_decay_iters=None, lr_warmup_iters=0, lr_warmup_fraction=0.25, num_rollout=4,
                       num_steps_per_rollout=2)
    assert O.schedule_steps(args) == (2, 8)
    with pytest.raises(ValueError, match="schedule length"):
        O.schedule_steps(_sched_args(lr_decay_iters=None))
    with pytest.raises(ValueError, match="did you mean 'cosine'"):
        O.schedule_steps(_sched_args(lr_decay_style="cosin"))
    with pytest.raises(ValueError, match="shorter than the decay"):
        O.schedule_steps(_sched_args(lr_warmup_iters=10))


def test_padded_vocab_columns_are_not_tokens():
    """Megatron pads the output layer (128 x TP); those columns must not take probability mass or grads."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 5, 48, generator=g, requires_grad=True)
    targets = torch.randint(0, 40, (2, 5), generator=g)
    logp, ent = L.vocab_parallel_logprobs_entropy(logits, targets, vocab_size=40)
    ref_logp, ref_ent = _torch_logprobs_entropy(logits[..., :40].detach(), targets)
    torch.testing.assert_close(logp, ref_logp)
    torch.testing.assert_close(ent, ref_ent)
    (logp.sum() + ent.sum()).backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[..., 40:].abs().max() == 0


@pytest.mark.parametrize("flags,error", [
    # context parallelism without TE: the all-gather CP attention has no dropout (TE's CP attention has)
    (("--context-parallel-size", "2", "--actor-num-gpus-per-node", "2", "--attention-dropout", "0.2"),
     "use --attention-dropout 0"),
    (("--rollout-temperature", "0"), "--rollout-temperature must be > 0"),
])
def test_unsupported_input_fails_before_any_distributed_setup(tiny_ckpt, flags, error):
    import torch.distributed as dist

    from slime_like.backends.megatron.trainer import MegatronTrainer
    from slime_like.config.errors import ConfigError
    from test_trainer_common import make_args

    try:
        args = make_args(tiny_ckpt, *flags)
    except ConfigError as e:  # the config layer may already refuse it, equally clearly
        assert error.split()[0] in str(e)
        return
    with pytest.raises((NotImplementedError, ValueError), match=error):
        MegatronTrainer(args, role="actor")
    assert not dist.is_initialized()

"""Qwen3-Next / Qwen3.5's gated delta net (backends/megatron/gated_delta_net.py) beyond the logits parity of
test_model_parity.py: the recurrence against transformers' own delta-rule kernel, and packed rows (the trainer's
--use-dynamic-batch-size layout) giving each sample the log-probs it gets alone."""
import pytest
import torch
from _dist import run_ranks, tiny_ckpts  # noqa: F401  (tiny_ckpts is a fixture)
from test_trainer_common import make_batch
from test_trainer_single import _trainer


def test_recurrence_matches_transformers_chunked_kernel():
    """Our step-by-step recurrence equals transformers' chunked torch kernel (64-token chunks: 150 tokens span three,
    so the carried state between chunks is exercised) within 1e-5 in fp32, with 2 value heads per key head."""
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    from slime_like.backends.megatron.gated_delta_net import recurrent_gated_delta_rule

    g = torch.Generator().manual_seed(0)
    b, s, h, dk, dv = 2, 150, 4, 8, 6
    q, k = (torch.nn.functional.normalize(torch.randn(b, s, h, dk, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(b, s, h, dv, generator=g)
    decay = -torch.rand(b, s, h, generator=g) * 2  # log decay in (-2, 0]
    beta = torch.rand(b, s, h, generator=g)
    ours = recurrent_gated_delta_rule(q, k, v, decay, beta)
    ref, _ = torch_chunk_gated_delta_rule(q, k, v, g=decay, beta=beta, use_qk_l2norm_in_kernel=False)
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() < 1e-5
    assert ref.abs().max().item() > 0.1  # not trivially small


def packed_case(rank, world_size, port, ckpt):
    batch = make_batch(8, seed=3)
    t = _trainer(ckpt, rank, world_size, port, "--micro-batch-size", "4", "--global-batch-size", "8")
    out = {"padded": t.compute_log_probs(batch)["log_probs"]}
    t.args.use_dynamic_batch_size, t.args.max_tokens_per_gpu = True, 64  # the data layer reads both per call
    out["packed"] = t.compute_log_probs(batch)["log_probs"]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3_next", "qwen3_5"])
def test_packed_rows_restart_the_state_per_sample(tiny_ckpts, arch):
    """Eight samples packed into rows (block-causal mask on CPU): the conv and the recurrent state restart at every
    sample, so each sample's log-probs equal those of the padded layout (one sample per row)."""
    out = run_ranks(packed_case, 1, tiny_ckpts[arch])[0]
    diffs = [(a - b).abs().max().item() for a, b in zip(out["padded"], out["packed"])]
    assert len(diffs) == 8 and max(diffs) < 1e-5, diffs

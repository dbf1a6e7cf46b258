"""Without TransformerEngine the local spec's core attention is torch's SDPA (backends/megatron/sdpa_attention.py),
per sample in a packed row: the model's logits equal megatron-core's own DotProductAttention's to 1e-5 (fp32),
padded and packed, on the tiny Qwen2 (grouped-query: 4 query heads, 2 key/value heads), and the gradients
of a loss on them too. --attention-backend local keeps mcore's module.
"""
import pytest
import torch
from _dist import run_ranks
from test_trainer_common import make_args, make_batch


def _core_attentions(chunks):
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    return [m for c in chunks for m in c.modules() if isinstance(m, DotProductAttention)]


def sdpa_case(rank, world_size, port, ckpt, packed, per_sample_cap=None):
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from slime_like.backends.megatron import sdpa_attention

    from slime_like.backends.megatron.sdpa_attention import SDPADotProductAttention
    from slime_like.backends.megatron.trainer import MegatronTrainer

    if per_sample_cap is not None:  # rows of more samples than this take one masked SDPA call
        sdpa_attention.MAX_PER_SAMPLE_CALLS = per_sample_cap
    flags = ("--use-dynamic-batch-size", "--max-tokens-per-gpu", "48") if packed else ("--micro-batch-size", "4")
    t = MegatronTrainer(make_args(ckpt, *flags), role="actor", rank=rank, world_size=world_size, master_port=port)
    attns = _core_attentions(t.chunks)
    kinds = {type(m).__name__ for m in attns}
    batch = make_batch(8, seed=2)
    mbs = t.batcher.for_scoring(batch)
    (chunk,) = t.model  # the DDP-wrapped chunk: gradients land in main_grad

    def logits_and_grads():
        out, grads = [], []
        for mb in mbs:
            chunk.zero_grad_buffer()
            logits = chunk(mb.tokens, mb.position_ids, mb.attention_mask)
            (logits.float() ** 2).mean().backward()
            out.append(logits.detach().clone())
        grads = [p.main_grad.clone() if hasattr(p, "main_grad") else p.grad.clone() for p in chunk.parameters()]
        return out, grads

    sdpa = logits_and_grads()
    for m in attns:
        m.__class__ = DotProductAttention  # same parameters and buffers: the subclass adds none
    ref = logits_and_grads()
    for m in attns:
        m.__class__ = SDPADotProductAttention
    return {"kinds": kinds, "rows": [mb.tokens.shape for mb in mbs],
            "logit_diff": max((a - b).abs().max().item() for a, b in zip(sdpa[0], ref[0])),
            "grad_diff": max((a - b).abs().max().item() for a, b in zip(sdpa[1], ref[1])),
            "grad_scale": max(b.abs().max().item() for b in ref[1])}



@pytest.mark.parametrize("packed,cap", [(False, None), (True, None), (True, 1)],
                         ids=["padded", "packed-per-sample", "packed-one-masked-call"])
def test_sdpa_core_attention_matches_mcore_local_attention(tiny_ckpt, packed, cap):
    out = run_ranks(sdpa_case, 1, tiny_ckpt, packed, cap)[0]
    assert out["kinds"] == {"SDPADotProductAttention"}
    if packed:
        assert all(r[0] == 1 for r in out["rows"]) and any(r[1] > 7 for r in out["rows"])  # several samples a row
    assert out["logit_diff"] < 1e-5, out
    assert out["grad_diff"] < 1e-5 * max(1.0, out["grad_scale"]), out


def local_case(rank, world_size, port, ckpt):
    from slime_like.backends.megatron.trainer import MegatronTrainer

    t = MegatronTrainer(make_args(ckpt, "--attention-backend", "local"), role="actor", rank=rank,
                        world_size=world_size, master_port=port)
    return {type(m).__name__ for m in _core_attentions(t.chunks)}


def test_attention_backend_local_keeps_mcore_attention(tiny_ckpt):
    assert run_ranks(local_case, 1, tiny_ckpt)[0] == {"DotProductAttention"}


def test_segment_lengths_reads_block_causal_masks_only():
    from slime_like.backends.megatron.sdpa_attention import segment_lengths
    from slime_like.backends.training.micro_batch import block_causal_mask

    assert segment_lengths(block_causal_mask([3, 1, 4])) == [3, 1, 4]
    plain_causal = ~torch.ones(5, 5, dtype=torch.bool).tril()[None, None]
    assert segment_lengths(plain_causal) == [5]
    other = block_causal_mask([2, 3]).clone()
    other[0, 0, 4, 0] = False  # a row attending across samples is not block-causal
    assert segment_lengths(other) is None

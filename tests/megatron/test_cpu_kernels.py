"""cpu_kernels: each replacement is bit-for-bit equal to mcore's own code, forward and backward, and the
model really runs through it (a whole GPTModel step gives identical logits and gradients either way)."""
import pytest
import torch
from _dist import run_ranks, tiny_ckpts  # noqa: F401  (fixture)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="cpu_kernels refuses to run with CUDA")


def _freqs(s, d):
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    f = torch.outer(torch.arange(s).float(), inv)
    return torch.cat([f, f], -1)[:, None, None, :]  # mcore's [s, 1, 1, d] layout


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(11, 128, 4, 32), (7, 3, 2, 64), (5, 1, 3, 16)])
def test_rope_equals_mcore_bit_for_bit(dtype, shape):
    from slime_like.backends.megatron import cpu_kernels

    cpu_kernels.apply()
    import megatron.core.models.common.embeddings.rope_utils as rope_utils

    fast = rope_utils._apply_rotary_pos_emb_bshd
    s, b, h, d = shape
    g = torch.Generator().manual_seed(sum(shape))
    qkv = torch.randn(s, b, h, 3 * d, generator=g).to(dtype)
    grad = torch.randn(s, b, h, d, generator=g).to(dtype)
    results = []
    for fn in (fast.reference, fast):
        x = qkv.clone().requires_grad_(True)
        out = fn(x[..., :d], _freqs(s, d), mscale=1.0)  # a strided view, like the query out of the fused qkv
        out.backward(grad)
        results.append((out.detach(), x.grad))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])
    assert results[1][0].is_contiguous() and results[1][0].dtype == dtype
    assert not torch.equal(results[1][0], qkv[..., :d])  # it did rotate something


def _model_step_both_ways(rank, world_size, port, ckpt):
    from slime_like.backends.megatron import cpu_kernels, model, parallel
    from slime_like.args import make_args
    from slime_like.config.hf_config import fill_args_from_hf

    parallel.init_distributed(rank, world_size, master_port=port)
    import megatron.core.models.common.embeddings.rope_utils as rope_utils

    args = fill_args_from_hf(make_args("--hf-checkpoint", ckpt), ckpt)
    m = model.build_model(args)[0]
    ids = torch.randint(2, 60, (3, 9), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(9).expand(3, 9)
    calls = []
    apply_ = cpu_kernels._RotaryHalves.apply
    cpu_kernels._RotaryHalves.apply = lambda *a: calls.append(1) or apply_(*a)
    out = []
    fast = rope_utils._apply_rotary_pos_emb_bshd
    for fn in (fast, fast.reference):
        rope_utils._apply_rotary_pos_emb_bshd = fn
        m.zero_grad(set_to_none=True)
        logits = m(ids, pos, None)
        logits.float().pow(2).mean().backward()
        out.append((logits.detach(), [p.grad.clone() for p in m.parameters()]))
    rope_utils._apply_rotary_pos_emb_bshd = fast
    same = torch.equal(out[0][0], out[1][0]) and all(torch.equal(a, b) for a, b in zip(out[0][1], out[1][1]))
    return {"same": same, "fast_calls": len(calls), "layers": args.num_layers}


@pytest.mark.slow
def test_model_runs_through_the_kernels_and_gives_identical_results(tiny_ckpts):
    (r,) = run_ranks(_model_step_both_ways, 1, tiny_ckpts["qwen2"])
    assert r["fast_calls"] == 2 * r["layers"]  # query and key of every layer, one forward
    assert r["same"]


def test_unknown_kernel_name_is_rejected():
    from slime_like.backends.megatron import cpu_kernels

    with pytest.raises(ValueError, match="unknown kernel"):
        cpu_kernels.apply(skip=("ropee",))

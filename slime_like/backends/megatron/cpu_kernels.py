"""Faster CPU versions of megatron-core hot spots, bit-for-bit equal to the code they replace.

On GPU mcore fuses these (TransformerEngine / Apex kernels); on CPU it runs the unfused Python
reference, which for a small model is a large share of the train step. Each replacement computes the
same floating-point operations in the same order (forward and backward), so results do not change:
tests/megatron/test_cpu_kernels.py compares them with mcore's own code with torch.equal. Applied by
`apply()` on CPU runs only (parallel.init_distributed, next to cpu_compat), idempotent.

Kernel (name)   what it replaces and why it is faster
--------------  ---------------------------------------------------------------------------------------
rope            rope_utils._apply_rotary_pos_emb_bshd (non-interleaved, whole head dim rotated): mcore
                builds `rotate_half(t)` with a negation and a concatenation, then concatenates the
                (empty) pass-through part again, and autograd keeps 8 nodes per call. One autograd
                Function computes each half straight into the output, t1*c1 - t2*s1 and t2*c2 + t1*s2
                (`a + (-b)` is `a - b` exactly in IEEE arithmetic), and its backward is the same sums
                autograd forms for mcore's graph; it saves cos/sin instead of the activations.
                ~20 % of a 0.5M-parameter model's train step was mcore's RoPE.
"""
from __future__ import annotations

import torch

_applied: set[str] = set()


class _RotaryHalves(torch.autograd.Function):
    """out = t * cos + rotate_half(t) * sin for rotate_half(x) = cat(-x2, x1), with cos / sin constant."""

    @staticmethod
    def forward(ctx, t, cos, sin):
        h = t.shape[-1] // 2
        t1, t2 = t[..., :h], t[..., h:]
        c1, c2, s1, s2 = cos[..., :h], cos[..., h:], sin[..., :h], sin[..., h:]
        out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
        torch.sub(t1 * c1, t2 * s1, out=out[..., :h])
        torch.add(t2 * c2, t1 * s2, out=out[..., h:])
        ctx.save_for_backward(cos, sin)
        return out

    @staticmethod
    def backward(ctx, g):
        # mcore's graph: dt = g*cos (through t*cos) + rotate_half's backward of g*sin, which sends the
        # second half of g*sin to t1 and minus the first half to t2; two terms, so their order is free.
        cos, sin = ctx.saved_tensors
        h = g.shape[-1] // 2
        g1, g2 = g[..., :h], g[..., h:]
        c1, c2, s1, s2 = cos[..., :h], cos[..., h:], sin[..., :h], sin[..., h:]
        dt = torch.empty(g.shape, dtype=g.dtype, device=g.device)
        torch.add(g1 * c1, g2 * s2, out=dt[..., :h])
        torch.sub(g2 * c2, g1 * s1, out=dt[..., h:])
        return dt, None, None


def _patch_rope():
    import megatron.core.models.common.embeddings.rope_utils as rope_utils
    import megatron.core.models.common.embeddings.rotary_pos_embedding as rotary_pos_embedding

    reference = rope_utils._apply_rotary_pos_emb_bshd

    def apply_rotary_pos_emb_bshd(t, freqs, rotary_interleaved=False, multi_latent_attention=False, mscale=1.0):
        if (rotary_interleaved or multi_latent_attention or freqs.shape[-1] != t.shape[-1] or t.shape[-1] % 2
                or freqs.requires_grad or t.device.type != "cpu"):
            return reference(t, freqs, rotary_interleaved, multi_latent_attention, mscale)
        cos = (torch.cos(freqs) * mscale).to(t.dtype)  # as mcore computes them
        sin = (torch.sin(freqs) * mscale).to(t.dtype)
        shape = torch.broadcast_shapes(t.shape, cos.shape)
        if shape != t.shape:  # cos/sin broadcast over batch and heads, never the other way round
            return reference(t, freqs, rotary_interleaved, multi_latent_attention, mscale)
        return _RotaryHalves.apply(t, cos, sin)

    apply_rotary_pos_emb_bshd.reference = reference
    rope_utils._apply_rotary_pos_emb_bshd = apply_rotary_pos_emb_bshd
    rotary_pos_embedding._apply_rotary_pos_emb_bshd = apply_rotary_pos_emb_bshd  # re-exported by name


KERNELS = {"rope": _patch_rope}


def apply(skip: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Install every kernel not in `skip` (once each); return the names installed so far."""
    unknown = [s for s in skip if s not in KERNELS]
    if unknown:
        raise ValueError(f"cpu_kernels.apply(skip=...): unknown kernel(s) {unknown}; known: {sorted(KERNELS)}")
    if torch.cuda.is_available():
        raise RuntimeError("slime_like.backends.megatron.cpu_kernels is for CPU-only runs; CUDA is available here")
    for name, patch in KERNELS.items():
        if name not in skip and name not in _applied:
            patch()
            _applied.add(name)
    return sorted(_applied)

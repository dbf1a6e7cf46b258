"""HF <-> megatron-core tensor layouts of Qwen3-Next / Qwen3.5's layers (used by hf_weights.py).

- gated delta net in_proj (gated_delta_net.py): mcore [q; k; v; z; beta; alpha], each section whole-model wide.
  Qwen3.5 stores in_proj_qkv ([q; k; v]), in_proj_z, in_proj_b, in_proj_a; Qwen3-Next stores in_proj_qkvz and
  in_proj_ba grouped per key head: [q_h, k_h, v of its value heads, z of its value heads] and [b_h..., a_h...].
- conv1d: [q; k; v] channels in both.
- gated attention (--attention-output-gate): HF's q_proj holds per head [query (head_dim rows); gate (head_dim)];
  mcore's linear_qkv per KV group [queries of the group; their gates; k; v].
Under TP every section is split on its own, so a rank holds [q_r; k_r; v_r; z_r; b_r; a_r] (tp_sections).
"""
from __future__ import annotations

import torch


def _dims(args):
    la = args.hf_linear_attention
    r = la["num_value_heads"] // la["num_key_heads"]
    return la["num_key_heads"], la["key_head_dim"], la["value_head_dim"], r


def tp_sections(kind: str, args) -> list[int] | None:
    """Rows of each TP-split section of a full mcore tensor (None: split the whole tensor)."""
    if kind not in ("gdn_in", "gdn_conv"):
        return None
    nk, dk, dv, r = _dims(args)
    qk, v, nv = nk * dk, nk * r * dv, nk * r
    return [qk, qk, v, v, nv, nv] if kind == "gdn_in" else [qk, qk, v]


def merge_in_proj(tensors: list, args) -> torch.Tensor:
    if len(tensors) == 4:  # Qwen3.5: already [q; k; v], z, b, a
        return torch.cat(tensors)
    nk, dk, dv, r = _dims(args)
    qkvz, ba = tensors
    hidden = qkvz.shape[1:]
    g = qkvz.reshape(nk, 2 * dk + 2 * r * dv, *hidden)
    q, k, v, z = g.split([dk, dk, r * dv, r * dv], dim=1)
    b, a = ba.reshape(nk, 2 * r, *hidden).split([r, r], dim=1)
    return torch.cat([x.reshape(-1, *hidden) for x in (q, k, v, z, b, a)])


def split_in_proj(full: torch.Tensor, args, hf_count: int) -> list:
    nk, dk, dv, r = _dims(args)
    hidden = full.shape[1:]
    q, k, v, z, b, a = full.split(tp_sections("gdn_in", args))
    if hf_count == 4:
        return [torch.cat([q, k, v]), z, b, a]
    per_head = [x.reshape(nk, -1, *hidden) for x in (q, k, v, z)]
    qkvz = torch.cat(per_head, dim=1).reshape(-1, *hidden)
    ba = torch.cat([b.reshape(nk, r, *hidden), a.reshape(nk, r, *hidden)], dim=1).reshape(-1, *hidden)
    return [qkvz, ba]


def merge_gated_qkv(q, k, v, groups: int, head_dim: int) -> torch.Tensor:
    rest = q.shape[1:]
    q = q.reshape(groups, -1, 2, head_dim, *rest)  # [group, its heads, (query, gate), head_dim, ...]
    query, gate = (q[:, :, i].reshape(groups, -1, *rest) for i in (0, 1))
    return torch.cat([query, gate, k.reshape(groups, -1, *rest), v.reshape(groups, -1, *rest)], dim=1) \
        .reshape(-1, *rest)


def split_gated_qkv(full, heads: int, groups: int, head_dim: int) -> list:
    rest = full.shape[1:]
    per = heads // groups * head_dim
    g = full.reshape(groups, 2 * per + 2 * head_dim, *rest)
    query, gate = (g[:, i * per:(i + 1) * per].reshape(groups, heads // groups, head_dim, *rest) for i in (0, 1))
    q_proj = torch.stack([query, gate], dim=2).reshape(-1, *rest)
    k, v = g[:, 2 * per:2 * per + head_dim], g[:, 2 * per + head_dim:]
    return [q_proj, k.reshape(-1, *rest), v.reshape(-1, *rest)]

"""Gated delta net (the linear-attention layers of Qwen3-Next and Qwen3.5) as a megatron-core self-attention module.

megatron-core 0.16 has `megatron.core.ssm.gated_delta_net.GatedDeltaNet`, but it will not build without
flash-linear-attention (its __init__ raises ImportError) and allocates on `torch.cuda.current_device()`, and it
refuses packed sequences; so the layer spec puts this module in the linear-attention layers instead. Its
parameters carry megatron-core's names and layout (in_proj = [q; k; v; z; beta; alpha] per TP rank, conv1d,
dt_bias, A_log, out_norm, out_proj), so the HF mapping (hf_names.py) reads like the attention one.

Per token t and value head h (q, k L2-normalised, q scaled by 1/sqrt(d_k); S a d_k x d_v state per head):
    S <- exp(g_t) S;   S <- S + k_t (beta_t (v_t - S^T k_t))^T;   o_t = S^T q_t
with g = -exp(A_log) softplus(alpha + dt_bias), beta = sigmoid(beta logits), then a gated RMSNorm
(norm(o) * weight * silu(z)) and out_proj. q / k / v first go through a causal depthwise conv1d + SiLU.
On CPU the recurrence runs step by step in torch (exact; the tiny models' lengths make a chunked form
unnecessary); on CUDA with flash-linear-attention importable its chunked kernel runs instead. Packed rows
(the block-causal mask of the local spec, or TE's cu_seqlens) restart the conv and the state at each sample.
TP splits the key / value heads (in_proj columns, conv channels, dt_bias, A_log) over ranks; out_proj is row
parallel; the gated norm's weight is shared by all heads, so its gradient is summed over TP.

Context parallelism (--context-parallel-size CP > 1, backends/training/cp_layout.py's 2 x CP chunks per sample):
token t's output depends on every earlier token of its sample through the conv and the state, so after the local
in_proj each rank all-gathers the conv / beta / alpha projections over the CP group (not z, which is used per
token), puts every sample back in order (cp_attention.gather_whole_samples), runs the conv and the delta rule over
whole samples, exactly the CP 1 computation, and keeps the outputs of its own chunks for the gated norm and
out_proj. The backward sums every rank's gradient of a rank's projections (all-gather's adjoint). Cost per linear
layer: CP x the gathered projections' memory and CP x the recurrence's work on every rank (each rank recomputes
whole samples), the price of the simplest exact form; megatron-core 0.16 has no GDN context parallelism (its
GatedDeltaNetContextParallel is a TODO), and slime all-gathers the layer's hidden states the same way.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from megatron.core.transformer.module import MegatronModule


@dataclass(frozen=True)
class LinearAttentionDims:
    """config.json's linear_* sizes (the layer has no Megatron flags: slime's plugin reads them there too)."""
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel_dim: int

    @property
    def in_proj_sections(self) -> list[int]:
        qk, v, nv = self.num_key_heads * self.key_head_dim, self.num_value_heads * self.value_head_dim, \
            self.num_value_heads
        return [qk, qk, v, v, nv, nv]  # q, k, v, z (output gate), beta, alpha

    @property
    def conv_sections(self) -> list[int]:
        return self.in_proj_sections[:3]


def _fla_kernel():
    """flash-linear-attention's chunked kernel where CUDA runs and fla imports; None otherwise."""
    if not torch.cuda.is_available():
        return None
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError:
        return None
    return chunk_gated_delta_rule


def recurrent_gated_delta_rule(q, k, v, g, beta):
    """q, k [b, s, h, dk] (L2-normalised), v [b, s, h, dv], g / beta [b, s, h] -> o [b, s, h, dv], in fp32."""
    dtype = v.dtype
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    q = q * q.shape[-1] ** -0.5
    b, s, h, dk = k.shape
    state = q.new_zeros(b, h, dk, v.shape[-1])
    out = []
    for t in range(s):
        state = state * g[:, t, :, None, None].exp()
        remembered = torch.einsum("bhkv,bhk->bhv", state, k[:, t])
        delta = (v[:, t] - remembered) * beta[:, t, :, None]
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", state, q[:, t]))
    return torch.stack(out, dim=1).to(dtype)


def _segments(seq_len: int, attention_mask, packed_seq_params) -> list[int] | None:
    """Sample lengths of a packed row (None: every row is one sample)."""
    if packed_seq_params is not None and packed_seq_params.cu_seqlens_q is not None:
        cu = packed_seq_params.cu_seqlens_q.tolist()
        return [b - a for a, b in zip(cu, cu[1:]) if b > a]
    if attention_mask is not None:
        from slime_like.backends.megatron.sdpa_attention import segment_lengths

        lengths = segment_lengths(attention_mask)
        if lengths is None:
            raise ValueError("gated delta net: the attention mask is not block-causal; linear attention takes "
                             "causal rows or packed samples only")
        return lengths
    return None


class GatedDeltaNetAttention(MegatronModule):
    """Called like mcore's SelfAttention: hidden [s, b, h] -> (output [s, b, h], bias None)."""

    def __init__(self, config, layer_number, dims: LinearAttentionDims, pg_collection=None, cp_comm_type=None,
                 **_unused):
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

        super().__init__(config)
        tp = ps.get_tensor_model_parallel_world_size()
        if dims.num_key_heads % tp:
            raise ValueError(f"--tensor-model-parallel-size {tp} does not divide the {dims.num_key_heads} "
                             "linear-attention key heads (config.json linear_num_key_heads)")
        self.dims, self.tp, self.layer_number = dims, tp, layer_number
        self.in_proj = ColumnParallelLinear(config.hidden_size, sum(dims.in_proj_sections), config=config,
                                            init_method=config.init_method, bias=False, gather_output=False,
                                            skip_bias_add=True)
        conv_local = sum(dims.conv_sections) // tp
        self.conv1d = torch.nn.Conv1d(conv_local, conv_local, dims.conv_kernel_dim, groups=conv_local, bias=False,
                                      padding=dims.conv_kernel_dim - 1, dtype=config.params_dtype)
        heads = dims.num_value_heads // tp
        self.dt_bias = torch.nn.Parameter(torch.ones(heads, dtype=config.params_dtype))
        self.A_log = torch.nn.Parameter(torch.empty(heads, dtype=config.params_dtype).uniform_(1, 16).log())
        for p in (self.conv1d.weight, self.dt_bias, self.A_log):
            p.tensor_model_parallel, p.partition_dim, p.partition_stride = True, 0, 1
        self.out_norm = torch.nn.Module()
        self.out_norm.weight = torch.nn.Parameter(torch.ones(dims.value_head_dim, dtype=config.params_dtype))
        self.out_proj = RowParallelLinear(dims.num_value_heads * dims.value_head_dim, config.hidden_size,
                                          config=config, init_method=config.output_layer_init_method, bias=False,
                                          input_is_parallel=True, skip_bias_add=True)
        self.eps = config.layernorm_epsilon
        self.kernel = _fla_kernel()

    def forward(self, hidden_states, attention_mask=None, packed_seq_params=None, **_unused):
        seq_len, batch, _ = hidden_states.shape
        projected, _ = self.in_proj(hidden_states)
        sections = [n // self.tp for n in self.dims.in_proj_sections]
        qkv, z, b, a = projected.transpose(0, 1).split([sum(sections[:3]), *sections[3:]], dim=-1)
        keep = None
        if self._context_parallel(packed_seq_params):  # this rank's chunks -> whole samples (module docstring)
            from megatron.core import parallel_state as ps

            from slime_like.backends.megatron.cp_attention import gather_whole_samples

            whole, lengths, keep = gather_whole_samples(torch.cat([qkv, b, a], dim=-1)[0],
                                                        packed_seq_params.cu_seqlens_q, ps.get_context_parallel_group())
            qkv, b, a = whole[None].split([sum(sections[:3]), *sections[4:]], dim=-1)
        else:
            lengths = _segments(seq_len, attention_mask, packed_seq_params)
        if lengths is not None and batch != 1:
            raise ValueError("gated delta net: a packed micro-batch must be one row")
        out = self._mix(qkv, b, a, sections, lengths)
        if keep is not None:
            out = out[:, keep]
        dv = self.dims.value_head_dim
        out = self._gated_norm(out, z.reshape(batch, seq_len, -1, dv))
        out = out.reshape(batch, seq_len, -1).transpose(0, 1).contiguous()
        return self.out_proj(out)

    def _context_parallel(self, packed_seq_params) -> bool:
        return (self.config.context_parallel_size > 1 and packed_seq_params is not None
                and packed_seq_params.qkv_format == "thd")

    def _mix(self, qkv, b, a, sections, lengths):
        """The conv and the delta rule over whole rows or samples: [b, s, .] projections -> [b, s, heads, dv]."""
        batch, seq_len = qkv.shape[:2]
        pieces = [qkv] if lengths is None else list(qkv.split(lengths, dim=1))
        qkv = torch.cat([self._conv(p) for p in pieces], dim=1)
        q, k, v = qkv.split(sections[:3], dim=-1)
        dk, dv = self.dims.key_head_dim, self.dims.value_head_dim
        # HF's l2norm: x / sqrt(sum x^2 + 1e-6), per head
        q, k = (self._l2norm(x.reshape(batch, seq_len, -1, dk)) for x in (q, k))
        v = v.reshape(batch, seq_len, -1, dv)
        repeat = self.dims.num_value_heads // self.dims.num_key_heads
        if repeat > 1:
            q, k = q.repeat_interleave(repeat, dim=2), k.repeat_interleave(repeat, dim=2)
        beta = b.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        return self._delta_rule(q, k, v, g, beta, lengths)

    def _conv(self, x):
        """Causal depthwise conv + SiLU over one sample (or unpacked rows): x [b, s, c]."""
        s = x.shape[1]
        return F.silu(self.conv1d(x.transpose(1, 2))[..., :s]).transpose(1, 2)

    @staticmethod
    def _l2norm(x):
        x = x.float()
        return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)

    def _delta_rule(self, q, k, v, g, beta, lengths):
        if self.kernel is not None and q.is_cuda:
            cu = None
            if lengths is not None:
                cu = torch.tensor([0] + lengths, device=q.device).cumsum(0).to(torch.int32)
            out, _ = self.kernel(q.to(v.dtype), k.to(v.dtype), v, g=g, beta=beta.to(v.dtype), cu_seqlens=cu,
                                 use_qk_l2norm_in_kernel=False)
            return out
        if lengths is None:
            return recurrent_gated_delta_rule(q, k, v, g, beta)
        split = [x.split(lengths, dim=1) for x in (q, k, v, g, beta)]
        return torch.cat([recurrent_gated_delta_rule(*parts) for parts in zip(*split)], dim=1)

    def _gated_norm(self, x, z):
        """HF's RMSNormGated: fp32 norm, times the weight in the input dtype, times silu(z) in fp32."""
        from megatron.core.tensor_parallel import copy_to_tensor_model_parallel_region

        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        weight = copy_to_tensor_model_parallel_region(self.out_norm.weight) if self.tp > 1 else self.out_norm.weight
        h = weight * h.to(dtype)
        return (h * F.silu(z.float())).to(dtype)

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None, **_unused):
        """torch_dist layout independent of TP: heads split over ranks (axis 0), and in_proj / conv1d saved per
        section (q, k, v, z, beta, alpha) so a checkpoint saved at one TP size loads at another."""
        from megatron.core import parallel_state as ps
        from megatron.core.ssm.gated_delta_net import _split_tensor_factory
        from megatron.core.transformer.utils import (ensure_metadata_has_dp_cp_group,
                                                     make_sharded_tensors_for_checkpoint, sharded_state_dict_default)

        metadata = ensure_metadata_has_dp_cp_group(metadata)
        tp_group = ps.get_tensor_model_parallel_group()
        own = {"dt_bias": self.dt_bias, "A_log": self.A_log, "conv1d.weight": self.conv1d.weight,
               "out_norm.weight": self.out_norm.weight}
        out = make_sharded_tensors_for_checkpoint(own, prefix, {"dt_bias": 0, "A_log": 0, "conv1d.weight": 0},
                                                  sharded_offsets, tp_group=tp_group,
                                                  dp_cp_group=metadata["dp_cp_group"])
        for name in ("in_proj", "out_proj"):
            out.update(sharded_state_dict_default(getattr(self, name), f"{prefix}{name}.", sharded_offsets, metadata,
                                                  tp_group=tp_group))
        for key, sections, names in (("in_proj.weight", self.dims.in_proj_sections,
                                      ["query", "key", "value", "z", "beta", "alpha"]),
                                     ("conv1d.weight", self.dims.conv_sections, ["query", "key", "value"])):
            out[prefix + key] = _split_tensor_factory(out[prefix + key], [n // self.tp for n in sections], names, 0)
        return out

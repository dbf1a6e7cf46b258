"""DeepSeek sparse attention layers (DeepSeek-V3.2 `deepseek_v32`, GLM-5 `glm_moe_dsa`) for megatron-core's
multi-latent attention, in plain torch (dsa_math.py has the math).

DSAMLASelfAttention is megatron-core's MLASelfAttention (its projections, norms and RoPE, its parameter names) with
the lightning indexer beside it, under slime's glm5 plugin's names (`self_attention.wq_b / wk / k_norm /
weights_proj`, HF `self_attn.indexer.*`), and its own core attention: every query attends to the index_topk keys
its indexer scores highest. GLM-5's "shared" layers (config.json indexer_types) have no indexer and reuse the
previous full layer's choice, as transformers does.

megatron-core 0.16's own DSA (transformer/experimental_attention_variant/dsa.py) is not used: its indexer needs
fast_hadamard_transform (CUDA, bf16 only), refuses packed sequences and knows neither GLM-5's interleaved indexer
RoPE nor shared layers.

Positions: RoPE is applied at each token's position in its sample (the model's position_ids, which a forward
pre-hook hands to every layer), not at its row index, so a packed row, Megatron's 2 x CP chunks and slime's
--allgather-cp pieces all rotate keys and queries as the whole sample would; keys, values and indexer keys are
then all-gathered over context parallelism (the gather's backward sums the key / value gradients back).

The indexer is frozen (requires_grad False), as in slime's RL training: slime's glm5 plugin detaches its inputs and
discards its scores (only the top-k indices are used), so no loss reaches it. DeepSeek-V3.2's own training trains it
with a KL loss against the attention (megatron-core's dsa_indexer_loss_coeff); slime_like does not. The one
difference from slime: slime leaves the indexer's requires_grad on, so AdamW's weight decay shrinks its (never
trained) weights every step; here they stay exactly as loaded.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from megatron.core.transformer.multi_latent_attention import MLASelfAttention

from slime_like.backends.megatron import dsa_math


@dataclass
class SparseSettings:
    """config.json's indexer: index_topk, index_n_heads, index_head_dim; `shared_layers`: 0-based layers reusing the
    previous full layer's top-k (GLM-5's indexer_types "shared"); `interleaved_rope`: GLM-5 rotates interleaved
    pairs in the indexer, DeepSeek-V3.2 the two halves."""
    topk: int
    n_heads: int
    head_dim: int
    shared_layers: tuple = ()
    interleaved_rope: bool = False
    allgather_cp: bool = False  # --allgather-cp: under CP the row is a contiguous piece of the packed stream


@dataclass
class ForwardContext:
    """Per forward pass, shared by a model chunk's DSA layers: the token positions (set by the model's pre-hook) and
    each full layer's chosen key indices per sample (for the shared layers after it)."""
    positions: torch.Tensor | None = None
    keep: dict = field(default_factory=dict)


class _UnusedCoreAttention(torch.nn.Module):
    """MLA builds a core attention; the DSA layer computes its own (megatron-core's refuses CP > 1 on CPU)."""

    def __init__(self, **kwargs):
        super().__init__()


class _PositionRotary(torch.nn.Module):
    """Stands in for MLA's rotary module: per-token angles `[s, b, 1, d]` at the context's positions. The real module
    is kept out of the module tree (no new state-dict names) and its CP slicing is switched off."""

    def __init__(self, inner, context: ForwardContext):
        super().__init__()
        inner.cp_group = None
        self._inner, self._context = [inner], context

    def get_rotary_seq_len(self, *args, **kwargs) -> int:
        return int(self._context.positions.max()) + 1

    def forward(self, seq_len, *args, **kwargs):
        positions = self._context.positions  # [b, s]
        out = self._inner[0](int(positions.max()) + 1, packed_seq=True)
        emb, rest = (out[0], out[1:]) if isinstance(out, tuple) else (out, None)
        per_token = emb[:, 0][positions.transpose(0, 1)]  # [max, 1, 1, d] -> [s, b, 1, d]
        return per_token if rest is None else (per_token, *rest)


class Indexer(torch.nn.Module):
    """The lightning indexer's weights (transformers' GlmMoeDsaIndexer / DeepseekV32Indexer), replicated on every
    TP rank."""

    def __init__(self, config, sparse: SparseSettings):
        super().__init__()
        dtype = config.params_dtype
        self.wq_b = torch.nn.Linear(config.q_lora_rank, sparse.n_heads * sparse.head_dim, bias=False, dtype=dtype)
        self.wk = torch.nn.Linear(config.hidden_size, sparse.head_dim, bias=False, dtype=dtype)
        self.k_norm = torch.nn.LayerNorm(sparse.head_dim, eps=1e-6, dtype=dtype)
        self.weights_proj = torch.nn.Linear(config.hidden_size, sparse.n_heads, bias=False, dtype=dtype)


class DSAMLASelfAttention(MLASelfAttention):
    def __init__(self, config, submodules, layer_number, sparse: SparseSettings, context: ForwardContext, **kwargs):
        super().__init__(config, submodules, layer_number, **kwargs)
        self.sparse, self.context = sparse, context
        self.rotary_pos_emb = _PositionRotary(self.rotary_pos_emb, context)
        self.shared = (layer_number - 1) in sparse.shared_layers
        if not self.shared:  # built under the attention module: slime's names (self_attention.wq_b, ...)
            indexer = Indexer(config, sparse)
            for name in ("wq_b", "wk", "k_norm", "weights_proj"):
                setattr(self, name, getattr(indexer, name))
                getattr(self, name).requires_grad_(False)

    def forward(self, hidden_states, attention_mask, key_value_states=None, inference_context=None,
                rotary_pos_emb=None, rotary_pos_cos=None, rotary_pos_sin=None, rotary_pos_cos_sin=None,
                attention_bias=None, packed_seq_params=None, position_ids=None, sequence_len_offset=None, *,
                inference_params=None):
        if inference_context is not None or inference_params is not None:
            raise NotImplementedError("DeepSeek sparse attention layers: training forward only (no inference cache)")
        if self.context.positions is None:
            raise RuntimeError("DeepSeek sparse attention needs the model's position_ids (set by build_model's hook)")
        # [s, b, n, d] whatever the layout: RoPE comes from the positions, not from THD offsets
        query, key, value, q_compressed, _ = self.get_query_key_value_tensors(hidden_states, None, None, None)
        context = self._attend(query, key, value, hidden_states, q_compressed, attention_mask, packed_seq_params)
        return self.linear_proj(context)

    # --- the indexer ------------------------------------------------------------------------------------------
    def _indexer_inputs(self, hidden_states, q_compressed):
        """(queries [s, b, H, D], weights [s, b, H], keys [s, b, D]) with RoPE applied, from detached inputs."""
        from megatron.core.transformer.identity_op import IdentityOp

        x, qr = hidden_states.detach(), q_compressed.detach()
        if isinstance(self.q_layernorm, IdentityOp):  # TE fuses the q norm into linear_q_up_proj
            qr = F.rms_norm(qr, (qr.shape[-1],), self.linear_q_up_proj.layer_norm_weight,
                            self.config.layernorm_epsilon)
        if self.config.sequence_parallel and self.pg_collection.tp.size() > 1:
            from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

            x = gather_from_sequence_parallel_region(x, group=self.pg_collection.tp)
            if qr.shape[0] != x.shape[0]:
                qr = gather_from_sequence_parallel_region(qr, group=self.pg_collection.tp)
        s, b = x.shape[0], x.shape[1]
        heads, dim = self.sparse.n_heads, self.sparse.head_dim
        with torch.no_grad():
            q = self.wq_b(qr).view(s, b, heads, dim)
            k = self.k_norm(self.wk(x))
            weights = F.linear(x.float(), self.weights_proj.weight.float()) * heads ** -0.5
            freqs = self.rotary_pos_emb(s)
            freqs, mscale = (freqs[0], freqs[1]) if isinstance(freqs, tuple) else (freqs, 1.0)
            q = self._rope(q, freqs, mscale)
            k = self._rope(k.unsqueeze(2), freqs, mscale).squeeze(2)
        return q, weights, k

    def _rope(self, x, freqs, mscale):
        """transformers' indexer RoPE on the first qk_rope_head_dim dims: GLM-5 on interleaved pairs, DeepSeek-V3.2 on
        the two halves (x1 / x2 of each rotated pair as a contiguous block: dot products are what count)."""
        d = freqs.shape[-1]
        rot, rest = x[..., :d], x[..., d:]
        if self.sparse.interleaved_rope:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
        else:
            x1, x2 = rot[..., :d // 2], rot[..., d // 2:]
        angle = freqs[..., :d // 2]
        cos, sin = (torch.cos(angle) * mscale).to(x.dtype), (torch.sin(angle) * mscale).to(x.dtype)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)

    # --- attention over each sample ---------------------------------------------------------------------------
    def _attend(self, query, key, value, hidden_states, q_compressed, attention_mask, packed_seq_params):
        s, b = query.shape[0], query.shape[1]
        iq, iw, ik = (None, None, None) if self.shared else self._indexer_inputs(hidden_states, q_compressed)
        samples_per_row, gathered = self._layout(s, b, attention_mask, packed_seq_params)
        if gathered:  # context parallelism: every rank's keys, values and indexer keys
            key, value = (_gather_rows(x) for x in (key, value))
            ik = None if ik is None else _gather_rows(ik)
        outputs, keeps = [], []
        for row, samples in enumerate(samples_per_row):
            out = query.new_zeros(s, *value.shape[2:])
            for sample in samples:
                chosen = self._chosen(len(keeps), iq, iw, ik, row, sample)
                keeps.append(chosen)
                out = out.index_copy(0, sample.q_rows, dsa_math.sparse_attention(
                    query[sample.q_rows, row], key[sample.k_rows, row], value[sample.k_rows, row], chosen,
                    sample.q_pos, self.softmax_scale))
            outputs.append(out)
        if not self.shared:
            self.context.keep[self.layer_number] = keeps
        return torch.stack(outputs, dim=1).reshape(s, b, -1)

    def _chosen(self, index, iq, iw, ik, row, sample):
        """`[Lq, k]` key indices this sample's queries attend to."""
        if self.shared:  # the nearest full layer before this one (transformers' prev_topk_indices)
            full = max(n for n in self.context.keep if n < self.layer_number)
            return self.context.keep[full][index]
        inputs = dsa_math.IndexerInputs(iq[sample.q_rows, row], iw[sample.q_rows, row], ik[sample.k_rows, row])
        return dsa_math.select_keys(inputs, sample.q_pos, self.sparse.topk, self.sparse.head_dim ** -0.5)

    def _layout(self, s, b, attention_mask, packed_seq_params):
        """(per row: its samples, whether keys are gathered over CP)."""
        from megatron.core import parallel_state as ps

        device = self.context.positions.device
        if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
            cu = packed_seq_params.cu_seqlens_q.tolist()
            cp, rank = ps.get_context_parallel_world_size(), ps.get_context_parallel_rank()
            if cp == 1:
                return [dsa_math.row_samples([e - a for a, e in zip(cu, cu[1:])], 0, device)], False
            split = dsa_math.allgather_samples if self.sparse.allgather_cp else dsa_math.zigzag_samples
            return [split(cu, cp, rank, s, device)], True
        if attention_mask is not None:  # a packed row's block-causal mask (training/micro_batch.py)
            from slime_like.backends.megatron.sdpa_attention import segment_lengths

            lengths = segment_lengths(attention_mask)
            if lengths is None:
                raise NotImplementedError("DeepSeek sparse attention: only causal rows and block-causal packed rows")
            return [dsa_math.row_samples(lengths, 0, device)], False
        return [dsa_math.row_samples([s], 0, device) for _ in range(b)], False


def _gather_rows(x):
    """`[t, 1, ...]` of every CP rank stacked in rank order: `[cp * t, 1, ...]` (the backward sums gradients)."""
    from megatron.core import parallel_state as ps

    from slime_like.backends.megatron.cp_attention import _AllGatherFirstDim

    group = ps.get_context_parallel_group()
    out = _AllGatherFirstDim.apply(x, group) if x.requires_grad else _gather_no_grad(x, group)
    return out.reshape(-1, *x.shape[1:])


def _gather_no_grad(x, group):
    import torch.distributed as dist

    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.stack(parts)


def use_sparse_attention(spec, sparse: SparseSettings, context: ForwardContext):
    """Point every MLA layer of a layer / block spec at DSAMLASelfAttention (in place); returns spec."""
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.spec_utils import ModuleSpec

    layers = getattr(spec, "layer_specs", None) or [spec]
    for layer in layers:
        attention = layer.submodules.self_attention
        submodules = copy.copy(attention.submodules)
        submodules.core_attention = _UnusedCoreAttention
        layer.submodules.self_attention = ModuleSpec(
            module=DSAMLASelfAttention, submodules=submodules,
            params={"attn_mask_type": AttnMaskType.causal, "sparse": sparse, "context": context})
    return spec


def check_chunk_start(model, sparse: SparseSettings) -> None:
    """A chunk (pipeline stage or virtual stage) must not start on a shared-indexer layer: the full layer whose top-k
    it reuses would be on another stage (slime's get_glm5_spec asserts the same)."""
    layers = getattr(getattr(model, "decoder", None), "layers", None)
    if layers is not None and len(layers) and layers[0].layer_number - 1 in sparse.shared_layers:
        raise ValueError(f"a pipeline stage starts on layer {layers[0].layer_number} (1-based), a shared-indexer "
                         "layer (config.json indexer_types) reusing another stage's top-k; choose the pipeline "
                         "split (--decoder-first/last-pipeline-num-layers) so every stage starts on a full layer")


def positions_hook(context: ForwardContext):
    """GPTModel forward pre-hook: hand the micro-batch's position_ids to the DSA layers, reset the shared choices."""

    def hook(module, args, kwargs):
        positions = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
        if positions is None:
            raise ValueError("DeepSeek sparse attention needs position_ids (each token's position in its sample)")
        context.positions = positions if positions.dim() == 2 else positions[None]
        context.keep = {}

    return hook

"""Build megatron-core GPTModel chunks from Megatron-style args (Qwen2/2.5, Qwen3, Llama 3, Qwen3-MoE, GLM-4 dense,
GLM-4.5-style MoE, DeepSeek-V3-style multi-latent attention).

Args use Megatron-LM dest names (num_layers, hidden_size, ...). Flags left unset are filled from an HF
config.json by `slime_like.config.hf_config.fill_args_from_hf` (the trainer and the conversion tools call it).
The layer spec and every kernel fusion follow what this machine can run (backends/megatron/kernels.py): the
TransformerEngine spec when CUDA is present and TE importable (unless --transformer-impl local / --attention-backend
local), mcore's local (pure torch) spec otherwise; a fusion is on only when its kernel is importable, and one the
user asked for that cannot run is an error naming the flag (the TransformerConfig: transformer_config.py).
role="critic" replaces the LM head by a scalar value head.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from slime_like.backends.megatron.transformer_config import kernel_choice, transformer_config_from_args


def padded_vocab_size(args) -> int:
    """Megatron's rule: round vocab_size up to make_vocab_size_divisible_by * TP (default 128)."""
    multiple = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size
    return (args.vocab_size + multiple - 1) // multiple * multiple


def uses_te_spec(args) -> bool:
    """Whether build_model builds TransformerEngine's layer spec for these args on this machine."""
    return kernel_choice(args).te_spec


def layer_spec(config, args, vp_stage=None, dsa_context=None):
    """TE spec where kernels.resolve chose it (CUDA + TransformerEngine), local (pure torch) spec otherwise;
    MoE-aware per layer (the layers of virtual stage `vp_stage` under an interleaved schedule). `dsa_context`: the
    chunk's DeepSeek sparse attention context (dsa.py), for DeepSeek-V3.2 / GLM-5."""
    from megatron.core.models.gpt.gpt_layer_specs import (get_gpt_decoder_block_spec,
                                                          get_gpt_layer_local_spec,
                                                          get_gpt_layer_with_transformer_engine_spec)

    from slime_like.config.slime_paths import BUILT_SPECS, LINEAR_ATTENTION_SPECS, MINIMAX_M2_SPEC

    spec_flag = tuple(args.spec or ())
    if spec_flag and spec_flag not in BUILT_SPECS:  # the launch check says so first (config/support.py)
        raise ValueError(f"--spec {' '.join(spec_flag)}: custom layer specs are not built; of slime's plugins only "
                         + " and ".join(f"`--spec {' '.join(s)}`" for s in BUILT_SPECS) + " are")
    te, mla = uses_te_spec(args), config.multi_latent_attention
    hybrid = spec_flag in LINEAR_ATTENTION_SPECS
    if hybrid or (config.layernorm_zero_centered_gamma and not te):  # Qwen3-Next / Qwen3.5 (linear_attention_spec.py)
        from slime_like.backends.megatron import linear_attention_spec as hybrid_spec

        spec = hybrid_spec.block_spec_for(config, te, vp_stage)
        if not te:
            spec = hybrid_spec.use_zero_centered_norms(spec)
        if hybrid:
            spec = hybrid_spec.use_linear_attention(spec, config, args.hf_linear_attention, te, vp_stage)
    elif config.num_moe_experts:  # a block spec: dense and MoE layers may alternate (moe_layer_freq)
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=te, normalization=config.normalization,
                                          vp_stage=vp_stage)
    elif te:
        spec = get_gpt_layer_with_transformer_engine_spec(qk_layernorm=config.qk_layernorm, multi_latent_attention=mla)
    else:
        spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization=config.normalization,
                                        multi_latent_attention=mla)
    # torch's SDPA, per sample in a packed row; context parallelism's all-gather attention (sdpa_attention.py)
    if not te and (args.attention_backend != "local" or args.context_parallel_size > 1):
        from slime_like.backends.megatron.sdpa_attention import use_sdpa_attention

        spec = use_sdpa_attention(spec)
    if mla and not te:
        from slime_like.backends.megatron.mla import use_local_mla_attention

        spec = use_local_mla_attention(spec)
    if args.hf_sparse_attention:  # DeepSeek-V3.2 / GLM-5: the indexer and top-k attention (backends/megatron/dsa.py)
        from slime_like.backends.megatron import dsa

        spec = dsa.use_sparse_attention(spec, sparse_settings(args), dsa_context or dsa.ForwardContext())
    if spec_flag == MINIMAX_M2_SPEC:  # query / key norm over all heads (backends/megatron/qk_norm.py)
        from slime_like.backends.megatron.qk_norm import use_across_heads_qk_norm

        spec = use_across_heads_qk_norm(spec, config.num_query_groups or config.num_attention_heads,
                                        config.tensor_model_parallel_size)
    post_attn, post_mlp = bool(args.post_self_attn_layernorm), bool(args.post_mlp_layernorm)
    if post_attn or post_mlp:  # GLM-4 dense sandwich norms (backends/megatron/sandwich.py)
        from slime_like.backends.megatron.sandwich import use_sandwich_norms

        spec = use_sandwich_norms(spec, _norm_class(te, spec), post_attn, post_mlp)
    return spec


def _norm_class(te: bool, spec):
    """The norm module the layer spec builds (TE fuses its own into the linears: TENorm stands alone)."""
    if te:
        from megatron.core.extensions.transformer_engine import TENorm

        return TENorm
    return (getattr(spec, "layer_specs", None) or [spec])[0].submodules.input_layernorm


class ValueHead(torch.nn.Module):
    """Critic head: hidden -> 1 scalar per token, replicated on every TP rank (it is tiny).

    Called like mcore's output layer (`layer(hidden, weight=..., runtime_gather_output=...)` -> (out, bias)),
    so GPTModel returns [batch, seq, 1] values instead of logits.
    """

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.sequence_parallel = False
        self.weight = torch.nn.Parameter(torch.empty(1, config.hidden_size, dtype=config.params_dtype))
        torch.nn.init.normal_(self.weight, mean=0.0, std=config.init_method_std)

    def forward(self, hidden, weight=None, runtime_gather_output=None):
        if self.config.sequence_parallel:  # hidden is split over sequence: gather (backward splits)
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return F.linear(hidden, self.weight.to(hidden.dtype)), None


PADDED_LOGIT = -1.0e4  # exp(-1e4) == 0 in fp32/bf16, yet finite, so p * logit and entropies stay NaN-free


def _mask_padded_vocab(vocab: int, padded: int):
    """Forward hook on the LM head: logits of Megatron's padding rows (ids >= vocab) become PADDED_LOGIT.

    Padding rows hold zeros, whose logit 0 would take probability mass the HF model (and the rollout
    engine) never gives them; masked, the trainer's softmax equals HF's over the real vocabulary.
    """

    def hook(module, inputs, output):
        from megatron.core import parallel_state as ps

        logits, bias = output
        width = logits.shape[-1]  # this TP rank's shard, or the full padded vocab when gathered
        start = 0 if width == padded else ps.get_tensor_model_parallel_rank() * width
        ids = torch.arange(start, start + width, device=logits.device)
        return logits.masked_fill(ids >= vocab, PADDED_LOGIT), bias

    return hook


def sparse_settings(args):
    """dsa.SparseSettings of a DeepSeek-V3.2 / GLM-5 checkpoint (config.json's indexer, --allgather-cp)."""
    from slime_like.backends.megatron.dsa import SparseSettings

    cfg = args.hf_sparse_attention
    return SparseSettings(topk=cfg["topk"], n_heads=cfg["n_heads"], head_dim=cfg["head_dim"],
                          shared_layers=tuple(cfg["shared_layers"]), interleaved_rope=cfg["interleaved_rope"],
                          allgather_cp=bool(args.allgather_cp))


def _vision_family(args):
    """(VisionFamily, transformers config) of a vision-language checkpoint (backends/megatron/vision.py), else None."""
    from slime_like.config.hf_families import family_of

    if not family_of({"model_type": args.hf_model_type}).vision_language:
        return None
    from slime_like.backends.megatron import vision

    return vision.VLM_FAMILIES[args.hf_model_type], vision.hf_vlm_config(args.hf_checkpoint)


def build_model(args, role: str = "actor"):
    """Build this rank's model chunk(s): a list of GPTModel, one per virtual pipeline stage (one without an
    interleaved schedule).

    Must run after parallel.init_distributed. Chunk v of pipeline rank p holds the layers of virtual stage
    v * PP + p (megatron-core's numbering; layer_number stays global); embeddings in the first rank's first chunk,
    final norm + LM head (or value head for role="critic") in the last rank's last chunk.
    """
    from megatron.core import parallel_state as ps

    from slime_like.backends.megatron.mtp import builds_mtp

    if role not in ("actor", "critic", "ref"):
        raise ValueError(f"build_model(role={role!r}): role must be actor, critic or ref")
    config = transformer_config_from_args(args, mtp=builds_mtp(args, role))
    if config.deterministic_mode:  # Megatron-LM's --deterministic-mode: deterministic kernels or an error
        torch.use_deterministic_algorithms(True)
    vpp = config.virtual_pipeline_model_parallel_size
    if vpp is None:
        chunks = [_build_chunk(args, config, role, None, ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage())]
    else:
        chunks = [_build_chunk(args, config, role, v, ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=v),
                               ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=v)) for v in range(vpp)]
    return chunks


def _build_chunk(args, config, role: str, vp_stage, pre: bool, post: bool):
    """One GPTModel chunk: the layers of its (virtual) stage, embeddings when `pre`, the head when `post`."""
    from megatron.core.models.gpt import GPTModel

    critic = role == "critic"
    tie = not args.untie_embeddings_and_output_weights and not critic
    vision = _vision_family(args)
    if vision is not None:
        from slime_like.backends.megatron.vision import VisionGPTModel as GPTModel  # noqa: F811

        config.apply_rope_fusion = False  # M-RoPE angles differ per sample: the unfused path applies them
    dsa_context = None
    if args.hf_sparse_attention:
        from slime_like.backends.megatron import dsa

        dsa_context = dsa.ForwardContext()
    spec = layer_spec(config, args, vp_stage, dsa_context)
    mtp_spec = None
    if config.mtp_num_layers:  # --enable-mtp-training (mtp.py): the MTP block on the last stage's last chunk
        from slime_like.backends.megatron import mtp

        mtp_spec = mtp.block_spec(config, spec, uses_te_spec(args), vp_stage)
    model = GPTModel(config=config, transformer_layer_spec=spec, mtp_block_spec=mtp_spec,
                     vocab_size=padded_vocab_size(args),
                     max_sequence_length=args.max_position_embeddings,
                     pre_process=pre, post_process=post,
                     share_embeddings_and_output_weights=tie, parallel_output=True,
                     position_embedding_type=args.position_embedding_type,
                     rotary_base=int(args.rotary_base),
                     rotary_percent=args.rotary_percent,
                     rope_scaling=args.use_rope_scaling,  # Llama 3.1 style
                     rope_scaling_factor=args.rope_scaling_factor,
                     vp_stage=vp_stage)
    if vision is not None:
        model.attach_vision(vision[1], vision[0], args.rotary_base, config.params_dtype)
        if args.freeze_vision_tower and model.pre_process:
            model.visual.requires_grad_(False)
    if critic and post:
        model.output_layer = ValueHead(config)
    elif post:
        if padded_vocab_size(args) > args.vocab_size:
            model.output_layer.register_forward_hook(_mask_padded_vocab(args.vocab_size, padded_vocab_size(args)))
        from slime_like.backends.megatron import response_rows

        response_rows.attach(model)  # the trainer's response-positions-only forward (issue 26)
    if mtp_spec is not None:
        mtp.attach(model)
    if dsa_context is not None:  # the sparse attention layers rotate at each token's position in its sample
        dsa.check_chunk_start(model, sparse_settings(args))
        model.register_forward_pre_hook(dsa.positions_hook(dsa_context), with_kwargs=True)
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    for p in model.parameters():  # mcore's DDP/optimizer expect these attributes on every param
        if not hasattr(p, "tensor_model_parallel"):
            p.tensor_model_parallel, p.partition_dim, p.partition_stride = False, -1, 1
    return model

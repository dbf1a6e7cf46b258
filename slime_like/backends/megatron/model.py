"""Build megatron-core GPTModel chunks from Megatron-style args (Qwen2/2.5, Qwen3, Llama 3, Qwen3-MoE, GLM-4 dense,
GLM-4.5-style MoE, DeepSeek-V3-style multi-latent attention).

Args use Megatron-LM dest names (num_layers, hidden_size, ...). Flags left unset are filled from an HF
config.json by `slime_like.config.hf_config.fill_args_from_hf` (the trainer and the conversion tools call it).
The layer spec and every kernel fusion follow what this machine can run (backends/megatron/kernels.py): the
TransformerEngine spec when CUDA is present and TE importable (unless --transformer-impl local / --attention-backend
local), mcore's local (pure torch) spec otherwise; a fusion is on only when its kernel is importable, and one the
user asked for that cannot run is an error naming the flag. role="critic" replaces the LM head by a scalar value head.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def padded_vocab_size(args) -> int:
    """Megatron's rule: round vocab_size up to make_vocab_size_divisible_by * TP (default 128)."""
    multiple = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size
    return (args.vocab_size + multiple - 1) // multiple * multiple


def params_dtype(args) -> torch.dtype:
    if args.bf16:
        return torch.bfloat16
    if args.fp16:
        return torch.float16
    return torch.float32


def virtual_pipeline_size(args) -> int | None:
    """Model chunks per pipeline rank (megatron-core's virtual_pipeline_model_parallel_size; None: one), derived
    as Megatron-LM does from the two flags (checked by config/trainer_megatron.check_virtual_pipeline)."""
    per_layer, per_rank = args.num_layers_per_virtual_pipeline_stage, args.num_virtual_stages_per_pipeline_rank
    if per_layer is not None:
        vpp = args.num_layers // args.pipeline_model_parallel_size // per_layer
    else:
        vpp = per_rank
    return vpp if vpp and vpp > 1 else None


def transformer_config_from_args(args, mtp: bool = False):
    """TransformerConfig from Megatron-style args; a CUDA kernel fusion is on only where its kernel is available
    (kernels.resolve; raises ValueError listing the explicit requests this machine cannot honour). `mtp`: with
    --mtp-num-layers multi-token-prediction layers (mtp.py)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    missing = [n for n in ("num_layers", "hidden_size", "num_attention_heads") if getattr(args, n) is None]
    if missing:
        raise ValueError(f"model flags missing: {', '.join('--' + m.replace('_', '-') for m in missing)}; "
                         "source a scripts/models/*.sh MODEL_ARGS or pass --hf-checkpoint to read them from config.json")
    cuda = torch.cuda.is_available()
    kernels = kernel_choice(args)
    dtype = params_dtype(args)
    swiglu = args.swiglu
    kw = dict(
        num_layers=args.num_layers, hidden_size=args.hidden_size,
        ffn_hidden_size=args.ffn_hidden_size,
        num_attention_heads=args.num_attention_heads,
        num_query_groups=args.num_query_groups if args.group_query_attention else None,
        kv_channels=args.kv_channels,
        normalization=args.normalization, layernorm_epsilon=args.norm_epsilon,
        gated_linear_unit=swiglu, activation_func=F.silu if swiglu else F.gelu,
        add_bias_linear=args.add_bias_linear,  # dest of --disable-bias-linear (store_false)
        add_qkv_bias=args.add_qkv_bias,
        qk_layernorm=args.qk_layernorm,
        hidden_dropout=args.hidden_dropout, attention_dropout=args.attention_dropout,
        init_method_std=args.init_method_std,
        params_dtype=dtype, pipeline_dtype=dtype, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
        attention_softmax_in_fp32=args.attention_softmax_in_fp32,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        # uneven split (--decoder-first/last-pipeline-num-layers); each layer's layer_number stays global, so the HF
        # mapping and the weight push walk each stage's own layers
        num_layers_in_first_pipeline_stage=args.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=args.decoder_last_pipeline_num_layers,
        # interleaved schedule (config/trainer_megatron.check_virtual_pipeline): model chunks per pipeline rank
        virtual_pipeline_model_parallel_size=virtual_pipeline_size(args),
        # Megatron-LM's default with an interleaved schedule (its --no-overlap-p2p-communication is off): one
        # direction per exchange, so at PP=2, where the previous and the next stage are the same rank, the
        # activation and the gradient (and their shapes) cannot be taken for each other
        overlap_p2p_comm=virtual_pipeline_size(args) is not None,
        batch_p2p_comm=virtual_pipeline_size(args) is None,
        context_parallel_size=args.context_parallel_size,
        # TE's CP attention: p2p ring / all_gather / a2a per layer (Megatron's --cp-comm-type; one value for all)
        cp_comm_type=_cp_comm_type(args) if kernels.te_spec and args.context_parallel_size > 1 else None,
        expert_model_parallel_size=args.expert_model_parallel_size,
        expert_tensor_parallel_size=args.expert_tensor_parallel_size,
        use_cpu_initialization=not cuda,
        perform_initialization=True,
        # rollout batches vary in length: under PP the p2p shapes must be exchanged every micro-batch
        variable_seq_lengths=args.pipeline_model_parallel_size > 1,
        **{k: v for k, v in kernels.fields.items() if not k.startswith("moe_")},
        recompute_granularity=args.recompute_granularity, recompute_method=args.recompute_method,
        recompute_num_layers=args.recompute_num_layers,
        calculate_per_token_loss=args.calculate_per_token_loss,
        deterministic_mode=bool(args.deterministic_mode),
        rotary_interleaved=bool(args.rotary_interleaved),  # GLM-4: RoPE on interleaved pairs
        # Qwen3-Next / Qwen3.5: sigmoid gate on the attention output (slime passes both spellings), 1 + weight norms
        attention_output_gate=bool(args.attention_output_gate or args.use_gated_attention),
        layernorm_zero_centered_gamma=bool(args.apply_layernorm_1p),
        cuda_graph_scope=[],  # mcore's default 'full' is deprecated (a warning per model) and means the same
        mtp_num_layers=args.mtp_num_layers if mtp else None,
        mtp_loss_scaling_factor=args.mtp_loss_scaling_factor if mtp else None,
    )
    if kw.get("fp8"):
        _check_fp8_device(args.fp8_recipe)
    kw["moe_token_dispatcher_type"] = _token_dispatcher(args, kw["variable_seq_lengths"])
    if args.num_experts:
        kw.update(_moe_kwargs(args, kernels.fields))
    if args.multi_latent_attention:
        return _mla_config(args, kw)
    return TransformerConfig(**kw)


# compute capability each FP8 recipe needs (TransformerEngine: FP8 GEMMs from Ada / Hopper; MXFP8 on Blackwell;
# the 128-block scaling of --fp8-recipe blockwise on Hopper and later)
FP8_CAPABILITY = {"delayed": (8, 9), "tensorwise": (8, 9), "blockwise": (9, 0), "mxfp8": (10, 0)}


def _check_fp8_device(recipe: str) -> None:
    """This GPU runs the FP8 recipe, or a ValueError naming the flag, the GPU and what it needs."""
    need = FP8_CAPABILITY[recipe]
    have = torch.cuda.get_device_capability()
    if tuple(have) < need:
        raise ValueError(f"--fp8-recipe {recipe} needs a GPU of compute capability {need[0]}.{need[1]}+ "
                         f"({torch.cuda.get_device_name()} is {have[0]}.{have[1]}): drop the FP8 flags (bf16) or "
                         + ("use --fp8-recipe delayed" if need > (8, 9) else "run on Ada / Hopper / Blackwell GPUs"))


def _cp_comm_type(args):
    """Megatron-LM's --cp-comm-type values as TransformerConfig takes them (mcore spells all-gather all_gather)."""
    values = [v.replace("allgather", "all_gather") for v in args.cp_comm_type]
    return values[0] if len(values) == 1 else values


def _token_dispatcher(args, variable_seq_lengths: bool) -> str:
    """mcore rejects Megatron's default "allgather" dispatcher with variable_seq_lengths, even for dense
    models (where it is unused); MoE + PP needs alltoall (or flex)."""
    dispatcher = args.moe_token_dispatcher_type
    if variable_seq_lengths and dispatcher == "allgather":
        if args.num_experts:
            raise ValueError("--moe-token-dispatcher-type allgather cannot run with pipeline parallelism (variable "
                             "sequence lengths); use --moe-token-dispatcher-type alltoall")
        dispatcher = "alltoall"
    return dispatcher


def kernel_choice(args):
    """kernels.check for this process's device (CUDA visible or not): the layer spec and the fusion fields."""
    from slime_like.backends.megatron import kernels

    return kernels.check(args, torch.cuda.is_available())


def _moe_kwargs(args, kernel_fields: dict) -> dict:
    """TransformerConfig's MoE fields (grouped GEMM and permute fusion as kernels.resolve chose)."""
    return dict(num_moe_experts=args.num_experts, moe_router_topk=args.moe_router_topk,
                moe_ffn_hidden_size=args.moe_ffn_hidden_size,
                moe_shared_expert_intermediate_size=args.moe_shared_expert_intermediate_size,
                moe_shared_expert_gate=bool(args.moe_shared_expert_gate),  # Qwen2-MoE's sigmoid gate
                moe_layer_freq=args.moe_layer_freq,
                moe_router_load_balancing_type=args.moe_router_load_balancing_type,
                moe_aux_loss_coeff=args.moe_aux_loss_coeff,
                moe_router_score_function=args.moe_router_score_function,
                moe_router_pre_softmax=args.moe_router_pre_softmax,
                moe_grouped_gemm=kernel_fields["moe_grouped_gemm"],
                moe_router_dtype=args.moe_router_dtype,
                moe_permute_fusion=kernel_fields["moe_permute_fusion"],
                moe_enable_routing_replay=bool(args.use_routing_replay or args.use_rollout_routing_replay),
                **_router_kwargs(args))


def _mla_config(args, kw):
    """Multi-latent attention (DeepSeek-V3 / Kimi-K2 / Moonlight). RoPE lives inside the attention (GPTModel builds
    none): plain RoPE at --rotary-scaling-factor 1, megatron-core's YaRN otherwise (factor, --mscale,
    --mscale-all-dim from the flags; beta_fast / beta_slow / original length from config.json where the trainer
    read one, megatron-core's defaults 32 / 1 / 4096 otherwise, as in Megatron-LM)."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    factor = args.rotary_scaling_factor
    kw.pop("kv_channels", None)
    kw.update(q_lora_rank=args.q_lora_rank, kv_lora_rank=args.kv_lora_rank, qk_head_dim=args.qk_head_dim,
              qk_pos_emb_head_dim=args.qk_pos_emb_head_dim, v_head_dim=args.v_head_dim,
              rope_type="rope" if factor == 1.0 else "yarn", rotary_base=args.rotary_base,
              rotary_percent=1.0, rotary_scaling_factor=factor, mscale=args.mscale, mscale_all_dim=args.mscale_all_dim,
              apply_rope_fusion=False, num_query_groups=None)
    yarn = args.hf_yarn or {}
    if factor != 1.0 and not yarn.get("truncate", True):
        raise ValueError("config.json rope_scaling.truncate false: megatron-core's YaRN rounds the correction range "
                         "to whole dims (truncate true) only")
    kw.update({k: yarn[k] for k in ("original_max_position_embeddings", "beta_fast", "beta_slow") if k in yarn})
    return MLATransformerConfig(**kw)


def _router_kwargs(args) -> dict:
    """DeepSeek-V3 / GLM-4.5 routing: expert-bias correction, group-limited top-k, scaled top-k weights."""
    kw = dict(moe_router_enable_expert_bias=bool(args.moe_router_enable_expert_bias),
              moe_router_bias_update_rate=args.moe_router_bias_update_rate,
              moe_router_num_groups=args.moe_router_num_groups,
              moe_router_group_topk=args.moe_router_group_topk,
              moe_router_topk_scaling_factor=args.moe_router_topk_scaling_factor)
    groups, group_topk = kw["moe_router_num_groups"], kw["moe_router_group_topk"]
    topk = args.moe_router_topk
    if groups and groups > 1 and group_topk and topk // group_topk != 2:
        # megatron-core scores a group by its top (topk // group_topk) experts; HF's DeepSeek-V3 / GLM-4.5 by its
        # top 2
        raise ValueError(f"--moe-router-num-groups {groups} --moe-router-group-topk {group_topk} with "
                         f"--moe-router-topk {topk}: megatron-core ranks groups by their top {topk // group_topk} "
                         "experts, the HF models by their top 2, so routing would differ; it needs "
                         "topk = 2 x group-topk")
    return kw


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
    from slime_like.config.hf_config import family_of

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

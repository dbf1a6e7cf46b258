"""megatron-core's TransformerConfig (MLATransformerConfig for multi-latent attention) from Megatron-style args.

One helper per group of fields: the parallel layout (TP / PP / virtual pipeline / CP / EP), MoE and its router,
multi-latent attention with its RoPE / YaRN; multi-token prediction and the kernel fusions (kernels.py) are chosen
here as well. A fusion is on only where its kernel is available; an explicit request this machine cannot honour is a
ValueError naming the flag. model.py builds the layer spec and the GPTModel chunks from this config.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


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
        **_parallel_kwargs(args, kernels.te_spec),
        use_cpu_initialization=not cuda,
        perform_initialization=True,
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


def _parallel_kwargs(args, te_spec: bool) -> dict:
    """TransformerConfig's parallel layout: TP, PP (uneven and interleaved), CP, EP."""
    return dict(
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
        cp_comm_type=_cp_comm_type(args) if te_spec and args.context_parallel_size > 1 else None,
        expert_model_parallel_size=args.expert_model_parallel_size,
        expert_tensor_parallel_size=args.expert_tensor_parallel_size,
        # rollout batches vary in length: under PP the p2p shapes must be exchanged every micro-batch
        variable_seq_lengths=args.pipeline_model_parallel_size > 1,
    )


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

"""The model: Megatron-LM's architecture flags (what scripts/models/*.sh set) and Megatron's own derived model
defaults, so the dry run shows what the trainer will build. config.json <-> these flags: hf_config.py.

Megatron reference: megatron/training/arguments.py, `_add_network_size_args` and `_add_moe_args`.
"""
from __future__ import annotations

import argparse
import json
import os

from slime_like.config.errors import ConfigError
from slime_like.config.types import moe_layer_freq
from slime_like.registry import ROLLOUT_ENGINES, TRAINER_BACKENDS
from slime_like.config.types import Float, Int, moe_layer_freq


def add_model_group(parser):
    g = parser.add_argument_group("model", "Model architecture (Megatron-LM flags; set by scripts/models/*.sh)")
    a = g.add_argument
    a("--num-layers", type=Int(1), default=None, help="Number of transformer layers.")
    a("--hidden-size", type=Int(1), default=None, help="Transformer hidden size.")
    a("--ffn-hidden-size", type=Int(1), default=None,
      help="MLP intermediate size; Megatron derives 4*hidden (or 8/3*hidden rounded to 64 with --swiglu) if unset.")
    a("--num-attention-heads", type=Int(1), default=None, help="Number of attention (query) heads.")
    a("--kv-channels", type=Int(1), default=None,
      help="Per-head dimension; defaults to hidden_size // num_attention_heads.")
    a("--group-query-attention", action="store_true", help="Use grouped-query attention (with --num-query-groups).")
    a("--num-query-groups", type=Int(1), default=1, help="Number of key/value heads under --group-query-attention.")
    a("--max-position-embeddings", type=Int(1), default=None, help="Maximum sequence length the positions cover.")
    a("--position-embedding-type", default="learned_absolute",
      choices=["learned_absolute", "rope", "mrope", "relative", "none"], help="Position embedding type.")
    a("--use-rotary-position-embeddings", action="store_true",
      help="Use rotary position embeddings (older spelling of --position-embedding-type rope).")
    a("--rotary-base", type=Int(1), default=10000, help="RoPE theta (HF rope_theta).")
    a("--rotary-percent", type=Float(0, 1, lo_open=True), default=1.0,
      help="Fraction of each head's dims that get RoPE (HF partial_rotary_factor).")
    a("--rotary-interleaved", action="store_true", help="Interleaved (GPT-J style) rotary embedding.")
    a("--rotary-seq-len-interpolation-factor", type=Int(1), default=None,
      help="Linear RoPE position interpolation factor.")
    a("--use-rope-scaling", action="store_true", help="Llama-3.1 style RoPE frequency scaling.")
    # two flags as in Megatron-LM: Llama 3.x frequency scaling reads --rope-scaling-factor, MLA's YaRN
    # --rotary-scaling-factor (slime's llama files pass the latter; config/support.py says when that is ignored)
    a("--rope-scaling-factor", type=Float(0, lo_open=True), default=8.0,
      help="Llama 3.x RoPE scaling factor for --use-rope-scaling.")
    a("--rotary-scaling-factor", type=Float(0, lo_open=True), default=1.0,
      help="YaRN RoPE scaling factor of multi-latent attention (HF rope_scaling factor); 1 = no scaling.")
    a("--no-rope-fusion", action="store_false", dest="apply_rope_fusion", help="Disable the fused RoPE kernel.")
    a("--no-position-embedding", action="store_false", dest="add_position_embedding",
      help="Do not add learned absolute position embeddings.")
    a("--normalization", default="LayerNorm", choices=["LayerNorm", "RMSNorm"], help="Normalisation layer type.")
    a("--norm-epsilon", type=Float(0), default=1e-5, help="Epsilon of the normalisation layers (HF rms_norm_eps).")
    a("--apply-layernorm-1p", action="store_true", help="LayerNorm with zero-centred gamma (weight + 1).")
    a("--apply-residual-connection-post-layernorm", action="store_true",
      help="Residual taken after the layernorm (BERT style).")
    a("--post-self-attn-layernorm", action="store_true", help="Extra norm after self-attention (GLM-4 'sandwich' norm).")
    a("--post-mlp-layernorm", action="store_true", help="Extra norm after the MLP (GLM-4 'sandwich' norm).")
    a("--swiglu", action="store_true", help="SwiGLU MLP (gate and up projections).")
    a("--openai-gelu", action="store_true", help="OpenAI's tanh GeLU approximation.")
    a("--squared-relu", action="store_true", help="Squared ReLU activation.")
    a("--untie-embeddings-and-output-weights", action="store_true",
      help="Separate input embedding and output layer (HF tie_word_embeddings = false).")
    a("--disable-bias-linear", action="store_false", dest="add_bias_linear",
      help="No bias in the linear layers (dest add_bias_linear).")
    a("--add-qkv-bias", action="store_true", dest="add_qkv_bias", help="Bias in the QKV projection only (Qwen2).")
    a("--qk-layernorm", action="store_true", help="RMSNorm on queries and keys per head (Qwen3).")
    a("--vocab-size", type=Int(1), default=None, help="Vocabulary size (HF vocab_size).")
    a("--padded-vocab-size", type=Int(1), default=None, help="Use this padded vocabulary size instead of deriving it.")
    a("--make-vocab-size-divisible-by", type=Int(1), default=128,
      help="Pad the vocabulary to a multiple of this times the TP size.")
    a("--seq-length", type=Int(1), default=None, help="Maximum training sequence length.")
    a("--init-method-std", type=Float(0), default=0.02, help="Std of the normal weight initialisation.")
    a("--attention-dropout", type=Float(0, 1, hi_open=True), default=0.1,
      help="Dropout after the attention softmax (Megatron default 0.1).")
    a("--hidden-dropout", type=Float(0, 1, hi_open=True), default=0.1,
      help="Dropout on the hidden states (Megatron default 0.1).")
    a("--multi-latent-attention", action="store_true", help="Multi-latent attention (DeepSeek-V2/V3).")
    a("--q-lora-rank", type=Int(1), default=None, help="MLA query low-rank dimension.")
    a("--kv-lora-rank", type=Int(1), default=32, help="MLA key/value low-rank dimension.")
    a("--qk-head-dim", type=Int(1), default=128, help="MLA q/k head dimension without RoPE.")
    a("--qk-pos-emb-head-dim", type=Int(1), default=64, help="MLA q/k RoPE head dimension.")
    a("--v-head-dim", type=Int(1), default=128, help="MLA value head dimension.")
    a("--mscale", type=Float(0), default=1.0, help="MLA YaRN attention-scale factor (HF rope_scaling mscale).")
    a("--mscale-all-dim", type=Float(0), default=0.0, help="MLA YaRN mscale_all_dim (HF rope_scaling mscale_all_dim).")
    a("--attention-output-gate", action="store_true",
      help="Sigmoid gate on the attention output (Qwen3-Next / Qwen3.5 full-attention layers).")
    a("--use-gated-attention", action="store_true",
      help="Gated attention, the spelling slime's Qwen3-Next / Qwen3.5 model files pass with --attention-output-gate.")
    a("--tokenizer-type", default=None, help="Megatron tokenizer type (slime reads the tokenizer from --hf-checkpoint).")
    a("--tokenizer-model", default=None, help="Tokenizer path for Megatron tokenizers.")
    a("--trust-remote-code", action="store_true", default=False,
      help="Megatron's flag: let transformers run the Python code shipped with --hf-checkpoint (tokenizer, model) "
           "and pass --trust-remote-code to SGLang. Off by default: a checkpoint folder is data, not code.")
    a("--model-name", default=None,
      help="Model family used for Megatron->HF weight naming; default: derived from --hf-checkpoint's config.json.")
    a("--custom-model-provider-path", default=None, help="'module.function' that builds the Megatron model.")
    a("--spec", nargs="*", default=None, help="Megatron layer spec as 'module function' (custom architectures).")

    m = parser.add_argument_group("model (MoE)", "Mixture-of-experts architecture (Megatron-LM flags)")
    a = m.add_argument
    a("--num-experts", type=Int(1), default=None, help="Number of routed experts (HF num_experts / n_routed_experts).")
    a("--moe-layer-freq", type=moe_layer_freq, default=1,
      help="Int N (every N-th layer is MoE) or a list expression like '([0]*3+[1]*45)'.")
    a("--moe-ffn-hidden-size", type=Int(1), default=None, help="Intermediate size of each routed expert.")
    a("--moe-shared-expert-intermediate-size", type=Int(1), default=None,
      help="Total intermediate size of shared experts.")
    a("--moe-shared-expert-overlap", action="store_true", help="Overlap shared-expert compute with dispatch.")
    a("--moe-shared-expert-gate", action="store_true", help="Sigmoid gate on the shared experts' output (Qwen-MoE).")
    a("--moe-router-topk", type=Int(1), default=2, help="Experts per token (HF num_experts_per_tok).")
    a("--moe-router-load-balancing-type", default="aux_loss",
      choices=["aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"], help="Router load balancing.")
    a("--moe-router-score-function", default="softmax", choices=["softmax", "sigmoid"], help="Router score function.")
    a("--moe-router-pre-softmax", action="store_true", help="Softmax before top-k (Mixtral-style is after).")
    a("--moe-router-dtype", default=None, choices=["fp32", "fp64"], help="Router computation dtype.")
    a("--moe-router-num-groups", type=Int(1), default=None, help="Expert groups for group-limited routing.")
    a("--moe-router-group-topk", type=Int(1), default=None, help="Groups selected per token in group-limited routing.")
    a("--moe-router-topk-scaling-factor", type=Float(0), default=None,
      help="Scale applied to the top-k routing weights.")
    a("--moe-router-enable-expert-bias", action="store_true", help="Aux-loss-free expert bias (DeepSeek-V3).")
    a("--moe-router-bias-update-rate", type=Float(0), default=1e-3, help="Update rate of the expert bias.")
    a("--moe-aux-loss-coeff", type=Float(0), default=0.0, help="Auxiliary load-balancing loss coefficient.")
    a("--moe-z-loss-coeff", type=Float(0), default=None, help="Router z-loss coefficient.")
    a("--moe-input-jitter-eps", type=Float(0), default=None, help="Jitter added to router inputs.")
    a("--moe-grouped-gemm", action="store_true", help="Grouped GEMM for the experts (CUDA).")
    a("--moe-token-dispatcher-type", default="allgather", choices=["allgather", "alltoall", "flex"],
      help="Token dispatcher.")
    a("--moe-enable-deepep", action="store_true", help="DeepEP dispatcher (CUDA, with --moe-token-dispatcher-type flex).")
    a("--moe-permute-fusion", action="store_true", help="Fused token permutation (CUDA).")
    a("--moe-token-drop-policy", default="probs", choices=["probs", "position"], help="Which tokens to drop.")
    a("--moe-expert-capacity-factor", type=Float(0, lo_open=True), default=None,
      help="Expert capacity factor; None = no dropping.")
    a("--moe-pad-expert-input-to-capacity", action="store_true", help="Pad expert inputs to capacity.")
    a("--mtp-num-layers", type=Int(0), default=None, help="Number of multi-token-prediction layers.")
    a("--mtp-loss-scaling-factor", type=Float(0), default=0.2, help="Scale of the MTP loss.")
    a("--enable-mtp-training", action="store_true", help="Train the MTP layers too (slime).")
    # slime has no flag of its own for this (its Megatron trainer freezes by regex, --freeze-params-name-list, not
    # built here; its former FSDP trainer trained the whole HF model): named as the contract of issue 30 says
    a("--freeze-vision-tower", action=argparse.BooleanOptionalAction, default=False,
      help="Vision-language --hf-checkpoint: keep the vision tower (patch embedding, vision blocks, merger / "
           "projector) frozen; the language model trains. Weight pushes then leave the tower out. Default: train it.")
    return parser


def check_vision_tower(args) -> None:
    """--freeze-vision-tower on a text-only --hf-checkpoint would freeze nothing: an error, not a no-op."""
    if not args.freeze_vision_tower or not args.hf_checkpoint:
        return
    path = os.path.join(args.hf_checkpoint, "config.json")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return  # missing or unreadable: the checkpoint checks say so
    if isinstance(cfg, dict) and not cfg.get("vision_config"):
        raise ConfigError(f"--freeze-vision-tower: --hf-checkpoint {args.hf_checkpoint} is a text model "
                          f"(model_type {cfg.get('model_type')!r}, no vision_config in config.json), so there is no "
                          "vision tower to freeze; drop the flag or use a vision-language checkpoint")


def add_routing_replay_flags(g):
    """(slime extras group: whole-run settings, not per-role) MoE routing replay."""
    a = g.add_argument
    a("--use-routing-replay", action="store_true",
      help="slime's R2: the old-policy scoring pass records each MoE layer's routing; the training forwards of the "
           "rollout replay it (Megatron trainer).")
    a("--use-rollout-routing-replay", action="store_true",
      help="slime's R3: the engines return the experts they routed each token to (return_routed_experts) and the "
           "trainer's forwards replay them (Megatron trainer; SGLang or CPU engine).")


def check_routing_replay(args) -> None:
    """--use-routing-replay / --use-rollout-routing-replay: an MoE model in the Megatron trainer, one pipeline stage,
    no sequence parallelism or recompute (the replayed routing is laid out for whole sequences, forward only)."""
    flags = [f for f, on in (("--use-routing-replay", args.use_routing_replay),
                             ("--use-rollout-routing-replay", args.use_rollout_routing_replay)) if on]
    if not flags:
        return
    problems = []
    if len(flags) == 2:
        problems.append("pick one of --use-routing-replay (replay the trainer's own old-policy routing) and "
                        "--use-rollout-routing-replay (replay the engine's)")
    if not args.num_experts:
        problems.append(f"{flags[0]} needs an MoE model (--num-experts, or an MoE --hf-checkpoint)")
    if not TRAINER_BACKENDS.has(args.train_backend, "routing_replay"):
        problems.append(f"{flags[0]} with --train-backend {args.train_backend}: routing replay runs in the Megatron "
                        "trainer (megatron-core's RouterReplay)")
    if args.pipeline_model_parallel_size > 1 or args.sequence_parallel or args.recompute_granularity:
        problems.append(f"{flags[0]} with pipeline parallelism, --sequence-parallel or --recompute-granularity: the "
                        "replayed routing is laid out for whole sequences in one stage, forward passes only")
    engine = args.rollout_engine
    if args.use_rollout_routing_replay and engine in ROLLOUT_ENGINES \
            and not ROLLOUT_ENGINES.has(engine, "returns_routed_experts"):
        having = " and ".join(map(ROLLOUT_ENGINES.display, ROLLOUT_ENGINES.with_capability("returns_routed_experts")))
        problems.append(f"--use-rollout-routing-replay with --rollout-engine {engine}: "
                        f"{ROLLOUT_ENGINES.display(engine)} does not return the routed experts ({having} do)")
    if problems:
        raise ConfigError("\n".join(problems))


def derive_model_defaults(args, report):
    """Megatron's own derived model defaults, so the dry run shows what the trainer will build."""
    if args.num_attention_heads and args.hidden_size:
        if args.kv_channels is None:
            if args.hidden_size % args.num_attention_heads:
                raise ConfigError(f"--hidden-size {args.hidden_size} is not divisible by --num-attention-heads "
                                  f"{args.num_attention_heads}; set --kv-channels explicitly")
            args.kv_channels = args.hidden_size // args.num_attention_heads
        if not args.group_query_attention:
            args.num_query_groups = args.num_attention_heads
        elif args.num_attention_heads % args.num_query_groups:
            raise ConfigError(f"--num-attention-heads {args.num_attention_heads} is not a multiple of "
                              f"--num-query-groups {args.num_query_groups}")
        if args.ffn_hidden_size is None:
            h = args.hidden_size
            args.ffn_hidden_size = int(4 * h * 2 / 3 / 64) * 64 if args.swiglu else 4 * h
    if args.use_rotary_position_embeddings:
        args.position_embedding_type = "rope"
    if (args.attention_dropout or args.hidden_dropout) and args.loss_type != "sft_loss":
        report.warn(f"--attention-dropout {args.attention_dropout} / --hidden-dropout {args.hidden_dropout} "
                    "(Megatron's defaults are 0.1): the trainer's log-probs will not match the rollout engine's; RL recipes pass "
                    "--attention-dropout 0.0 --hidden-dropout 0.0")
    if args.num_experts and args.moe_ffn_hidden_size is None:
        args.moe_ffn_hidden_size = args.ffn_hidden_size
    if args.max_position_embeddings is None and args.seq_length is not None:
        args.max_position_embeddings = args.seq_length

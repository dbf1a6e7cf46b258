"""Build the HF model of one role (actor / critic / reference), add LoRA, shard it with FSDP2.

- actor / reference: `AutoModelForCausalLM` from --hf-checkpoint (fp32 master weights; the mixed-precision
  policy casts gathered params to --fsdp-param-dtype for compute). Output: logits `[b, S, V]`.
  A vision-language checkpoint (config.json has a vision_config) loads as `AutoModelForImageTextToText`
  (vision.py), its vision tower frozen with --freeze-vision-tower.
- critic: the same backbone (`AutoModel`, the LM without its head) plus a value head `hidden -> 1`
  (normal init, std --init-method-std, as the Megatron critic). Output: values `[b, S, 1]`.
- LoRA (--lora-rank > 0): peft adapters on --lora-target-modules; only adapter (and value-head) params train.
  The reference model is then the same module with adapters disabled: no second copy of the base.
Sharding: every decoder layer is its own FSDP unit, then the root (embeddings, final norm, head) — the
usual FSDP2 recipe: one all-gather per layer, and tied embedding / head weights stay in one unit. A VLM's vision
blocks are units too, and its vision tower (patch embedding, mergers) one more.
"""
from __future__ import annotations

import torch
from torch import nn

from slime_like.backends.fsdp import vision

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class ValueModel(nn.Module):
    """Critic: HF backbone + a linear value head; forward returns `[b, S, 1]` float values."""

    def __init__(self, backbone: nn.Module, hidden_size: int, init_std: float):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1, bias=False)
        nn.init.normal_(self.value_head.weight, mean=0.0, std=init_std)

    def forward(self, input_ids, position_ids=None, **multimodal):
        hidden = self.backbone(input_ids=input_ids, position_ids=position_ids, **multimodal).last_hidden_state
        return self.value_head(hidden.to(self.value_head.weight.dtype))


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks (HF keeps them in a ModuleList named `layers` / `h` / `blocks`); a VLM's
    vision blocks are not the decoder's."""
    best = []
    tower = vision.vision_prefixes(model)
    for name, module in model.named_modules():
        if tower and name.startswith(tower):
            continue
        if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "h", "blocks") \
                and len(module) > len(best):
            best = list(module)
    if not best:
        raise ValueError(f"{type(model).__name__}: no decoder-layer ModuleList (layers / h / blocks) to shard")
    return best


def hf_config(args):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(args.hf_checkpoint, trust_remote_code=_trust(args))
    # the trainer's dropout follows our flags (RL recipes: 0), not whatever the checkpoint was trained with
    for cfg in {id(c): c for c in (config, vision.text_config(config))}.values():
        for key, value in (("attention_dropout", args.attention_dropout),
                           ("hidden_dropout", args.hidden_dropout)):
            if hasattr(cfg, key):
                setattr(cfg, key, float(value))
    return config


def _trust(args) -> bool:
    return bool(args.sglang_server_args.get("trust_remote_code", False))


def load_hf_model(args, role: str, source: str | None = None) -> nn.Module:
    """The unsharded fp32 model of `role` with weights from `source` (default --hf-checkpoint); a VLM's vision
    tower frozen with --freeze-vision-tower."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForImageTextToText

    source = source or args.hf_checkpoint
    config = hf_config(args)
    kw = dict(config=config, dtype=torch.float32, trust_remote_code=_trust(args),
              attn_implementation=attention_implementation(args))
    multimodal = vision.is_vision_language(config)
    if multimodal:
        vision.check_supported(config, f"--hf-checkpoint {args.hf_checkpoint}")
    if role == "critic":
        backbone = AutoModel.from_pretrained(source, **kw)
        model = ValueModel(backbone, vision.text_config(config).hidden_size, float(args.init_method_std))
    else:
        model = (AutoModelForImageTextToText if multimodal else AutoModelForCausalLM).from_pretrained(source, **kw)
    if multimodal and args.freeze_vision_tower:
        vision.freeze(model)
    return model


def attention_implementation(args) -> str:
    """SDPA; under Ulysses sequence parallelism (--context-parallel-size > 1) its all-to-all form (ulysses.py),
    registered in transformers' AttentionInterface when the trainer made its groups."""
    if int(args.context_parallel_size) > 1:
        from slime_like.backends.fsdp.ulysses import ATTENTION

        return ATTENTION
    return "sdpa"


def linear_module_names(model: nn.Module) -> list[str]:
    """Last name components of the model's linear layers (what --lora-target-modules may name)."""
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)})


def add_lora(args, model: nn.Module, role: str) -> nn.Module:
    """peft LoRA on --lora-target-modules; a name the model lacks is an error listing the names it has."""
    from peft import LoraConfig, get_peft_model

    targets = list(args.lora_target_modules)
    if targets != ["all-linear"]:
        names = linear_module_names(model)
        missing = [t for t in targets if t not in names]
        if missing:
            raise ValueError(f"--lora-target-modules {' '.join(missing)}: the model has no such linear module; "
                             f"its linear modules are: {' '.join(names)} (or use all-linear)")
    config = LoraConfig(r=int(args.lora_rank), lora_alpha=float(args.lora_alpha),
                        lora_dropout=float(args.lora_dropout),
                        target_modules="all-linear" if targets == ["all-linear"] else targets, bias="none")
    excluded = vision.linear_names(model) if args.freeze_vision_tower else []  # a frozen tower gets no adapters
    if role == "critic":
        config.modules_to_save = ["value_head"]  # the freshly initialised head must train
        excluded.append("value_head")
    if excluded:
        config.exclude_modules = excluded
    return get_peft_model(model, config)


def mixed_precision(args):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    param = args.fsdp_param_dtype or ("bf16" if args.bf16 else "fp32")
    return MixedPrecisionPolicy(param_dtype=DTYPES[param], reduce_dtype=DTYPES[args.fsdp_reduce_dtype])


def device_mesh(args, world_size: int, device_type: str):
    """1-D mesh (full_shard / shard_grad_op) or 2-D (replicate, shard) for hybrid_shard and no_shard."""
    from torch.distributed.device_mesh import init_device_mesh

    strategy = args.fsdp_sharding_strategy
    shard = world_size
    if strategy == "hybrid_shard":
        shard = min(int(args.fsdp_size), world_size)
    elif strategy == "no_shard":
        shard = 1
    if world_size % shard:
        raise ValueError(f"--fsdp-size {shard} must divide the trainer world size {world_size}")
    if shard == world_size:
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("shard",))
    return init_device_mesh(device_type, (world_size // shard, shard), mesh_dim_names=("replicate", "shard"))


def shard_model(args, model: nn.Module, mesh, trainable: bool = True) -> nn.Module:
    """fully_shard every decoder layer, then the root; forward prefetch and CPU offload per the flags."""
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    strategy = args.fsdp_sharding_strategy
    reshard = args.fsdp_reshard_after_forward
    if reshard is None:
        reshard = strategy != "shard_grad_op"
    kw = dict(mesh=mesh, reshard_after_forward=bool(reshard), mp_policy=mixed_precision(args))
    if args.fsdp_cpu_offload and torch.cuda.is_available():
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=bool(args.fsdp_offload_pin_memory))
    if args.recompute_granularity == "full" and trainable:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}) \
            if hasattr(model, "gradient_checkpointing_enable") else _checkpoint_layers(model)
    layers = decoder_layers(model)
    for unit in vision.shard_units(model) + layers:
        fully_shard(unit, **kw)
    fully_shard(model, **kw)
    if args.fsdp_forward_prefetch:
        for layer, nxt in zip(layers, layers[1:]):
            layer.set_modules_to_forward_prefetch([nxt])
    return model


def _checkpoint_layers(model):
    """Activation checkpointing for models without HF's switch (the critic's ValueModel): per backbone."""
    model.backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

"""ROLL's pipeline + worker YAML (seed 003 and ROLL's RLVR examples) -> the equivalent slime_like flags.

Workers: actor_train (trainer), actor_infer (engines), reference (its own worker when placed apart,
else inside the actor), critic (a second trainer; per-role values go to the critic's role overlay).
See docs/from-roll.md; the schema below is the contract (Map / Read / NoEffect / Refuse per key).
"""
from __future__ import annotations

from slime_like.config.errors import ConfigError
from slime_like.config.frontends import megatron_keys as mk
from slime_like.config.frontends.top_keys import ROLL_TOP_KEYS
from slime_like.config.frontends.common import (Free, Map, NoEffect, Read, Refuse, devices_text, get, parse_devices,
                                                walk)

TOP_KEYS = ROLL_TOP_KEYS
_LOG = "logging detail of ROLL's pipeline"
_TRAIN_STRATEGIES = ("megatron_train", "fsdp2_train")
_INFER_STRATEGIES = ("vllm", "sglang", "hf_infer")


def _f(flag):
    return lambda v, t: t.flag(flag, v)


def _sw(flag):
    return lambda v, t: t.switch(flag, bool(v))


def _fact(name):
    def put(v, t):
        t.facts[name] = v
    return put


def _adv(v, t):
    table = {"grpo": "grpo", "gae": "ppo", "ppo": "ppo", "reinforce_plus_plus": "reinforce_plus_plus",
             "gspo": "gspo"}
    if v not in table:
        raise ConfigError(f"{v!r} is not an estimator here; use one of {', '.join(sorted(table))}")
    t.flag("--advantage-estimator", table[v])


_DTYPES = {"bf16": "--bf16", "fp16": "--fp16", "fp32": None}


def _dtype(role):
    def put(v, t):
        if v not in _DTYPES:
            raise ConfigError(f"{v!r}: use fp32, bf16 or fp16")
        t.facts[f"{role}_dtype"] = v
    return put


def _template(v, t):
    t.facts.setdefault("template", v)


def _model_args(role):
    return {**MODEL_ARGS, "model_name_or_path": Map("str", _fact(f"{role}_model_path")), "dtype": Map("str", _dtype(role))}


MODEL_ARGS = {
    "disable_gradient_checkpointing": NoEffect("bool", "activation recompute is chosen by the Megatron flags "
                                                       "(--recompute-granularity)", harmless=(False, True)),
    "attn_implementation": NoEffect("str", "the trainer chooses attention kernels itself"),
    "ulysses_size": Refuse("int", "context (Ulysses) parallelism is not implemented", ok=(None, 1)),
}


def _train_args(role):
    dest = (lambda d: (lambda v, t: t.role("critic", d, v))) if role == "critic" else None

    def m(flag, d):
        return Map("float" if d in ("lr", "weight_decay", "adam_beta1", "adam_beta2", "max_grad_norm") else "int",
                   dest(d) if dest else _f(flag))

    return {
        "learning_rate": m("--lr", "lr"),
        "weight_decay": m("--weight-decay", "weight_decay"),
        "adam_beta1": m("--adam-beta1", "adam_beta1"),
        "adam_beta2": m("--adam-beta2", "adam_beta2"),
        "max_grad_norm": Map("float", dest("clip_grad") if dest else _f("--clip-grad")),
        "per_device_train_batch_size": Map("int", _fact(f"{role}_per_device")),
        "gradient_accumulation_steps": Map("int", _fact(f"{role}_grad_accum")),
        "warmup_steps": m("--lr-warmup-iters", "lr_warmup_iters"),
        "lr_scheduler_type": Map("str", (lambda v, t: t.role("critic", "lr_decay_style", _sched(v))) if dest
                                 else (lambda v, t: t.flag("--lr-decay-style", _sched(v)))),
        "num_train_epochs": NoEffect("int", "the run length is max_steps (--num-rollout)"),
    }


def _sched(v):
    table = {"constant": "constant", "linear": "linear", "cosine": "cosine", "constant_with_warmup": "constant"}
    if v not in table:
        raise ConfigError(f"{v!r}: use constant, constant_with_warmup, linear or cosine")
    return table[v]


def _data_files(v, t):
    t.facts["train_files"] = [v] if isinstance(v, str) else list(v)


DATA_ARGS = {
    "template": Map("str", _template),
    "file_name": Map("list_or_str", _data_files),
    "prompt": Map("str", _f("--input-key")),
    "messages": Map("str", lambda v, t: (t.flag("--input-key", v), t.flag("--apply-chat-template"))),
    "dataset_dir": Read("str", "the directory relative file_name entries are read from"),
    "domain_interleave_probs": Refuse("dict", "one data stream per run; mix domains in the file", ok=(None,)),
    "preprocessing_num_workers": NoEffect("int", "prompts are read by the rollout manager in-process"),
}


def _gen_args(prefix):
    return {
        "max_new_tokens": Map("int", _f(f"--{prefix}-max-response-len")),
        "temperature": Map("float", _f(f"--{prefix}-temperature")),
        "top_p": Map("float", _f(f"--{prefix}-top-p")),
        "top_k": Map("int", _f(f"--{prefix}-top-k")),
        "num_beams": Refuse("int", "beam search is not used in RL sampling", ok=(1,)),
        "num_return_sequences": Read("int", "must equal num_return_sequences_in_group (rollout) or is 1 (eval)"),
        "repetition_penalty": Map("float", _f("--rollout-repetition-penalty")) if prefix == "rollout"
        else Refuse("float", "one repetition penalty per run (actor_infer's)", ok=(1.0,)),
        "min_new_tokens": Map("int", _f(f"--{prefix}-min-new-tokens")),
        "do_sample": Map("bool", (lambda v, t: t.switch("--rollout-greedy", not v)) if prefix == "rollout"
                         else (lambda v, t: t.flag("--eval-temperature", 0.0 if not v else None))),
        "stop_strings": Map("list", lambda v, t: t.flag(f"--{prefix}-stop", *v) if prefix == "rollout" else None),
    }


# ROLL's fsdp2_train strategy_config: the FSDP trainer's settings (its --fsdp-* flags are another engineer's).
_FSDP2 = {k: Read("any", "an fsdp2_train setting") for k in ("fsdp_size", "param_dtype", "reduce_dtype",
                                                              "reshard_after_forward", "offload_policy")}


def _strategy(role):
    config = {"megatron_train": mk.ROLL_MEGATRON, "megatron_infer": mk.ROLL_MEGATRON_INFER}
    if role == "actor_infer":
        cfg = {"gpu_memory_utilization": Read("float", "the engine's memory share (see _engine_settings)"),
               "mem_fraction_static": Read("float", "SGLang's memory share (see _engine_settings)"),
               "block_size": Read("int", "vLLM's KV block size (see _engine_settings)"),
               "max_model_len": Map("int", _f("--rollout-max-context-len")),
               "load_format": NoEffect("str", "engines always start from the trainer's weights (pushed before the "
                                              "first rollout)", harmless=("dummy", "auto")),
               "context_length": Read("int", "SGLang's context length (see _engine_settings)")}
    elif role == "reference":
        cfg = config["megatron_infer"]
    else:  # actor_train, critic: Megatron (or FSDP2) settings; the critic's must match the actor's layout
        cfg = {**mk.ROLL_MEGATRON, **_FSDP2} if role == "actor_train" else mk.ROLL_MEGATRON_INFER
    return {"strategy_name": Map("str", _fact(f"{role}_strategy")), "strategy_config": cfg}


def _worker(role):
    out = {"model_args": _model_args(role), "strategy_args": _strategy(role),
           "device_mapping": Read("mapping", "placement (--placement)"),
           "infer_batch_size": NoEffect("int", "log-prob passes use the training micro-batches (--micro-batch-size)"),
           "world_size": Read("int", "equals the device_mapping length"),
           "data_args": DATA_ARGS if role == "actor_train" else {"template": Map("str", _template)},
           "worker_cls": NoEffect("str", "workers are slime_like's own")}
    if role in ("actor_train", "critic"):
        out["training_args"] = _train_args(role)
    if role == "actor_infer":
        out["generating_args"] = _gen_args("rollout")
        out["num_gpus_per_worker"] = Map("int", _f("--rollout-num-gpus-per-engine"))
    return out


def _reward(v, t):
    cls = v.get("worker_cls", "") if isinstance(v, dict) else ""
    if "." in cls and not cls.startswith("roll."):
        t.flag("--custom-rm-path", cls)  # our extension: a module.function reward
    elif cls.endswith("MathRuleRewardWorker"):
        t.flag("--rm-type", "math")
    else:
        raise ConfigError(f"worker_cls {cls!r}: only ROLL's MathRuleRewardWorker (-> --rm-type math) or a "
                          "module.function reward (-> --custom-rm-path) runs here")
    if len(t.facts.setdefault("rewards", [])) >= 1:
        raise ConfigError("one reward per run here; ROLL's per-domain routing (tag_included) is not built")
    t.facts["rewards"].append(cls)


SCHEMA = {
    "hydra": Free(NoEffect("any", "Hydra's own run settings; the config is read without Hydra")),
    "defaults": NoEffect("list", "Hydra defaults lists are not composed; write one whole file"),
    "exp_name": Map("str", _f("--wandb-group")),
    "seed": Map("int", lambda v, t: (t.flag("--seed", v), t.flag("--rollout-seed", v))),
    "logging_dir": Map("str", _f("--tensorboard-dir")),
    "output_dir": Map("str", lambda v, t: t.flag("--save", f"{v}/checkpoints")),
    "num_gpus_per_node": Map("int", _f("--num-gpus-per-node")),
    "track_with": Map("str", lambda v, t: t.switch("--use-wandb", v == "wandb") or
                      t.switch("--use-tensorboard", v == "tensorboard")),
    "tracker_kwargs": Free(NoEffect("any", "tracker credentials and tags: use the --wandb-* flags")),
    "max_steps": Map("int", _f("--num-rollout")),
    "save_steps": Map("int", _f("--save-interval")),
    "logging_steps": NoEffect("int", "one metrics line per rollout", harmless=(1,)),
    "eval_steps": Map("int", _fact("eval_steps")),
    "resume_from_checkpoint": Map("any", lambda v, t: t.flag("--load", v if isinstance(v, str) else None)),
    "rollout_batch_size": Map("int", _f("--rollout-batch-size")),
    "val_batch_size": NoEffect("int", "validation always covers the whole validation set"),
    "prompt_length": Map("int", _f("--rollout-max-prompt-len")),
    "response_length": Map("int", _f("--rollout-max-response-len")),
    "num_return_sequences_in_group": Map("int", _f("--n-samples-per-prompt")),
    "ppo_epochs": Refuse("int", "each rollout is trained on once (several steps: gradient_accumulation_steps)",
                         ok=(1,)),
    "adv_estimator": Map("str", _adv),
    "whiten_advantages": Map("bool", _sw("--normalize-advantages")),
    "norm_mean_type": NoEffect("str", "GRPO normalises within each group"),
    "norm_std_type": NoEffect("str", "GRPO normalises within each group"),
    "value_clip": Map("float", _f("--value-clip")),
    "pg_clip": Map("float", _f("--eps-clip")),
    "pg_clip_high": Map("float", _f("--eps-clip-high")),
    "dual_clip_loss": NoEffect("bool", "set the bound with --eps-clip-c"),
    "reward_clip": Refuse("float", "rewards are not clipped", ok=(None,)),
    "init_kl_coef": Map("float", _f("--kl-coef")),
    "kl_penalty": Map("str", _f("--kl-loss-type")),
    "use_kl_loss": Map("bool", _sw("--use-kl-loss")),
    "kl_loss_coef": Map("float", _f("--kl-loss-coef")),
    "entropy_loss_coef": Map("float", _f("--entropy-coef")),
    "loss_agg_mode": Map("str", _f("--loss-agg-mode")),
    "pretrain": Map("str", _f("--hf-checkpoint")),
    "reward_pretrain": Read("str", "the critic's initial weights (see _model_and_data)"),
    "validation": {"data_args": {"template": Map("str", _template),
                                 "file_name": Map("list_or_str", _fact("val_files"))},
                   "generating_args": _gen_args("eval")},
    "actor_train": _worker("actor_train"),
    "actor_infer": _worker("actor_infer"),
    "reference": _worker("reference"),
    "critic": _worker("critic"),
    "rewards": Free(Map("dict", _reward)),
}


def translate(cfg: dict, t) -> None:
    walk(cfg, SCHEMA, t)
    mk.finish(t)
    _model_and_data(cfg, t)
    _strategies(cfg, t)
    _batch(cfg, t)
    _placement(cfg, t)


def _model_and_data(cfg, t):
    """Precision and weights come from actor_train (the engines start from the trainer's weights); a reference
    model path of its own is --ref-load."""
    dtype = t.facts.get("actor_train_dtype")
    if dtype and _DTYPES[dtype]:
        t.flag(_DTYPES[dtype])
    for role in ("actor_infer", "reference", "critic"):
        other = t.facts.get(f"{role}_dtype")
        if other and dtype and other != dtype:
            t.no_effect.append((f"{role}.model_args.dtype", other, f"the {role} runs in actor_train's dtype {dtype}"))
    path = t.facts.get("actor_train_model_path")
    if path and not get(cfg, "pretrain"):
        t.flag("--hf-checkpoint", path)
    base = path or get(cfg, "pretrain")
    infer = t.facts.get("actor_infer_model_path")
    if infer and infer != base:
        t.no_effect.append(("actor_infer.model_args.model_name_or_path", infer,
                            "the engines start from the trainer's weights, pushed before the first rollout"))
    ref = t.facts.get("reference_model_path")
    if ref and ref != base:
        t.flag("--ref-load", ref)
    critic = t.facts.get("critic_model_path") or get(cfg, "reward_pretrain")
    if critic and critic != base:
        t.no_effect.append(("critic.model_args.model_name_or_path", critic, "the critic starts from the actor's "
                            "checkpoint (--critic-load resumes a saved critic)"))
    files = t.facts.get("train_files")
    if files:
        data_dir = get(cfg, "actor_train.data_args.dataset_dir")
        t.flag("--prompt-data", _under(data_dir, files[0]))
        if len(files) > 1:
            t.flag("--prompt-data-extra", *[_under(data_dir, f) for f in files[1:]])
        t.flag("--label-key", "ground_truth")  # ROLL's RLVR data column for the reference answer
    template = t.facts.get("template")
    if template is not None:
        t.flag("--prompt-template", template)
    val = t.facts.get("val_files")
    if val:
        t.flag("--eval-prompt-data", *[x for i, p in enumerate(val) for x in (f"val{i}" if i else "val", p)])
        t.flag("--eval-interval", t.facts.get("eval_steps") or 1)
    n_eval = get(cfg, "validation.generating_args.num_return_sequences")
    if n_eval:
        t.flag("--n-samples-per-eval-prompt", n_eval)
    n_roll = get(cfg, "actor_infer.generating_args.num_return_sequences")
    group = get(cfg, "num_return_sequences_in_group")
    if n_roll and group and n_roll != group:
        raise ConfigError(f"{t.path}: actor_infer.generating_args.num_return_sequences {n_roll} differs from "
                          f"num_return_sequences_in_group {group}; make them equal")


def _under(base, f):
    import os

    return os.path.join(base, f) if base and not os.path.isabs(f) else f


def _strategies(cfg, t):
    train = t.facts.get("actor_train_strategy", "megatron_train")
    if train not in _TRAIN_STRATEGIES:
        raise ConfigError(f"{t.path}: actor_train.strategy_args.strategy_name: {train!r}: use "
                          f"{' or '.join(_TRAIN_STRATEGIES)}")
    train_cfg = get(cfg, "actor_train.strategy_args.strategy_config", {})
    if train == "fsdp2_train":
        from slime_like.config.frontends import fsdp_keys
        from slime_like.config.frontends.common import parser_options as _parser_options

        t.flag("--train-backend", "fsdp")
        if fsdp_keys.available(_parser_options()):
            fsdp_keys.roll(train_cfg, t)
        else:
            t.unmapped += [("--train-backend", "fsdp", f"actor_train.strategy_args.strategy_config.{k}")
                           for k in train_cfg]
    else:
        t.no_effect += [(f"actor_train.strategy_args.strategy_config.{k}", v, "an fsdp2_train setting")
                        for k, v in train_cfg.items() if k in _FSDP2]
    infer = t.facts.get("actor_infer_strategy")
    if infer is not None:
        if infer not in _INFER_STRATEGIES:
            raise ConfigError(f"{t.path}: actor_infer.strategy_args.strategy_name: {infer!r}: use "
                              f"{', '.join(_INFER_STRATEGIES)}")
        t.flag("--rollout-engine", {"hf_infer": "cpu"}.get(infer, infer))
    _engine_settings(cfg, t, infer)
    _same_layout(cfg, t)
    for worker in ("actor_train", "actor_infer", "reference", "critic"):
        size, mapping = get(cfg, f"{worker}.world_size"), get(cfg, f"{worker}.device_mapping")
        if size is not None and mapping is not None and size != len(parse_devices(mapping, worker)):
            raise ConfigError(f"{t.path}: {worker}.world_size {size} differs from the {worker}.device_mapping length")
    ref = t.facts.get("reference_strategy")
    if ref not in (None, "megatron_infer", "hf_infer"):
        raise ConfigError(f"{t.path}: reference.strategy_args.strategy_name: {ref!r}: use megatron_infer")
    if get(cfg, "critic") and t.facts.get("critic_strategy", "megatron_train") != "megatron_train":
        raise ConfigError(f"{t.path}: critic.strategy_args.strategy_name: the critic trains with megatron_train")


# actor_infer strategy_config key -> (SGLang flag, vLLM flag); None: no such setting for that engine
_ENGINE_KEYS = {"gpu_memory_utilization": ("--sglang-mem-fraction-static", "--vllm-gpu-memory-utilization"),
                "mem_fraction_static": ("--sglang-mem-fraction-static", None),
                "context_length": ("--sglang-context-length", None),
                "block_size": (None, "--vllm-block-size")}


def _engine_settings(cfg, t, infer):
    """The engine's own settings go to its own flags: --sglang-* (sglang, hf_infer -> the CPU engine, which warns
    about what it does not use) or --vllm-* (once the vLLM engine is on main; "not built yet" before)."""
    from slime_like.config.frontends.common import parser_options as _parser_options

    prefix = "actor_infer.strategy_args.strategy_config"
    vllm = infer == "vllm"
    for key, value in (get(cfg, prefix, {}) or {}).items():
        if key not in _ENGINE_KEYS:
            continue
        flag = _ENGINE_KEYS[key][1 if vllm else 0]
        if flag is None:
            t.no_effect.append((f"{prefix}.{key}", value, f"not a setting of the {infer or 'sglang'} engine"))
        elif vllm and "--vllm-config" not in _parser_options():
            t.unmapped.append(("--rollout-engine", "vllm", f"{prefix}.{key}"))
        else:
            t.current = f"{prefix}.{key}"
            t.flag(flag, value)
            t.current = None


def _same_layout(cfg, t):
    """The reference and the critic run with the actor's parallel layout here (slime's rule for the critic)."""
    actor = get(cfg, "actor_train.strategy_args.strategy_config", {}) or {}
    for worker in ("reference", "critic"):
        for key, value in (get(cfg, f"{worker}.strategy_args.strategy_config", {}) or {}).items():
            if key.endswith("_parallel_size") and value != actor.get(key, 1):
                raise ConfigError(f"{t.path}: {worker}.strategy_args.strategy_config.{key}: {value} differs from "
                                  f"actor_train's {actor.get(key, 1)}; the {worker} runs with the actor's parallel "
                                  "layout here, so make them equal")


def _batch(cfg, t):
    """ROLL: global batch = per_device x grad_accum x world / (TP x PP x CP); micro-batch = per_device."""
    per_device, accum = t.facts.get("actor_train_per_device"), t.facts.get("actor_train_grad_accum")
    world = 1
    if per_device:
        t.flag("--micro-batch-size", per_device)
    if per_device and accum:
        mapping = get(cfg, "actor_train.device_mapping")
        world = len(parse_devices(mapping, "actor_train.device_mapping")) if mapping is not None else 1
        par = 1
        for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
            par *= get(cfg, f"actor_train.strategy_args.strategy_config.{key}", 1)
        if world % par:
            raise ConfigError(f"{t.path}: actor_train.device_mapping has {world} GPUs, not divisible by TP x PP x CP "
                              f"= {par}")
        t.flag("--global-batch-size", per_device * accum * world // par)
    if get(cfg, "critic"):
        t.flag("--use-critic")
        c_device, c_accum = t.facts.get("critic_per_device"), t.facts.get("critic_grad_accum")
        if c_device:
            t.role("critic", "micro_batch_size", c_device)
        if c_device and c_accum and per_device and accum:
            c_world = len(parse_devices(get(cfg, "critic.device_mapping", [0]), "critic.device_mapping"))
            if c_device * c_accum * c_world != per_device * accum * world:
                raise ConfigError(f"{t.path}: critic.training_args: per_device_train_batch_size x "
                                  "gradient_accumulation_steps x GPUs differs from actor_train's; the critic trains "
                                  "on the same global batch here, so make them equal")


def _placement(cfg, t):
    """device_mapping per worker -> --placement; a reference placed with the actor runs inside it."""
    specs = []
    for worker, comp in (("actor_train", "actor"), ("actor_infer", "rollout"), ("critic", "critic"),
                         ("reference", "reference")):
        mapping = get(cfg, f"{worker}.device_mapping")
        if mapping is None:
            continue
        ids = parse_devices(mapping, f"{t.path}: {worker}.device_mapping")
        specs.append(f"{comp}:{devices_text(ids)}")
    if specs:
        t.flag("--placement", *specs)

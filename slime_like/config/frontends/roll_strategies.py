"""ROLL's worker strategies (strategy_name / strategy_config of actor_train, actor_infer, reference, critic) -> the
trainer backend, the rollout engine and its own flags; the reference and critic run with the actor's layout."""
from __future__ import annotations

from slime_like.config.errors import ConfigError
from slime_like.config.frontends.common import Read, get, parse_devices

_TRAIN_STRATEGIES = ("megatron_train", "fsdp2_train")
_INFER_STRATEGIES = ("vllm", "sglang", "hf_infer")

# ROLL's fsdp2_train strategy_config: the FSDP trainer's settings (its --fsdp-* flags are another engineer's).
FSDP2_KEYS = {k: Read("any", "an fsdp2_train setting") for k in ("fsdp_size", "param_dtype", "reduce_dtype",
                                                              "reshard_after_forward", "offload_policy")}


def strategies(cfg, t):
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
                        for k, v in train_cfg.items() if k in FSDP2_KEYS]
    _ulysses(train, t)
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


def _ulysses(train, t):
    """actor_train.model_args.ulysses_size N > 1 -> --context-parallel-size N: the FSDP trainer's Ulysses sequence
    parallelism (slime's FSDP backend reads the same flag); megatron_train has its own context_parallel_size."""
    size = t.facts.get("ulysses_size")
    if not size or size == 1:
        return
    if train != "fsdp2_train":
        raise ConfigError(f"{t.path}: actor_train.model_args.ulysses_size {size}: Ulysses sequence parallelism runs "
                          "with strategy_name fsdp2_train (the FSDP trainer); with megatron_train set "
                          "actor_train.strategy_args.strategy_config.context_parallel_size instead")
    t.current = "actor_train.model_args.ulysses_size"
    t.flag("--context-parallel-size", size)
    t.current = None


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

"""RLinf `actor.fsdp_config` and ROLL `fsdp2_train` strategy_config -> the FSDP trainer's `--fsdp-*` flags.

Used only when the parser has those flags (the FSDP trainer is on main); before that, a file that picks the
FSDP trainer stops with "not built yet" (frontends/__init__._drop_unbuilt). FSDP1-only switches (FSDP2 has no
such knob) are accepted with a warning; settings with no flag here are refused with the reason.
"""
from __future__ import annotations

from slime_like.config.errors import ConfigError

_FSDP1 = "an FSDP1 setting; the trainer uses FSDP2 (fully_shard), which has no such switch"
_DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "fp32": "fp32", "float32": "fp32",
           "torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}


def available(options: dict) -> bool:
    return "--fsdp-sharding-strategy" in options


def _dtype(value, key: str) -> str:
    out = _DTYPES.get(str(value).lower())
    if out is None:
        raise ConfigError(f"{key}: {value!r}: use bf16, fp16 or fp32")
    return out


def _switch(t, flag: str, value: bool):
    t.flag(flag if value else "--no-" + flag[2:])


def rlinf(cfg: dict, t, prefix: str = "actor.fsdp_config") -> None:
    """Translate RLinf's fsdp_config (seed 002) key by key; every key is mapped, warned or refused."""
    for key, value in (cfg or {}).items():
        dotted = f"{t.path}: {prefix}.{key}"
        t.current = f"{prefix}.{key}"
        if key == "strategy":
            if str(value).lower() not in ("fsdp", "fsdp2"):
                raise ConfigError(f"{dotted}: {value!r}: use fsdp or fsdp2")
            if str(value).lower() == "fsdp":
                t.no_effect.append((f"{prefix}.strategy", value, "the trainer always uses FSDP2 (fully_shard)"))
        elif key == "sharding_strategy":
            t.flag("--fsdp-sharding-strategy", str(value).lower())
        elif key == "cpu_offload":
            t.switch("--fsdp-cpu-offload", bool(value))
        elif key == "offload_pin_memory":
            _switch(t, "--fsdp-offload-pin-memory", bool(value))
        elif key == "reshard_after_forward":
            _switch(t, "--fsdp-reshard-after-forward", bool(value))
        elif key == "enable_gradient_accumulation":
            _switch(t, "--fsdp-defer-grad-sync", bool(value))
        elif key == "forward_prefetch":
            t.switch("--fsdp-forward-prefetch", bool(value))
        elif key in ("limit_all_gathers", "backward_prefetch", "use_orig_params"):
            if value not in (None, False):
                t.no_effect.append((f"{prefix}.{key}", value, _FSDP1))
        elif key == "use_liger_kernel":
            if value:
                t.no_effect.append((f"{prefix}.{key}", value, "fused Liger kernels are not wired (same results)"))
        elif key == "mixed_precision":
            _mixed_precision(value or {}, t, f"{prefix}.mixed_precision")
        elif key == "amp_autocast":
            if (value or {}).get("enabled"):
                t.flag("--fsdp-autocast", _dtype((value or {}).get("precision", "bf16"), f"{dotted}.precision"))
        elif key == "grad_scaler":
            if (value or {}).get("enabled"):
                raise ConfigError(f"{dotted}.enabled: an fp16 gradient scaler is not built for the FSDP trainer; "
                                  "train in bf16 (mixed_precision.param_dtype: bf16)")
        else:
            raise ConfigError(f"{dotted}: unknown key; keys of {prefix}: strategy, sharding_strategy, cpu_offload, "
                              "offload_pin_memory, reshard_after_forward, enable_gradient_accumulation, "
                              "forward_prefetch, limit_all_gathers, backward_prefetch, use_orig_params, "
                              "use_liger_kernel, mixed_precision, amp_autocast, grad_scaler")
        t.current = None


def _mixed_precision(value: dict, t, prefix: str) -> None:
    for key, v in value.items():
        t.current = f"{prefix}.{key}"
        if key == "param_dtype":
            t.flag("--fsdp-param-dtype", _dtype(v, f"{t.path}: {prefix}.{key}"))
        elif key == "reduce_dtype":
            t.flag("--fsdp-reduce-dtype", _dtype(v, f"{t.path}: {prefix}.{key}"))
        elif key == "buffer_dtype":
            t.no_effect.append((f"{prefix}.{key}", v, "buffers stay in the model's dtype (FSDP2 has no buffer dtype)"))
        else:
            raise ConfigError(f"{t.path}: {prefix}.{key}: unknown key; use param_dtype, reduce_dtype, buffer_dtype")


def roll(cfg: dict, t, prefix: str = "actor_train.strategy_args.strategy_config") -> None:
    """ROLL's fsdp2_train strategy_config (seed 003's FSDP2 Strategy Config)."""
    for key, value in (cfg or {}).items():
        t.current = f"{prefix}.{key}"
        if key == "fsdp_size":
            t.flag("--fsdp-size", value)
        elif key in ("param_dtype", "reduce_dtype"):
            t.flag(f"--fsdp-{key.replace('_', '-')}", _dtype(value, f"{t.path}: {prefix}.{key}"))
        elif key == "reshard_after_forward":
            _switch(t, "--fsdp-reshard-after-forward", bool(value))
        elif key == "offload_policy":
            t.switch("--fsdp-cpu-offload", bool(value))
        else:  # a Megatron key under fsdp2_train: the FSDP trainer's own validation names what it ignores
            continue
        t.current = None

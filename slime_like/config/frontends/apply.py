"""After parsing: the translation's per-role values join the role overlay, its no-effect keys become warnings."""
from __future__ import annotations

from slime_like.config.errors import ConfigError
from slime_like.config.role_overrides import _convert
from slime_like.registry import ADVANTAGE_ESTIMATORS


def apply_translation(args, report, parser, t) -> None:
    report.translation = t
    if t is None:
        if args.config_format != "auto":
            report.warn(f"--config-format {args.config_format} has no effect without --config FILE.yaml")
        return
    t.path = args.config  # the file as the user named it (the last --config wins, as for any flag)
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    overlay = args.megatron_role_overrides
    for role, values in t.roles.items():
        merged = {}
        for dest, value in values.items():
            merged[dest] = _convert(actions[dest], value, f"{t.path} ({role} {dest})")
        # --megatron-config-path, when also given, is the more specific file: its values win
        overlay[role] = {**merged, **overlay.get(role, {})}
        critic_runs = args.use_critic or ADVANTAGE_ESTIMATORS.has(args.advantage_estimator, "needs_critic")
        if role == "critic" and not critic_runs:
            raise ConfigError(f"{t.path}: a critic section is given but no critic runs; set the PPO estimator "
                              "(adv_estimator: gae / adv_type: ppo) or remove the section")
    from slime_like.config.frontends.defaults import defaults_note

    note = defaults_note(t)
    if note:
        report.warn(note)
    _precision_on_cpu(args, report, t)
    by_reason: dict = {}
    for key, value, why in t.no_effect:
        by_reason.setdefault(why, []).append(f"{key}={value}")
    for why, keys in by_reason.items():
        report.warn(f"{t.path}: {', '.join(keys)}: accepted, no effect here ({why})")


def _precision_on_cpu(args, report, t) -> None:
    """fp16 from the file on a machine without CUDA: the gradients underflow on CPU (grad norms ~5e-10 where fp32
    gives 2-3 on the same run), i.e. the run learns nothing."""
    from slime_like.config.cluster import cuda_visible

    if args.fp16 and "--fp16" in t.origin and not cuda_visible():
        report.warn(f"{t.path}: {t.origin['--fp16']} [--fp16]: fp16 training on a machine without CUDA: the "
                    "gradients underflow here (grad norms ~5e-10 where fp32 gives 2-3 on the same run), so the run "
                    "learns nothing; set the key to fp32 on CPU (bf16 on GPUs)")

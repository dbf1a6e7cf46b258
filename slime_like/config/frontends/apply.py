"""After parsing: the translation's per-role values join the role overlay, its no-effect keys become warnings."""
from __future__ import annotations

from slime_like.config.errors import ConfigError
from slime_like.config.algorithm import ESTIMATOR_TRAITS
from slime_like.config.role_overrides import _convert


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
        if role == "critic" and not (args.use_critic or ESTIMATOR_TRAITS[args.advantage_estimator].needs_critic):
            raise ConfigError(f"{t.path}: a critic section is given but no critic runs; set the PPO estimator "
                              "(adv_estimator: gae / adv_type: ppo) or remove the section")
    by_reason: dict = {}
    for key, value, why in t.no_effect:
        by_reason.setdefault(why, []).append(f"{key}={value}")
    for why, keys in by_reason.items():
        report.warn(f"{t.path}: {', '.join(keys)}: accepted, no effect here ({why})")

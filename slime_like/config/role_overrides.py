"""`--megatron-config-path FILE`: per-role (actor / critic) overrides on top of the shared CLI (slime seed 000).

    megatron:
      - name: default          # optional label
        role: critic           # actor | critic (required)
        overrides:             # argparse dest names; `args:` is the backward-compatible alias
          lr: 1e-5

The CLI stays the baseline and a missing role inherits it unchanged. `num_nodes` / `num_gpus_per_node`
are ignored with a warning (placement stays on --actor-num-* / --critic-num-*). Stricter than slime, which
only warns: an unknown role, a duplicate role, a non-list `megatron`, an unknown entry field or override
key (with the closest valid one), a placement key, or a topology key that would differ between actor
and critic is an error naming the file and the entry. Values go through the flag's own argparse type, so
`lr: 1e-6` (which YAML 1.1 reads as a string) becomes the float 1e-06.
"""
from __future__ import annotations

import argparse
import copy

from slime_like.config.errors import ConfigError, did_you_mean
from slime_like.config.safe_yaml import read_yaml
from slime_like.registry import ADVANTAGE_ESTIMATORS

ROLES = ("actor", "critic")
ENTRY_FIELDS = ("name", "role", "overrides", "args")
IGNORED_KEYS = ("num_nodes", "num_gpus_per_node")
PLACEMENT_KEYS = ("actor_num_nodes", "actor_num_gpus_per_node", "critic_num_nodes", "critic_num_gpus_per_node",
                  "rollout_num_gpus", "rollout_num_gpus_per_engine", "num_gpus_per_node", "colocate",
                  "megatron_config_path", "rollout_engine", "dry_run")
# Seed 000: actor and critic must share the Megatron parallel topology.
TOPOLOGY_KEYS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                 "expert_model_parallel_size", "expert_tensor_parallel_size", "sequence_parallel")


def load_role_overrides(args, report, parser) -> None:
    """Read and check the YAML once at start-up; store {role: {dest: value}} as args.megatron_role_overrides."""
    args.megatron_role_overrides = {}
    args.megatron_role_entries = {}  # role -> index of its entry in the YAML list (named in messages)
    path = args.megatron_config_path
    if not path:
        return
    raw = read_yaml(path, "--megatron-config-path")
    example = "megatron: [{name: default, role: critic, overrides: {lr: 1e-5}}]"
    if not isinstance(raw, dict) or "megatron" not in raw:
        keys = list(raw) if isinstance(raw, dict) else type(raw).__name__
        raise ConfigError(f"{path}: expected a top-level 'megatron' list, e.g. {example}; found {keys}")
    extra = [k for k in raw if k != "megatron"]
    if extra:
        raise ConfigError(f"{path}: unknown top-level key(s) {extra}; only 'megatron' is read")
    entries = raw["megatron"]
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: 'megatron' must be a list of role entries, got {type(entries).__name__}; "
                          f"e.g. {example}")
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    seen: dict = {}
    for i, entry in enumerate(entries):
        where = f"{path}: megatron[{i}]"
        role, overrides = _entry_role_and_overrides(entry, where, seen)
        seen[role] = i
        args.megatron_role_overrides[role] = _converted_overrides(args, report, overrides, actions, where, role)
        args.megatron_role_entries[role] = i
    _check_topology(args, path)
    if not (args.use_critic or ADVANTAGE_ESTIMATORS.has(args.advantage_estimator, "needs_critic")):
        report.warn(f"--megatron-config-path {path} is used without a critic (no --use-critic, estimator "
                    f"{args.advantage_estimator}); only the actor entry has an effect")


def _entry_role_and_overrides(entry, where: str, seen: dict) -> tuple[str, dict]:
    """One `megatron[i]` entry checked: known fields, a supported role not seen before, a mapping of overrides."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: each entry must be a mapping with role and overrides, got {entry!r}")
    for field in entry:
        if field not in ENTRY_FIELDS:
            raise ConfigError(f"{where}: unknown field '{field}'{did_you_mean(str(field), ENTRY_FIELDS)}; "
                              f"entry fields are {', '.join(ENTRY_FIELDS)}")
    role = entry.get("role")
    if role not in ROLES:
        hint = did_you_mean(str(role), ROLES) if role is not None else ""
        raise ConfigError(f"{where}: role {role!r} is not supported{hint}; use one of {', '.join(ROLES)}")
    if role in seen:
        raise ConfigError(f"{where}: duplicate role '{role}' (already in megatron[{seen[role]}]); "
                          "merge the two entries")
    if "overrides" in entry and "args" in entry:
        raise ConfigError(f"{where}: has both 'overrides' and its alias 'args'; keep only 'overrides'")
    overrides = entry.get("overrides", entry.get("args")) or {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"{where} (role {role}): overrides must be a mapping of argparse dest names to "
                          f"values, got {type(overrides).__name__}")
    return role, overrides


def _converted_overrides(args, report, overrides: dict, actions: dict, where: str, role: str) -> dict:
    """{dest: value converted as its flag would be}; placement keys refused, ignored keys warned."""
    converted = {}
    for key, value in overrides.items():
        key = str(key)
        if key in IGNORED_KEYS:
            report.warn(f"{where} (role {role}): '{key}' is ignored; GPU placement stays on "
                        f"--{role}-num-nodes / --{role}-num-gpus-per-node")
            continue
        if key in PLACEMENT_KEYS:
            raise ConfigError(f"{where} (role {role}): '{key}' is a placement/run setting, not a per-role "
                              f"override; set --{key.replace('_', '-')} on the command line")
        if key not in actions:
            hint = did_you_mean(key.replace("-", "_"), actions) or did_you_mean(key, actions)
            raise ConfigError(f"{where} (role {role}): unknown key '{key}'{hint}. Keys are argparse dest "
                              "names (tensor_model_parallel_size, not --tensor-model-parallel-size)")
        converted[key] = _convert(actions[key], value, f"{where} (role {role}) key '{key}'")
    return converted


def _convert(action, value, where: str):
    """Convert a YAML value exactly as the flag would be converted on the command line."""
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction)):
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if action.nargs in ("+", "*") or isinstance(action.nargs, int):
        items = value if isinstance(value, list) else [value]
        return [_convert_one(action, v, where) for v in items]
    return _convert_one(action, value, where)


def _convert_one(action, value, where: str):
    if value is None:
        return None
    conv = action.type
    try:
        if conv is None:
            out = value if isinstance(value, str) else str(value)
        elif conv is int and isinstance(value, float):
            if not value.is_integer():
                raise ValueError("not an integer")
            out = int(value)
        elif conv in (int, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
            out = conv(value)
        else:
            out = conv(value) if isinstance(value, str) or conv not in (int, float) else conv(str(value))
    except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
        raise ConfigError(f"{where}: invalid value {value!r} ({e})") from None
    if action.choices is not None and out not in action.choices:
        raise ConfigError(f"{where}: {out!r} is not one of {list(action.choices)}")
    return out


def _check_topology(args, path: str) -> None:
    roles = args.megatron_role_overrides
    for key in TOPOLOGY_KEYS:
        actor = roles.get("actor", {}).get(key, getattr(args, key))
        critic = roles.get("critic", {}).get(key, getattr(args, key))
        if actor != critic:
            raise ConfigError(f"{path}: {key} would be {actor!r} for the actor but {critic!r} for the critic; actor "
                              "and critic must share the parallel topology (slime: unsupported). Set it once on "
                              f"the CLI (--{key.replace('_', '-')}) and remove it from the YAML")


def apply_role(args, role: str):
    """Deep copy of args with the role's settings: critic-* flags (critic), then the YAML overrides."""
    if role not in ROLES:
        raise ConfigError(f"unknown role {role!r}{did_you_mean(str(role), ROLES)}; roles are {', '.join(ROLES)}")
    out = copy.deepcopy(args)
    if role == "critic":
        # slime's critic flags; the critic never adds a KL term to the reward.
        if args.critic_lr is not None:
            out.lr = args.critic_lr
        out.lr_warmup_iters = args.critic_lr_warmup_iters
        out.save = args.critic_save or (args.save.rstrip("/") + "_critic" if args.save else None)
        out.load = args.critic_load or out.save
        out.kl_coef = 0.0
    for key, value in args.megatron_role_overrides.get(role, {}).items():
        setattr(out, key, copy.deepcopy(value))
    out.role = role
    return out

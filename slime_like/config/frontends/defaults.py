"""What RLinf and ROLL do where a file is silent, and where its relative paths point.

A key the file leaves out takes its framework's default (not ours): `apply_defaults` writes it into the loaded
file before the schema walk, so it is translated like any key, and records it for the start-up line / dry run
(`defaults_note`). Relative paths resolve against the working directory and are recorded too.
"""
from __future__ import annotations

import os

# RLinf's own defaults for keys a file leaves out (rlinf/config.py's validate_* fill-ins and the reasoning
# runner's reads), where they differ from ours or decide something here. Applied before the walk; the dry run
# lists them. rollout.rollout_backend (RLinf: sglang) is left to --rollout-engine auto: sglang on a GPU.
RLINF_DEFAULTS = {
    "runner.max_steps": -1,
    "runner.val_check_interval": -1,
    "algorithm.n_minibatches": 1,
    "algorithm.sampling_params.temperature": 1.0,
    "actor.optim.weight_decay": 0.01,
    "actor.lr_sched.lr_decay_style": "constant",
    "actor.lr_sched.min_lr": 0.0,
    "actor.lr_sched.lr_warmup_iters": 0,
    "reward.reward_scale": 1.0,
    "algorithm.sampling_params.do_sample": True,
    "actor.model.context_parallel_size": 1,
}

# ROLL's defaults for keys a file leaves out (roll/configs/base_config.py BaseConfig / PPOConfig,
# training_args.py, generating_args.py, data_args.py), where they map onto a flag here. Applied before the walk;
# the dry run lists them. Not applied: track_with / logging_dir (tensorboard: opt in with track_with), exp_name
# (the launcher script's name), init_kl_coef (read only with add_token_level_kl).
ROLL_DEFAULTS = {
    "seed": 42,
    "output_dir": "./output",
    "max_steps": 500,
    "save_steps": 50,
    "eval_steps": 10,
    "rollout_batch_size": 128,
    "prompt_length": 1024,
    "ppo_epochs": 1,
    "adv_estimator": "gae",
    "pg_clip": 0.2,
    "loss_agg_mode": "seq-mean-token-mean",
    "actor_train.training_args.learning_rate": 5.0e-5,
    "actor_train.training_args.lr_scheduler_type": "linear",
    "actor_train.training_args.weight_decay": 0.0,
    "actor_train.training_args.warmup_steps": 0,
    "actor_train.training_args.max_grad_norm": 1.0,
    "actor_train.training_args.per_device_train_batch_size": 8,
    "actor_train.training_args.gradient_accumulation_steps": 1,
    "actor_train.data_args.template": "native",
    "actor_infer.generating_args.temperature": 0.95,
    "actor_infer.generating_args.top_p": 0.7,
    "actor_infer.generating_args.top_k": 50,
}

_ABSENT = object()


def apply_defaults(cfg: dict, defaults: dict, t, framework: str) -> None:
    """Put `framework`'s default into `cfg` for each dotted key the file leaves out (a key written as null is the
    user's own value and stays), recording each on `t.defaults` for the dry run."""
    for dotted, value in defaults.items():
        node, parts = cfg, dotted.split(".")
        for part in parts[:-1]:
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                break  # a scalar where a section belongs: the walk names that key
        else:
            if node.get(parts[-1], _ABSENT) is _ABSENT:
                node[parts[-1]] = value
                t.defaults.append((dotted, value))
    t.framework = framework


def absolute_path(t, key: str, path: str) -> str:
    """A relative path of the file, resolved against the working directory (where RLinf and ROLL resolve it too:
    Hydra's run.dir '.' / the launch directory), and recorded so the dry run says which directory that was."""
    if not isinstance(path, str) or os.path.isabs(path) or "://" in path:
        return path
    resolved = os.path.normpath(os.path.join(os.getcwd(), path))
    t.paths.append((key, path, resolved))
    return resolved


def defaults_note(t) -> str | None:
    """One line naming the framework defaults applied and the relative paths resolved (--dry-run, start-up)."""
    parts = []
    if t.defaults:
        flags = {key.split(" (")[0]: flag for flag, key in t.origin.items()}
        shown = [f"{k}={v}" + (f" [{flags[k]}]" if k in flags else "") for k, v in t.defaults]
        parts.append(f"keys the file leaves out take {getattr(t, 'framework', t.fmt)}'s defaults: {', '.join(shown)}")
    if t.paths:
        shown = [f"{k} {p} -> {r}" for k, p, r in t.paths]
        parts.append(f"relative paths resolve against the working directory {os.getcwd()}: {'; '.join(shown)}")
    return f"{t.path}: " + "; ".join(parts) if parts else None


def defaults_lines(t) -> list:
    """--dry-run's sections: the framework's defaults applied for keys the file leaves out (with the flag each
    became), and the relative paths with the directory they resolved against."""
    out = []
    if t.defaults:
        flags = {key.split(" (")[0]: flag for flag, key in t.origin.items()}
        out.append(f"\n-- {t.framework}'s defaults for keys the file leaves out --")
        out += [f"    {key} = {value}" + (f"    [{flags[key]}]" if key in flags else "    (read by the translation)")
                for key, value in t.defaults]
    if t.paths:
        out.append(f"\n-- relative paths of the file, resolved against the working directory {os.getcwd()} --")
        out += [f"    {key}: {path} -> {resolved}" for key, path, resolved in t.paths]
    return out

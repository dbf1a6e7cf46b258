"""Everything a run can check before Ray starts, checked before Ray starts -- by `--dry-run` and every start.

    run_preflight(args)   # raises ConfigError listing every independent problem at once; returns notes

- data: every --prompt-data / --eval-prompt-data file parses, with the keys the flags name (file:line of the
  first bad line, the count of bad lines; non-UTF-8 bytes named; a UTF-8 BOM accepted; big files in part);
  with --multimodal-keys every row's images load (preflight_images.py: all bad rows listed together);
- --hf-checkpoint holds config.json, tokenizer files and weights; --load / --critic-load are checkpoints of
  the expected format or empty (a fresh start); --ref-load exists in a loadable format;
- each role's learning-rate schedule (warm-up shorter than the decay horizon), naming the YAML file, entry
  and key when the value came from --megatron-config-path;
- every custom `--*-path` function imports and accepts the arguments it will be called with.
Prompt tokenization (over-long / empty prompts) is the data source's job at load time, not repeated here.
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys

from slime_like.config.errors import ConfigError
from slime_like.config.algorithm import reference_needed
from slime_like.config.preflight_files import (check_data_file, check_hf_checkpoint, check_megatron_load,
                                               check_ref_load, check_save_dir)
from slime_like.config.preflight_images import check_data_images
from slime_like.config.rewards import rm_type_problem
from slime_like.config.role_overrides import ROLES, apply_role
from slime_like.config.schedule import schedule_steps
from slime_like.config.install_extras import missing_extra
from slime_like.config.train_env import train_env_vars, trainer_threads
from slime_like.config.slime_paths import OWN_FUNCTIONS, resolve

# flag dest -> (positional arguments it is called with, keyword arguments); None: import check only.
CALL_SHAPES = {
    "custom_rm_path": (("args", "sample"), {}),
    "rollout_function_path": (("args", "rollout_id", "data_source"), {"evaluation": False}),
    "eval_function_path": (("args", "rollout_id", "data_source"), {"evaluation": True}),
    "custom_generate_function_path": (("args", "sample", "sampling_params"), {}),
    "agent_function_path": (("args", "sample", "base_url", "api_key"), {}),
    "dynamic_sampling_filter_path": (("args", "group"), {}),
    "rollout_sample_filter_path": (("args", "groups"), {}),
    "rollout_all_samples_process_path": (("args", "groups", "data_source"), {}),
    "custom_reward_post_process_path": (("args", "samples"), {}),
    "data_source_path": (("args", "tokenizer"), {}),
    "buffer_filter_path": (("args", "rollout_id", "buffer", "num_samples"), {}),
    "rollout_data_postprocess_path": (("args", "rollout_id", "rollout_data"), {}),
    "custom_advantage_function_path": (("args", "rollout_data"), {}),
    "custom_tis_function_path": (("args",), dict.fromkeys(("pg_loss", "train_log_probs", "rollout_log_probs",
                                                           "loss_masks", "total_lengths", "response_lengths"))),
    "custom_convert_samples_to_train_data_path": (("args", "samples"), {}),
    "custom_megatron_init_path": (("args",), {}),
    "custom_megatron_before_log_prob_hook_path": (("args", "model", "store_prefix"), {}),
    "custom_megatron_before_train_step_hook_path": (
        ("args", "rollout_id", "step_id", "model", "optimizer", "opt_param_scheduler"), {}),
    # rollout_id= / evaluation= are passed only when the hook names them: rollout/sample_hooks.py checks
    "rollout_sample_hook_path": None,
    "custom_rollout_log_function_path": None, "custom_eval_rollout_log_function_path": None,
    "custom_loss_function_path": (("args", "batch", "logits", "sum_of_sample_mean"), {}),
    "custom_pg_loss_reducer_function_path": (
        ("total_lengths", "response_lengths", "loss_masks", "calculate_per_token_loss"), {}),
    "custom_update_weight_post_write_path": None,
    "custom_model_provider_path": None,
}
SCHEDULE_KEYS = ("lr_warmup_iters", "lr_warmup_fraction", "lr_decay_iters", "lr_decay_style", "train_iters")


def run_preflight(args) -> list:
    """Raise one ConfigError naming every problem found; return notes (e.g. a partial check of a big file)."""
    errors, notes = [], []
    _data(args, errors, notes)
    _checkpoints(args, errors)
    errors += _schedules(args)
    errors += _functions(args)
    errors += _environment(args)
    if len(errors) == 1:
        raise ConfigError(errors[0])
    if errors:
        raise ConfigError(f"{len(errors)} problems, all found before starting:\n" +
                          "\n".join(f"  - {e}" for e in errors))
    return notes


def _data(args, errors: list, notes: list) -> None:
    if args.debug_train_only:
        return  # trains on saved rollouts: no prompt is read
    if args.prompt_data == "":
        errors.append("--prompt-data '': an empty path; give the JSONL / JSON / Parquet file of prompts")
    if args.prompt_data and args.data_source_path is None:
        keys = {"--input-key": args.input_key}
        if args.label_key:
            keys["--label-key"] = args.label_key
        for flag, path in [("--prompt-data", args.prompt_data),
                           *(("--prompt-data-extra", p) for p in args.prompt_data_extra or [])]:
            e, n = check_data_file(path, flag, keys)
            errors += e
            notes += n
            if args.multimodal_keys and not e:
                e, n = check_data_images(path, flag, args.input_key, args.multimodal_keys)
                errors += e
                notes += n
    data = args.eval_prompt_data or []
    own = {d["name"]: d["overrides"] for d in args.eval_datasets or ()}  # --eval-config
    for name, path in zip(data[0::2], data[1::2]):
        o = own.get(name, {})
        keys = {"--eval-input-key": o.get("eval_input_key") or args.eval_input_key or args.input_key}
        label = o.get("eval_label_key") or args.eval_label_key or args.label_key
        if label:
            keys["--eval-label-key"] = label
        flag = f"--eval-config {args.eval_config} dataset {name}" if name in own else f"--eval-prompt-data {name}"
        e, n = check_data_file(path, flag, keys)
        errors += e
        notes += n
        media = o.get("multimodal_keys") or args.multimodal_keys
        if media and not e:
            e, n = check_data_images(path, flag, keys["--eval-input-key"], media)
            errors += e
            notes += n
        if "rm_type" in o and not o.get("custom_rm_path"):  # its own reward type: checked like --rm-type
            problem = rm_type_problem(o["rm_type"], args.rm_url)
            if problem:
                errors.append(f"{flag}: its rm_type: {problem}")


def _checkpoints(args, errors: list) -> None:
    if args.hf_checkpoint and not args.debug_train_only:
        errors += check_hf_checkpoint(args.hf_checkpoint)
    if args.save is not None:
        errors += check_save_dir(args.save, "--save")
    if args.load:
        errors += check_megatron_load(args.load, "--load", fresh_ok=True)  # slime: --load = --save on a fresh run
    if args.critic_load and args.use_critic:
        errors += check_megatron_load(args.critic_load, "--critic-load", fresh_ok=True)
    if args.ref_load and reference_needed(args):
        errors += check_ref_load(args.ref_load)
    teacher = args.opd_teacher_load if args.use_opd and args.opd_type == "megatron" else None
    if teacher and os.path.exists(teacher):  # a missing one is already a path problem of distillation.py
        errors += check_megatron_load(teacher, "--opd-teacher-load", fresh_ok=False)


def _environment(args) -> list:
    """The trainer ranks' environment, read later on the Ray workers (where an error would come late)."""
    try:
        trainer_threads(1, train_env_vars(args.train_env_vars))
    except ValueError as e:
        return [str(e)]
    return []


def _schedules(args) -> list:
    """Each role's warm-up vs decay horizon, with the source of the offending values named."""
    errors, seen = [], set()
    roles = [r for r in ROLES if r == "actor" or args.use_critic]
    for role in roles:
        view = apply_role(args, role)
        try:
            schedule_steps(view)
        except ValueError as e:
            msg = str(e)
            if msg in seen:
                continue  # the same shared value: one message
            seen.add(msg)
            source = _schedule_source(args, role)
            errors.append(f"role {role}: {msg.split('; lower')[0] + source if source else msg}")
    return errors


def _schedule_source(args, role: str) -> str:
    overrides = args.megatron_role_overrides.get(role, {})
    entries = args.megatron_role_entries
    from_yaml = [k for k in SCHEDULE_KEYS if k in overrides]
    if from_yaml:
        keys = ", ".join(f"{k}: {overrides[k]}" for k in from_yaml)
        return (f"; {args.megatron_config_path} entry megatron[{entries.get(role, '?')}] (role {role}) sets {keys}: "
                "lower it there (or raise lr_decay_iters / --num-rollout)")
    if role == "critic" and args.critic_lr_warmup_iters:
        return (f"; set by --critic-lr-warmup-iters {args.critic_lr_warmup_iters}: lower it (or raise "
                "--lr-decay-iters / --num-rollout)")
    return ""


def _functions(args) -> list:
    """Import every custom function the run names, and bind the arguments it will be called with."""
    errors = []
    # as the actors see them: the driver's working directory is on their PYTHONPATH (ray/cluster.py)
    added = os.getcwd() not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        for dest, shape in CALL_SHAPES.items():
            values = getattr(args, dest, None)
            for value in values if isinstance(values, list) else [values]:
                if value:
                    err = _check_function(value, "--" + dest.replace("_", "-"), shape)
                    if err:
                        errors.append(err)
    finally:
        if added:
            sys.path.remove(os.getcwd())
    return errors


def _check_function(path: str, flag: str, shape) -> str | None:
    path = resolve(path)
    if not isinstance(path, str) or "." not in path:
        return f"{flag} {path!r}: expected 'module.function' (e.g. my_pkg.rewards.score)"
    if flag[2:].replace("-", "_") in OWN_FUNCTIONS.get(path, ()):
        return None  # our own, checked by the tests; importing it would need the rollout extra (aiohttp, torch)
    return import_and_bind(path, flag, shape)


def import_and_bind(path: str, flag: str, shape) -> str | None:
    """Import `path` ('module.function') and bind the call `shape`; the error line, or None when it fits."""
    module_name, attr = path.rsplit(".", 1)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError or an error raised while the module runs: both stop the run
        install = missing_extra(e)
        if install:
            return (f"{flag} {path}: cannot import module {module_name!r}: it needs {e.name}, which is not "
                    f"installed here; {install}")
        return f"{flag} {path}: cannot import module {module_name!r} ({type(e).__name__}: {e}); is it on PYTHONPATH?"
    fn = getattr(module, attr, None)
    if fn is None:
        import difflib

        close = difflib.get_close_matches(attr, [n for n in dir(module) if not n.startswith("_")], n=1)
        return f"{flag} {path}: module {module_name!r} has no {attr!r}" + \
            (f" (did you mean {module_name}.{close[0]}?)" if close else "")
    if not callable(fn):
        return f"{flag} {path}: {attr!r} is a {type(fn).__name__}, not a function"
    if shape is None:
        return None
    positional, keywords = shape
    try:
        inspect.signature(fn).bind(*positional, **keywords)
    except TypeError as e:
        call = ", ".join([*positional, *(f"{k}={v}" for k, v in keywords.items())])
        return f"{flag} {path}: it will be called as {attr}({call}) but its signature is {attr}" \
               f"{inspect.signature(fn)} ({e})"
    except ValueError:  # builtins without a signature: nothing to check
        return None
    return None

"""slime's --eval-config: an OmegaConf YAML / JSON file of evaluation datasets, each with its own settings.

    eval:                          # (or these keys at the root)
      defaults:                    # optional, for every dataset
        n_samples_per_eval_prompt: 4
        temperature: 0.6
      datasets:                    # a list of {name, path, ...} or a mapping name -> {path, ...}
        - name: aime
          path: /data/aime.jsonl
          max_response_len: 8192
          label_key: answer

A dataset entry wins over `defaults`, which win over the command line (--eval-* flags, then the rollout's). The file
replaces --eval-prompt-data (as in slime). Each dataset's values become the eval flags they stand for while that
dataset is evaluated (rollout/eval.py). slime keys with no behaviour here are refused, naming the key.
"""
from __future__ import annotations

from slime_like.config.errors import ConfigError
from slime_like.config.safe_yaml import read_yaml

# slime's per-dataset key -> the flag dest it overrides while that dataset is evaluated
KEY_TO_DEST = {
    "n_samples_per_eval_prompt": "n_samples_per_eval_prompt", "temperature": "eval_temperature",
    "top_p": "eval_top_p", "top_k": "eval_top_k", "max_response_len": "eval_max_response_len",
    "min_new_tokens": "eval_min_new_tokens", "stop": "rollout_stop", "stop_token_ids": "rollout_stop_token_ids",
    "input_key": "eval_input_key", "label_key": "eval_label_key", "tool_key": "eval_tool_key",
    "metadata_key": "metadata_key", "apply_chat_template": "apply_chat_template",
    "apply_chat_template_kwargs": "apply_chat_template_kwargs", "custom_rm_path": "custom_rm_path",
    "rm_type": "rm_type", "repetition_penalty": "rollout_repetition_penalty",
    "skip_special_tokens": "rollout_skip_special_tokens", "multimodal_keys": "multimodal_keys",
}
# slime's EvalDatasetConfig fields slime_like has no behaviour for
REFUSED = {
    "custom_generate_function_path": "a per-dataset generate function is not supported (set "
                                     "--custom-generate-function-path for the whole run)",
    "app_service": "slime's AppServer generation proxy is not implemented",
    "eval_task_timeout": "eval tasks have no timeout of their own here",
    "min_eval_samples": "partial evals are not implemented (every prompt is scored)",
    "eval_early_stop_remaining": "eval early stop is not implemented (every prompt is scored)",
    "eval_early_stop_idle_timeout": "eval early stop is not implemented (every prompt is scored)",
    "message_processor": "slime's per-source message processors are not implemented",
    "reward_model": "slime's per-source reward-model configs are not implemented (use custom_rm_path / rm_type)",
    "remote_environment": "slime's remote environments are not implemented",
    "metadata_overrides": "metadata overrides are not implemented",
    "no_stop_trim": "the engine keeps matched stop strings always (no_stop_trim is always on)",
}


def read_eval_config(path: str) -> list[dict]:
    """[{"name", "path", "overrides": {dest: value}}] from the file; a ConfigError names the file and key."""
    from omegaconf import OmegaConf

    data = read_yaml(path, "--eval-config", omegaconf_floats=True)  # bounded; OmegaConf resolves on plain data
    if not isinstance(data, dict):
        raise ConfigError(f"--eval-config {path}: the root must be a mapping (with an `eval` key or the eval keys)")
    try:
        raw = OmegaConf.to_container(OmegaConf.create(data), resolve=True)
    except Exception as e:  # noqa: BLE001 - a YAML / interpolation error, reported with the file
        raise ConfigError(f"--eval-config {path}: cannot be read: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"--eval-config {path}: the root must be a mapping (with an `eval` key or the eval keys)")
    cfg = raw.get("eval", raw)
    if not isinstance(cfg, dict):
        raise ConfigError(f"--eval-config {path}: `eval` must be a mapping with `datasets` (and `defaults`)")
    extra = set(cfg) - {"defaults", "datasets"}
    if extra:
        raise ConfigError(f"--eval-config {path}: unknown key(s) {sorted(extra)} under eval; expected datasets, defaults")
    defaults = _checked(dict(cfg.get("defaults") or {}), path, "eval.defaults")
    entries = _dataset_list(cfg.get("datasets"), path)
    out = []
    for i, entry in enumerate(entries):
        where = f"eval.datasets[{i}] ({entry.get('name', '?')})"
        for key in ("name", "path"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise ConfigError(f"--eval-config {path}: {where} needs a `{key}` string")
        own = _checked({k: v for k, v in entry.items() if k not in ("name", "path")}, path, where)
        merged = {**defaults, **own}
        out.append({"name": entry["name"], "path": entry["path"],
                    "overrides": {KEY_TO_DEST[k]: v for k, v in merged.items()}})
    names = [d["name"] for d in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"--eval-config {path}: dataset names repeat: {names}")
    return out


def _dataset_list(datasets, path: str) -> list[dict]:
    if isinstance(datasets, dict):  # slime also accepts name -> settings
        return [{"name": name, **(cfg or {})} for name, cfg in datasets.items()]
    if isinstance(datasets, list) and datasets and all(isinstance(d, dict) for d in datasets):
        return [dict(d) for d in datasets]
    raise ConfigError(f"--eval-config {path}: eval.datasets must be a non-empty list of {{name, path, ...}} or a "
                      f"mapping name -> {{path, ...}}; got {type(datasets).__name__}")


# keys whose values the engine or the data loader would only reject later: checked now
_NUMBERS = {"n_samples_per_eval_prompt": (int, 1), "max_response_len": (int, 1), "min_new_tokens": (int, 0),
            "top_k": (int, -1), "temperature": ((int, float), 0.0), "top_p": ((int, float), 0.0)}


def _checked(mapping: dict, path: str, where: str) -> dict:
    for key, value in mapping.items():
        kind, low = _NUMBERS.get(key, (None, None))
        if kind and (isinstance(value, bool) or not isinstance(value, kind) or value < low
                     or (key == "top_p" and not 0 < value <= 1)):
            raise ConfigError(f"--eval-config {path}: {where} {key}: {value!r} is not valid (a number >= {low}"
                              f"{', in (0, 1]' if key == 'top_p' else ''})")
    for key in mapping:
        if key in REFUSED:
            raise ConfigError(f"--eval-config {path}: {where} key '{key}' is not honoured by slime_like: "
                              f"{REFUSED[key]}; remove it")
        if key not in KEY_TO_DEST:
            raise ConfigError(f"--eval-config {path}: {where} has unknown key '{key}'; known: "
                              f"{', '.join(['name', 'path', *KEY_TO_DEST])}")
    return mapping

"""`--custom-config-path FILE`: slime's YAML of extra attributes for custom functions (slime's arguments.py reads it
with yaml.safe_load -- here config/safe_yaml.py's bounded reader -- and sets every key on args, overriding a flag of the same name with a warning).

    # mis.yaml (slime's examples/train_infer_mismatch_helper)
    use_tis: true          # a flag: converted as the flag converts it, then checked with every other flag
    tis_mode: truncate     # not a flag: an attribute that the custom function reads (args.tis_mode)

Applied after the command line and before validation, so a flag set here is validated and derived like one given
on the command line. Stricter than slime where slime would run wrong: a file that is not a mapping, a key that is
not an identifier, a key naming a bookkeeping attribute or a slime feature slime_like refuses, or a flag value of
the wrong type is an error naming the file and the key. The keys that are no flag are listed in a note (read only
by the run's custom functions, so a misspelt one is visible there).
"""
from __future__ import annotations

import os

from slime_like.config.errors import ConfigError
from slime_like.config.role_overrides import _convert
from slime_like.config.safe_yaml import read_yaml
from slime_like.config.unimplemented import SLIME_ONLY_FLAGS

MAX_BYTES = 1 << 20
_REFUSED = {flag[2:].replace("-", "_"): feature for flag, feature in SLIME_ONLY_FLAGS.items()}


def add_custom_config_flag(g):
    g.add_argument("--custom-config-path", default=None,
                   help="YAML of extra attributes for custom functions (slime's): each key is set on args; a key "
                        "that is a flag's dest overrides that flag.")


def _load(path: str) -> dict:
    if os.path.isfile(path) and os.path.getsize(path) > MAX_BYTES:
        raise ConfigError(f"--custom-config-path {path}: {os.path.getsize(path)} bytes; at most {MAX_BYTES} are read")
    data = read_yaml(path, "--custom-config-path")  # bounded: aliases, depth, UTF-8 (config/safe_yaml.py)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--custom-config-path {path}: expected a mapping of attribute: value, got "
                          f"{type(data).__name__}")
    return data


def apply_custom_config(args, report, parser) -> None:
    """Set the file's keys on args (flags converted as on the command line); every bad key reported at once."""
    args.custom_config = {}
    path = args.custom_config_path
    if not path:
        return
    data = _load(path)
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    bookkeeping = set(vars(args)) - set(actions)
    errors, free = [], []
    for key, value in data.items():
        where = f"--custom-config-path {path}: key '{key}'"
        if not isinstance(key, str) or not key.isidentifier() or key.startswith("_"):
            errors.append(f"{where}: not an attribute name (letters, digits, '_'; not starting with '_')")
        elif key in _REFUSED:
            errors.append(f"{where} turns on {_REFUSED[key]}, which slime_like does not implement; remove it")
        elif key in bookkeeping:
            errors.append(f"{where} names slime_like's own bookkeeping attribute; rename it in your function")
        elif key in actions:
            try:
                converted = _convert(actions[key], value, where)
            except ConfigError as e:
                errors.append(str(e))
                continue
            if key in args.cli_dests and getattr(args, key) != converted:
                report.warn(f"{where} overrides --{key.replace('_', '-')} {getattr(args, key)!r} with "
                            f"{converted!r} (slime applies the file last)")
            setattr(args, key, converted)
            args.custom_config[key] = converted
        else:
            setattr(args, key, value)
            args.custom_config[key] = value
            free.append(key)
    if errors:
        raise ConfigError("\n".join(errors))
    if free:
        report.warnings.append(f"--custom-config-path {path}: attributes for custom functions (no flag reads "
                               f"them): {', '.join(sorted(free))}")

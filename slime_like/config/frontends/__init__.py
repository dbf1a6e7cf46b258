"""`--config FILE.yaml` (RLinf or ROLL): the file becomes flag tokens spliced where `--config FILE` stands.

    expand(argv) -> (argv with the file's flags spliced in, Translation or None)

Flags before `--config` lose to the file, flags after it win (argparse keeps the last value). Dotted overrides
(`algorithm.group_size=8`) anywhere on the command line are applied to the file before it is translated.
"""
from __future__ import annotations

from slime_like.config.errors import ConfigError
from slime_like.config.frontends.common import Translation, load, split_overrides
from slime_like.config.frontends.common import parser_options as _parser_options

FORMATS = ("rlinf", "roll")


def _option(argv: list, name: str):
    """(index, value) of `--name VALUE` / `--name=VALUE`; (None, None) when absent; the last one wins."""
    found = (None, None)
    for i, tok in enumerate(argv):
        if tok == name:
            if i + 1 >= len(argv):
                raise ConfigError(f"{name} needs a value")
            found = (i, argv[i + 1])
        elif tok.startswith(name + "="):
            found = (i, tok.split("=", 1)[1])
    return found


def detect_format(cfg: dict, path: str) -> str:
    from slime_like.config.frontends import rlinf, roll

    keys = set(cfg)
    shared = {"critic"}  # a section of both formats
    rlinf_hits, roll_hits = keys & (set(rlinf.TOP_KEYS) - shared), keys & (set(roll.TOP_KEYS) - shared)
    if rlinf_hits and not roll_hits:
        return "rlinf"
    if roll_hits and not rlinf_hits:
        return "roll"
    raise ConfigError(f"--config {path}: cannot tell RLinf from ROLL by its top-level keys {sorted(keys)}; RLinf "
                      f"files have {', '.join(rlinf.TOP_KEYS)}; ROLL files have {', '.join(roll.TOP_KEYS)}. "
                      "Add --config-format rlinf|roll")


def expand(argv: list):
    index, path = _option(argv, "--config")
    _, fmt = _option(argv, "--config-format")
    rest, overrides = split_overrides(argv, _takes_value)
    if path is None:
        if overrides:
            raise ConfigError(f"{overrides[0]!r}: dotted overrides need --config FILE.yaml (an RLinf or ROLL file)")
        return argv, None
    if fmt not in (None, "auto", *FORMATS):
        raise ConfigError(f"--config-format {fmt}: use auto, rlinf or roll")
    cfg = load(path, overrides)
    fmt = detect_format(cfg, path) if fmt in (None, "auto") else fmt
    t = Translation(path, fmt)
    t.overrides = overrides
    t.user_flags = {tok.split("=", 1)[0] for tok in rest if tok.startswith("--")}  # the user's own, either side
    if fmt == "rlinf":
        from slime_like.config.frontends import megatron_keys, rlinf

        rlinf.translate(cfg, t)
        t.attempt(megatron_keys.finish, t)
    else:
        from slime_like.config.frontends import roll

        roll.translate(cfg, t)
    # splice at the position of --config in the override-free argv
    index, _ = _option(rest, "--config")
    width = 1 if "=" in rest[index] else 2
    t.attempt(_drop_unbuilt, t, rest[index + width:])
    _name_defaults(t)
    spliced = rest[:index] + t.tokens + rest[index:index + width] + rest[index + width:]
    return spliced, t  # t.errors are raised by parse_args with what it finds after: all problems at once


def _name_defaults(t) -> None:
    """A flag written from a framework default names that in errors: `max_steps (absent: ROLL's default 500)`."""
    applied = dict(t.defaults)
    for flag, key in t.origin.items():
        if key in applied:
            t.origin[flag] = f"{key} (absent: {t.framework}'s default {applied[key]})"


def command_line(t) -> list:
    """The equivalent slime-style command line, one flag with its values per line (--dry-run, config_to_flags)."""
    import shlex

    lines, line = [], []
    for tok in t.tokens:
        if tok.startswith("--") and line:
            lines.append(" ".join(shlex.quote(x) for x in line))
            line = []
        line.append(tok)
    if line:
        lines.append(" ".join(shlex.quote(x) for x in line))
    return lines


# Backends other engineers are building: the file may name them before they exist here.
_UNBUILT_KEYS = {"--rollout-engine": "the engine (RLinf rollout.rollout_backend / ROLL actor_infer strategy_name)",
                 "--train-backend": "the trainer (RLinf actor.training_backend / ROLL actor_train strategy_name)"}


def _drop_unbuilt(t, after: list) -> None:
    """A backend value our parser does not offer yet is a clear "not built yet" error, unless the user's own
    flag after the file replaces it (then the file's value is dropped: the user's flag wins anyway)."""
    actions = _parser_options()
    for flag, what in _UNBUILT_KEYS.items():
        for i in [i for i, tok in enumerate(t.tokens) if tok == flag]:
            value = t.tokens[i + 1]
            if value in actions[flag].choices:
                continue
            if any(tok == flag or tok.startswith(flag + "=") for tok in after):
                del t.tokens[i:i + 2]
                t.no_effect += [(key, "...", f"a setting of {flag} {value}, which the {flag} after the file replaces")
                                for f, v, key in t.unmapped if (f, v) == (flag, value)]
                continue
            raise ConfigError(f"{t.path}: {what} is {value!r}, i.e. {flag} {value}, which is not built yet in "
                              f"slime_like (available: {', '.join(actions[flag].choices)}); choose one of those "
                              f"after the file, e.g. {flag} {actions[flag].choices[-1]}")
    kept = {(t.tokens[i], t.tokens[i + 1]) for i in range(len(t.tokens) - 1) if t.tokens[i] in _UNBUILT_KEYS}
    for flag, value, key in t.unmapped:
        if (flag, value) in kept:
            raise ConfigError(f"{t.path}: {key}: a setting of {flag} {value}, whose own flags this translation does "
                              "not map yet; set the equivalent flag after the file and remove the key")


def _takes_value(flag: str) -> bool:
    action = _parser_options().get(flag)
    return action is None or action.nargs != 0

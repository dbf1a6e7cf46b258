"""`--vllm-*` passthrough: every vLLM server (engine) argument, prefixed, kept for the vllm engine's launcher.

vLLM runs from its own environment (bench/.venv-vllm: it pins its own torch stack), so its argument parser is
normally not importable here. Two modes, chosen when our parser is built:
* generated -- from vLLM's own parser (``vllm.entrypoints.launchers.cli_args.make_arg_parser``): imported
  in-process when vllm is importable, else read from the spec that parser was dumped to
  (``<vLLM venv>/slime_like_vllm_cli.json``, written by ``bench/vllm_peer/setup_env.sh`` with
  ``python -m slime_like.config.vllm_passthrough --dump``). Each option ``--NAME`` becomes ``--vllm-NAME``
  (dest ``vllm_<dest>``) with vLLM's kind (switch / --no- switch / value / list), int and float types and
  string choices, so typos and bad values fail at parse time with vLLM's own vocabulary.
* generic -- no spec: any ``--vllm-NAME [VALUE ...]`` is accepted (same rules as ``--sglang-*``: bare flag =
  True, int / float / string values, several values = a list) and vLLM checks it at launch.

Either way ``args.vllm_server_args = {dest: value}`` holds what the user set (CLI or ``--vllm-config FILE``, a
YAML/JSON mapping of vLLM argument names; the CLI wins) and ``args.vllm_cli_options = {dest: "--option"}`` how
vLLM spells each. The environment is found through $SLIME_LIKE_VLLM_VENV, else ``bench/.venv-vllm`` of this
checkout. This module imports nothing of ours but config.errors (config/ sits at the bottom of the imports).
"""
from __future__ import annotations

import json
import os
import sys

from slime_like.config.errors import ConfigError, did_you_mean
from slime_like.config.sglang_passthrough import named_engines
from slime_like.config.yaml_mapping import load_yaml_mapping
from slime_like.registry import ROLLOUT_ENGINES

PREFIX = "--vllm-"
SPEC_FILE = "slime_like_vllm_cli.json"
# vLLM arguments the engine launcher sets (model, topology, ports, our worker extension): never user-settable.
LAUNCHER_OWNED = frozenset({
    "model", "model_tag", "host", "port", "served_model_name", "worker_extension_cls", "api_key",
    "tensor_parallel_size", "seed", "uds", "headless", "config",
})
# slime_like's own --vllm-* flags (not vLLM arguments).
OWN = frozenset({"config", "server_args", "cli_options", "passthrough_mode"})


def vllm_venv() -> str:
    env = os.environ.get("SLIME_LIKE_VLLM_VENV")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "bench", ".venv-vllm"))


def vllm_importable() -> bool:
    """vLLM installed in this interpreter (a namespace package such as a `vllm/` test folder does not count)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


def load_spec() -> list[dict] | None:
    """vLLM's argument spec: from vllm itself when importable here, else the dumped file, else None."""
    if vllm_importable() and os.environ.get("SLIME_LIKE_VLLM_PASSTHROUGH") != "file":
        return dump_spec()
    path = os.path.join(vllm_venv(), SPEC_FILE)
    if not os.path.isfile(path) or os.environ.get("SLIME_LIKE_VLLM_PASSTHROUGH") == "generic":
        return None
    with open(path) as f:
        return json.load(f)["options"]


def dump_spec() -> list[dict]:
    """Walk vLLM's own server parser (run under vLLM's interpreter) -> one JSON-able record per option."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    out = []
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--") and not o.startswith("--no-")]
        if not longs or action.dest == "help":
            continue
        kind = {"BooleanOptionalAction": "bool", "_StoreTrueAction": "true", "_AppendAction": "append"}.get(
            type(action).__name__, "value")
        tname = getattr(action.type, "__name__", None)
        choices = list(action.choices) if action.choices and all(isinstance(c, str) for c in action.choices) else None
        out.append({"option": max(longs, key=len) if longs[0].startswith("--") else longs[0], "names": longs,
                    "dest": action.dest, "kind": kind, "type": tname if tname in ("int", "float") else "str",
                    "nargs": action.nargs if isinstance(action.nargs, str) else None, "choices": choices})
    return out


def add_generated_flags(group, spec: list[dict], taken: set) -> dict:
    """Register --vllm-NAME for each spec option; returns {dest: vLLM option string} of those added."""
    import argparse

    options = {}
    for o in spec:
        if o["dest"] in LAUNCHER_OWNED or o["dest"] in OWN:
            continue
        names = [PREFIX + n[2:] for n in o["names"] if PREFIX + n[2:] not in taken]
        if not names:
            continue
        kw = {"dest": "vllm_" + o["dest"], "default": None, "help": argparse.SUPPRESS}
        if o["kind"] == "bool":
            kw["action"] = argparse.BooleanOptionalAction
        elif o["kind"] == "true":
            kw["action"] = "store_true"
        else:
            kw["type"] = {"int": int, "float": float}.get(o["type"], str)
            if o["choices"]:
                kw["choices"] = o["choices"]
            if o["nargs"] in ("+", "*") or o["kind"] == "append":
                kw["nargs"] = "+"
        group.add_argument(*names, **kw)
        taken.update(names)
        options[o["dest"]] = o["option"]
    return options


def want_generated(argv) -> bool:
    """Build the flags from vLLM's own argument dump only when this command line has vLLM flags to check (or asks
    for --help) and does not pick another engine: a plain start parses with the one shared parser."""
    if not any(t.startswith(PREFIX) or t in ("-h", "--help") for t in argv):
        return False
    return not any(engine in ROLLOUT_ENGINES and not ROLLOUT_ENGINES.has(engine, "vllm_server_args")
                   for engine in named_engines(argv))


def extract_generic(argv, known_options) -> tuple[list, dict]:
    """Split unknown `--vllm-NAME [VALUE ...]` tokens out of argv -> (rest, {dest: value})."""
    from slime_like.config.sglang_passthrough import _coerce, _looks_like_flag

    rest, found, i = [], {}, 0
    while i < len(argv):
        tok = argv[i]
        flag = tok.split("=", 1)[0]
        if tok.startswith(PREFIX) and flag not in known_options:
            name = flag[len(PREFIX):].replace("-", "_")
            _check_name(name, flag)
            if "=" in tok:
                found[name] = _coerce(tok.split("=", 1)[1])
            else:
                values = []
                while i + 1 < len(argv) and not _looks_like_flag(argv[i + 1]):
                    values.append(_coerce(argv[i + 1]))
                    i += 1
                found[name] = True if not values else values[0] if len(values) == 1 else values
        else:
            rest.append(tok)
        i += 1
    return rest, found


def _check_name(name: str, shown: str) -> None:
    if not name:
        raise ConfigError(f"'{shown}' names no vLLM argument; write --vllm-NAME [VALUE]")
    if name in LAUNCHER_OWNED:
        raise ConfigError(f"{shown} is set by the vllm engine launcher (from --hf-checkpoint, "
                          "--rollout-num-gpus-per-engine, --seed and the placement plan); remove it")


def collect(args, options: dict, generic: dict) -> None:
    """Fill args.vllm_server_args / args.vllm_cli_options from the parsed flags, the config file and generic values."""
    chosen = _load_config(args.vllm_config, options) if args.vllm_config else {}
    for dest in options:
        value = getattr(args, "vllm_" + dest, None)
        if value is not None:
            chosen[dest] = value
    chosen.update(generic)
    for dest, value in chosen.items():
        setattr(args, "vllm_" + dest, value)
    args.vllm_server_args = chosen
    args.vllm_cli_options = {d: options.get(d, "--" + d.replace("_", "-")) for d in chosen}
    args.vllm_passthrough_mode = "generated" if options else "generic"


def _load_config(path: str, options: dict) -> dict:
    data = load_yaml_mapping("--vllm-config", path, "vLLM argument names")
    out = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        _check_name(name, f"--vllm-config {path}: '{key}'")
        if options and name not in options:
            raise ConfigError(f"--vllm-config {path}: '{key}' is not a vLLM server argument"
                              f"{did_you_mean(name, options)}")
        out[name] = value
    return out


def server_argv(args) -> list[str]:
    """The user's vLLM values as vLLM CLI tokens (True -> --flag, False -> --no-flag, lists -> repeated values)."""
    out = []
    values = args.vllm_server_args
    spelled = args.vllm_cli_options
    for dest in sorted(values):
        value, flag = values[dest], spelled.get(dest, "--" + dest.replace("_", "-"))
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + flag[2:])
        elif isinstance(value, (list, tuple)):
            out += [flag, *map(str, value)]
        elif isinstance(value, dict):
            out += [flag, json.dumps(value)]
        else:
            out += [flag, str(value)]
    return out


if __name__ == "__main__":  # python -m slime_like.config.vllm_passthrough --dump OUT (under vLLM's interpreter)
    if sys.argv[1:2] != ["--dump"] or len(sys.argv) != 3:
        raise SystemExit("usage: python -m slime_like.config.vllm_passthrough --dump OUT.json")
    import vllm

    with open(sys.argv[2], "w") as f:
        json.dump({"vllm_version": vllm.__version__, "options": dump_spec()}, f, indent=0)
    print(f"wrote {sys.argv[2]}: vLLM {vllm.__version__} server arguments")

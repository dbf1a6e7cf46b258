"""What the RLinf and ROLL front-ends share: loading (OmegaConf, resolvers, dotted overrides), the key schema
walk, and the translation record.

A front-end never builds a Namespace itself. It turns the file into the tokens of an equivalent slime-style
command line (plus per-role values for the actor / critic, the same overlay `--megatron-config-path` sets);
`slime_like.args.parse_args` splices those tokens where `--config FILE` stood, so flags written after the
file win, and then everything goes through the one parser, the support table and validation.

Every key of the file is in the format's schema, a nested dict whose leaves are rules:
  Map(type, fn)      translated: fn(value, t) adds flags / role values / facts to the Translation `t`
  Read(type, why)    consumed by the format's own cross-key logic (placement, interpolation, ...)
  NoEffect(type, why, harmless=...)   accepted; a value outside `harmless` gives one warning saying why
  Refuse(type, why, ok=...)           a value outside `ok` is a one-line error naming the dotted key
A `Free(rule)` node accepts any sub-key with the same rule (e.g. tracker settings). An unknown key at any depth
is an error naming its dotted path and the closest real key.
"""
from __future__ import annotations

import functools

import os
import re

from slime_like.config.errors import ConfigError, did_you_mean
from slime_like.config.placement_spec import devices_text, parse_devices  # noqa: F401 (the front-ends' GPU lists)

_ANY = object()
TYPES = {
    "int": (int,), "float": (int, float), "bool": (bool,), "str": (str,), "list": (list,), "dict": (dict,),
    "any": (object,), "num_or_str": (int, float, str), "list_or_str": (list, str), "mapping": (list, str, int),
}
_TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
               "list": "a list", "dict": "a mapping", "num_or_str": "a number or a string",
               "list_or_str": "a list or a string", "mapping": "a device list (e.g. list(range(0,8)))"}


class Rule:
    def __init__(self, typ: str, why: str = "", fn=None, ok=_ANY):
        self.typ, self.why, self.fn, self.ok = typ, why, fn, ok


class Map(Rule):
    def __init__(self, typ: str, fn):
        super().__init__(typ, fn=fn)


class Read(Rule):
    pass


class NoEffect(Rule):
    def __init__(self, typ: str, why: str, harmless=_ANY):
        super().__init__(typ, why, ok=harmless)


class Refuse(Rule):
    def __init__(self, typ: str, why: str, ok=()):
        super().__init__(typ, why, ok=ok)


class Free:
    """Any sub-key, each under `rule` (a Rule or a nested schema dict)."""

    def __init__(self, rule):
        self.rule = rule


class Translation:
    """The equivalent command line being built: flag tokens in file order, role values, facts, notes."""

    def __init__(self, path: str, fmt: str):
        self.path, self.fmt = path, fmt
        self.tokens: list = []
        self.roles: dict = {}
        self.facts: dict = {}
        self.no_effect: list = []   # (dotted key, value, why)
        # (flag, value, dotted key): settings of a backend (fsdp, vllm) whose own flags this translation does not
        # map yet; an error once that backend exists, never silently dropped (before, "not built yet" stops it)
        self.unmapped: list = []
        self.origin: dict = {}      # flag -> the dotted key that wrote it (for errors the parser finds later)
        self.current = None         # the key being translated

    def flag(self, flag: str, *values):
        """`--flag v1 v2`; a None value leaves the flag out (the default stands)."""
        if values and all(v is None for v in values):
            return
        if self.current:
            self.origin[flag] = self.current
        self.tokens.append(flag)
        self.tokens.extend(_token(v) for v in values)

    def switch(self, flag: str, on: bool):
        if on:
            self.flag(flag)

    def explain(self, message: str) -> str:
        """A parser error about a flag this file wrote, with the file and the dotted key in front."""
        m = re.match(r"^(?:argument )?(--[\w-]+)", message)
        flag = m.group(1) if m else None
        if flag in self.origin:
            return f"{self.path}: {self.origin[flag]} (translated to {flag}): {message}"
        return message

    def role(self, role: str, dest: str, value):
        if value is not None:
            self.roles.setdefault(role, {})[dest] = value


def _token(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


# ---- loading ----------------------------------------------------------------------------------------------

def _register_resolvers():
    """The resolvers RLinf registers (rlinf/config.py) and ROLL's configs rely on, minus code execution."""
    from omegaconf import OmegaConf

    table = {
        "multiply": lambda x, y: x * y,
        "int_div": lambda x, y: x // y,
        "subtract": lambda x, y: x - y,
        "add": lambda x, y: x + y,
        "not": lambda x: not bool(x),
        "torch.dtype": lambda name: str(name),  # the dtype's name: the config layer never imports torch
    }
    register = getattr(OmegaConf, "register_resolver", None) or OmegaConf.register_new_resolver  # 2.4 renamed it
    for name, fn in table.items():
        if not OmegaConf.has_resolver(name):
            register(name, fn)


def load(path: str, overrides: list) -> dict:
    """YAML file + dotted `a.b=c` overrides -> a plain dict with every interpolation resolved."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not os.path.isfile(path):
        raise ConfigError(f"--config {path}: no such file")
    _register_resolvers()
    try:
        cfg = OmegaConf.load(path)
    except Exception as e:  # yaml.YAMLError and friends: show the parser's line:column
        raise ConfigError(f"--config {path}: not valid YAML: {_one_line(e)}") from None
    if not isinstance(cfg, type(OmegaConf.create({}))):
        raise ConfigError(f"--config {path}: expected a mapping of sections at the top level")
    for item in overrides:
        key, value = item.split("=", 1)
        try:
            OmegaConf.update(cfg, key, _yaml_value(value), merge=False, force_add=True)  # replace, as Hydra does
        except OmegaConfBaseException as e:
            raise ConfigError(f"override {item!r}: {_one_line(e)}") from None
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or "?"
        raise ConfigError(f"{path}: key '{key}': cannot resolve its interpolation: {_one_line(e)}") from None


def _yaml_value(text: str):
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _one_line(e) -> str:
    return " ".join(str(e).split())[:300]


def split_overrides(argv: list, takes_value=lambda flag: True) -> tuple[list, list]:
    """Pull `key=value` / `a.b.c=value` tokens out of argv -> (rest, overrides). A token right after a flag that
    takes a value is that flag's value, not an override (`takes_value(flag)` says which flags do)."""
    rest, overrides = [], []
    for i, tok in enumerate(argv):
        prev = argv[i - 1] if i else ""
        is_value = prev.startswith("--") and "=" not in prev and takes_value(prev)
        if not is_value and not tok.startswith("-") and re.match(r"^[A-Za-z_]\w*(\.\w+)*=", tok):
            overrides.append(tok)
        else:
            rest.append(tok)
    return rest, overrides


# ---- the schema walk ----------------------------------------------------------------------------------------

def _all_paths(schema, prefix="") -> list:
    out = []
    for key, node in schema.items():
        path = f"{prefix}{key}"
        out.append(path)
        if isinstance(node, dict):
            out += _all_paths(node, path + ".")
    return out


def check_type(where: str, typ: str, value):
    """The value, checked against `typ`; YAML 1.1 reads `1e-6` as a string, so numbers in strings are converted."""
    if value is None or typ == "any":
        return value
    if typ == "float" and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    kinds = TYPES[typ]
    if isinstance(value, bool) and bool not in kinds and object not in kinds:
        raise ConfigError(f"{where}: expected {_TYPE_WORDS[typ]}, got {value!r}")
    if not isinstance(value, kinds):
        raise ConfigError(f"{where}: expected {_TYPE_WORDS[typ]}, got {value!r} ({type(value).__name__})")
    return value


def walk(cfg: dict, schema: dict, t: Translation, prefix: str = "", root_schema=None):
    """Check every key of `cfg` against `schema`, apply Map / NoEffect / Refuse rules in file order."""
    root_schema = root_schema or schema
    for key, value in cfg.items():
        dotted = f"{prefix}{key}"
        where = f"{t.path}: {dotted}"
        node = schema.get(key) if isinstance(schema, dict) else None
        if isinstance(schema, Free):
            node = schema.rule
        if node is None:
            raise ConfigError(f"{where}: unknown key{_suggest(str(key), dotted, schema, root_schema)}")
        if isinstance(node, (dict, Free)):
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: expected a mapping (a section), got {value!r}")
            walk(value, node, t, dotted + ".", root_schema)
            continue
        value = cfg[key] = check_type(where, node.typ, value)
        if isinstance(node, Refuse) and value is not None and value not in node.ok:
            raise ConfigError(f"{where}: {value!r} is not supported here: {node.why}")
        if isinstance(node, NoEffect) and value is not None and (node.ok is _ANY or value not in node.ok):
            t.no_effect.append((dotted, value, node.why))
        if isinstance(node, Map):
            t.current = dotted
            try:
                node.fn(value, t)
            except ConfigError as e:
                raise ConfigError(f"{where}: {e}") from None
            finally:
                t.current = None


def _suggest(key: str, dotted: str, schema, root_schema) -> str:
    siblings = list(schema) if isinstance(schema, dict) else []
    hint = did_you_mean(key, siblings)
    if hint:
        return hint
    elsewhere = [p for p in _all_paths(root_schema) if p.rsplit(".", 1)[-1] == key]
    if elsewhere:
        return f" here (it belongs under {' or '.join(sorted(elsewhere))})"
    parent = dotted.rsplit(".", 1)[0] if "." in dotted else ""
    keys = ", ".join(sorted(siblings)[:12])
    return f"; keys of {parent or 'the top level'}: {keys}{' ...' if len(siblings) > 12 else ''}"


def get(cfg: dict, dotted: str, default=None):
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


@functools.lru_cache(maxsize=1)
def parser_options() -> dict:
    """The parser's option strings -> actions (which flags exist, which take a value); built once."""
    from slime_like.config.parser import shared_parser

    return shared_parser()._option_string_actions

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
from slime_like.config.safe_yaml import parse_yaml, read_yaml

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
        self.errors: list = []      # every problem of the file, "dotted.key [--flag]: why"; raised together
        self.defaults: list = []    # (dotted key, value): the framework's defaults applied for keys left out
        self.paths: list = []       # (dotted key, as written, absolute): relative paths resolved
        self.user_flags: set = set()  # flags the user wrote on the command line (they can supply a missing key)
        self.framework = fmt

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

    def error(self, key: str, message: str, flag: str | None = None):
        """Record a problem of the file (every one is reported at once, after the whole file is read)."""
        self.errors.append(f"{key}{f' [{flag}]' if flag else ''}: {message}")

    def attempt(self, step, *a):
        """Run one cross-key step of a translation; its ConfigError becomes one recorded problem."""
        try:
            step(*a)
        except ConfigError as e:
            text = str(e)
            prefix = f"{self.path}: "
            self.errors.append(text[len(prefix):] if text.startswith(prefix) else text)

    def explain(self, message: str) -> list:
        """The problems of a parser / validation / preflight error, each naming the file's dotted key, with the
        slime flag it was translated to in brackets, where the flag came from the file."""
        return [self._name_key(item) for item in split_problems(message)]

    def _name_key(self, text: str) -> str:
        """Each flag the file wrote, at its first mention: `--input-key` -> `actor_train.data_args.prompt
        [--input-key]`."""
        named = set()

        def name(m):
            flag = m.group(0)
            if flag in named or flag not in self.origin:
                return flag
            named.add(flag)
            return f"{self.origin[flag]} [{flag}]"
        return re.sub(r"(?<![\w-])--[a-z][\w-]*", name, text)

    def report(self, later: str | None = None) -> str | None:
        """Every problem at once: the file's own, then those found after translation (None when none)."""
        problems = list(self.errors) + (self.explain(later) if later else [])
        if not problems:
            return None
        if len(problems) == 1:
            return f"{self.path}: {problems[0]}" if self.errors or problems[0] != later else later
        return (f"{len(problems)} problems, all found before starting (keys of {self.path} by dotted path, with "
                "the slime flag each maps to in brackets):\n" + "\n".join(f"  - {p}" for p in problems))

    def role(self, role: str, dest: str, value):
        if value is not None:
            self.roles.setdefault(role, {})[dest] = value


def split_problems(message: str) -> list:
    """'N problems ...:\n  - a\n  - b' (validation, preflight) -> [a, b]; any other message -> [message]."""
    lines = message.split("\n")
    if len(lines) > 1 and all(line.startswith("  - ") for line in lines[1:]):
        return [line[4:] for line in lines[1:]]
    return [message]


def _token(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


# ---- loading ----------------------------------------------------------------------------------------------

def _register_resolvers():
    """The resolvers RLinf registers (rlinf/utils/omega_resolver.py) and ROLL's configs rely on, minus code
    execution, with omegaconf's current resolver API: `register_new_resolver` before 2.4, `register_resolver` from
    2.4 on. Before 2.4 `register_resolver` is the legacy API, which refuses nested interpolations such as RLinf's
    `${subtract:${runner.seq_length}, ${data.max_prompt_length}}` (omegaconf 2.3 is what hydra-core pins)."""
    from omegaconf import OmegaConf

    table = {
        "multiply": lambda x, y: x * y,
        "int_div": lambda x, y: x // y,
        "subtract": lambda x, y: x - y,
        "add": lambda x, y: x + y,
        "not": lambda x: not bool(x),
        "torch.dtype": lambda name: str(name),  # the dtype's name: the config layer never imports torch
    }
    import omegaconf

    # 2.4 deprecates register_new_resolver and gives its API the old name back; before 2.4 that name is legacy
    major_minor = tuple(int(x) for x in omegaconf.__version__.split(".")[:2])
    register = OmegaConf.register_resolver if major_minor >= (2, 4) else OmegaConf.register_new_resolver
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
    data = read_yaml(path, "--config", omegaconf_floats=True)  # bounded; OmegaConf resolves on the plain data
    if not isinstance(data, (dict, type(None))):
        raise ConfigError(f"--config {path}: expected a mapping of sections at the top level")
    try:
        cfg = OmegaConf.create(data or {})
    except OmegaConfBaseException as e:
        raise ConfigError(f"--config {path}: not an OmegaConf config: {_one_line(e)}") from None
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
    try:
        return parse_yaml(text, "override", repr(text), omegaconf_floats=True)
    except ConfigError:
        return text  # not YAML: the literal string, as Hydra takes it


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
    """Check every key of `cfg` against `schema`, apply Map / NoEffect / Refuse rules in file order. A bad key is
    recorded (t.errors) and the walk goes on, so one dry run names every problem of the file."""
    root_schema = root_schema or schema
    for key, value in cfg.items():
        dotted = f"{prefix}{key}"
        node = schema.get(key) if isinstance(schema, dict) else None
        if isinstance(schema, Free):
            node = schema.rule
        if node is None:
            t.error(dotted, f"unknown key{_suggest(str(key), dotted, schema, root_schema)}")
            continue
        if isinstance(node, (dict, Free)):
            if value is None:
                continue
            if not isinstance(value, dict):
                t.error(dotted, f"expected a mapping (a section), got {value!r}")
                continue
            walk(value, node, t, dotted + ".", root_schema)
            continue
        flag = getattr(node.fn, "flag", None)
        try:
            value = cfg[key] = check_type(dotted, node.typ, value)
        except ConfigError as e:
            t.error(dotted, str(e)[len(dotted) + 2:], flag)
            continue
        if isinstance(node, Refuse) and value is not None and value not in node.ok:
            t.error(dotted, f"{value!r} is not supported here: {node.why}")
        if isinstance(node, NoEffect) and value is not None and (node.ok is _ANY or value not in node.ok):
            t.no_effect.append((dotted, value, node.why))
        if isinstance(node, Map):
            t.current = dotted
            try:
                node.fn(value, t)
            except ConfigError as e:
                t.error(dotted, str(e), flag)
            finally:
                t.current = None


def flag_rule(flag: str, fn):
    """`fn` (value, t) that writes `flag`, marked with it so an error about the key names the flag too."""
    fn.flag = flag
    return fn


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


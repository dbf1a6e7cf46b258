"""The one YAML reader of the project: every YAML (or JSON) file a user hands us goes through `read_yaml`.

`yaml.safe_load` runs no code but has no bounds: a 415-byte alias bomb ("billion laughs") expands to 10^9 nodes
as soon as anything walks it (a message that prints the value, OmegaConf.create, a deep copy), a document nested
50,000 deep overflows the composer's recursion, a file that is not UTF-8 ends in a UnicodeDecodeError traceback
and /dev/zero is read until memory runs out. Here the file is read in bytes up to MAX_BYTES, decoded as UTF-8,
composed by PyYAML's pure-Python SafeLoader with a nesting-depth and alias-count bound, and its node graph is
measured (aliases expanded, each shared node counted once per use) before any Python object is built. Anything
over a bound, a recursive alias, a duplicate key or a syntax error is a ConfigError of one line naming the flag,
the file and the line.

OmegaConf files (RLinf / ROLL `--config`, `--eval-config`) are read here too, with `omegaconf_floats=True`
(YAML 1.2 floats such as 1e-5, no timestamps, as OmegaConf's own loader reads them); the caller gives the plain
data to OmegaConf.create, whose interpolations and resolvers work on it as on OmegaConf.load's result.
"""
from __future__ import annotations

import os
import re

from slime_like.config.errors import ConfigError

MAX_BYTES = 2 * 1024 * 1024      # config files are kilobytes; a 2 MiB one is already unusual
MAX_DEPTH = 100                  # real configs nest < 10 deep; PyYAML's composer recurses ~3 frames per level
MAX_ALIASES = 1_000              # `*name` uses; configs that share blocks use a handful
MAX_EXPANDED_NODES = 200_000     # nodes after alias expansion: what a reader of the data would walk

_FLOAT_1_2 = re.compile(r"""^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?
                              |[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""", re.X)
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_loaders: dict = {}


def read_yaml(path: str, flag: str, *, omegaconf_floats: bool = False):
    """The file's data (None when empty), or a one-line ConfigError `FLAG PATH:LINE: what` for a missing,
    oversized, non-UTF-8, malformed or bomb-shaped file. `flag` names where the path came from."""
    return parse_yaml(_read_text(path, flag), flag, path, omegaconf_floats=omegaconf_floats)


def parse_yaml(text: str, flag: str, source: str, *, omegaconf_floats: bool = False):
    """`text` (from `source`: a file, or e.g. a command-line override) read under the same bounds."""
    import yaml

    if len(text) > MAX_BYTES:
        raise ConfigError(f"{flag} {source}: longer than {MAX_BYTES} characters")
    loader = _loader_class(omegaconf_floats)(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, flag, source)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        raise ConfigError(f"{flag} {_where(source, e.problem_mark or e.context_mark)}: not valid YAML: "
                          f"{_one_line(e)}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{flag} {source}: not valid YAML: {_one_line(e)}") from None
    except RecursionError:  # a bound above should come first; this keeps the promise of one line
        raise ConfigError(f"{flag} {source}: nested too deeply to read (more than {MAX_DEPTH} levels)") from None
    finally:
        loader.dispose()


def _read_text(path: str, flag: str) -> str:
    if not os.path.exists(path):
        raise ConfigError(f"{flag} {path}: no such file")
    if os.path.isdir(path):
        raise ConfigError(f"{flag} {path}: is a directory, expected a YAML / JSON file")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)  # bounded even for /dev/zero or a FIFO that never ends
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot be read: {e.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"{flag} {path}: larger than {MAX_BYTES // (1024 * 1024)} MiB; a configuration file is "
                          "kilobytes (is this the right file?)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise ConfigError(f"{flag} {path}:{line}:{column}: not UTF-8 (byte 0x{raw[e.start]:02x}); save the file "
                          "as UTF-8") from None


def _loader_class(omegaconf_floats: bool):
    """A SafeLoader subclass (pure Python, so its composer can be bounded) made once per flavour."""
    if omegaconf_floats in _loaders:
        return _loaders[omegaconf_floats]
    import yaml
    from yaml.events import AliasEvent

    class BoundedLoader(yaml.SafeLoader):
        def __init__(self, stream):
            super().__init__(stream)
            self._depth = 0
            self._aliases = 0

        def compose_node(self, parent, index):
            mark = self.peek_event().start_mark
            if self.check_event(AliasEvent):
                self._aliases += 1
                if self._aliases > MAX_ALIASES:
                    raise yaml.composer.ComposerError(None, None, f"more than {MAX_ALIASES} aliases (*name)", mark)
                return super().compose_node(parent, index)
            self._depth += 1
            try:
                if self._depth > MAX_DEPTH:
                    raise yaml.composer.ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep", mark)
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def construct_mapping(self, node, deep=False):
            seen = {}  # explicit keys only: a key that overrides one merged in by `<<: *base` is not a duplicate
            for key_node, _ in getattr(node, "value", ()):
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key_node.value!r} (first on line {seen[key_node.value]}); "
                        "keep one", key_node.start_mark)
                seen[key_node.value] = key_node.start_mark.line + 1
            return super().construct_mapping(node, deep=deep)

    if omegaconf_floats:
        BoundedLoader.yaml_implicit_resolvers = {
            first: [(tag, rx) for tag, rx in resolvers if tag not in (_TIMESTAMP, "tag:yaml.org,2002:float")]
            for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
        BoundedLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_1_2, list("-+0123456789."))
    _loaders[omegaconf_floats] = BoundedLoader
    return BoundedLoader


def _check_expansion(root, flag: str, path: str) -> None:
    """Refuse a recursive alias or a graph that expands past MAX_EXPANDED_NODES, walking iteratively (no
    recursion) with each distinct node measured once."""
    import yaml

    size: dict = {}
    on_path: set = set()
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            total = 1 + sum(size[id(c)] for c in _children(node, yaml))
            if total > MAX_EXPANDED_NODES:
                raise ConfigError(f"{flag} {_where(path, node.start_mark)}: its aliases expand to more than "
                                  f"{MAX_EXPANDED_NODES} values (an alias bomb?); write the values out")
            size[key] = total
            continue
        if key in size:
            continue
        if key in on_path:
            raise ConfigError(f"{flag} {_where(path, node.start_mark)}: a recursive alias (an anchor used inside "
                              "itself); such data has no end")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node, yaml) if id(c) not in size)


def _children(node, yaml):
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return ()


def _where(path: str, mark) -> str:
    return f"{path}:{mark.line + 1}" if mark is not None else path


def _one_line(e) -> str:
    problem = getattr(e, "problem", None)
    context = getattr(e, "context", None)
    text = " ".join(p for p in (context, problem) if p) if problem else str(e)
    return " ".join(text.split())[:300]

"""`--sglang-*` passthrough: every SGLang server setting, prefixed, kept for the engine launcher.

Two modes, chosen when the parser is built:
* generated -- `sglang` is importable (GPU machines): its own `ServerArgs.add_cli_args` registers the
  flags, each renamed `--sglang-NAME` with dest `sglang_NAME`, so types, choices and typos are checked
  exactly as SGLang checks them. Importing sglang pulls in torch, so this mode is skipped when the run
  cannot use SGLang anyway (`--rollout-engine cpu`, `--debug-train-only`, `--load-debug-rollout-data`)
  or when SLIME_LIKE_SGLANG_PASSTHROUGH=generic.
* generic -- no sglang (CPU machines): any `--sglang-NAME [VALUE ...]` is accepted; a bare flag means True,
  each value is read as int, then float, else kept as a string; several values make a list.

Either way the result is `args.sglang_server_args = {name: value}` holding only what the user set (on the
CLI, or in `--sglang-config FILE`, a YAML/JSON mapping of ServerArgs fields, or slime's engine-layout file:
sglang_layout.py; the CLI wins), plus one
attribute `args.sglang_<name>` per entry. The launcher passes exactly `sglang_server_args` to the server.
"""
from __future__ import annotations

import importlib.util
import os

from slime_like.config.errors import ConfigError, did_you_mean
from slime_like.config.sglang_layout import apply_slime_layout, is_slime_layout
from slime_like.config.yaml_mapping import load_yaml_mapping
from slime_like.registry import ROLLOUT_ENGINES

PREFIX = "--sglang-"
# ServerArgs fields the launcher owns (model, topology, ports): never user-settable through the passthrough.
LAUNCHER_OWNED = frozenset({
    "model_path", "config", "trust_remote_code", "random_seed", "enable_memory_saver", "tp_size", "port", "host",
    "nnodes", "node_rank", "dist_init_addr", "gpu_id_step", "base_gpu_id", "nccl_port", "skip_server_warmup",
    "api_key", "disaggregation_mode", "disaggregation_bootstrap_port",  # the roles: --prefill-num-servers
})
_NO_SGLANG_IMPORT_FLAGS = ("--debug-train-only", "--load-debug-rollout-data")


def want_generated(argv) -> bool:
    """Generate the flags from sglang's ServerArgs only when sglang is installed and the run may use it."""
    if os.environ.get("SLIME_LIKE_SGLANG_PASSTHROUGH", "") == "generic":
        return False
    if any(tok in _NO_SGLANG_IMPORT_FLAGS or tok.startswith("--load-debug-rollout-data=") for tok in argv):
        return False
    if any(ROLLOUT_ENGINES.has(engine, "embedded") for engine in named_engines(argv)):
        return False  # our own server: SGLang's ServerArgs do not apply to it
    return importlib.util.find_spec("sglang") is not None


def named_engines(argv) -> list:
    """The --rollout-engine values an (unparsed) command line names."""
    out = [tok.split("=", 1)[1] for tok in argv if tok.startswith("--rollout-engine=")]
    return out + [argv[i + 1] for i, tok in enumerate(argv[:-1]) if tok == "--rollout-engine"]


class _Prefixing:
    """Stands in for an argparse group while ServerArgs.add_cli_args runs: renames every flag it adds."""

    def __init__(self, group, taken: set, dests: set):
        self.group, self.taken, self.dests = group, taken, dests
        self.options: dict = {}   # ServerArgs field -> SGLang's option string (may differ from the field name)

    def add_argument(self, *names, **kwargs):
        longs = [n for n in names if n.startswith("--")]
        dest = kwargs.pop("dest", None) or (longs[0][2:] if longs else names[0].lstrip("-")).replace("-", "_")
        if dest in LAUNCHER_OWNED:
            return None
        new_names = [PREFIX + n[2:] for n in longs if PREFIX + n[2:] not in self.taken]
        if not new_names:
            return None
        kwargs.pop("required", None)
        if isinstance(kwargs.get("help"), str) and "%(" not in kwargs["help"]:
            kwargs["help"] = kwargs["help"].replace("%", "%%")  # argparse formats help with %-interpolation
        self.taken.update(new_names)
        self.dests.add(dest)
        self.options.setdefault(dest, longs[0])   # a later alias of the same field (deprecated spelling) maps to it
        return self.group.add_argument(*new_names, dest="sglang_" + dest, **kwargs)

    def add_argument_group(self, *a, **k):
        return self

    def add_mutually_exclusive_group(self, *a, **k):
        return self

    def set_defaults(self, **kwargs):
        pass


def add_generated_flags(parser, group) -> set:
    """Register sglang's ServerArgs flags under --sglang-*; return the set of ServerArgs field names added."""
    from sglang.srt.server_args import ServerArgs

    dests: set = set()
    prefixing = _Prefixing(group, set(parser._option_string_actions), dests)
    ServerArgs.add_cli_args(prefixing)
    parser.sglang_options = prefixing.options
    return dests


# sglang_router.launch_router settings the driver sets itself (the engines it routes over, where it listens)
ROUTER_PREFIX = "--router-"
ROUTER_OWNED = frozenset({"worker_urls", "host", "port"})


def extract_router_args(argv, known_options) -> tuple[list, dict]:
    """Split `--router-NAME [VALUE]` tokens out of argv -> (rest, {name: value}) for sglang_router's launcher."""
    return extract_generic(argv, known_options, prefix=ROUTER_PREFIX, owned=ROUTER_OWNED,
                           what="sglang-router", owner="the driver (the engines' URLs, a free port)")


def extract_generic(argv, known_options, prefix: str = PREFIX, owned=LAUNCHER_OWNED, what: str = "SGLang",
                    owner: str = "the engine launcher (from --hf-checkpoint, --rollout-num-gpus-per-engine and "
                                 "the placement plan)") -> tuple[list, dict]:
    """Split `--sglang-NAME [VALUE]` tokens the parser does not know out of argv -> (rest, {name: value})."""
    rest, found = [], {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        flag = tok.split("=", 1)[0]
        if tok.startswith(prefix) and flag not in known_options:
            name = flag[len(prefix):].replace("-", "_")
            if not name:
                raise ConfigError(f"'{tok}' names no {what} setting; write {prefix}NAME [VALUE]")
            if name in owned:
                raise ConfigError(f"{flag} is set by {owner}; remove it")
            if "=" in tok:
                found[name] = _coerce(tok.split("=", 1)[1])
            else:  # every value up to the next flag: one -> scalar, several -> list (--sglang-cuda-graph-bs 1 2 4)
                values = []
                while i + 1 < len(argv) and not _looks_like_flag(argv[i + 1]):
                    values.append(_coerce(argv[i + 1]))
                    i += 1
                found[name] = True if not values else values[0] if len(values) == 1 else values
        else:
            rest.append(tok)
        i += 1
    return rest, found


def _looks_like_flag(tok: str) -> bool:
    if not tok.startswith("-"):
        return False
    try:
        float(tok)  # negative numbers are values
        return False
    except ValueError:
        return True


def _coerce(text: str):
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def collect(args, parser, generated_fields, generic_values: dict) -> None:
    """Fill args.sglang_server_args (user-set passthrough values) and the sglang_<name> attributes."""
    from_file = _load_sglang_config(args, parser, generated_fields) if args.sglang_config else {}
    chosen = dict(from_file)
    if generated_fields:
        for name in generated_fields:
            value = getattr(args, "sglang_" + name)
            if value != parser.get_default("sglang_" + name):
                chosen[name] = value
    chosen.update(generic_values)
    for name, value in chosen.items():
        setattr(args, "sglang_" + name, value)
    args.sglang_server_args = chosen
    args.sglang_cli_options = {k: v for k, v in getattr(parser, "sglang_options", {}).items() if k in chosen}
    args.sglang_passthrough_mode = "generated" if generated_fields else "generic"


def _load_sglang_config(args, parser, generated_fields) -> dict:
    """A flat mapping of ServerArgs fields, or slime's engine-layout file (`sglang:` list, sglang_layout.py)."""
    path = args.sglang_config
    data = load_yaml_mapping("--sglang-config", path, "SGLang ServerArgs fields")
    _refuse_framework_config(path, data)
    if is_slime_layout(data):
        data = apply_slime_layout(args, parser, path, data)  # the layout set on args; its groups' overrides here
    out = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if isinstance(value, dict):  # no ServerArgs field is a mapping; a section means another kind of file
            raise ConfigError(f"--sglang-config {path}: '{key}' is a section (a mapping), but the file must map "
                              "SGLang ServerArgs fields to plain values (mem_fraction_static: 0.7)")
        if name in LAUNCHER_OWNED:
            raise ConfigError(f"--sglang-config {path}: '{key}' is set by the engine launcher; remove it")
        if generated_fields and name not in generated_fields:
            raise ConfigError(f"--sglang-config {path}: '{key}' is not an SGLang ServerArgs field"
                              f"{did_you_mean(name, generated_fields)}")
        out[name] = value
    return out


def _refuse_framework_config(path: str, data: dict) -> None:
    """An RLinf / ROLL training config passed here would become meaningless --sglang-cluster, ... settings."""
    from slime_like.config.frontends.top_keys import RLINF_TOP_KEYS, ROLL_TOP_KEYS

    for fmt, keys in (("RLinf", RLINF_TOP_KEYS), ("ROLL", ROLL_TOP_KEYS)):
        hits = [k for k in data if k in keys]
        if len(hits) >= 2:
            raise ConfigError(f"--sglang-config {path}: this is an {fmt} training config (top-level "
                              f"{', '.join(hits[:4])}), not SGLang engine settings; pass it as --config {path}")

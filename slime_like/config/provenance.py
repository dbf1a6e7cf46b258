"""What the run ran with, and where each value came from: RUN_DIR/config.yaml and the start-up lines.

Sources, most specific first: `YAML <file> megatron[i]` (a --megatron-config-path entry), `CLI` (named on the
command line), `config.json` (model flags filled from --hf-checkpoint), `derived` (validation's defaults, e.g.
--global-batch-size from the batch identity), `critic flag` (--critic-lr and friends).
`shared` / `roles` list only values that differ from the parser's defaults, plus every value a YAML entry sets (even
one equal to the default: the YAML still decided it). `all_values` then lists every flag's value, defaults
included, so the run can be reproduced after a default changes (secrets masked).
"""
from __future__ import annotations

import os
import shlex
import sys
import time

from slime_like import __version__
from slime_like.config.parser import defaults_of, group_of, shared_parser
from slime_like.config.role_overrides import ROLES, apply_role

CONFIG_FILE = "config.yaml"
SECRETS = ("engine_api_key", "wandb_key")  # written as <secret>: config.yaml is shared with results
# role-view values that apply_role derives from the critic-* flags
_CRITIC_FLAGS = {"lr": "--critic-lr", "lr_warmup_iters": "--critic-lr-warmup-iters", "save": "--critic-save",
                 "load": "--critic-load", "kl_coef": "(the critic never adds a KL term)"}


def cli_dests(parser, argv: list) -> list:
    """The dests of the flags named on the command line (`--flag value` and `--flag=value`)."""
    actions = parser._option_string_actions
    return sorted({actions[tok.split("=", 1)[0]].dest for tok in argv
                   if tok.startswith("--") and tok.split("=", 1)[0] in actions})


def _plain(value):
    """YAML-safe value: containers recursively, everything else as a number / bool / str / None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def _skip(dest: str) -> bool:
    from slime_like.config.dry_run import _INTERNAL

    return dest in _INTERNAL or dest.startswith("sglang_")


def shared_values(args, report) -> dict:
    """{dest: {"value", "source"}} of the shared namespace, non-default values only."""
    parser = shared_parser()
    defaults, groups = defaults_of(parser), group_of(parser)
    named = set(args.cli_dests)
    out = {}
    for dest, value in sorted(vars(args).items()):
        if _skip(dest) or (dest in defaults and defaults[dest] == value):
            continue
        if dest in named:
            source = "CLI"
        elif args.model_args_from_hf and groups.get(dest, "").startswith("model"):
            source = "config.json"
        else:
            source = "derived"
        out[dest] = {"value": "<secret>" if dest in SECRETS else _plain(value), "source": source}
    return out


def all_values(args) -> dict:
    """Every value of the shared namespace, defaults included (the parser's dests and derived ones), secrets masked."""
    return {dest: "<secret>" if dest in SECRETS and value else _plain(value)
            for dest, value in sorted(vars(args).items()) if not _skip(dest)}


def role_values(args, report) -> dict:
    """{role: {dest: {"value", "source"}}}: each role's values that differ from the shared ones or come from
    a YAML entry (shown even when equal to the default)."""
    out = {}
    overrides = args.megatron_role_overrides
    entries = args.megatron_role_entries
    for role in ROLES:
        if role == "critic" and not args.use_critic:
            continue
        view = apply_role(args, role)
        mine = {}
        for dest, value in sorted(vars(view).items()):
            if _skip(dest) or dest == "role":
                continue
            if dest in overrides.get(role, {}):
                source = f"YAML {args.megatron_config_path} megatron[{entries.get(role, '?')}]"
                if dest in args.cli_dests and getattr(args, dest, None) != value:
                    source += f", over the CLI's --{dest.replace('_', '-')} {getattr(args, dest)}"
            elif getattr(args, dest, None) != value:
                source = _CRITIC_FLAGS.get(dest, "derived") if role == "critic" else "derived"
            else:
                continue
            mine[dest] = {"value": _plain(value), "source": source}
        out[role] = mine
    return out


def start_lines(args, report) -> list:
    """The log's summary: each role's values that are not the shared ones, with their source."""
    lines = []
    for role, values in role_values(args, report).items():
        if values:
            items = ", ".join(f"{k}={v['value']} ({v['source']})" for k, v in values.items())
            lines.append(f"role {role}: {items}")
    return lines


def write_config(args, report, argv: list) -> str:
    """Append this start's resolved configuration to RUN_DIR/config.yaml as one YAML document.

    A resumed run (same --run-dir) adds a document after the earlier ones instead of replacing them."""
    import yaml

    os.makedirs(args.run_dir, exist_ok=True)
    path = os.path.join(args.run_dir, CONFIG_FILE)
    doc = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "slime_like_version": __version__,  # which build produced the run (CHANGELOG.md)
           "command": shlex.join([os.path.basename(sys.argv[0] or "train.py"), *argv]),
           "warnings": list(report.warnings),
           "shared": shared_values(args, report), "roles": role_values(args, report),
           "all_values": all_values(args)}
    resumed = os.path.exists(path) and os.path.getsize(path) > 0
    with open(path, "a") as f:
        f.write(("---\n# a later start in the same run directory (resume or re-run)\n" if resumed else "") +
                yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=120))
    return path

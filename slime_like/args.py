"""`parse_args()` -> one Namespace for the whole run; `role_args(args, role)` -> a per-role copy.

    args = parse_args()                     # CLI (+ --config, --sglang-config, --megatron-config-path), validated
    args, plan, report = parse_run()        # the same, plus the placement plan and the ConfigReport (warnings,
                                            # launch refusals, preflight notes, applied defaults, provenance)
    critic = role_args(args, "critic")      # a deep copy with the critic's overrides; `args` is untouched

Layers, lowest first: Megatron/slime defaults -> the CLI -> derived defaults (validation) -> per-role YAML
overrides (only inside `role_args`). A config error prints `<prog>: error: <message>` and exits with
status 2, never a traceback. Nothing here imports torch, ray or transformers.
"""
from __future__ import annotations

import os
import sys

from slime_like.config.custom_config import apply_custom_config
from slime_like.config.errors import ConfigError
from slime_like.config.frontends import expand as expand_config
from slime_like.config.frontends.apply import apply_translation
from slime_like.config.parser import parse_namespace
from slime_like.config.preflight import run_preflight
from slime_like.config.provenance import cli_dests
from slime_like.config.report import ConfigReport
from slime_like.config.role_overrides import ROLES, apply_role, load_role_overrides
from slime_like.config.validate import validate_args
from slime_like.utils.slime_names import install as install_slime_names
from slime_like.plan import build_plan

__all__ = ["ConfigError", "ConfigReport", "ROLES", "make_args", "parse_args", "parse_run", "role_args"]


def parse_args(argv=None, *, exit_on_error: bool = True, prog: str | None = None, preflight: bool = False):
    """Parse and validate `argv` (default sys.argv[1:]).

    exit_on_error=False raises ConfigError instead of exiting (library use, tests). preflight=True (what
    train.py's start and --dry-run use) also checks the files, schedules and custom functions the run will
    use (slime_like/config/preflight.py) and reports every problem found in one message.
    """
    return parse_run(argv, exit_on_error=exit_on_error, prog=prog, preflight=preflight)[0]


def parse_run(argv=None, *, exit_on_error: bool = True, prog: str | None = None, preflight: bool = False):
    """`parse_args`, the run's placement plan and what the configuration layer found, computed once:
    (args, plan, report), `report` a ConfigReport. What the entry scripts use."""
    argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]
    prog = prog or os.path.basename(sys.argv[0] or "train.py") or "train.py"
    translation, problem = None, None
    report = ConfigReport()
    try:
        argv, translation = expand_config(argv)  # --config RLinf/ROLL YAML -> our flags, spliced in place
        args, parser = parse_namespace(argv, prog=prog)
        args.cli_dests = cli_dests(parser, argv)  # what the user named (provenance, explicit-vs-default choices)
        load_role_overrides(args, report, parser)
        apply_custom_config(args, report, parser)   # slime's YAML of extra attributes, before validation sees the flags
        apply_translation(args, report, parser, translation)
        before = dict(vars(args))
        validate_args(args, report, raise_path_problems=not preflight)
        report.record_applied_defaults(before, args)
        if preflight:
            install_slime_names()   # the preflight imports the run's functions; slime's names as the actors see them
            report.notes = run_preflight(args)
        plan = build_plan(args)  # the layout must be placeable; raises ConfigError otherwise
    except ConfigError as e:
        problem = str(e)
    if translation is not None:  # the file's own problems, then later ones, each naming the file's key
        problem = translation.report(problem)
    if problem is not None:
        if not exit_on_error:
            raise ConfigError(problem)
        print(f"{prog}: error: {problem}", file=sys.stderr)
        sys.exit(2)
    return args, plan, report


def make_args(*argv, validate: bool = False, **overrides):
    """A Namespace from the real parser for tools and tests: `argv` are flags as a user types them.

    validate=False gives the parser's defaults plus `argv` (every flag's dest present, no run-level checks: what
    a unit of the rollout or a conversion tool needs); validate=True goes through `parse_args` (validation, the
    derived defaults, the plan). `overrides` set attributes afterwards and must name a flag's dest, so a
    renamed flag fails here instead of leaving a stale attribute nobody reads.
    """
    argv = [str(a) for a in argv]
    if validate:
        args = parse_args(argv, exit_on_error=False)
    else:
        args, _ = parse_namespace(argv)
    for name, value in overrides.items():
        if not hasattr(args, name):
            raise AttributeError(f"make_args: {name!r} is no flag's dest; pass the flag in argv or fix the name")
        setattr(args, name, value)
    return args


def role_args(args, role: str):
    """A deep copy of `args` with `role`'s YAML overrides (and the critic-* flags for the critic) applied.

    The shared namespace is never mutated; calling this twice gives equal, independent copies.
    """
    return apply_role(args, role)

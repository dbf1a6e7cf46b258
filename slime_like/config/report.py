"""What the configuration layer found while it parsed and validated a run, kept beside the Namespace (never on it).

    args, plan, report = parse_run(argv)     # slime_like/args.py
    report.warnings          # no-effect and derived-value warnings (each printed once on stderr when found)
    report.launch_refusals   # settings this machine cannot run: --dry-run lists them, the launch stops on them
    report.notes             # the preflight's notes (e.g. a big data file checked in part)
    report.applied_defaults  # dest -> value that validation derived or changed (not what the user typed)
    report.translation       # the --config RLinf / ROLL translation (its equivalent command line), or None

The Namespace holds the run's settings and run facts: what the trainers, engines and loops read (including
`args.cli_dests`, the flags the user named: the Megatron kernel choice and the precision default tell an explicit
request from a default by it). The report holds what only the dry run and the launcher print (config/dry_run.py,
config/provenance.py, ray/entry.py).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

from slime_like.config.errors import ConfigError

_UNSET = object()


@dataclass
class ConfigReport:
    warnings: list = field(default_factory=list)
    launch_refusals: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    path_problems: list = field(default_factory=list)
    applied_defaults: dict = field(default_factory=dict)
    translation: object = None

    def warn(self, message: str) -> None:
        """Print a start-up warning to stderr now and keep it (the dry run counts them, config.yaml lists them)."""
        print(f"WARNING: {message}", file=sys.stderr)
        self.warnings.append(message)

    def refuse(self, message: str) -> None:
        """A setting valid on GPUs that slime_like will not run: planned by --dry-run, refused at launch."""
        self.launch_refusals.append(message)

    def path_problem(self, message: str) -> None:
        """A missing input path: independent of every other rule, reported together at the end of validation
        (or by the preflight, which checks the same paths more deeply)."""
        self.path_problems.append(message)

    def raise_path_problems(self) -> None:
        problems = self.path_problems
        if problems:
            raise ConfigError(problems[0] if len(problems) == 1 else
                              f"{len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems))

    def refuse_at_launch(self) -> None:
        """The launch (not --dry-run) stops here, before Ray or torch, when the run needs what slime_like lacks."""
        if self.launch_refusals:
            raise ConfigError("this run cannot start: " + "; ".join(self.launch_refusals))

    def record_applied_defaults(self, before: dict, args) -> None:
        """dest -> value for every attribute validation set or changed, compared with `before` (vars(args))."""
        self.applied_defaults = {k: v for k, v in vars(args).items() if before.get(k, _UNSET) is _UNSET
                                 or not _same(before[k], v)}


def _same(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # an object whose == is not a bool (none here today): treat as changed
        return False

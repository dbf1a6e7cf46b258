"""Write an RLinf or ROLL YAML file as a bash recipe of slime_like flags.

    python -m slime_like.tools.config_to_flags FILE.yaml [algorithm.group_size=8 ...] [--config-format rlinf|roll]
        [-o run.sh]

The recipe holds the flags the file translates to (exactly what `train.py --config FILE` runs) and, when the
file sets per-role values (a ROLL critic), the --megatron-config-path YAML next to it. Checks the result with
the real parser first, so a file that `train.py` would refuse is refused here with the same one-line error.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys

from slime_like.config.errors import ConfigError


def recipe(argv: list) -> tuple[str, str | None]:
    """-> (bash text, role overlay YAML text or None)."""
    from slime_like.config.frontends import command_line, expand

    _, t = expand(argv)
    lines = ["#!/bin/bash", f"# Translated from {t.fmt} file {t.path}" +
             (f" with {' '.join(t.overrides)}" if t.overrides else "") + " by slime_like.tools.config_to_flags.",
             "# Keys with no effect here are listed by `train.py --dry-run` with the reason.", "set -euo pipefail", "",
             "CONFIG_ARGS=("]
    lines += [f"  {line}" for line in command_line(t)]
    overlay = None
    if t.roles:
        import yaml

        overlay = yaml.safe_dump({"megatron": [{"role": r, "overrides": v} for r, v in t.roles.items()]})
        lines.append('  --megatron-config-path "$(dirname "$0")/roles.yaml"')
    lines += [")", "", 'python train.py "${CONFIG_ARGS[@]}" "$@"', ""]
    return "\n".join(lines), overlay


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m slime_like.tools.config_to_flags", description=__doc__.split("\n")[0])
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algorithm.group_size=8")
    p.add_argument("--config-format", default="auto", choices=["auto", "rlinf", "roll"])
    p.add_argument("-o", "--output", default=None, help="write the recipe here (default: stdout)")
    ns = p.parse_args(argv)
    args = ["--config", ns.config, "--config-format", ns.config_format, *ns.overrides]
    try:
        from slime_like.args import parse_args

        parse_args(args + ["--dry-run"], exit_on_error=False, prog="config_to_flags")  # same checks as train.py
        text, overlay = recipe(args)
    except ConfigError as e:
        print(f"config_to_flags: error: {e}", file=sys.stderr)
        return 2
    if ns.output:
        with open(ns.output, "w") as f:
            f.write(text)
        os.chmod(ns.output, 0o755)
        if overlay:
            with open(os.path.join(os.path.dirname(os.path.abspath(ns.output)), "roles.yaml"), "w") as f:
                f.write(overlay)
        print(f"wrote {shlex.quote(ns.output)}", file=sys.stderr)
    else:
        print(text)
        if overlay:
            print("# roles.yaml:\n" + "\n".join("# " + line for line in overlay.splitlines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

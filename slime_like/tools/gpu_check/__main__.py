"""`python -m slime_like.tools.gpu_check [--cpu-smoke] [--out DIR] [--only a,b] [--total-budget S]`; the package
docstring lists the checks. Exit status 0 when no check failed (passed or skipped with a reason), 1 otherwise."""
from __future__ import annotations

import argparse
import sys


def parse(argv=None):
    p = argparse.ArgumentParser(prog="gpu-check", description=__doc__)
    p.add_argument("--cpu-smoke", action="store_true", help="the same checks on CPU: 2-layer model, gloo")
    p.add_argument("--out", default="gpu_check_out", help="where gpu_summary.json goes (default ./gpu_check_out)")
    p.add_argument("--work", default=None, help="scratch dir for checkpoints and exports (default OUT/work)")
    p.add_argument("--only", default=None, help="comma-separated checks to run (their needs must have run before)")
    p.add_argument("--total-budget", type=float, default=None,
                   help="seconds for all checks (default 400 on the GPU, 900 for --cpu-smoke)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-budget", type=float, default=0.0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse(argv)
    if a.child:
        from slime_like.tools.gpu_check.child import main as child_main

        return child_main(a.child, a.cpu_smoke, a.work, a.result, a.child_budget)
    from slime_like.tools.gpu_check.runner import main as run

    return run(a)


if __name__ == "__main__":
    sys.exit(main())

"""One-step-off pipelined RL loop: generation of rollout N+1 overlaps training on N. For now: parse, validate, plan."""
import sys

from slime_like.args import parse_args


def main(argv=None):
    args = parse_args(argv)
    if args.dry_run:
        from slime_like.plan import print_dry_run

        print_dry_run(args)
        return 0
    raise SystemExit("train.py: the training loop is not wired yet; use --dry-run")


if __name__ == "__main__":
    sys.exit(main())

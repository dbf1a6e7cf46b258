"""What train.py and train_async.py share around their loops: parse and validate, --dry-run, start the
run (placement, trainers, engines), push the initial weights, the baseline eval, and a clean shutdown on
success, error, Ctrl-C or SIGTERM. Ray and torch are imported only after --dry-run has returned."""
from __future__ import annotations

import sys
import time

from slime_like.args import parse_run
from slime_like.config.install_extras import extras_missing_for_a_run
from slime_like.config.slime_paths import is_fully_async
from slime_like.ray.signals import handle_signals, stopped_by

# A start with no flag at all: what every run needs, in one message (not the first missing flag's complaint)
WHAT_A_RUN_NEEDS = """{prog}: a run needs at least
  --hf-checkpoint DIR         the model to train: a Hugging Face directory (config.json, tokenizer, weights)
  --prompt-data FILE          prompts (JSONL or Parquet) with --input-key / --label-key naming their fields
  --rollout-batch-size N      prompts per rollout, and --num-rollout N (or --num-epoch N)
  a reward                    --rm-type NAME (e.g. math, deepscaler) or --custom-rm-path module.function
  GPUs                        --actor-num-gpus-per-node N with --colocate (engines share the GPUs) or
                              --rollout-num-gpus N (engines on GPUs of their own)
Add --dry-run to check a command and see its plan without starting anything; --help lists every flag.
A complete example on a CPU: slime-like demo (scripts/run-demo.sh in a checkout)."""


def launch(loop, argv=None, *, allow_colocate: bool = True, allow_fully_async: bool = False,
           prog: str | None = None) -> int:
    """Run `loop(args, run, logger)` for the command line `argv`; returns the process exit code: 143 / 130 after
    SIGTERM / SIGINT in any phase, once everything the run started has been stopped (ray/signals.py)."""
    with handle_signals():
        try:
            return _launch(loop, argv, allow_colocate, allow_fully_async, prog)
        except KeyboardInterrupt as e:
            stop = stopped_by(e)
            if stop is None:
                raise
            print(f"[slime_like] stopped by {stop.name}: everything the run started is shut down; exit status "
                  f"{stop.exit_code}", file=sys.stderr)
            return stop.exit_code


def _launch(loop, argv, allow_colocate: bool, allow_fully_async: bool, prog: str | None) -> int:
    started = time.monotonic()
    if not [a for a in _argv(argv) if a != "--dry-run"]:
        print(WHAT_A_RUN_NEEDS.format(prog=prog or "train.py"), file=sys.stderr)
        return 2
    args, plan, report = parse_run(argv, prog=prog, preflight=True)
    if args.colocate and not allow_colocate:
        what = ("the placement puts the engines on the actor's GPUs (colocated)" if args.placement_map
                else "--colocate is not supported")
        print(f"{prog or 'train'}: {what}: generation of the next rollout runs while the trainer trains, so they "
              "need separate GPUs. Give the engines GPUs of their own, or use train.py.", file=sys.stderr)
        return 2
    if is_fully_async(args) and not allow_fully_async:
        print(f"{prog or 'train'}: --rollout-function-path {args.rollout_function_path}: the fully async rollout "
              "generates while the trainer trains, so it needs train_async.py's loop (as in slime's "
              "examples/fully_async): run train_async.py with the same flags.", file=sys.stderr)
        return 2
    from slime_like.plan import print_dry_run

    if args.dry_run:
        print_dry_run(args, report, plan)
        return 0
    for note in report.notes:
        print(f"NOTE: {note}", file=sys.stderr)
    if _refused_at_launch(args, report, prog):
        return 2
    from slime_like.config.provenance import start_lines, write_config

    print(f"[slime_like] resolved configuration: {write_config(args, report, _argv(argv))}", file=sys.stderr)
    for line in start_lines(args, report):
        print(f"[slime_like] {line}", file=sys.stderr)
    import ray

    from slime_like.ray.cluster import RayClusterError
    from slime_like.ray.failures import EngineLostDuringPush, report_actor_failure
    from slime_like.ray.run_summary import summary_block
    from slime_like.utils.console import unavailable_on_this_machine

    for line in unavailable_on_this_machine(args):
        print(f"[slime_like] {line}", file=sys.stderr)
    try:
        # a signal on the way: its exception leaves through _run's and Run.start's clean-up, then launch's handler
        first_rollout = _run(loop, args, plan)
    except (RayClusterError, EngineLostDuringPush) as e:  # no cluster / GPUs for the plan, a dead engine: one line
        print(f"{prog or 'train.py'}: error: {e}", file=sys.stderr)
        return 1
    except ray.exceptions.RayError as e:  # raised inside an actor: the root cause, once, and where the rest is
        print(report_actor_failure(e, args.run_dir, prog or "train.py"), file=sys.stderr)
        return 1
    print(summary_block(args, first_rollout, time.monotonic() - started), flush=True)
    return 0


def _refused_at_launch(args, report, prog: str | None) -> bool:
    """The pre-Ray launch checks, after --dry-run's plan and before Ray or torch start; True (each reason printed)
    when this run cannot start here."""
    from slime_like.config.errors import ConfigError

    from slime_like.backends.megatron.kernels import launch_check

    try:
        report.refuse_at_launch()  # what slime_like cannot run
    except ConfigError as e:
        print(f"{prog or 'train'}: error: {e}", file=sys.stderr)
        return True
    # Both checks are torch-free and independent: one start reports both (what this GPU machine's kernels allow,
    # and the extras a run needs beyond the light core that `--dry-run` runs on).
    kernel_errors, kernel_note = launch_check(args)
    install = extras_missing_for_a_run(args.train_backend)
    if kernel_note and not kernel_errors:
        print(f"[slime_like] {kernel_note}", file=sys.stderr)
    if kernel_errors:
        print(f"{prog or 'train'}: error: this run cannot start: " + "; ".join(kernel_errors), file=sys.stderr)
    if install:
        print(f"{prog or 'train'}: error: {install}", file=sys.stderr)
    return bool(kernel_errors or install)


def _run(loop, args, plan) -> int:
    """Start the run, train with `loop`, stop everything; returns the first rollout id it trained."""
    from slime_like.ray.run import Run
    from slime_like.utils.metrics import MetricsLogger

    run = Run.start(args, plan)
    logger = MetricsLogger(args)
    interrupted = False
    try:
        check = args.check_weight_update_equal and run.engines.urls and run.actor is not None
        if check:  # slime: the engines keep a copy of what they loaded, then forget it (noise) before the push
            run.check_engine_weights("snapshot")
            run.check_engine_weights("reset_tensors")
        run.update_weights()  # engines start from exactly the weights the trainer holds (resume included)
        if check:  # the push must have rewritten every tensor back to exactly the snapshot
            run.check_engine_weights("compare")
            print("[slime_like] --check-weight-update-equal: every engine holds exactly the trainer's weights",
                  file=sys.stderr)
        if args.eval_interval and run.start_rollout_id == 0 and not args.skip_eval_before_train:
            logger.log(-1, run.evaluate(0))  # the baseline, logged as rollout -1: before any RL update
        loop(args, run, logger)
        return run.start_rollout_id
    except KeyboardInterrupt:  # a signal (ray/signals.py): stop without waiting for the work in flight
        interrupted = True
        raise
    finally:
        logger.close()
        run.shutdown(interrupted=interrupted)


def _argv(argv) -> list:
    return [str(a) for a in (sys.argv[1:] if argv is None else argv)]

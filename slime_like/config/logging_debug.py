"""Logging (console / metrics.jsonl / wandb / tensorboard), the run directory, debug and dry-run flags, slime's CI
checks and profiling flags; the debug checks and the run directory's derived defaults."""
from __future__ import annotations

import os
import time

from slime_like.config.errors import ConfigError
from slime_like.config.types import Float, Int


def add_logging_group(parser):
    g = parser.add_argument_group("logging (wandb / tensorboard)", "Metrics, run directory, wandb, tensorboard")
    a = g.add_argument
    a("--run-dir", default=None,
      help="(slime_like) Where metrics.jsonl, plots and logs go; default runs/<UTC timestamp>.")
    a("--log-interval", type=Int(1), default=100, help="Console log every N optimizer steps (Megatron default 100).")
    a("--use-wandb", action="store_true", help="Log to Weights & Biases.")
    a("--wandb-project", default=None, help="wandb project.")
    a("--wandb-group", default=None, help="wandb group.")
    a("--wandb-team", default=None, help="wandb entity.")
    a("--wandb-mode", default=None, choices=["online", "offline", "disabled"], help="wandb mode (overrides WANDB_MODE).")
    a("--wandb-dir", default=None, help="wandb files directory; default <run-dir>/wandb.")
    a("--wandb-key", default=None, help="wandb API key (prefer the WANDB_API_KEY environment variable).")
    a("--wandb-host", default=None, help="wandb server URL.")
    a("--wandb-run-id", default=None, help="Resume this wandb run.")
    a("--disable-wandb-random-suffix", action="store_false", dest="wandb_random_suffix",
      help="No random suffix on the wandb run name.")
    a("--wandb-always-use-train-step", action="store_true", help="Use the train step as wandb's x-axis everywhere.")
    a("--use-tensorboard", action="store_true", help="Log to tensorboard.")
    a("--tensorboard-dir", default=None, help="tensorboard directory; default <run-dir>/tensorboard.")
    a("--tb-project-name", default=None, help="tensorboard project name (slime).")
    a("--tb-experiment-name", default=None, help="tensorboard experiment name (slime).")
    a("--log-multi-turn", action="store_true", help="Log multi-turn rollout statistics.")
    a("--log-passrate", action="store_true", help="Log pass@n of the rollout groups.")
    a("--log-reward-category", default=None, help="Log counts of this key of dict rewards.")
    a("--log-correct-samples", action="store_true", help="Log correct samples.")
    a("--disable-tqdm", action="store_true",
      help="(slime_like) No progress bar during generation (also off when stderr is not a terminal).")
    return parser


def add_debug_group(parser):
    g = parser.add_argument_group("debug", "Dry run and debugging")
    a = g.add_argument
    a("--config", default=None, metavar="FILE.yaml",
      help="(slime_like) An RLinf or ROLL YAML config, translated into these flags where it stands (flags after it "
           "win); dotted overrides like algorithm.group_size=8 may follow. See docs/from-rlinf.md, docs/from-roll.md.")
    a("--config-format", default="auto", choices=["auto", "rlinf", "roll"],
      help="(slime_like) Format of --config; auto recognises it from its top-level keys.")
    a("--dry-run", action="store_true",
      help="(slime_like) Validate, print the resolved config, batch arithmetic and placement plan, then exit.")
    a("--debug-rollout-only", action="store_true", help="Only generate (no trainer).")
    a("--debug-train-only", action="store_true", help="Only train (no engines; use with --load-debug-rollout-data).")
    a("--save-debug-rollout-data", default=None, help="Save each rollout to this path ('{rollout_id}' substituted).")
    a("--load-debug-rollout-data", default=None, help="Train on saved rollouts instead of generating (implies "
      "--debug-train-only).")
    a("--load-debug-rollout-data-subsample", type=Float(0, 1, lo_open=True), default=None,
      help="Use this fraction of the saved rollout.")
    a("--save-debug-train-data", default=None, help="Save each training batch to this path.")
    a("--dump-details", default=None, help="Save rollout and train data under this directory.")
    a("--check-weight-update-equal", action="store_true", help="Verify engine weights equal the trainer's after sync.")
    a("--record-memory-history", action="store_true", help="Record CUDA memory history.")
    a("--memory-snapshot-dir", default=".", help="Where memory snapshots go.")
    return parser


def add_ci_flags(g):
    """(slime extras group) CI checks."""
    a = g.add_argument
    a("--ci-test", action="store_true", help="Assert slime's CI invariants during the run.")
    a("--ci-disable-kl-checker", action="store_true", help="Skip the CI KL check.")
    a("--ci-save-grad-norm", default=None, help="Save grad norms for a later CI comparison.")
    a("--ci-load-grad-norm", default=None, help="Compare grad norms with a saved CI run.")
    a("--ci-train-rollout-logprob-abs-diff-threshold", type=Float(0), default=0.1,
      help="Bound on |train - rollout log-prob| under --ci-test.")


def add_profiling_flags(g):
    """(slime extras group) memory recording and profiling."""
    a = g.add_argument
    a("--memory-recorder", default="torch", choices=["torch", "memray"], help="Memory recorder.")
    a("--memory-snapshot-num-steps", type=Int(1), default=None, help="Steps recorded per memory snapshot.")
    a("--profile-target", nargs="+", default=["train_overall"],
      choices=["train_overall", "train_actor", "train_log_probs"], help="What the profiler records.")


def check_debug(args):
    if args.load_debug_rollout_data is not None:
        args.debug_train_only = True
    if args.debug_rollout_only and args.debug_train_only:
        raise ConfigError("--debug-rollout-only and --debug-train-only (or --load-debug-rollout-data) exclude each other")
    if args.dump_details is not None:
        # slime's layout; JSON files (debug dumps are never pickles here), hence the .json names
        args.save_debug_rollout_data = f"{args.dump_details}/rollout_data/{{rollout_id}}.json"
        args.save_debug_train_data = f"{args.dump_details}/train_data/{{rollout_id}}.json"


def derive_run_dirs(args):
    if args.run_dir is None:
        args.run_dir = os.path.join("runs", time.strftime("%Y%m%d-%H%M%S", time.gmtime()))
    if args.use_wandb and args.wandb_dir is None:
        args.wandb_dir = os.path.join(args.run_dir, "wandb")
    if args.use_tensorboard and args.tensorboard_dir is None:
        args.tensorboard_dir = os.path.join(args.run_dir, "tensorboard")

"""Logging (console / metrics.jsonl / wandb / tensorboard), debug flags, the SGLang flags slime owns, and the
slime flags we recognise but do not implement (refused at launch, not "unknown flag").

The other `--sglang-*` flags are passed through to the engine: see sglang_passthrough.py.
"""
from __future__ import annotations

import argparse

# slime features slime_like does not implement: recognised, so --dry-run plans the run and the launch refuses it
# naming the feature (never silently ignored).
UNSUPPORTED = {
    "--use-routing-replay": "MoE routing replay", "--use-rollout-routing-replay": "MoE rollout routing replay",
    "--megatron-to-hf-mode": "Megatron-Bridge weight conversion", "--use-slime-router": "slime's own router",
    "--prefill-num-servers": "prefill/decode disaggregation", "--rollout-data-transport": "straw / NIXL transport",
    "--release-train": "releasing trainer actors between steps", "--update-weight-mode": "delta weight sync",
    "--custom-config-path": "free-form YAML attributes",
    "--only-train-params-name-list": "partial-parameter training", "--freeze-params-name-list": "parameter freezing",
    "--pg-loss-type": "REINFORCE score centering", "--use-score-centering": "REINFORCE score centering",
    "--use-opsm": "off-policy sequence masking", "--allgather-cp": "all-gather context parallelism",
    "--flush-cache-interval": "PipelineRL-style in-flight weight updates",
}


class _Unsupported(argparse.Action):
    """Keeps the value: a recipe that passes one of these still parses (and --dry-run prints its plan); the run is
    refused at launch with the feature's name (config/support.py, launch_refusals)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values if values else True)


def add_unsupported_group(parser):
    g = parser.add_argument_group("unsupported slime flags")
    for flag in UNSUPPORTED:
        g.add_argument(flag, action=_Unsupported, nargs="*", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def add_sglang_group(parser):
    g = parser.add_argument_group(
        "SGLang", "Rollout engine settings. Any other --sglang-NAME [VALUE] is passed to the engine as --NAME VALUE.")
    a = g.add_argument
    a("--sglang-server-concurrency", type=int, default=512, help="Concurrent requests the rollout client sends per engine.")
    a("--sglang-router-ip", default=None, help="Use an existing sglang-router at this IP instead of starting one.")
    a("--sglang-router-port", type=int, default=None, help="Port of the existing sglang-router.")
    a("--sglang-router-request-timeout-secs", type=int, default=14400, help="Router request timeout (seconds).")
    a("--sglang-config", default=None,
      help="(slime_like) YAML/JSON mapping of SGLang ServerArgs fields to values; --sglang-* flags on the CLI win.")
    return parser


def add_vllm_group(parser):
    g = parser.add_argument_group(
        "vLLM", "--rollout-engine vllm settings. Any vLLM server argument --NAME [VALUE] is passed as "
                "--vllm-NAME [VALUE] (checked against vLLM's own parser when its environment is built).")
    g.add_argument("--vllm-config", default=None,
                   help="(slime_like) YAML/JSON mapping of vLLM server arguments to values; --vllm-* flags on the "
                        "CLI win.")
    return parser


def add_logging_group(parser):
    g = parser.add_argument_group("logging (wandb / tensorboard)", "Metrics, run directory, wandb, tensorboard")
    a = g.add_argument
    a("--run-dir", default=None,
      help="(slime_like) Where metrics.jsonl, plots and logs go; default runs/<UTC timestamp>.")
    a("--log-interval", type=int, default=100, help="Console log every N optimizer steps (Megatron default 100).")
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
    a("--load-debug-rollout-data-subsample", type=float, default=None, help="Use this fraction of the saved rollout.")
    a("--save-debug-train-data", default=None, help="Save each training batch to this path.")
    a("--dump-details", default=None, help="Save rollout and train data under this directory.")
    a("--check-weight-update-equal", action="store_true", help="Verify engine weights equal the trainer's after sync.")
    a("--record-memory-history", action="store_true", help="Record CUDA memory history.")
    a("--memory-snapshot-dir", default=".", help="Where memory snapshots go.")
    return parser

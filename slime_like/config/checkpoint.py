"""Checkpoints: what the run loads (--hf-checkpoint, --ref-load, --load) and where it saves; their checks.

The deeper file checks (a Megatron tracker file, the HF directory's tokenizer and weights) run in the preflight
(preflight_files.py); the backend-specific ones (torch_dist vs the FSDP trainer's DCP) in trainer_fsdp.py.
"""
from __future__ import annotations

import json
import os

from slime_like.config.errors import ConfigError
from slime_like.config.types import Int


def add_checkpoint_group(parser):
    g = parser.add_argument_group("checkpoint", "Checkpoint loading and saving")
    a = g.add_argument
    a("--hf-checkpoint", default=None,
      help="HF checkpoint dir: tokenizer, config.json (checked against the model flags) and engine weights.")
    a("--ref-load", default=None, help="Reference model checkpoint; also the initial weights when --load is empty.")
    a("--ref-ckpt-step", type=Int(0), default=None, help="Checkpoint step of --ref-load.")
    a("--load", default=None, help="Actor checkpoint to resume from; falls back to --ref-load.")
    a("--save", default=None, help="Directory for actor checkpoints.")
    a("--save-interval", type=Int(1), default=None, help="Save every N rollouts (needs --save).")
    a("--no-save-optim", action="store_true", default=False, help="Do not save optimizer state.")
    a("--no-save-rng", action="store_true", default=None, help="Do not save RNG state.")
    a("--no-load-optim", action="store_true", default=None, help="Do not load optimizer state.")
    a("--no-load-rng", action="store_true", default=None, help="Do not load RNG state.")
    a("--finetune", action="store_true", help="Load weights only; reset iteration, optimizer and RNG.")
    a("--ckpt-format", default="torch_dist", choices=["torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"],
      help="Megatron checkpoint format.")
    a("--ckpt-step", type=Int(), default=None,  # >= 0: checked below with "must be an iteration"
      help="Resume from this iteration of --load (every role) instead of the latest complete one; refused if its "
           "files do not match their record.")
    a("--async-save", action="store_true", help="Save checkpoints asynchronously.")
    a("--auto-detect-ckpt-format", action="store_true", help="Detect the checkpoint format when loading.")
    a("--save-hf", default=None, help="Also save HF-format weights to this path ('{rollout_id}' is substituted).")
    a("--critic-load", default=None, help="Critic checkpoint to load (slime); default = --load / --ref-load.")
    a("--critic-save", default=None, help="Directory for critic checkpoints (slime); default = <--save>_critic.")
    return parser


def check_checkpoints(args, report):
    if args.save_interval is not None:
        if not args.save:
            raise ConfigError(f"--save-interval {args.save_interval} needs --save DIR (where checkpoints go)")
        if args.save_interval < 1:
            raise ConfigError(f"--save-interval {args.save_interval}: must be >= 1")
    if args.hf_checkpoint and not args.debug_train_only and not os.path.isdir(args.hf_checkpoint):
        what = "is a file, not a directory" if os.path.isfile(args.hf_checkpoint) else "no such directory"
        report.path_problem(f"--hf-checkpoint {args.hf_checkpoint}: {what} (it provides the tokenizer, "
                             "config.json and the engines' initial weights)")
    if not args.hf_checkpoint:
        raise ConfigError("--hf-checkpoint DIR is required (tokenizer, config.json, engine weights)")
    _quantized_checkpoint(args, report)
    if args.ckpt_step is not None:
        if args.ckpt_step < 0:
            raise ConfigError(f"--ckpt-step {args.ckpt_step}: must be an iteration number >= 0")
        if not args.load:
            raise ConfigError(f"--ckpt-step {args.ckpt_step} picks an iteration of --load; give --load DIR")


def raw_hf_config(path) -> dict | None:
    """config.json of an HF directory as a dict; None when absent or unreadable (the checkpoint checks say so)."""
    file = os.path.join(path, "config.json") if path else None
    if not file or not os.path.isfile(file):
        return None
    try:
        with open(file) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return None  # unreadable: the checkpoint checks say so
    return cfg if isinstance(cfg, dict) else None


def _quantized_checkpoint(args, report) -> None:
    """An FP8 / INT4 --hf-checkpoint (config.json's quantization_config): slime trains in BF16 and re-quantizes the
    weights it pushes into the layout the checkpoint declares (its BF16-train / FP8-rollout recipe); slime_like
    pushes unquantized weights, which an engine started from this checkpoint would load into its quantized
    layers wrongly. A launch refusal until quantize-on-push exists (the dry run still plans the run)."""
    import json

    path = os.path.join(args.hf_checkpoint, "config.json")
    try:
        with open(path) as f:
            quant = json.load(f).get("quantization_config")
    except (OSError, ValueError, AttributeError):
        return  # missing or unreadable: the preflight / model checks say so
    if not quant:
        return
    shown = ", ".join(f"{k}: {quant[k]}" for k in ("quant_method", "fmt", "bits", "weight_block_size")
                      if isinstance(quant, dict) and k in quant) or str(quant)[:80]
    report.refuse(f"--hf-checkpoint {args.hf_checkpoint} is a quantized checkpoint (config.json quantization_config: "
                  f"{shown}): slime trains in BF16 and re-quantizes each weight push into that layout; slime_like "
                  "pushes unquantized weights, which the engines' quantized layers would load wrongly, and its "
                  "trainer does not dequantize the checkpoint. Quantize-on-push is not built: use the BF16 "
                  "checkpoint the quantized one was made from as --hf-checkpoint")


def is_megatron_checkpoint(path) -> bool:
    """A torch_dist directory: Megatron's iteration marker and a `common.pt` in the iteration it names (the
    FSDP trainer's DCP checkpoints use the same marker but have no common.pt)."""
    tracker = os.path.join(path, "latest_checkpointed_iteration.txt")
    if not os.path.isfile(tracker):
        return os.path.isfile(os.path.join(path, "common.pt"))  # an iter_* directory passed directly
    text = open(tracker).read().strip()
    if text == "release":  # Megatron-LM's weights-only checkpoint lives in release/
        return os.path.isfile(os.path.join(path, "release", "common.pt"))
    return text.isdigit() and os.path.isfile(os.path.join(path, f"iter_{int(text):07d}", "common.pt"))


def is_fsdp_checkpoint(path) -> bool:
    """A checkpoint root written by the FSDP trainer: its published iteration holds fsdp_meta.json."""
    tracker = os.path.join(path, "latest_checkpointed_iteration.txt")
    if not os.path.isfile(tracker):
        return False
    text = open(tracker).read().strip()
    return text.isdigit() and os.path.isfile(os.path.join(path, f"iter_{int(text):07d}", "fsdp_meta.json"))

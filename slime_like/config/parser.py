"""The layered argument parser: real argparse groups, no abbreviations, did-you-mean for typos.

Parsing order (`parse_namespace`):
  1. build the parser (flag groups; SGLang ServerArgs flags when sglang is importable),
  2. pull generic `--sglang-*` tokens out of argv (CPU machines),
  3. argparse; any leftover flag is an error naming the closest real flag,
  4. collect the SGLang passthrough values.
Role overlays and validation run afterwards (see slime_like/args.py).
"""
from __future__ import annotations

import argparse
import functools

from slime_like.config import (algorithm, checkpoint, cluster, custom_config, data, distillation, engines,
                               logging_debug, model, optimizer, rewards, rollout, sglang_passthrough, trainer_fsdp,
                               trainer_megatron, unimplemented, vllm_passthrough)
from slime_like.config.errors import ConfigError, did_you_mean
from slime_like.registry import ADVANTAGE_ESTIMATORS, ROLLOUT_ENGINES, TRAINER_BACKENDS, load
from slime_like.registry import version as registry_version

# slime's flags outside its core loop keep their own --help section (as slime's recipes and docs know them);
# each concern module adds its own flags to it, in this order.
SLIME_EXTRAS = "slime extras"
GROUP_ORDER = ["cluster", "model", "model (MoE)", "checkpoint", "rollout", "data", "eval", "perf/parallelism",
               "algorithm (GRPO/PPO)", "optimizer & LR schedule", "fsdp / LoRA", "SGLang", "vLLM", "reward",
               "logging (wandb / tensorboard)", "debug", SLIME_EXTRAS]


class SlimeArgumentParser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of printing a 300-flag usage line and exiting."""

    def error(self, message):
        raise ConfigError(message)


def build_parser(prog: str = "train.py", generated_sglang: bool = False, vllm_spec: list | None = None):
    """-> (parser, generated ServerArgs field names or empty set); with `vllm_spec`, also the --vllm-* flags
    generated from it (their {dest: vLLM option} in `parser.vllm_options`)."""
    p = SlimeArgumentParser(
        prog=prog, allow_abbrev=False, usage="%(prog)s [FLAGS ...]   (python %(prog)s --help lists them by group)",
        description="RL post-training with Megatron-core trainers and SGLang / CPU rollout engines. "
                    "Flags follow Megatron-LM and slime; see docs/configuration.md.")
    cluster.add_cluster_group(p)
    model.add_model_group(p)
    checkpoint.add_checkpoint_group(p)
    engines.add_engine_flags(rollout.add_rollout_group(p))
    data.add_data_group(p)
    data.add_eval_group(p)
    trainer_megatron.add_perf_group(p)
    algorithm.add_algorithm_group(p)
    optimizer.add_optimizer_group(p)
    trainer_fsdp.add_fsdp_group(p)
    engines.add_sglang_group(p)
    sglang_group = p._action_groups[-1]
    engines.add_vllm_group(p)
    vllm_group = p._action_groups[-1]
    rewards.add_reward_group(p)
    logging_debug.add_logging_group(p)
    logging_debug.add_debug_group(p)
    _add_slime_extras(p)
    for table in (TRAINER_BACKENDS, ROLLOUT_ENGINES, ADVANTAGE_ESTIMATORS):  # a plugged-in entry's own flags
        for entry in table.entries():
            if entry.add_flags is not None:
                load(entry.add_flags)(p)
    unimplemented.add_unsupported_group(p)
    fields = set()
    p.vllm_options = {}
    if vllm_spec:
        p.vllm_options = vllm_passthrough.add_generated_flags(vllm_group, vllm_spec, set(p._option_string_actions))
    if generated_sglang:
        fields = sglang_passthrough.add_generated_flags(p, sglang_group)
    return p, fields


def _add_slime_extras(p):
    g = p.add_argument_group(SLIME_EXTRAS, "slime flags for hooks, weight-sync variants, agent rollouts, CI checks "
                                           "(docs/configuration.md says which are honoured here)")
    trainer_megatron.add_hook_flags(g)
    rollout.add_sample_hook_flag(g)
    data.add_loss_mask_flag(g)
    optimizer.add_stateless_adam_flag(g)
    trainer_megatron.add_batching_flags(g)
    engines.add_weight_sync_flags(g)
    rollout.add_rollout_source_flags(g)
    distillation.add_opd_flags(g)
    algorithm.add_opsm_flag(g)
    model.add_routing_replay_flags(g)
    custom_config.add_custom_config_flag(g)
    logging_debug.add_ci_flags(g)
    trainer_megatron.add_kernel_flags(g)
    logging_debug.add_profiling_flags(g)


def shared_parser():
    """The plain parser, built once per state of slime_like/registry.py (a registration adds choices and may add
    flags), so once per process in practice."""
    return _shared_parser(registry_version())


@functools.lru_cache(maxsize=1)
def _shared_parser(version: int):
    """The plain parser (no SGLang / vLLM flags generated from an installed engine), built once per process.

    What parses a plain command line, and what the layers that read defaults, groups or option strings use (the
    dry run, provenance, the support tables, the HF model fill, the front-ends): one build per start instead of
    one per reader. Read-only for them; only `parse_namespace` sets its `prog` (usage and --help text)."""
    return build_parser()[0]


def defaults_of(parser) -> dict:
    """dest -> default after type conversion (argparse converts string defaults, e.g. '{}' -> {})."""
    out = {}
    for action in parser._actions:
        if action.dest == "help" or action.default is argparse.SUPPRESS:
            continue
        value = action.default
        if isinstance(value, str) and action.type is not None and callable(action.type):
            value = action.type(value)
        out[action.dest] = value
    return out


def group_of(parser) -> dict:
    """dest -> title of its argparse group (for printing the resolved config by section)."""
    out = {}
    for group in parser._action_groups:
        for action in group._group_actions:
            out[action.dest] = group.title
    return out


def parse_namespace(argv: list, prog: str = "train.py"):
    """argv -> (Namespace, parser); raises ConfigError for unknown flags and bad values."""
    generated = sglang_passthrough.want_generated(argv)
    vllm_spec = vllm_passthrough.load_spec() if vllm_passthrough.want_generated(argv) else None
    if generated or vllm_spec:
        parser, fields = build_parser(prog, generated, vllm_spec)
    else:
        parser, fields = shared_parser(), set()
        parser.prog = prog
    generic = vllm_generic = {}
    if not parser.vllm_options:
        argv, vllm_generic = vllm_passthrough.extract_generic(argv, parser._option_string_actions)
    if not fields:
        argv, generic = sglang_passthrough.extract_generic(argv, parser._option_string_actions)
    argv, router = sglang_passthrough.extract_router_args(argv, parser._option_string_actions)
    args, extras = parser.parse_known_args(argv)
    if extras:
        raise ConfigError(_unknown_message(extras, parser))
    sglang_passthrough.collect(args, parser, fields, generic)
    args.router_args = router  # --router-NAME VALUE: passed to sglang_router.launch_router as --NAME VALUE
    _add_bookkeeping(args)
    vllm_passthrough.collect(args, parser.vllm_options, vllm_generic)
    return args, parser


def _add_bookkeeping(args) -> None:
    """The run facts that are no flag but that later layers fill in (YAML overlays, config.json, --num-epoch) and
    the trainers read: present from the start, so every reader says `args.x` whatever stage made the Namespace.
    What the configuration layer found (warnings, launch refusals, notes, provenance) is no run fact: it goes to
    the ConfigReport beside the Namespace (report.py)."""
    args.cli_dests = []                 # what the user named on the command line (slime_like/args.py)
    args.megatron_role_overrides = {}   # role -> {dest: value} of --megatron-config-path (role_overrides.py)
    args.megatron_role_entries = {}     # role -> index of its YAML entry, for messages
    args.model_args_from_hf = False     # the model flags came from config.json (hf_config.fill_model_from_hf)
    args.hf_model_type = ""             # config.json's model_type: the HF weight layout (hf_config.fill_args_from_hf)
    args.hf_yarn = None                 # config.json's YaRN settings Megatron has no flags for (same)
    args.hf_text_of_vlm = False         # the text model of a vision-language checkpoint (Qwen3.5; same)
    args.hf_linear_attention = None     # Qwen3-Next / Qwen3.5's gated-delta-net layers and sizes (same)
    args.hf_sparse_attention = None     # DeepSeek sparse attention's indexer (DeepSeek-V3.2, GLM-5; same)
    args.num_rollout_per_epoch = None   # set when --num-epoch derives --num-rollout (data.py)
    args.custom_config = {}             # the keys --custom-config-path set (custom_config.py)


def _unknown_message(extras, parser) -> str:
    known = [o for o in parser._option_string_actions if o.startswith("--")]
    flags = [t.split("=", 1)[0] for t in extras if t.startswith("-") and not _is_number(t)]
    if not flags:
        return f"unexpected argument(s) {' '.join(extras)!r}: every value must follow its flag"
    parts = [f"unknown flag {f}{did_you_mean(f, known)}" for f in flags]
    return "; ".join(parts) + ". Flags are never abbreviated; `--help` lists them by group."


def _is_number(tok: str) -> bool:
    try:
        float(tok)
        return True
    except ValueError:
        return False

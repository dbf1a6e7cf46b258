"""The one table of what a run can plug in: trainer backends (--train-backend), rollout engines (--rollout-engine)
and advantage estimators (--advantage-estimator). Each entry is a name -> where its code lives (a lazy
"module:attr" path), its capabilities (the questions the rest of the code asks instead of comparing names), the
--help group of its own flags, and optionally its own flag builder and validator.

    from slime_like.registry import TRAINER_BACKENDS, ROLLOUT_ENGINES, ADVANTAGE_ESTIMATORS
    TRAINER_BACKENDS.has(args.train_backend, "supports_lora")    # never `args.train_backend == "fsdp"`
    ROLLOUT_ENGINES.register("toy", "my_pkg.engine:ToyEngine", capabilities={"weights_checker"},
                             validator="my_pkg.checks:check_toy")  # now a valid --rollout-engine choice

The parser takes its `choices` from here (a live view: a later registration is a valid choice and shows in
--help); backends/trainer_api.py, backends/engine_api/engine.py and algorithms/registry.py read and write these
tables instead of keeping their own, so they agree by construction. Imports nothing of ours and nothing heavy:
the configuration layer (torch-free, --dry-run) and every backend read it.
"""
from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field

_version = 0  # bumped by every (un)registration: the parser cache keys on it (config/parser.py shared_parser)


def version() -> int:
    return _version


@dataclass(frozen=True)
class Entry:
    """One registered choice. `target`, `add_flags` and `validator` are objects or lazy "module:attr" paths:
    add_flags(parser) adds the entry's own argparse group (plugged-in entries; the built-ins' groups are laid
    out by config/parser.py); validator(args, report) runs the entry's own checks when a run selects it."""
    name: str
    target: object
    capabilities: frozenset = frozenset()
    flag_group: str | None = None
    add_flags: object = None
    validator: object = None
    facts: dict = field(default_factory=dict)   # named values (a package to import, a loss kind, ...)

    def has(self, capability: str) -> bool:
        return capability in self.capabilities


def load(target):
    """A "module:attr" path -> the object (an object is returned as it is)."""
    if not isinstance(target, str):
        return target
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


class _Choices:
    """argparse `choices` that follow the table (`in` and iteration read it when asked, not when built)."""

    def __init__(self, table: Registry, extra: tuple):
        self._table, self._extra = table, extra

    def __contains__(self, value) -> bool:
        return value in self._extra or value in self._table

    def __iter__(self):
        return iter([*self._extra, *self._table.names()])


class Registry:
    def __init__(self, flag: str, what: str):
        self.flag, self.what = flag, what
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, target, *, capabilities=(), flag_group: str | None = None, add_flags=None,
                 validator=None, **facts) -> Entry:
        """Add a choice. Registering a name again with a different entry is an error, never a silent override."""
        global _version
        entry = Entry(name, target, frozenset(capabilities), flag_group, add_flags, validator, dict(facts))
        if name in self._entries and self._entries[name] != entry:
            raise ValueError(f"{self.what} {name!r} is already registered ({self._entries[name].target})")
        self._entries[name] = entry
        _version += 1
        return entry

    def unregister(self, name: str) -> None:
        """Remove a choice (tests and plug-ins that registered one for a while)."""
        global _version
        self._entries.pop(name, None)
        _version += 1

    def __contains__(self, name) -> bool:
        return name in self._entries

    def names(self) -> list[str]:
        return list(self._entries)

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def get(self, name: str) -> Entry:
        if name not in self._entries:
            close = difflib.get_close_matches(str(name), self.names(), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(f"unknown {self.flag} {name!r}{hint}; registered: {', '.join(self.names())}")
        return self._entries[name]

    def has(self, name: str, capability: str) -> bool:
        """Whether the registered `name` has `capability` (an unknown name has none)."""
        return name in self._entries and self._entries[name].has(capability)

    def with_capability(self, capability: str) -> list[str]:
        return [n for n, e in self._entries.items() if e.has(capability)]

    def fact(self, name: str, key: str, default=None):
        return self._entries[name].facts.get(key, default) if name in self._entries else default

    def load(self, name: str):
        return load(self.get(name).target)

    def choices(self, *extra) -> _Choices:
        return _Choices(self, extra)

    def display(self, name: str) -> str:
        """How messages name the entry ("the Megatron trainer"; default: the flag value)."""
        return self.fact(name, "display", name)

    def run_validator(self, name: str, args, report) -> None:
        """The entry's own checks, if it has any: validator(args, report), raising ConfigError on bad input."""
        if name in self._entries and self._entries[name].validator is not None:
            load(self._entries[name].validator)(args, report)


TRAINER_BACKENDS = Registry("--train-backend", "trainer backend")
ROLLOUT_ENGINES = Registry("--rollout-engine", "rollout engine")
ADVANTAGE_ESTIMATORS = Registry("--advantage-estimator", "advantage estimator")

# ---- trainer backends: capabilities --------------------------------------------------------------------------
# keeps_pushed_weights      keeps the weights last pushed to the engines (--keep-old-actor)
# distributed_optimizer     shards optimizer state by default on GPUs (slime's ZeRO default)
# megatron_checkpoints      reads and writes Megatron torch_dist checkpoints
# megatron_hooks            calls slime's --custom-megatron-* hooks (megatron-core model chunks)
# megatron_core_spec        builds megatron-core layer specs (--transformer-impl, --attention-backend choose them)
# routing_replay            replays MoE routing (--use-routing-replay, --use-rollout-routing-replay)
# supports_lora             trains LoRA adapters (--lora-rank); the KL reference is the base with adapters off
# saves_hf                  writes --save-hf exports itself
# fp32_sharded_params       computes in bf16 / fp16 over fp32 sharded parameters (FSDP2 mixed precision)
# cp_splits_responses       --context-parallel-size splits responses over CP ranks for the loss (Megatron's CP; the
#                           FSDP trainer's Ulysses sequence parallelism gathers whole sequences before the head)
# trains_images             trains vision-language models on the samples' multimodal_train_inputs (--multimodal-keys)
# trains_mtp                builds and trains multi-token-prediction layers (--enable-mtp-training)
# shares_prompts            computes each GRPO group's shared prompt once per micro-batch (--shared-prompt-training)
TRAINER_BACKENDS.register(
    "megatron", "slime_like.backends.megatron.trainer:MegatronTrainer", flag_group="perf/parallelism",
    capabilities={"keeps_pushed_weights", "distributed_optimizer", "megatron_checkpoints", "megatron_hooks",
                  "megatron_core_spec", "routing_replay", "trains_images", "trains_mtp", "cp_splits_responses",
                  "shares_prompts"},
    validator="slime_like.config.trainer_megatron:check_megatron_backend", display="the Megatron trainer",
    why_no_lora="its fused layers and distributed optimizer are not wired for adapters")
TRAINER_BACKENDS.register(
    "fsdp", "slime_like.backends.fsdp.trainer:FSDPTrainer", flag_group="fsdp / LoRA",
    capabilities={"supports_lora", "saves_hf", "fp32_sharded_params", "trains_images"},
    validator="slime_like.config.trainer_fsdp:check_fsdp_backend", display="the FSDP trainer")

# ---- rollout engines: capabilities -----------------------------------------------------------------------------
# needs_gpu                 runs on an NVIDIA GPU only; its python package (fact python_package) must import
# auto_with_gpu             what --rollout-engine auto picks when a GPU is visible and its package imports
# auto_default              what --rollout-engine auto picks otherwise
# embedded                  our own server: SGLang's ServerArgs flags are not generated for it; it reads only the
#                           --sglang-* keys of fact sglang_keys
# vllm_server_args          takes vLLM's server arguments (--vllm-*)
# uses_router               several engines sit behind a started sglang-router
# weights_checker           serves /weights_checker (--check-weight-update-equal)
# returns_routed_experts    returns the experts each token was routed to (--use-rollout-routing-replay)
# pull_weights              serves SGLang's /pull_weights (--update-weight-mode delta)
# no_offload_on_cpu         cannot release its memory without CUDA (--offload-rollout refused at launch there)
# spans_nodes               one engine over several nodes, a server process per node (SGLang's --nnodes)
# serves_images             takes SGLang's image_data with token-id prompts (--multimodal-keys)
# pd_disaggregation         prefill-only / decode-only servers handing the KV cache over (--prefill-num-servers)
ROLLOUT_ENGINES.register(
    "sglang", "slime_like.backends.sglang.engine:SGLangEngine", flag_group="SGLang",
    capabilities={"needs_gpu", "auto_with_gpu", "uses_router", "weights_checker", "returns_routed_experts",
                  "serves_images", "pull_weights", "spans_nodes", "pd_disaggregation"},
    python_package="sglang", install_extra="sglang", display="SGLang")
ROLLOUT_ENGINES.register(
    "vllm", "slime_like.backends.vllm.engine:VLLMEngine", flag_group="vLLM",
    capabilities={"vllm_server_args", "no_offload_on_cpu"}, display="the vLLM adapter")
ROLLOUT_ENGINES.register(
    "cpu", "slime_like.backends.cpu_engine.launch:CPUEngineServer", flag_group="SGLang",
    capabilities={"auto_default", "embedded", "weights_checker", "returns_routed_experts", "serves_images",
                  "pull_weights"},
    sglang_keys=("dtype", "max_running_requests", "context_length"), display="the CPU engine")

# ---- advantage estimators: capabilities (algorithms/registry.py's EstimatorSpec traits) --------------------------
# needs_critic               the token step reads the critic's values (the run trains a critic)
# uses_reward_kl             folds --kl-coef x KL into the token rewards (else no reference model for --kl-coef)
# whitens_returns            the advantages are the whitened returns
# needs_normalize_advantages defined with batch-whitened advantages (--normalize-advantages required)
# normalizes_group_std       the group step divides by the group's std (meaningless for a group of one)
# fact policy_loss_kind      algorithms.losses.policy_loss's kind: ppo (token ratio), gspo (sequence ratio), cispo
_ESTIMATORS = "slime_like.algorithms.estimators"
ADVANTAGE_ESTIMATORS.register("grpo", f"{_ESTIMATORS}:outcome_broadcast_estimator", flag_group="algorithm (GRPO/PPO)",
                              capabilities={"normalizes_group_std"}, policy_loss_kind="ppo")
ADVANTAGE_ESTIMATORS.register("gspo", f"{_ESTIMATORS}:outcome_broadcast_estimator", flag_group="algorithm (GRPO/PPO)",
                              capabilities={"normalizes_group_std"}, policy_loss_kind="gspo")
ADVANTAGE_ESTIMATORS.register("cispo", f"{_ESTIMATORS}:outcome_broadcast_estimator", flag_group="algorithm (GRPO/PPO)",
                              capabilities={"normalizes_group_std"}, policy_loss_kind="cispo")
ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus", f"{_ESTIMATORS}:reinforce_plus_plus_estimator",
                              flag_group="algorithm (GRPO/PPO)", policy_loss_kind="ppo",
                              capabilities={"uses_reward_kl", "whitens_returns", "needs_normalize_advantages"})
ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus_baseline", f"{_ESTIMATORS}:reinforce_plus_plus_baseline_estimator",
                              flag_group="algorithm (GRPO/PPO)", policy_loss_kind="ppo",
                              capabilities={"uses_reward_kl", "needs_normalize_advantages"})
ADVANTAGE_ESTIMATORS.register("ppo", f"{_ESTIMATORS}:ppo_gae_estimator", flag_group="algorithm (GRPO/PPO)",
                              capabilities={"needs_critic", "uses_reward_kl"}, policy_loss_kind="ppo")

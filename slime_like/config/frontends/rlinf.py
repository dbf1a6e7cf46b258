"""RLinf's YAML (seeds 001 / 002: cluster, runner, algorithm, inference, rollout, data, actor, reward, critic) ->
the equivalent slime_like flags. See docs/from-rlinf.md for the table in prose; the schema below is the contract:
every key is mapped (Map / Read), accepted with a warning (NoEffect), or refused with the reason (Refuse)."""
from __future__ import annotations

from slime_like.config.errors import ConfigError
from slime_like.config.frontends import megatron_keys as mk
from slime_like.config.frontends.top_keys import RLINF_TOP_KEYS
from slime_like.config.frontends.common import Free, Map, NoEffect, Read, Refuse, flag_rule, get, walk
from slime_like.config.frontends.defaults import RLINF_DEFAULTS, absolute_path, apply_defaults
from slime_like.config.frontends.rewards import rlinf_reward

TOP_KEYS = RLINF_TOP_KEYS
_GPU = "a GPU kernel / memory setting of the engine"
_LOG = "logging detail of RLinf's runner"
_NAME = "a label of an RLinf worker group; workers here are named by role"


def _f(flag, conv=None):
    return flag_rule(flag, lambda v, t: t.flag(flag, conv(v) if conv and v is not None else v))


def _sw(flag):
    return flag_rule(flag, lambda v, t: t.switch(flag, bool(v)))


def _fact(name):
    def put(v, t):
        t.facts[name] = v
    return put


def _engine(v, t):
    t.facts["rollout_backend"] = v


def _adv(v, t):
    table = {"grpo": "grpo", "ppo": "ppo", "gae": "ppo", "reinforce_plus_plus": "reinforce_plus_plus",
             "reinforce++": "reinforce_plus_plus", "gspo": "gspo"}
    if v not in table:
        raise ConfigError(f"{v!r} is not an estimator here; use one of {', '.join(sorted(table))}")
    t.flag("--advantage-estimator", table[v])


def _kl_type(v, t):
    table = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "k3": "k3", "low_var_kl": "low_var_kl"}
    if v not in table:
        raise ConfigError(f"{v!r} is not a KL estimator here; use one of {', '.join(sorted(table))}")
    t.flag("--kl-loss-type", table[v])


def _reward_type(v, t):
    if v is None:
        return  # null: no reward function (reported by _reward with the other problems)
    if "." in v:  # a 'module.function' reward: our extension, so the demo's task can run from an RLinf file
        t.flag("--custom-rm-path", v)
    elif v in ("math", "deepscaler", "dapo", "f1", "gpqa"):
        t.flag("--rm-type", v)
    else:
        raise ConfigError(f"{v!r} is not a reward here; use math, deepscaler, dapo, f1, gpqa or a module.function")


def _greedy(v, t):
    t.switch("--rollout-greedy", bool(v))


def _train_paths(v, t):
    paths = [absolute_path(t, f"data.train_data_paths[{i}]" if not isinstance(v, str) else "data.train_data_paths", p)
             for i, p in enumerate(_paths(v))]
    t.flag("--prompt-data", paths[0])
    if len(paths) > 1:
        t.flag("--prompt-data-extra", *paths[1:])


def _paths(v) -> list:
    return [v] if isinstance(v, str) else list(v)


SCHEMA = {
    "hydra": Free(NoEffect("any", "Hydra's own run settings; the config is read without Hydra")),
    "defaults": NoEffect("list", "Hydra defaults lists are not composed; write one whole file",
                         harmless=([{"override hydra/job_logging": "stdout"}],)),
    "cluster": {
        "num_nodes": Map("int", _f("--num-nodes")),
        "num_gpus_per_node": Map("int", _f("--num-gpus-per-node")),
        "component_placement": Read("dict", "becomes --placement (placement section of the translation)"),
    },
    "runner": {
        "task_type": Refuse("str", "only math-style reasoning RL (prompt -> response -> reward) runs here",
                            ok=("math", "reasoning")),
        "logger": {
            "path": Map("str", _f("--tensorboard-dir")),
            "log_path": Map("str", _f("--tensorboard-dir")),
            "project_name": Map("str", _f("--wandb-project")),
            "experiment_name": Map("str", _f("--wandb-group")),
            "logger_backends": Map("list", lambda v, t: (t.switch("--use-tensorboard", "tensorboard" in v),
                                                         t.switch("--use-wandb", "wandb" in v))),
            "tensorboard": {"enable": Map("bool", _sw("--use-tensorboard")),
                            "queue_size": NoEffect("int", _LOG)},
            "wandb": {"enable": Map("bool", _sw("--use-wandb")),
                      "project_name": Map("str", _f("--wandb-project")),
                      "experiment_name": Map("str", _f("--wandb-group"))},
        },
        "max_epochs": Read("int", "--num-epoch when runner.max_steps is -1"),
        "max_steps": Read("int", "--num-rollout (one RLinf step = one rollout and its update)"),
        "val_check_interval": Read("int", "--eval-interval when validation data is given (-1: never)"),
        "save_interval": Map("int", lambda v, t: t.flag("--save-interval", v if v and v > 0 else None)),
        "seq_length": Map("int", lambda v, t: (t.flag("--seq-length", v), t.flag("--rollout-max-context-len", v))),
        "enable_dynamic_batch_size": Map("bool", _sw("--use-dynamic-batch-size")),
        "max_tokens_per_mbs": Read("int", "--max-tokens-per-gpu with runner.enable_dynamic_batch_size"),
        "resume_dir": Map("str", _f("--load")),
        "experiment_name": Read("str", "names the checkpoint directory (--save)"),
        "output_dir": Read("str", "--save OUTPUT_DIR/EXPERIMENT_NAME/checkpoints"),
    },
    "algorithm": {
        "group_size": Map("int", _f("--n-samples-per-prompt")),
        "n_minibatches": Map("int", _f("--num-steps-per-rollout")),
        "training_batch_size_per_gpu": Map("int", _f("--micro-batch-size")),
        "rollout_batch_size_per_gpu": Map("int", _fact("rollout_batch_size_per_gpu")),
        "logprob_forward_micro_batch_size": NoEffect("int", "log-prob passes use the training micro-batches "
                                                            "(--micro-batch-size); same values"),
        "val_rollout_batch_size_per_gpu": NoEffect("int", "validation shares the rollout's request concurrency "
                                                          "(algorithm.rollout_batch_size_per_gpu)"),
        "loss_type": Refuse("str", "the PPO-clip policy loss is the RL loss here", ok=("ppo", "actor_critic")),
        "loss_agg_func": Map("str", _f("--loss-agg-mode")),
        "kl_beta": Map("float", _f("--kl-coef")),
        "kl_penalty_type": Map("str", _kl_type),
        "ratio_clip_eps": Map("float", _f("--eps-clip")),
        "clip_ratio_low": Map("float", _f("--eps-clip")),
        "clip_ratio_high": Map("float", _f("--eps-clip-high")),
        "entropy_bonus": Map("float", _f("--entropy-coef")),
        "calculate_entropy": NoEffect("bool", "the entropy is always computed and logged (actor/entropy)",
                                      harmless=(True, False)),
        "clip_ratio_c": Map("float", _f("--eps-clip-c")),
        "adv_type": Map("str", _adv),
        "normalize_advantages": Map("bool", _sw("--normalize-advantages")),
        "early_stop_imp_ratio": Map("float", _f("--early-stop-imp-ratio")),
        "use_valid_token_scale": Map("bool", lambda v, t: t.switch("--loss-micro-batch-mean", not v)),
        # newer RLinf files keep these two under algorithm (older ones: rollout.recompute_logprobs)
        "recompute_logprobs": Map("bool", flag_rule("--use-rollout-logprobs",
                                                    lambda v, t: t.switch("--use-rollout-logprobs", not v))),
        "shuffle_rollout": NoEffect("bool", "a rollout's samples are split into optimizer steps in their order",
                                    harmless=(False,)),
        "sampling_params": {
            "use_greedy": Map("bool", _greedy),
            "do_sample": Map("bool", lambda v, t: _greedy(not v, t)),
            "temperature": Map("float", _f("--rollout-temperature")),
            "top_k": Map("int", _f("--rollout-top-k")),
            "top_p": Map("float", _f("--rollout-top-p")),
            "repetition_penalty": Map("float", _f("--rollout-repetition-penalty")),
            "max_new_tokens": Map("int", _f("--rollout-max-response-len")),
            "min_new_tokens": Map("int", _f("--rollout-min-new-tokens")),
        },
    },
    "inference": {
        "group_name": NoEffect("str", _NAME, harmless=("InferenceGroup",)),
        "load_from_actor": Refuse("bool", "log-probs are computed from the actor's own weights", ok=(True,)),
        "model": {
            "tensor_model_parallel_size": Read("int", "must match the actor's (log-probs run on the actor ranks)"),
            "pipeline_model_parallel_size": Read("int", "must match the actor's (log-probs run on the actor ranks)"),
            "sequence_parallel": NoEffect("bool", "log-probs run on the actor ranks with the actor's settings",
                                          harmless=(False, True)),
        },
    },
    "rollout": {
        "group_name": NoEffect("str", _NAME, harmless=("RolloutGroup",)),
        "rollout_backend": Map("str", _engine),
        "gpu_memory_utilization": Read("float", "the engine's memory share (--sglang-* or --vllm-*, see _backends)"),
        "model_dir": Map("str", _f("--hf-checkpoint")),
        "model": {"model_path": Map("str", _f("--hf-checkpoint")),
                  "model_type": NoEffect("str", "the architecture is read from the checkpoint's config.json")},
        "model_arch": NoEffect("str", "the architecture is read from the checkpoint's config.json"),
        "enforce_eager": Read("bool", "no CUDA graphs (--sglang-disable-cuda-graph or --vllm-enforce-eager)"),
        "distributed_executor_backend": NoEffect("str", "engines are separate server processes under Ray",
                                                 harmless=("mp", "ray")),
        "disable_log_stats": NoEffect("bool", _LOG, harmless=(False, True)),
        "detokenize": NoEffect("bool", "responses are scored from token ids and decoded text as needed",
                               harmless=(False, True)),
        "padding": Refuse("int", "the pad id comes from the tokenizer", ok=(None,)),
        "eos": Refuse("int", "the eos id comes from the tokenizer (stop ids: --rollout-stop-token-ids)", ok=(None,)),
        "attention_backend": Map("str", _f("--sglang-attention-backend")),
        "recompute_logprobs": Map("bool", flag_rule("--use-rollout-logprobs",
                                                    lambda v, t: t.switch("--use-rollout-logprobs", not v))),
        "return_logprobs": NoEffect("bool", "the engine always returns the sampled tokens' log-probs; "
                                            "recompute_logprobs decides which ones the loss uses",
                                    harmless=(False, True)),
        "tensor_parallel_size": Map("int", _f("--rollout-num-gpus-per-engine")),
        "pipeline_parallel_size": Refuse("int", "engines are tensor-parallel only", ok=(1,)),
        "validate_weight": Refuse("bool", "engine weights are not compared after a sync", ok=(False,)),
        "validate_save_dir": NoEffect("str", "only read with rollout.validate_weight"),
        "print_outputs": NoEffect("bool", "use --save-debug-rollout-data PATH to keep the outputs", harmless=(False,)),
        "sglang_decode_log_interval": Map("int", _f("--sglang-decode-log-interval")),
        "max_running_requests": Map("int", _f("--sglang-max-running-requests")),
        "cuda_graph_max_bs": Map("int", _f("--sglang-cuda-graph-max-bs")),
        "use_torch_compile": Map("bool", _sw("--sglang-enable-torch-compile")),
        "torch_compile_max_bs": Map("int", _f("--sglang-torch-compile-max-bs")),
    },
    "data": {
        "type": Refuse("str", "prompt / label records (math-style) are what the data source reads", ok=("math",)),
        "max_prompt_length": Map("int", _f("--rollout-max-prompt-len")),
        "filter_prompt_by_length": NoEffect("bool", "prompts longer than data.max_prompt_length are always dropped "
                                                    "(--rollout-max-prompt-len)", harmless=(True,)),
        "rollout_batch_size": Map("int", _f("--rollout-batch-size")),
        "val_rollout_batch_size": NoEffect("int", "validation always covers the whole validation set; the batch "
                                                  "size only chunks it"),
        "num_workers": NoEffect("int", "prompts are read by the rollout manager in-process"),
        "prompt_key": Map("str", _f("--input-key")),
        "answer_key": Map("str", _f("--label-key")),
        "shuffle": Map("bool", _sw("--rollout-shuffle")),
        "validation_shuffle": Map("bool", _sw("--eval-shuffle")),
        "seed": Map("int", _f("--rollout-seed")),
        "train_data_paths": Map("list_or_str", _train_paths),
        "val_data_paths": Read("list_or_str", "--eval-prompt-data val PATH ..."),
    },
    "actor": {
        "group_name": NoEffect("str", _NAME, harmless=("ActorGroup",)),
        "training_backend": Map("str", _fact("training_backend")),
        "mcore_gpt": Refuse("bool", "the trainer builds megatron-core GPT models", ok=(True,)),
        "spec_name": NoEffect("str", "the layer spec follows the checkpoint's architecture"),
        "checkpoint_load_path": Map("str", _f("--load")),
        "offload_optimizer": Read("bool", "--offload-train / --no-offload-train (see _offload)"),
        "offload_weight": Read("bool", "--offload-train / --no-offload-train (see _offload)"),
        "offload_grad": Read("bool", "--offload-train / --no-offload-train (see _offload)"),
        "enable_dp_load_balance": NoEffect("bool", "micro-batches are balanced by length already",
                                           harmless=(False,)),
        "calculate_flops": NoEffect("bool", "FLOPs are not logged", harmless=(False,)),
        "seed": Map("int", _f("--seed")),
        "model": mk.RLINF_MODEL,
        "optim": mk.RLINF_OPTIM,
        "lr_sched": mk.RLINF_LR_SCHED,
        "tokenizer": {
            "tokenizer_model": Map("str", _f("--tokenizer-model")),
            "use_fast": NoEffect("bool", "the tokenizer is loaded as transformers chooses (fast when available)"),
            "trust_remote_code": Map("bool", _fact("trust_remote_code")),
            "padding_side": NoEffect("str", "batches are packed; padding side does not apply", harmless=("right",)),
        },
        "megatron": mk.RLINF_MEGATRON,
        "fsdp_config": Free(Read("any", "read with actor.training_backend: fsdp")),
    },
    "reward": {
        "use_reward_model": Refuse("bool", "reward models are reached through --rm-type remote_rm --rm-url",
                                   ok=(False,)),
        "reward_type": Map("str", _reward_type),
        "reward_scale": Map("float", _f("--reward-scale")),
    },
    "critic": {
        "use_critic_model": Map("bool", _sw("--use-critic")),
    },
}


def translate(cfg: dict, t) -> None:
    """Walk the file (file order), then the cross-key parts: steps, checkpoints, eval, placement, backends. Every
    step records its problems on `t` (t.errors) so the whole file is reported at once."""
    apply_defaults(cfg, RLINF_DEFAULTS, t, "RLinf")
    walk(cfg, SCHEMA, t)
    for step in (_run_length, _outputs, _eval, rlinf_reward, _inference, _backends, _placement):
        t.attempt(step, cfg, t)


def _run_length(cfg, t):
    max_steps, epochs = get(cfg, "runner.max_steps", -1), get(cfg, "runner.max_epochs")
    t.current = "runner.max_steps" if max_steps and max_steps > 0 else "runner.max_epochs"
    if max_steps and max_steps > 0:
        t.flag("--num-rollout", max_steps)
    elif epochs:
        t.flag("--num-epoch", epochs)
    t.current = None
    if get(cfg, "runner.enable_dynamic_batch_size", False):
        t.flag("--max-tokens-per-gpu", get(cfg, "runner.max_tokens_per_mbs"))
    per_gpu = t.facts.get("rollout_batch_size_per_gpu")
    if per_gpu:  # requests in flight per engine = per GPU x the engine's GPUs
        t.flag("--sglang-server-concurrency", per_gpu * get(cfg, "rollout.tensor_parallel_size", 1))


def _outputs(cfg, t):
    """RLinf writes everything under output_dir/experiment_name: so do checkpoints (--save) and metrics
    (--run-dir: metrics.jsonl, plots, tensorboard) here; a --run-dir after the file wins."""
    out, name = get(cfg, "runner.output_dir"), get(cfg, "runner.experiment_name")
    if not out:
        return
    t.current = "runner.output_dir"
    base = absolute_path(t, "runner.output_dir", out)
    run_dir = f"{base}/{name}" if name else base
    t.flag("--save", f"{run_dir}/checkpoints")
    t.flag("--run-dir", run_dir)
    t.current = None


def _eval(cfg, t):
    val = get(cfg, "data.val_data_paths")
    interval = get(cfg, "runner.val_check_interval", -1)
    if val and interval and interval > 0:
        t.current = "data.val_data_paths"
        paths = [absolute_path(t, "data.val_data_paths", p) for p in _paths(val)]
        t.flag("--eval-prompt-data", *[x for i, p in enumerate(paths) for x in (f"val{i}" if i else "val", p)])
        t.current = "runner.val_check_interval"
        t.flag("--eval-interval", interval)
        t.current = None


def _inference(cfg, t):
    for key, flag in (("tensor_model_parallel_size", "--tensor-model-parallel-size"),
                      ("pipeline_model_parallel_size", "--pipeline-model-parallel-size")):
        inf, act = get(cfg, f"inference.model.{key}"), get(cfg, f"actor.model.{key}", 1)
        if inf is not None and inf != act:
            raise ConfigError(f"{t.path}: inference.model.{key}: {inf} differs from actor.model.{key} {act}; "
                              f"log-probs run on the actor ranks with the actor's {flag}, so make them equal")


def _backends(cfg, t):
    backend = t.facts.get("training_backend", "megatron")
    if backend == "fsdp":
        from slime_like.config.frontends import fsdp_keys
        from slime_like.config.frontends.common import parser_options as _parser_options

        t.flag("--train-backend", "fsdp")
        if fsdp_keys.available(_parser_options()):
            fsdp_keys.rlinf(get(cfg, "actor.fsdp_config", {}), t)
        else:
            t.unmapped += [("--train-backend", "fsdp", f"actor.fsdp_config.{k}") for k in get(cfg, "actor.fsdp_config", {})]
    elif backend != "megatron":
        raise ConfigError(f"{t.path}: actor.training_backend: {backend!r}: use megatron or fsdp")
    elif get(cfg, "actor.fsdp_config"):
        t.no_effect.append(("actor.fsdp_config", "...", "read only with actor.training_backend: fsdp"))
    engine = t.facts.get("rollout_backend")
    if engine is not None:
        if engine not in ("sglang", "vllm"):
            raise ConfigError(f"{t.path}: rollout.rollout_backend: {engine!r}: use sglang or vllm")
        t.flag("--rollout-engine", engine)
    _engine_settings(cfg, t, engine or "sglang")
    _offload(cfg, t)
    if t.facts.get("trust_remote_code"):
        t.no_effect.append(("actor.tokenizer.trust_remote_code", True,
                            "tokenizers load without remote code; pass --trust-remote-code where a flag exists"))


def _engine_settings(cfg, t, engine):
    from slime_like.config.frontends.common import parser_options as _parser_options

    flags = {"gpu_memory_utilization": ("--sglang-mem-fraction-static", "--vllm-gpu-memory-utilization"),
             "enforce_eager": ("--sglang-disable-cuda-graph", "--vllm-enforce-eager")}
    for key, (sglang, vllm) in flags.items():
        value = get(cfg, f"rollout.{key}")
        if value is None:
            continue
        if engine == "vllm" and "--vllm-config" not in _parser_options():
            t.unmapped.append(("--rollout-engine", "vllm", f"rollout.{key}"))
            continue
        t.current = f"rollout.{key}"
        flag = vllm if engine == "vllm" else sglang
        if key == "enforce_eager":
            t.switch(flag, bool(value))
        else:
            t.flag(flag, value)
        t.current = None


def _offload(cfg, t):
    """actor.offload_*: the trainer leaves the GPU while colocated engines generate. Here weights, grads and
    optimizer state move together (--offload-train), on by default when colocated: all false -> off."""
    keys = ("offload_optimizer", "offload_weight", "offload_grad")
    values = {k: get(cfg, f"actor.{k}") for k in keys if get(cfg, f"actor.{k}") is not None}
    if not values:
        return
    if len(set(values.values())) > 1:
        t.no_effect.append(("actor.offload_*", values, "weights, gradients and optimizer state are offloaded "
                                                       "together (--offload-train): any true offloads all"))
    placement = get(cfg, "cluster.component_placement", {}) or {}
    sets = {n.strip(): str(d) for names, d in placement.items() for n in str(names).split(",")}
    if placement and sets.get("actor") != sets.get("rollout"):
        t.no_effect += [(f"actor.{k}", v, "the engines have GPUs of their own: nothing waits for the trainer's "
                                          "memory (offloading applies to colocated runs)") for k, v in values.items()]
        return
    t.flag("--offload-train" if any(values.values()) else "--no-offload-train")


def _placement(cfg, t):
    placement = get(cfg, "cluster.component_placement")
    if not placement:
        return
    specs = []
    for names, devices in placement.items():
        comps = []
        for name in str(names).split(","):
            name = name.strip()
            if name == "inference":  # the log-prob pass: here it runs on the actor ranks
                continue
            if name not in ("actor", "rollout", "critic", "reference"):
                raise ConfigError(f"{t.path}: cluster.component_placement: unknown component {name!r}; "
                                  "use actor, rollout, inference, critic, reference")
            comps.append(name)
        if comps:
            specs.append(f"{','.join(comps)}:{devices}")
    inference = [d for n, d in placement.items() if "inference" in str(n).split(",")]
    actor = [d for n, d in placement.items() if "actor" in str(n).split(",")]
    if inference and inference != actor:
        raise ConfigError(f"{t.path}: cluster.component_placement: inference on {inference[0]!r} apart from the "
                          f"actor ({actor[0] if actor else 'unplaced'!r}): a separate log-prob worker group is not "
                          "built; place inference with the actor (actor,inference: ...)")
    t.flag("--placement", *specs)

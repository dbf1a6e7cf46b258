"""ROLL's pipeline + worker YAML (seed 003 and ROLL's RLVR examples) -> the equivalent slime_like flags.

Workers: actor_train (trainer), actor_infer (engines), reference (its own worker when placed apart,
else inside the actor), critic (a second trainer; per-role values go to the critic's role overlay).
See docs/from-roll.md; the schema below is the contract (Map / Read / NoEffect / Refuse per key).
"""
from __future__ import annotations

from slime_like.config.errors import ConfigError
from slime_like.config.frontends import megatron_keys as mk
from slime_like.config.frontends.top_keys import ROLL_TOP_KEYS
from slime_like.config.frontends.common import (Free, Map, NoEffect, Read, Refuse, devices_text, flag_rule, get,
                                                parse_devices, walk)
from slime_like.config.frontends.defaults import ROLL_DEFAULTS, absolute_path, apply_defaults
from slime_like.config.frontends.rewards import estimator, reward_kl, roll_rewards
from slime_like.config.frontends.roll_strategies import FSDP2_KEYS, strategies

TOP_KEYS = ROLL_TOP_KEYS
_LOG = "logging detail of ROLL's pipeline"


def _f(flag):
    return flag_rule(flag, lambda v, t: t.flag(flag, v))


def _sw(flag):
    return flag_rule(flag, lambda v, t: t.switch(flag, bool(v)))


def _fact(name):
    def put(v, t):
        t.facts[name] = v
    return put


def _adv(v, t):
    table = {"grpo": "grpo", "gae": "ppo", "ppo": "ppo", "reinforce_plus_plus": "reinforce_plus_plus",
             "gspo": "gspo"}
    if v not in table:
        raise ConfigError(f"{v!r} is not an estimator here; use one of {', '.join(sorted(table))}")
    t.flag("--advantage-estimator", table[v])


_DTYPES = {"bf16": "--bf16", "fp16": "--fp16", "fp32": None}


def _dtype(role):
    def put(v, t):
        if v not in _DTYPES:
            raise ConfigError(f"{v!r}: use fp32, bf16 or fp16")
        t.facts[f"{role}_dtype"] = v
    return put


def _template(v, t):
    t.facts.setdefault("template", v)


def _model_args(role):
    return {**MODEL_ARGS, "model_name_or_path": Map("str", _fact(f"{role}_model_path")), "dtype": Map("str", _dtype(role)),
            "ulysses_size": ULYSSES_SIZE[role]}


MODEL_ARGS = {
    "disable_gradient_checkpointing": NoEffect("bool", "activation recompute is chosen by the Megatron flags "
                                                       "(--recompute-granularity)", harmless=(False, True)),
    "attn_implementation": NoEffect("str", "the trainer chooses attention kernels itself"),
}
# Ulysses sequence parallelism is actor_train's: --context-parallel-size with the FSDP trainer (roll_strategies.py)
ULYSSES_SIZE = {
    "actor_train": Map("int", _fact("ulysses_size")),
    "reference": NoEffect("int", "the reference runs with actor_train's layout (its ulysses_size)", harmless=(None, 1)),
    "actor_infer": NoEffect("int", "the engines run whole sequences (their own parallelism: num_gpus_per_worker)",
                            harmless=(None, 1)),
    "critic": Refuse("int", "the critic trains with megatron_train here (its context_parallel_size)", ok=(None, 1)),
}


def _train_args(role):
    dest = (lambda d: (lambda v, t: t.role("critic", d, v))) if role == "critic" else None

    def m(flag, d):
        return Map("float" if d in ("lr", "weight_decay", "adam_beta1", "adam_beta2", "max_grad_norm") else "int",
                   dest(d) if dest else _f(flag))

    return {
        "learning_rate": m("--lr", "lr"),
        "weight_decay": m("--weight-decay", "weight_decay"),
        "adam_beta1": m("--adam-beta1", "adam_beta1"),
        "adam_beta2": m("--adam-beta2", "adam_beta2"),
        "max_grad_norm": Map("float", dest("clip_grad") if dest else _f("--clip-grad")),
        "per_device_train_batch_size": Map("int", _fact(f"{role}_per_device")),
        "gradient_accumulation_steps": Map("int", _fact(f"{role}_grad_accum")),
        "warmup_steps": m("--lr-warmup-iters", "lr_warmup_iters"),
        "lr_scheduler_type": Map("str", (lambda v, t: t.role("critic", "lr_decay_style", _sched(v))) if dest
                                 else (lambda v, t: t.flag("--lr-decay-style", _sched(v)))),
        "num_train_epochs": NoEffect("int", "the run length is max_steps (--num-rollout)"),
    }


def _sched(v):
    table = {"constant": "constant", "linear": "linear", "cosine": "cosine", "constant_with_warmup": "constant"}
    if v not in table:
        raise ConfigError(f"{v!r}: use constant, constant_with_warmup, linear or cosine")
    return table[v]


def _data_files(v, t):
    t.facts["train_files"] = [v] if isinstance(v, str) else list(v)


DATA_ARGS = {
    "template": Map("str", _template),
    "file_name": Map("list_or_str", _data_files),
    "prompt": Map("str", _f("--input-key")),
    "messages": Map("str", lambda v, t: (t.flag("--input-key", v), t.flag("--apply-chat-template"))),
    "dataset_dir": Read("str", "the directory relative file_name entries are read from"),
    "domain_interleave_probs": Refuse("dict", "one data stream per run; mix domains in the file", ok=(None,)),
    "preprocessing_num_workers": NoEffect("int", "prompts are read by the rollout manager in-process"),
}


def _gen_args(prefix):
    return {
        "max_new_tokens": Map("int", _f(f"--{prefix}-max-response-len")),
        "temperature": Map("float", _f(f"--{prefix}-temperature")),
        "top_p": Map("float", _f(f"--{prefix}-top-p")),
        "top_k": Map("int", _f(f"--{prefix}-top-k")),
        "num_beams": Refuse("int", "beam search is not used in RL sampling", ok=(1,)),
        "num_return_sequences": Read("int", "must equal num_return_sequences_in_group (rollout) or is 1 (eval)"),
        "repetition_penalty": Map("float", _f("--rollout-repetition-penalty")) if prefix == "rollout"
        else Refuse("float", "one repetition penalty per run (actor_infer's)", ok=(1.0,)),
        "min_new_tokens": Map("int", _f(f"--{prefix}-min-new-tokens")),
        "do_sample": Map("bool", (lambda v, t: t.switch("--rollout-greedy", not v)) if prefix == "rollout"
                         else (lambda v, t: t.flag("--eval-temperature", 0.0 if not v else None))),
        "stop_strings": Map("list", lambda v, t: t.flag(f"--{prefix}-stop", *v) if prefix == "rollout" else None),
    }


def _strategy(role):
    config = {"megatron_train": mk.ROLL_MEGATRON, "megatron_infer": mk.ROLL_MEGATRON_INFER}
    if role == "actor_infer":
        cfg = {"gpu_memory_utilization": Read("float", "the engine's memory share (see _engine_settings)"),
               "mem_fraction_static": Read("float", "SGLang's memory share (see _engine_settings)"),
               "block_size": Read("int", "vLLM's KV block size (see _engine_settings)"),
               "max_model_len": Map("int", _f("--rollout-max-context-len")),
               "load_format": NoEffect("str", "engines always start from the trainer's weights (pushed before the "
                                              "first rollout)", harmless=("dummy", "auto")),
               "context_length": Read("int", "SGLang's context length (see _engine_settings)")}
    elif role == "reference":
        cfg = config["megatron_infer"]
    else:  # actor_train, critic: Megatron (or FSDP2) settings; the critic's must match the actor's layout
        cfg = {**mk.ROLL_MEGATRON, **FSDP2_KEYS} if role == "actor_train" else mk.ROLL_MEGATRON_INFER
    return {"strategy_name": Map("str", _fact(f"{role}_strategy")), "strategy_config": cfg}


def _worker(role):
    out = {"model_args": _model_args(role), "strategy_args": _strategy(role),
           "device_mapping": Read("mapping", "placement (--placement)"),
           "infer_batch_size": NoEffect("int", "log-prob passes use the training micro-batches (--micro-batch-size)"),
           "world_size": Read("int", "equals the device_mapping length"),
           "data_args": DATA_ARGS if role == "actor_train" else {"template": Map("str", _template)},
           "worker_cls": NoEffect("str", "workers are slime_like's own")}
    if role in ("actor_train", "critic"):
        out["training_args"] = _train_args(role)
    if role == "actor_infer":
        out["generating_args"] = _gen_args("rollout")
        out["num_gpus_per_worker"] = Map("int", _f("--rollout-num-gpus-per-engine"))
    return out


def _reward(v, t):
    cls = v.get("worker_cls", "") if isinstance(v, dict) else ""
    if "." in cls and not cls.startswith("roll."):
        t.flag("--custom-rm-path", cls)  # our extension: a module.function reward
    elif cls.endswith("MathRuleRewardWorker"):
        t.flag("--rm-type", "math")
    else:
        raise ConfigError(f"worker_cls {cls!r}: only ROLL's MathRuleRewardWorker (-> --rm-type math) or a "
                          "module.function reward (-> --custom-rm-path) runs here")
    if len(t.facts.setdefault("rewards", [])) >= 1:
        raise ConfigError("one reward per run here; ROLL's per-domain routing (tag_included) is not built")
    t.facts["rewards"].append(cls)


SCHEMA = {
    "hydra": Free(NoEffect("any", "Hydra's own run settings; the config is read without Hydra")),
    "defaults": NoEffect("list", "Hydra defaults lists are not composed; write one whole file"),
    "exp_name": Map("str", _f("--wandb-group")),
    "seed": Map("int", lambda v, t: (t.flag("--seed", v), t.flag("--rollout-seed", v))),
    "logging_dir": Map("str", flag_rule("--tensorboard-dir",
                                        lambda v, t: t.flag("--tensorboard-dir", absolute_path(t, t.current, v)))),
    "output_dir": Map("str", flag_rule("--run-dir", lambda v, t: _output_dir(absolute_path(t, t.current, v), t))),
    "num_gpus_per_node": Map("int", _f("--num-gpus-per-node")),
    "track_with": Map("str", lambda v, t: t.switch("--use-wandb", v == "wandb") or
                      t.switch("--use-tensorboard", v == "tensorboard")),
    "tracker_kwargs": Free(NoEffect("any", "tracker credentials and tags: use the --wandb-* flags")),
    "max_steps": Map("int", _f("--num-rollout")),
    "save_steps": Map("int", _f("--save-interval")),
    "logging_steps": NoEffect("int", "one metrics line per rollout", harmless=(1,)),
    "eval_steps": Map("int", _fact("eval_steps")),
    "resume_from_checkpoint": Map("any", lambda v, t: t.flag("--load", v if isinstance(v, str) else None)),
    "rollout_batch_size": Map("int", _f("--rollout-batch-size")),
    "val_batch_size": NoEffect("int", "validation always covers the whole validation set"),
    "prompt_length": Map("int", _f("--rollout-max-prompt-len")),
    "response_length": Map("int", _f("--rollout-max-response-len")),
    "num_return_sequences_in_group": Map("int", _f("--n-samples-per-prompt")),
    "ppo_epochs": Refuse("int", "each rollout is trained on once (several steps: gradient_accumulation_steps)",
                         ok=(1,)),
    "adv_estimator": Map("str", _adv),
    "whiten_advantages": Map("bool", _sw("--normalize-advantages")),
    "norm_mean_type": NoEffect("str", "GRPO normalises within each group"),
    "norm_std_type": NoEffect("str", "GRPO normalises within each group"),
    "value_clip": Map("float", _f("--value-clip")),
    "pg_clip": Map("float", _f("--eps-clip")),
    "pg_clip_high": Map("float", _f("--eps-clip-high")),
    "dual_clip_loss": NoEffect("bool", "set the bound with --eps-clip-c"),
    "reward_clip": NoEffect("float", "rewards are not clipped (the built-in rewards lie in [-1, 1])"),
    "advantage_clip": NoEffect("float", "advantages are not clipped (GRPO's are normalised within each group)"),
    "init_kl_coef": Map("float", _fact("init_kl_coef")),
    "add_token_level_kl": Map("bool", _fact("add_token_level_kl")),
    "kl_penalty": Map("str", _f("--kl-loss-type")),
    "use_kl_loss": Map("bool", _sw("--use-kl-loss")),
    "kl_loss_coef": Map("float", _f("--kl-loss-coef")),
    "entropy_loss_coef": Map("float", _f("--entropy-coef")),
    "loss_agg_mode": Map("str", _f("--loss-agg-mode")),
    "pretrain": Map("str", _f("--hf-checkpoint")),
    "reward_pretrain": Read("str", "the critic's initial weights (see _models)"),
    "validation": {"data_args": {"template": Map("str", _template),
                                 "file_name": Map("list_or_str", _fact("val_files"))},
                   "generating_args": _gen_args("eval")},
    "actor_train": _worker("actor_train"),
    "actor_infer": _worker("actor_infer"),
    "reference": _worker("reference"),
    "critic": _worker("critic"),
    "rewards": Free(Map("dict", _reward)),
}


def translate(cfg: dict, t) -> None:
    """Every step records its problems on `t` (t.errors) so the whole file is reported at once."""
    apply_defaults(cfg, ROLL_DEFAULTS, t, "ROLL")
    walk(cfg, SCHEMA, t)
    t.attempt(mk.finish, t)
    for step in (roll_rewards, estimator, reward_kl, _models, _data, strategies, _batch, _placement):
        t.attempt(step, cfg, t)


def _output_dir(path, t):
    """ROLL writes checkpoints and logs under output_dir: so do --save (checkpoints) and --run-dir (metrics.jsonl,
    plots) here; a --run-dir after the file wins."""
    t.flag("--save", f"{path}/checkpoints")
    t.flag("--run-dir", path)


def _models(cfg, t):
    """Precision and weights come from actor_train (the engines start from the trainer's weights); a reference
    model path of its own is --ref-load."""
    dtype = t.facts.get("actor_train_dtype")
    if dtype and _DTYPES[dtype]:
        t.current = "actor_train.model_args.dtype"
        t.flag(_DTYPES[dtype])
        t.current = None
    for role in ("actor_infer", "reference", "critic"):
        other = t.facts.get(f"{role}_dtype")
        if other and dtype and other != dtype:
            t.no_effect.append((f"{role}.model_args.dtype", other, f"the {role} runs in actor_train's dtype {dtype}"))
    path = t.facts.get("actor_train_model_path")
    if path and not get(cfg, "pretrain"):
        t.current = "actor_train.model_args.model_name_or_path"
        t.flag("--hf-checkpoint", path)
        t.current = None
    base = path or get(cfg, "pretrain")
    infer = t.facts.get("actor_infer_model_path")
    if infer and infer != base:
        t.no_effect.append(("actor_infer.model_args.model_name_or_path", infer,
                            "the engines start from the trainer's weights, pushed before the first rollout"))
    ref = t.facts.get("reference_model_path")
    if ref and ref != base:
        t.current = "reference.model_args.model_name_or_path"
        t.flag("--ref-load", ref)
        t.current = None
    elif base and (get(cfg, "use_kl_loss") or get(cfg, "add_token_level_kl")) and "--ref-load" not in t.user_flags:
        # ROLL's reference worker starts from pretrain unless it names a model of its own
        t.current = f"reference.model_args.model_name_or_path (absent: ROLL uses pretrain {base})"
        t.flag("--ref-load", base)
        t.current = None
    critic = t.facts.get("critic_model_path") or get(cfg, "reward_pretrain")
    if critic and critic != base:
        t.no_effect.append(("critic.model_args.model_name_or_path", critic, "the critic starts from the actor's "
                            "checkpoint (--critic-load resumes a saved critic)"))


def _data(cfg, t):
    """Training and validation prompts, their template, and the samples drawn per prompt."""
    files = t.facts.get("train_files")
    if files:
        data_dir = get(cfg, "actor_train.data_args.dataset_dir")
        key = "actor_train.data_args.file_name"
        files = [absolute_path(t, key, _under(data_dir, f)) for f in files]
        t.current = key
        t.flag("--prompt-data", files[0])
        if len(files) > 1:
            t.flag("--prompt-data-extra", *files[1:])
        t.current = next(iter(f"rewards.{k}" for k in (get(cfg, "rewards") or {})), "rewards")
        t.flag("--label-key", "ground_truth")  # ROLL's RLVR reward workers read the reference answer there
        t.current = None
    template = t.facts.get("template")
    if template is not None:
        t.flag("--prompt-template", template)
    val = t.facts.get("val_files")
    if val:
        val = [absolute_path(t, "validation.data_args.file_name", p) for p in ([val] if isinstance(val, str) else val)]
        t.current = "validation.data_args.file_name"
        t.flag("--eval-prompt-data", *[x for i, p in enumerate(val) for x in (f"val{i}" if i else "val", p)])
        t.current = "eval_steps"
        t.flag("--eval-interval", t.facts.get("eval_steps") or 1)
        t.current = None
    n_eval = get(cfg, "validation.generating_args.num_return_sequences")
    if n_eval:
        t.flag("--n-samples-per-eval-prompt", n_eval)
    n_roll = get(cfg, "actor_infer.generating_args.num_return_sequences")
    group = get(cfg, "num_return_sequences_in_group")
    if n_roll and group and n_roll != group:
        raise ConfigError(f"{t.path}: actor_infer.generating_args.num_return_sequences {n_roll} differs from "
                          f"num_return_sequences_in_group {group}; make them equal")


def _under(base, f):
    import os

    return os.path.join(base, f) if base and not os.path.isabs(f) else f


def _batch(cfg, t):
    """ROLL: global batch = per_device x grad_accum x world / (TP x PP x CP); micro-batch = per_device."""
    per_device, accum = t.facts.get("actor_train_per_device"), t.facts.get("actor_train_grad_accum")
    world = 1
    if per_device:
        t.flag("--micro-batch-size", per_device)
    if per_device and accum:
        mapping = get(cfg, "actor_train.device_mapping")
        world = len(parse_devices(mapping, "actor_train.device_mapping")) if mapping is not None else 1
        par = 1
        for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
            par *= get(cfg, f"actor_train.strategy_args.strategy_config.{key}", 1)
        par *= t.facts.get("ulysses_size") or 1  # fsdp2_train: the SP ranks of a DP rank share its samples
        if world % par:
            raise ConfigError(f"{t.path}: actor_train.device_mapping has {world} GPUs, not divisible by TP x PP x CP "
                              f"x ulysses_size = {par}")
        t.flag("--global-batch-size", per_device * accum * world // par)
    if get(cfg, "critic"):
        t.flag("--use-critic")
        c_device, c_accum = t.facts.get("critic_per_device"), t.facts.get("critic_grad_accum")
        if c_device:
            t.role("critic", "micro_batch_size", c_device)
        if c_device and c_accum and per_device and accum:
            c_world = len(parse_devices(get(cfg, "critic.device_mapping", [0]), "critic.device_mapping"))
            if c_device * c_accum * c_world != per_device * accum * world:
                raise ConfigError(f"{t.path}: critic.training_args: per_device_train_batch_size x "
                                  "gradient_accumulation_steps x GPUs differs from actor_train's; the critic trains "
                                  "on the same global batch here, so make them equal")


def _placement(cfg, t):
    """device_mapping per worker -> --placement; a reference placed with the actor runs inside it."""
    specs = []
    for worker, comp in (("actor_train", "actor"), ("actor_infer", "rollout"), ("critic", "critic"),
                         ("reference", "reference")):
        mapping = get(cfg, f"{worker}.device_mapping")
        if mapping is None:
            continue
        ids = parse_devices(mapping, f"{t.path}: {worker}.device_mapping")
        specs.append(f"{comp}:{devices_text(ids)}")
    if specs:
        t.flag("--placement", *specs)

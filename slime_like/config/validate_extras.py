"""Checks and derived values of the flags the RLinf / ROLL front-ends brought in (sampling, aggregation,
reward scale, prompt templates). Called by validate.validate_args."""
from __future__ import annotations

from slime_like.config.errors import ConfigError, warn

# ChatML, the layout of ROLL's qwen2_5 template (and Qwen2.5's own): one user turn, then the assistant's.
CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TEMPLATES = ("plain", "native", "chatml", "qwen2_5")


def validate_extras(args) -> None:
    _weight_transport(args)
    _sampling(args)
    _algorithm(args)
    _prompt_template(args)


def _weight_transport(args):
    if args.update_weight_transport == "disk":
        if not args.update_weight_disk_dir:
            raise ConfigError("--update-weight-transport disk needs --update-weight-disk-dir: a directory the trainer "
                              "writes each sync's HF checkpoint to and every engine reads from (same path)")
        if args.pipeline_model_parallel_size > 1:
            raise ConfigError(f"--update-weight-transport disk with --pipeline-model-parallel-size "
                              f"{args.pipeline_model_parallel_size}: each pipeline stage sends its own layers, so an "
                              "engine would reload a partial checkpoint; use PP 1 or --update-weight-transport nccl")
    elif args.update_weight_disk_dir or args.update_weight_disk_keep_files:
        warn(args, "--update-weight-disk-dir / --update-weight-disk-keep-files without --update-weight-transport disk: "
                   "nothing is written there (weights go to the engines as tensors)")


def _sampling(args):
    if not args.rollout_repetition_penalty > 0:
        raise ConfigError(f"--rollout-repetition-penalty {args.rollout_repetition_penalty}: must be > 0 (1.0 = off)")
    m = args.rollout_min_new_tokens
    if m is not None:
        if m < 0:
            raise ConfigError(f"--rollout-min-new-tokens {m}: must be >= 0")
        if args.rollout_max_response_len is not None and m > args.rollout_max_response_len:
            raise ConfigError(f"--rollout-min-new-tokens {m} exceeds --rollout-max-response-len "
                              f"{args.rollout_max_response_len}")
    if args.rollout_greedy and args.n_samples_per_prompt > 1:
        warn(args, f"--rollout-greedy with --n-samples-per-prompt {args.n_samples_per_prompt}: the responses of a "
                   "group are identical, so group-relative advantages are all 0 (nothing is learned)")


def _algorithm(args):
    ratio = args.early_stop_imp_ratio
    if ratio is not None and not ratio > 0:
        raise ConfigError(f"--early-stop-imp-ratio {ratio}: must be > 0 (the mean importance ratio starts at 1)")
    if args.loss_agg_mode == "seq-mean-token-sum-norm" and not args.rollout_max_response_len:
        raise ConfigError("--loss-agg-mode seq-mean-token-sum-norm divides by --rollout-max-response-len; set it")
    if args.reward_scale is not None and not args.reward_scale > 0:
        raise ConfigError(f"--reward-scale {args.reward_scale}: must be > 0")
    if args.use_stateless_adam and (args.optimizer != "adam" or not args.no_save_optim):
        raise ConfigError(f"--use-stateless-adam (with --optimizer {args.optimizer}"
                          + ("" if args.no_save_optim else ", without --no-save-optim")
                          + "): slime's stateless Adam is an Adam and keeps no moments to save; use --optimizer adam "
                            "--no-save-optim")
    if args.calculate_per_token_loss and (args.loss_agg_mode != "token-mean" or args.loss_micro_batch_mean):
        raise ConfigError("--calculate-per-token-loss is megatron-core's token-mean path; it cannot be combined "
                          f"with --loss-agg-mode {args.loss_agg_mode} or --loss-micro-batch-mean")


def _prompt_template(args):
    """--prompt-template -> the chat-template flags the data source reads."""
    t = args.prompt_template
    if t is None or t == "plain":
        return
    if t not in TEMPLATES:
        raise ConfigError(f"--prompt-template {t!r}: use one of {', '.join(TEMPLATES)} (ROLL's other template names "
                          "are model-specific layouts; write the prompt as text or use native)")
    args.apply_chat_template = True
    if t in ("chatml", "qwen2_5"):
        kwargs = dict(args.apply_chat_template_kwargs or {})
        if "chat_template" in kwargs:
            raise ConfigError(f"--prompt-template {t} sets the chat template; drop chat_template from "
                              "--apply-chat-template-kwargs")
        kwargs["chat_template"] = CHATML
        args.apply_chat_template_kwargs = kwargs

"""The algorithm: advantage estimator, policy / value losses, KL, importance sampling (GRPO / PPO family); the
estimators' traits validation asks about, the checks and derived defaults. On-policy distillation:
distillation.py; rewards: rewards.py."""
from __future__ import annotations

import os
from slime_like.config.errors import ConfigError
from slime_like.registry import ADVANTAGE_ESTIMATORS, TRAINER_BACKENDS
from slime_like.config.types import Float, Int, SEED_MAX


# the policy loss that clips a detached importance weight (its lower bound is optional): a policy_loss_kind of
# slime_like/registry.py's estimator entries (algorithms.losses.policy_loss)
CLIPPED_WEIGHT_KIND = "cispo"


def reference_needed(args) -> bool:
    """Whether anything reads a reference model: the KL loss, or --kl-coef with an estimator that folds KL
    into the reward (grpo / gspo ignore it: no reference model, no reference pass for it)."""
    return bool(args.use_kl_loss or (args.kl_coef and ADVANTAGE_ESTIMATORS.has(args.advantage_estimator,
                                                                                  "uses_reward_kl")))


def add_algorithm_group(parser):
    g = parser.add_argument_group("algorithm (GRPO/PPO)", "Advantages, policy / value losses, KL, importance sampling")
    a = g.add_argument
    a("--advantage-estimator", default="grpo", choices=ADVANTAGE_ESTIMATORS.choices(), help="Advantage estimator.")
    a("--loss-type", default="policy_loss", choices=["policy_loss", "sft_loss", "custom_loss"],
      help="policy_loss (PPO-clip), sft_loss, or custom_loss (--custom-loss-function-path).")
    a("--custom-loss-function-path", default=None, help="'module.function' for --loss-type custom_loss.")
    a("--custom-advantage-function-path", default=None, help="'module.function' replacing the advantage computation.")
    a("--disable-compute-advantages-and-returns", action="store_false", dest="compute_advantages_and_returns",
      help="Skip advantages/returns (SFT or custom losses).")
    a("--eps-clip", type=Float(0), default=0.2, help="PPO clip range (lower side: ratio >= 1 - eps_clip).")
    a("--eps-clip-high", type=Float(0), default=None, help="Upper clip range; default = --eps-clip (symmetric).")
    a("--eps-clip-c", type=Float(1, lo_open=True), default=None,
      help="Dual-clip PPO lower bound c (> 1) for negative advantages.")
    a("--value-clip", type=Float(0), default=0.2, help="Clip range of the value loss.")
    a("--kl-coef", type=Float(0), default=0.0, help="KL penalty folded into the reward (needs a reference model).")
    a("--use-kl-loss", action="store_true", help="Compute KL to the reference model as a loss term / metric.")
    a("--kl-loss-coef", type=Float(0), default=0.0, help="Weight of the KL loss (0 = monitor only).")
    a("--kl-loss-type", default="k1", choices=["k1", "k2", "k3", "low_var_kl"], help="KL estimator.")
    a("--use-unbiased-kl", action="store_true", help="Importance-weighted (unbiased) KL estimate.")
    a("--ref-update-interval", type=Int(1), default=None, help="Copy the actor into the reference every N rollouts.")
    a("--entropy-coef", type=Float(), default=0.0, help="Entropy bonus weight.")
    a("--gamma", type=Float(0, 1), default=1.0, help="Discount (PPO GAE).")
    a("--lambd", type=Float(0, 1), default=1.0, help="GAE lambda.")
    a("--normalize-advantages", action="store_true", help="Whiten advantages over the batch.")
    a("--disable-grpo-std-normalization", action="store_false", dest="grpo_std_normalization",
      help="GRPO without dividing by the group std (Dr. GRPO).")
    a("--disable-rewards-normalization", action="store_false", dest="rewards_normalization",
      help="No group normalisation of rewards.")
    a("--loss-agg-mode", default="token-mean",
      choices=["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"],
      help="(slime_like) How per-token losses of an optimizer step become one number: token-mean (every token of the "
           "step weighs the same), seq-mean-token-mean (every response weighs the same), seq-mean-token-sum (every "
           "response's token sum, averaged over responses), seq-mean-token-sum-norm (that, divided by "
           "--rollout-max-response-len: Dr. GRPO). RLinf loss_agg_func / ROLL loss_agg_mode.")
    a("--loss-micro-batch-mean", action="store_true",
      help="(slime_like) Aggregate within each micro-batch and weigh micro-batches equally, as RLinf does with "
           "use_valid_token_scale: false (default: aggregate over the whole step).")
    a("--early-stop-imp-ratio", type=Float(0, lo_open=True), default=None,
      help="(slime_like) Skip a micro-batch's policy update when its mean importance ratio exp(logp - old_logp) "
           "over valid tokens (all data-parallel ranks) exceeds this (RLinf early_stop_imp_ratio); "
           "metric actor/early_stopped_frac.")
    a("--calculate-per-token-loss", action="store_true", help="Average the loss over tokens instead of samples.")
    a("--use-tis", action="store_true", help="Truncated importance sampling against the rollout log-probs.")
    a("--tis-clip", type=Float(0), default=2.0, help="Upper clip of the TIS ratio.")
    a("--tis-clip-low", type=Float(0), default=0.0, help="Lower clip of the TIS ratio.")
    a("--custom-tis-function-path", default=None, help="'module.function' computing TIS weights.")
    a("--use-rollout-logprobs", action="store_true", help="Use the engine's log-probs as the old policy.")
    a("--use-rollout-entropy", action="store_true", help="Compute entropy alongside log-probs.")
    a("--get-mismatch-metrics", action="store_true", help="Log train/rollout log-prob mismatch metrics.")
    a("--num-critic-only-steps", type=Int(0), default=0, help="First N rollouts train only the critic.")
    a("--megatron-config-path", default=None,
      help="YAML with per-role (actor / critic) overrides of these flags; see docs/configuration.md.")
    a("--seed", type=Int(0, SEED_MAX), default=1234, help="Trainer random seed (slime default 1234).")
    return parser


def add_opsm_flag(g):
    """(slime extras group) off-policy sequence masking (algorithms.losses.opsm_mask)."""
    a = g.add_argument
    a("--use-opsm", action="store_true",
      help="Off-policy sequence masking: drop the policy loss of a sequence with a negative advantage whose mean "
           "log-ratio old - new exceeds --opsm-delta (slime's OPSM).")
    a("--opsm-delta", type=Float(0), default=1e-4, help="Threshold of off-policy sequence masking.")


def check_algorithm(args, report):
    est = args.advantage_estimator
    if not args.compute_advantages_and_returns and args.loss_type == "policy_loss":
        raise ConfigError(f"--disable-compute-advantages-and-returns with --loss-type {args.loss_type}: the policy "
                          "loss needs advantages; it is for --loss-type sft_loss or custom_loss")
    trait = lambda name: ADVANTAGE_ESTIMATORS.has(est, name)  # noqa: E731 (the estimator's capabilities)
    critic_users = ADVANTAGE_ESTIMATORS.with_capability("needs_critic")
    if args.use_critic and not trait("needs_critic"):
        raise ConfigError(f"--use-critic with --advantage-estimator {est}: only {', '.join(critic_users)} use(s) "
                          f"critic values (GAE); use --advantage-estimator {critic_users[0]} or drop --use-critic")
    if trait("needs_critic") and not args.use_critic:
        args.use_critic = True  # slime: the ppo estimator always trains a critic
    if args.eps_clip_high is None:
        args.eps_clip_high = args.eps_clip
    if ADVANTAGE_ESTIMATORS.fact(est, "policy_loss_kind") == CLIPPED_WEIGHT_KIND and args.eps_clip < 1.0:
        report.warn(f"--advantage-estimator cispo with --eps-clip {args.eps_clip}: the lower bound "
                    f"{1.0 - args.eps_clip:g} of the importance weight stays active; canonical CISPO is single-sided "
                    "(--eps-clip 1.0, and a wide --eps-clip-high such as 4.0), as slime warns")
    if args.use_opsm and args.loss_type != "policy_loss":
        raise ConfigError(f"--use-opsm with --loss-type {args.loss_type}: off-policy sequence masking applies to "
                          "the policy loss (--loss-type policy_loss)")
    if args.eps_clip <= 0 or args.eps_clip_high <= 0:
        raise ConfigError(f"--eps-clip ({args.eps_clip}) and --eps-clip-high ({args.eps_clip_high}) must be > 0")
    if args.eps_clip_c is not None and args.eps_clip_c <= 1.0:
        raise ConfigError(f"--eps-clip-c {args.eps_clip_c}: dual-clip PPO needs c > 1 (e.g. 3.0)")
    if args.kl_coef != 0 and args.kl_loss_coef != 0:
        raise ConfigError(f"--kl-coef {args.kl_coef} (KL in the reward) and --kl-loss-coef {args.kl_loss_coef} "
                          "(KL in the loss) are both set; use one of them")
    if args.kl_coef != 0 and not trait("uses_reward_kl"):
        report.warn(f"--kl-coef {args.kl_coef} has no effect with --advantage-estimator {est}: it ignores the "
                    "reward-side KL, so no reference model and no reference forward pass are run for it "
                    "(regularise with --use-kl-loss --kl-loss-coef instead)")
    # with LoRA (--train-backend fsdp) the reference is the base (--ref-load or --hf-checkpoint), adapters disabled
    lora_reference = TRAINER_BACKENDS.has(args.train_backend, "supports_lora") and args.lora_rank
    if reference_needed(args) and not lora_reference:
        if not args.ref_load:
            which = "--use-kl-loss" if args.use_kl_loss else f"--kl-coef {args.kl_coef}"
            raise ConfigError(f"{which} needs a reference model: set --ref-load to its checkpoint")
        if not os.path.exists(args.ref_load):
            report.path_problem(f"--ref-load {args.ref_load}: no such file or directory (the KL reference model)")
    if trait("needs_normalize_advantages") and not args.normalize_advantages:
        raise ConfigError(f"--advantage-estimator {est} needs --normalize-advantages (REINFORCE++ whitens "
                          "advantages over the batch); add the flag")
    if args.loss_type == "custom_loss" and not args.custom_loss_function_path:
        raise ConfigError("--loss-type custom_loss needs --custom-loss-function-path module.function")
    if args.use_rollout_logprobs and args.use_tis:
        raise ConfigError("--use-rollout-logprobs and --use-tis exclude each other: TIS corrects between rollout "
                          "and trainer log-probs, which --use-rollout-logprobs makes identical")
    if args.n_samples_per_prompt == 1 and args.grpo_std_normalization and trait("normalizes_group_std"):
        args.grpo_std_normalization = False  # slime: the std of a one-sample group is undefined
        report.warn("--n-samples-per-prompt 1: GRPO std normalisation turned off (a group of one has no std)")
    if args.num_critic_only_steps and not args.use_critic:
        raise ConfigError(f"--num-critic-only-steps {args.num_critic_only_steps} needs a critic "
                          "(--advantage-estimator ppo)")
    ADVANTAGE_ESTIMATORS.run_validator(est, args, report)  # the estimator's own checks (registry.py)


def check_loss_shaping(args):
    ratio = args.early_stop_imp_ratio
    if ratio is not None and not ratio > 0:
        raise ConfigError(f"--early-stop-imp-ratio {ratio}: must be > 0 (the mean importance ratio starts at 1)")
    if args.loss_agg_mode == "seq-mean-token-sum-norm" and not args.rollout_max_response_len:
        raise ConfigError("--loss-agg-mode seq-mean-token-sum-norm divides by --rollout-max-response-len; set it")


def check_per_token_loss(args):
    if args.calculate_per_token_loss and (args.loss_agg_mode != "token-mean" or args.loss_micro_batch_mean):
        raise ConfigError("--calculate-per-token-loss is megatron-core's token-mean path; it cannot be combined "
                          f"with --loss-agg-mode {args.loss_agg_mode} or --loss-micro-batch-mean")

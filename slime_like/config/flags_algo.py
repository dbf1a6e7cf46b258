"""slime's algorithm (GRPO / PPO family) and reward flags."""
from __future__ import annotations

from typing import NamedTuple


class EstimatorTraits(NamedTuple):
    """What validation needs to know of an --advantage-estimator (the full spec lives in algorithms/)."""
    needs_critic: bool = False
    uses_reward_kl: bool = False
    needs_normalize_advantages: bool = False
    normalizes_group_std: bool = False


# The registered estimators (slime_like/algorithms/estimators.py), kept here as a light copy because config/
# imports nothing else of ours (and stays torch-free); tests/algorithms/test_estimator_specs.py checks that it
# matches the registry name for name and trait for trait. A new estimator adds its line here too.
ESTIMATOR_TRAITS = {
    "grpo": EstimatorTraits(normalizes_group_std=True),
    "gspo": EstimatorTraits(normalizes_group_std=True),
    "reinforce_plus_plus": EstimatorTraits(uses_reward_kl=True, needs_normalize_advantages=True),
    "reinforce_plus_plus_baseline": EstimatorTraits(uses_reward_kl=True, needs_normalize_advantages=True),
    "ppo": EstimatorTraits(needs_critic=True, uses_reward_kl=True),
}
ADVANTAGE_ESTIMATORS = list(ESTIMATOR_TRAITS)


def reference_needed(args) -> bool:
    """Whether anything reads a reference model: the KL loss, or --kl-coef with an estimator that folds KL
    into the reward (grpo / gspo ignore it: no reference model, no reference pass for it)."""
    return bool(args.use_kl_loss or (args.kl_coef and ESTIMATOR_TRAITS[args.advantage_estimator].uses_reward_kl))


def add_algorithm_group(parser):
    g = parser.add_argument_group("algorithm (GRPO/PPO)", "Advantages, policy / value losses, KL, importance sampling")
    a = g.add_argument
    a("--advantage-estimator", default="grpo", choices=ADVANTAGE_ESTIMATORS, help="Advantage estimator.")
    a("--loss-type", default="policy_loss", choices=["policy_loss", "sft_loss", "custom_loss"],
      help="policy_loss (PPO-clip), sft_loss, or custom_loss (--custom-loss-function-path).")
    a("--custom-loss-function-path", default=None, help="'module.function' for --loss-type custom_loss.")
    a("--custom-advantage-function-path", default=None, help="'module.function' replacing the advantage computation.")
    a("--disable-compute-advantages-and-returns", action="store_false", dest="compute_advantages_and_returns",
      help="Skip advantages/returns (SFT or custom losses).")
    a("--eps-clip", type=float, default=0.2, help="PPO clip range (lower side: ratio >= 1 - eps_clip).")
    a("--eps-clip-high", type=float, default=None, help="Upper clip range; default = --eps-clip (symmetric).")
    a("--eps-clip-c", type=float, default=None, help="Dual-clip PPO lower bound c (> 1) for negative advantages.")
    a("--value-clip", type=float, default=0.2, help="Clip range of the value loss.")
    a("--kl-coef", type=float, default=0.0, help="KL penalty folded into the reward (needs a reference model).")
    a("--use-kl-loss", action="store_true", help="Compute KL to the reference model as a loss term / metric.")
    a("--kl-loss-coef", type=float, default=0.0, help="Weight of the KL loss (0 = monitor only).")
    a("--kl-loss-type", default="k1", choices=["k1", "k2", "k3", "low_var_kl"], help="KL estimator.")
    a("--use-unbiased-kl", action="store_true", help="Importance-weighted (unbiased) KL estimate.")
    a("--ref-update-interval", type=int, default=None, help="Copy the actor into the reference every N rollouts.")
    a("--entropy-coef", type=float, default=0.0, help="Entropy bonus weight.")
    a("--gamma", type=float, default=1.0, help="Discount (PPO GAE).")
    a("--lambd", type=float, default=1.0, help="GAE lambda.")
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
    a("--early-stop-imp-ratio", type=float, default=None,
      help="(slime_like) Skip a micro-batch's policy update when its mean importance ratio exp(logp - old_logp) "
           "over valid tokens (all data-parallel ranks) exceeds this (RLinf early_stop_imp_ratio); "
           "metric actor/early_stopped_frac.")
    a("--calculate-per-token-loss", action="store_true", help="Average the loss over tokens instead of samples.")
    a("--use-tis", action="store_true", help="Truncated importance sampling against the rollout log-probs.")
    a("--tis-clip", type=float, default=2.0, help="Upper clip of the TIS ratio.")
    a("--tis-clip-low", type=float, default=0.0, help="Lower clip of the TIS ratio.")
    a("--custom-tis-function-path", default=None, help="'module.function' computing TIS weights.")
    a("--use-rollout-logprobs", action="store_true", help="Use the engine's log-probs as the old policy.")
    a("--use-rollout-entropy", action="store_true", help="Compute entropy alongside log-probs.")
    a("--get-mismatch-metrics", action="store_true", help="Log train/rollout log-prob mismatch metrics.")
    a("--num-critic-only-steps", type=int, default=0, help="First N rollouts train only the critic.")
    a("--megatron-config-path", default=None,
      help="YAML with per-role (actor / critic) overrides of these flags; see docs/configuration.md.")
    a("--seed", type=int, default=1234, help="Trainer random seed (slime default 1234).")
    return parser


def add_reward_group(parser):
    g = parser.add_argument_group("reward", "Reward functions")
    a = g.add_argument
    a("--rm-type", default=None,
      help="Built-in reward: math, deepscaler, dapo, f1, gpqa, boxed_<type>, remote_rm.")
    a("--custom-rm-path", default=None, help="'module.function' reward (args, sample) -> float; overrides --rm-type.")
    a("--rm-url", default=None, help="Reward service URL for --rm-type remote_rm.")
    a("--reward-scale", type=float, default=None,
      help="(slime_like) RLinf reward_scale S: a reward r in [0, 1] becomes S * (2r - 1), so correct = +S and "
           "wrong = -S for a 0/1 reward.")
    a("--reward-key", default=None, help="Key selecting the reward from dict-valued rewards.")
    a("--eval-reward-key", default=None, help="--reward-key for eval; default = --reward-key.")
    a("--group-rm", action="store_true", help="The reward function scores a whole group at once.")
    a("--on-nonfinite-reward", default="error", choices=["error", "skip", "zero"],
      help="(slime_like) A NaN/inf reward: 'error' stops the run naming the reward function, prompt index and "
           "value; 'skip' drops that prompt's group (another prompt takes its place, counted as "
           "rollout/nonfinite_reward_groups); 'zero' trains on it with reward 0 (counted likewise).")
    a("--custom-reward-post-process-path", default=None, help="'module.function' post-processing rewards.")
    a("--custom-convert-samples-to-train-data-path", default=None,
      help="'module.function' turning samples into the training batch.")
    a("--rm-timeout", type=float, default=60.0,
      help="(slime_like) Seconds per HTTP attempt of --rm-type remote_rm before it counts as failed.")
    a("--rm-max-retries", type=int, default=10,
      help="(slime_like) HTTP attempts per sample for --rm-type remote_rm, the first included (1 = no retry).")
    a("--rm-retry-budget", type=int, default=None,
      help="(slime_like) Retries of remote_rm per rollout, all samples together; default 2 x the rollout's samples.")
    a("--rm-circuit-breaker", type=int, default=20,
      help="(slime_like) remote_rm failures in a row (no success between them) that stop the rollout: the server "
           "is down.")
    a("--rm-retry-backoff", type=float, default=0.5,
      help="(slime_like) First retry delay of remote_rm in seconds; doubles per attempt, capped at 30 s.")
    return parser

"""Rewards: the reward function (built-in --rm-type, a custom one, a remote service), its retries and post-processing;
their checks."""
from __future__ import annotations

import difflib

from slime_like.config.errors import ConfigError
from slime_like.config.types import Float, Int

# The built-in reward types (rollout/rewards/ grades them; each also as boxed_<type> except remote_rm): named here so
# the start-up checks of --rm-type and of every --eval-config dataset's rm_type need no rollout import.
RULE_TYPES = ("math", "deepscaler", "dapo", "f1", "gpqa", "random")
ALL_TYPES = RULE_TYPES + ("remote_rm",)
IFBENCH_REFUSAL = ("--rm-type ifbench is not available in slime_like: slime grades IFBench by cloning "
                   "github.com/allenai/IFBench when the run starts and importing its instruction checkers, which are "
                   "not on PyPI and are not shipped here (nothing is downloaded at run time). Clone IFBench yourself "
                   "and pass --custom-rm-path to a function of yours that calls its instructions_registry")


def rm_type_problem(rm_type, rm_url) -> str | None:
    """Why a reward type cannot run here (None: it can). Used for --rm-type and each eval dataset's rm_type."""
    if not rm_type:
        return None
    base = rm_type.removeprefix("boxed_")
    if base == "ifbench":
        return IFBENCH_REFUSAL
    if base not in ALL_TYPES or (base == "remote_rm" and rm_type != base):
        close = difflib.get_close_matches(base, ALL_TYPES, n=1)
        return (f"--rm-type {rm_type!r} is not a known reward type (known: {', '.join(ALL_TYPES)}, the rule types "
                f"also as boxed_<type>){f'; did you mean {close[0]!r}?' if close else ''}")
    if base == "remote_rm" and not rm_url:
        return "--rm-type remote_rm needs --rm-url http://HOST:PORT/..."
    return None


def add_reward_group(parser):
    g = parser.add_argument_group("reward", "Reward functions")
    a = g.add_argument
    a("--rm-type", default=None,
      help="Built-in reward: math, deepscaler, dapo, f1, gpqa, boxed_<type>, remote_rm.")
    a("--custom-rm-path", default=None, help="'module.function' reward (args, sample) -> float; overrides --rm-type.")
    a("--rm-url", default=None, help="Reward service URL for --rm-type remote_rm.")
    a("--reward-scale", type=Float(0, lo_open=True), default=None,
      help="(slime_like) RLinf reward_scale S: a reward r in [0, 1] becomes S * (2r - 1), so correct = +S and "
           "wrong = -S for a 0/1 reward.")
    a("--reward-key", default=None, help="Key selecting the reward from dict-valued rewards.")
    a("--eval-reward-key", default=None, help="--reward-key for eval; default = --reward-key.")
    a("--group-rm", action="store_true", help="The reward function scores a whole group at once.")
    a("--on-nonfinite-reward", default="error", choices=["error", "skip", "zero"],
      help="(slime_like) A NaN/inf reward: 'error' stops the run naming the reward function, prompt index and "
           "value; 'skip' drops that prompt's group (another prompt takes its place, counted as "
           "rollout/nonfinite_reward_groups); 'zero' trains on it with reward 0 (counted likewise).")
    a("--on-reward-error", default="error", choices=["error", "skip"],
      help="(slime_like) A reward function that raises: 'error' stops the run naming it, the prompt index and the "
           "exception; 'skip' marks the prompt's samples FAILED (slime's Sample.Status for a recoverable failure) so "
           "the group is dropped and another prompt takes its place, counted as rollout/reward_errors.")
    a("--custom-reward-post-process-path", default=None, help="'module.function' post-processing rewards.")
    a("--custom-convert-samples-to-train-data-path", default=None,
      help="'module.function' turning samples into the training batch.")
    a("--rm-timeout", type=Float(0, lo_open=True), default=60.0,
      help="(slime_like) Seconds per HTTP attempt of --rm-type remote_rm before it counts as failed.")
    a("--rm-max-retries", type=Int(1), default=10,
      help="(slime_like) HTTP attempts per sample for --rm-type remote_rm, the first included (1 = no retry).")
    a("--rm-retry-budget", type=Int(0), default=None,
      help="(slime_like) Retries of remote_rm per rollout, all samples together; default 2 x the rollout's samples.")
    a("--rm-circuit-breaker", type=Int(1), default=20,
      help="(slime_like) remote_rm failures in a row (no success between them) that stop the rollout: the server "
           "is down.")
    a("--rm-retry-backoff", type=Float(0, lo_open=True), default=0.5,
      help="(slime_like) First retry delay of remote_rm in seconds; doubles per attempt, capped at 30 s.")
    return parser


def check_rewards_and_tools(args):
    """Reward-model timeouts and retries, the tool-call settings, reward types that cannot run here."""
    for flag, low in (("rm_timeout", 0), ("rm_retry_backoff", 0)):
        if getattr(args, flag) <= low:
            raise ConfigError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be > 0 (seconds)")
    if args.rm_max_retries < 1:
        raise ConfigError(f"--rm-max-retries {args.rm_max_retries}: must be >= 1 (attempts per sample, the first "
                          "included)")
    if args.max_tool_turns < 0:
        raise ConfigError(f"--max-tool-turns {args.max_tool_turns}: must be >= 0")
    if not args.tool_call_end:
        raise ConfigError("--tool-call-end must be a non-empty stop string, e.g. '</tool>'")
    problem = None if args.custom_rm_path else rm_type_problem(args.rm_type, args.rm_url)  # before any engine starts
    if problem:
        raise ConfigError(problem)


def check_reward_scale(args):
    if args.reward_scale is not None and not args.reward_scale > 0:
        raise ConfigError(f"--reward-scale {args.reward_scale}: must be > 0")

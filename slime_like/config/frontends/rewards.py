"""Whether a file's rewards can be computed, checked before anything starts (without a reward function or the
reference answer every reward is 0 and a run "succeeds" learning nothing): RLinf's reward.reward_type and
data.answer_key; ROLL's `rewards:` workers, its estimator (gae needs a critic) and reward-side KL (only with
add_token_level_kl, as in ROLL)."""
from __future__ import annotations

from slime_like.config.frontends.common import get


def roll_rewards(cfg, t):
    """ROLL's RLVR pipeline scores responses only through its `rewards:` workers: without the section no reward
    can be computed (ROLL itself needs it), so it is an error here, before anything starts."""
    if not get(cfg, "rewards") and not t.user_flags & {"--rm-type", "--custom-rm-path"}:
        t.error("rewards", "absent: ROLL computes rewards only through the reward workers of this section, so "
                "every reward would be 0; add one, e.g. rewards: {math_rule: {worker_cls: "
                "roll.pipeline.rlvr.rewards.math_rule_reward_worker.MathRuleRewardWorker}} (scores the data's "
                "ground_truth column) or {worker_cls: my_module.my_reward}", "--rm-type")


def estimator(cfg, t):
    est = get(cfg, "adv_estimator")
    if est == "gae" and not get(cfg, "critic"):
        how = "ROLL's default, the file leaves it out" if ("adv_estimator", "gae") in t.defaults else "the file's"
        t.error("adv_estimator", f"gae ({how}) trains a critic, but the file has no critic section; set "
                "adv_estimator: grpo (or reinforce_plus_plus), or add a critic worker", "--advantage-estimator")


def reward_kl(cfg, t):
    """ROLL puts init_kl_coef x KL into the reward only with add_token_level_kl: true (then --kl-coef here)."""
    coef = t.facts.get("init_kl_coef")
    if t.facts.get("add_token_level_kl"):
        t.current = "init_kl_coef" if coef is not None else "add_token_level_kl"
        t.flag("--kl-coef", 0.2 if coef is None else coef)  # ROLL's default init_kl_coef
        t.current = None
    elif coef is not None:
        t.no_effect.append(("init_kl_coef", coef, "read only with add_token_level_kl: true (as in ROLL)"))


def rlinf_reward(cfg, t):
    """A reward that cannot be computed is an error here, before anything starts: RLinf's math dataset reads the
    reference answer from the column data.answer_key names (RLinf has no default for it), and the reward
    function is reward.reward_type. Without either every reward would be 0 and the run would learn nothing."""
    if get(cfg, "reward.use_reward_model"):
        return  # refused by the schema already
    if not get(cfg, "reward.reward_type") and not t.user_flags & {"--rm-type", "--custom-rm-path"}:
        t.error("reward.reward_type", "absent: no reward function, every reward would be 0; set it (math, "
                "deepscaler, dapo, f1, gpqa, or a module.function of your own)", "--rm-type")
    if not get(cfg, "data.answer_key") and "--label-key" not in t.user_flags:
        t.error("data.answer_key", "absent: the reward compares each response with the reference answer in the "
                "data column data.answer_key names (RLinf has no default for it); without it every reward would "
                "be 0. Name the column, e.g. data.answer_key: answer", "--label-key")

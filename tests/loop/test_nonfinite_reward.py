"""Issue 19, finding 6 end to end: a reward function answering NaN for one prompt in seven no longer poisons
the policy. With --on-nonfinite-reward skip the run completes, those groups are dropped and counted, every
loss and grad norm is finite, and checkpoints (written only from finite weights) are saved."""
import math

import pytest

import train
from conftest import loop_argv
from slime_like.utils.metrics import read_metrics

pytestmark = pytest.mark.slow


def test_nan_rewards_are_skipped_and_the_weights_stay_finite(tiny_ckpt, toy_prompts, tmp_path):
    argv = loop_argv(tiny_ckpt, toy_prompts[0], tmp_path, "--colocate", "--actor-num-gpus-per-node", "1",
                     "--num-rollout", "3", "--custom-rm-path", "nan_rewards.nan_for_one_prompt_in_seven",
                     "--on-nonfinite-reward", "skip", "--save", str(tmp_path / "ckpt"), "--save-interval", "1")
    assert train.main(argv) == 0
    rows = [r for r in read_metrics(str(tmp_path / "metrics.jsonl")) if r["rollout_id"] >= 0]
    assert [r["rollout_id"] for r in rows] == [0, 1, 2]
    assert sum(r["rollout/nonfinite_rewards"] for r in rows) > 0
    for r in rows:
        assert r["rollout/groups_kept"] == 8 and r["actor/nonfinite_steps"] == 0.0, r
        assert math.isfinite(r["actor/grad_norm"]) and math.isfinite(r["actor/loss"]) and \
            math.isfinite(r["rollout/reward"]), r
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"

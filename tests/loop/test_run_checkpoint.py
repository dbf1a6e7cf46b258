"""Issue 19, finding 8: actor and critic resume from the same iteration.

A PPO run saves iterations 0 and 1; the checkpoint dirs are then put in the state a kill between the critic's
save and the actor's leaves (critic at iteration 1 published, actor and run marker still at 0). The resume loads
iteration 0 for both roles: the critic's re-saved iteration 1 holds one optimizer step per rollout, as an
uninterrupted run's does. A new run whose --save has only another run's `_critic` folder is refused before Ray."""
import json
import os
import shutil

import pytest

import train
from conftest import loop_argv
from slime_like.ray.run_checkpoint import MARKER, CheckpointMismatch
from slime_like.utils.metrics import read_metrics

pytestmark = pytest.mark.slow


def _scheduler_steps(iter_dir):
    from megatron.core import dist_checkpointing

    common = dist_checkpointing.load_common_state_dict(iter_dir)
    return common["opt_param_scheduler"]["num_steps"]


def test_kill_between_critic_and_actor_saves_resumes_both_at_one_iteration(tiny_ckpt, toy_prompts, tmp_path):
    ckpt = tmp_path / "ckpt"
    critic = tmp_path / "ckpt_critic"
    common = ["--colocate", "--actor-num-gpus-per-node", "1", "--advantage-estimator", "ppo", "--use-critic",
              "--save", str(ckpt), "--save-interval", "1"]
    assert train.main(loop_argv(tiny_ckpt, toy_prompts[0], tmp_path, *common, "--num-rollout", "2")) == 0
    assert json.loads((ckpt / MARKER).read_text())["iteration"] == 1
    steps_at_1 = _scheduler_steps(str(critic / "iter_0000001"))
    # the state a kill between the critic's save of iteration 1 and the actor's leaves behind
    shutil.rmtree(ckpt / "iter_0000001")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("0")
    (ckpt / MARKER).write_text(json.dumps({"iteration": 0, "roles": {"actor": str(ckpt), "critic": str(critic)}}))
    assert train.main(loop_argv(tiny_ckpt, toy_prompts[0], tmp_path, *common, "--num-rollout", "2",
                                "--load", str(ckpt))) == 0
    rows = [r["rollout_id"] for r in read_metrics(str(tmp_path / "metrics.jsonl")) if r["rollout_id"] >= 0]
    assert rows[-1] == 1 and 2 not in rows, rows   # the resumed run redid rollout 1 only
    # the critic trained rollout 1 once on top of iteration 0, not twice (once more on top of its iteration 1)
    assert _scheduler_steps(str(critic / "iter_0000001")) == steps_at_1
    assert json.loads((ckpt / MARKER).read_text())["iteration"] == 1


def test_a_stray_critic_folder_from_another_run_is_refused(tiny_ckpt, toy_prompts, tmp_path):
    stray = tmp_path / "ckpt_critic" / "iter_0000003"
    stray.mkdir(parents=True)
    (stray / "metadata.json").write_text("{}")
    (stray / "PUBLISHED").write_text("")
    (tmp_path / "ckpt_critic" / "latest_checkpointed_iteration.txt").write_text("3")
    argv = loop_argv(tiny_ckpt, toy_prompts[0], tmp_path, "--colocate", "--actor-num-gpus-per-node", "1",
                     "--advantage-estimator", "ppo", "--use-critic", "--num-rollout", "1",
                     "--save", str(tmp_path / "ckpt"))
    with pytest.raises(CheckpointMismatch, match="another run"):
        train.main(argv)

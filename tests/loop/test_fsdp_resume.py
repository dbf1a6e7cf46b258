"""An FSDP PPO run resumes every role from the run's common iteration (the driver passes it to the trainer build).

A run saves iterations 0 and 1 of actor and critic; the checkpoint dirs are then left with the actor one iteration
ahead of its critic and no run marker (a critic's save of iteration 1 lost, or a layout of an older run). The
driver resumes both roles from iteration 0, the newest both hold; before, the FSDP actor loaded its own latest
(1), the critic 0, and the run stopped with "the actor resumed from iteration 1 but the critic from 0"."""
import json
import shutil

import pytest

import train
from conftest import loop_argv
from slime_like.ray.run_checkpoint import MARKER

pytestmark = pytest.mark.slow


def _rollout_ids(run_dir) -> list:
    """Every line's rollout id, in the order written (read_metrics would merge a redone rollout's two lines)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [i for i in (json.loads(line)["rollout_id"] for line in lines if line.strip()) if i >= 0]


def _scheduler_steps(iter_dir) -> int:
    return json.loads((iter_dir / "fsdp_meta.json").read_text())["scheduler"]["num_steps"]


def test_fsdp_ppo_resumes_actor_and_critic_from_their_common_iteration(tiny_ckpt, toy_prompts, tmp_path):
    ckpt, critic = tmp_path / "ckpt", tmp_path / "ckpt_critic"
    argv = loop_argv(tiny_ckpt, toy_prompts[0], tmp_path, "--train-backend", "fsdp", "--colocate",
                     "--actor-num-gpus-per-node", "1", "--advantage-estimator", "ppo", "--use-critic",
                     "--save", str(ckpt), "--save-interval", "1", "--num-rollout", "2")
    assert train.main(argv) == 0
    first = len(_rollout_ids(tmp_path))
    actor_steps_at_1 = _scheduler_steps(ckpt / "iter_0000001")
    critic_steps_at_1 = _scheduler_steps(critic / "iter_0000001")
    # the actor one iteration ahead of its critic, no run marker
    shutil.rmtree(critic / "iter_0000001")
    (critic / "latest_checkpointed_iteration.txt").write_text("0")
    (ckpt / MARKER).unlink()
    assert train.main([*argv, "--load", str(ckpt)]) == 0
    resumed = _rollout_ids(tmp_path)[first:]
    assert resumed and set(resumed) == {1}, resumed  # the resumed run redid rollout 1 only, for both roles
    # both roles trained rollout 1 once on top of iteration 0 (the actor not twice, on top of its own iteration 1)
    assert _scheduler_steps(ckpt / "iter_0000001") == actor_steps_at_1
    assert _scheduler_steps(critic / "iter_0000001") == critic_steps_at_1
    assert json.loads((ckpt / MARKER).read_text())["iteration"] == 1

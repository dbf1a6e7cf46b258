"""End-to-end fixtures: a tiny checkpoint, the toy task's prompts, and the common train.py flags."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
# The driver hands PYTHONPATH to every Ray actor, so the rollout actor can import toy_task.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [HERE, os.environ.get("PYTHONPATH", "")] if p)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

import toy_task  # noqa: E402


@pytest.fixture(scope="session")
def toy_prompts(tmp_path_factory):
    d = tmp_path_factory.mktemp("toy")
    return toy_task.write_prompts(str(d / "prompts.jsonl")), toy_task.write_prompts(str(d / "eval.jsonl"), n=16, seed=1)


def loop_argv(ckpt, prompts, run_dir, *extra):
    """train.py flags for a small GRPO run on one declared GPU slot, colocated unless `extra` says otherwise."""
    return ["--hf-checkpoint", ckpt, "--prompt-data", prompts, "--input-key", "prompt", "--label-key", "label",
            "--custom-rm-path", "toy_task.digit_share", "--rollout-batch-size", "8", "--n-samples-per-prompt", "8",
            "--rollout-max-response-len", str(toy_task.MAX_RESPONSE_LEN), "--rollout-temperature", "1",
            "--lr", "1e-2", "--lr-decay-style", "constant", "--micro-batch-size", "64", "--num-gpus-per-node", "4",
            "--run-dir", str(run_dir), *extra]


def assert_fully_async_accounting(dumps: str, ckpt_dir, n: int, staleness: int = 1) -> None:
    """A fully async run's n rollouts (--save-debug-rollout-data dumps): every trained sample at most `staleness`
    policy versions behind its step (from the versions the engine reported), no prompt trained twice or lost (the
    final checkpoint puts the prompts still generating back in its buffer)."""
    import json

    trained = []
    for step in range(n):
        samples = json.load(open(dumps.format(rollout_id=step)))["samples"]
        for s in samples:
            versions = [int(v) for v in s["weight_versions"]]
            assert versions and 0 <= step - min(versions) <= staleness, (step, s["weight_versions"])
        trained += sorted({s["group_index"] for s in samples})
    state = json.load(open(os.path.join(ckpt_dir, "rollout_state", f"rollout_{n - 1:07d}.json")))["data_source"]
    pending = [g[0]["group_index"] for g in state["buffer"]]
    assert len(trained) == len(set(trained)) == n * 8
    assert sorted(trained + pending) == list(range(state["next_group_index"]))

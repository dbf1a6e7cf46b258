"""train_async.py in fully async mode for real (Ray, CPU engine, megatron-core, weight pushes while generating):
the toy task learns, no trained sample is more than --max-staleness versions behind (from the versions the
engine reported), and every prompt taken from the data is trained once or saved back for the next run."""
import pytest

import train
import train_async
from conftest import assert_fully_async_accounting, loop_argv
from slime_like.utils.metrics import read_metrics

pytestmark = pytest.mark.slow
FN = "slime.rollout.fully_async_rollout.generate_rollout_fully_async"


def test_fully_async_learns_within_the_staleness_bound(tiny_ckpt, toy_prompts, tmp_path):
    n = 8
    dumps = str(tmp_path / "rollout_{rollout_id}.json")
    argv = loop_argv(tiny_ckpt, toy_prompts[0], tmp_path, "--actor-num-gpus-per-node", "1", "--rollout-num-gpus", "1",
                     "--num-rollout", str(n), "--rollout-function-path", FN, "--max-staleness", "1", "--use-tis",
                     "--save-debug-rollout-data", dumps, "--save", str(tmp_path / "ckpt"), "--save-interval", "100",
                     "--eval-prompt-data", "toy", toy_prompts[1], "--eval-interval", "4",
                     "--n-samples-per-eval-prompt", "1")
    assert train_async.main(argv) == 0
    lines = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [r["rollout_id"] for r in lines if "eval/toy/reward" in r] == [-1, 3, 7]   # eval beside the worker
    rows = [r for r in lines if r["rollout_id"] >= 0]
    assert [r["rollout_id"] for r in rows] == list(range(n))
    assert_fully_async_accounting(dumps, tmp_path / "ckpt", n)
    assert all(r["weights/version"] == step + 1 and r["rollout/staleness/max"] <= 1 for step, r in enumerate(rows))
    # the engines did generate ahead of the trainer: some batches came from the previous policy
    assert max(r["rollout/staleness/max"] for r in rows) == 1
    first, last = (sum(r["rollout/reward"] for r in rs) / 2 for rs in (rows[:2], rows[-2:]))
    assert last > first + 0.1, (first, last)


def test_train_py_refuses_the_fully_async_rollout(tiny_ckpt, toy_prompts, tmp_path, capsys):
    argv = loop_argv(tiny_ckpt, toy_prompts[0], tmp_path, "--actor-num-gpus-per-node", "1", "--rollout-num-gpus", "1",
                     "--num-rollout", "1", "--rollout-function-path", FN)
    assert train.main(argv) == 2
    assert "train_async.py" in capsys.readouterr().err

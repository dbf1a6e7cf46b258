"""One definition of what a run achieved (issue 32: one demo run read 2.52x in the console and 2.70x in the PNG's
title): the run's summary block, the learning curve's title and the demo's verdict state the same change."""
import io

import pytest

from slime_like.args import make_args
from slime_like.demo.summary import verdict
from slime_like.ray.run_summary import summary_block
from slime_like.utils.metrics import MetricsLogger, read_metrics
from slime_like.utils.plot import curve_title
from slime_like.utils.run_outcome import eval_change

# the eval before the first update, then five evals: the last three average 0.45
EVALS = {-1: 0.15, 9: 0.30, 19: 0.35, 29: 0.40, 39: 0.50, 49: 0.45}


def _write(run_dir, evals=EVALS, rollouts=50):
    with MetricsLogger(make_args(run_dir=str(run_dir)), stream=io.StringIO()) as lg:
        for i in range(-1, rollouts):
            metrics = {} if i < 0 else {"rollout/reward": 0.1 + 0.01 * i}
            if i in evals:
                metrics["eval/arith/accuracy"] = evals[i]
            lg.log(i, metrics)


def test_the_change_is_the_mean_of_the_last_three_evals_over_the_first(tmp_path):
    _write(tmp_path)
    change = eval_change(read_metrics(str(tmp_path)))
    assert change.key == "eval/arith/accuracy" and change.first == 0.15 and change.first_id == -1
    assert change.tail_mean == pytest.approx(0.45) and change.tail_n == 3 and change.ratio == pytest.approx(3.0)
    assert (change.last, change.best, change.best_id) == (0.45, 0.50, 39)  # the last eval alone would say 3.00x too
    text = "0.150 (before the first update) -> 0.450 (mean of the last 3 evals, 3.00x)"
    assert change.describe() == text
    assert curve_title(str(tmp_path), read_metrics(str(tmp_path))).endswith(f"eval/arith/accuracy: {text}")
    args = make_args(run_dir=str(tmp_path), num_rollout=50)
    block = summary_block(args, 0, 312.0)
    assert block.startswith("[slime_like] run finished: 50 rollouts (0-49) in 5 min 12 s")
    assert f"eval/arith/accuracy : {text}" in block and "checkpoints : none (no --save)" in block
    assert "train reward: 0.100 (rollout 0) -> 0.580 (mean of the last 3 rollouts)" in block
    assert verdict(str(tmp_path)) == f"[demo] RL doubled the held-out accuracy: {text}; best 0.500 after rollout 39"


def test_fewer_evals_and_a_zero_start(tmp_path):
    _write(tmp_path / "one", {-1: 0.2}, rollouts=3)
    one = eval_change(read_metrics(str(tmp_path / "one")))
    assert one.tail_n == 0 and one.describe() == "0.200 (before the first update; one eval only)"
    assert curve_title(str(tmp_path / "one"), read_metrics(str(tmp_path / "one"))) == "Learning curve: one"
    assert verdict(str(tmp_path / "one")).startswith("[demo] only the eval before the first update ran (0.200)")
    _write(tmp_path / "zero", {-1: 0.0, 1: 0.1}, rollouts=3)
    zero = eval_change(read_metrics(str(tmp_path / "zero")))
    assert zero.ratio is None and zero.describe() == "0.000 (before the first update) -> 0.100 (mean of the last eval)"
    _write(tmp_path / "none", {}, rollouts=2)
    assert eval_change(read_metrics(str(tmp_path / "none"))) is None
    assert "eval        : none" in summary_block(make_args(run_dir=str(tmp_path / "none"), num_rollout=2), 0, 5.0)

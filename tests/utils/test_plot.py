"""The learning-curve plot: a real PNG from a metrics.jsonl written by MetricsLogger, via the CLI."""
import io
import math
import os
import subprocess
import sys

import pytest

from slime_like.args import make_args
from slime_like.utils.metrics import MetricsLogger
from slime_like.utils.plot import curve_keys, eval_series, plot_learning_curve
from slime_like.utils.metrics import read_metrics


def _write_run(run_dir, n=30):
    with MetricsLogger(make_args(run_dir=str(run_dir)), stream=io.StringIO()) as lg:
        for i in range(n):
            if i % 5 == 0:
                lg.log(i, {"eval/arith/accuracy": 0.15 + 0.01 * i, "eval/arith/reward": 0.1 + 0.01 * i})
            lg.log(i, {"rollout/reward_mean": 0.08 + 0.002 * i + 0.02 * math.sin(i), "actor/loss": 0.0})


def test_plot_cli_writes_a_real_png(tmp_path):
    from PIL import Image

    _write_run(tmp_path)
    env = dict(os.environ, MPLBACKEND="")  # the module must select Agg itself
    out = subprocess.run([sys.executable, "-m", "slime_like.utils.plot", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    png = tmp_path / "learning_curve.png"
    assert out.stdout.strip() == str(png)
    assert png.stat().st_size > 20_000                     # axes, three curves, legend: not an empty canvas
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size == (960, 576)
        colors = im.convert("RGB").getcolors(maxcolors=1_000_000)
        assert len(colors) > 50                             # anti-aliased lines and text, not a blank image


def test_curve_keys_and_errors(tmp_path):
    _write_run(tmp_path, n=6)
    train, evals = curve_keys(read_metrics(str(tmp_path)))
    assert train == "rollout/reward_mean"
    assert evals == ["eval/arith/accuracy", "eval/arith/reward"]
    empty = tmp_path / "empty"
    with MetricsLogger(make_args(run_dir=str(empty)), stream=io.StringIO()) as lg:
        lg.log(0, {"actor/loss": 1.0})
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_learning_curve(str(empty))
    with pytest.raises(FileNotFoundError, match="--run-dir"):
        plot_learning_curve(str(tmp_path / "missing"))


def test_identical_reward_and_accuracy_drawn_once(tmp_path):
    with MetricsLogger(make_args(run_dir=str(tmp_path)), stream=io.StringIO()) as lg:
        for i in (-1, 2, 4):
            lg.log(i, {"eval/a/accuracy": 0.1 * i, "eval/a/reward": 0.1 * i,          # 0/1 reward
                       "eval/b/accuracy": 0.2, "eval/b/reward": 0.5})                  # graded reward
    records = read_metrics(str(tmp_path))
    series = eval_series(records, curve_keys(records)[1])
    assert [label for label, _, _ in series] == ["eval/a/accuracy (= reward)", "eval/b/accuracy", "eval/b/reward"]
    assert series[0][1] == [-1, 2, 4]
    assert plot_learning_curve(str(tmp_path)).endswith("learning_curve.png")


def test_compare_plots_one_metric_of_several_runs(tmp_path):
    from PIL import Image

    for name in ("a", "b"):
        _write_run(tmp_path / name, n=11)
    out = tmp_path / "both.png"
    done = subprocess.run([sys.executable, "-m", "slime_like.utils.plot", "--compare", f"first={tmp_path / 'a'}",
                           f"second={tmp_path / 'b'}", "--line", "teacher=0.61", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with Image.open(out) as im:
        assert im.format == "PNG" and len(im.convert("RGB").getcolors(maxcolors=1_000_000)) > 50
    bad = subprocess.run([sys.executable, "-m", "slime_like.utils.plot", "--compare", str(tmp_path / "a"),
                          "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "expected LABEL=VALUE" in bad.stderr
    from slime_like.utils.plot import plot_comparison

    with pytest.raises(ValueError, match="has no eval/other/accuracy"):
        plot_comparison({"a": str(tmp_path / "a")}, "eval/other/accuracy", str(out))

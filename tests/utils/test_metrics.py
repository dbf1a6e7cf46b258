"""MetricsLogger: the JSONL record, the console line, append on resume, TensorBoard and wandb (offline) output."""
import io
import json
import os

import pytest

from slime_like.args import make_args
from slime_like.utils.metrics import MetricsLogger, flatten_metrics, format_console_line, read_metrics


def _args(run_dir, **kw):
    return make_args(run_dir=str(run_dir), **kw)


def _lines(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_jsonl_lines_keys_and_flush(tmp_path):
    console = io.StringIO()
    logger = MetricsLogger(_args(tmp_path), stream=console)
    logger.log(0, {"eval": {"arith": {"accuracy": 0.16}}})
    logger.log(1, {"rollout/reward_mean": 0.25, "actor/loss": -0.02, "time/generate": 1.5})
    # flushed per line: readable before close()
    lines = _lines(tmp_path)
    assert [list(r)[0] for r in lines] == ["rollout_id", "rollout_id"]
    assert lines[0] == {"rollout_id": 0, "eval/arith/accuracy": 0.16}
    assert lines[1] == {"rollout_id": 1, "rollout/reward_mean": 0.25, "actor/loss": -0.02, "time/generate": 1.5}
    logger.close()


def test_append_on_resume_and_merge(tmp_path):
    with MetricsLogger(_args(tmp_path), stream=io.StringIO()) as logger:
        for i in range(3):
            logger.log(i, {"rollout/reward_mean": 0.1 * i})
    # a crashed writer left half a line behind; the resumed run cuts it and appends
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"rollout_id": 3, "rollout/rew')
    with MetricsLogger(_args(tmp_path), stream=io.StringIO()) as logger:
        logger.log(2, {"rollout/reward_mean": 0.5})        # resumed from the checkpoint after rollout 1
        logger.log(2, {"eval/arith/accuracy": 0.3})
        logger.log(3, {"rollout/reward_mean": 0.6})
    lines = _lines(tmp_path)
    assert [r["rollout_id"] for r in lines] == [0, 1, 2, 2, 2, 3]
    merged = read_metrics(str(tmp_path))
    assert [r["rollout_id"] for r in merged] == [0, 1, 2, 3]
    assert merged[2] == {"rollout_id": 2, "rollout/reward_mean": 0.5, "eval/arith/accuracy": 0.3}


def test_values_are_normalised_and_bad_input_is_named(tmp_path):
    torch = pytest.importorskip("torch")
    flat = flatten_metrics({"actor": {"loss": torch.tensor(0.5), "kl": float("nan")}, "perf/tokens_per_s": 10})
    assert flat == {"actor/loss": 0.5, "actor/kl": None, "perf/tokens_per_s": 10.0}
    with pytest.raises(TypeError, match="actor/lr"):
        flatten_metrics({"actor/lr": "fast"})
    with pytest.raises(ValueError, match="--run-dir"):
        MetricsLogger(make_args(run_dir=None))
    with MetricsLogger(_args(tmp_path), stream=io.StringIO()) as logger:
        with pytest.raises(TypeError, match="rollout_id"):
            logger.log("3", {"a/b": 1})
        logger.log(0, {"actor/kl": float("inf")})
    assert _lines(tmp_path) == [{"rollout_id": 0, "actor/kl": None}]


def test_console_line_content_and_order(tmp_path):
    metrics = {"eval/arith/accuracy": 0.38, "time/train": 0.8, "time/generate": 1.25, "actor/lr": 5e-5,
               "actor/grad_norm": 0.41, "actor/clipfrac": 0.0, "actor/entropy": 1.234, "actor/kl": 0.0012,
               "rollout/truncated_ratio": 0.05, "rollout/response_len_mean": 4.25, "rollout/reward_mean": 0.453,
               "perf/tokens_per_s": 532.4, "time/update_weights": 0.1, "custom/thing": 3.0}
    line = format_console_line(7, metrics)
    assert line == ("rollout 7 | reward 0.453 | len 4.2 | trunc 0.05 | kl 0.0012 | entropy 1.234 | clipfrac 0.000 | "
                    "grad_norm 0.410 | lr 5.00e-05 | tok/s 532 | time generate 1.25s train 0.80s update_weights 0.10s"
                    " | eval/arith/accuracy 0.380")
    console = io.StringIO()
    with MetricsLogger(_args(tmp_path, log_interval=100), stream=console) as logger:   # Megatron's per-step flag
        logger.log(1, {"rollout/reward_mean": 0.1})
        logger.log(2, {"eval/arith/accuracy": 0.2, "time/eval": 0.5})
    printed = console.getvalue().splitlines()
    assert printed == ["rollout 1 | reward 0.100", "rollout 2 | time eval 0.50s | eval/arith/accuracy 0.200"]
    assert len(_lines(tmp_path)) == 2


def test_console_line_with_the_loops_key_names():
    """The names rollout/controller.py, rollout/eval.py and the role-prefixed trainer metrics use."""
    metrics = {"rollout/reward": 0.12, "rollout/response_len/mean": 3.6, "rollout/response_len/max": 5,
               "rollout/truncated_ratio": 0.0, "rollout/tokens_per_s": 850.2, "actor/pg_loss": 0.01,
               "actor/loss": 0.02, "actor/kl_loss": 0.003, "actor/entropy": 0.7, "actor/clipfrac": 0.0,
               "actor/grad_norm": 0.45, "actor/lr": 5e-5, "critic/loss": 0.2, "critic/lr": 1e-5,
               "eval/arith/reward": 0.3, "eval/arith/accuracy": 0.3, "eval/arith/pass@1": 0.3,
               "eval/arith/response_len/mean": 3.5}
    assert format_console_line(4, metrics) == (
        "rollout 4 | reward 0.120 | len 3.6 | trunc 0.00 | loss 0.0200 | kl 0.0030 | entropy 0.700 | "
        "clipfrac 0.000 | grad_norm 0.450 | lr 5.00e-05 | v_loss 0.2000 | v_lr 1.00e-05 | tok/s 850 | "
        "eval/arith/accuracy 0.300 | eval/arith/reward 0.300")
    # a custom eval without accuracy / reward still shows what it has
    assert format_console_line(5, {"eval/x/f1": 0.5}) == "rollout 5 | eval/x/f1 0.500"


def test_tensorboard_event_file_readable(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb_dir = tmp_path / "tb"
    with MetricsLogger(_args(tmp_path, use_tensorboard=True, tensorboard_dir=str(tb_dir)), stream=io.StringIO()) as lg:
        for i in range(3):
            lg.log(i, {"rollout/reward_mean": 0.1 * i, "actor/kl": float("nan") if i == 1 else 0.01})
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    rewards = acc.Scalars("rollout/reward_mean")
    assert [e.step for e in rewards] == [0, 1, 2]
    assert [round(e.value, 6) for e in rewards] == [0.0, 0.1, 0.2]
    assert [e.step for e in acc.Scalars("actor/kl")] == [0, 2]      # NaN is not sent to the tracker


def test_tensorboard_default_dir(tmp_path):
    pytest.importorskip("tensorboard")
    with MetricsLogger(_args(tmp_path, use_tensorboard=True), stream=io.StringIO()) as lg:
        lg.log(0, {"rollout/reward_mean": 1.0})
    files = os.listdir(tmp_path / "tensorboard")
    assert any(f.startswith("events.out.tfevents") for f in files)


def test_wandb_offline_run_dir(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    args = _args(tmp_path, use_wandb=True, wandb_mode="offline", wandb_project="slime_like_test",
                 wandb_group="unit", wandb_dir=str(tmp_path / "wb"), lr=5e-5)
    with MetricsLogger(args, stream=io.StringIO()) as lg:
        for i in range(2):
            lg.log(i, {"rollout/reward_mean": 0.5 + i})
    runs = [d for d in os.listdir(tmp_path / "wb" / "wandb") if d.startswith("offline-run-")]
    assert len(runs) == 1
    run_files = os.listdir(tmp_path / "wb" / "wandb" / runs[0])
    assert any(f.endswith(".wandb") for f in run_files)
    assert _lines(tmp_path)[1]["rollout/reward_mean"] == 1.5


def test_wandb_bad_mode_is_named(tmp_path):
    pytest.importorskip("wandb")
    with pytest.raises(ValueError, match="--wandb-mode 'ofline'"):
        MetricsLogger(_args(tmp_path, use_wandb=True, wandb_mode="ofline"))


def test_wandb_missing_is_a_clear_error(tmp_path):
    """Run in a child whose import of wandb fails, as on a machine without the extra."""
    import subprocess
    import sys
    code = ("import sys; sys.modules['wandb'] = None\n"
            "from slime_like.args import make_args\n"
            "from slime_like.utils.metrics import MetricsLogger\n"
            "try:\n    MetricsLogger(make_args(run_dir=sys.argv[1], use_wandb=True))\n"
            "except ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert "pip install wandb" in out.stdout, out.stderr
    assert not os.path.exists(tmp_path / "metrics.jsonl")          # failed before touching the run


def test_with_parse_args_flags(tmp_path, tiny_ckpt, monkeypatch):
    """The real flags from slime_like.args.parse_args: run dir, tensorboard sub-dirs, wandb offline dir."""
    pytest.importorskip("wandb")
    from slime_like.args import parse_args

    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    args = parse_args(["--hf-checkpoint", tiny_ckpt, "--rollout-batch-size", "4", "--num-rollout", "2", "--colocate",
                       "--actor-num-gpus-per-node", "1", "--run-dir", str(run_dir), "--use-tensorboard",
                       "--tb-project-name", "proj", "--tb-experiment-name", "exp", "--use-wandb",
                       "--wandb-mode", "offline", "--wandb-group", "g1"], exit_on_error=False)
    with MetricsLogger(args, stream=io.StringIO()) as lg:
        lg.log(0, {"rollout/reward_mean": 0.25})
    assert _lines(run_dir) == [{"rollout_id": 0, "rollout/reward_mean": 0.25}]
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(run_dir / "tensorboard" / "proj" / "exp"))
    assert [d for d in os.listdir(run_dir / "wandb" / "wandb") if d.startswith("offline-run-")]

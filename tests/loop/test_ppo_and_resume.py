"""PPO with a critic and a per-role YAML overlay; stopping a run with SIGTERM and resuming it exactly."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import yaml

import train
from conftest import REPO, loop_argv
from slime_like.utils.metrics import read_metrics

pytestmark = pytest.mark.slow


def test_ppo_with_critic_uses_the_yaml_overlay_lr(tiny_ckpt, toy_prompts, tmp_path, capfd):
    cfg = tmp_path / "ppo.yaml"
    cfg.write_text("megatron:\n  - name: default\n    role: critic\n    overrides:\n      lr: 3e-4\n")
    argv = loop_argv(tiny_ckpt, toy_prompts[0], tmp_path, "--colocate", "--actor-num-gpus-per-node", "1",
                     "--num-rollout", "2", "--advantage-estimator", "ppo", "--use-critic",
                     "--megatron-config-path", str(cfg), "--save", str(tmp_path / "ckpt"), "--save-interval", "5")
    assert train.main(argv) == 0
    # the interval (5) never came, but the last rollout (1) is saved for both roles, as slime does
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    assert (tmp_path / "ckpt_critic" / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    # the run says what it ran: the critic's lr from the YAML entry, in RUN_DIR/config.yaml
    config = yaml.safe_load(open(tmp_path / "config.yaml"))
    assert config["roles"]["critic"]["lr"] == {"value": 3e-4, "source": f"YAML {cfg} megatron[0], over the CLI's --lr 0.01"}
    rows = [r for r in read_metrics(str(tmp_path / "metrics.jsonl")) if r["rollout_id"] >= 0]
    assert len(rows) == 2
    for r in rows:
        assert r["actor/lr"] == pytest.approx(1e-2) and r["critic/lr"] == pytest.approx(3e-4), r
        assert "critic/value_loss" in r and r["critic/grad_norm"] > 0
    # the console (issue 32): two trainers, yet no library notice a user cannot act on; one line instead; and the
    # run ends with its summary block, both roles' checkpoints named
    out, err = capfd.readouterr()
    console = out + err
    for notice in ("Transformer Engine and Apex are not installed", "Apex is not installed", "full scope is deprecated",
                   "Rerun State Machine", "RerunStateMachine", "deduplicates logs", "Started a local Ray instance"):
        assert notice not in console, notice
    assert console.count("TransformerEngine and Apex not installed: megatron-core uses its PyTorch") == 1
    summary = out.split("[slime_like] run finished: 2 rollouts (0-1) in ", 1)[1]
    assert f"actor {tmp_path / 'ckpt'}, critic {tmp_path / 'ckpt_critic'} (latest: rollout 1)" in summary
    assert f"metrics     : {tmp_path / 'metrics.jsonl'}" in summary and "train reward: " in summary


def _cmdline(p) -> list:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _running(p) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _prompts_by_rollout(debug_dir):
    from slime_like.utils.json_dump import read_json

    out = {}
    for name in sorted(n for n in os.listdir(debug_dir) if n.endswith(".pt")):  # not a write cut by SIGTERM
        d = read_json(os.path.join(debug_dir, name))
        out[d["rollout_id"]] = [s["prompt"] for s in d["samples"]]
    return out


def test_sigterm_then_resume_continues_the_prompt_sequence(tiny_ckpt, toy_prompts, tmp_path):
    ckpt, debug = tmp_path / "ckpt", tmp_path / "debug"
    common = loop_argv(tiny_ckpt, toy_prompts[0], tmp_path, "--colocate", "--actor-num-gpus-per-node", "1",
                       "--rollout-shuffle", "--save", str(ckpt), "--save-interval", "1",
                       "--save-debug-rollout-data", str(debug / "rollout_{rollout_id}.pt"))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # 1) a long run, stopped by SIGTERM once two rollouts are checkpointed (a rollout of this toy task takes
    # well under a second now: the run must be long enough that the signal lands before its end)
    n = 16
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "train.py"), *common, "--num-rollout", str(n)],
                            env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = ckpt / "latest_checkpointed_iteration.txt"
    deadline = time.time() + 400
    while not (marker.exists() and int(marker.read_text().strip() or -1) >= 1):  # a fast run may pass 1 between polls
        assert proc.poll() is None and time.time() < deadline, "first run ended or stalled before rollout 1 was saved"
        time.sleep(0.1)
    # everything the run started: its Ray instance (GCS, raylet, workers) and the engine server below them
    tree = psutil.Process(proc.pid).children(recursive=True)
    assert any("cpu_engine" in " ".join(_cmdline(p)) for p in tree), "the engine server should be running"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 143  # 128 + SIGTERM, after the clean stop (our handler, not Ray's)
    # a clean stop leaves none of them behind
    deadline = time.time() + 60
    while alive := [p for p in tree if _running(p)]:
        assert time.time() < deadline, f"still alive after SIGTERM: {[' '.join(_cmdline(p))[:80] for p in alive]}"
        time.sleep(1)
    # 2) resume in-process and finish the run
    stopped_at = int(marker.read_text())
    assert stopped_at < n - 1, "the first run finished before SIGTERM reached it"
    assert train.main([*common, "--num-rollout", str(n), "--load", str(ckpt)]) == 0
    rows = [r for r in read_metrics(str(tmp_path / "metrics.jsonl")) if r["rollout_id"] >= 0]
    assert [r["rollout_id"] for r in rows][-(n - 1 - stopped_at):] == list(range(stopped_at + 1, n))
    # 3) the prompt sequence is the data source's own: no prompt repeated or skipped across the restart
    from slime_like.args import parse_args
    from slime_like.rollout.controller import load_tokenizer
    from slime_like.rollout.data_source import DataSource

    args = parse_args([*common, "--num-rollout", str(n)], exit_on_error=False)
    ds = DataSource(args, load_tokenizer(args))
    expected = [[s.prompt for g in ds.get_samples(args.rollout_batch_size) for s in g] for _ in range(n)]
    got = _prompts_by_rollout(debug)
    assert [got[i] for i in range(n)] == expected

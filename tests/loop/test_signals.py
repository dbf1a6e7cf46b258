"""SIGTERM and SIGINT in every phase of a real run (train.py on the tiny model, a private Ray, a CPU engine):
the driver stops everything it started, prints one line and exits 143 / 130 (128 + the signal), never a Python
traceback (before the fix: exit 1 and Ray's KeyboardInterrupt traceback mid-rollout; exit 134 from Ray's C++
failure handler once ours was installed before Ray). A hook of tests/loop/signal_phases.py holds the run in the
phase and writes RUN_DIR/phase_<name>; the signal is sent once that file exists, so it lands in that phase."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

import train
from conftest import REPO, loop_argv

pytestmark = pytest.mark.slow

PHASE_FLAGS = {
    "startup": ["--custom-megatron-init-path", "signal_phases.startup"],
    "rollout": ["--custom-rm-path", "signal_phases.rollout"],   # replaces loop_argv's reward (the last one wins)
    "train": ["--custom-megatron-before-train-step-hook-path", "signal_phases.train"],
    "push": ["--custom-megatron-before-train-step-hook-path", "signal_phases.push"],
    "save": ["--custom-megatron-before-train-step-hook-path", "signal_phases.save"],
}


def _argv(tiny_ckpt, prompts, tmp_path, phase):
    return loop_argv(tiny_ckpt, prompts, tmp_path, "--colocate", "--actor-num-gpus-per-node", "1", "--num-rollout", "3",
                     "--save", str(tmp_path / "ckpt"), "--save-interval", "1", *PHASE_FLAGS[phase])


def _cmdline(p) -> list:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _alive(p) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _stop_in_phase(argv, run_dir, phase, sig):
    """Start train.py, wait until the hook holds it in `phase`, send `sig`; (exit status, stderr, the process tree
    the run had when the signal was sent)."""
    err_path = run_dir / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, os.path.join(REPO, "train.py"), *argv], cwd=REPO,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.DEVNULL, stderr=err)
    marker = run_dir / f"phase_{phase}"
    deadline = time.time() + 600
    while not marker.exists():
        assert proc.poll() is None, f"train.py ended (rc {proc.returncode}) before reaching {phase}: " \
                                    f"{err_path.read_text()[-3000:]}"
        assert time.time() < deadline, f"no {phase} phase within 600 s"
        time.sleep(0.2)
    tree = psutil.Process(proc.pid).children(recursive=True)
    engines = [p for p in tree if "cpu_engine" in " ".join(_cmdline(p))]
    proc.send_signal(sig)
    rc = proc.wait(timeout=180)
    return rc, err_path.read_text(), tree, engines


@pytest.mark.parametrize("phase,sig", [("startup", signal.SIGINT), ("rollout", signal.SIGTERM),
                                       ("rollout", signal.SIGINT), ("train", signal.SIGINT),
                                       ("push", signal.SIGTERM), ("save", signal.SIGTERM)],
                         ids=["startup-INT", "rollout-TERM", "rollout-INT", "train-INT", "push-TERM", "save-TERM"])
def test_signal_stops_the_run_cleanly(tiny_ckpt, toy_prompts, tmp_path, phase, sig):
    rc, err, tree, engines = _stop_in_phase(_argv(tiny_ckpt, toy_prompts[0], tmp_path, phase), tmp_path, phase, sig)
    name = signal.Signals(sig).name
    assert rc == 128 + sig, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and f"*** {name} received" not in err, err[-3000:]
    ours = [line for line in err.splitlines() if line.startswith("[slime_like] stopped by")]
    assert ours == [f"[slime_like] stopped by {name}: everything the run started is shut down; exit status "
                    f"{128 + sig}"], err[-3000:]
    assert engines or phase == "startup"  # the engine server was up when the signal came (and is gone below)
    deadline = time.time() + 60
    while alive := [p for p in tree if _alive(p)]:
        assert time.time() < deadline, f"left running: {[' '.join(_cmdline(p))[:80] for p in alive]}"
        time.sleep(0.5)
    marker = tmp_path / "ckpt" / "latest_checkpointed_iteration.txt"
    # rollout 1 trains, saves, then pushes: a run stopped in its training or saving has rollout 0's checkpoint as
    # the complete one, a run stopped in its push rollout 1's
    expected = {"startup": None, "rollout": "0", "train": "0", "save": "0", "push": "1"}[phase]
    assert (marker.read_text().strip() if marker.exists() else None) == expected
    if phase == "save":  # the interrupted save left the complete checkpoint usable: the run resumes from it
        resume = loop_argv(tiny_ckpt, toy_prompts[0], tmp_path, "--colocate", "--actor-num-gpus-per-node", "1",
                           "--num-rollout", "3", "--save", str(tmp_path / "ckpt"), "--save-interval", "1",
                           "--load", str(tmp_path / "ckpt"))
        assert train.main(resume) == 0
        assert marker.read_text().strip() == "2"

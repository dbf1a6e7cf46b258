"""Fixtures for the configuration tests: a placeholder HF checkpoint dir (config.json only; no weights needed), and a
machine that shows a GPU."""
import os

import pytest

from cfg_helpers import write_hf_dir


@pytest.fixture
def hf_dir(tmp_path):
    return write_hf_dir(tmp_path / "hf")


@pytest.fixture
def base(hf_dir):
    """A minimal valid colocated run on 2 GPU slots; tests append/replace flags."""
    return ["--hf-checkpoint", hf_dir, "--rollout-batch-size", "4", "--n-samples-per-prompt", "2",
            "--num-rollout", "2", "--colocate", "--actor-num-gpus-per-node", "2", "--num-gpus-per-node", "2"]


@pytest.fixture
def gpu_visible(tmp_path, monkeypatch):
    """A machine that shows an NVIDIA GPU: a stand-in nvidia-smi on PATH, CUDA_VISIBLE_DEVICES set."""
    bin_dir = tmp_path / "gpu_bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")


@pytest.fixture
def gpu_machine(gpu_visible, tmp_path, monkeypatch):
    """A GPU machine (gpu_visible) with SGLang installed (a stand-in package the configuration layer finds; its
    flags are then taken as SGLang's generic passthrough, as when SLIME_LIKE_SGLANG_PASSTHROUGH=generic): the
    recipes are GPU plans, so what the launch would refuse only for want of a GPU or of SGLang here (FP8 training,
    the CPU engine standing in) is not counted against them. Nothing here starts an engine or imports SGLang."""
    site = tmp_path / "gpu_site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("SLIME_LIKE_SGLANG_PASSTHROUGH", "generic")

"""Fixtures for the configuration tests: a placeholder HF checkpoint dir (config.json only; no weights needed)."""
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


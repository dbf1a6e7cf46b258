"""Engine-test fixtures: real CPU engine servers in subprocesses on the tiny checkpoint."""
import os

import pytest

from engine_helpers import free_port, start  # noqa: F401

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def engine(tiny_ckpt, tmp_path_factory):
    """One engine for generation tests (weights never change on it)."""
    proc = start(tiny_ckpt, tmp_path_factory, index=0)
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def tiny_ckpt_b(tmp_path_factory):
    """Same architecture as tiny_ckpt, different random weights (the 'trained' weights to sync in)."""
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    return build_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny_qwen2_b")), seed=1, init_std=0.2)


@pytest.fixture(scope="session")
def hf_models(tiny_ckpt, tiny_ckpt_b):
    """transformers models of both checkpoints: the reference the engine must reproduce."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return {p: AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32).eval() for p in (tiny_ckpt, tiny_ckpt_b)}

"""Session-wide test setup: never touch a model hub, keep torch to one thread per process."""
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# No RAY_AUTH_MODE here: a run's private Ray and the scripts' clusters use token authentication themselves.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Engines started by tests require this key and every client in the test process sends it (slime_like.utils.auth);
# the tests of the authentication itself start engines with their own keys.
os.environ.setdefault("SLIME_LIKE_ENGINE_API_KEY", "test-suite-engine-key")
# Scripts under test call `python` and `ray`: they must find this interpreter's environment (CI runs
# `.venv/bin/python -m pytest` without activating the venv).
_bin = os.path.dirname(sys.executable)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _bin:
    os.environ["PATH"] = _bin + os.pathsep + os.environ.get("PATH", "")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """A tiny random Qwen2 checkpoint (HF format, char tokenizer) shared by the whole session."""
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    return build_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny_qwen2")))


@pytest.fixture(scope="session")
def tiny_vlm_ckpt(tmp_path_factory):
    """A tiny random Qwen2.5-VL checkpoint (HF format: char tokenizer + Qwen-VL tokens, PIL image processor with a
    56x56 image = 4 image tokens) shared by the whole session."""
    from slime_like.tools.tiny_vlm import build_tiny_vlm_checkpoint

    return build_tiny_vlm_checkpoint(str(tmp_path_factory.mktemp("tiny_qwen2_5_vl")), family="qwen2_5_vl")


@pytest.fixture(scope="session")
def tiny_qwen3_vl_ckpt(tmp_path_factory):
    """A tiny random Qwen3-VL checkpoint (as tiny_vlm_ckpt; patch 16, so a 64x64 image = 4 image tokens)."""
    from slime_like.tools.tiny_vlm import build_tiny_vlm_checkpoint

    return build_tiny_vlm_checkpoint(str(tmp_path_factory.mktemp("tiny_qwen3_vl")), family="qwen3_vl")

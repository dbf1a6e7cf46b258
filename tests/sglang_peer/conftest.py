"""SGLang's own Python code as the oracle for our SGLang side (no GPU needed).

The interpreter is the vLLM environment (bench/.venv-vllm: torch 2.13 CPU, msgspec, pyzmq, starlette, triton)
plus `sglang==0.5.23` installed with --no-deps and IPython, traitlets, orjson, gguf -- bench/vllm_peer/setup_env.sh
does both. `sglang.srt.server_args.ServerArgs` and `sglang.srt.managers.io_struct` import there on CPU.
Without it these tests skip with one line (fail under CI=true). To re-check against a newer SGLang: install
it into that venv (`bench/.venv-vllm/bin/python -m pip install --no-deps sglang==X`) and run
`pytest tests/sglang_peer`.
"""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
HINT = "SGLang peer not installed: run `bash bench/vllm_peer/setup_env.sh` (installs sglang --no-deps there)"


@pytest.fixture(scope="session")
def sglang_python():
    from slime_like.config.vllm_passthrough import vllm_venv

    py = os.path.join(vllm_venv(), "bin", "python")
    ok = os.path.exists(py) and subprocess.run(
        [py, "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('sglang') is None)"]).returncode == 0
    if not ok:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {HINT}")
        pytest.skip(HINT)
    return py


def run_check(python, mode, *extra) -> dict:
    """Run check_with_sglang.py under SGLang's interpreter; return its RESULT json."""
    env = dict(os.environ, PYTHONPATH=REPO, SLIME_LIKE_VLLM_PASSTHROUGH="generic")
    out = subprocess.run([python, os.path.join(HERE, "check_with_sglang.py"), mode, *extra], env=env,
                         capture_output=True, text=True, timeout=600)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, f"check_with_sglang.py {mode} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


sys.path.insert(0, HERE)

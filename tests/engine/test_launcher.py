"""Launchers: exact SGLang / CPU engine command lines (router: test_router.py), start-up failure reports, engine death, no orphans."""
import os
import sys

import pytest

from engine_helpers import engine_args, free_port, run, start
from slime_like.args import make_args
from slime_like.backends.engine_api.client import EngineClient, EngineUnreachable
from slime_like.backends.cpu_engine.launch import build_cpu_engine_command
from slime_like.backends.engine_api.launcher import EngineDied, EngineStartError, start_engine
from slime_like.backends.sglang.engine import build_sglang_command


def test_sglang_command_exact():
    args = make_args(hf_checkpoint="/ckpt/Qwen2.5-7B", rollout_num_gpus_per_engine=2, seed=42,
                     colocate=True, trust_remote_code=True, sglang_server_args={"mem_fraction_static": 0.7, "enable_dp_attention": True,
                                                                 "cuda_graph_bs": [1, 2, 4], "disable_radix_cache": False,
                                                                 "log_level": "warning"})
    cmd = build_sglang_command(args, port=30001, host="10.0.0.2", base_gpu_id=4, nccl_port=31001, python="python")
    assert cmd == ["python", "-m", "sglang.launch_server", "--model-path", "/ckpt/Qwen2.5-7B",
                   "--tp-size", "2", "--base-gpu-id", "4", "--port", "30001", "--host", "10.0.0.2",
                   "--trust-remote-code", "--random-seed", "42", "--enable-memory-saver", "--nccl-port", "31001",
                   "--cuda-graph-bs", "1", "2", "4", "--enable-dp-attention", "--log-level", "warning",
                   "--mem-fraction-static", "0.7"]


def test_sglang_command_generic_attributes_and_multinode():
    # the parser's generic --sglang-* passthrough; our own --sglang-server-concurrency is no server flag
    args = make_args("--hf-checkpoint", "/m", "--rollout-num-gpus-per-engine", 16, "--seed", 7,
                     "--sglang-server-concurrency", 512, "--sglang-chunked-prefill-size", 4096)
    cmd = build_sglang_command(args, port=1, host="h", dist_init_addr="10.0.0.1:5000", nnodes=2, node_rank=1,
                               python="py")
    assert cmd == ["py", "-m", "sglang.launch_server", "--model-path", "/m", "--tp-size", "16",
                   "--base-gpu-id", "0", "--port", "1", "--host", "h", "--random-seed", "7",
                   "--dist-init-addr", "10.0.0.1:5000",
                   "--nnodes", "2", "--node-rank", "1", "--chunked-prefill-size", "4096"]
    with pytest.raises(ValueError, match="dist_init_addr"):
        build_sglang_command(args, port=1, nnodes=2)
    with pytest.raises(ValueError, match="hf-checkpoint"):
        build_sglang_command(make_args(), port=1)


def test_cpu_engine_command():
    args = make_args(hf_checkpoint="/m", seed=3, sglang_server_args={"max_running_requests": 8, "dtype": "bfloat16"})
    assert build_cpu_engine_command(args, port=9, python="py") == [
        "py", "-m", "slime_like.backends.cpu_engine", "--model-path", "/m", "--host", "127.0.0.1", "--port", "9",
        "--dtype", "bfloat16", "--parent-pid", str(os.getpid()), "--max-running-requests", "8", "--random-seed", "3"]


def test_failed_start_names_engine_and_shows_log(tmp_path):
    args = engine_args(str(tmp_path / "no_model"))
    port = free_port()
    with pytest.raises(EngineStartError) as e:
        start_engine(args, kind="cpu", engine_index=3, port=port, log_dir=str(tmp_path), health_timeout=120)
    msg = str(e.value)
    assert "rollout engine 3 (cpu)" in msg and f"http://127.0.0.1:{port}" in msg
    assert "config.json" in msg  # the engine's own error, from its log tail


def test_start_timeout_kills_the_process(tmp_path):
    cmd = [sys.executable, "-c", "import time; print('stuck loading', flush=True); time.sleep(600)"]
    with pytest.raises(EngineStartError, match=r"not healthy after 2s(.|\n)*stuck loading"):
        start_engine(engine_args("/m"), kind="cpu", engine_index=5, port=free_port(), log_dir=str(tmp_path),
                     health_timeout=2, cmd=cmd)


@pytest.mark.slow
def test_engine_death_is_reported_with_log_tail_and_clear_client_errors(tiny_ckpt, tmp_path_factory):
    proc = start(tiny_ckpt, tmp_path_factory, index=7)
    assert run(EngineClient(proc.url).health())
    proc.check_alive()  # running: no error
    os.kill(proc.popen.pid, 9)  # the engine dies (OOM killer, segfault, ...)
    proc.popen.wait(10)
    with pytest.raises(EngineDied, match=r"rollout engine 7 \(cpu\) at http://127\.0\.0\.1:\d+ died(.|\n)*CPU engine ready"):
        proc.check_alive()
    with pytest.raises(EngineUnreachable, match=proc.url.replace(".", r"\.")):
        run(EngineClient(proc.url).generate([1, 2], {"max_new_tokens": 2}))
    assert not run(EngineClient(proc.url).health())
    proc.stop()  # already dead: no error
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.popen.pid, 0)  # nothing of its process group is left


@pytest.mark.slow
def test_engine_exits_when_its_launcher_is_killed(tiny_ckpt, tmp_path):
    """A launcher killed with SIGKILL cannot stop its engine; the engine notices and exits by itself."""
    import subprocess
    import time

    port = free_port()
    code = ("import sys, time; from slime_like.args import make_args; "
            "from slime_like.backends.engine_api.launcher import start_engine; "
            f"p = start_engine(make_args(hf_checkpoint={tiny_ckpt!r}, seed=0), kind='cpu', port={port}, "
            f"log_dir={str(tmp_path)!r}); "
            "print(p.popen.pid, flush=True); time.sleep(600)")
    launcher = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                env=dict(os.environ, OMP_NUM_THREADS="1"))
    engine_pid = int(launcher.stdout.readline())
    os.kill(launcher.pid, 9)
    launcher.wait(10)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            os.kill(engine_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    else:
        os.kill(engine_pid, 9)
        pytest.fail("the engine outlived its killed launcher by 30 s")

"""--use-fault-tolerance behind a real sglang-router (sglang-router 0.3.2 from bench/.venv-vllm), started first
with no workers and named with --sglang-router-ip/port. The run registers its two CPU engines; one is killed
(kill -9) or hung (SIGSTOP) in the middle of rollout 1. The rollout finishes through the router on the other
engine; the dead one is removed from the router as soon as the run finds it, restarted at the next weight
update, and added to the router once it holds the trainer's weights. When the run stops its engines it removes
them from the router (which outlives the run).

Without the vLLM environment (where sglang-router lives) the tests skip with one line; under CI=true that is
a failure (CI builds it)."""
import json
import os
import subprocess

import pytest

import train
from conftest import loop_argv
from slime_like.args import make_args
from slime_like.backends.sglang.router import build_router_command, list_workers, start_router
from slime_like.config.vllm_passthrough import vllm_venv
from slime_like.utils.metrics import read_metrics
from slime_like.utils.net import free_port

pytestmark = pytest.mark.slow

KEY = "ft-router-test-key"
BUILD_HINT = ("sglang-router not installed: build bench/.venv-vllm with `bash bench/vllm_peer/setup_env.sh` (or set "
              "SLIME_LIKE_VLLM_VENV)")


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    """A real sglang-router on 127.0.0.1, no workers yet, requiring the run's key; round robin, so both engines
    get requests and the restarted one is seen serving."""
    python = os.path.join(vllm_venv(), "bin", "python")
    if not os.path.exists(python) or subprocess.run([python, "-c", "import sglang_router"]).returncode:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {BUILD_HINT}")
        pytest.skip(BUILD_HINT)
    args = make_args(engine_api_key=KEY, sglang_router_request_timeout_secs=None,
                     save=str(tmp_path_factory.mktemp("router")))
    args.router_args = {"policy": "round_robin", "log_level": "warn"}   # what --router-NAME VALUE sets
    port = free_port()
    proc = start_router(args, [], port=port, cmd=build_router_command(args, [], port=port, python=python))
    try:
        yield proc.url, port
    finally:
        proc.stop()


@pytest.mark.parametrize("fault", ["kill_engine0", "stop_engine1"])
def test_dead_engine_leaves_the_router_and_its_restart_joins_it(tiny_ckpt, toy_prompts, tmp_path, router, fault,
                                                                 monkeypatch):
    url, port = router
    monkeypatch.setenv("SLIME_LIKE_ENGINE_API_KEY", KEY)   # the key the router was started with
    n = 3
    argv = loop_argv(tiny_ckpt, toy_prompts[0], tmp_path, "--actor-num-gpus-per-node", "1", "--rollout-num-gpus",
                     "2", "--rollout-num-gpus-per-engine", "1", "--num-rollout", str(n),
                     "--sglang-router-ip", "127.0.0.1", "--sglang-router-port", str(port),
                     "--custom-generate-function-path", f"engine_faults.{fault}", "--use-fault-tolerance",
                     "--custom-rollout-log-function-path", "engine_faults.record_router_workers",
                     "--rollout-health-check-interval", "0.5", "--rollout-health-check-timeout", "2",
                     "--save-debug-rollout-data", str(tmp_path / "rollout_{rollout_id}.json"))
    assert train.main(argv) == 0
    rows = [r for r in read_metrics(str(tmp_path / "metrics.jsonl")) if r["rollout_id"] >= 0]
    assert [r["rollout_id"] for r in rows] == list(range(n))
    # a killed engine's requests the router itself sends again (the run may find it dead only before the push);
    # a hung one's hold rollout 1 until the run's health check takes it out of the router and re-sends them
    if fault == "stop_engine1":
        assert rows[1]["rollout/dead_engines"] == 1, rows[1]
    assert rows[1]["rollout/engine_restarts"] == 1, rows[1]
    for r in rows[2:]:
        # two engines again, and every sample's log-probs are the trainer's: the restarted engine served (round
        # robin) on the current weights (from --hf-checkpoint's, the gap would be ~0.17)
        assert r["rollout/engines_live"] == 2 and "rollout/dead_engines" not in r, r
        assert r["rollout/logprob_abs_diff"] < 1e-3, r
    # the router's workers after each rollout: the two engines; after the restart the survivor and the restarted
    # engine, both healthy, and the failed engine's URL gone; none once the run has stopped its engines
    with open(tmp_path / "engine_faults.txt") as f:
        failed = f.read().split()
    with open(tmp_path / "router_workers.jsonl") as f:
        seen = {row["rollout_id"]: row["workers"] for row in map(json.loads, f)}
    assert len(failed) == 1 and failed[0] in seen[0] and len(seen[0]) == 2, (failed, seen)
    for k in range(2, n):
        assert len(seen[k]) == 2 and all(seen[k].values()) and failed[0] not in seen[k], (k, seen)
        assert len(set(seen[k]) & set(seen[0])) == 1, (k, seen)   # the survivor, and one new URL
    assert list_workers(url, KEY) == {}
    # exactly the scheduled prompts were trained on: rollout k holds prompts 8k..8k+7, each 8 times
    for k in range(n):
        with open(tmp_path / f"rollout_{k}.json") as f:
            labels = sorted(int(s["label"]) for s in json.load(f)["samples"])
        assert labels == sorted(list(range(8 * k, 8 * k + 8)) * 8), k

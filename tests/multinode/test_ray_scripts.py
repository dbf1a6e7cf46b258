"""scripts/ray/*: bad settings fail fast and clearly; a head and a worker node started by the scripts on this host
form a 2-node cluster that wait-for-nodes, cluster_check.py and `ray job submit` (submit.sh) use."""
import json
import os
import signal
import subprocess
import time

import pytest
from multinode_helpers import REPO, free_port, pid_alive, processes_with

RAY = REPO / "scripts" / "ray"


def run_script(name, *args, env=None, timeout=60):
    return subprocess.run(["bash", str(RAY / name), *args], env=dict(os.environ, **(env or {})),
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("env, message", [
    ({"RAY_NUM_GPUS": "four"}, "RAY_NUM_GPUS=four is not a non-negative integer"),
    ({"RAY_PORT": "70000"}, "RAY_PORT=70000 is not a TCP port"),
    ({"RAY_TEMP_DIR": "/tmp/" + "x" * 60}, "unix socket paths under it would pass the 107-byte limit"),
    ({"RAY_TEMP_DIR": "relative/dir"}, "must be an absolute path"),
    ({"RAY_INCLUDE_DASHBOARD": "yes"}, "RAY_INCLUDE_DASHBOARD=yes must be true or false"),
    ({"RAY_MIN_WORKER_PORT": "20000", "RAY_MAX_WORKER_PORT": "19000"}, "must be below RAY_MAX_WORKER_PORT"),
])
def test_start_head_rejects_bad_settings(env, message):
    r = run_script("start-head.sh", env=env)
    assert r.returncode == 2 and message in r.stderr, (r.returncode, r.stderr)
    assert "ray head:" not in r.stdout  # nothing was started


def test_start_worker_rejects_bad_address():
    r = run_script("start-worker.sh", "10.0.0.1", env={"RAY_NUM_GPUS": "1"})
    assert r.returncode == 2 and "'10.0.0.1' is not HOST:PORT" in r.stderr, r.stderr


def test_start_worker_waits_for_the_head_then_names_it():
    port = free_port()  # nobody listens there
    r = run_script("start-worker.sh", f"127.0.0.1:{port}", env={"RAY_NUM_GPUS": "1", "RAY_WAIT_TIMEOUT": "2"})
    assert r.returncode == 1, r.stderr
    assert f"the Ray head at 127.0.0.1:{port} did not accept connections within 2 s" in r.stderr, r.stderr
    assert "ray worker: joining" not in r.stdout  # `ray start` never ran


def test_wait_for_nodes_names_an_unreachable_head():
    port = free_port()  # nobody listens there
    t0 = time.monotonic()
    r = run_script("wait-for-nodes.sh", "2", "8", "2", env={"RAY_ADDRESS": f"127.0.0.1:{port}"})
    assert r.returncode == 1
    assert f"nothing listens on the Ray head address 127.0.0.1:{port} after 2 s" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 30


def test_slurm_library_refuses_to_run_outside_slurm():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    r = subprocess.run(["bash", "-c", f"source {REPO}/scripts/slurm/ray_cluster.sh"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "runs inside a Slurm job (SLURM_JOB_ID" in r.stderr, r.stderr


@pytest.fixture
def two_node_ray(tmp_path):
    """Head (dashboard on, 2 GPU slots) + one worker node (2 GPU slots) on this host, each its own `ray start
    --block` in its own process group; stopped with SIGTERM (then SIGKILL to the group) and checked by pid."""
    temp = f"/tmp/rt_{os.getpid()}"  # short: Ray's socket paths
    gcs, dash, client = free_port(), free_port(), free_port()
    common = {"RAY_HEAD_IP": "127.0.0.1", "RAY_PORT": str(gcs), "RAY_DASHBOARD_PORT": str(dash),
              "RAY_CLIENT_PORT": str(client), "RAY_TEMP_DIR": temp, "RAY_NUM_GPUS": "2", "RAY_NUM_CPUS": "1",
              "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    procs = []

    def start(script, log, **extra):
        env = dict(os.environ, **common, **extra)
        with open(tmp_path / log, "w") as f:
            procs.append(subprocess.Popen(["bash", str(RAY / script), "--block"], env=env, stdout=f,
                                          stderr=subprocess.STDOUT, start_new_session=True))

    # Distinct agent and worker ports: both nodes share this host (on a real cluster the defaults do).
    start("start-head.sh", "head.log", RAY_AGENT_PORT=str(free_port()), RAY_MIN_WORKER_PORT="23100",
          RAY_MAX_WORKER_PORT="23199")
    start("start-worker.sh", "worker.log", RAY_AGENT_PORT=str(free_port()), RAY_MIN_WORKER_PORT="23200",
          RAY_MAX_WORKER_PORT="23299")
    try:
        yield dict(common, RAY_ADDRESS=f"127.0.0.1:{gcs}", logs=tmp_path)
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        deadline = time.monotonic() + 20
        while processes_with(marker_cmd=temp + "/") and time.monotonic() < deadline:
            time.sleep(0.5)
        left = processes_with(marker_cmd=temp + "/")
        for line in left:  # the nodes did not stop their children: kill exactly those pids
            pid = int(line.split()[0])
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", temp])
        assert left == [], f"Ray processes left after SIGTERM: {left}"


@pytest.mark.slow
def test_two_node_cluster_from_the_scripts(two_node_ray, tiny_ckpt, tmp_path):
    env = {k: v for k, v in two_node_ray.items() if k != "logs"}

    def logs():  # the tail of both nodes' logs, for failure messages
        return "".join(f"\n--- {p.name}\n" + p.read_text()[-2500:] for p in two_node_ray["logs"].glob("*.log"))

    r = run_script("wait-for-nodes.sh", "2", "4", "150", env=env, timeout=200)
    assert r.returncode == 0, r.stderr + logs()
    assert "ray cluster ready: 2 node(s), 4 GPU slot(s)" in r.stdout

    # More than the cluster has: a clear timeout naming what is missing.
    r = run_script("wait-for-nodes.sh", "3", "6", "3", env=env)
    assert r.returncode == 1
    assert "has 2 of 3 node(s) and 4 of 6 GPU slot(s); missing 1 node(s) and 2 GPU slot(s)" in r.stderr, r.stderr

    # Every GPU slot of both nodes takes an actor.
    report = tmp_path / "check.json"
    r = subprocess.run(["python", str(RAY / "cluster_check.py"), "--nodes", "2", "--gpus-per-node", "2",
                        "--out", str(report)], env=dict(os.environ, **env), capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr + logs()
    check = json.loads(report.read_text())
    assert check["errors"] == [] and len(check["placements"]) == 4
    assert len({node for node, _ in check["placements"]}) == 2

    # slime's flow: `ray job submit -- python train.py ...` through the dashboard's job API.
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "1+1=", "label": "2"}\n')
    r = run_script("submit.sh", "--hf-checkpoint", str(tiny_ckpt), "--prompt-data", str(prompts),
                   "--input-key", "prompt", "--label-key", "label", "--rm-type", "math",
                   "--num-rollout", "1", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4",
                   "--actor-num-nodes", "2", "--actor-num-gpus-per-node", "2", "--num-gpus-per-node", "2",
                   "--rollout-num-gpus", "4", "--colocate", "--dry-run", env=env, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + logs()
    assert "succeeded" in r.stdout and "placement plan" in r.stdout, r.stdout[-3000:]

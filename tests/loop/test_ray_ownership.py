"""A run owns its Ray: another head on the machine, or the address file a dead one left, changes nothing;
`--ray-address` joins a head on request; the private instance listens on loopback only, with token auth.

The foreign head is a real `ray start --head`, started the way a user would (no --temp-dir), in an
environment whose TMPDIR is a fresh short directory: its `ray_current_cluster` file is then exactly where a
plain `ray.init()` in that environment looks (the test checks that first). It is cleaned up by pid.
"""
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile

import psutil
import pytest

from conftest import REPO, loop_argv
from listeners import is_loopback, kill as _kill, listening, train as _train
from slime_like.utils.net import free_port

pytestmark = pytest.mark.slow
RAY = os.path.join(os.path.dirname(sys.executable), "ray")


def _processes_under(path: str) -> list:
    """Processes whose command line names `path` (the head's temp dir), with their descendants."""
    found = {}
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(path in part for part in p.info["cmdline"] or []):
                found[p.pid] = p
                for c in p.children(recursive=True):
                    found[c.pid] = c
        except psutil.Error:
            continue
    return list(found.values())


@pytest.fixture
def foreign_head():
    tmp = tempfile.mkdtemp(prefix="fh", dir="/tmp")  # short: Ray's unix sockets live below it
    env = {**os.environ, "TMPDIR": tmp, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    head = {"env": env, "tmp": tmp, "file": os.path.join(tmp, "ray", "ray_current_cluster")}
    try:
        for attempt in range(2):  # `ray start` gives a node 30 s (hard-coded) to register: a loaded host can miss it
            # its own agent port: Ray's default (52365) may be held by another head on a shared machine
            started = subprocess.run([RAY, "start", "--head", "--port=0", "--num-cpus=2", "--num-gpus=4",
                                      f"--dashboard-agent-listen-port={free_port()}", "--include-dashboard=false",
                                      "--disable-usage-stats"], env=env, timeout=180, capture_output=True, text=True)
            if started.returncode == 0 or "timed out during startup" not in started.stdout + started.stderr:
                break
            _kill(_processes_under(tmp))
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        head["address"] = open(head["file"]).read().strip()
        # what a plain ray.init() in this environment would connect to: this head
        probe = ("from ray._private.services import get_ray_address_from_environment as f; "
                 "print(f(None, None))")
        seen = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
        assert seen.stdout.strip() == head["address"], seen
        yield head
    finally:
        _kill(_processes_under(tmp))
        shutil.rmtree(tmp, ignore_errors=True)


def test_foreign_head_and_stale_address_file_change_nothing_and_ray_address_joins(
        foreign_head, tiny_ckpt, toy_prompts, tmp_path):
    user_env = {k: v for k, v in foreign_head["env"].items() if not k.startswith("RAY_AUTH")}
    def tiny_run(name, *extra):
        return loop_argv(tiny_ckpt, toy_prompts[0], tmp_path / name, "--colocate", "--actor-num-gpus-per-node", "1",
                         "--num-rollout", "1", *extra)

    argv = tiny_run("own")
    dry = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), *argv, "--dry-run"], env=user_env,
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr

    sockets: dict = {}
    rc, out = _train(user_env, argv, watch=lambda pid: listening(pid, sockets))
    assert rc == 0, out[-3000:]
    assert "private Ray instance on 127.0.0.1 (token auth" in out
    ray_servers = {v[0] for v in sockets.values()}
    assert {"gcs_server", "raylet"} <= ray_servers, sockets  # the watch saw the Ray servers themselves
    # Ray's servers (GCS, raylet, agents, workers' gRPC), the trainer's and the engine's on loopback only
    # (tests/loop/test_listeners.py checks a disaggregated run on a host whose name resolves off loopback)
    wide = {k: v for k, v in sockets.items() if not is_loopback(v[1])}
    assert wide == {}, f"listening beyond loopback: {wide}"

    # --ray-address joins the foreign head (with its token, as the cluster's docs tell the user to set)
    join_env = {**user_env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": foreign_head["env"]["RAY_AUTH_TOKEN"]}
    out = _start_ray(join_env, tiny_run("joined", "--ray-address", foreign_head["address"]))
    assert f"joined the Ray cluster at {foreign_head['address']} (1 node(s), 4 GPUs)" in out
    # a plan that needs more GPU slots than the joined cluster declares: one line, no resource counts passed
    big = tiny_run("big", "--ray-address", foreign_head["address"], "--num-gpus-per-node", "8",
                   "--actor-num-gpus-per-node", "8")
    r = _start_ray(join_env, big, expect_rc=3)
    assert "declares 4 GPU(s) on 1 node(s) but the plan needs 8 GPU slots" in r, r

    # the head dies the hard way: its address file stays behind; a run starts its own Ray regardless. This run's
    # reward function raises inside the rollout actor: one short block names the actor, the root cause and the
    # log with the full traceback, instead of Ray's nested tracebacks.
    _kill(_processes_under(foreign_head["tmp"]))
    assert os.path.exists(foreign_head["file"])
    rc, out = _train(user_env, tiny_run("stale", "--custom-rm-path", "toy_task.exploding_reward"))
    assert "private Ray instance on 127.0.0.1" in out
    log = tmp_path / "stale" / "error.log"
    assert rc == 1 and (f"train.py: error in RolloutManager.generate (pid " in out), out[-3000:]
    # every prompt's reward explodes; which one the rollout reports first depends on the groups' finishing order
    assert re.search(r"RewardFunctionError: reward function failed on prompt index \d+ \(--rm-type None, "
                     r"--custom-rm-path toy_task\.exploding_reward\): ValueError: the reward model exploded on "
                     r"purpose; pass --on-reward-error skip to drop such prompts instead\n"
                     + re.escape(f"  full traceback: {log}"), out), out[-3000:]
    assert out.count("the reward model exploded on purpose") == 1 and "Traceback" not in out, out[-3000:]
    assert "ValueError: the reward model exploded on purpose" in log.read_text()
    # and asking to join the dead head is one clear line, not a traceback
    r = _start_ray(join_env, tiny_run("x", "--ray-address", foreign_head["address"]), expect_rc=3)
    assert f"cannot reach the Ray cluster at {foreign_head['address']}" in r, r
    # a plan spanning two nodes joins the cluster Ray finds: here only the dead head's file, then nothing at all
    two_nodes = ("--actor-num-nodes", "2", "--actor-num-gpus-per-node", "4")
    r = _start_ray(user_env, tiny_run("y", *two_nodes), expect_rc=3)
    assert f"cannot reach the Ray cluster at {foreign_head['address']}" in r, r
    os.remove(foreign_head["file"])
    r = _start_ray(user_env, tiny_run("z", *two_nodes), expect_rc=3)
    assert "the plan spans several nodes (or --ray-address auto) but no running Ray cluster was found" in r, r


# train.py's own start-up path up to Ray (parse -> plan -> init_ray), then one task on the cluster: the same
# code a run executes, without paying for the trainers and engines again.
_START_RAY = """
import sys, ray
from slime_like.args import parse_args
from slime_like.plan import build_plan
from slime_like.ray.cluster import RayClusterError, init_ray
args = parse_args(sys.argv[1:])
try:
    print(init_ray(args, build_plan(args)))
except RayClusterError as e:
    print(e, file=sys.stderr)
    sys.exit(3)
print("task:", ray.get(ray.remote(lambda: 41 + 1).remote()))
"""


def _start_ray(env, argv, expect_rc=0) -> str:
    """Run _START_RAY; returns stdout on success, stderr (the one-line error) when `expect_rc` is 3."""
    r = subprocess.run([sys.executable, "-c", _START_RAY, *argv], env=env, cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    if expect_rc:
        assert r.returncode == expect_rc and "Traceback" not in r.stderr, r.stdout + r.stderr
        return r.stderr
    assert r.returncode == 0 and "task: 42" in r.stdout, r.stdout + r.stderr
    return r.stdout

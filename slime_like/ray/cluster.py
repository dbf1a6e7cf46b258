"""Which Ray a run uses: its own private instance, or a cluster the user asked it to join.

- One node, no `--ray-address` / `RAY_ADDRESS`: a private Ray instance of this run -- its own temp dir and
  ports (all picked by the OS, Ray's fixed defaults too), every server bound to 127.0.0.1, token
  authentication with a secret generated for this process.
  It never reads another cluster's address file (`ray_current_cluster` in Ray's default temp dir), so a
  head someone else started, or the file a dead head left behind, changes nothing.
- `--ray-address auto|HOST:PORT` or `RAY_ADDRESS` (which `ray job submit` sets): join that cluster. A plan that
  spans several nodes joins the running cluster as Ray finds it (`auto`). Joining passes no resource counts
  (Ray refuses them for an existing cluster) and checks that the cluster declares the GPU slots the plan needs.
  Authentication is the cluster's: RAY_AUTH_MODE / RAY_AUTH_TOKEN(_PATH) as the user's environment sets them
  (scripts/ray and scripts/slurm turn token authentication on; docs/multinode.md).
"""
from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import socket
import sys
import tempfile

import ray

from slime_like.ray.failures import divert_worker_death_notices
from slime_like.ray.placement import QUIET_OPENMP
from slime_like.ray.signals import ray_init_keeps_our_handlers
from slime_like.utils.console import python_warnings_env

# Ray's deepest unix socket sits ~64 bytes below its temp dir; a socket path must stay under 108 bytes.
_MAX_TEMP_DIR_LEN = 40
_SINGLE_MACHINE_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class RayClusterError(RuntimeError):
    """The cluster to join is missing or cannot host the plan; the message is one line for the user."""


def ray_address(args) -> str | None:
    """The cluster to join, or None for a private instance. The flag wins over the environment."""
    return args.ray_address or os.environ.get("RAY_ADDRESS") or None


def init_ray(args, plan=None) -> str:
    """Start or join Ray for this run; returns a one-line description of what it is connected to."""
    if ray.is_initialized():
        return "Ray already initialised in this process"
    address = ray_address(args)
    if address is None and plan is not None and plan.num_nodes > 1:
        address = "auto"  # a multi-node plan needs the running cluster; Ray finds it (RAY_ADDRESS or its file)
    with ray_init_keeps_our_handlers():  # a signal while Ray starts: handled as in every other phase
        said = _start_private(args) if address is None else _join(address, plan)
    divert_worker_death_notices(args.run_dir)  # the driver reports a dead actor itself, once
    return said


def _runtime_env() -> dict:
    # Actors import user code by dotted path (--custom-rm-path my_rm.score): give them the driver's working
    # directory and PYTHONPATH, as `python train.py` itself sees them.
    pythonpath = os.pathsep.join(p for p in [os.getcwd(), os.environ.get("PYTHONPATH", "")] if p)
    return {"env_vars": {"TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": pythonpath, **QUIET_OPENMP,
                         "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
                         "TRANSFORMERS_OFFLINE": os.environ.get("TRANSFORMERS_OFFLINE", "1"),
                         # the console: no per-file progress bars from the workers, no notice a user cannot act on
                         "HF_HUB_DISABLE_PROGRESS_BARS": os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
                         "PYTHONWARNINGS": python_warnings_env()}}


def _private_temp_dir() -> str:
    base = tempfile.gettempdir()
    if len(base) > _MAX_TEMP_DIR_LEN - 12:
        base = "/tmp"
    return tempfile.mkdtemp(prefix="slr_ray_", dir=base)


@contextlib.contextmanager
def _loopback_node():
    """While Ray starts, make it take 127.0.0.1 as this node's address, so GCS, raylet, workers and agents
    listen there only (checked by tests/loop/test_ray_ownership.py).

    Ray binds its servers to the node IP and turns 127.0.0.1 into the machine's routable address unless
    `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` (the single-machine mode Ray uses on macOS). The variable is read
    when ray is imported, so the already-imported constant is set too; the processes Ray starts inherit the
    variable. Both are restored afterwards (a later join in the same process must see the real address).
    """
    from ray._private import ray_constants

    with _swapped({_SINGLE_MACHINE_VAR: "0"}, [(ray_constants, "ENABLE_RAY_CLUSTER", False)]):
        yield


@contextlib.contextmanager
def _swapped(env: dict, attrs: list):
    """Environment variables `env` and module attributes `attrs` ([(module, name, value), ...]) set while the
    block runs, then put back as they were (a variable that was unset is unset again)."""
    saved_env = {name: os.environ.get(name) for name in env}
    saved_attrs = [(obj, name, getattr(obj, name)) for obj, name, _ in attrs]
    os.environ.update(env)
    for obj, name, value in attrs:
        setattr(obj, name, value)
    try:
        yield
    finally:
        for obj, name, value in saved_attrs:
            setattr(obj, name, value)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# Fixed-port metrics servers of the autoscaler monitor and the dashboard process (ray.init starts both, on
# loopback here); read from the environment by those processes when they start. 0: the OS picks.
_METRIC_PORT_VARS = ("AUTOSCALER_METRIC_PORT", "DASHBOARD_METRIC_PORT")


@contextlib.contextmanager
def _ports_of_its_own():
    """While Ray starts, let the OS pick the ports Ray otherwise fixes: the dashboard agent's HTTP server (52365)
    and the two metrics servers (44217, 44227).

    On a shared host another run (or user) may hold a fixed port: that server of ours then logs a traceback and
    does not serve, or a later run loses the port to ours. ray.init has no option for the agent's port (`ray
    start` has --dashboard-agent-listen-port), so the RayParams class ray.init builds is swapped for one whose
    default is 0, which the agent supports (it binds port 0 on the node address and records the port it got).
    The metrics ports' variables are set only if the user has not set them, and restored afterwards.
    """
    from ray._private import parameter

    original = parameter.RayParams

    class _Params(original):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("dashboard_agent_listen_port", 0)
            super().__init__(*args, **kwargs)

    unset = {v: "0" for v in _METRIC_PORT_VARS if v not in os.environ}
    with _swapped(unset, [(parameter, "RayParams", _Params)]):
        yield


def enable_token_auth() -> None:
    """Token authentication with a secret of this process (children inherit it; nothing is written to disk).

    Ray reads RAY_AUTH_MODE into its C++ config when imported and caches the token, so both are reloaded
    after the environment changes (what Ray's own `_enable_token_auth` does).
    """
    if not os.environ.get("RAY_AUTH_TOKEN"):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    _reload_auth_mode("token")


def _reload_auth_mode(mode: str) -> None:
    from ray._raylet import AuthenticationTokenLoader, Config

    os.environ["RAY_AUTH_MODE"] = mode
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def _start_private(args) -> str:
    enable_token_auth()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    temp_dir = _private_temp_dir()
    # logging_level WARNING: Ray's "Started a local Ray instance." (our own start line says what it is) is left out
    kwargs = dict(address="local", include_dashboard=False, runtime_env=_runtime_env(), log_to_driver=True,
                  logging_level="WARNING",
                  object_store_memory=512 * 1024 ** 2, num_cpus=max(os.cpu_count() or 2, 2),
                  _temp_dir=temp_dir, _node_ip_address="127.0.0.1")
    if not _has_cuda_devices():
        kwargs["num_gpus"] = args.num_gpus_per_node  # declared GPU slots: the same placement code runs on CPU
    with _loopback_node(), _ports_of_its_own():
        ray.init(**kwargs)
    atexit.register(_remove_private_ray, temp_dir)   # after ray.init: runs before Ray's own exit handler
    return f"private Ray instance on 127.0.0.1 (token auth, temp dir {temp_dir})"


def _remove_private_ray(temp_dir: str) -> None:
    """At exit, however the run ends: stop the private Ray, then remove its temp dir (sockets, session logs), which
    each run used to leave behind as /tmp/slr_ray_*. The run's own logs live in RUN_DIR."""
    try:
        if ray.is_initialized():
            ray.shutdown()
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


_START_FIRST = ("Start the cluster first (scripts/ray/start-head.sh, start-worker.sh) or, on one node, drop "
                "--ray-address / RAY_ADDRESS to let the run start its own Ray")


def _resolve(address: str) -> str:
    """auto -> RAY_ADDRESS, else the address file the last `ray start` wrote in Ray's default temp dir.

    Never Ray's legacy fallback of `auto` (connect to any GCS process found running on the machine): on a
    shared host that would be someone else's cluster."""
    from ray._private.services import get_ray_address_from_environment

    if address != "auto":
        return address
    found = get_ray_address_from_environment(None, None)
    if not found or found == "local":
        raise RayClusterError("the plan spans several nodes (or --ray-address auto) but no running Ray cluster was "
                              f"found (RAY_ADDRESS unset, no address file of a live head). {_START_FIRST}")
    return found


def _check_reachable(address: str) -> None:
    """Fail in seconds on a dead head (Ray itself retries the GCS for minutes), e.g. a stale address file."""
    host, _, port = address.split("://")[-1].rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=5):
            pass
    except (OSError, ValueError) as e:
        raise RayClusterError(f"cannot reach the Ray cluster at {address} ({e}). {_START_FIRST}") from None


def _join(address: str, plan) -> str:
    address = _resolve(address)
    _check_reachable(address)
    if not os.environ.get("RAY_AUTH_MODE"):  # our clusters authenticate (scripts/ray, scripts/slurm): so do we
        _reload_auth_mode("token")
    try:
        ray.init(address=address, runtime_env=_runtime_env(), log_to_driver=True)
    except ConnectionError as e:
        raise RayClusterError(f"cannot reach the Ray cluster at {address}: {str(e).splitlines()[0]}. "
                              f"{_START_FIRST}") from None
    except Exception as e:  # AuthenticationError and friends: say which cluster and what to set
        if "auth" in type(e).__name__.lower() or "token" in str(e).lower():
            raise RayClusterError(f"the Ray cluster at {address} refused this driver's token "
                                  f"({type(e).__name__}); set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH to the "
                                  "cluster's token (scripts/ray/_common.sh prints where it is)") from None
        raise
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    gpus = ray.cluster_resources().get("GPU", 0)
    if plan is not None and gpus < plan.num_slots:
        ray.shutdown()
        raise RayClusterError(f"the Ray cluster at {address} declares {gpus:g} GPU(s) on {len(nodes)} node(s) but the "
                              f"plan needs {plan.num_slots} GPU slots; add nodes (RAY_NUM_GPUS=N on CPU-only nodes) "
                              "or lower --actor-num-gpus-per-node / --rollout-num-gpus")
    return f"joined the Ray cluster at {address} ({len(nodes)} node(s), {gpus:g} GPUs)"


def cluster_spans_nodes() -> bool:
    """True when the Ray cluster has live nodes on more than one address (several raylets on one host count
    as one node: they reach each other over loopback). Servers of the run listen on loopback unless it does."""
    return len({n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}) > 1


def _has_cuda_devices() -> bool:
    # Not CUDA_VISIBLE_DEVICES: Slurm sets it on CPU test nodes too. Not torch: the driver stays light.
    return os.path.exists("/dev/nvidia0")


def say(line: str) -> None:
    print(f"[slime_like] {line}", file=sys.stderr, flush=True)

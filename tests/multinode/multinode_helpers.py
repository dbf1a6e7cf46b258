"""Helpers of the multi-node tests: free ports, processes left behind, a handle on the local Slurm, job polling."""
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCAL_CLUSTER = REPO / "scripts" / "slurm" / "local_cluster.sh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_range(n: int, lo: int = 6820, hi: int = 7800) -> int:
    """First port p in [lo, hi) with p..p+n-1 all free on 127.0.0.1 (slurmd ports must be consecutive)."""
    for start in range(lo, hi, n):
        socks = []
        try:
            for p in range(start, start + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return start
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports in [{lo}, {hi})")


def processes_with(marker_env: str | None = None, marker_cmd: str | None = None) -> list[str]:
    """'pid cmdline' of live processes whose environment has marker_env (e.g. SLURM_JOB_ID=7) or whose command line
    contains marker_cmd (e.g. /tmp/ray_7). Zombies and this process are skipped."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if (d / "stat").read_text().split(") ")[-1].startswith("Z"):
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            env = (d / "environ").read_bytes().split(b"\0") if marker_env else []
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if (marker_env and marker_env.encode() in env) or (marker_cmd and marker_cmd in cmd):
            found.append(f"{d.name} {cmd[:160]}")
    return found


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and not stat.read_text().split(") ")[-1].startswith("Z")


class LocalSlurm:
    """A running scripts/slurm/local_cluster.sh cluster: env for the Slurm CLI, and its daemons' pids."""

    def __init__(self, base: Path, env: dict):
        self.base, self.env = base, env
        self.conf = base / "etc" / "slurm.conf"

    def run(self, *cmd, check=True, timeout=60) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, check=check, timeout=timeout)

    def daemon_pids(self) -> dict[str, int]:
        pids = {}
        for f in (self.base / "run").glob("*.pid"):
            text = f.read_text().strip()
            if text.isdigit():
                pids[f.stem] = int(text)
        return pids

    def job_state(self, job_id: str) -> dict[str, str]:
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def wait_for_job(cluster: LocalSlurm, job_id: str, timeout: float) -> dict[str, str]:
    """Poll until the job leaves the queue states; scancel it and fail on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        state = cluster.job_state(job_id)
        if state.get("JobState") not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", None):
            return state
        if time.monotonic() > deadline:
            cluster.run("scancel", job_id, check=False)
            pytest.fail(f"job {job_id} still {state.get('JobState')} after {timeout:.0f} s; cancelled it")
        time.sleep(1)

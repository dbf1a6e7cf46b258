"""Fixtures for the multi-node tests: a real local Slurm (scripts/slurm/local_cluster.sh).

Every daemon a fixture starts is stopped by its finalizer, and the finalizer checks by pid that it is gone.
"""
import os
import shutil
import subprocess

import pytest
from multinode_helpers import LOCAL_CLUSTER, LocalSlurm, free_port, free_port_range, pid_alive


@pytest.fixture(scope="module")
def local_slurm(tmp_path_factory):
    """A 2-node Slurm (n1, n2: two slurmd on this host, 4 fake GPUs each), installed with apt-get if missing.
    Module scope: the daemons stop as soon as the module's tests are done, not at the end of the whole run."""
    if not all(shutil.which(c) for c in ("slurmctld", "slurmd", "munged", "sbatch")) and not shutil.which("apt-get"):
        pytest.skip("Slurm is not installed and apt-get is not available to install it "
                    "(slurmctld slurmd slurm-client munge); scripts/slurm/local_cluster.sh needs a Debian/Ubuntu host")
    if os.geteuid() != 0:
        pytest.fail("the local Slurm test needs root (apt-get, mknod for the fake GPU devices, slurmd); run it as root")
    base = tmp_path_factory.mktemp("slurm")  # short enough for munge's unix socket path
    env = dict(os.environ, BASE=str(base), NODES="2", GPUS_PER_NODE="4",
               SLURMCTLD_PORT=str(free_port()), SLURMD_PORT=str(free_port_range(2)),
               SLURM_CONF=str(base / "etc" / "slurm.conf"))
    cluster = LocalSlurm(base, env)

    def stop():
        pids = cluster.daemon_pids()
        subprocess.run(["bash", str(LOCAL_CLUSTER), "stop"], env=env, capture_output=True, timeout=120)
        left = {name: pid for name, pid in pids.items() if pid_alive(pid)}
        for pid in left.values():  # the script failed to stop them: do it here, by pid
            os.kill(pid, 9)
        assert not left, f"local_cluster.sh stop left daemons running: {left}"

    start = subprocess.run(["bash", str(LOCAL_CLUSTER), "start"], env=env, capture_output=True, text=True,
                           timeout=600)
    if start.returncode != 0:
        stop()
        pytest.fail(f"local_cluster.sh start failed (exit {start.returncode}):\n{start.stdout}\n{start.stderr}")
    try:
        yield cluster
    finally:
        stop()

"""What a run's processes listen on: a psutil watch over a process and its descendants (tests helper)."""
import os
import socket
import subprocess
import sys
import threading
import time

import psutil

from conftest import REPO

# Ray's fixed default ports: the dashboard agent's HTTP server, the autoscaler's and the dashboard's metrics
RAY_FIXED_PORTS = {52365: "dashboard agent HTTP", 44217: "autoscaler metrics", 44227: "dashboard metrics"}


def listening(pid: int, into: dict) -> None:
    """Add {(pid, port): (process name, address)} for every listening inet socket of `pid` and its descendants."""
    try:
        procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return
    for p in procs:
        try:
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    into[(p.pid, c.laddr.port)] = (p.name(), c.laddr.ip)
        except psutil.Error:
            continue


def is_loopback(ip: str) -> bool:
    return ip in ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def routable_interface() -> str | None:
    """A non-loopback interface with an IPv4 address, if the host has one."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and not a.address.startswith("127.") for a in addrs):
            return name
    return None


def kill(procs: list):
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)


def train(env, argv, timeout=600, watch=None):
    """Run train.py as a user would; `watch(pid)` is called every 0.5 s while it runs."""
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "train.py"), *argv], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.time() + timeout
    while proc.poll() is None and time.time() < deadline:
        if watch is not None:
            watch(proc.pid)
        time.sleep(0.5)
    if proc.poll() is None:
        kill([proc] + psutil.Process(proc.pid).children(recursive=True))
    reader.join(10)
    return proc.returncode, "".join(out)

"""Where the vllm engine listens, measured on a real vLLM (its own server): only the adapter's port is TCP.

vLLM's dev-mode routes (/collective_rpc runs named methods on the workers, /sleep, /pause, ...) take no API key:
its middleware guards only /v1, /v2, /inference, /cohere. Before, vLLM served them on 127.0.0.1:Q, where any local
process could call them; now it serves on a Unix socket in the adapter's private (0700) directory, and its
engine-core ZMQ sockets (ipc://) sit there too. What still listens on TCP: the worker's torch.distributed gloo
groups (gloo has no Unix-socket transport and vLLM no option to avoid it), pinned to loopback. The engine starts
with GLOO_SOCKET_IFNAME on the host's routable interface, standing in for the usual host whose name resolves to
its routable address (gloo's default; this machine's hostname resolves to 127.0.0.1, which would hide it).
"""
import json
import os
import socket
import urllib.error
import urllib.request

import psutil
import pytest

from conftest import start_vllm, unix_request
from slime_like.utils.auth import auth_headers

pytestmark = pytest.mark.slow


def routable_interface() -> str | None:
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and not a.address.startswith("127.") for a in addrs):
            return name
    return None


@pytest.fixture(scope="module")
def served(vllm_env, vllm_ckpts, tmp_path_factory):
    iface = routable_interface()
    proc = start_vllm(vllm_ckpts[0], tmp_path_factory.mktemp("vllm_sockets_logs"),
                      env={"GLOO_SOCKET_IFNAME": iface} if iface else None)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def socket_path(served):
    req = urllib.request.Request(served.url + "/get_server_info", headers=auth_headers())
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["upstream_socket"]


def _tree(served) -> list[psutil.Process]:
    adapter = psutil.Process(served.popen.pid)
    return [adapter, *adapter.children(recursive=True)]


def _role(p: psutil.Process, adapter_pid: int) -> str:
    if p.pid == adapter_pid:
        return "adapter"
    title = " ".join(p.cmdline())
    return title.split()[0] if title.startswith("VLLM::") else ("api_server" if "api_server" in title else title[:60])


def _sockets(served) -> dict:
    """{role (pid): {"tcp": [listening (ip, port)], "unix": [bound socket paths]}} over the engine's processes."""
    out = {}
    for p in _tree(served):
        try:
            conns = p.net_connections(kind="all")
            role = f"{_role(p, served.popen.pid)} ({p.pid})"
        except psutil.NoSuchProcess:
            continue
        out[role] = {"tcp": sorted((c.laddr.ip, c.laddr.port) for c in conns
                                   if c.status == psutil.CONN_LISTEN and c.family in (2, 10)),
                     "unix": sorted({c.laddr for c in conns if c.family == 1 and str(c.laddr).startswith("/")})}
    return out


def test_only_the_adapter_listens_on_tcp_besides_the_workers_gloo_on_loopback(served, socket_path):
    port = int(served.url.rsplit(":", 1)[1])
    found = _sockets(served)
    adapter = [v for k, v in found.items() if k.startswith("adapter")][0]
    assert adapter["tcp"] == [("127.0.0.1", port)], found
    api = [v for k, v in found.items() if k.startswith("api_server")]
    assert len(api) == 1 and api[0]["tcp"] == [] and socket_path in api[0]["unix"], found
    for role, s in found.items():
        if role.startswith("VLLM::Worker"):   # torch.distributed's gloo groups: loopback only
            assert s["tcp"] and all(ip in ("127.0.0.1", "::1") for ip, _ in s["tcp"]), found
        elif not role.startswith("adapter"):
            assert s["tcp"] == [], (role, found)
        # vLLM's ZMQ ipc:// sockets and its HTTP socket: all in the adapter's private directory
        assert all(path.startswith(os.path.dirname(socket_path) + "/") for path in s["unix"]), (role, found)
    assert any(s["unix"] for role, s in found.items() if role.startswith("VLLM::EngineCore")), found


def test_vllms_dev_routes_take_no_key_so_its_socket_dir_is_private(served, socket_path):
    """The vLLM fact behind the Unix socket: a dev route answers without the secret (only /v1... need it)."""
    d = os.stat(os.path.dirname(socket_path))
    assert d.st_mode & 0o777 == 0o700 and d.st_uid == os.getuid()
    # no Authorization header: /collective_rpc runs a method of our worker extension all the same
    body = json.dumps({"method": "slime_weight_checksum", "args": ["model.embed_tokens.weight"]}).encode()
    out = json.loads(unix_request(socket_path, "POST", "/collective_rpc", body, {"Content-Type": "application/json"}))
    assert len(out["results"][0]) == 8
    with pytest.raises(urllib.error.HTTPError) as e:
        unix_request(socket_path, "GET", "/v1/models")
    assert e.value.code == 401


def test_stop_leaves_no_process_and_no_directory(served, socket_path):
    procs = _tree(served)
    served.stop()
    gone, alive = psutil.wait_procs(procs, timeout=30)
    assert not alive, alive
    assert not os.path.exists(os.path.dirname(socket_path))

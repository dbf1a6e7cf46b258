"""The process-group listeners a rendezvous creates are on its address only (utils/rendezvous.py), measured with
psutil: torch's own TCPStore listens on every interface, ours on the host it is given; gloo follows a loopback
rendezvous even when GLOO_SOCKET_IFNAME names the routable interface."""
import os
import socket
from datetime import timedelta

import psutil

from slime_like.utils import rendezvous
from slime_like.utils.net import free_port



def _routable_interface() -> str:
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and not a.address.startswith("127.") for a in addrs):
            return name
    return "lo"


def _listeners() -> set:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


def test_store_listens_on_its_host_only_where_torch_listens_everywhere():
    import torch.distributed as dist

    before = _listeners()
    theirs = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30))
    assert _listeners() - before == {("::", theirs.port)}  # why utils/rendezvous.py binds the socket itself
    del theirs
    before = _listeners()
    ours = rendezvous.tcp_store("127.0.0.1", free_port(), 0, 1, timedelta(seconds=30))
    ours.set("k", "v")
    assert ours.get("k") == b"v"
    assert _listeners() - before == {("127.0.0.1", ours.port)}


def test_loopback_weight_sync_group_pins_gloo_and_restores_the_environment(monkeypatch):
    from slime_like.backends.engine_api.process_group import destroy_process_group, init_custom_process_group

    iface = _routable_interface()
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", iface)  # as on a host whose name resolves off loopback
    before = _listeners()
    pg = init_custom_process_group("gloo", f"tcp://127.0.0.1:{free_port()}", 1, 0, "listeners_test",
                                   timeout=timedelta(seconds=30))
    try:
        new = _listeners() - before
        assert new and all(ip == "127.0.0.1" for ip, _ in new), new  # the store and gloo's device
        assert os.environ["GLOO_SOCKET_IFNAME"] == iface
    finally:
        destroy_process_group(pg)


def test_gloo_interface_for_a_remote_rendezvous_lifts_the_loopback_pin(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")
    monkeypatch.setattr(rendezvous, "_user_ifname", [])
    rendezvous.pin_gloo_to_loopback()
    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"
    with rendezvous.gloo_interface_for("10.1.2.3"):
        assert os.environ["GLOO_SOCKET_IFNAME"] == "eth7"  # the user's, for an engine on another host
    with rendezvous.gloo_interface_for("127.0.0.1"):
        assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"
    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"
    assert rendezvous.is_loopback("localhost") and rendezvous.is_loopback("::1")
    assert not rendezvous.is_loopback("10.1.2.3") and not rendezvous.is_loopback("node-1")

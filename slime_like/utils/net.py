"""Network helpers shared by the trainer, the engines and the Ray layer."""
import socket


def free_port(host: str = "") -> int:
    """A TCP port that was free a moment ago (torch.distributed masters, engines, weight-sync groups).

    Probes all interfaces by default: Ray's workers listen on random ports of the node's own IP, so a port
    free on 127.0.0.1 can still be taken there, and a TCPStore that listens everywhere would fail with
    EADDRINUSE. Another process can take the port before we bind it; callers that can retry do."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]

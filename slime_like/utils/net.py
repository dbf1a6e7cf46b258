"""Network helpers shared by the trainer, the engines and the Ray layer."""
import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago (torch.distributed masters, engines, weight-sync groups).
    Another process can take it before we bind it; callers that can retry on EADDRINUSE do."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]

"""Helpers shared by the engine tests (imported by conftest and the tests)."""
import socket

from slime_like.args import make_args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_args(ckpt: str, **kw):
    return make_args(hf_checkpoint=ckpt, seed=0, sglang_server_args=kw)


def start(ckpt, tmp_path_factory, index=0, **kw):
    from slime_like.backends.engine_api.launcher import start_engine

    return start_engine(engine_args(ckpt, **kw), kind="cpu", engine_index=index, port=free_port(),
                        log_dir=str(tmp_path_factory.mktemp("engine_logs")), env={"OMP_NUM_THREADS": "1"})


def hf_greedy(model, prompt, n):
    """Greedy continuation of `prompt` for exactly n tokens by plain full forward passes (no KV cache, no
    padding, eos not special): the independent reference the engine's batched decoding must reproduce."""
    import torch

    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def run(coro):
    import asyncio

    return asyncio.run(coro)

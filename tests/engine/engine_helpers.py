"""Helpers shared by the engine tests (imported by conftest and the tests)."""
import argparse
import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_args(ckpt: str, **kw) -> argparse.Namespace:
    return argparse.Namespace(hf_checkpoint=ckpt, seed=0, save=None, sglang_server_args=kw)


def start(ckpt, tmp_path_factory, index=0, **kw):
    from slime_like.backends.sglang.launcher import start_engine

    return start_engine(engine_args(ckpt, **kw), kind="cpu", engine_index=index, port=free_port(),
                        log_dir=str(tmp_path_factory.mktemp("engine_logs")), env={"OMP_NUM_THREADS": "1"})


def hf_greedy(model, prompt, n):
    """transformers' own greedy continuation of `prompt` for exactly n tokens (eos ignored)."""
    import torch

    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def run(coro):
    import asyncio

    return asyncio.run(coro)

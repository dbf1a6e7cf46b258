"""Delta weight sync (--update-weight-mode delta) against a full disk push: bytes written and wall time per push.

    PYTHONPATH=. .venv/bin/python bench/bench_delta_sync.py [--hidden 512 --layers 8] [--lr 1e-5] [--pushes 3]
        [--encoding xor|overwrite]

A random Qwen2 (slime_like.tools.tiny_model, float32) is served by a real CPU engine. Per push, transformers' copy
of it takes one Adam step on a language-model loss, then its weights go to the engine by (a) DiskWeightSender (a full
HF checkpoint the engine reloads) and (b) DeltaWeightSender (xor deltas; the engine patches its local copy and
reloads it), each timed end to end (the engine has the weights when send returns). Two settings: every weight
trainable, and only layer 1's MLP (frozen layers / adapters). Prints bytes and seconds per push.
"""
import argparse
import os
import socket
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM

from slime_like.args import make_args
from slime_like.backends.engine_api import disk_delta
from slime_like.backends.engine_api.delta_sync import DeltaWeightSender
from slime_like.backends.engine_api.disk_sync import DiskWeightSender
from slime_like.backends.engine_api.launcher import start_engine
from slime_like.tools.tiny_model import build_tiny_checkpoint


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--pushes", type=int, default=3)
    p.add_argument("--encoding", default="xor", choices=["xor", "overwrite"])
    a = p.parse_args()
    root = tempfile.mkdtemp(prefix="delta_bench_")
    ckpt = build_tiny_checkpoint(os.path.join(root, "ckpt"), hidden_size=a.hidden, num_layers=a.layers,
                                 num_heads=8, num_kv_heads=4, ffn_hidden_size=a.hidden * 11 // 4)
    shared, local = os.path.join(root, "shared"), os.path.join(root, "local")
    args = make_args(hf_checkpoint=ckpt, seed=0, update_weight_disk_dir=shared,
                     update_weight_local_checkpoint_dir=local)
    engine = start_engine(args, kind="cpu", engine_index=0, port=_port(), log_dir=os.path.join(root, "logs"))
    names = set(disk_delta.read_checkpoint(ckpt))
    try:
        for trainable in ("", "model.layers.1.mlp."):
            model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
            for name, q in model.named_parameters():
                q.requires_grad_(name.startswith(trainable))
            opt = torch.optim.Adam([q for q in model.parameters() if q.requires_grad], lr=a.lr)
            full = DiskWeightSender([engine.url], shared, hf_checkpoint=ckpt)
            delta = DeltaWeightSender([engine.url], shared, local, ckpt, encoding=a.encoding)
            delta.connect()
            delta.send([(n, t) for n, t in model.state_dict().items() if n in names])   # version 0 + the start
            rows = []
            for step in range(a.pushes):
                ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12 + step]])
                opt.zero_grad()
                model(input_ids=ids, labels=ids).loss.backward()
                opt.step()
                named = [(n, t.detach()) for n, t in model.state_dict().items() if n in names]
                t0 = time.perf_counter()
                full_bytes = full.send(named)
                t1 = time.perf_counter()
                delta_bytes = delta.send(named)
                t2 = time.perf_counter()
                rows.append((full_bytes, t1 - t0, delta_bytes, t2 - t1))
            print(f"trainable {trainable or 'all'} ({a.hidden} hidden, {a.layers} layers, lr {a.lr}, {a.encoding}):")
            for fb, ft, db, dt in rows:
                print(f"  full push {fb / 1e6:.1f} MB in {ft:.2f} s; delta {db / 1e6:.2f} MB ({db / fb:.1%}) in "
                      f"{dt:.2f} s")
    finally:
        engine.stop()


if __name__ == "__main__":
    main()

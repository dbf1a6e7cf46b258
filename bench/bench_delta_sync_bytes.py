"""Bytes of a delta weight sync (--update-weight-mode delta) against a full push, for one optimizer step.

    PYTHONPATH=. .venv/bin/python bench/bench_delta_sync_bytes.py [--lr 1e-5] [--trainable model.layers.1.mlp.]

A tiny Qwen2 (slime_like.tools.tiny_model, float32) takes one Adam step on a language-model loss, with every
parameter trainable or only those whose name starts with --trainable; prints the full push's bytes and the
compressed xor / overwrite deltas (engine_api/disk_delta.encode, what the sender writes per tensor).
"""
import argparse
import tempfile

import torch
from transformers import AutoModelForCausalLM

from slime_like.backends.engine_api import disk_delta
from slime_like.tools.tiny_model import build_tiny_checkpoint


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--trainable", default="", help="name prefix of the trainable parameters (default: all)")
    a = p.parse_args()
    ckpt = build_tiny_checkpoint(tempfile.mkdtemp(prefix="delta_bench_"))
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    for name, param in model.named_parameters():
        param.requires_grad_(name.startswith(a.trainable))
    names = set(disk_delta.read_checkpoint(ckpt))
    before = {n: t.detach().clone() for n, t in model.state_dict().items() if n in names}
    opt = torch.optim.Adam([q for q in model.parameters() if q.requires_grad], lr=a.lr)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    full, wire = 0, {"xor": 0, "overwrite": 0}
    for n, t in model.state_dict().items():
        if n in names:
            new = t.contiguous().reshape(-1).view(torch.uint8).numpy()
            old = before[n].contiguous().reshape(-1).view(torch.uint8).numpy()
            full += new.size
            for enc in wire:
                wire[enc] += len(disk_delta.encode(new, old, enc)[0] or b"")
    print(f"trainable {a.trainable or 'all'}, lr {a.lr}: full push {full} bytes; "
          + ", ".join(f"{enc} delta {b} ({b / full:.1%})" for enc, b in wire.items()))


if __name__ == "__main__":
    main()

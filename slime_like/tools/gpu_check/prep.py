"""prep: a random-init Qwen2 of Qwen2.5-0.5B's shape (2 layers in the smoke) written by transformers, as a downloaded
checkpoint would be (bf16 safetensors on the GPU, fp32 in the smoke so its exports round-trip exactly), with a
tokenizer the engines can load."""
from __future__ import annotations

import json
import os
import shutil
import time

import torch

from slime_like.tools.gpu_check.common import param_count


def run(ctx, partial):
    import transformers

    t0 = time.time()
    torch.manual_seed(0)
    with torch.device(ctx.device):  # initialising 494 M parameters on the GPU takes a second, on CPU tens
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**ctx.cfg))
    if ctx.cuda:
        model = model.to(torch.bfloat16)
    tmp = ctx.ckpt + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    _tokenizer(tmp, ctx.cfg["vocab_size"])
    shutil.rmtree(ctx.ckpt, ignore_errors=True)
    os.replace(tmp, ctx.ckpt)
    n = sum(p.numel() for p in model.parameters())
    size = sum(os.path.getsize(os.path.join(ctx.ckpt, f)) for f in os.listdir(ctx.ckpt))
    with open(os.path.join(ctx.ckpt, "config.json")) as f:
        dtype = (lambda c: c.get("dtype") or c.get("torch_dtype"))(json.load(f))
    details = dict(params=n, params_formula=param_count(ctx.cfg), bytes=size, dtype=dtype,
                   seconds=round(time.time() - t0, 1), machine=machine())
    ok = n == param_count(ctx.cfg)
    return ("pass" if ok else "fail"), f"{n / 1e6:.1f}M params ({dtype}), {size / 2 ** 20:.0f} MiB", details


def _tokenizer(path: str, vocab: int) -> None:
    """A word-level tokenizer over the model's vocabulary (the engines need one; ids are what the checks use)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t1", pad_token="t0").save_pretrained(path)


def machine() -> dict:
    """What the summary's table needs to say where it was measured (the runner itself imports no torch)."""
    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out.update(gpu=props.name, gpu_memory_gb=round(props.total_memory / 2 ** 30, 1),
                   gpu_count=torch.cuda.device_count())
    return out

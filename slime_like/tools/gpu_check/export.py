"""export: the HF export the megatron_grpo check wrote (the project's hf_weights.export_hf of the trained weights)
loads in transformers and reproduces the trained Megatron logits: exactly in the smoke's fp32, within bf16 noise on
the GPU (transformers' own bf16-vs-fp32 difference on the export sets the scale)."""
from __future__ import annotations

import os

import torch

from slime_like.tools.gpu_check.common import compare_logits, hf_logits


def run(ctx, partial):
    saved = os.path.join(ctx.export_dir, "megatron_logits.pt")
    if not os.path.isfile(saved):
        return "fail", f"no HF export from megatron_grpo ({saved} missing)", {}
    ref = torch.load(saved)
    ids = ref["ids"].to(ctx.device)
    vocab = ctx.cfg["vocab_size"]
    hf_dtype = torch.bfloat16 if ctx.cuda else torch.float32
    hf = hf_logits(ctx, ctx.export_dir, hf_dtype, ids)
    trained = ref["logits"].to(ctx.device)
    details = {"trained_megatron_vs_hf_export": compare_logits(trained, hf, vocab, ids),
               "megatron_dtype": ref["dtype"], "hf_dtype": str(hf_dtype)}
    noise = 0.0
    if ctx.cuda:
        details["hf_bf16_vs_fp32"] = compare_logits(hf, hf_logits(ctx, ctx.export_dir, torch.float32, ids), vocab, ids)
        noise = details["hf_bf16_vs_fp32"]["logp_max"]
    got = details["trained_megatron_vs_hf_export"]["logp_max"]
    ok = got <= (5 * noise + 0.05 if ctx.cuda else 2e-5)
    return ("pass" if ok else "fail"), (f"trained Megatron ({ref['dtype']}) vs transformers on the export: logp "
                                        f"max|d| {got:.2e} (bf16 noise {noise:.3f})"), details

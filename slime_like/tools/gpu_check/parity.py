"""parity: the Megatron trainer's model (real parser -> config.json -> build_model with the kernel defaults of this
machine -> HF weights, as the trainer loads it) against transformers on fixed ids: fp32 logits / log-probs, and
bf16 on the GPU (judged against transformers' own bf16 error: megatron-core's local spec normalises in bf16,
transformers' Qwen2 in fp32, so bf16 is a numerics indicator, not a mapping test)."""
from __future__ import annotations

import time

import torch

from slime_like.tools.gpu_check.common import compare_logits, free_port, hf_logits, megatron_logits, parsed


def build(ctx, ckpt: str, bf16: bool):
    """chunks, args: the trainer's load path (no trainer: the parity is about the model)."""
    from slime_like.backends.megatron import hf_weights, model as M
    from slime_like.config.hf_config import fill_args_from_hf

    args = parsed(ctx, "--hf-checkpoint", ckpt, "--ref-load", ckpt)
    args.bf16 = bf16  # fp32 on a GPU is not a run configuration (slime's default is bf16): the parity asks for it
    args = fill_args_from_hf(args, ckpt)
    chunks = M.build_model(args)
    hf_weights.load_hf_weights(chunks, ckpt, args)
    return chunks, args


def spec_of(chunk, args) -> dict:
    from slime_like.backends.megatron import model as M

    layer = chunk.decoder.layers[0]
    cfg = chunk.config
    return {"te_spec": M.uses_te_spec(args), "norm": type(layer.input_layernorm).__name__,
            "core_attention": type(layer.self_attention.core_attention).__name__,
            "fusions_on": sorted(k for k in ("apply_rope_fusion", "gradient_accumulation_fusion",
                                             "masked_softmax_fusion", "bias_activation_fusion", "bias_dropout_fusion",
                                             "persist_layer_norm") if getattr(cfg, k))}


def run(ctx, partial):
    from slime_like.backends.megatron import parallel

    parallel.init_distributed(0, 1, master_port=free_port())
    ids = torch.randint(2, ctx.cfg["vocab_size"], (2, 32 if ctx.smoke else 256),
                        generator=torch.Generator().manual_seed(7)).to(ctx.device)
    vocab = ctx.cfg["vocab_size"]
    ref32 = hf_logits(ctx, ctx.ckpt, torch.float32, ids)
    details = {"tf32_matmul": torch.backends.cuda.matmul.allow_tf32}
    for dtype in (["fp32", "bf16"] if ctx.cuda else ["fp32"]):
        t0 = time.time()
        chunks, args = build(ctx, ctx.ckpt, bf16=dtype == "bf16")
        logits = megatron_logits(chunks[0], ids)
        details["spec"] = spec_of(chunks[0], args)
        details[f"megatron_{dtype}_vs_hf_fp32"] = compare_logits(logits, ref32, vocab, ids)
        if dtype == "bf16":
            ref16 = hf_logits(ctx, ctx.ckpt, torch.bfloat16, ids)
            details["megatron_bf16_vs_hf_bf16"] = compare_logits(logits, ref16, vocab, ids)
            details["hf_bf16_vs_hf_fp32"] = compare_logits(ref16, ref32, vocab, ids)
        details[f"{dtype}_s"] = round(time.time() - t0, 1)
        del chunks, logits
        partial.save(f"{dtype} done", details)
    return judge(ctx, details)


def judge(ctx, d: dict):
    """fp32: log-probs within 1e-3 on the GPU (GEMMs sum in another order), 2e-5 on CPU. bf16: at most 5x
    transformers' own bf16 error + 0.05."""
    f = d["megatron_fp32_vs_hf_fp32"]
    ok = f["logp_max"] < (1e-3 if ctx.cuda else 2e-5)
    line = f"fp32 logp max|d| {f['logp_max']:.2e}"
    if "megatron_bf16_vs_hf_fp32" in d:
        b, n = d["megatron_bf16_vs_hf_fp32"], d["hf_bf16_vs_hf_fp32"]
        ok = ok and b["logp_max"] <= 5 * n["logp_max"] + 0.05
        line += f"; bf16 logp max|d| {b['logp_max']:.3f} (transformers bf16's own: {n['logp_max']:.3f})"
    spec = d["spec"]
    line += f"; spec te={spec['te_spec']} attention={spec['core_attention']} fusions={spec['fusions_on'] or 'none'}"
    return ("pass" if ok else "fail"), line, d

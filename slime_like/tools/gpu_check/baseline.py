"""A plain transformers training step on the trainer checks' micro-batches: the yardstick of their speed (fp32 master
weights, bf16 autocast on the GPU, SDPA attention, AdamW, a PPO-style token loss over the full-vocabulary
log-softmax the trainers also compute)."""
from __future__ import annotations

import gc

import torch

from slime_like.tools.gpu_check.common import kernel_share, throughput, timed


def run(ctx, batch: dict) -> dict:
    from transformers import AutoModelForCausalLM

    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if ctx.cuda else 0
    model = AutoModelForCausalLM.from_pretrained(ctx.ckpt, dtype=torch.float32, attn_implementation="sdpa")
    model = model.to(ctx.device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=ctx.lr, weight_decay=0.0, foreach=True)
    toks = torch.tensor(batch["tokens"], device=ctx.device)
    adv = torch.tensor(batch["rewards"], device=ctx.device)
    p, n, total = ctx.prompt, ctx.n, float(ctx.n * (ctx.seq - ctx.prompt))

    def step():
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for i in range(0, n, ctx.mbs):
            ids = toks[i:i + ctx.mbs]
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=ctx.cuda):
                logits = model(input_ids=ids).logits
            lp = torch.log_softmax(logits[:, p - 1:-1].float(), -1).gather(-1, ids[:, p:, None])[..., 0]
            loss = -(adv[i:i + ctx.mbs, None] * torch.exp(lp - lp.detach())).sum() / total
            loss.backward()
            loss_sum += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss_sum

    steps = [timed(ctx, step)[1] for _ in range(min(ctx.steps, 5))]  # a median of 4 warm steps: enough, cheaper
    prof = kernel_share(ctx, step)
    peak = round((torch.cuda.max_memory_allocated() - base) / 2 ** 30, 2) if ctx.cuda else None
    del model, opt
    gc.collect()
    if ctx.cuda:
        torch.cuda.empty_cache()
    return {"throughput": throughput(ctx, [{"train_s": s} for s in steps]), "profile": prof, "gpu_peak_gb": peak}

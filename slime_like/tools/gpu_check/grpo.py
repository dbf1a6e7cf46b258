"""megatron_grpo / fsdp_grpo: GRPO rollouts with a KL reference through the project's trainer class
(trainer_api.build, the class --train-backend names), on one fixed synthetic batch: finite, learning (log-probs of the
positive-reward samples up, negative down), tokens/s, MFU, peak memory, the GPU-kernel share of one train step
(torch.profiler), offload / onload (memory released, same log-probs after, a step after onload still moves them);
the Megatron trainer also writes its HF export and its trained logits for the `export` check. Then, in the same
process with the trainer offloaded, a plain transformers step (fp32 master weights, bf16 autocast on the GPU,
SDPA, AdamW) over the same micro-batches: the speed ratio and its own kernel share."""
from __future__ import annotations

import gc
import math

import torch

from slime_like.tools.gpu_check import baseline
from slime_like.tools.gpu_check.common import (free_port, kernel_share, log, make_batch, param_count, parsed,
                                               peak_memory_gb, throughput, timed)


def make_trainer(ctx, backend: str):
    from slime_like.backends import trainer_api

    extra = ["--train-backend", backend] + (["--use-distributed-optimizer"] if backend == "megatron" else [])
    args = parsed(ctx, *extra)
    return trainer_api.build(args, role="actor", rank=0, world_size=1, master_addr="127.0.0.1",
                             master_port=free_port())


def one_rollout(ctx, t, batch, rollout_id: int, profile: bool = False) -> dict:
    """Scoring (policy + reference), advantages, one optimizer step: what the loop does per rollout."""
    score, s_score = timed(ctx, lambda: t.compute_log_probs(batch, old_policy=t.old_log_probs_needed()))
    batch.update(score)
    batch.update(t.compute_advantages(batch))
    prof = {}
    if profile:
        box = {}
        prof = kernel_share(ctx, lambda: box.setdefault("m", t.train_step(rollout_id, batch)))
        m, s_train = box["m"], prof["profiled_wall_s"]
    else:
        m, s_train = timed(ctx, lambda: t.train_step(rollout_id, batch))
    out = dict(loss=m["loss"], kl_loss=m.get("kl_loss"), grad_norm=m.get("grad_norm"), train_s=round(s_train, 4),
               score_s=round(s_score, 4))
    log(f"  rollout {rollout_id}: loss {m['loss']:.5f} grad_norm {m.get('grad_norm', float('nan')):.4f} "
        f"train {s_train:.3f}s score {s_score:.3f}s")
    return out | ({"profile": prof} if prof else {})


def sums(log_probs, batch) -> tuple:
    pos = sum(float(lp.sum()) for lp, r in zip(log_probs, batch["rewards"]) if r > 0)
    neg = sum(float(lp.sum()) for lp, r in zip(log_probs, batch["rewards"]) if r < 0)
    return pos, neg


def offload_cycle(ctx, t, batch, rollout_id: int) -> dict:
    before = t.compute_log_probs(batch)["log_probs"]
    alloc0 = torch.cuda.memory_allocated() if ctx.cuda else 0
    _, s_off = timed(ctx, t.offload)
    alloc1 = torch.cuda.memory_allocated() if ctx.cuda else 0
    _, s_on = timed(ctx, t.onload)
    after = t.compute_log_probs(batch)["log_probs"]
    diff = max(float((a - b).abs().max()) for a, b in zip(before, after))
    # the optimizer must still drive the weights the model computes with after onload
    one_rollout(ctx, t, batch, rollout_id)
    moved = max(float((a - b).abs().max()) for a, b in zip(after, t.compute_log_probs(batch)["log_probs"]))
    return dict(gpu_alloc_gb_before=round(alloc0 / 2 ** 30, 2), gpu_alloc_gb_offloaded=round(alloc1 / 2 ** 30, 2),
                offload_s=round(s_off, 2), onload_s=round(s_on, 2), log_probs_max_diff_after_onload=diff,
                log_probs_moved_by_a_step_after_onload=moved,
                ok=diff < 1e-5 and moved > 0 and (not ctx.cuda or alloc1 < alloc0 / 2))


def run_trainer(ctx, partial, backend: str):
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats()
    batch = make_batch(ctx)
    t, s_init = timed(ctx, lambda: make_trainer(ctx, backend))
    details = {"backend": backend, "init_s": round(s_init, 1), "params": param_count(ctx.cfg),
               "batch": f"{ctx.n} x {ctx.seq} tokens ({ctx.seq - ctx.prompt} response), micro-batch {ctx.mbs}",
               "precision": "bf16" if t.args.bf16 else "fp32"}
    before = t.compute_log_probs(batch)["log_probs"]
    steps = [one_rollout(ctx, t, batch, r, profile=r == ctx.steps - 1) for r in range(ctx.steps)]
    prof = steps[-1].pop("profile")  # the profiled step's time carries the profiler's overhead: not in the speed
    details.update(steps=steps, memory=peak_memory_gb(ctx), throughput=throughput(ctx, steps[:-1]), profile=prof)
    finite = all(math.isfinite(s["loss"]) and (s["grad_norm"] is None or math.isfinite(s["grad_norm"]))
                 for s in steps)
    (p0, n0), (p1, n1) = sums(before, batch), sums(t.compute_log_probs(batch)["log_probs"], batch)
    details["logprob_sums"] = dict(pos_before=p0, pos_after=p1, neg_before=n0, neg_after=n1)
    learned = p1 > p0 and n1 < n0
    partial.save(f"{len(steps)} rollouts done; offload / baseline not finished", details)
    details["offload"] = offload_cycle(ctx, t, batch, ctx.steps)
    if backend == "megatron":
        details["export"] = write_export(ctx, t)
    t.offload()  # the baseline gets the device to itself
    del t
    gc.collect()
    if ctx.cuda:
        torch.cuda.empty_cache()
    partial.save("trainer done; the transformers baseline did not finish", details)
    details["hf_baseline"] = baseline.run(ctx, batch)
    details["speed_ratio_vs_hf"] = round(details["throughput"]["tokens_per_s"] /
                                         details["hf_baseline"]["throughput"]["tokens_per_s"], 3)
    ok = finite and learned and details["offload"]["ok"]
    tp, prof = details["throughput"], details["profile"]
    mfu = f"MFU {tp['mfu']:.3f}" if tp["mfu"] is not None else "MFU n/a"
    share = f"GPU kernels {prof['kernel_share']:.0%} of a step" if prof["kernel_share"] is not None else \
        "GPU kernel share n/a"
    memory = ", ".join(f"{k} {v}" for k, v in details["memory"].items())
    line = (f"{len(steps)} rollouts finite={finite} learning={learned}; {tp['tokens_per_s']:.0f} tok/s, {mfu}, "
            f"x{details['speed_ratio_vs_hf']} a plain transformers step, {memory}, {share}; "
            f"offload/onload ok={details['offload']['ok']}")
    return ("pass" if ok else "fail"), line, details


def write_export(ctx, t) -> dict:
    """The project's HF export of the trained weights, and the trained logits on fixed ids (for `export`)."""
    import os
    import shutil

    from slime_like.backends.megatron import hf_weights
    from slime_like.tools.gpu_check.common import fixed_ids, megatron_logits

    shutil.rmtree(ctx.export_dir, ignore_errors=True)
    _, s = timed(ctx, lambda: hf_weights.export_hf(t.chunks, t.args, ctx.export_dir, ctx.ckpt))
    ids = fixed_ids(ctx)
    logits = megatron_logits(t.chunks[0], ids)[..., :ctx.cfg["vocab_size"]].cpu()
    torch.save({"ids": ids.cpu(), "logits": logits, "dtype": str(next(t.chunks[0].parameters()).dtype)},
               os.path.join(ctx.export_dir, "megatron_logits.pt"))
    return {"seconds": round(s, 1), "files": sorted(os.listdir(ctx.export_dir))}


def run_megatron(ctx, partial):
    return run_trainer(ctx, partial, "megatron")


def run_fsdp(ctx, partial):
    return run_trainer(ctx, partial, "fsdp")

"""What the checks share: the run's sizes (GPU or smoke), the trainers' flags, the synthetic GRPO batch, timing,
memory, logits comparison, the profiler's GPU-kernel share. Imported by the check processes only (torch)."""
from __future__ import annotations

import json
import os
import resource
import statistics
import time

import torch

# Qwen2.5-0.5B's published config.json (sizes, rope, norms) with random weights; initializer_range 0.05 gives logits
# far from uniform, so a parity check means something
QWEN2_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768, sliding_window=32768,
                 max_window_layers=24, use_sliding_window=False, rope_theta=1000000.0, rms_norm_eps=1e-6,
                 tie_word_embeddings=True, hidden_act="silu", bos_token_id=151643, eos_token_id=151643,
                 initializer_range=0.05, attention_dropout=0.0)
TINY = dict(QWEN2_05B, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=512, max_position_embeddings=1024, sliding_window=1024,
            max_window_layers=2, bos_token_id=1, eos_token_id=1, initializer_range=0.1)
# dense bf16 peak FLOP/s by GPU name (MFU); None elsewhere
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "H800": 989e12, "A100": 312e12, "A800": 312e12, "L40S": 362e12}


class Ctx:
    """One check process's view of the run."""

    def __init__(self, smoke: bool, work: str):
        self.smoke = smoke
        self.cuda = not smoke and torch.cuda.is_available()
        self.device = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        self.work = work
        self.ckpt = os.path.join(work, "qwen2_tiny" if smoke else "qwen2_0p5b_random")
        self.export_dir = os.path.join(work, "export_megatron")
        self.cfg = TINY if smoke else QWEN2_05B
        # n samples of seq tokens (prompt of them prompt), micro-batches of mbs, `steps` GRPO rollouts
        self.n, self.seq, self.prompt, self.mbs, self.steps, self.lr = (
            (8, 48, 16, 4, 4, 1e-3) if smoke else (64, 512, 128, 8, 10, 1e-5))
        self.syncs = 2 if smoke else 4
        self.dtype = "bf16" if self.cuda else "fp32"


def log(msg: str) -> None:
    print(msg, flush=True)


def short_error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".replace("\n", " ")[:400]


def trainer_flags(ctx: Ctx, *extra) -> list:
    """A one-GPU colocated GRPO run with a KL reference over ctx's batch, as a user types it. The GPU defaults
    (bf16, distributed optimizer) are named explicitly so the smoke runs the same configuration on CPU, in fp32."""
    flags = ["--hf-checkpoint", ctx.ckpt, "--ref-load", ctx.ckpt, "--rollout-batch-size", str(ctx.n // 8),
             "--n-samples-per-prompt", "8", "--num-rollout", str(ctx.steps + 2), "--colocate",
             "--actor-num-gpus-per-node", "1", "--hidden-dropout", "0", "--attention-dropout", "0",
             "--lr-decay-style", "constant", "--weight-decay", "0", "--clip-grad", "1.0", "--seed", "1234",
             "--global-batch-size", str(ctx.n), "--num-steps-per-rollout", "1", "--micro-batch-size", str(ctx.mbs),
             "--lr", str(ctx.lr), "--optimizer", "adam", "--advantage-estimator", "grpo", "--use-kl-loss",
             "--kl-loss-coef", "0.001", "--kl-loss-type", "low_var_kl", "--attention-softmax-in-fp32",
             "--accumulate-allreduce-grads-in-fp32"]
    if ctx.cuda:
        flags.append("--bf16")
    return flags + list(extra)


def parsed(ctx: Ctx, *extra, role: str = "actor"):
    from slime_like.args import make_args, role_args

    return role_args(make_args(*trainer_flags(ctx, *extra), validate=True), role)


def free_port() -> int:
    from slime_like.utils.net import free_port as fp

    return fp("127.0.0.1")


def make_batch(ctx: Ctx, seed: int = 0) -> dict:
    """ctx.n samples of ctx.seq random tokens (ctx.prompt of prompt), rewards alternating -1 / +1."""
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(2, ctx.cfg["vocab_size"], (ctx.n, ctx.seq), generator=g)
    r = ctx.seq - ctx.prompt
    return {"tokens": [t.tolist() for t in toks], "response_lengths": [r] * ctx.n, "loss_masks": [[1] * r] * ctx.n,
            "rewards": [1.0 if i % 2 else -1.0 for i in range(ctx.n)],
            "raw_rewards": [float(i % 2) for i in range(ctx.n)],
            "rollout_log_probs": [[-8.0] * r for _ in range(ctx.n)], "sample_indices": list(range(ctx.n)),
            "truncated": [0] * ctx.n}


def fixed_ids(ctx: Ctx, batch: int = 2, seed: int = 7) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, ctx.cfg["vocab_size"], (batch, 32 if ctx.smoke else 256), generator=g).to(ctx.device)


def param_count(cfg: dict) -> int:
    h, layers, v, f = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = h // heads
    attn = h * heads * hd + heads * hd + 2 * (h * kv * hd + kv * hd) + heads * hd * h
    return v * h * (1 if cfg["tie_word_embeddings"] else 2) + layers * (attn + 3 * h * f + 2 * h) + h


def sync(ctx: Ctx) -> None:
    if ctx.cuda:
        torch.cuda.synchronize()


def timed(ctx: Ctx, fn):
    """(fn(), seconds) with the device synchronised around it."""
    sync(ctx)
    t0 = time.perf_counter()
    out = fn()
    sync(ctx)
    return out, time.perf_counter() - t0


def peak_memory_gb(ctx: Ctx) -> dict:
    """GPU: torch's peak allocated; CPU: the process's peak resident set (the smoke's stand-in)."""
    if ctx.cuda:
        return {"gpu_peak_gb": round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)}
    return {"cpu_peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 2)}


def peak_flops(ctx: Ctx) -> float | None:
    if not ctx.cuda:
        return None
    name = torch.cuda.get_device_name(0)
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def throughput(ctx, steps: list) -> dict:
    tokens = ctx.n * ctx.seq  # every token of every sample goes through forward and backward
    warm = steps[1:] if len(steps) > 2 else steps
    med = statistics.median(s["train_s"] for s in warm)
    peak = peak_flops(ctx)
    tps = tokens / med
    return dict(tokens_per_step=tokens, step_s_median=round(med, 4), step_s_first=steps[0]["train_s"],
                tokens_per_s=round(tps, 1), mfu=round(6 * param_count(ctx.cfg) * tps / peak, 4) if peak else None)


def kernel_share(ctx: Ctx, fn) -> dict:
    """One call of fn under torch.profiler: wall time, and on the GPU the summed time of its device kernels and their
    share of the wall time (how much of the step the GPU is busy: issue #26 reads it). CPU: the wall time only."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.cuda else [])
    with profile(activities=activities) as prof:
        _, wall = timed(ctx, fn)
    out = {"profiled_wall_s": round(wall, 4)}
    if ctx.cuda:
        from torch.autograd import DeviceType

        events = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA]
        busy = sum(getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)
                   for e in events) / 1e6  # torch renamed the field (cuda -> device) in 2.4
        out.update(kernel_s=round(busy, 4), kernel_share=round(busy / wall, 3), kernels=sum(e.count for e in events))
    else:
        out.update(kernel_s=None, kernel_share=None, kernel_note="no GPU: device kernels are not measured")
    return out


def compare_logits(ours: torch.Tensor, ref: torch.Tensor, vocab: int, ids: torch.Tensor) -> dict:
    """max / mean |diff| of logits, of the full-vocabulary log-probs and of the next-token log-probs."""
    ours, ref = ours[..., :vocab].float(), ref[..., :vocab].float()
    lp_o, lp_r = torch.log_softmax(ours, -1), torch.log_softmax(ref, -1)
    tgt = ids[:, 1:, None]
    tok_o, tok_r = lp_o[:, :-1].gather(-1, tgt), lp_r[:, :-1].gather(-1, tgt)
    d = (ours - ref).abs()
    return dict(logits_max=d.max().item(), logits_mean=d.mean().item(), ref_logits_std=ref.std().item(),
                logp_max=(lp_o - lp_r).abs().max().item(), token_logp_max=(tok_o - tok_r).abs().max().item())


def hf_logits(ctx: Ctx, path: str, dtype: torch.dtype, ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(ctx.device).eval()
    with torch.no_grad():
        out = model(ids).logits.float()
    del model
    return out


def megatron_logits(chunk, ids: torch.Tensor) -> torch.Tensor:
    """Full logits of a one-stage Megatron chunk in eval mode (the padded vocabulary rows included)."""
    pos = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    mode = chunk.training
    chunk.eval()
    try:
        with torch.no_grad():
            return chunk(ids, pos, attention_mask=None).float()
    finally:
        chunk.train(mode)


class Partial:
    """A check's provisional result, rewritten as it goes: a check killed by its budget still reports what it
    found."""

    def __init__(self, path: str | None):
        self.path = path

    def save(self, summary: str, details: dict) -> None:
        if not self.path:
            return
        with open(self.path + ".tmp", "w") as f:
            json.dump({"status": "fail", "summary": summary, "details": details, "partial": True}, f, indent=1,
                      default=str)
        os.replace(self.path + ".tmp", self.path)

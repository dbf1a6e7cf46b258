"""sglang: one real SGLang engine (started by the project's launcher, as a run starts it) on the random checkpoint
receives the trained weights of the megatron_grpo export through TensorWeightSender (CUDA IPC) and generates with
them: its greedy tokens' log-probs after the push match transformers on the exported weights (within bf16 noise)
and differ from before the push. On the GPU it is skipped, with the reason, when sglang is not importable (the
runner decides); the smoke runs the same code against the project's CPU engine (same protocol, shared memory, fp32),
where the log-probs must match to 1e-4."""
from __future__ import annotations

import os
import secrets

import torch

from slime_like.tools.gpu_check.common import free_port, parsed

PROMPT = list(range(2, 34))
NEW_TOKENS = 8


def generate(url: str, key: str) -> tuple:
    from slime_like.backends.engine_api.client import post

    out = post(url, "/generate", {"input_ids": PROMPT, "return_logprob": True,
                                  "sampling_params": {"temperature": 0.0, "max_new_tokens": NEW_TOKENS}},
               timeout=300, api_key=key)
    pairs = out["meta_info"]["output_token_logprobs"]  # [logprob, token id, text] per generated token
    return [int(p[1]) for p in pairs], [float(p[0]) for p in pairs]


def reference_logprobs(ctx, tokens: list) -> list:
    """transformers on the exported weights: log p(token) of each generated token given what precedes it."""
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if ctx.smoke else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(ctx.export_dir, dtype=dtype).to(ctx.device).eval()
    ids = torch.tensor([PROMPT + tokens], device=ctx.device)
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)
    start = len(PROMPT) - 1
    return [float(logp[start + i, t]) for i, t in enumerate(tokens)]


def run(ctx, partial):
    from safetensors.torch import load_file

    from slime_like.backends.engine_api.launcher import start_engine
    from slime_like.backends.engine_api.weight_sync import TensorWeightSender

    key = secrets.token_hex(16)
    kind = "cpu" if ctx.smoke else "sglang"
    args = parsed(ctx, "--sglang-dtype", "float32") if ctx.smoke else \
        parsed(ctx, "--rollout-engine", "sglang", "--sglang-mem-fraction-static", "0.5")
    engine = start_engine(args, kind, port=free_port(), gpu_ids=[0], log_dir=ctx.work, api_key=key,
                          health_timeout=240)
    try:
        before_tokens, before_lp = generate(engine.url, key)
        weights = {}
        for f in sorted(os.listdir(ctx.export_dir)):
            if f.endswith(".safetensors"):
                weights.update(load_file(os.path.join(ctx.export_dir, f), device=str(ctx.device)))
        sender = TensorWeightSender([engine.url], timeout_s=300, api_key=key)
        sender.send(sorted(weights.items()), bucket_bytes=int(args.update_weight_buffer_size), weight_version="1")
        sender.close()
        tokens, lp = generate(engine.url, key)
    finally:
        engine.stop()
    ref = reference_logprobs(ctx, tokens)
    diff = max(abs(a - b) for a, b in zip(lp, ref))
    moved = before_tokens != tokens or max(abs(a - b) for a, b in zip(before_lp, lp)) > 0.1
    details = dict(before_tokens=before_tokens, tokens=tokens, engine_logprobs=lp, transformers_logprobs=ref,
                   max_logprob_diff=diff, output_changed_by_push=moved)
    ok = diff < (1e-4 if ctx.smoke else 0.1) and moved
    details["engine"] = kind
    line = (f"{'SGLang' if kind == 'sglang' else 'the CPU engine (smoke stand-in)'} generated {len(tokens)} tokens "
            f"with the pushed weights: log-probs within {diff:.1e} of "
            f"transformers on them, changed by the push={moved}")
    return ("pass" if ok else "fail"), line, details

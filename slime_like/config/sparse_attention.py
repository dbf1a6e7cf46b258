"""DeepSeek sparse attention (DeepSeek-V3.2 `deepseek_v32`, GLM-5 `glm_moe_dsa`): when the Megatron trainer may
train it.

Each query of these models attends only to the `index_topk` keys its lightning indexer scores highest. When a
sample has at most `index_topk` tokens, every query has at most that many keys (causal), so the indexer selects all
of them and the attention is exactly the model's dense multi-latent attention (DeepSeek-V3's), which the trainer
builds; the indexer's output then changes nothing and its weights get no gradient (they are neither loaded nor
trained; HF exports copy them from --hf-checkpoint, engines keep theirs). Longer samples need the sparse kernels
(the indexer's top-k and sparse MLA: slime's TileLang kernels, FlashMLA), which slime_like does not have: the launch
refuses a run whose samples can be longer, and the model refuses such a sample (backends/megatron/model.py).
"""
from __future__ import annotations

import os

MISSING_KERNEL = ("DeepSeek sparse attention's kernels (the lightning indexer's top-k and sparse multi-latent "
                  "attention: slime's TileLang kernels / FlashMLA), which slime_like does not have")


def check_length_bound(args, report) -> None:
    """Refuse at launch a DSA model whose samples (prompt + response) may exceed config.json's index_topk."""
    path = args.hf_checkpoint
    if not path or not os.path.isfile(os.path.join(path, "config.json")):
        return
    from slime_like.config.hf_config import family_of, read_hf_config

    cfg = read_hf_config(path)
    if not family_of(cfg).sparse_attention:
        return
    topk = int(cfg.get("index_topk") or 2048)
    prompt, response = args.rollout_max_prompt_len, args.rollout_max_response_len
    if prompt is not None and response is not None and prompt + response <= topk:
        return
    bound = "unbounded" if prompt is None or response is None else str(prompt + response)
    report.refuse(f"--hf-checkpoint {path}: model_type {cfg.get('model_type')} uses DeepSeek sparse attention with "
                  f"index_topk {topk}; the trainer builds it as dense multi-latent attention, the same computation "
                  f"only for samples of at most {topk} tokens, and --rollout-max-prompt-len + "
                  f"--rollout-max-response-len is {bound}. Longer samples need {MISSING_KERNEL}. Set both so their "
                  f"sum is at most {topk}")

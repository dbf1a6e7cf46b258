"""--shared-prompt-training in megatron-core (the layout: backends/training/shared_prompt.py).

megatron-core's GPTModel builds its rotary embedding by row index (`rotary_pos_emb(S)`: `[S, 1, 1, D]` for
positions 0..S-1). In a shared-prompt row response k follows responses 1..k-1, so its row index is off by their
lengths; RoPE is relative, but only within one sample's own positions. `per_token_rope` gathers the embedding's
rows by the micro-batch's `position_ids` for one forward of a chunk (a forward hook on the chunk's RotaryEmbedding),
so every token gets its position in its own sample; the result keeps the `[S, 1, 1, D]` shape the attention expects.

What the layout needs from the model, checked at launch (`launch_problems`): the local / SDPA core attention (it
takes the boolean mask; TransformerEngine's THD path would not), plain RoPE or position_ids-fed embeddings (no
M-RoPE / YaRN / MLA rotary), softmax attention in every layer (linear-attention layers would run their recurrence
across the responses) and no sparse attention.
"""
from __future__ import annotations

import contextlib

from slime_like.backends.megatron.hf_weights import unwrap


@contextlib.contextmanager
def per_token_rope(chunk, mb):
    """Inside this, `chunk`'s rotary embedding follows `mb.position_ids` (a shared-prompt micro-batch only)."""
    rope = getattr(unwrap(chunk), "rotary_pos_emb", None) if mb.per_token_positions else None
    if rope is None:
        yield
        return
    positions = mb.position_ids[0]
    handle = rope.register_forward_hook(lambda module, args, out: out[positions.to(out.device)])
    try:
        yield
    finally:
        handle.remove()


def launch_problems(args, use_te: bool, vision: bool) -> list[str]:
    """Why this machine / model cannot run --shared-prompt-training (empty: it can)."""
    flag = "--shared-prompt-training"
    problems = []
    if use_te:
        problems.append(f"{flag} needs the local / SDPA core attention (a boolean attention mask per row), but "
                        "TransformerEngine's layer spec is in use here: add --transformer-impl local, or drop the flag")
    if vision:
        problems.append(f"{flag}: vision-language models (M-RoPE, images) are not supported; drop the flag")
    if args.multi_latent_attention:
        problems.append(f"{flag}: multi-latent attention keeps its own rotary embedding; drop the flag")
    if args.position_embedding_type in ("yarn", "mrope"):  # learned / none take position_ids
        problems.append(f"{flag} needs plain RoPE, the model uses --position-embedding-type "
                        f"{args.position_embedding_type}; drop the flag")
    if args.hf_sparse_attention or args.hf_linear_attention or args.spec:
        problems.append(f"{flag}: sparse or linear attention layers (or a custom --spec) are not supported; "
                        "drop the flag")
    return problems

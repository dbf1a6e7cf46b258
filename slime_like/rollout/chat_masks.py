"""Loss masks of multi-turn chat data as slime's MultiTurnLossMaskGenerator hands them out: (token ids, mask) of a
conversation, 1 on the assistant turns. The mask comes from the tokenizer's own chat template
(sft_rollout.conversation_tokens renders growing prefixes), so one class serves every template; slime's
``tokenizer_type`` names the template family it hand-codes and is checked, not needed."""
from __future__ import annotations

from .sft_rollout import conversation_tokens

TOKENIZER_TYPES = ("qwen", "qwen3", "qwen3_5", "distill_qwen")


def get_response_lengths(loss_masks: list[list[int]]) -> list[int]:
    """Length of each mask from its first 1 to the end (0 when nothing is trained)."""
    return [len(mask) - mask.index(1) if 1 in mask else 0 for mask in loss_masks]


class MultiTurnLossMaskGenerator:
    def __init__(self, tokenizer, tokenizer_type: str = "qwen"):
        if tokenizer_type not in TOKENIZER_TYPES:
            raise ValueError(f"tokenizer_type {tokenizer_type!r}: expected one of {TOKENIZER_TYPES}")
        self.tokenizer, self.tokenizer_type = tokenizer, tokenizer_type

    def get_loss_mask(self, messages: list[dict], tools: list[dict] | None = None) -> tuple[list[int], list[int]]:
        return conversation_tokens(self.tokenizer, messages, tools)   # step_loss_mask 0: that turn untrained

    def get_response_lengths(self, loss_masks: list[list[int]]) -> list[int]:
        return get_response_lengths(loss_masks)

    def get_text_from_loss_mask(self, token_ids: list[int], loss_masks: list[int]) -> list[str]:
        """The decoded text of each run of trained tokens."""
        runs, current = [], []
        for token, m in zip(token_ids, loss_masks):
            if m == 1:
                current.append(token)
            elif current:
                runs.append(current)
                current = []
        if current:
            runs.append(current)
        return [self.tokenizer.decode(r) for r in runs]

"""slime.utils.mask_utils: loss masks of multi-turn chat data (slime_like/rollout/chat_masks.py)."""
from slime_like.rollout.chat_masks import MultiTurnLossMaskGenerator, get_response_lengths

__all__ = ["MultiTurnLossMaskGenerator", "get_response_lengths"]

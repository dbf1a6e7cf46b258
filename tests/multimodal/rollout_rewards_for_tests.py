"""Reward functions the multimodal rollout tests name with --custom-rm-path (imported from tests/multimodal)."""


async def reward_length(args, sample):
    return float(sample.response_length)

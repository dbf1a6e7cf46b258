"""User functions the rollout tests pass through --custom-rm-path / --custom-generate-function-path."""
from slime_like.rollout.generate import generate_sample


def reward_even_groups_split(args, sample):
    """Even prompts: rewards [1, 0, ...] (varied, kept by the filter); odd prompts: all 0 (filtered)."""
    return 1.0 if sample.group_index % 2 == 0 and sample.index % 2 == 0 else 0.0


def reward_one_in_four(args, sample):
    return 1.0 if sample.index % 4 == 0 else 0.0


def reward_length(args, sample):
    return float(sample.response_length)


def reward_raises(args, sample):
    raise RuntimeError(f"grader crashed on {sample.response_length} tokens")


async def generate_three_tokens(args, sample, sampling_params):
    sample.metadata["custom_generate"] = True
    return await generate_sample(args, sample, dict(sampling_params, max_new_tokens=3))


async def reward_length_slow(args, sample):
    """Slow grader: while group 0 is being scored (0.5 s), the next queued sample is already generating."""
    import asyncio

    await asyncio.sleep(0.5)
    return float(sample.response_length)


SEEN_ALL_GROUPS = []


def mark_first_sample_removed(args, groups):
    groups[0][0].remove_sample = True


def record_all_groups(args, groups, data_source):
    SEEN_ALL_GROUPS.append(sorted(g[0].group_index for g in groups))


def log_everything_myself(rollout_id, args, samples, metrics, rollout_time):
    return True


def post_process_double(args, samples):
    raw = [float(s.reward) for s in samples]
    return raw, [2 * r for r in raw]


async def generate_ignore_eos(args, sample, sampling_params):
    """The default generate with eos ignored: every response runs to max_new_tokens (timing tests)."""
    return await generate_sample(args, sample, dict(sampling_params, ignore_eos=True))

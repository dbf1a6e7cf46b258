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


ENGINE_URL = []  # set by a test: the engine reward_length_once_next_runs watches


async def reward_length_once_next_runs(args, sample):
    """Grader that returns only once the engine is generating the next response (its generated-token count has
    grown by a few since this call began): the partial-rollout abort that follows a group's scoring then meets a
    response mid-generation however fast the machine (a fixed sleep let a quiet one finish every response)."""
    import asyncio
    import time

    import aiohttp

    from slime_like.utils.auth import auth_headers

    async def generated(session):
        async with session.get(ENGINE_URL[0] + "/get_server_info", headers=auth_headers()) as r:
            return (await r.json())["internal_states"][0]["generated_tokens"]

    async with aiohttp.ClientSession() as session:
        start, deadline = await generated(session), time.monotonic() + 60
        while await generated(session) < start + 3:
            assert time.monotonic() < deadline, "the next response never started"
            await asyncio.sleep(0.002)
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


HOOKED = []


def record_sample(args, sample, rollout_id):
    HOOKED.append((rollout_id, sample.index))


async def relabel_sample(args, sample, **kwargs):
    """A replacing hook: returns a new Sample whose label the reward below checks."""
    import dataclasses

    return dataclasses.replace(sample, label="hooked", metadata=dict(sample.metadata, evaluation=kwargs["evaluation"]))


def reward_label_is_hooked(args, sample):
    return 1.0 if sample.label == "hooked" else 0.0


def newest_first(args, rollout_id, buffer, num_samples):
    """A buffer filter: the most recently returned groups go first (slime's default is FIFO)."""
    taken = buffer[-num_samples:][::-1]
    del buffer[-num_samples:]
    return taken


def train_data_with_doubled_rewards(args, samples):
    return {"tokens": [s.tokens for s in samples], "response_lengths": [s.response_length for s in samples],
            "loss_masks": [s.loss_mask for s in samples], "rewards": [2.0 * s.reward for s in samples],
            "raw_reward": [s.reward for s in samples], "my_key": [s.index for s in samples]}


async def generate_two_per_prompt(args, sample, sampling_params):
    """slime's multi-sample form: one prompt sample in, two trainable samples out (a 2- and a 3-token reply)."""
    import copy

    second = copy.deepcopy(sample)
    first = await generate_sample(args, sample, dict(sampling_params, max_new_tokens=2, ignore_eos=True))
    second = await generate_sample(args, second, dict(sampling_params, max_new_tokens=3, ignore_eos=True))
    return [first, second]


async def generate_not_a_sample(args, sample, sampling_params):
    return {"text": "no"}


def reward_label_is_answer_field(args, sample):
    """1.0 when the sample's label came from the `answer` field (an --eval-config dataset's own label_key)."""
    return 1.0 if sample.label == "A" else 0.0

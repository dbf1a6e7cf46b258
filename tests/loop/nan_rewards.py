"""A reward function that answers NaN for one prompt in seven (issue 19's probe), else the toy task's reward."""
from toy_task import digit_share


async def nan_for_one_prompt_in_seven(args, sample):
    if sample.group_index % 7 == 3:
        return float("nan")
    return await digit_share(args, sample)

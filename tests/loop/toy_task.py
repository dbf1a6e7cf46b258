"""A toy verifiable task for the end-to-end loop tests: the reward is the share of digits in the response.

A random tiny model writes digits ~10 % of the time; RL with the right sign raises that quickly, with the
wrong sign it falls. Imported by the rollout actor through --custom-rm-path toy_task.digit_share (the
tests put this folder on PYTHONPATH, which the driver hands to every Ray actor).
"""
import json
import os
import random

MAX_RESPONSE_LEN = 4


async def digit_share(args, sample) -> float:
    return sum(c.isdigit() for c in sample.response) / MAX_RESPONSE_LEN


async def exploding_reward(args, sample) -> float:
    """A reward function with the right signature that fails at run time (the actor-failure report test)."""
    raise ValueError("the reward model exploded on purpose")


def record_trainer_env(args):
    """--custom-megatron-init-path hook: what the trainer actor runs with (the --train-env-vars test reads it)."""
    import torch

    with open(os.path.join(args.run_dir, "trainer_env.json"), "w") as f:
        json.dump({"threads": torch.get_num_threads(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                   "probe": os.environ.get("SLIME_LIKE_TRAIN_ENV_PROBE")}, f)


def write_prompts(path, n=64, seed=0):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            prompt = "".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 5)))
            f.write(json.dumps({"prompt": prompt, "label": str(i)}) + "\n")
    return path

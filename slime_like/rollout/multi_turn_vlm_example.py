"""Example ``--custom-generate-function-path`` for vision-language models: a multi-turn rollout whose environment
answers each model turn with a new image (slime's geo3k_vlm_multi_turn shape).

    --multimodal-keys '{"image": "images"}' \
    --custom-generate-function-path slime_like.rollout.multi_turn_vlm_example.generate

Turn k: the model answers (trainable tokens), then the environment shows the prompt's first image rotated by
90 degrees k times with "Look again." (non-trainable tokens, multimodal.turns.append_observation), for
``args.max_tool_turns`` observations or until the response budget is spent. Every request sends all the
sample's images so far as image_data; the sample's multimodal_train_inputs hold every turn's pixels in order,
so the trainer scores the whole conversation with every image.
"""
from __future__ import annotations

from ..sample import Sample, Status
from .engines import current_state
from .generate_group import append_engine_output, sample_images

OBSERVATION = "Look again."


def _rotated_first_image(sample: Sample, turn: int):
    from slime_like.multimodal.images import load_image

    first = load_image(sample.multimodal_inputs["image"][0], where=f"sample {sample.index} image 0")
    return first.rotate(90 * turn, expand=True)


async def generate(args, sample: Sample, sampling_params: dict) -> Sample:
    from slime_like.multimodal.turns import append_observation

    state = current_state()
    if state.processor is None or not (sample.multimodal_inputs or {}).get("image"):
        raise ValueError("multi_turn_vlm_example.generate needs --multimodal-keys and a prompt with an image")
    budget = sampling_params["max_new_tokens"]
    for turn in range(1, int(args.max_tool_turns) + 2):
        remaining = budget - sample.response_length
        if remaining <= 0:
            sample.status = Status.TRUNCATED
            break
        out = await state.engine_generate(sample.tokens, dict(sampling_params, max_new_tokens=remaining),
                                          image_data=sample_images(sample))
        append_engine_output(sample, out)
        if sample.status != Status.COMPLETED or turn > int(args.max_tool_turns):
            break
        message = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": OBSERVATION}]}
        append_observation(sample, state.processor, message, [_rotated_first_image(sample, turn)])
        sample.status = Status.PENDING
        if sample.response_length >= budget:
            sample.status = Status.TRUNCATED   # the observation spent the budget: nothing left to answer with
            break
    sample.metadata["round_number"] = sample.metadata.get("round_number", 0) + turn   # read by --log-multi-turn
    return sample

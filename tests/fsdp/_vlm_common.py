"""Tiny Qwen2.5-VL / Qwen3-VL checkpoints (slime_like/tools/tiny_vlm.py) and multimodal rollout batches for the FSDP
VLM tests: what the rollout hands the trainer (contract of issue 30), built with the data stage's own processor
(slime_like/multimodal/processor.py): prompt ids with the image placeholders expanded, a response, and
`multimodal_train_inputs` = {pixel_values, image_grid_thw} per sample (None for a text sample)."""
import random

import numpy as np
import torch

FAMILIES = ("qwen2_5_vl", "qwen3_vl")
UNIT = {"qwen2_5_vl": 28, "qwen3_vl": 32}  # one merged patch, in pixels (patch 14 / 16 x merge 2)
# images per sample, as (width, height) in merged patches: one, two of different shapes, none (a text sample)
IMAGES = [((2, 2),), ((4, 2), (2, 4)), ((3, 4),), (), ((2, 3),), ((4, 4),), ((2, 2),), ((3, 2),)]


def build_tiny_vlm(out_dir, family):
    from slime_like.tools.tiny_vlm import build_tiny_vlm_checkpoint

    # init_std 0.1: logits far from uniform, so a parity check means something
    return build_tiny_vlm_checkpoint(out_dir, family=family, init_std=0.1)


def pattern_image(seed, size):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8), "RGB")


def images_for(family, shapes, seed):
    return [pattern_image(seed * 10 + k, (w * UNIT[family], h * UNIT[family])) for k, (w, h) in enumerate(shapes)]


def encode(processor, images, seed):
    """(prompt + response ids, response length, multimodal_train_inputs) of a chat prompt with `images`."""
    from slime_like.multimodal.processor import encode_prompt

    g = random.Random(seed)
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": "count " * g.randint(1, 3)}]
    prompt = encode_prompt(processor, processor.apply_chat_template([{"role": "user", "content": content}]), images)
    response = processor.tokenizer(f"{g.randint(0, 99)} shapes", add_special_tokens=False)["input_ids"]
    return prompt.token_ids + response, len(response), prompt.multimodal_train_inputs


def vlm_batch(ckpt, family, n=8, seed=0):
    """n samples of a rollout batch: one image, two images of different shapes, none, several sizes."""
    from slime_like.multimodal.processor import load_processor

    processor = load_processor(ckpt)
    b = {k: [] for k in ("tokens", "response_lengths", "loss_masks", "rewards", "raw_rewards", "rollout_log_probs",
                         "sample_indices", "truncated", "multimodal_train_inputs")}
    for i in range(n):
        tokens, r, mm = encode(processor, images_for(family, IMAGES[i % len(IMAGES)], seed * 100 + i), seed * 100 + i)
        b["tokens"].append(tokens)
        b["response_lengths"].append(r)
        b["loss_masks"].append([1] * r)
        b["rewards"].append(1.0 if i % 2 else -1.0)
        b["raw_rewards"].append(float(i % 2))
        b["rollout_log_probs"].append([-4.0] * r)
        b["sample_indices"].append(i)
        b["truncated"].append(0)
        b["multimodal_train_inputs"].append(mm)
    return b


def other_image(ckpt, family, batch, sample=0):
    """The batch with sample `sample`'s images replaced by others of the same sizes (same tokens)."""
    from slime_like.multimodal.processor import load_processor, process_images

    b = dict(batch, multimodal_train_inputs=list(batch["multimodal_train_inputs"]))
    shapes = IMAGES[sample % len(IMAGES)]
    b["multimodal_train_inputs"][sample] = process_images(load_processor(ckpt), images_for(family, shapes, 4242))
    return b


def hf_vlm(ckpt):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(ckpt, dtype=torch.float32).eval()


def hf_vlm_log_probs(model, batch, temperature=1.0, one_d_positions=False):
    """Reference: transformers' own forward (`model`: a checkpoint dir or the HF model), one sample at a time, with
    the inputs the HF processor gives it (mm_token_type_ids included), so transformers computes the M-RoPE
    positions itself. `one_d_positions`: plain 1-D positions instead (what a text model's position ids give)."""
    from slime_like.multimodal.processor import hf_model_inputs

    model = hf_vlm(model) if isinstance(model, str) else model
    out = []
    with torch.no_grad():
        for toks, r, mm in zip(batch["tokens"], batch["response_lengths"], batch["multimodal_train_inputs"]):
            inputs = hf_model_inputs(model.config.image_token_id, toks, mm)
            if one_d_positions:
                inputs["position_ids"] = torch.arange(len(toks))[None]
            logits = model(**inputs).logits[0] / temperature
            lp = torch.log_softmax(logits[len(toks) - r - 1:len(toks) - 1].float(), -1)
            out.append(lp.gather(-1, torch.tensor(toks[len(toks) - r:])[:, None])[:, 0])
    return out


def with_observation_image(ckpt, family, batch, sample=0):
    """The batch with a multi-turn observation inside sample `sample`'s response, as multimodal/turns.py appends
    one: after the first response token, non-trainable tokens holding a new image's placeholders, whose pixels are
    appended to the sample's multimodal_train_inputs."""
    from slime_like.multimodal.processor import load_processor, process_images

    processor = load_processor(ckpt)
    tok = processor.tokenizer
    image = process_images(processor, images_for(family, ((2, 3),), 777))
    n_image = int(image["image_grid_thw"].prod()) // processor.merge_size ** 2
    observation = tok.convert_tokens_to_ids(["<|vision_start|>"]) + [processor.image_token_id] * n_image \
        + tok.convert_tokens_to_ids(["<|vision_end|>"]) + tok("look again", add_special_tokens=False)["input_ids"]
    b = {k: list(v) for k, v in batch.items()}
    toks, r = b["tokens"][sample], b["response_lengths"][sample]
    cut = len(toks) - r + 1
    b["tokens"][sample] = toks[:cut] + observation + toks[cut:]
    b["response_lengths"][sample] = r + len(observation)
    b["loss_masks"][sample] = [1] + [0] * len(observation) + [1] * (r - 1)
    b["rollout_log_probs"][sample] = [-4.0] * (r + len(observation))
    mm = b["multimodal_train_inputs"][sample]
    b["multimodal_train_inputs"][sample] = {key: torch.cat([mm[key], image[key]]) for key in mm}
    return b

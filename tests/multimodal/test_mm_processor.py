"""slime_like.multimodal.processor against transformers' own Qwen-VL processor (the oracle): expanded prompt ids,
pixel values and grids, for Qwen2.5-VL and Qwen3-VL tiny checkpoints."""
import pytest
import torch

from mm_helpers import hf_processor, pattern_image, solid_image
from slime_like.multimodal.processor import encode_prompt, image_token_counts, load_processor, mm_token_type_ids

MESSAGES = [
    {"role": "system", "content": "Count."},
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many? "},
                                 {"type": "image"}, {"type": "text", "text": "and here?"}]},
]


@pytest.fixture(params=["qwen2_5_vl", "qwen3_vl"])
def family_ckpt(request, tiny_vlm_ckpt, tiny_qwen3_vl_ckpt):
    return request.param, {"qwen2_5_vl": tiny_vlm_ckpt, "qwen3_vl": tiny_qwen3_vl_ckpt}[request.param]


def test_prompt_ids_and_pixels_equal_transformers_processor(family_ckpt):
    family, ckpt = family_ckpt
    ours, oracle = load_processor(ckpt), hf_processor(ckpt, family)
    # two sizes: the small one is scaled up to min_pixels, the wide one keeps its aspect within max_pixels
    images = [pattern_image(1, size=(40, 40)), pattern_image(2, size=(120, 60))]
    text = ours.apply_chat_template(MESSAGES)
    assert text == oracle.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert text.count("<|image_pad|>") == 2 and text.endswith("<|im_start|>assistant\n")
    enc = encode_prompt(ours, text, images)
    want = oracle(text=[text], images=images, return_tensors="pt")
    assert enc.token_ids == want["input_ids"][0].tolist()
    assert torch.equal(enc.multimodal_train_inputs["image_grid_thw"], want["image_grid_thw"])
    assert torch.equal(enc.multimodal_train_inputs["pixel_values"], want["pixel_values"].float())
    assert enc.multimodal_train_inputs["pixel_values"].dtype == torch.float32
    assert enc.multimodal_train_inputs["image_grid_thw"].dtype == torch.long
    ids = torch.tensor([enc.token_ids])
    assert torch.equal(mm_token_type_ids(ours.image_token_id, ids), want["mm_token_type_ids"].to(torch.int32))
    counts = image_token_counts(ours, want["image_grid_thw"])
    assert enc.token_ids.count(ours.image_token_id) == sum(counts)
    assert counts[0] != counts[1]  # the two sizes give different token counts: the order of expansion matters


def test_56px_image_is_four_tokens(tiny_vlm_ckpt):
    proc = load_processor(tiny_vlm_ckpt)
    enc = encode_prompt(proc, proc.apply_chat_template([{"role": "user", "content": [{"type": "image"}]}]),
                        [solid_image()])
    assert enc.multimodal_train_inputs["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert enc.token_ids.count(proc.image_token_id) == 4


def test_text_only_prompt_has_no_train_inputs(tiny_vlm_ckpt):
    proc = load_processor(tiny_vlm_ckpt)
    enc = encode_prompt(proc, proc.apply_chat_template([{"role": "user", "content": "2+2?"}]), [])
    assert enc.multimodal_train_inputs is None
    assert proc.tokenizer.decode(enc.token_ids) == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"


def test_placeholder_count_mismatch_is_an_error(tiny_vlm_ckpt):
    proc = load_processor(tiny_vlm_ckpt)
    text = proc.apply_chat_template([{"role": "user", "content": [{"type": "image"}]}])
    with pytest.raises(ValueError, match=r"1 image placeholder\(s\) '<\|image_pad\|>' for 2 image\(s\)"):
        encode_prompt(proc, text, [solid_image(), solid_image()])
    with pytest.raises(ValueError, match="but no image"):
        encode_prompt(proc, text, [])


def test_text_checkpoint_is_refused(tiny_ckpt):
    with pytest.raises(Exception):
        load_processor(tiny_ckpt)

"""tools/tiny_vlm.py: the tiny Qwen2.5-VL / Qwen3-VL checkpoints load with transformers' Auto classes and their
images reach the logits."""
import json
import os

import pytest
import torch

from mm_helpers import pattern_image
from slime_like.multimodal.processor import encode_prompt, hf_model_inputs, load_processor
from slime_like.tools.tiny_vlm import FAMILIES, build_tiny_vlm_checkpoint


@pytest.fixture(params=FAMILIES)
def family_ckpt(request, tiny_vlm_ckpt, tiny_qwen3_vl_ckpt):
    return request.param, {"qwen2_5_vl": tiny_vlm_ckpt, "qwen3_vl": tiny_qwen3_vl_ckpt}[request.param]


def test_loads_and_images_change_the_logits(family_ckpt):
    from transformers import AutoConfig, AutoModelForImageTextToText

    family, ckpt = family_ckpt
    assert AutoConfig.from_pretrained(ckpt).model_type == family
    with open(os.path.join(ckpt, "processor_config.json")) as f:
        assert json.load(f)["processor_class"] == {"qwen2_5_vl": "Qwen2_5_VLProcessor",
                                                   "qwen3_vl": "Qwen3VLProcessor"}[family]
    model = AutoModelForImageTextToText.from_pretrained(ckpt).eval()
    assert next(model.parameters()).dtype == torch.float32
    proc = load_processor(ckpt)
    assert proc.tokenizer.eos_token == "<|im_end|>" and model.generation_config.eos_token_id == proc.tokenizer.eos_token_id
    text = proc.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}])
    logits = []
    for seed in (1, 2):
        enc = encode_prompt(proc, text, [pattern_image(seed)])
        with torch.no_grad():
            inputs = hf_model_inputs(proc.image_token_id, enc.token_ids, enc.multimodal_train_inputs)
            out = model(**inputs)
            # M-RoPE reached the model: the positions after the 4 image tokens advance by the grid's 2, not by 4
            assert int(model.model.rope_deltas.flatten()[0]) == -2
        logits.append(out.logits[0, -1])
    assert torch.isfinite(logits[0]).all()
    assert (logits[0] - logits[1]).abs().max() > 1e-4  # a different image gives different next-token logits


def test_deterministic_and_unknown_family(tmp_path):
    a = build_tiny_vlm_checkpoint(str(tmp_path / "a"), family="qwen3_vl", seed=3)
    b = build_tiny_vlm_checkpoint(str(tmp_path / "b"), family="qwen3_vl", seed=3)
    with open(os.path.join(a, "model.safetensors"), "rb") as fa, open(os.path.join(b, "model.safetensors"), "rb") as fb:
        assert fa.read() == fb.read()
    with pytest.raises(ValueError, match="unknown tiny VLM family 'llava'"):
        build_tiny_vlm_checkpoint(str(tmp_path / "c"), family="llava")

"""Vision-language GRPO through the whole loop (issue 30): the data source's images, the CPU engine serving the
tiny Qwen2.5-VL / Qwen3-VL with image_data, the FSDP trainer on each sample's multimodal_train_inputs, and the
weight push back into the engine, for 3 rollouts."""
import json

import pytest
from PIL import Image

import train
from conftest import loop_argv
from slime_like.utils.metrics import read_metrics

pytestmark = pytest.mark.slow


def _image_prompts(tmp_path, n=8):
    rows = []
    for i in range(n):
        Image.new("RGB", (56, 56), (30 * i, 255 - 30 * i, 90)).save(tmp_path / f"{i}.png")
        rows.append({"prompt": f"<image>Which digit is {i}?", "images": [f"{i}.png"], "label": str(i)})
    path = tmp_path / "vlm_prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_fsdp_grpo_with_images_three_rollouts(family, tiny_vlm_ckpt, tiny_qwen3_vl_ckpt, tmp_path):
    ckpt = {"qwen2_5_vl": tiny_vlm_ckpt, "qwen3_vl": tiny_qwen3_vl_ckpt}[family]
    argv = loop_argv(ckpt, _image_prompts(tmp_path), tmp_path, "--train-backend", "fsdp", "--colocate",
                     "--actor-num-gpus-per-node", "1", "--num-rollout", "3", "--rollout-batch-size", "4",
                     "--n-samples-per-prompt", "4", "--micro-batch-size", "8", "--multimodal-keys", '{"image": "images"}')
    assert train.main(argv) == 0
    rows = [r for r in read_metrics(str(tmp_path / "metrics.jsonl")) if r["rollout_id"] >= 0]
    assert [r["rollout_id"] for r in rows] == [0, 1, 2]
    for r in rows:  # the engine generated with the trainer's pushed weights and both saw the images
        assert r["rollout/logprob_abs_diff"] < 1e-3, r
    assert rows[-1]["actor/grad_norm"] > 0


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_megatron_grpo_with_images_three_rollouts(family, tiny_vlm_ckpt, tiny_qwen3_vl_ckpt, tmp_path):
    """The same loop with the Megatron trainer (megatron-core language model + the HF vision tower, M-RoPE)."""
    ckpt = {"qwen2_5_vl": tiny_vlm_ckpt, "qwen3_vl": tiny_qwen3_vl_ckpt}[family]
    argv = loop_argv(ckpt, _image_prompts(tmp_path), tmp_path, "--train-backend", "megatron", "--colocate",
                     "--actor-num-gpus-per-node", "1", "--num-rollout", "3", "--rollout-batch-size", "4",
                     "--n-samples-per-prompt", "4", "--micro-batch-size", "8", "--multimodal-keys", '{"image": "images"}')
    assert train.main(argv) == 0
    rows = [r for r in read_metrics(str(tmp_path / "metrics.jsonl")) if r["rollout_id"] >= 0]
    assert [r["rollout_id"] for r in rows] == [0, 1, 2]
    print(family, "logprob_abs_diff", [r["rollout/logprob_abs_diff"] for r in rows])
    for r in rows:  # the engine generated with the trainer's pushed weights and both saw the images
        assert r["rollout/logprob_abs_diff"] < 1e-3, r
    assert rows[-1]["actor/grad_norm"] > 0

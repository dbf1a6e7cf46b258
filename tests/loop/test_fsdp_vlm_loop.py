"""`--train-backend fsdp` with images through train.py (issue 30), the vision tower trained and frozen: Ray, the CPU
engine serving a tiny Qwen2.5-VL with SGLang's image_data, FSDP2 training, weight sync. Three GRPO rollouts each; in
every rollout the trainer's log-probs equal the engine's (< 1e-4: the previous push, a trained vision tower
included, reached the engine); with --freeze-vision-tower the pushes leave the tower out. (tests/loop/test_vlm_loop.py
runs both families with the tower trained.)"""
import json

import numpy as np
import pytest

import train
from conftest import loop_argv
from slime_like.utils.metrics import read_metrics

pytestmark = pytest.mark.slow
UNIT = {"qwen2_5_vl": 28, "qwen3_vl": 32}  # one merged patch in pixels: an image of 2x2 of them is 4 image tokens


def _image_prompts(tmp_path, family, n=4):
    """n prompts, each with one random-pattern PNG (2x2 or 3x2 merged patches) named relative to the data file."""
    from PIL import Image

    rows = []
    for i in range(n):
        side = UNIT[family]
        pixels = np.random.default_rng(i).integers(0, 256, size=(2 * side, (2 + i % 2) * side, 3), dtype=np.uint8)
        Image.fromarray(pixels, "RGB").save(tmp_path / f"img{i}.png")
        rows.append({"prompt": f"<image>digits {i}:", "images": [f"img{i}.png"], "label": str(i)})
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _run(family, tmp_path, *flags):
    from slime_like.tools.tiny_vlm import build_tiny_vlm_checkpoint

    ckpt = build_tiny_vlm_checkpoint(str(tmp_path / "ckpt"), family=family, init_std=0.1)
    run_dir = tmp_path / "run"
    argv = loop_argv(ckpt, _image_prompts(tmp_path, family), run_dir, "--train-backend", "fsdp", "--colocate",
                     "--actor-num-gpus-per-node", "1", "--num-rollout", "3", "--multimodal-keys",
                     '{"image": "images"}', "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
                     "--micro-batch-size", "8", *flags)
    assert train.main(argv) == 0
    rows = [r for r in read_metrics(str(run_dir / "metrics.jsonl")) if r["rollout_id"] >= 0]
    print(family, flags, [(r["rollout/logprob_abs_diff"], r["weights/bytes_sent"]) for r in rows])  # for the docs
    return rows


def test_three_grpo_rollouts_with_a_trained_and_a_frozen_vision_tower(tmp_path):
    trained = _run("qwen2_5_vl", tmp_path / "trained")
    frozen = _run("qwen2_5_vl", tmp_path / "frozen", "--freeze-vision-tower")
    for rows in (trained, frozen):
        assert [r["rollout_id"] for r in rows] == [0, 1, 2]
        for r in rows:  # rollouts 1 and 2 ran on pushed weights (a trained tower included)
            assert r["rollout/logprob_abs_diff"] < 1e-4, r
            assert r["weights/bytes_sent"] > 0 and r["actor/grad_norm"] > 0, r
    # the tower's weights (fp32) are what the frozen run's pushes leave out
    assert 0 < frozen[-1]["weights/bytes_sent"] < trained[-1]["weights/bytes_sent"]

"""Engine and FSDP trainer agree on multimodal samples (issue 30): the CPU engine serving a tiny Qwen2.5-VL /
Qwen3-VL generates a rollout with images (SGLang's image_data, the data source's own processing), and the FSDP
trainer's log-probs of the resulting train batch equal the engine's rollout log-probs (fp32, < 1e-4); the same
batch with one sample's image replaced moves that sample's trainer log-probs away from the engine's, so the image
reached both (and the same one)."""
import json
import os
import sys

import pytest
import torch
from _fsdp_common import make_args, run_ranks
from _vlm_common import FAMILIES, UNIT, build_tiny_vlm, pattern_image

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "multimodal"))
from mm_helpers import png_bytes, start_cpu_engine  # noqa: E402

pytestmark = pytest.mark.slow


def _prompts(tmp_path, family, n=2):
    """n prompts with one image each (sizes of 2x2 and 3x2 merged patches), images as files next to the data."""
    rows = []
    for i in range(n):
        side = UNIT[family]
        (tmp_path / f"{i}.png").write_bytes(png_bytes(pattern_image(20 + i, ((2 + i) * side, 2 * side))))
        rows.append({"prompt": f"<image>how many shapes, {i}?", "images": [f"{i}.png"], "label": str(i)})
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _rollout(ckpt, data, url):
    from slime_like.args import make_args as parse
    from slime_like.rollout.batch import to_train_batch
    from slime_like.rollout.controller import RolloutController

    args = parse("--hf-checkpoint", ckpt, "--prompt-data", data, "--input-key", "prompt", "--label-key", "label",
                 "--num-rollout", "1", "--colocate", "--actor-num-gpus-per-node", "1", "--num-gpus-per-node", "1",
                 "--rollout-max-response-len", "6", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
                 "--rollout-temperature", "1", "--train-backend", "fsdp", "--multimodal-keys", '{"image": "images"}',
                 "--seed", "7",
                 "--custom-rm-path", "rollout_rewards_for_tests.reward_length", validate=True)
    ctl = RolloutController(args, [url])
    try:
        samples, _ = ctl.generate(0)
    finally:
        ctl.close()
    return to_train_batch(args, samples)


def score_rank(rank, world_size, port, ckpt, batches):
    from slime_like.backends.fsdp.trainer import FSDPTrainer

    t = FSDPTrainer(make_args(ckpt, "--lr", "1e-2", "--micro-batch-size", "4", "--global-batch-size", "4"), "actor",
                    rank, world_size, master_port=port)
    return [t.compute_log_probs(b)["log_probs"] for b in batches]


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_and_fsdp_trainer_log_probs_agree_on_images(family, tmp_path):
    ckpt = build_tiny_vlm(str(tmp_path / "ckpt"), family)
    engine = start_cpu_engine(ckpt, str(tmp_path / "engine"))
    try:
        batch = _rollout(ckpt, _prompts(tmp_path, family), engine.url)
    finally:
        engine.stop()
    assert len(batch["tokens"]) == 4 and all(mm is not None for mm in batch["multimodal_train_inputs"])
    shapes = [tuple(mm["image_grid_thw"][0].tolist()) for mm in batch["multimodal_train_inputs"]]
    assert shapes[0] != shapes[2]  # two image sizes in one micro-batch
    swapped = dict(batch, multimodal_train_inputs=list(batch["multimodal_train_inputs"]))
    from slime_like.multimodal.processor import load_processor, process_images

    swapped["multimodal_train_inputs"][0] = process_images(load_processor(ckpt), [pattern_image(99, (
        2 * UNIT[family], 2 * UNIT[family]))])
    mine, other = run_ranks(score_rank, 1, ckpt, [batch, swapped])[0]
    engine_lp = [torch.tensor(x, dtype=torch.float32) for x in batch["rollout_log_probs"]]
    for ours, theirs in zip(mine, engine_lp):
        assert (ours - theirs).abs().max().item() < 1e-4
    assert (other[0] - engine_lp[0]).abs().max().item() > 1e-3  # another image: not the engine's sample
    for ours, theirs in zip(other[1:], engine_lp[1:]):
        assert (ours - theirs).abs().max().item() < 1e-4


def test_cpu_engine_reloads_a_qwen2_5_vl_checkpoint_from_disk(tmp_path):
    """Colocated runs reload the engine's weights from --hf-checkpoint's files on resume: Qwen2.5-VL files keep the
    names `model.layers.*` / `visual.*`, transformers 5's model has `model.language_model.*` / `model.visual.*`."""
    from safetensors import safe_open

    from _vlm_common import hf_vlm
    from slime_like.backends.cpu_engine.weights import load_from_disk

    ckpt = build_tiny_vlm(str(tmp_path / "ckpt"), "qwen2_5_vl")
    with safe_open(os.path.join(ckpt, "model.safetensors"), "pt") as f:
        assert any(k.startswith("visual.") for k in f.keys())  # the file's own names differ from the model's
    model, reference = hf_vlm(ckpt), dict(hf_vlm(ckpt).named_parameters())
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    assert load_from_disk(model, ckpt, [str(tmp_path)]) == len(reference)
    assert all(torch.equal(p, reference[n]) for n, p in model.named_parameters())

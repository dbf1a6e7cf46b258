"""The visual demo (issue 30 item 5): the shape-counting task, its exact-match reward, the SFT warm-up, and a very
short run of the whole pipeline (train.py, FSDP trainer, CPU engine with images). The learning claim (GRPO at least
doubles the held-out accuracy) is measured in docs/demo.md with its command, not asserted here."""
import asyncio
import base64
import hashlib
import io
import json
import os
from types import SimpleNamespace

import pytest
from PIL import Image

from slime_like.demo import shapes
from slime_like.demo.shapes import GRID, CELL, PROMPT, read_jsonl, score, score_ids, write_data
from slime_like.sample import Sample, Status


def _digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _shapes_seen(img) -> int:
    """Cells holding a shape, read from the pixels: shapes are drawn with every channel <= 160, backgrounds >= 215."""
    img = img.convert("RGB")
    cells = set()
    for y in range(img.height):
        for x in range(img.width):
            if max(img.getpixel((x, y))) <= 160:
                cells.add((y // CELL) * GRID + x // CELL)
    return len(cells)


def test_data_is_deterministic_and_the_answer_is_in_the_picture(tmp_path):
    a = write_data(str(tmp_path / "a"), n_train=60, n_heldout=20)
    b = write_data(str(tmp_path / "b"), n_train=60, n_heldout=20)
    for split in ("train", "heldout"):
        assert _digest(a[split]) == _digest(b[split])
    train, held = read_jsonl(a["train"]), read_jsonl(a["heldout"])
    assert len(train) == 60 and len(held) == 20
    assert {r["prompt"] for r in train + held} == {PROMPT}     # one text: only the picture tells the answer
    assert not {r["images"][0] for r in train} & {r["images"][0] for r in held}
    assert set(r["label"] for r in train) <= {str(n) for n in range(1, 10)} and len({r["label"] for r in train}) >= 6
    for rec in train[:25] + held:
        rel = rec["images"][0]
        assert not os.path.isabs(rel)  # read from the data file's folder, as the data source does
        assert _digest(tmp_path / "a" / rel) == _digest(tmp_path / "b" / rel)
        with Image.open(tmp_path / "a" / rel) as img:
            assert img.size == (84, 84)
            assert _shapes_seen(img) == int(rec["label"])


@pytest.mark.parametrize("response,truncated,expected", [
    ("7", False, 1.0), ("7<|im_end|>", False, 1.0), ("7<|im_end|>x", False, 1.0),
    ("77", False, 0.0), (" 7", False, 0.0), ("7", True, 0.0), ("", False, 0.0), ("6<|im_end|>", False, 0.0),
])
def test_score_text(response, truncated, expected):
    assert score(response, "7", truncated=truncated) == expected


def test_reward_decides_on_ids(tiny_vlm_ckpt):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_vlm_ckpt)
    seven, end = tok.encode("7", add_special_tokens=False), [tok.convert_tokens_to_ids("<|im_end|>")]
    pad = [tok.convert_tokens_to_ids("<|image_pad|>")]
    assert score_ids(seven + end, "7", tiny_vlm_ckpt) == 1.0
    assert score_ids(seven, "7", tiny_vlm_ckpt) == 1.0                   # the engine trimmed the stop token
    assert score_ids(seven, "7", tiny_vlm_ckpt, truncated=True) == 0.0
    assert score_ids(seven + pad + end, "7", tiny_vlm_ckpt) == 0.0       # a token that decodes to nothing visible
    assert score_ids(tok.encode("8", add_special_tokens=False) + end, "7", tiny_vlm_ckpt) == 0.0

    args = SimpleNamespace(hf_checkpoint=tiny_vlm_ckpt)
    prompt = tok.encode("How many shapes?", add_special_tokens=False)

    def sample(resp, text, status):
        return Sample(tokens=prompt + resp, response=text, response_length=len(resp), label="7", status=status)

    got = [asyncio.run(shapes.reward(args, s)) for s in (
        sample(seven + end, "7", Status.COMPLETED), sample(seven + seven, "77", Status.TRUNCATED),
        Sample(response="7", label="7", status=Status.COMPLETED))]                  # no ids: the text decides
    assert got == [1.0, 0.0, 1.0]


@pytest.fixture(scope="module")
def vlm_task(tmp_path_factory):
    """The demo's task, model and a short warm-up (a low target keeps it to a few dozen steps)."""
    from slime_like.demo.vlm_prepare import prepare

    out = str(tmp_path_factory.mktemp("vlm_demo") / "task")
    lines = []
    task = prepare(out, target=0.1, log=lines.append)
    return task, lines


def test_prepare_warms_up_then_skips(vlm_task):
    from transformers import AutoModelForImageTextToText

    from slime_like.demo.vlm_prepare import prepare
    from slime_like.demo.vlm_sft import VlmCodec, evaluate_greedy

    task, lines = vlm_task
    assert any(line.startswith("data: wrote 4000 train / 200 held-out") for line in lines)
    assert any(line.startswith("sft: saved") for line in lines)
    acc = task["sft"]["heldout_accuracy"]
    assert acc >= 0.1 and task["sft"]["history"][-1][2] == acc
    # the saved checkpoint is the evaluated one, checked again from disk with plain transformers
    model = AutoModelForImageTextToText.from_pretrained(task["sft_model"])
    assert evaluate_greedy(model, VlmCodec(task["sft_model"]), task["heldout"]) == pytest.approx(acc)
    mtime = os.path.getmtime(os.path.join(task["sft_model"], "model.safetensors"))
    again = []
    prepare(os.path.dirname(task["sft_model"]), target=0.1, log=again.append)
    assert sum("skipped" in line for line in again) == 3 and not any("saved" in line for line in again)
    assert os.path.getmtime(os.path.join(task["sft_model"], "model.safetensors")) == mtime


def _picture(data_url: str):
    return Image.open(io.BytesIO(base64.b64decode(data_url.split(",", 1)[1])))


@pytest.fixture
def own_ray():
    """The run below starts a private Ray in this process with its plan's one GPU slot; a later in-process run joins
    an initialised Ray as it is (ray/cluster.py init_ray), so the loop tests after this folder found a 1-GPU cluster
    and failed or hung (the CI run of e78be06). Stopped here once the run is over."""
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()


@pytest.mark.slow
def test_grpo_pipeline_runs_on_pictures(vlm_task, tmp_path, own_ray):
    """Two GRPO rollouts of the demo's recipe (smaller batches) through train.py: every trained sample carries its
    picture, whose shapes are its label, and its reward is the exact-match rule recomputed from its tokens."""
    from slime_like.demo.vlm_run import main
    from slime_like.rollout.debug_data import load_rollout
    from slime_like.utils.metrics import read_metrics

    task, _ = vlm_task
    run_dir = tmp_path / "run"
    os.makedirs(run_dir)
    os.symlink(os.path.dirname(task["sft_model"]), run_dir / "task")
    dumps = str(tmp_path / "rollout_{rollout_id}.json")
    assert main([str(run_dir), "--num-rollout", "2", "--rollout-batch-size", "4", "--micro-batch-size", "32",
                 "--lr-warmup-iters", "0",
                 "--eval-interval", "1", "--save-debug-rollout-data", dumps]) == 0
    rows = read_metrics(str(run_dir / "metrics.jsonl"))
    assert [r["rollout_id"] for r in rows if "rollout/reward" in r] == [0, 1]
    evals = [r for r in rows if "eval/shapes/accuracy" in r]
    assert [r["rollout_id"] for r in evals][:1] == [-1] and len(evals) >= 2
    # the engine's greedy eval before any update agrees with transformers' generate on the same pictures (a prompt
    # or two may flip on a near-tie between the batched engine and generate's batches)
    assert evals[0]["eval/shapes/accuracy"] == pytest.approx(task["sft"]["heldout_accuracy"], abs=0.015)
    assert os.path.exists(run_dir / "learning_curve.png")
    for rollout_id in (0, 1):
        samples = load_rollout(dumps, rollout_id)
        assert len(samples) == 4 * 8
        row = next(r for r in rows if r.get("rollout_id") == rollout_id and "rollout/reward" in r)
        assert row["rollout/reward"] == pytest.approx(sum(s.reward for s in samples) / len(samples))
        for s in samples:
            (url,) = s.multimodal_inputs["image"]
            assert _shapes_seen(_picture(url)) == int(s.label)
            response = s.tokens[len(s.tokens) - s.response_length:]
            want = score_ids(response, s.label, task["sft_model"], truncated=s.status == Status.TRUNCATED)
            assert s.reward == want
    json.dumps(rows)  # metrics are plain JSON

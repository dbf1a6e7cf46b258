"""slime's multimodal data format through the data source and the preflight: --multimodal-keys, images as paths
(relative to the data file), file:// URLs and base64, JSONL and Parquet; prompt ids and pixel values equal
transformers' processor; bad images stop the start before Ray with every bad row listed."""
import json

import pytest
import torch

from mm_helpers import b64, hf_processor, pattern_image, png_bytes, png_header_only
from slime_like.multimodal.images import load_image
from slime_like.rollout.batch import to_train_batch
from slime_like.rollout.data_source import RolloutDataSource
from slime_like.rollout.serialize import sample_from_dict, sample_to_dict

KEYS = '{"image": "images"}'


def _args(ckpt, data, *flags):
    from slime_like.args import make_args

    return make_args("--hf-checkpoint", ckpt, "--prompt-data", data, "--input-key", "prompt", "--label-key", "label",
                     "--num-rollout", "1", "--colocate", "--actor-num-gpus-per-node", "1", "--num-gpus-per-node", "1",
                     "--rollout-max-response-len", "4", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
                     "--multimodal-keys", KEYS, "--train-backend", "fsdp", *flags, validate=True)


@pytest.fixture
def image_rows(tmp_path):
    """Rows with each image form; returns (rows, [[PIL image, ...] per row])."""
    (tmp_path / "imgs").mkdir()
    imgs = [pattern_image(i, size=(56 + 28 * (i % 2), 56)) for i in range(4)]
    for i, im in enumerate(imgs):
        (tmp_path / "imgs" / f"{i}.png").write_bytes(png_bytes(im))
    rows = [
        {"prompt": "<image>How many?", "images": ["imgs/0.png"], "label": "1"},
        {"prompt": "Left <image> right <image>?", "images": [f"file://{tmp_path}/imgs/1.png", b64(png_bytes(imgs[2]))],
         "label": "2"},
        {"prompt": [{"role": "system", "content": "Look."}, {"role": "user", "content": "<image>and?"}],
         "images": ["data:image/png;base64," + b64(png_bytes(imgs[3]))], "label": "3"},
        {"prompt": "no image here", "images": [], "label": "4"},
    ]
    return rows, [[imgs[0]], [imgs[1], imgs[2]], [imgs[3]], []]


def _oracle(ckpt, family, row, images):
    """transformers' processor on the same conversation: (input_ids, pixel_values or None)."""
    oracle = hf_processor(ckpt, family)
    prompt = row["prompt"] if isinstance(row["prompt"], list) else [{"role": "user", "content": row["prompt"]}]
    messages = []
    for m in prompt:
        parts = m["content"].split("<image>")
        content = [{"type": "text", "text": parts[0]}] if parts[0] else []
        for rest in parts[1:]:
            content += [{"type": "image"}] + ([{"type": "text", "text": rest}] if rest else [])
        messages.append({"role": m["role"], "content": content})
    text = oracle.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    out = oracle(text=[text], images=images or None, return_tensors="pt")
    return out["input_ids"][0].tolist(), out.get("pixel_values")


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_data_source_fills_the_contract_fields(tmp_path, tiny_vlm_ckpt, image_rows, fmt):
    rows, images = image_rows
    if fmt == "jsonl":
        path = tmp_path / "data.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:  # parquet: the 3rd image as Hugging Face datasets' image struct {bytes, path}, the list column as is
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = [dict(r) for r in rows]
        rows[2] = dict(rows[2], prompt="<image>and?", images=[{"bytes": png_bytes(images[2][0]), "path": None}])
        rows = [dict(r, images=[i if isinstance(i, dict) else {"bytes": None, "path": i} for i in r["images"]])
                for r in rows]
        path = tmp_path / "data.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
    ds = RolloutDataSource(_args(tiny_vlm_ckpt, str(path)), tokenizer=None)
    groups = ds.get_samples(2) + ds.get_samples(2)
    for g, row, imgs in zip(groups, rows, images):
        s = g[0]
        want_ids, want_pixels = _oracle(tiny_vlm_ckpt, "qwen2_5_vl", row if fmt == "jsonl" or row is not rows[2]
                                        else dict(row, prompt="<image>and?"), imgs)
        assert s.tokens == want_ids and s.response_length == 0
        if not imgs:
            assert s.multimodal_inputs is None and s.multimodal_train_inputs is None
            continue
        urls = s.multimodal_inputs["image"]
        assert len(urls) == len(imgs) and all(u.startswith("data:image/png;base64,") for u in urls)
        assert [load_image(u, where="t").tobytes() for u in urls] == [im.tobytes() for im in imgs]
        assert torch.equal(s.multimodal_train_inputs["pixel_values"], want_pixels.float())
        assert g[1].multimodal_train_inputs is s.multimodal_train_inputs   # processed once per group
        json.dumps(s.multimodal_inputs)


def test_samples_serialize_and_batch_carry_train_inputs(tmp_path, tiny_vlm_ckpt, image_rows):
    rows, _ = image_rows
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = _args(tiny_vlm_ckpt, str(path))
    ds = RolloutDataSource(args, tokenizer=None)
    samples = [s for g in ds.get_samples(4) for s in g]
    back = sample_from_dict(json.loads(json.dumps(sample_to_dict(samples[2]))))
    for k in ("pixel_values", "image_grid_thw"):
        assert torch.equal(back.multimodal_train_inputs[k], samples[2].multimodal_train_inputs[k])
        assert back.multimodal_train_inputs[k].dtype == samples[2].multimodal_train_inputs[k].dtype
    for s in samples:
        s.tokens.append(5)
        s.response_length, s.loss_mask, s.rollout_log_probs, s.reward = 1, [1], [-0.5], 1.0
    batch = to_train_batch(args, samples)
    assert [x is None for x in batch["multimodal_train_inputs"]] == [False] * 6 + [True] * 2
    assert batch["multimodal_train_inputs"][0] is samples[0].multimodal_train_inputs


def test_preflight_lists_every_bad_image_before_ray(tmp_path, tiny_vlm_ckpt, capsys):
    import sys

    import train

    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()   # an earlier in-process run's Ray (the CI run): the check below needs none

    (tmp_path / "ok.png").write_bytes(png_bytes(pattern_image(0)))
    (tmp_path / "notes.png").write_text("text")
    rows = [{"prompt": "<image>a", "images": ["ok.png"], "label": "1"},
            {"prompt": "<image>b", "images": ["gone.png"], "label": "1"},
            {"prompt": "<image>c", "images": ["notes.png"], "label": "1"},
            {"prompt": "<image>d", "images": [b64(png_header_only(9000, 9000))], "label": "1"},
            {"prompt": "<image><image>e", "images": ["ok.png"], "label": "1"}]
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["--hf-checkpoint", tiny_vlm_ckpt, "--prompt-data", str(path), "--input-key", "prompt", "--label-key",
            "label", "--num-rollout", "1", "--rollout-batch-size", "2", "--colocate", "--actor-num-gpus-per-node", "1",
            "--num-gpus-per-node", "1", "--multimodal-keys", KEYS, "--train-backend", "fsdp"]
    for extra in (["--dry-run"], []):
        try:
            code = train.main(argv + extra)
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err
        assert code == 2, err
        assert "--prompt-data: 4 problem(s) with images in 4 row(s)" in err
        assert f"{path}:2: image 0 (key 'images'[0]): image file 'gone.png' not found" in err
        assert f"{path}:3: image 0 (key 'images'[0]): 'notes.png' is not an image Pillow can read" in err
        assert f"{path}:4: image 0 (key 'images'[0]): image" in err and "9000x9000 = 81000000 pixels" in err
        assert f"{path}:5: the prompt has 2 '<image>' placeholder(s) for 1 image(s)" in err
        assert f"{path}:1:" not in err
    assert "ray" not in sys.modules or not __import__("ray").is_initialized()


@pytest.mark.parametrize("keys, expected", [
    ('{"video": "v"}', "media type 'video' is not supported"),
    ('["images"]', "expected a JSON object mapping a media type"),
    ('{"image": 3}', "'image' maps to 3"),
])
def test_bad_multimodal_keys(tmp_path, tiny_vlm_ckpt, keys, expected):
    from slime_like.config.errors import ConfigError

    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "x", "label": "1"}\n')
    with pytest.raises((ConfigError, SystemExit)) as err:
        _args(tiny_vlm_ckpt, str(path), "--multimodal-keys", keys)
    assert expected in str(err.value) or expected in str(getattr(err.value, "__context__", ""))


def test_text_checkpoint_is_refused(tmp_path, tiny_ckpt):
    from slime_like.config.errors import ConfigError

    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "x", "label": "1"}\n')
    with pytest.raises(ConfigError, match="needs a vision-language --hf-checkpoint; .* model_type 'qwen2'"):
        _args(tiny_ckpt, str(path))


def test_vllm_engine_is_refused_with_images(tmp_path, tiny_vlm_ckpt):
    from slime_like.config.errors import ConfigError

    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "x", "label": "1"}\n')
    with pytest.raises(ConfigError, match=r"--multimodal-keys with --rollout-engine vllm: the vLLM adapter takes no "
                                          r"images .* use SGLang and the CPU engine"):
        _args(tiny_vlm_ckpt, str(path), "--rollout-engine", "vllm")
    assert _args(tiny_vlm_ckpt, str(path), "--rollout-engine", "cpu").rollout_engine == "cpu"


class _TextOnlyTrainer:
    """Stands in for a trainer class without the trains_images capability (the configuration layer only names it)."""


def test_a_trainer_without_images_is_refused(tmp_path, tiny_vlm_ckpt):
    """A trainer backend without the trains_images capability: --multimodal-keys with it is an error before any work,
    not a run that trains on the tokens alone. Both built trainers (FSDP, Megatron) train on images."""
    from slime_like.backends import trainer_api
    from slime_like.config.errors import ConfigError
    from slime_like.registry import TRAINER_BACKENDS

    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "x", "label": "1"}\n')
    assert _args(tiny_vlm_ckpt, str(path), "--train-backend", "megatron").train_backend == "megatron"
    trainer_api.register_backend("text_only_trainer", _TextOnlyTrainer, capabilities=set())
    try:
        with pytest.raises(ConfigError, match=r"--multimodal-keys with --train-backend text_only_trainer: .* does "
                                              r"not train on images .* use the Megatron trainer or the FSDP trainer"):
            _args(tiny_vlm_ckpt, str(path), "--train-backend", "text_only_trainer")
    finally:
        TRAINER_BACKENDS.unregister("text_only_trainer")

"""A rollout with images end to end: the data source's samples go to a real CPU engine serving the tiny Qwen2.5-VL
with SGLang's image_data, come back with log-probs that equal transformers' (so the engine saw each sample's
image), and the train batch carries each sample's multimodal_train_inputs."""
import json

import pytest
import torch

from mm_helpers import greedy_reference, pattern_image, png_bytes, start_cpu_engine
from slime_like.rollout.batch import to_train_batch
from slime_like.rollout.controller import RolloutController


@pytest.fixture(scope="module")
def vlm_engine(tiny_vlm_ckpt, tmp_path_factory):
    proc = start_cpu_engine(tiny_vlm_ckpt, str(tmp_path_factory.mktemp("vlm_rollout_engine")))
    yield proc.url
    proc.stop()


@pytest.fixture(scope="module")
def hf_vlm(tiny_vlm_ckpt):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(tiny_vlm_ckpt).eval()


def _data(tmp_path, n=4):
    rows = []
    for i in range(n):
        (tmp_path / f"{i}.png").write_bytes(png_bytes(pattern_image(10 + i)))
        rows.append({"prompt": f"<image>shape {i}?", "images": [f"{i}.png"], "label": str(i)})
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _args(ckpt, data, *flags):
    from slime_like.args import make_args

    return make_args("--hf-checkpoint", ckpt, "--prompt-data", data, "--input-key", "prompt", "--label-key", "label",
                     "--num-rollout", "1", "--colocate", "--actor-num-gpus-per-node", "1", "--num-gpus-per-node", "1",
                     "--rollout-max-response-len", "5", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
                     "--rollout-greedy", "--multimodal-keys", '{"image": "images"}', "--train-backend", "fsdp",
                     "--custom-rm-path", "rollout_rewards_for_tests.reward_length", *flags, validate=True)


def test_rollout_with_images_matches_transformers(tmp_path, tiny_vlm_ckpt, vlm_engine, hf_vlm):
    from slime_like.multimodal.processor import load_processor

    ctl = RolloutController(_args(tiny_vlm_ckpt, _data(tmp_path)), [vlm_engine])
    try:
        samples, metrics = ctl.generate(0)
    finally:
        ctl.close()
    assert len(samples) == 4 and metrics["rollout/num_samples"] == 4
    image_token = load_processor(tiny_vlm_ckpt).image_token_id
    for s in samples:
        assert s.response_length > 0 and s.tokens.count(image_token) == 4
        ids, lps = greedy_reference(hf_vlm, image_token, s.tokens[:s.prompt_length], s.multimodal_train_inputs,
                                    s.response_length)
        assert s.tokens[s.prompt_length:] == ids
        assert max(abs(a - b) for a, b in zip(s.rollout_log_probs, lps)) < 1e-4
    # two prompts, two different images: different log-probs for the same greedy text
    assert samples[0].rollout_log_probs != samples[2].rollout_log_probs
    batch = to_train_batch(ctl.args, samples)
    assert all(torch.equal(b["pixel_values"], s.multimodal_train_inputs["pixel_values"])
               for b, s in zip(batch["multimodal_train_inputs"], samples))


def test_multi_turn_with_images(tmp_path, tiny_vlm_ckpt, vlm_engine, hf_vlm):
    """slime's multi-turn VLM shape: each environment turn shows a new image; the engine gets every image so far,
    the sample carries every turn's pixels, observation tokens are not trained on, and the policy tokens'
    log-probs equal transformers' over the whole conversation with all its images."""
    from slime_like.multimodal.processor import encode_prompt, load_processor

    proc = load_processor(tiny_vlm_ckpt)
    first = encode_prompt(proc, proc.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "shape 0?"}]}]), [pattern_image(10)])
    stop_id = greedy_reference(hf_vlm, proc.image_token_id, first.token_ids, first.multimodal_train_inputs, 1)[0][0]
    # every turn ends after one token (the greedy first token is the stop token): 3 answers, 2 observations
    args = _args(tiny_vlm_ckpt, _data(tmp_path, n=2), "--rollout-max-response-len", "200", "--n-samples-per-prompt",
                 "1", "--custom-generate-function-path", "slime_like.rollout.multi_turn_vlm_example.generate",
                 "--max-tool-turns", "2", "--rollout-stop-token-ids", str(stop_id))
    ctl = RolloutController(args, [vlm_engine])
    try:
        samples, _ = ctl.generate(0)
    finally:
        ctl.close()
    s = samples[0]
    assert len(s.multimodal_inputs["image"]) == 3
    grids = s.multimodal_train_inputs["image_grid_thw"]
    assert len(grids) == 3 and s.multimodal_train_inputs["pixel_values"].shape[0] == int(grids.prod(-1).sum())
    assert s.tokens.count(proc.image_token_id) == sum(int(g.prod()) // 4 for g in grids)
    trained = [i for i, m in enumerate(s.loss_mask) if m]
    assert len(trained) == 3 and 0 < s.loss_mask.count(0) == s.response_length - 3
    assert s.metadata["round_number"] == 3
    # transformers over the whole sequence, every image: the log-prob of each trained token
    from slime_like.multimodal.processor import hf_model_inputs

    with torch.no_grad():
        logits = hf_vlm(**hf_model_inputs(proc.image_token_id, s.tokens, s.multimodal_train_inputs)).logits[0]
    logp = torch.log_softmax(logits.float(), -1)
    for i in trained:
        pos = s.prompt_length + i
        assert abs(float(logp[pos - 1, s.tokens[pos]]) - s.rollout_log_probs[i]) < 1e-4


def test_sampled_placeholder_tokens_end_the_response(tmp_path, tiny_vlm_ckpt, vlm_engine):
    """A random tiny VLM at temperature 1 samples <|image_pad|> / <|video_pad|> now and then (2 of 128 ids: about
    8 in these 512 tokens); no trainer can score such a token, so the response ends before it. Every sample that
    reaches training has exactly its images' placeholder tokens."""
    from slime_like.multimodal.processor import image_token_counts, load_processor

    proc = load_processor(tiny_vlm_ckpt)
    placeholders = {proc.image_token_id, proc.tokenizer.convert_tokens_to_ids("<|video_pad|>")}
    args = _args(tiny_vlm_ckpt, _data(tmp_path, n=8), "--rollout-max-response-len", "16", "--rollout-batch-size", "4",
                 "--n-samples-per-prompt", "8", "--rollout-temperature", "1")
    args.rollout_greedy = False
    ctl = RolloutController(args, [vlm_engine])
    try:
        samples, metrics = ctl.generate(0)
    finally:
        ctl.close()
    cut = [s for s in samples if s.metadata.get("cut_at_placeholder")]
    assert cut, "no placeholder was sampled in 512 tokens"
    for s in samples:
        assert not placeholders & set(s.tokens[s.prompt_length:])
        assert s.tokens.count(proc.image_token_id) == sum(image_token_counts(
            proc, s.multimodal_train_inputs["image_grid_thw"]))
        assert s.response_length >= 1
    assert all(s.response_length < 16 and s.status.value == "truncated" for s in cut)

"""The CPU engine serving Qwen2.5-VL / Qwen3-VL over real HTTP with SGLang's image_data, against transformers:
greedy tokens equal transformers' generate, log-probs equal a full-forward reference (which proves the image
reached the model: a different image gives different log-probs), in batches mixing images and text."""
import asyncio

import pytest
import torch

from mm_helpers import greedy_reference, pattern_image, start_cpu_engine
from slime_like.backends.engine_api.client import EngineClient, EngineError
from slime_like.multimodal.images import image_to_data_url
from slime_like.multimodal.processor import encode_prompt, hf_model_inputs, load_processor

N = 6
GREEDY = {"temperature": 0, "max_new_tokens": N, "ignore_eos": True}


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def served(request, tiny_vlm_ckpt, tiny_qwen3_vl_ckpt, tmp_path_factory):
    from transformers import AutoModelForImageTextToText

    ckpt = {"qwen2_5_vl": tiny_vlm_ckpt, "qwen3_vl": tiny_qwen3_vl_ckpt}[request.param]
    torch.set_num_threads(1)
    proc = start_cpu_engine(ckpt, str(tmp_path_factory.mktemp("vlm_engine_logs")))
    yield ckpt, proc.url, load_processor(ckpt), AutoModelForImageTextToText.from_pretrained(ckpt).eval()
    proc.stop()


def _prompt(proc, images, text="what?"):
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    return encode_prompt(proc, proc.apply_chat_template([{"role": "user", "content": content}]), images)


def _gen(url, ids, params, image_data=None, **extra):
    async def go():
        async with EngineClient(url) as c:
            kw = dict(extra, image_data=image_data) if image_data is not None else extra
            return await c.generate(ids, params, **kw)
    return asyncio.run(go())


def _tokens_and_lps(out):
    lp = out["meta_info"]["output_token_logprobs"]
    return [t for _, t, _ in lp], [v for v, _, _ in lp]


def test_greedy_with_an_image_equals_transformers_generate(served):
    ckpt, url, proc, model = served
    img = pattern_image(1)
    enc = _prompt(proc, [img])
    out = _gen(url, enc.token_ids, {"temperature": 0, "max_new_tokens": N}, [image_to_data_url(img)])
    with torch.no_grad():
        want = model.generate(**hf_model_inputs(proc.image_token_id, enc.token_ids, enc.multimodal_train_inputs),
                              max_new_tokens=N, do_sample=False)[0, len(enc.token_ids):].tolist()
    assert out["output_ids"] == want
    assert out["meta_info"]["prompt_tokens"] == len(enc.token_ids)


def test_batch_of_images_and_text_matches_the_reference_per_prompt(served):
    ckpt, url, proc, model = served
    imgs = [pattern_image(2), pattern_image(3, size=(112, 56))]
    same_text = [_prompt(proc, [im]) for im in imgs[:1]] + [_prompt(proc, [pattern_image(4)])]
    two_images = _prompt(proc, imgs)
    text_only = _prompt(proc, [])
    prompts = [*same_text, two_images, text_only]
    # the first two prompts have the same ids (one 56x56 image each) but different pixels: the engine must not
    # share their prefill
    assert prompts[0].token_ids == prompts[1].token_ids
    image_data = [[image_to_data_url(pattern_image(2))], [image_to_data_url(pattern_image(4))],
                  [image_to_data_url(im) for im in imgs], None]
    outs = _gen(url, [p.token_ids for p in prompts], GREEDY, image_data)
    got = [_tokens_and_lps(o) for o in outs]
    for p, (ids, lps) in zip(prompts, got):
        want_ids, want_lps = greedy_reference(model, proc.image_token_id, p.token_ids, p.multimodal_train_inputs, N)
        assert ids == want_ids
        assert max(abs(a - b) for a, b in zip(lps, want_lps)) < 1e-4
    assert max(abs(a - b) for a, b in zip(got[0][1], got[1][1])) > 1e-4   # the image changed the log-probs


def test_prompt_logprobs_see_the_image(served):
    ckpt, url, proc, model = served
    img = pattern_image(5)
    enc = _prompt(proc, [img])
    out = _gen(url, enc.token_ids, dict(GREEDY, max_new_tokens=1), [image_to_data_url(img)], logprob_start_len=0)
    got = [v for v, _, _ in out["meta_info"]["input_token_logprobs"]][1:]
    with torch.no_grad():
        logits = model(**hf_model_inputs(proc.image_token_id, enc.token_ids, enc.multimodal_train_inputs)).logits[0]
    ids = torch.tensor(enc.token_ids)
    want = torch.log_softmax(logits.float(), -1)[:-1].gather(-1, ids[1:, None]).squeeze(-1).tolist()
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-4


def test_bad_image_requests_are_400s(served, tmp_path):
    ckpt, url, proc, model = served
    img = pattern_image(6)
    enc = _prompt(proc, [img])
    (tmp_path / "a.png").write_bytes(b"")
    cases = {
        "no image for the placeholders": (None, "image token(s)"),
        "two images for one": ([image_to_data_url(img)] * 2, "need 8"),
        "a file path": ([str(tmp_path / "a.png")], "files and URLs are not read here"),
        "not an image": (["data:image/png;base64,aGVsbG8gd29ybGQ="], "not an image Pillow can read"),
    }
    for name, (data, expected) in cases.items():
        with pytest.raises(EngineError) as err:
            _gen(url, enc.token_ids, GREEDY, data if data is not None else None)
        assert err.value.status == 400, name
        assert expected in str(err.value), (name, str(err.value))

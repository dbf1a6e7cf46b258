"""DeepSeek-V3.2 (`deepseek_v32`) and GLM-5 (`glm_moe_dsa`): DeepSeek sparse attention trained as the dense
multi-latent attention it equals while no sample is longer than config.json's index_topk (config/sparse_attention.py).

Logits parity with transformers, the bit-identical export and EP / TP / PP are in test_model_parity.py; here: the
equivalence itself (transformers' sparse model = its dense DeepSeek-V3 on the same weights up to index_topk tokens,
and not beyond), the model's refusal of a longer sample, the launch refusal, a GRPO step."""
import json
import os
import shutil
import sys

import pytest
import torch
from _dist import run_ranks, tiny_ckpts  # noqa: F401  (tiny_ckpts is a fixture)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config"))


def _as(ckpt, tmp_path, name, **changes):
    out = tmp_path / name
    shutil.copytree(ckpt, out)
    cfg = json.load(open(out / "config.json"))
    cfg.update(changes)
    json.dump(cfg, open(out / "config.json", "w"))
    return str(out)


@pytest.mark.parametrize("arch", ["deepseek_v32", "glm_moe_dsa"])
def test_sparse_attention_is_the_dense_one_up_to_index_topk(tiny_ckpts, tmp_path, arch):
    """transformers' DSA model gives its dense DeepSeek-V3 twin's logits (same weights, the indexer unused) on 12
    tokens with index_topk 16 or 12; with index_topk 4 < 12 it does not: the bound the launch checks is needed."""
    import transformers

    ids = torch.randint(2, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    dense_dir = _as(tiny_ckpts[arch], tmp_path, "dense", model_type="deepseek_v3", architectures=None)
    with torch.no_grad():
        dense = transformers.AutoModelForCausalLM.from_pretrained(dense_dir, dtype=torch.float32).eval()(ids).logits
        out = {}
        for topk in (16, 12, 4):
            d = _as(tiny_ckpts[arch], tmp_path, f"topk{topk}", index_topk=topk)
            model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
            out[topk] = (model(ids).logits - dense).abs().max().item()
    assert out[16] < 1e-5 and out[12] < 1e-5, out
    assert out[4] > 1e-2, out


def longer_sample_case(rank, world_size, port, ckpt):
    from slime_like.args import make_args
    from slime_like.backends.megatron import hf_weights, model, parallel
    from slime_like.config.hf_config import fill_args_from_hf

    parallel.init_distributed(rank, world_size, master_port=port)
    args = fill_args_from_hf(make_args("--hf-checkpoint", ckpt), ckpt)
    chunk = model.build_model(args)[0]
    hf_weights.load_hf_weights([chunk], ckpt, args)
    ids = torch.randint(2, 100, (1, 16))
    with torch.no_grad():
        fits = tuple(chunk(ids, torch.arange(16)[None], attention_mask=None).shape)
        try:
            chunk(torch.randint(2, 100, (1, 17)), torch.arange(17)[None], attention_mask=None)
            refused = ""
        except ValueError as e:
            refused = str(e)
    return args.hf_index_topk, fits, refused


def test_the_model_refuses_a_sample_longer_than_index_topk(tiny_ckpts):
    topk, fits, refused = run_ranks(longer_sample_case, 1, tiny_ckpts["deepseek_v32"])[0]
    assert topk == 16 and fits[:2] == (1, 16)
    assert "a sample of 17 tokens exceeds config.json index_topk 16" in refused
    assert "lightning indexer" in refused and "sparse multi-latent attention" in refused


def test_launch_refuses_samples_that_may_exceed_index_topk(tiny_ckpts):
    from cfg_helpers import parse_report

    base = ["--hf-checkpoint", tiny_ckpts["glm_moe_dsa"], "--rollout-batch-size", "4", "--n-samples-per-prompt", "2",
            "--num-rollout", "2", "--colocate", "--actor-num-gpus-per-node", "1", "--num-gpus-per-node", "1"]
    _, report = parse_report(base + ["--rollout-max-response-len", "8"])
    mine = [r for r in report.launch_refusals if "index_topk 16" in r]
    assert len(mine) == 1 and "is unbounded" in mine[0] and "lightning indexer" in mine[0], report.launch_refusals
    _, report = parse_report(base + ["--rollout-max-prompt-len", "10", "--rollout-max-response-len", "8"])
    assert any("is 18" in r for r in report.launch_refusals), report.launch_refusals
    _, report = parse_report(base + ["--rollout-max-prompt-len", "8", "--rollout-max-response-len", "8"])
    assert not any("index_topk" in r for r in report.launch_refusals), report.launch_refusals


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["deepseek_v32", "glm_moe_dsa"])
def test_sparse_attention_grpo_step(tiny_ckpts, arch):
    """GRPO steps (samples of at most 13 tokens, index_topk 16): the loss falls and log-probs follow the advantage."""
    from test_model_families import grpo_step_case

    out = run_ranks(grpo_step_case, 1, tiny_ckpts[arch], "0")[0]
    assert out["losses"][-1] < out["losses"][0], out["losses"]
    (pos0, neg0), (pos1, neg1) = out["before"], out["after"]
    assert pos1 > pos0 and neg1 < neg0, (out["before"], out["after"])

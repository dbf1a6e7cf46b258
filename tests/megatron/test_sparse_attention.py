"""DeepSeek-V3.2 (`deepseek_v32`) and GLM-5 (`glm_moe_dsa`): DeepSeek sparse attention in the Megatron trainer
(backends/megatron/dsa.py), on samples longer than config.json's index_topk (6 in the tiny models).

Logits parity on padded rows at TP / PP / EP and the bit-identical export (indexer included) are in
test_model_parity.py; here: that the top-k matters in these models (transformers' sparse model differs from its
dense twin), packed rows and GLM-5's shared-indexer layers vs transformers, the frozen indexer, --allgather-cp's
layout and CP = 2 (--allgather-cp and Megatron's 2 x CP) = CP = 1 on gloo, the launch checks (GLM-5.2's shared-indexer
schedule and the pipeline stages it allows), a GRPO step. (TP > 1 trains MoE models only with sequence parallelism,
which needs TransformerEngine: TP 2 is checked forward-only in test_model_parity.py.)"""
import json
import os
import shutil
import sys

import pytest
import torch
from _dist import run_ranks, tiny_ckpts  # noqa: F401  (tiny_ckpts is a fixture)
from test_context_parallel import scored_once
from test_trainer_common import flat
from test_trainer_parallel import parallel_case

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config"))


def _as(ckpt, tmp_path, name, **changes):
    out = tmp_path / name
    shutil.copytree(ckpt, out)
    cfg = json.load(open(out / "config.json"))
    cfg.update(changes)
    json.dump(cfg, open(out / "config.json", "w"))
    return str(out)


@pytest.mark.parametrize("arch", ["deepseek_v32", "glm_moe_dsa"])
def test_top_k_matters_in_the_tiny_models(tiny_ckpts, tmp_path, arch):
    """transformers' DSA model (index_topk 6) is not its dense DeepSeek-V3 twin on 12 tokens (so the parity tests
    test the sparse attention), and is with index_topk 12 (the twin is a faithful dense reference)."""
    import transformers

    ids = torch.randint(2, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    dense_dir = _as(tiny_ckpts[arch], tmp_path, "dense", model_type="deepseek_v3", architectures=None)
    with torch.no_grad():
        dense = transformers.AutoModelForCausalLM.from_pretrained(dense_dir, dtype=torch.float32).eval()(ids).logits
        out = {}
        for topk in (12, 6):
            d = _as(tiny_ckpts[arch], tmp_path, f"topk{topk}", index_topk=topk)
            model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
            out[topk] = (model(ids).logits - dense).abs().max().item()
    assert out[12] < 1e-5 and out[6] > 1e-2, out


def test_blocked_sparse_attention_is_the_per_query_definition(monkeypatch):
    """dsa_math in query blocks (tiny BLOCK_ELEMENTS) equals the definition written per query: top-k of the index
    scores among keys <= q, softmax over those keys only."""
    from slime_like.backends.megatron import dsa_math

    g = torch.Generator().manual_seed(3)
    lq = lk = 17
    ix = dsa_math.IndexerInputs(torch.randn(lq, 4, 8, generator=g), torch.randn(lq, 4, generator=g),
                                torch.randn(lk, 8, generator=g))
    q, k, v = torch.randn(lq, 2, 6, generator=g), torch.randn(lk, 2, 6, generator=g), torch.randn(lk, 2, 5, generator=g)
    pos = torch.arange(lq)
    monkeypatch.setattr(dsa_math, "BLOCK_ELEMENTS", 64)  # a few queries per block
    chosen = dsa_math.select_keys(ix, pos, 5, 8 ** -0.5)
    out = dsa_math.sparse_attention(q, k, v, chosen, pos, 0.3)
    for i in range(lq):
        score = torch.stack([(ix.weights[i] * torch.relu(ix.queries[i] @ ix.keys[j] * 8 ** -0.5)).sum()
                             for j in range(i + 1)])
        keys = score.argsort(descending=True, stable=True)[:5]
        assert set(keys.tolist()) == set(c for c in chosen[i].tolist() if c <= i)
        att = torch.softmax(torch.einsum("nd,knd->nk", q[i], k[keys]) * 0.3, dim=-1)
        torch.testing.assert_close(out[i], torch.einsum("nk,knd->nd", att, v[keys]), atol=1e-6, rtol=1e-5)


def packed_rank(rank, world, port, ckpt):
    """One packed row of three samples (14, 9, 20 tokens; block-causal mask) vs transformers per sample; the
    indexer's weights are frozen and equal the checkpoint's."""
    import transformers
    from safetensors.torch import load_file

    from slime_like.args import make_args
    from slime_like.backends.megatron import hf_weights, model, parallel
    from slime_like.backends.training.micro_batch import block_causal_mask
    from slime_like.config.hf_config import fill_args_from_hf

    parallel.init_distributed(rank, world, master_port=port)
    args = fill_args_from_hf(make_args("--hf-checkpoint", ckpt), ckpt)
    chunk = model.build_model(args)[0]
    hf_weights.load_hf_weights([chunk], ckpt, args)
    chunk.eval()
    lengths = [14, 9, 20]
    g = torch.Generator().manual_seed(1)
    samples = [torch.randint(2, 100, (n,), generator=g) for n in lengths]
    row = torch.cat(samples)[None]
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        out = chunk(row, positions, block_causal_mask(lengths))[0]
    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    worst, start = 0.0, 0
    for ids in samples:
        with torch.no_grad():
            ref = hf(ids[None]).logits[0]
        worst = max(worst, (out[start:start + len(ids), :ref.shape[-1]] - ref).abs().max().item())
        start += len(ids)
    ref_sd = load_file(os.path.join(ckpt, "model.safetensors"))
    indexer = {n: p for n, p in chunk.named_parameters() if any(k in n for k in ("wq_b", ".wk.", "k_norm",
                                                                                   "weights_proj"))}
    frozen = bool(indexer) and not any(p.requires_grad for p in indexer.values())
    exported = {n: (t - ref_sd[n]).abs().max().item() for n, t in hf_weights.iter_hf_weights([chunk], args)
                if ".indexer." in n}
    return worst, frozen, len(indexer), exported


@pytest.mark.parametrize("arch", ["deepseek_v32", "glm_moe_dsa", "glm_moe_dsa_shared"])
def test_packed_row_matches_transformers(tiny_ckpts, tmp_path, arch):
    ckpt = tiny_ckpts[arch.replace("_shared", "")]
    if arch.endswith("_shared"):  # GLM-5's indexer_types: layer 1 reuses layer 0's top-k and has no indexer
        ckpt = _as(ckpt, tmp_path, "shared", indexer_types=["full", "shared"])
    worst, frozen, n_indexer, exported = run_ranks(packed_rank, 1, ckpt)[0]
    assert worst < 1e-5, worst
    assert frozen and n_indexer == (5 if arch.endswith("_shared") else 10), n_indexer
    assert len(exported) == n_indexer and max(exported.values()) == 0.0, exported


def test_allgather_layout_cuts_the_stream_into_contiguous_pieces():
    from slime_like.backends.training.cp_layout import build_allgather_cp_micro_batch
    from slime_like.backends.training.data import PackedBatch

    batch = {"tokens": [list(range(10, 19)), list(range(20, 25))], "response_lengths": [4, 2],
             "loss_masks": [[1, 0, 1, 1], [1, 1]], "advantages": [torch.arange(4.0), torch.arange(2.0) + 10]}
    pb = PackedBatch(batch)
    mbs = [build_allgather_cp_micro_batch(pb, [0, 1], 2, r, field_keys=("advantages",)) for r in range(2)]
    # 9 + 5 = 14 stream tokens: 7 per rank, THD lengths the samples themselves (no padding needed)
    assert [mb.tokens[0].tolist() for mb in mbs] == [[10, 11, 12, 13, 14, 15, 16], [17, 18, 20, 21, 22, 23, 24]]
    assert mbs[1].position_ids[0].tolist() == [7, 8, 0, 1, 2, 3, 4]
    assert mbs[0].packed_seq_params.cu_seqlens_q.tolist() == [0, 9, 14]
    seen = scored_once(mbs, 2)
    assert seen == {(0, j): (15 + j, float(j)) for j in range(4)} | {(1, j): (23 + j, 10.0 + j) for j in range(2)}
    odd = build_allgather_cp_micro_batch(PackedBatch({**batch, "tokens": [list(range(10, 19)), [20, 21, 22, 23]],
                                                      "loss_masks": [[1] * 4, [1] * 2]}), [0, 1], 2, 1)
    assert odd.packed_seq_params.cu_seqlens_q.tolist() == [0, 9, 13, 14]  # the stream's padding: its own sequence


CP2 = ("--context-parallel-size", "2")


@pytest.mark.slow
@pytest.mark.parametrize("layout", [("--allgather-cp",), ()], ids=["allgather-cp", "zigzag"])
def test_cp2_trains_like_cp1(tiny_ckpts, layout):
    """GLM-5 tiny model, 8 samples of 3..13 tokens (index_topk 6): old log-probs, two Adam steps' metrics and the
    new log-probs at CP 2 equal CP 1's."""
    ckpt = tiny_ckpts["glm_moe_dsa"]
    single = run_ranks(parallel_case, 1, ckpt, 1, 1, ())[0]
    for r in run_ranks(parallel_case, 2, ckpt, 1, 1, CP2 + layout):
        torch.testing.assert_close(flat(r["old"]), flat(single["old"]), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(flat(r["new"]), flat(single["new"]), atol=1e-5, rtol=1e-5)
        for step, ref in enumerate(single["metrics"]):
            for key in ("loss", "pg_loss", "grad_norm", "tokens"):
                assert r["metrics"][step][key] == pytest.approx(ref[key], rel=1e-4, abs=1e-5), (step, key)
    assert (flat(single["new"]) - flat(single["old"])).abs().max() > 1e-3


def test_launch_checks(tiny_ckpts, tiny_ckpt):
    from cfg_helpers import parse_report

    from slime_like.config.errors import ConfigError

    def argv(ckpt, *extra):
        return ["--hf-checkpoint", ckpt, "--rollout-batch-size", "4", "--n-samples-per-prompt", "2",
                "--num-rollout", "2", "--colocate", "--actor-num-gpus-per-node", "2", "--num-gpus-per-node", "2",
                *extra]

    glm5 = ("--spec", "slime_plugins.models.glm5.glm5", "get_glm5_spec")
    args, report = parse_report(argv(tiny_ckpts["glm_moe_dsa"], *glm5, *CP2, "--allgather-cp"))
    assert args.allgather_cp and not report.launch_refusals, report.launch_refusals
    with pytest.raises(ConfigError, match="--allgather-cp with --context-parallel-size 2: supported for DeepSeek "
                                          "sparse attention models only.*this one is qwen2"):
        parse_report(argv(tiny_ckpt, *CP2, "--allgather-cp"))
    assert parse_report(argv(tiny_ckpt, "--allgather-cp"))[0].allgather_cp  # CP 1: a no-op, as in slime
    with pytest.raises(ConfigError, match="slime's GLM-5 layer spec builds DeepSeek sparse attention.*qwen2"):
        parse_report(argv(tiny_ckpt, *glm5))


def test_shared_indexer_layers_and_pipeline_stages(tiny_ckpts, tmp_path):
    """GLM-5.2's schedule (index_topk_freq 4, index_skip_topk_offset 3: full layers 1, 2, 3, 7, 11, ... 1-based, as
    slime's recipe says) read as transformers reads it; a pipeline stage may not start on a shared layer."""
    from cfg_helpers import parse_report

    from slime_like.config.errors import ConfigError
    from slime_like.config.hf_layer_layouts import sparse_attention_settings

    cfg = {"model_type": "glm_moe_dsa", "num_hidden_layers": 78, "index_topk_freq": 4, "index_skip_topk_offset": 3}
    shared = set(sparse_attention_settings(cfg)["shared_layers"])
    assert [i + 1 for i in range(16) if i not in shared] == [1, 2, 3, 7, 11, 15]
    ckpt = _as(tiny_ckpts["glm_moe_dsa"], tmp_path, "shared", indexer_types=["full", "shared"])
    argv = ["--hf-checkpoint", ckpt, "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--num-rollout", "2",
            "--colocate", "--actor-num-gpus-per-node", "2", "--num-gpus-per-node", "2"]
    with pytest.raises(ConfigError, match="pipeline stage 1 would start on layer 2 .1-based., a shared-indexer layer"):
        parse_report(argv + ["--pipeline-model-parallel-size", "2"])
    assert parse_report(argv + ["--tensor-model-parallel-size", "2"])[0].hf_checkpoint == ckpt


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["deepseek_v32", "glm_moe_dsa"])
def test_sparse_attention_grpo_step(tiny_ckpts, arch):
    """GRPO steps on samples of up to 13 tokens (index_topk 6): the loss falls and log-probs follow the advantage."""
    from test_model_families import grpo_step_case

    out = run_ranks(grpo_step_case, 1, tiny_ckpts[arch], "0")[0]
    assert out["losses"][-1] < out["losses"][0], out["losses"]
    (pos0, neg0), (pos1, neg1) = out["before"], out["after"]
    assert pos1 > pos0 and neg1 < neg0, (out["before"], out["after"])

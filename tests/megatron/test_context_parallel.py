"""Context parallelism (--context-parallel-size 2) in the Megatron trainer, on CPU with gloo: Megatron's load-balanced
2 x CP chunking (backends/training/cp_layout.py) and the local spec's all-gather CP attention (cp_attention.py).

- the layout: every sample padded to a multiple of 2 x CP, rank r holds chunks r and 2 x CP - 1 - r, every
  response token scored by exactly one rank;
- logits: each CP rank's logits equal transformers' at the positions it holds (1e-5 fp32), padded and packed;
- the trainer: old log-probs, advantages, two Adam steps (loss, pg_loss, entropy, grad norm, tokens) and the new
  log-probs equal CP=1's, with fixed micro-batches, packed variable-length samples and TP=2 x CP=2 (4 ranks).
"""
import warnings

import pytest
import torch
from _dist import run_ranks
from test_trainer_common import flat
from test_trainer_parallel import parallel_case

from slime_like.backends.training.cp_layout import build_cp_micro_batch, chunk_positions, padded_length
from slime_like.backends.training.data import PackedBatch

CP2 = ("--context-parallel-size", "2")
PACKED = ("--use-dynamic-batch-size", "--max-tokens-per-gpu", "30")


def scored_once(mbs: list, samples: int) -> dict:
    """{(sample, response position): (target, advantage)} over the CP ranks' micro-batches, each scored token once."""
    seen = {}
    for mb in mbs:
        for k in range(samples):
            for j, ok, target, adv in zip(mb.response_index[k].tolist(), mb.valid[k].tolist(), mb.targets[k].tolist(),
                                          mb.fields["advantages"][k].tolist()):
                if ok:
                    assert (k, j) not in seen
                    seen[k, j] = (target, adv)
    return seen


def test_chunks_balance_and_cover_every_response_token():
    assert padded_length(9, 2) == 12 and padded_length(8, 2) == 8 and padded_length(1, 4) == 8
    assert chunk_positions(12, 2, 0).tolist() == [0, 1, 2, 9, 10, 11]
    assert chunk_positions(12, 2, 1).tolist() == [3, 4, 5, 6, 7, 8]
    batch = {"tokens": [list(range(10, 19)), list(range(20, 25))], "response_lengths": [4, 2],
             "loss_masks": [[1, 0, 1, 1], [1, 1]], "advantages": [torch.arange(4.0), torch.arange(2.0) + 10]}
    pb = PackedBatch(batch)
    mbs = [build_cp_micro_batch(pb, [0, 1], 2, r, field_keys=("advantages",)) for r in range(2)]
    # 9 tokens -> 12, 5 -> 8: each rank's row holds 6 + 4 tokens; THD lengths are the whole padded samples
    assert [mb.tokens.shape[1] for mb in mbs] == [10, 10]
    assert mbs[0].packed_seq_params.cu_seqlens_q.tolist() == [0, 12, 20]
    assert mbs[0].tokens[0, :6].tolist() == [10, 11, 12, 0, 0, 0]  # chunks 0 and 3 (3 holds padding only)
    seen = scored_once(mbs, 2)  # every response token scored once, with its target, mask and advantage
    assert seen == {(0, j): (15 + j, float(j)) for j in range(4)} | {(1, j): (23 + j, 10.0 + j) for j in range(2)}
    assert mbs[0].response_lengths == [4, 2]  # whole lengths: what the gathered log-probs unpad to


def logits_rank(rank, world, port, ckpt, packed):
    """This CP rank's logits at its row positions vs transformers' logits of the whole samples."""
    warnings.filterwarnings("ignore")
    import transformers

    from slime_like.backends.megatron import hf_weights, model, parallel
    from slime_like.backends.training.data import MicroBatcher
    from test_trainer_common import make_args, make_batch

    ps = parallel.init_distributed(rank, world, master_port=port, cp=world)
    extra = PACKED if packed else ()
    from slime_like.config.hf_config import fill_args_from_hf

    args = fill_args_from_hf(make_args(ckpt, "--actor-num-gpus-per-node", world, *CP2, *extra), ckpt)  # as trainers do
    chunks = model.build_model(args)
    hf_weights.load_hf_weights(chunks, ckpt, args)
    chunks[0].eval()
    batch = make_batch(6, seed=2)
    batcher = MicroBatcher(args, pack_rows=True, use_te=False, device=None,
                           cp=(ps.get_context_parallel_world_size(), ps.get_context_parallel_rank()))
    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    worst = 0.0
    for mb in batcher.split(batch, list(range(6))):
        with torch.no_grad():
            out = chunks[0](mb.tokens, mb.position_ids, None, packed_seq_params=mb.packed_seq_params)
        cu = mb.packed_seq_params.cu_seqlens_q.tolist()
        start = 0
        for k, i in enumerate(mb.sample_ids):
            ids = torch.tensor(batch["tokens"][i])[None]
            with torch.no_grad():
                ref = hf(ids).logits[0]
            pos = chunk_positions(cu[k + 1] - cu[k], 2, rank)
            real = pos < ids.shape[1]
            local = out[0, start:start + len(pos)][real, :ref.shape[-1]]
            worst = max(worst, (local - ref[pos[real]]).abs().max().item())
            start += len(pos)
    return worst


@pytest.mark.slow
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_cp2_logits_match_transformers(tiny_ckpt, packed):
    assert max(run_ranks(logits_rank, 2, tiny_ckpt, packed)) < 1e-5


@pytest.fixture(scope="module")
def single(tiny_ckpt):
    return run_ranks(parallel_case, 1, tiny_ckpt, 1, 1, ())[0]


def _same_training(results, single):
    for r in results:
        torch.testing.assert_close(flat(r["old"]), flat(single["old"]), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(flat(r["adv"]), flat(single["adv"]), atol=1e-5, rtol=1e-5)
        for step, ref in enumerate(single["metrics"]):  # every rank returns the same DP x CP-reduced dict
            assert {"loss", "pg_loss", "entropy", "grad_norm", "tokens", "clipfrac"} <= set(ref)
            assert set(r["metrics"][step]) == set(ref)
            for key in ref:
                assert r["metrics"][step][key] == pytest.approx(ref[key], rel=1e-4, abs=1e-5), (step, key)
        torch.testing.assert_close(flat(r["new"]), flat(single["new"]), atol=1e-4, rtol=1e-4)
    assert (flat(single["new"]) - flat(single["old"])).abs().max() > 1e-3  # the steps did move the model


# per-sequence statistics over CP: seq-mean weights (whole-response token counts), GSPO's sequence ratio and
# OPSM's sequence KL (masked sums all-reduced over CP)
LOSS_VARIANTS = {"seq-mean": ("--loss-agg-mode", "seq-mean-token-mean"),
                 "gspo-opsm": ("--advantage-estimator", "gspo", "--use-opsm", "--opsm-delta", "0.0")}


@pytest.mark.slow
@pytest.mark.parametrize("extra", [CP2, CP2 + PACKED, *(CP2 + v for v in LOSS_VARIANTS.values())],
                         ids=["cp2", "cp2-packed", *("cp2-" + k for k in LOSS_VARIANTS)])
def test_cp2_trains_like_cp1(tiny_ckpt, single, extra):
    if extra[2:] in LOSS_VARIANTS.values():
        single = run_ranks(parallel_case, 1, tiny_ckpt, 1, 1, extra[2:])[0]
    results = run_ranks(parallel_case, 2, tiny_ckpt, 1, 1, extra)
    assert [r["dp"] for r in results] == [1, 1]
    _same_training(results, single)


@pytest.mark.slow
def test_tp2_cp2_trains_like_single_rank(tiny_ckpt, single):
    results = run_ranks(parallel_case, 4, tiny_ckpt, 2, 1, CP2, timeout=480.0)
    assert sorted((r["tp_rank"], r["dp"]) for r in results) == [(0, 1), (0, 1), (1, 1), (1, 1)]
    _same_training(results, single)


def test_gpu_without_te_refuses_what_the_local_cp_attention_cannot_run_before_ray(tiny_ckpt, monkeypatch):
    """On a GPU machine without TransformerEngine the launch names it (kernels.launch_check, before Ray);
    the trainer's own start-up check says the same on a CPU-only head node."""
    import slime_like.config.cluster as cluster
    from slime_like.backends.megatron import kernels
    from slime_like.backends.megatron.checks import check_supported
    from test_trainer_common import make_args

    args = make_args(tiny_ckpt, *CP2, "--actor-num-gpus-per-node", "2", "--attention-dropout", "0.2")
    monkeypatch.setattr(cluster, "cuda_visible", lambda: True)
    errors, note = kernels.launch_check(args)
    assert any("the all-gather CP attention has no dropout; use --attention-dropout 0" in e for e in errors), errors
    assert "local spec" in note
    with pytest.raises(NotImplementedError, match="use --attention-dropout 0"):
        check_supported(args, "actor")
    check_supported(make_args(tiny_ckpt, *CP2, "--actor-num-gpus-per-node", "2"), "actor")  # CP itself runs

"""Context parallelism (--context-parallel-size 2) over Qwen3-Next / Qwen3.5's gated delta net layers, on CPU with
gloo: each CP rank gathers the conv / delta-rule inputs of whole samples (cp_attention.gather_whole_samples), runs
the recurrence over them and keeps its own 2 chunks (backends/megatron/gated_delta_net.py).

- the gather: whole samples back in order, `whole[keep]` is this rank's row, and the gradient each rank gets is the
  sum over CP ranks of theirs at its tokens;
- logits: each CP rank's logits equal transformers' at the positions it holds (1e-5 fp32), padded and packed;
- the trainer: old log-probs, advantages, two Adam steps and the new log-probs equal CP=1's (test_context_parallel's
  tolerances), for qwen3_next (gated delta net + gated attention + MoE) and qwen3_5 (dense, tied), with packed
  variable-length samples, and qwen3_5 at TP=2 x CP=2 (4 ranks).
"""
import pytest
import torch
from _dist import TINY, run_ranks
from test_context_parallel import CP2, PACKED, _same_training, logits_rank
from test_trainer_parallel import parallel_case

ARCHS = ("qwen3_next", "qwen3_5")
# qwen3_next's MoE load-balancing loss (config.json router_aux_loss_coef) counts every token of a micro-batch, the
# padding included, and CP pads each sample to a multiple of 2 x CP: its gradient differs from CP=1's for that reason
# alone (the gated delta net is not involved: with it off, CP=2's gradients equal CP=1's), so it is off here
# (--moe-aux-loss-coeff 0 is the parser default, which a model taken from config.json replaces by the config's value).
ARCH_FLAGS = {"qwen3_next": ("--moe-router-load-balancing-type", "none"), "qwen3_5": ()}


@pytest.fixture(scope="module")
def gdn_ckpts(tmp_path_factory):
    """Only the two tiny hybrid checkpoints this module trains (tiny_ckpts would build every family)."""
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("gdn_cp")
    return {a: build_tiny_checkpoint(str(root / a), init_std=0.1, **TINY[a]) for a in ARCHS}


def gather_rank(rank, world, port):
    """Two samples of 8 and 4 tokens (chunks of 2 and 1 per rank) gathered over 2 gloo ranks, and the gradient."""
    import torch.distributed as dist

    from slime_like.backends.megatron.cp_attention import gather_whole_samples
    from slime_like.backends.training.cp_layout import chunk_positions
    from slime_like.backends.training.micro_batch import packed_seq_params_for

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    whole_ref = torch.arange(12.0)[:, None] * torch.tensor([1.0, -1.0])  # token i of the row of both samples: (i, -i)
    pos = torch.cat([chunk_positions(8, world, rank), 8 + chunk_positions(4, world, rank)])
    x = whole_ref[pos].clone().requires_grad_(True)
    cu = packed_seq_params_for([8, 4]).cu_seqlens_q
    whole, lengths, keep = gather_whole_samples(x, cu, dist.group.WORLD)
    weights = torch.arange(1.0, 13.0)[:, None] * (rank + 1)  # rank r's loss weighs whole token i by (i + 1)(r + 1)
    (whole * weights).sum().backward()
    out = {"whole": whole.detach(), "lengths": lengths, "kept": torch.equal(whole[keep], x), "pos": pos,
           "grad": x.grad}
    dist.destroy_process_group()
    return out


def test_gather_whole_samples_orders_keeps_and_sums_gradients():
    results = run_ranks(gather_rank, 2)
    whole_ref = torch.arange(12.0)[:, None] * torch.tensor([1.0, -1.0])
    for r in results:
        assert torch.equal(r["whole"], whole_ref) and r["lengths"] == [8, 4] and r["kept"]
        # both ranks' losses use every token: d/dx = (i + 1) * (1 + 2) at this rank's whole positions i
        assert torch.equal(r["grad"], ((r["pos"] + 1.0) * 3)[:, None].expand(-1, 2))
    assert results[0]["pos"].tolist() == [0, 1, 6, 7, 8, 11] and results[1]["pos"].tolist() == [2, 3, 4, 5, 9, 10]


@pytest.mark.slow
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_cp2_qwen3_next_logits_match_transformers(gdn_ckpts, packed):
    assert max(run_ranks(logits_rank, 2, gdn_ckpts["qwen3_next"], packed)) < 1e-5


@pytest.fixture(scope="module")
def singles(gdn_ckpts):
    return {a: run_ranks(parallel_case, 1, gdn_ckpts[a], 1, 1, ARCH_FLAGS[a])[0] for a in ARCHS}


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("extra", [CP2, CP2 + PACKED], ids=["cp2", "cp2-packed"])
def test_cp2_gated_delta_net_trains_like_cp1(gdn_ckpts, singles, arch, extra):
    results = run_ranks(parallel_case, 2, gdn_ckpts[arch], 1, 1, extra + ARCH_FLAGS[arch])
    assert [r["dp"] for r in results] == [1, 1]
    _same_training(results, singles[arch])


@pytest.mark.slow
def test_tp2_cp2_gated_delta_net_trains_like_single_rank(gdn_ckpts, singles):
    """qwen3_5 (dense): megatron-core's MoE layer refuses to train under TP without sequence parallelism, which
    needs TransformerEngine; the gated delta net's heads and in_proj sections split over TP as at CP=1."""
    results = run_ranks(parallel_case, 4, gdn_ckpts["qwen3_5"], 2, 1, CP2, timeout=600.0)
    assert sorted((r["tp_rank"], r["dp"]) for r in results) == [(0, 1), (0, 1), (1, 1), (1, 1)]
    _same_training(results, singles["qwen3_5"])

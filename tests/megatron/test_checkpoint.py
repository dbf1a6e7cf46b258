"""torch_dist checkpoints: save -> load -> one more step equals an uninterrupted run (model, optimizer,
scheduler, RNG with dropout on), --no-save-optim / --no-load-optim, atomic publish (a save killed before
the marker is never picked up; an incomplete published dir falls back), and HF dirs through load_checkpoint."""
import os
import signal
import subprocess
import sys
import warnings

import pytest
import torch
from _dist import run_ranks, tiny_ckpts  # noqa: F401  (tiny_ckpts is a fixture)

TOKENS = torch.randint(2, 100, (4, 16), generator=torch.Generator().manual_seed(1))


def _setup(rank, world, port, hf_dir, tp, dropout, dist_opt=False):
    warnings.filterwarnings("ignore")
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    from slime_like.backends.megatron import hf_weights, model, parallel
    from slime_like.args import make_args
    from slime_like.config.hf_config import fill_args_from_hf

    parallel.init_distributed(rank, world, master_port=port, tp=tp)
    args = fill_args_from_hf(make_args("--hf-checkpoint", hf_dir), hf_dir)
    args.tensor_model_parallel_size, args.hidden_dropout, args.attention_dropout = tp, dropout, dropout
    chunks = model.build_model(args)
    hf_weights.load_hf_weights(chunks, hf_dir, args)
    ddp = DistributedDataParallel(config=chunks[0].config, ddp_config=DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=dist_opt), module=chunks[0])
    chunks[0].config.finalize_model_grads_func, chunks[0].config.no_sync_func = finalize_model_grads, ddp.no_sync
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-2, min_lr=1e-3, params_dtype=torch.float32,
                                                 clip_grad=1.0, use_distributed_optimizer=dist_opt), [ddp])
    sched = OptimizerParamScheduler(opt, init_lr=0.0, max_lr=1e-2, min_lr=1e-3, lr_warmup_steps=2,
                                    lr_decay_steps=10, lr_decay_style="cosine", start_wd=0.0, end_wd=0.0,
                                    wd_incr_steps=10, wd_incr_style="constant")
    return args, chunks, ddp, opt, sched


def _step(ddp, opt, sched):
    """One training step on fixed tokens; returns the loss (dropout draws from the RNG state)."""
    ddp.train()
    ddp.zero_grad_buffer()
    opt.zero_grad()
    pos = torch.arange(TOKENS.shape[1]).expand_as(TOKENS)
    loss = ddp(TOKENS, pos, attention_mask=None, labels=torch.roll(TOKENS, -1, 1)).mean()
    loss.backward()
    ddp.finish_grad_sync()
    opt.step()
    sched.step(increment=1)
    return loss.item()


def _params(chunks):
    return {n: p.detach().clone() for n, p in chunks[0].named_parameters()}


def resume_rank(rank, world, port, hf_dir, save_dir, tp, dist_opt=False):
    from slime_like.backends.megatron import checkpoint

    _, chunks, ddp, opt, sched = _setup(rank, world, port, hf_dir, tp, dropout=0.1, dist_opt=dist_opt)
    for _ in range(2):
        _step(ddp, opt, sched)
    checkpoint.save_checkpoint(save_dir, 2, chunks, optimizer=opt, scheduler=sched, extra_state={"role": "actor"})
    loss_a, lr_a = _step(ddp, opt, sched), opt.param_groups[0]["lr"]
    params_a = _params(chunks)

    # a fresh model/optimizer/scheduler (HF weights again, RNG re-seeded) restored from the checkpoint
    _, chunks2, ddp2, opt2, sched2 = _setup_again(hf_dir, tp, dist_opt)
    it = checkpoint.load_checkpoint(save_dir, chunks2, optimizer=opt2, scheduler=sched2)
    loss_b, lr_b = _step(ddp2, opt2, sched2), opt2.param_groups[0]["lr"]
    params_b = _params(chunks2)
    return dict(it=it, loss=(loss_a, loss_b), lr=(lr_a, lr_b),
                max_diff=max((params_a[n] - params_b[n]).abs().max().item() for n in params_a),
                tracker=open(os.path.join(save_dir, checkpoint.TRACKER)).read())


def _setup_again(hf_dir, tp, dist_opt):
    """A second model in the same process (parallel state already up)."""
    import torch.distributed as dist

    return _setup(dist.get_rank(), dist.get_world_size(), None, hf_dir, tp, dropout=0.1, dist_opt=dist_opt)


@pytest.mark.slow
def test_resume_equals_uninterrupted_tp2(tiny_ckpts, tmp_path):
    results = run_ranks(resume_rank, 2, tiny_ckpts["qwen2"], str(tmp_path / "save"), 2)
    for r in results:
        assert r["it"] == 2 and r["tracker"] == "2"
        assert r["loss"][0] == pytest.approx(r["loss"][1], abs=1e-6), r
        assert r["lr"][0] == pytest.approx(r["lr"][1]), r
        assert r["max_diff"] < 1e-6, r
    assert sorted(os.listdir(tmp_path / "save")) == ["iter_0000002", "latest_checkpointed_iteration.txt"]


@pytest.mark.slow
def test_resume_equals_uninterrupted_dp2_distributed_optimizer(tiny_ckpts, tmp_path):
    # DP=2 with the distributed optimizer: each rank saves its shard of the fp32 Adam state
    results = run_ranks(resume_rank, 2, tiny_ckpts["qwen2"], str(tmp_path / "save"), 1, True)
    for r in results:
        assert r["it"] == 2 and r["loss"][0] == pytest.approx(r["loss"][1], abs=1e-6), r
        assert r["max_diff"] < 1e-6, r


KILLED_SAVE = """
import os, signal, sys, warnings
warnings.filterwarnings("ignore")
from slime_like.backends.megatron import checkpoint, model, parallel
from slime_like.args import make_args
from slime_like.config.hf_config import fill_args_from_hf
parallel.init_distributed(0, 1, master_port=int(sys.argv[3]))
args = fill_args_from_hf(make_args("--hf-checkpoint", sys.argv[1]), sys.argv[1])
chunks = model.build_model(args)
# crash exactly between "all shards written" and "marker published": the process dies by SIGKILL
checkpoint._publish = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
checkpoint.save_checkpoint(sys.argv[2], 8, chunks)
"""


def optim_flags_rank(rank, world, port, hf_dir, save_dir):
    import shutil

    from slime_like.backends.megatron import checkpoint, parallel

    args, chunks, ddp, opt, sched = _setup(rank, world, port, hf_dir, 1, dropout=0.0)
    out = {"hf_dir_detected": checkpoint.is_hf_dir(hf_dir), "save_dir_hf": None}
    _step(ddp, opt, sched)
    checkpoint.save_checkpoint(save_dir, 7, chunks)  # --no-save-optim: the trainer passes optimizer=None
    out["save_dir_hf"] = checkpoint.is_hf_dir(save_dir)
    saved = _params(chunks)
    try:
        checkpoint.load_checkpoint(save_dir, chunks, optimizer=opt, scheduler=sched)
    except ValueError as e:
        out["needs_no_load_optim"] = str(e)
    # --no-load-optim: weights only
    with torch.no_grad():
        for p in chunks[0].parameters():
            p.zero_()
    out["it_no_optim"] = checkpoint.load_checkpoint(save_dir, chunks, optimizer=opt, scheduler=sched,
                                                    load_optim=False)
    out["weights_restored"] = max((saved[n] - p).abs().max().item() for n, p in chunks[0].named_parameters())

    # a save killed before publishing: the full iter_0000008 exists, the marker still says 7
    # own session: the save's helper processes (dist_checkpointing's writer manager) are cleaned up with it;
    # output to a file, not a pipe, which an orphaned helper would keep open
    with open(os.path.join(os.path.dirname(save_dir), "killed_save.log"), "w") as logf:
        proc = subprocess.Popen([sys.executable, "-c", KILLED_SAVE, hf_dir, save_dir, str(parallel.free_port())],
                                stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        out["killed_rc"] = proc.wait(timeout=240)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    out["iter8_exists"] = os.path.isdir(checkpoint.iteration_dir(save_dir, 8))
    out["after_kill"] = checkpoint.load_checkpoint(save_dir, chunks, load_optim=False)

    # a published marker pointing at an incomplete dir (metadata.json missing) falls back to 7, the newest
    # complete published one (8 is complete on disk but was never published)
    shutil.copytree(checkpoint.iteration_dir(save_dir, 7), checkpoint.iteration_dir(save_dir, 9))
    os.remove(os.path.join(checkpoint.iteration_dir(save_dir, 9), "metadata.json"))
    checkpoint._publish(save_dir, 9)
    out["fallback"] = checkpoint.load_checkpoint(save_dir, chunks, load_optim=False)

    # an HF dir given to load_checkpoint loads HF weights (and reports no iteration)
    with torch.no_grad():
        for p in chunks[0].parameters():
            p.zero_()
    out["hf_it"] = checkpoint.load_checkpoint(hf_dir, chunks, args=args)
    from safetensors.torch import load_file

    hf = load_file(os.path.join(hf_dir, "model.safetensors"))
    emb = chunks[0].embedding.word_embeddings.weight
    out["hf_emb_diff"] = (emb[: hf["model.embed_tokens.weight"].shape[0]] - hf["model.embed_tokens.weight"]).abs().max().item()
    out["hf_fc2_diff"] = (chunks[0].decoder.layers[1].mlp.linear_fc2.weight
                          - hf["model.layers.1.mlp.down_proj.weight"]).abs().max().item()
    return out


@pytest.mark.slow
def test_optim_flags_atomic_publish_and_hf_dir(tiny_ckpts, tmp_path):
    (r,) = run_ranks(optim_flags_rank, 1, tiny_ckpts["qwen2"], str(tmp_path / "save"))
    assert r["hf_dir_detected"] and r["save_dir_hf"] is False
    assert "--no-load-optim" in r["needs_no_load_optim"]
    assert r["it_no_optim"] == 7 and r["weights_restored"] == 0.0
    assert r["killed_rc"] == -signal.SIGKILL and r["iter8_exists"]
    assert r["after_kill"] == 7
    assert r["fallback"] == 7
    assert r["hf_it"] is None and r["hf_emb_diff"] == 0.0 and r["hf_fc2_diff"] == 0.0


def release_rank(rank, world, port, hf_dir, save_dir):
    """Megatron-LM's weights-only `release` layout (marker text 'release', weights in LOAD/release/), as its
    converter writes it: loaded as weights, no iteration, no optimizer state read."""
    from slime_like.backends.megatron import checkpoint

    args, chunks, ddp, opt, sched = _setup(rank, world, port, hf_dir, 1, dropout=0.0)
    _step(ddp, opt, sched)
    checkpoint.save_checkpoint(save_dir, 3, chunks)  # weights only, as a converter writes them
    os.rename(checkpoint.iteration_dir(save_dir, 3), os.path.join(save_dir, "release"))
    with open(os.path.join(save_dir, checkpoint.TRACKER), "w") as f:
        f.write("release\n")
    saved = _params(chunks)
    with torch.no_grad():
        for p in chunks[0].parameters():
            p.zero_()
    out = {"release_dir": checkpoint.release_dir(save_dir),
           # the trainer's --load path with an optimizer: a release checkpoint has none, and none is asked for
           "it": checkpoint.load_checkpoint(save_dir, chunks, optimizer=opt, scheduler=sched)}
    out["weights_restored"] = max((saved[n] - p).abs().max().item() for n, p in chunks[0].named_parameters())
    try:
        checkpoint.load_checkpoint(save_dir, chunks, load_optim=False, iteration=5)
    except ValueError as e:
        out["step_refused"] = str(e)
    return out


@pytest.mark.slow
def test_megatron_release_checkpoint_loads_as_weights(tiny_ckpts, tmp_path):
    (r,) = run_ranks(release_rank, 1, tiny_ckpts["qwen2"], str(tmp_path / "save"))
    assert r["release_dir"] == str(tmp_path / "save" / "release")
    assert r["it"] is None and r["weights_restored"] == 0.0
    assert "a release checkpoint (marker 'release') has no iterations" in r["step_refused"]

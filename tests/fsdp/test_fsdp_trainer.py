"""The FSDP2 trainer on a tiny Qwen2, in real gloo processes: log-probs against transformers' own forward, one
GRPO step at world size 2 against world size 1, the same update as the Megatron trainer, and DCP checkpoints
(resume == uninterrupted, a world-size-2 checkpoint loads at world size 1, an unpublished save is never used).

One run per world size feeds several tests (module fixture): spawning a rank costs more than the checks."""
import os

import pytest
from _fsdp_common import flat, hf_log_probs, make_args, make_batch, run_ranks, shard

pytestmark = pytest.mark.slow
# SGD: its update is lr x gradient, so two trainers agree as closely as their gradients do
STEP_FLAGS = ["--lr", "1e-2", "--micro-batch-size", "2", "--global-batch-size", "8", "--clip-grad", "1.0",
              "--optimizer", "sgd"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    # init_std 0.1: logits far from uniform, so a parity check means something
    return build_tiny_checkpoint(str(tmp_path_factory.mktemp("fsdp_tiny")), init_std=0.1)


def _trainer(ckpt, rank, world_size, port, *flags):
    from slime_like.backends.fsdp.trainer import FSDPTrainer

    return FSDPTrainer(make_args(ckpt, *STEP_FLAGS, *flags), "actor", rank, world_size, master_port=port)


def _step(t, rollout_id, world_size, rank):
    mine = shard(make_batch(8, seed=rollout_id), world_size, rank)
    mine.update(t.compute_advantages(mine))
    return t.train_step(rollout_id, mine)


def grpo_rank(rank, world_size, port, ckpt, save):
    """Score, one GRPO step on this rank's share, score, HF weights, save, a second step, score."""
    t = _trainer(ckpt, rank, world_size, port, "--save", save)
    before = t.compute_log_probs(make_batch(8))["log_probs"]
    metrics = _step(t, 0, world_size, rank)
    after0 = t.compute_log_probs(make_batch(8))["log_probs"]
    weights = {n: w.clone() for n, w in t.iter_hf_weights()}
    t.save(0)
    _step(t, 1, world_size, rank)
    return dict(before=before, metrics=metrics, after0=after0, weights=weights,
                after1=t.compute_log_probs(make_batch(8))["log_probs"])


@pytest.fixture(scope="module")
def runs(ckpt, tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp_saves")
    ws2 = run_ranks(grpo_rank, 2, ckpt, str(root / "ws2"))
    return {"ws1": run_ranks(grpo_rank, 1, ckpt, str(root / "ws1"))[0], "ws2": ws2[0], "ws2_rank1": ws2[1],
            "save_ws2": str(root / "ws2")}


def test_log_probs_equal_transformers_and_a_grpo_step_at_ws2_equals_ws1(ckpt, runs):
    reference = flat(hf_log_probs(ckpt, make_batch(8)))
    ws1, ws2 = runs["ws1"], runs["ws2"]
    for before in (ws1["before"], ws2["before"], runs["ws2_rank1"]["before"]):
        assert (flat(before) - reference).abs().max().item() < 1e-5
    # one step on a batch split over 2 ranks == the whole batch on 1 rank (token-mean loss, reduce-scatter avg)
    assert (flat(ws2["after0"]) - flat(ws1["after0"])).abs().max().item() < 1e-5
    assert (flat(ws1["after0"]) - flat(ws1["before"])).abs().max().item() > 1e-3  # the step moved the policy
    for key in ("loss", "pg_loss", "entropy", "grad_norm", "tokens"):
        assert ws2["metrics"][key] == pytest.approx(ws1["metrics"][key], rel=1e-5, abs=1e-7), key
    assert runs["ws2_rank1"]["weights"] == {}  # only rank 0 yields the gathered weights
    for name, w in ws1["weights"].items():
        assert (ws2["weights"][name] - w).abs().max().item() < 1e-6, name


def megatron_rank(rank, world_size, port, ckpt):
    from slime_like.backends.megatron.trainer import MegatronTrainer

    t = MegatronTrainer(make_args(ckpt, *STEP_FLAGS), "actor", rank, world_size, master_port=port)
    metrics = _step(t, 0, world_size, rank)
    return metrics, {n: w.clone() for n, w in t.iter_hf_weights()}


def test_fsdp_and_megatron_make_the_same_update(ckpt, runs):
    """Same tiny Qwen2, same batch, same flags: the weights after one SGD step agree to 2e-6 (Adam agrees to
    ~2e-5: its first step is lr * g/|g|, which amplifies float noise where a gradient is ~0)."""
    mcore_metrics, mcore_weights = run_ranks(megatron_rank, 1, ckpt)[0]
    fsdp = runs["ws1"]
    assert sorted(fsdp["weights"]) == sorted(mcore_weights)
    worst = max((fsdp["weights"][n] - mcore_weights[n]).abs().max().item() for n in mcore_weights)
    assert worst < 2e-6, worst
    for key in ("loss", "entropy", "grad_norm"):
        assert fsdp["metrics"][key] == pytest.approx(mcore_metrics[key], rel=1e-4), key


def resume_rank(rank, world_size, port, ckpt, save):
    """Resume from `save`, one step; then a save that dies before publishing must stay invisible."""
    from slime_like.backends.fsdp import checkpoint

    t = _trainer(ckpt, rank, world_size, port, "--load", save, "--save", save)
    loaded, at_load = t.loaded_rollout_id, t.compute_log_probs(make_batch(8))["log_probs"]
    _step(t, 1, world_size, rank)
    resumed = t.compute_log_probs(make_batch(8))["log_probs"]

    def killed(*a):  # what a kill between writing the shards and publishing leaves on disk
        raise KeyboardInterrupt("killed before publish")
    checkpoint.publish = killed
    with pytest.raises(KeyboardInterrupt):
        t.save(1)
    again = _trainer(ckpt, rank, world_size, port, "--load", save)
    return loaded, at_load, resumed, again.loaded_rollout_id, again.compute_log_probs(make_batch(8))["log_probs"]


def test_dcp_resume_equals_uninterrupted_and_a_ws2_checkpoint_loads_at_ws1(ckpt, runs):
    save, ws2 = runs["save_ws2"], runs["ws2"]
    assert os.path.isfile(os.path.join(save, "iter_0000000", ".metadata"))
    loaded, at_load, resumed, loaded_again, at_load_again = run_ranks(resume_rank, 1, ckpt, save)[0]
    assert loaded == 0 and loaded_again == 0  # the unpublished iteration 1 is invisible
    assert os.path.isdir(os.path.join(save, "iter_0000001"))  # ... although its shards were written
    assert (flat(at_load) - flat(ws2["after0"])).abs().max().item() < 1e-6  # weights resharded 2 -> 1 exactly
    assert (flat(at_load_again) - flat(ws2["after0"])).abs().max().item() < 1e-6
    # optimizer state (SGD momentum) and LR schedule resumed: the next step equals the uninterrupted run's
    # (ws1 after ws2: only the float order of the DP reduction differs)
    assert (flat(resumed) - flat(ws2["after1"])).abs().max().item() < 1e-5
    assert (flat(ws2["after1"]) - flat(ws2["after0"])).abs().max().item() > 1e-3


HOOK_FLAGS = ["--custom-advantage-function-path", "trainer_hooks_for_tests.all_positive_advantages",
              "--rollout-data-postprocess-path", "trainer_hooks_for_tests.flip_first_rollout"]


def one_update_rank(rank, world_size, port, ckpt, backend, flags):
    """Score, advantages, one step, score again: what the RL logic shared by both backends decides."""
    import trainer_hooks_for_tests as hooks
    from slime_like.backends.fsdp.trainer import FSDPTrainer
    from slime_like.backends.megatron.trainer import MegatronTrainer

    trainer = FSDPTrainer if backend == "fsdp" else MegatronTrainer
    backend_flag = ["--train-backend", "megatron"] if backend == "megatron" else []
    t = trainer(make_args(ckpt, *backend_flag, *STEP_FLAGS, *flags), "actor", rank, world_size, master_port=port)
    batch = make_batch(8, seed=5)
    batch.update(t.compute_log_probs(batch, old_policy=True))
    batch.update(t.compute_advantages(batch))
    out = {k: batch.get(k) for k in ("log_probs", "teacher_log_probs", "advantages")}
    out["adv"] = {float(v) for a in batch["advantages"] for v in a}
    out["metrics"] = t.train_step(0, batch)
    out["after"] = t.compute_log_probs(make_batch(8, seed=5))["log_probs"]
    out["calls"] = [c for c in hooks.CALLS if c[0] == "postprocess"]
    return out


def test_fsdp_calls_the_advantage_and_post_process_hooks_like_megatron(ckpt):
    """slime's advantage function (+1 everywhere) and post-process (rollout 0: sign flipped), both backends."""
    fsdp = run_ranks(one_update_rank, 1, ckpt, "fsdp", HOOK_FLAGS)[0]
    mcore = run_ranks(one_update_rank, 1, ckpt, "megatron", HOOK_FLAGS)[0]
    assert fsdp["adv"] == {1.0}  # the custom function's advantages, not GRPO's +-1
    assert [c[1] for c in fsdp["calls"]] == [0]
    # +1 flipped to -1 by the post-process: every sample's response log-probs fall (GRPO would raise half of them)
    assert all(float(a.sum()) < float(b.sum()) for a, b in zip(fsdp["after"], fsdp["log_probs"]))
    assert (flat(fsdp["after"]) - flat(mcore["after"])).abs().max().item() < 1e-5  # one copy of the logic
    assert fsdp["metrics"]["loss"] == pytest.approx(mcore["metrics"]["loss"], rel=1e-4)


def test_fsdp_opd_teacher_scores_like_transformers_and_megatron(ckpt, tmp_path):
    """--use-opd --opd-type megatron on the FSDP trainer: a frozen teacher scores every rollout; the OPD term
    gives the advantages the Megatron trainer gives."""
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    teacher = build_tiny_checkpoint(str(tmp_path / "teacher"), seed=1, init_std=0.1)
    flags = ["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", teacher, "--opd-kl-coef", "0.5"]
    fsdp = run_ranks(one_update_rank, 1, ckpt, "fsdp", flags)[0]
    mcore = run_ranks(one_update_rank, 1, ckpt, "megatron", flags)[0]
    oracle = flat(hf_log_probs(teacher, make_batch(8, seed=5)))
    assert (flat(fsdp["teacher_log_probs"]) - oracle).abs().max().item() < 1e-5
    assert (flat(fsdp["log_probs"]) - oracle).abs().max().item() > 1e-2  # a different model than the student
    assert (flat(fsdp["advantages"]) - flat(mcore["advantages"])).abs().max().item() < 1e-5
    assert len(fsdp["adv"]) > 2  # per-token OPD terms, not GRPO's two values
    assert fsdp["metrics"]["opd_reverse_kl"] == pytest.approx(mcore["metrics"]["opd_reverse_kl"], rel=1e-4)


def test_fsdp_full_vocabulary_opd_makes_the_megatron_update(ckpt, tmp_path):
    """--opd-kl-mode full: the teacher runs inside the loss of each micro-batch on both backends; same step."""
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    teacher = build_tiny_checkpoint(str(tmp_path / "teacher"), seed=1, init_std=0.1)
    flags = ["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", teacher, "--opd-kl-mode", "full"]
    fsdp = run_ranks(one_update_rank, 1, ckpt, "fsdp", flags)[0]
    mcore = run_ranks(one_update_rank, 1, ckpt, "megatron", flags)[0]
    assert fsdp["teacher_log_probs"] is None and mcore["teacher_log_probs"] is None  # no scoring pass of its own
    assert fsdp["metrics"]["opd_reverse_kl"] == pytest.approx(mcore["metrics"]["opd_reverse_kl"], rel=1e-4)
    assert fsdp["metrics"]["opd_reverse_kl"] > 0.1
    assert (flat(fsdp["after"]) - flat(fsdp["log_probs"])).abs().max().item() > 1e-3
    assert (flat(fsdp["after"]) - flat(mcore["after"])).abs().max().item() < 1e-5

"""On-policy distillation with a Megatron teacher (--use-opd --opd-type megatron), checked on its mechanism.

The teacher's log-probs must be the teacher's (an independent transformers forward of the teacher's HF
directory is the oracle), --opd-teacher-ckpt-step must pick that iteration of a torch_dist teacher, and the
OPD term must change the update: with zero task advantages, plain GRPO does not move the weights while OPD
moves the student's log-probs toward the teacher's. The long learning check is docs/guide.md's demo run.
"""
import pytest
import torch
from _dist import run_ranks
from test_trainer_common import make_args, make_batch


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(student, teacher): two tiny Qwen2 checkpoints with different random weights and logits far from flat."""
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("opd")
    return (build_tiny_checkpoint(str(root / "student"), seed=0, init_std=0.1),
            build_tiny_checkpoint(str(root / "teacher"), seed=1, init_std=0.1))


def _trainer(ckpt, rank, world_size, port, *flags):
    from slime_like.args import role_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    return MegatronTrainer(role_args(make_args(ckpt, *flags), "actor"), role="actor", rank=rank,
                           world_size=world_size, master_port=port)


def _zero_reward_batch():
    batch = make_batch(8, seed=11)
    batch["rewards"] = [0.0] * 8  # every group all-equal: GRPO's advantages are 0, only OPD can teach
    return batch


def mechanism_case(rank, world_size, port, student, teacher):
    """Plain GRPO and GRPO + OPD on the same batch, in one process (mcore's parallel state is reused)."""
    return [_one_update(rank, world_size, port, student, teacher, use_opd) for use_opd in (False, True)]


def _one_update(rank, world_size, port, student, teacher, use_opd):
    flags = ["--lr", "3e-4", "--global-batch-size", "8", "--micro-batch-size", "4"]
    if use_opd:
        flags += ["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", teacher, "--opd-kl-coef", "0.5"]
    t = _trainer(student, rank, world_size, port, *flags)
    batch = _zero_reward_batch()
    assert t.old_log_probs_needed() == use_opd  # OPD reads the student's scoring pass
    batch.update(t.compute_log_probs(batch, old_policy=True))
    batch.update(t.compute_advantages(batch))
    params = [p.detach().clone() for c in t.chunks for p in c.parameters()]
    metrics = t.train_step(0, batch)
    moved = max(float((p.detach() - q).abs().max()) for p, q in zip((p for c in t.chunks for p in c.parameters()), params))
    after = t.compute_log_probs(batch, old_policy=True)["log_probs"]
    return {k: batch.get(k) for k in ("log_probs", "teacher_log_probs", "advantages")} | \
        {"moved": moved, "after": after, "metrics": metrics}


def _hf_response_logprobs(model_dir, batch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).float().eval()
    out = []
    with torch.no_grad():
        for toks, r in zip(batch["tokens"], batch["response_lengths"]):
            logp = torch.log_softmax(model(torch.tensor([toks])).logits[0].float(), -1)
            pos = torch.arange(len(toks) - r - 1, len(toks) - 1)
            out.append(logp[pos, torch.tensor(toks[-r:])])
    return out


def test_opd_teacher_scores_and_the_term_drives_the_update(pair):
    student, teacher = pair
    plain, opd = run_ranks(mechanism_case, 1, student, teacher)[0]
    batch = _zero_reward_batch()
    # the teacher's log-probs are the teacher's (transformers as the oracle), not the student's
    for got, ref in zip(opd["teacher_log_probs"], _hf_response_logprobs(teacher, batch)):
        torch.testing.assert_close(got, ref, atol=2e-4, rtol=1e-4)
    assert max(float((s - t).abs().max()) for s, t in zip(opd["log_probs"], opd["teacher_log_probs"])) > 0.1
    # advantages = 0 (GRPO on equal rewards) - coef x (student - teacher), token by token
    for adv, s, t in zip(opd["advantages"], opd["log_probs"], opd["teacher_log_probs"]):
        torch.testing.assert_close(adv, -0.5 * (s - t))
    assert all(float(a.abs().max()) == 0.0 for a in plain["advantages"])
    assert plain["moved"] == 0.0 and opd["moved"] > 0  # without OPD there is nothing to learn here
    # the policy gradient of sum A_t log p_t with A_t = -c (s_t - t_t) is that of -c/2 sum (s_t - t_t)^2 here:
    # one small step brings the student's log-probs of these tokens closer to the teacher's
    gap = lambda lps: sum(float(((s - t) ** 2).sum()) for s, t in zip(lps, opd["teacher_log_probs"]))  # noqa: E731
    assert gap(opd["after"]) < 0.95 * gap(opd["log_probs"]), (gap(opd["after"]), gap(opd["log_probs"]))
    tokens = sum(len(s) for s in opd["log_probs"])
    reverse_kl = sum(float((s - t).sum()) for s, t in zip(opd["log_probs"], opd["teacher_log_probs"])) / tokens
    assert opd["metrics"]["opd_reverse_kl"] == pytest.approx(reverse_kl, rel=1e-4)


def ckpt_step_case(rank, world_size, port, student, teacher, save_dir):
    saved = _save_two_iterations(rank, world_size, port, teacher, save_dir)
    return saved, _teacher_at_step(rank, world_size, port, student, save_dir, 0)


def _save_two_iterations(rank, world_size, port, ckpt, save_dir):
    """A torch_dist teacher directory with iterations 0 and 1 (different weights); their log-probs."""
    t = _trainer(ckpt, rank, world_size, port, "--lr", "1e-2", "--global-batch-size", "8", "--micro-batch-size", "4",
                 "--save", save_dir)
    batch = make_batch(8, seed=3)
    out = []
    for it in range(2):
        t.save(it)
        out.append(t.compute_log_probs(batch, old_policy=True)["log_probs"])
        batch.update(t.compute_advantages(batch))
        t.train_step(it, batch)
    return out


def _teacher_at_step(rank, world_size, port, student, teacher_dir, step):
    flags = ["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", teacher_dir, "--opd-teacher-ckpt-step", step]
    t = _trainer(student, rank, world_size, port, *flags)
    return t.compute_log_probs(make_batch(8, seed=3), old_policy=False)["teacher_log_probs"]


def test_opd_teacher_ckpt_step_picks_the_iteration(pair, tmp_path):
    student, teacher = pair
    saved, at0 = run_ranks(ckpt_step_case, 1, student, teacher, str(tmp_path / "teacher_dist"))[0]
    for got, ref in zip(at0, saved[0]):
        torch.testing.assert_close(got, ref)
    assert max(float((a - b).abs().max()) for a, b in zip(saved[0], saved[1])) > 1e-3  # the steps differ


# ----------------------------------------------------------------- --opd-kl-mode full (our extension)
def _hf_exact_reverse_kl(student_dir, teacher_dir, batch):
    """Token-mean KL(student || teacher) over the whole vocabulary at every response position (transformers)."""
    from transformers import AutoModelForCausalLM

    models = [AutoModelForCausalLM.from_pretrained(d).float().eval() for d in (student_dir, teacher_dir)]
    total, tokens = 0.0, 0
    with torch.no_grad():
        for toks, r in zip(batch["tokens"], batch["response_lengths"]):
            pos = torch.arange(len(toks) - r - 1, len(toks) - 1)
            s, t = (torch.log_softmax(m(torch.tensor([toks])).logits[0, pos].float(), -1) for m in models)
            total += float((s.exp() * (s - t)).sum())
            tokens += r
    return total / tokens


def full_mode_case(rank, world_size, port, student, teacher):
    """Two full-mode steps on one zero-reward batch: the KL each step trained on, advantages, the scoring pass."""
    t = _trainer(student, rank, world_size, port, "--lr", "3e-3", "--global-batch-size", "8", "--micro-batch-size",
                 "4", "--actor-num-gpus-per-node", str(world_size), "--tensor-model-parallel-size", str(world_size),
                 "--num-gpus-per-node", str(world_size), "--use-opd", "--opd-type", "megatron",
                 "--opd-teacher-load", teacher, "--opd-kl-mode", "full", "--opd-kl-coef", "0.5")
    batch = _zero_reward_batch()
    scored = t.compute_log_probs(batch, old_policy=t.old_log_probs_needed())
    batch.update(t.compute_advantages(batch))
    first, second = t.train_step(0, batch), t.train_step(1, batch)
    return {"needed": t.old_log_probs_needed(), "scored": sorted(scored), "advantages": batch["advantages"],
            "kl": [first["opd_reverse_kl"], second["opd_reverse_kl"]], "loss": first["loss"]}


def test_full_mode_trains_on_the_exact_kl_under_tensor_parallelism(pair):
    student, teacher = pair
    tp1 = run_ranks(full_mode_case, 1, student, teacher)[0]
    tp2 = run_ranks(full_mode_case, 2, student, teacher)
    exact = _hf_exact_reverse_kl(student, teacher, _zero_reward_batch())
    # no teacher scoring pass and no student one (the KL is a loss term), advantages untouched (all 0 here)
    assert tp1["needed"] is False and tp1["scored"] == []
    assert all(float(a.abs().max()) == 0.0 for a in tp1["advantages"])
    # the first step's KL is the exact one of the start (transformers' full softmax as the oracle), the same at
    # TP = 2 (vocabulary-sharded logits, Megatron's padded columns excluded), and the loss is coef x KL
    assert tp1["kl"][0] == pytest.approx(exact, rel=1e-4)
    assert tp1["loss"] == pytest.approx(0.5 * exact, rel=1e-4)
    for rank in tp2:
        assert rank["kl"][0] == pytest.approx(exact, rel=1e-4)
        # the update descends the KL, by the same step on one rank or two
        assert rank["kl"][1] == pytest.approx(tp1["kl"][1], rel=1e-3)
    assert tp1["kl"][1] < 0.9 * tp1["kl"][0], tp1["kl"]

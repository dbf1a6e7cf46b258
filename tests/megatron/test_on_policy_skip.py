"""On-policy GRPO skips the old-policy forward pass (MegatronTrainer.old_log_probs_needed).

The skipped pass must not change the update: a train step whose batch has the recomputed `log_probs` and
one whose batch has none (the loss then takes the current log-probs, detached) give the same metrics and
the same new weights. Without the pass, the trainer-vs-engine gap is measured inside the train step.
"""
import torch
from _dist import run_ranks
from test_trainer_common import make_args, make_batch

ON_POLICY = ("--global-batch-size", "8", "--micro-batch-size", "4", "--lr", "1e-3")


def _trainer(ckpt, port, *flags):  # several per process: parallel state is initialised once
    from slime_like.args import role_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    return MegatronTrainer(role_args(make_args(ckpt, *ON_POLICY, *flags), "actor"), role="actor", rank=0,
                           world_size=1, master_port=port)


def skip_case(rank, world_size, port, ckpt):
    out = {}
    for name in ("recompute", "skip"):
        torch.manual_seed(0)
        t = _trainer(ckpt, port)
        batch = make_batch(8, seed=4)
        out["needed"] = t.old_log_probs_needed()
        batch.update(t.compute_log_probs(batch, old_policy=name == "recompute"))
        out[name + "_keys"] = sorted(batch)
        batch.update(t.compute_advantages(batch))
        metrics = t.train_step(0, batch)
        out[name] = {"metrics": metrics, "weights": torch.cat([p.detach().reshape(-1) for p in t.chunks[0].parameters()])}
    return out


def decisions_case(rank, world_size, port, ckpt):
    cases = {"on_policy": (), "two_steps": ("--num-steps-per-rollout", "2", "--global-batch-size", "4"),
             "reward_kl": ("--advantage-estimator", "reinforce_plus_plus_baseline", "--normalize-advantages",
                           "--kl-coef", "0.1", "--ref-load", ckpt),
             # grpo ignores the reward-side KL: no reference model, no extra pass for --kl-coef
             "grpo_kl_coef": ("--kl-coef", "0.1", "--ref-load", ckpt), "dropout": ("--hidden-dropout", "0.05"),
             "rollout_logprobs_two_steps": ("--use-rollout-logprobs", "--num-steps-per-rollout", "2",
                                            "--global-batch-size", "4")}
    out = {}
    for name, flags in cases.items():
        t = _trainer(ckpt, port, *flags)
        out[name] = t.old_log_probs_needed()
        out[name + "_ref"] = t.ref_model is not None
    return out


def test_on_policy_step_without_the_old_policy_pass_is_the_same_update(tiny_ckpt):
    out = run_ranks(skip_case, 1, tiny_ckpt)[0]
    assert out["needed"] is False  # one step per rollout, no reward KL, no dropout
    assert "log_probs" in out["recompute_keys"] and "log_probs" not in out["skip_keys"]
    a, b = out["recompute"], out["skip"]
    assert a["metrics"]["grad_norm"] > 0
    assert torch.allclose(a["weights"], b["weights"], atol=1e-6), (a["weights"] - b["weights"]).abs().max()
    for key in ("loss", "pg_loss", "entropy", "grad_norm"):
        assert abs(a["metrics"][key] - b["metrics"][key]) < 1e-5, key
    # the trainer-vs-engine gap is still measured (the batch's fake engine log-probs are ~-4, far off)
    assert b["metrics"]["train_rollout_logprob_abs_diff"] > 0.5


def test_old_policy_pass_is_kept_whenever_the_old_policy_differs_or_is_read(tiny_ckpt):
    out = run_ranks(decisions_case, 1, tiny_ckpt)[0]
    needed = {k: v for k, v in out.items() if not k.endswith("_ref")}
    assert needed == {"on_policy": False, "two_steps": True, "reward_kl": True, "grpo_kl_coef": False,
                      "dropout": True, "rollout_logprobs_two_steps": False}
    assert [k[:-4] for k, v in out.items() if k.endswith("_ref") and v] == ["reward_kl"]

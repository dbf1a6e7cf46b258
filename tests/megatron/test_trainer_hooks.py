"""slime's trainer hooks (--custom-megatron-*, --custom-advantage-function-path, --custom-tis-function-path):
each tiny function in trainer_hooks_for_tests.py leaves a trace or changes the update, in one spawned rank."""

import pytest
from _dist import run_ranks
from test_trainer_common import make_args, make_batch, response_logprob_sums

from slime_like import args as A

M = "trainer_hooks_for_tests"


def hooks_case(rank, world_size, port, ckpt):
    import trainer_hooks_for_tests as hooks
    from slime_like.args import role_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    args = make_args(ckpt, "--lr", "3e-3", "--global-batch-size", "8", "--micro-batch-size", "4", "--use-tis",
                     "--custom-megatron-init-path", f"{M}.init",
                     "--custom-megatron-before-log-prob-hook-path", f"{M}.before_log_prob",
                     "--custom-megatron-before-train-step-hook-path", f"{M}.before_train_step",
                     "--custom-advantage-function-path", f"{M}.all_positive_advantages",
                     "--custom-tis-function-path", f"{M}.tis_or_reject",
                     "--rollout-data-postprocess-path", f"{M}.flip_first_rollout")
    t = MegatronTrainer(role_args(args, "actor"), role="actor", rank=rank, world_size=world_size, master_port=port)
    out = {}
    for rollout, reject in ((0, False), (1, True)):
        hooks.REJECT_ALL = reject
        batch = make_batch(8, seed=50 + rollout)
        batch.update(t.compute_log_probs(batch))
        before = response_logprob_sums(batch["log_probs"], batch)
        batch.update(t.compute_advantages(batch))
        adv = sorted({float(v) for a in batch["advantages"] for v in a})
        metrics = t.train_step(rollout, batch)
        after = response_logprob_sums(t.compute_log_probs(batch)["log_probs"], batch)
        out[rollout] = {"before": before, "after": after, "metrics": metrics,
                        "adv": adv}
    out["calls"] = list(hooks.CALLS)
    return out


def test_trainer_hooks_change_what_they_should(tiny_ckpt):
    out = run_ranks(hooks_case, 1, tiny_ckpt)[0]
    calls = out["calls"]
    assert calls[0] == ("init", 3e-3)
    assert ("log_prob", "", 1) in calls
    assert [c[1:3] for c in calls if c[0] == "train_step"] == [(0, 0), (1, 0)]
    assert [c[1] for c in calls if c[0] == "postprocess"] == [0, 1]
    first, second = out[0], out[1]
    assert first["adv"] == [1.0]                                  # the custom advantages, not GRPO's +-1
    # +1 everywhere, flipped to -1 by the post-process hook: every sample's log-probs fall, the positive-reward
    # ones included (GRPO would push those up)
    assert first["after"][0] < first["before"][0] - 1e-3 and first["after"][1] < first["before"][1]
    assert first["metrics"]["my_tis"] == pytest.approx(1.0)       # the custom TIS function's metric
    assert first["metrics"]["grad_norm"] > 0
    # rollout 1: the TIS function rejects every token: no policy loss, no gradient (Adam's momentum still moves)
    assert second["metrics"]["loss"] == 0.0 and second["metrics"]["grad_norm"] == 0.0


def test_a_wrong_hook_signature_fails_at_start_naming_the_flag():
    from slime_like.backends.training.hooks import load_trainer_hooks

    with pytest.raises(ValueError, match=r"--custom-advantage-function-path .*fn\(args, rollout_data\)"):
        load_trainer_hooks(A.make_args(custom_advantage_function_path=f"{M}.wrong_signature"))
    with pytest.raises(ValueError, match="did you mean"):
        load_trainer_hooks(A.make_args(custom_megatron_init_path=f"{M}.initt"))
    with pytest.raises(ValueError, match="cannot be called as fn\(args, \*, pg_loss"):
        load_trainer_hooks(A.make_args(custom_tis_function_path=f"{M}.before_log_prob"))


def _sgd_update(ckpt, rank, world_size, port, *flags):
    """One plain-SGD step (the update is linear in the loss) on a fixed batch: (parameter deltas, metrics)."""
    import torch
    from slime_like.args import role_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    args = make_args(ckpt, "--optimizer", "sgd", "--lr", "0.1", "--global-batch-size", "8", "--micro-batch-size", "8",
                     *flags)
    t = MegatronTrainer(role_args(args, "actor"), role="actor", rank=rank, world_size=world_size, master_port=port)
    batch = make_batch(8, seed=60)
    if args.loss_type != "sft_loss":
        batch.update(t.compute_advantages(batch))
    before = [p.detach().clone() for c in t.chunks for p in c.parameters()]
    metrics = t.train_step(0, batch)
    delta = torch.cat([(p.detach() - b).reshape(-1) for p, b in zip((p for c in t.chunks for p in c.parameters()),
                                                                    before)])
    return delta, metrics


def loss_hooks_case(rank, world_size, port, ckpt):
    run = lambda *flags: _sgd_update(ckpt, rank, world_size, port, *flags)  # noqa: E731
    return {"sft": run("--loss-type", "sft_loss", "--disable-compute-advantages-and-returns"),
            "custom": run("--loss-type", "custom_loss", "--custom-loss-function-path", f"{M}.nll_loss"),
            "policy": run(),
            "double": run("--custom-pg-loss-reducer-function-path", f"{M}.double_token_mean"),
            "zero": run("--custom-pg-loss-reducer-function-path", f"{M}.zero_reducer")}


def test_custom_loss_and_pg_loss_reducer_change_the_update(tiny_ckpt):
    import torch

    out = run_ranks(loss_hooks_case, 1, tiny_ckpt)[0]
    # a custom loss written as slime's SFT loss makes exactly the built-in sft_loss update, and logs its metric
    (sft, sft_m), (custom, custom_m) = out["sft"], out["custom"]
    assert sft.abs().max() > 1e-4
    torch.testing.assert_close(custom, sft, atol=1e-6, rtol=1e-4)
    assert custom_m["my_nll"] == pytest.approx(sft_m["sft_loss"], rel=1e-5)
    assert custom_m["loss"] == pytest.approx(sft_m["loss"], rel=1e-5)
    # the pg-loss reducer replaces the policy loss's reduction: twice the token mean -> twice the SGD step
    (policy, policy_m), (double, double_m), (zero, _) = out["policy"], out["double"], out["zero"]
    assert policy.abs().max() > 1e-5
    torch.testing.assert_close(double, 2 * policy, atol=1e-6, rtol=1e-4)
    assert double_m["loss"] == pytest.approx(2 * policy_m["loss"], rel=1e-4)
    assert zero.abs().max() == 0.0


def test_loss_hooks_with_a_wrong_signature_fail_at_start():
    from slime_like.backends.training.hooks import load_trainer_hooks

    with pytest.raises(ValueError, match=r"--custom-loss-function-path .*cannot be called as "
                                         r"fn\(args, batch, logits, sum_of_sample_mean\)"):
        load_trainer_hooks(A.make_args(custom_loss_function_path=f"{M}.wrong_signature"))
    with pytest.raises(ValueError, match=r"--custom-pg-loss-reducer-function-path .*cannot be called as factory\("
                                         r"total_lengths, response_lengths, loss_masks, calculate_per_token_loss\)"):
        load_trainer_hooks(A.make_args(custom_pg_loss_reducer_function_path=f"{M}.wrong_signature"))
    with pytest.raises(ValueError, match=r"--custom-loss-function-path .*has no attribute 'nll_los'; did you mean"):
        load_trainer_hooks(A.make_args(custom_loss_function_path=f"{M}.nll_los"))

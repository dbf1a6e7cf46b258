"""slime's trainer hooks (--custom-megatron-*, --custom-advantage-function-path, --custom-tis-function-path):
each tiny function in trainer_hooks_for_tests.py leaves a trace or changes the update, in one spawned rank."""
from argparse import Namespace

import pytest
from _dist import run_ranks
from test_trainer_common import make_args, make_batch, response_logprob_sums

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
    from slime_like.backends.megatron.hooks import load_trainer_hooks

    with pytest.raises(ValueError, match=r"--custom-advantage-function-path .*fn\(args, rollout_data\)"):
        load_trainer_hooks(Namespace(custom_advantage_function_path=f"{M}.wrong_signature"))
    with pytest.raises(ValueError, match="did you mean"):
        load_trainer_hooks(Namespace(custom_megatron_init_path=f"{M}.initt"))
    with pytest.raises(ValueError, match="cannot be called as fn\(args, \*, pg_loss"):
        load_trainer_hooks(Namespace(custom_tis_function_path=f"{M}.before_log_prob"))

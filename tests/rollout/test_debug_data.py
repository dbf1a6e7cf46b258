"""Debug dumps: JSON round trip, slime's torch.save dumps read without running code, CI step checks."""
import os

import pytest
import torch

from slime_like.backends.training.ci_checks import CICheckError, check_step
from slime_like.rollout.debug_data import load_rollout, save_rollout
from slime_like.sample import Sample, Status


def _samples():
    return [Sample(index=i, group_index=i // 2, prompt="p", tokens=[1, 2, 3], response="x", response_length=1,
                   loss_mask=[1], rollout_log_probs=[-0.1 * (i + 1) / 3], reward={"score": 1.0}, label="4",
                   status=Status.COMPLETED) for i in range(4)]


def test_json_round_trip_is_exact_and_subsample_keeps_whole_groups(tmp_path):
    pattern = str(tmp_path / "r_{rollout_id}.pt")
    save_rollout(pattern, 3, _samples())
    back = load_rollout(pattern, 3)
    assert back == _samples()                       # floats bit-identical, status an enum again
    assert [s.index for s in load_rollout(pattern, 3, subsample=0.5)] == [0, 1]


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch " + _Boom.marker,))


def test_slime_torch_dumps_load_with_the_restricted_loader_only(tmp_path):
    good = str(tmp_path / "slime_0.pt")
    row = {k: v for k, v in vars(_samples()[0]).items()}
    row["status"] = "completed"
    row["rollout_top_p_token_ids"] = [3]            # a slime-only field lands in metadata
    torch.save({"rollout_id": 0, "samples": [row]}, good)
    (s,) = load_rollout(str(tmp_path / "slime_{rollout_id}.pt"), 0)
    assert s.tokens == [1, 2, 3] and s.metadata["slime_fields"] == {"rollout_top_p_token_ids": [3]}

    _Boom.marker = str(tmp_path / "pwned")
    torch.save({"rollout_id": 1, "samples": [], "x": _Boom()}, str(tmp_path / "slime_1.pt"))
    with pytest.raises(ValueError, match="not loaded"):
        load_rollout(str(tmp_path / "slime_{rollout_id}.pt"), 1)
    assert not os.path.exists(_Boom.marker)


def test_ci_step_checks(tmp_path):
    from slime_like.args import make_args

    args = make_args(ci_test=True, ci_disable_kl_checker=False, ci_train_rollout_logprob_abs_diff_threshold=0.1,
                     ci_save_grad_norm=None, ci_load_grad_norm=None)
    ok = {"train_rollout_logprob_abs_diff": 0.01, "approx_kl": 0.0, "clipfrac": 0.0, "kl_loss": 0.0, "grad_norm": 2.0}
    check_step(args, "actor", 0, 0, 1, ok, writer=True)
    with pytest.raises(CICheckError, match="threshold 0.1"):
        check_step(args, "actor", 0, 0, 1, dict(ok, train_rollout_logprob_abs_diff=0.5), writer=True)
    with pytest.raises(CICheckError, match="ppo_kl"):
        check_step(args, "actor", 3, 0, 1, dict(ok, approx_kl=1e-3), writer=True)
    check_step(args, "actor", 3, 1, 2, dict(ok, approx_kl=1e-3), writer=True)   # not a rollout's first step
    with pytest.raises(CICheckError, match="kl_loss"):
        check_step(args, "actor", 0, 0, 1, dict(ok, kl_loss=1e-3), writer=True)
    check_step(args, "actor", 1, 0, 1, dict(ok, kl_loss=1e-3), writer=True)    # only the run's first step
    pattern = str(tmp_path / "gn_{role}_{rollout_id}_{step_id}")
    check_step(make_args(ci_save_grad_norm=pattern), "actor", 0, 0, 1, ok, writer=True)
    load = make_args(ci_load_grad_norm=pattern)
    check_step(load, "actor", 0, 0, 1, dict(ok, grad_norm=2.01), writer=True)
    with pytest.raises(CICheckError, match="differs"):
        check_step(load, "actor", 0, 0, 1, dict(ok, grad_norm=2.5), writer=True)


def test_sft_rollout_masks_assistant_turns_and_completions(tiny_ckpt):
    from transformers import AutoTokenizer

    from slime_like.rollout.sft_rollout import completion_tokens, conversation_tokens

    tok = AutoTokenizer.from_pretrained(tiny_ckpt)
    msgs = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "12"},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "3"}]
    ids, mask = conversation_tokens(tok, msgs)
    assert tok.decode([i for i, m in zip(ids, mask) if m]) == "123"      # assistant contents, no headers
    assert ids == list(tok(tok.apply_chat_template(msgs, tokenize=False), add_special_tokens=False)["input_ids"])
    ids, mask = completion_tokens(tok, "ab", "12")
    assert ids[-1] == tok.eos_token_id and mask == [0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="--label-key"):
        completion_tokens(tok, "ab", None)

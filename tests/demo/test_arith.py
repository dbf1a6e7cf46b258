"""The demo task: data split, exact-match reward, and prepare (SFT warm-up + idempotent rerun)."""
import asyncio
import hashlib
import json
import os

import pytest

from slime_like.demo import arith
from slime_like.demo.arith import EOS_ID, reward, score, split_pairs, token_ids, write_data
from slime_like.sample import Sample, Status


def _digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_split_is_disjoint_complete_and_deterministic(tmp_path):
    a, b = write_data(str(tmp_path / "a")), write_data(str(tmp_path / "b"))
    assert _digest(a["train"]) == _digest(b["train"]) and _digest(a["heldout"]) == _digest(b["heldout"])
    train = [json.loads(line) for line in open(a["train"])]
    held = [json.loads(line) for line in open(a["heldout"])]
    assert len(held) == 200 and len(train) == 90 * 90 - 200
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    assert len({r["prompt"] for r in train}) == len(train)
    for r in train[:50] + held:
        x, y = map(int, r["prompt"].rstrip("=").split("+"))
        assert r["label"] == str(x + y) and 10 <= x <= 99 and 10 <= y <= 99
    # the held-out set is exactly the fixed split, whatever order the train file has
    assert [r["prompt"] for r in held] == [f"{x}+{y}=" for x, y in split_pairs()[1]]
    assert split_pairs(seed=1)[1] != split_pairs()[1]


@pytest.mark.parametrize("response,truncated,expected", [
    ("57", False, 1.0),              # engine trimmed the eos
    ("57<eos>", False, 1.0),
    ("57<eos><pad>", False, 1.0),
    ("571", False, 0.0),             # trailing digits
    ("5", False, 0.0),
    (" 57", False, 0.0),             # exact: no stripping
    ("57", True, 0.0),               # cut at max length, never said eos
    ("", False, 0.0),
])
def test_score_text(response, truncated, expected):
    assert score(response, "57", truncated=truncated) == expected


def test_score_ids_reject_invisible_tokens():
    ok = token_ids("57") + [EOS_ID]
    assert score("57", "57", response_ids=ok) == 1.0
    assert score("57", "57", response_ids=token_ids("57")) == 1.0            # eos trimmed, completed
    assert score("57", "57", truncated=True, response_ids=token_ids("57")) == 0.0
    assert score("57", "57", response_ids=[token_ids("5")[0], 40, token_ids("7")[0], EOS_ID]) == 0.0
    assert score("57", "58", response_ids=ok) == 0.0
    assert score("57", 57, response_ids=ok) == 1.0                            # int labels compare as text
    with pytest.raises(ValueError, match="outside the demo alphabet"):
        token_ids("5a")


def test_async_reward_on_samples():
    prompt = token_ids("12+45=")

    def sample(resp_ids, text, status):
        return Sample(tokens=prompt + resp_ids, response=text, response_length=len(resp_ids), label="57",
                      status=status)

    right = sample(token_ids("57") + [EOS_ID], "57", Status.COMPLETED)
    wrong = sample(token_ids("56") + [EOS_ID], "56", Status.COMPLETED)
    long = sample(token_ids("57123"), "57123", Status.TRUNCATED)
    text_only = Sample(response="57", label="57", status=Status.COMPLETED)    # no token ids: text decides
    got = [asyncio.run(reward(None, s)) for s in (right, wrong, long, text_only)]
    assert got == [1.0, 0.0, 0.0, 1.0]


def test_reward_loads_through_custom_rm_path():
    """`--custom-rm-path slime_like.demo.arith.reward` resolves to this function (module path + attribute)."""
    import importlib
    module, _, name = "slime_like.demo.arith.reward".rpartition(".")
    assert getattr(importlib.import_module(module), name) is arith.reward


def test_prepare_builds_then_skips(tmp_path, capsys):
    """A low target keeps SFT to a few dozen steps; the second call must do no work and change nothing."""
    from slime_like.demo.arith import evaluate_greedy
    from slime_like.demo.prepare import prepare

    out = prepare(str(tmp_path), sft_target=0.01, sft_eval_every=5)
    first = capsys.readouterr().out
    assert "data: wrote 7900 train / 200 held-out" in first and "sft: saved" in first
    acc = out["sft"]["heldout_accuracy"]
    assert acc >= 0.01
    # the saved checkpoint is the evaluated one, checked with plain transformers
    assert evaluate_greedy(out["sft_model"], out["heldout"]) == pytest.approx(acc)
    files = {p: os.path.getmtime(p) for p in (out["train"], out["heldout"],
                                                os.path.join(out["sft_model"], "model.safetensors"))}
    again = prepare(str(tmp_path), sft_target=0.01, sft_eval_every=5)
    second = capsys.readouterr().out
    assert second.count("skipped") == 3 and "wrote" not in second and "saved" not in second
    assert {p: os.path.getmtime(p) for p in files} == files
    assert again["sft"]["heldout_accuracy"] == acc
    assert not any(name.endswith(".tmp") for name in os.listdir(tmp_path))
    # --teacher-target: a stronger copy for on-policy distillation, built once beside the student
    with_teacher = prepare(str(tmp_path), sft_target=0.01, sft_eval_every=5, teacher_target=0.02)
    assert with_teacher["teacher"]["heldout_accuracy"] >= 0.02 and "teacher: saved" in capsys.readouterr().out
    prepare(str(tmp_path), sft_target=0.01, sft_eval_every=5, teacher_target=0.02)
    rerun = capsys.readouterr().out
    assert "teacher: " in rerun and "exists" in rerun and "teacher: saved" not in rerun  # skipped the second time


def test_sft_is_deterministic(tmp_path):
    """Same seed and thread count -> the same steps and bit-identical weights (short run: low target)."""
    from slime_like.demo.prepare import MODEL_SHAPE
    from slime_like.demo.sft import sft_warmup
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    base = build_tiny_checkpoint(str(tmp_path / "base"), alphabet=arith.ALPHABET, **MODEL_SHAPE)
    train, held = split_pairs()
    runs = [sft_warmup(base, train, held, str(tmp_path / f"sft{i}"), target=0.01, eval_every=5, log=lambda *a: None)
            for i in range(2)]
    assert runs[0]["history"] == runs[1]["history"]
    assert _digest(tmp_path / "sft0" / "model.safetensors") == _digest(tmp_path / "sft1" / "model.safetensors")


@pytest.mark.slow
def test_prepare_default_reaches_target(tmp_path):
    """The real warm-up: stops at the first eval >= 15 % held-out accuracy, near it (eval every 10 steps)."""
    from slime_like.demo.arith import evaluate_greedy
    from slime_like.demo.prepare import prepare

    out = prepare(str(tmp_path))
    assert 0.15 <= out["sft"]["heldout_accuracy"] < 0.40
    assert evaluate_greedy(out["sft_model"], out["heldout"]) == pytest.approx(out["sft"]["heldout_accuracy"])

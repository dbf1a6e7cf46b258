"""Issue 19, finding 7: bad prompts are found at load, not at rollout 10. Over-long (context length or more) and
empty prompts are refused naming the counts and rows, or dropped by --skip-over-long-prompts; a resume whose
filter changed continues with the prompts not used yet; non-UTF-8 names file and line, a BOM is accepted."""
import json

import pytest

from slime_like.args import make_args
from slime_like.rollout.data_source import PromptDataError, RolloutDataSource
from slime_like.tools.tiny_model import build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _args(path, **kw):
    base = dict(prompt_data=path, input_key="q", label_key=None, metadata_key="metadata", apply_chat_template=False,
                rollout_shuffle=False, rollout_seed=7, rollout_max_prompt_len=None, n_samples_per_prompt=1,
                sglang_server_args={"context_length": 64}, skip_over_long_prompts=False)
    base.update(kw)
    return make_args(**base)


def _rows():
    rows = [{"q": f"p{i}"} for i in range(8)]
    rows[3] = {"q": "a" * 80}      # 80 tokens with the char tokenizer: over a 64-token context
    rows[6] = {"q": ""}            # no tokens
    return rows


def test_over_long_and_empty_prompts_are_refused_at_load_with_rows(tmp_path, tok):
    path = _write(tmp_path / "p.jsonl", _rows())
    with pytest.raises(PromptDataError) as e:
        RolloutDataSource(_args(path), tok)
    msg = str(e.value)
    assert "1 over-long (rows 4)" in msg and "1 empty (rows 7)" in msg and "--skip-over-long-prompts" in msg


def test_skip_over_long_prompts_drops_them(tmp_path, tok):
    ds = RolloutDataSource(_args(_write(tmp_path / "p.jsonl", _rows()), skip_over_long_prompts=True), tok)
    assert [r["prompt"] for r in ds.records] == ["p0", "p1", "p2", "p4", "p5", "p7"]


def test_resume_with_a_changed_filter_continues_with_unused_prompts(tmp_path, tok):
    rows = [{"q": f"p{i}" + "x" * (20 if i == 4 else 0)} for i in range(8)]
    path = _write(tmp_path / "p.jsonl", rows)
    first = RolloutDataSource(_args(path, rollout_shuffle=True), tok)
    taken = [g[0].prompt for g in first.get_samples(3)]
    state = json.loads(json.dumps(first.state_dict()))          # through JSON, as a checkpoint stores it
    resumed = RolloutDataSource(_args(path, rollout_shuffle=True, rollout_max_prompt_len=10), tok)
    resumed.load_state_dict(state)
    rest = [g[0].prompt for g in resumed.get_samples(len(rows) - 3 - (rows[4]["q"] not in taken))]
    kept = {r["q"] for r in rows if len(r["q"]) <= 10}
    assert not set(rest) & set(taken) and set(rest) | (set(taken) & kept) == kept
    assert resumed.epoch == 0
    # the filtered run's own save resumes by identity too: epoch 0 is used up, the next prompt opens epoch 1
    again = RolloutDataSource(_args(path, rollout_shuffle=True, rollout_max_prompt_len=10), tok)
    again.load_state_dict(json.loads(json.dumps(resumed.state_dict())))
    assert again.get_samples(1)[0][0].prompt in kept and again.epoch == 1


def test_non_utf8_names_file_and_line_and_bom_is_accepted(tmp_path, tok):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"q": "ok"}\n{"q": "\xff"}\n')
    with pytest.raises(PromptDataError, match=r"bad.jsonl:2: not UTF-8"):
        RolloutDataSource(_args(str(bad)), tok)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b'\xef\xbb\xbf{"q": "p0"}\n{"q": "p1"}\n')
    assert [r["prompt"] for r in RolloutDataSource(_args(str(bom)), tok).records] == ["p0", "p1"]

"""Data source: keys, chat template, length filter, shuffle/epochs, exact resume, bad input."""
import json
import logging

import pytest

from slime_like.args import make_args
from slime_like.rollout.data_source import PromptDataError, RolloutDataSource, load_prompts
from slime_like.sample import Status
from slime_like.tools.tiny_model import build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def _args(path, **kw):
    base = dict(prompt_data=path, input_key="question", label_key="answer", metadata_key="metadata",
                apply_chat_template=False, rollout_shuffle=False, rollout_seed=7, rollout_max_prompt_len=None,
                n_samples_per_prompt=2)
    base.update(kw)
    return make_args(**base)


def test_groups_keys_and_tokens(tmp_path, tok):
    path = _write(tmp_path / "p.jsonl", [{"question": f"q{i}", "answer": str(i), "metadata": {"k": i}}
                                         for i in range(3)])
    ds = RolloutDataSource(_args(path), tok)
    groups = ds.get_samples(2)
    assert [[s.index for s in g] for g in groups] == [[0, 1], [2, 3]]
    assert [g[0].group_index for g in groups] == [0, 1]
    s = groups[1][1]
    assert (s.prompt, s.label, s.metadata, s.status) == ("q1", "1", {"k": 1}, Status.PENDING)
    assert tok.decode(s.tokens) == "q1" and s.response_length == 0


def test_chat_template_and_length_filter(tmp_path, tok, caplog):
    rows = [{"question": [{"role": "user", "content": "hi"}], "answer": "a"},
            {"question": "x" * 50, "answer": "b"}]
    path = _write(tmp_path / "c.jsonl", rows)
    with caplog.at_level(logging.INFO):
        recs = load_prompts(path, tok, "question", "answer", apply_chat_template=True, max_prompt_len=30)
    assert len(recs) == 1 and tok.decode(recs[0]["prompt_ids"]) == "<user>hi\n<assistant>"
    assert "dropped 1 of 2 prompts" in caplog.text


def _sequence(ds, n):
    return [g[0].prompt for g in ds.get_samples(n)]


def test_shuffle_epochs_and_exact_resume(tmp_path, tok):
    path = _write(tmp_path / "p.jsonl", [{"question": f"q{i}", "answer": "0"} for i in range(5)])
    args = _args(path, rollout_shuffle=True)
    full = RolloutDataSource(args, tok)
    reference = _sequence(full, 13)               # runs through 2.6 epochs
    for epoch in range(2):                        # each epoch is a permutation of all prompts
        assert sorted(reference[5 * epoch:5 * epoch + 5]) == [f"q{i}" for i in range(5)]
    assert reference[:5] != reference[5:10]       # reshuffled per epoch

    first = RolloutDataSource(args, tok)
    head = _sequence(first, 7)
    partial = first.get_samples(1)[0]             # pretend it was aborted mid-generation
    partial[0].tokens += [5, 6]; partial[0].response_length = 2; partial[0].status = Status.ABORTED
    first.add_samples([partial])
    state = json.loads(json.dumps(first.state_dict()))   # survives a JSON round trip

    resumed = RolloutDataSource(args, tok)
    resumed.load_state_dict(state)
    back = resumed.get_samples(1)[0]              # the buffered partial group comes first, intact
    assert back[0].tokens[-2:] == [5, 6] and back[0].status == Status.ABORTED
    tail = _sequence(resumed, 5)
    assert head + [back[0].prompt] + tail == reference
    assert resumed.get_samples(1)[0][0].group_index == 13


def test_resume_refuses_other_file(tmp_path, tok):
    a = RolloutDataSource(_args(_write(tmp_path / "a.jsonl", [{"question": "q", "answer": "1"}] * 3)), tok)
    b = RolloutDataSource(_args(_write(tmp_path / "b.jsonl", [{"question": "q", "answer": "1"}] * 4)), tok)
    with pytest.raises(ValueError, match="3 prompts"):
        b.load_state_dict(a.state_dict())


def test_malformed_line_names_file_and_line(tmp_path, tok):
    path = _write(tmp_path / "bad.jsonl", [{"question": "q", "answer": "1"}, "", '{"question": "q", "answer": '])
    with pytest.raises(PromptDataError, match=r"bad.jsonl:3: malformed JSON"):
        RolloutDataSource(_args(path), tok)


def test_missing_key_names_key_and_keys_present(tmp_path, tok):
    path = _write(tmp_path / "k.jsonl", [{"question": "q", "answer": "1"}, {"prompt": "q", "answer": "1"}])
    with pytest.raises(PromptDataError, match=r"k.jsonl:2: --input-key 'question' is not in the record "
                                              r"\(keys present: \['answer', 'prompt'\]\)"):
        RolloutDataSource(_args(path), tok)
    with pytest.raises(PromptDataError, match=r"did you mean --label-key answer"):
        RolloutDataSource(_args(_write(tmp_path / "k2.jsonl", [{"prompt": "q", "answer": "1"}]),
                                input_key="prompt", label_key="answr"), tok)


def test_parquet_when_available(tmp_path, tok):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa
    path = str(tmp_path / "p.parquet")
    pq.write_table(pa.Table.from_pylist([{"question": "abc", "answer": "1"}]), path)
    assert RolloutDataSource(_args(path), tok).get_samples(1)[0][0].prompt == "abc"

"""Hostile or broken input files (issue 31, items 3 and 7): every YAML the project reads goes through one bounded
reader (config/safe_yaml.py) and every prompt row through one bounded row reader (config/data_rows.py), so an
alias bomb, a document nested 50,000 deep, a file that is not UTF-8, a prompt row nested 100,000 deep and
--prompt-data /dev/zero each end the start-up with exit 2 and one line naming the file (and line), before Ray.

Each case runs the real train.py in a subprocess under a 3 GiB address-space limit, so a regression shows as a
MemoryError traceback, not as a machine out of memory."""
import os
import resource
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIMIT = 3 * 1024 ** 3


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def _train(argv, timeout=120) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=REPO)
    p = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), *map(str, argv)], capture_output=True,
                       text=True, env=env, cwd=REPO, timeout=timeout, preexec_fn=_limit_memory)
    return p.returncode, p.stderr


def _alias_bomb(leaf: str = '"lol"') -> str:
    """The 'billion laughs' shape: 9 levels of 9 aliases each, 9^9 = 387 million values when expanded."""
    lines = [f"x0: &x0 [{', '.join([leaf] * 9)}]"]
    lines += [f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join(lines) + "\n"


def _assert_one_line_error(rc, err, *needles):
    assert rc == 2, err[-3000:]
    assert "Traceback" not in err and "MemoryError" not in err and "RecursionError" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "ray" not in err.lower().replace("array", ""), err  # refused before Ray started


@pytest.mark.parametrize("flag,body", [
    ("--megatron-config-path", _alias_bomb() + "megatron: [{role: actor, overrides: {lr: *x8}}]\n"),
    ("--sglang-config", _alias_bomb() + "mem_fraction_static: *x8\n"),
    ("--vllm-config", _alias_bomb() + "gpu_memory_utilization: *x8\n"),
    ("--eval-config", _alias_bomb() + "eval: {datasets: *x8}\n"),
])
def test_yaml_alias_bomb_is_refused_in_one_line(base, tmp_path, flag, body):
    path = tmp_path / "bomb.yaml"
    path.write_text(body)
    assert len(body) < 700  # the probe's size class: a few hundred bytes
    rc, err = _train([*base, flag, path])
    _assert_one_line_error(rc, err, f"{flag} {path}:", "aliases expand to more than")


def test_rlinf_config_alias_bomb_is_refused(tmp_path):
    path = tmp_path / "rlinf.yaml"
    path.write_text(_alias_bomb() + "runner: {task_type: math}\nalgorithm: {group_size: *x8}\n")
    rc, err = _train(["--config", path])
    _assert_one_line_error(rc, err, f"--config {path}:", "aliases expand to more than")


def test_recursive_alias_is_refused(base, tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("megatron: &m [{role: actor, overrides: {lr: 1.0e-5}}, *m]\n")
    rc, err = _train([*base, "--megatron-config-path", path])
    _assert_one_line_error(rc, err, f"--megatron-config-path {path}:1:", "recursive alias")


def test_yaml_nested_50k_deep(base, tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("megatron:\n  - " + "[" * 50_000 + "]" * 50_000 + "\n")
    rc, err = _train([*base, "--megatron-config-path", path])
    _assert_one_line_error(rc, err, f"--megatron-config-path {path}:2", "nested more than 100 levels")


def test_yaml_not_utf8(base, tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"megatron:\n  - role: actor\n    name: caf\xe9\n")
    rc, err = _train([*base, "--sglang-config", path])
    _assert_one_line_error(rc, err, f"--sglang-config {path}:3:14: not UTF-8 (byte 0xe9)")


def test_yaml_duplicate_key_is_named(base, tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("megatron:\n  - role: actor\n    overrides: {lr: 1.0e-5, lr: 2.0e-5}\n")
    rc, err = _train([*base, "--megatron-config-path", path])
    _assert_one_line_error(rc, err, f"{path}:3", "duplicate key 'lr'")


def test_yaml_merge_keys_and_anchors_still_work(base, tmp_path):
    """Anchors, aliases and `<<:` merges within the bounds read as before (an override of a merged key is no
    duplicate)."""
    path = tmp_path / "roles.yaml"
    path.write_text("common: &c {lr: 1.0e-5, min_lr: 0.0}\n"
                    "megatron:\n  - role: actor\n    overrides: {<<: *c, lr: 2.0e-5}\n")
    rc, err = _train([*base, "--megatron-config-path", path, "--dry-run"])
    assert rc == 2 and "unknown top-level key(s) ['common']" in err  # read fine; the schema refuses the extra key


def test_prompt_row_nested_100k_deep(base, tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text('{"prompt": "1+1="}\n{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    rc, err = _train([*base, "--prompt-data", path, "--input-key", "prompt"])
    _assert_one_line_error(rc, err, f"--prompt-data: {path}:2: JSON nested")


def test_prompt_row_nested_500_deep(base, tmp_path):
    """Deep enough to parse but to break whatever walks it later (deepcopy, json.dumps): refused too."""
    path = tmp_path / "deep.jsonl"
    path.write_text('{"prompt": "1+1=", "metadata": ' + "[" * 500 + "]" * 500 + "}\n")
    rc, err = _train([*base, "--prompt-data", path, "--input-key", "prompt"])
    _assert_one_line_error(rc, err, f"--prompt-data: {path}:1: JSON nested more than 100 levels deep")


def test_prompt_data_dev_zero(base):
    rc, err = _train([*base, "--prompt-data", "/dev/zero", "--input-key", "prompt"])
    _assert_one_line_error(rc, err, "--prompt-data /dev/zero: is not a regular file")


def test_prompt_data_without_newlines(base, tmp_path):
    """A regular file of zeros with no newline (sparse: no disk used): one line longer than the row bound."""
    path = tmp_path / "zeros.jsonl"
    with open(path, "wb") as f:
        f.truncate(70 * 1024 ** 2)
    rc, err = _train([*base, "--prompt-data", path, "--input-key", "prompt"])
    _assert_one_line_error(rc, err, f"--prompt-data: {path}:1: longer than 64 MiB")


def test_data_source_reads_rows_under_the_same_bounds(tmp_path):
    """The data source (inside the run) reads rows through the same reader as the preflight."""
    from slime_like.rollout.data_source import PromptDataError, _read_rows

    path = tmp_path / "deep.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(PromptDataError, match=r"deep.jsonl:2: JSON nested"):
        list(_read_rows(str(path), "--prompt-data"))
    with pytest.raises(PromptDataError, match=r"/dev/zero: is not a regular file"):
        list(_read_rows("/dev/zero", "--prompt-data"))


def test_custom_config_alias_bomb_is_refused(base, tmp_path):
    path = tmp_path / "custom.yaml"
    path.write_text(_alias_bomb() + "tis_mode: *x8\n")
    rc, err = _train([*base, "--custom-config-path", path])
    _assert_one_line_error(rc, err, f"--custom-config-path {path}:", "aliases expand to more than")

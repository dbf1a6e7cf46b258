"""File checks of the preflight: prompt data, the HF checkpoint, Megatron checkpoints.

Each `check_*` returns (errors, notes): lists of one-line strings. Nothing here imports torch or ray.
Data files are streamed line by line; past `MAX_DATA_BYTES` a file is checked only in part and a note says so.
"""
from __future__ import annotations

import json
import os

from slime_like.config.data_rows import MAX_ROW_BYTES, MAX_ROW_DEPTH, bounded_lines, nesting_depth, not_a_data_file, \
    parse_row

MAX_DATA_BYTES = 32 * 1024 ** 2  # ~0.9 CPU-s of JSON parsing (35 MB/s, bench_dry_run.py); bigger: in part
TRACKER = "latest_checkpointed_iteration.txt"  # Megatron-LM's marker of a torch_dist checkpoint directory
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "tiktoken.model")


def check_data_file(path: str, flag: str, keys: dict) -> tuple[list, list]:
    """Every non-blank line of a JSONL file (every entry of a .json array) is a JSON object holding `keys`
    ({flag: key}); UTF-8 (a BOM is fine).

    Reports the first bad line as file:line and how many lines are bad in all."""
    why = not_a_data_file(path)
    if why:
        return [f"{flag} {path}: {why}"], []
    if path.endswith(".parquet"):
        return _check_parquet(path, flag, keys), []
    if path.endswith(".json") and _starts_with_array(path):
        return _check_json_array(path, flag, keys), []
    first, bad, nonempty, partial = None, 0, 0, False
    with open(path, "rb") as f:
        read = 0
        for line_no, raw in bounded_lines(f):
            read += len(raw)
            if read > MAX_DATA_BYTES and len(raw) <= MAX_ROW_BYTES:
                partial = True
                break
            problem = _line_problem(raw, keys, first_line=line_no == 1)
            if problem is None:
                nonempty += raw.strip() != b""
                continue
            bad += 1
            first = first or f"{path}:{line_no}: {problem}"
    errors = []
    if bad:
        errors.append(f"{flag}: {first}" + (f" ({bad} bad lines in all)" if bad > 1 else " (the only bad line)"))
    elif not nonempty and not partial:
        errors.append(f"{flag} {path}: the file holds no records")
    notes = [f"{flag} {path}: checked the first {MAX_DATA_BYTES >> 20} MiB only (partial check)"] if partial else []
    return errors, notes


def _line_problem(raw: bytes, keys: dict, first_line: bool = False) -> str | None:
    row, problem = parse_row(raw, first_line)
    if problem or row is None:
        return problem
    if not isinstance(row, dict):
        return f"expected a JSON object, got {type(row).__name__}"
    missing = [f"{k!r} ({flag})" for flag, k in keys.items() if k not in row]
    if missing:
        return f"no key {', '.join(missing)}; keys present: {sorted(row)[:8]}"
    return None


def _starts_with_array(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")[:1] == b"["


def _check_json_array(path: str, flag: str, keys: dict) -> list:
    """ROLL's data files: one JSON array of records (read whole, as the data source reads it)."""
    if os.path.getsize(path) > MAX_DATA_BYTES:
        return []  # the data source reports a bad entry when it reads the file
    try:
        with open(path, encoding="utf-8-sig") as f:
            rows = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return [f"{flag}: {path}: not a valid JSON array ({e})"]
    except RecursionError:
        return [f"{flag}: {path}: JSON nested deeper than Python can read (at most {MAX_ROW_DEPTH} levels)"]
    if not isinstance(rows, list) or not rows:
        return [f"{flag} {path}: the array holds no records"]
    for i, row in enumerate(rows, start=1):
        if nesting_depth(row) > MAX_ROW_DEPTH:
            return [f"{flag}: {path}: array entry {i}: JSON nested more than {MAX_ROW_DEPTH} levels deep"]
        problem = _line_problem(json.dumps(row).encode(), keys)
        if problem:
            return [f"{flag}: {path}: array entry {i}: {problem}"]
    return []


def _check_parquet(path: str, flag: str, keys: dict) -> list:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return [f"{flag} {path}: reading Parquet needs pyarrow (pip install pyarrow), or convert it to JSONL"]
    try:
        names = set(pq.read_schema(path).names)
    except Exception as e:  # corrupt file: pyarrow's own reason
        return [f"{flag} {path}: not a readable Parquet file ({e})"]
    missing = [f"{k!r} ({f})" for f, k in keys.items() if k not in names]
    return [f"{flag} {path}: no column {', '.join(missing)}; columns: {sorted(names)[:8]}"] if missing else []


def check_hf_checkpoint(path: str, flag: str = "--hf-checkpoint") -> list:
    """An HF model directory: config.json, tokenizer files, weights. All missing parts in one message."""
    if not os.path.exists(path):
        return [f"{flag} {path}: no such directory (it provides config.json, the tokenizer and the initial weights)"]
    if not os.path.isdir(path):
        return [f"{flag} {path}: is a file, not a directory; pass the model directory that holds config.json, "
                "the tokenizer files and the weights"]
    files = os.listdir(path)
    missing = []
    if "config.json" not in files:
        missing.append("config.json")
    if not any(f in files for f in TOKENIZER_FILES):
        missing.append(f"tokenizer files (one of {', '.join(TOKENIZER_FILES)})")
    if not any(f.endswith(WEIGHT_SUFFIXES) for f in files):
        missing.append("weights (*.safetensors)")
    if not missing:
        return []
    what = "is empty" if not files else f"has no {'; no '.join(missing)}"
    return [f"{flag} {path}: {what}; expected a Hugging Face model directory (config.json, tokenizer, "
            "*.safetensors), e.g. one written by save_pretrained"]


def check_megatron_load(path: str, flag: str, fresh_ok: bool) -> list:
    """--load / --critic-load: a torch_dist checkpoint root, an HF directory, or (fresh_ok) missing / empty."""
    if not os.path.exists(path) or (os.path.isdir(path) and not os.listdir(path)):
        return [] if fresh_ok else [f"{flag} {path}: no such checkpoint"]
    if not os.path.isdir(path):
        return [f"{flag} {path}: is a file, not a checkpoint directory"]
    files = os.listdir(path)
    if TRACKER in files:
        text = open(os.path.join(path, TRACKER)).read().strip()
        if text == "release":  # Megatron-LM's weights-only checkpoint (read_metadata: iteration 0) in LOAD/release/
            if not os.path.isfile(os.path.join(path, "release", "metadata.json")):
                return [f"{flag} {path}: {TRACKER} says release but release/ holds no torch_dist checkpoint "
                        "(metadata.json); Megatron-LM's legacy torch format is not read: convert it to torch_dist"]
            return []
        if not text.isdigit():
            return [f"{flag} {path}/{TRACKER}: expected an iteration number or 'release', found {text[:40]!r}"]
        if not os.path.isdir(os.path.join(path, f"iter_{int(text):07d}")):
            return [f"{flag} {path}: {TRACKER} names iteration {text} but iter_{int(text):07d}/ is missing"]
        return []
    if "config.json" in files and any(f.endswith(".safetensors") for f in files):
        return []  # an HF directory: the trainer starts from its weights
    iters = sorted(f for f in files if f.startswith("iter_"))
    if iters:
        return [f"{flag} {path}: has {iters[-1]} but no {TRACKER} (the marker a completed save writes last); the "
                "save was interrupted, or point the flag at the directory --save wrote"]
    return [f"{flag} {path}: neither a Megatron checkpoint ({TRACKER} + iter_*/) nor an HF model directory "
            f"(config.json + *.safetensors); found {sorted(files)[:6]}"]


def check_ref_load(path: str) -> list:
    """--ref-load: a torch_dist checkpoint or an HF directory; it must exist (the KL reference)."""
    if not os.path.exists(path):
        return [f"--ref-load {path}: no such file or directory (the KL reference model)"]
    if os.path.isdir(path) and not os.listdir(path):
        return [f"--ref-load {path}: empty directory (the KL reference model: a torch_dist checkpoint or an HF "
                "model directory)"]
    return check_megatron_load(path, "--ref-load", fresh_ok=False)


def check_save_dir(path: str, flag: str) -> list:
    """The run can create and write `path` (an existing directory, or one it can create): found before Ray, not
    when the first save fails 10-20 s after it (`--save /proc/self/x`). Nothing is left behind: the test
    directory made in the nearest existing ancestor is removed at once."""
    import tempfile

    if path == "":
        return [f"{flag} '': an empty path; give the checkpoint directory"]
    if os.path.exists(path) and not os.path.isdir(path):
        return [f"{flag} {path}: exists and is not a directory"]
    parent = os.path.abspath(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return [f"{flag} {path}: {parent} is not a directory, so the checkpoint directory cannot be created"]
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".slime_like_write_check_", dir=parent))
    except OSError as e:
        return [f"{flag} {path}: cannot create directories in {parent} ({e.strerror}); give a writable directory"]
    return []

"""The preflight's image check of multimodal prompt data (--multimodal-keys): every image of every row is loaded
(bounded, as the data source will load it) before Ray starts, and all bad rows are reported together.

A missing file, something that is not an image, a damaged or too large image, a placeholder count that does not
match the images: each named as FILE:ROW, the image's index and key, the value and the fix. The list is bounded
(MAX_LISTED lines, then a count); past MAX_CHECKED_IMAGE_BYTES of images the rest is left to the data source and a
note says so. Torch-free (Pillow only).
"""
from __future__ import annotations

import json

from slime_like.config.data_rows import bounded_lines, not_a_data_file, parse_row

MAX_LISTED = 10
MAX_CHECKED_IMAGE_BYTES = 256 * 1024 ** 2


def _rows(path: str):
    """(row number, dict) as the data source numbers them (JSONL line, JSON-array entry, Parquet row from 1);
    rows that are not objects are the line check's concern and skipped here."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        for batch_start, batch in _parquet_batches(pq.ParquetFile(path)):
            for i, row in enumerate(batch.to_pylist(), start=batch_start):
                yield i, row
        return
    with open(path, "rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    if path.endswith(".json") and head == b"[":
        with open(path, encoding="utf-8-sig") as f:
            for i, row in enumerate(json.load(f), start=1):
                if isinstance(row, dict):
                    yield i, row
        return
    with open(path, "rb") as f:
        for line_no, raw in bounded_lines(f):
            row, problem = parse_row(raw, first_line=line_no == 1)
            if isinstance(row, dict) and not problem:
                yield line_no, row


def _parquet_batches(pf):
    start = 1
    for batch in pf.iter_batches(batch_size=256):
        yield start, batch
        start += batch.num_rows


def _row_image_bytes(row: dict, key: str | None, base: str) -> int:
    """A rough size of the row's images (for the check's budget): their references' lengths or the file sizes."""
    import os

    total = 0
    for ref in (row.get(key) or []) if key else []:
        ref = ref.get("image", ref) if isinstance(ref, dict) else ref
        path = os.path.join(base, ref) if isinstance(ref, str) and len(ref) < 4096 else None
        if path and os.path.isfile(path):
            total += os.path.getsize(path)
        elif isinstance(ref, (str, bytes)):
            total += len(ref)
    return total


def check_data_images(path: str, flag: str, input_key: str, multimodal_keys: dict) -> tuple[list, list]:
    """(errors, notes) of the images of one prompt file; no error when the file itself is unreadable (the line
    check reports that) or a row lacks the prompt key (reported by the key check)."""
    from slime_like.multimodal.records import data_dir, record_problems

    if not_a_data_file(path):
        return [], []
    base, listed, bad_rows, n_problems, checked = data_dir(path), [], 0, 0, 0
    try:
        for row_no, row in _rows(path):
            if input_key not in row:
                continue
            if checked > MAX_CHECKED_IMAGE_BYTES:
                return _errors(flag, listed, bad_rows, n_problems), [
                    f"{flag} {path}: images checked up to row {row_no - 1} only ({MAX_CHECKED_IMAGE_BYTES >> 20} MiB); "
                    "the rest are checked as the run reads them"]
            checked += _row_image_bytes(row, multimodal_keys.get("image"), base)
            problems = record_problems(row, multimodal_keys, input_key, f"{path}:{row_no}", base)
            if problems:
                bad_rows += 1
                n_problems += len(problems)
                listed += problems[:MAX_LISTED - len(listed)]
    except (OSError, ValueError) as e:   # an unreadable file: the line / schema checks name it
        return [], [f"{flag} {path}: images not checked ({type(e).__name__}: {e})"]
    return _errors(flag, listed, bad_rows, n_problems), []


def _errors(flag: str, listed: list, bad_rows: int, n_problems: int) -> list:
    if not listed:
        return []
    more = n_problems - len(listed)
    tail = f"\n      ... and {more} more" if more > 0 else ""
    return [f"{flag}: {n_problems} problem(s) with images in {bad_rows} row(s):\n" +
            "\n".join(f"      {p}" for p in listed) + tail]

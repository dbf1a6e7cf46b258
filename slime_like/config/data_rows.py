"""One JSONL prompt row read under bounds: shared by the preflight (before Ray) and the data source (in the run).

json.loads recurses once per nesting level, so a row nested 100,000 deep ends in a RecursionError, and a 900-deep
one parses but breaks whatever walks it next (deepcopy, json.dumps); reading a "line" of /dev/zero or of a file
without newlines grows memory until MemoryError. Here a line is read with a length bound, a nesting depth is
measured on the raw text before parsing (brackets outside strings), and a device or FIFO is not read at all.
"""
from __future__ import annotations

import json
import os
import stat

MAX_ROW_BYTES = 64 * 1024 ** 2   # one prompt row; long multimodal rows (base64 images) are a few MB
MAX_ROW_DEPTH = 100              # chat messages nest ~4 deep; tool schemas ~10


def not_a_data_file(path: str) -> str | None:
    """Why `path` cannot be a data file (missing, a directory, a device / FIFO / socket), or None."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "no such file"
    except OSError as e:
        return f"cannot be read: {e.strerror}"
    if stat.S_ISDIR(mode):
        return "is a directory, expected a .jsonl, .json or .parquet file"
    if not stat.S_ISREG(mode):
        return "is not a regular file (a device, FIFO or socket); give a .jsonl, .json or .parquet file"
    return None


def bounded_lines(f):
    """(line number, bytes) of a binary file; a line longer than MAX_ROW_BYTES is yielded cut at the bound + 1
    byte, so `row_problem` refuses it without the rest ever being held in memory."""
    line_no = 0
    while True:
        raw = f.readline(MAX_ROW_BYTES + 1)
        if not raw:
            return
        line_no += 1
        yield line_no, raw
        if len(raw) > MAX_ROW_BYTES:
            return  # the rest of that line would come next as a "line" of its own: stop here


def parse_row(raw: bytes, first_line: bool = False):
    """(row, None) for a line holding JSON, (None, problem) otherwise; a blank line is (None, None).
    The problem is one line without the file name (the caller adds FILE:LINE)."""
    if len(raw) > MAX_ROW_BYTES:
        return None, f"longer than {MAX_ROW_BYTES >> 20} MiB (is this a JSONL file?)"
    if first_line and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]  # a UTF-8 byte-order mark (Windows editors write one): accepted
    if not raw.strip():
        return None, None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"not UTF-8: byte 0x{raw[e.start]:02x} at column {e.start + 1}; re-save the file as UTF-8"
    try:
        row = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"malformed JSON ({e.msg} at column {e.colno}): {text.strip()[:60]!r}"
    except RecursionError:
        return None, f"JSON nested deeper than Python can read (at most {MAX_ROW_DEPTH} levels are accepted)"
    # Counting brackets runs in C; only a row with many of them is walked (they may be siblings, not nesting).
    if text.count("[") + text.count("{") > MAX_ROW_DEPTH and nesting_depth(row) > MAX_ROW_DEPTH:
        return None, f"JSON nested more than {MAX_ROW_DEPTH} levels deep"
    return row, None


def nesting_depth(value, stop_after: int = MAX_ROW_DEPTH) -> int:
    """How deep lists / dicts nest in `value` (a scalar is 0), walked without recursion; stops counting once
    past `stop_after`."""
    deepest = 0
    stack = [(value, 1)] if isinstance(value, (list, dict)) else []
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > stop_after:
            break
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, (list, dict)))
    return deepest

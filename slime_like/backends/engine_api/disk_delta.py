"""Delta weight sync's files (slime's --update-weight-mode delta): encode on the trainer, verify and apply on the engine.

One directory per version under the shared --update-weight-disk-dir, as slime's trainer writes it:
  weight_v000003/model-00000-of-00001.safetensors   the changed tensors only: name -> uint8 array, the zstd-compressed
                                                    delta; the file's metadata maps name -> checksum of the NEW bytes
  weight_v000003/model.safetensors.index.json       {"metadata": {version, base_version, delta_encoding,
                                                    compression_format, checksum_format}, "weight_map": {name: file}}
Version 0 is the checkpoint the engines started from (--hf-checkpoint). Deltas are byte-level and dtype-blind:
'xor' (new ^ old: smallest, but right only against the exact base) or 'overwrite' (u4 count, u4 positions, new byte
values: idempotent). Each engine host keeps a full local copy (--update-weight-local-checkpoint-dir) that `pull`
brings to a version, one delta at a time; the engine then reloads that copy. A delta whose base is not the local
version, or whose result does not match its checksum, is refused and leaves the local copy as it was.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import zlib

import numpy as np

from slime_like.backends.engine_api.protocol import BadRequest

ENCODINGS = ("xor", "overwrite")
CHECKSUMS = ("xxh3-128", "blake3", "adler32")
COMPRESSION = "zstd"
INDEX = "model.safetensors.index.json"
DELTA_FILE = "model-00000-of-00001.safetensors"
STATE = "slime_like_delta_state.json"   # in the local checkpoint dir: the version its files hold
MODEL_FILES = (".json", ".jinja", ".txt", ".model", ".tiktoken")


def version_dir(source_dir: str, version: int) -> str:
    return os.path.join(source_dir, f"weight_v{version:06d}")


def checksum(algorithm: str, buf: np.ndarray) -> str:
    if algorithm == "xxh3-128":
        import xxhash

        return xxhash.xxh3_128(buf).hexdigest()
    if algorithm == "adler32":
        return f"{zlib.adler32(buf):08x}"
    if algorithm == "blake3":
        import blake3

        return blake3.blake3(buf).hexdigest()
    raise BadRequest(f"checksum_format {algorithm!r} is not one of {', '.join(CHECKSUMS)}")


def encode(new: np.ndarray, old: np.ndarray, encoding: str) -> tuple[bytes | None, int]:
    """(compressed delta or None when nothing changed, number of changed bytes)."""
    import zstandard

    if encoding == "xor":
        diff = np.bitwise_xor(new, old)
        changed = int(np.count_nonzero(diff))
    elif encoding == "overwrite":
        mask = new != old
        changed = int(np.count_nonzero(mask))
        pos = np.flatnonzero(mask).astype("<u4")
        diff = np.concatenate([np.array([pos.size], "<u4").view(np.uint8), pos.view(np.uint8), new[mask]])
    else:
        raise ValueError(f"delta encoding {encoding!r} is not one of {ENCODINGS}")
    if not changed:
        return None, 0
    return zstandard.ZstdCompressor(level=1).compress(diff.tobytes()), changed


def _decompress_bounded(data: bytes, limit: int, where: str) -> bytes:
    """zstd-decompressed `data`, refused past `limit` bytes without allocating more (a frame may declare any size)."""
    import io

    import zstandard

    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as reader:
            out = reader.read(limit + 1)
    except zstandard.ZstdError as e:
        raise BadRequest(f"{where}: the delta does not decompress ({e})") from None
    if len(out) > limit:
        raise BadRequest(f"{where}: the delta decompresses to more than the {limit} bytes its base tensor allows")
    return out


def apply(old: np.ndarray, compressed: np.ndarray, encoding: str, where: str) -> np.ndarray:
    """The new bytes of one tensor from its base bytes and its delta; a delta that cannot fit the base is refused."""
    # at most every byte changed: an xor delta is the base's size, an overwrite delta a count + (position, byte) each
    limit = old.size if encoding == "xor" else 4 + 5 * old.size
    diff = np.frombuffer(_decompress_bounded(compressed.tobytes(), limit, where), dtype=np.uint8)
    if encoding == "xor":
        if diff.size != old.size:
            raise BadRequest(f"{where}: an xor delta of {diff.size} bytes for a base tensor of {old.size} bytes")
        return np.bitwise_xor(old, diff)
    count = int(diff[:4].view("<u4")[0]) if diff.size >= 4 else -1
    if count < 0 or diff.size != 4 + 5 * count:
        raise BadRequest(f"{where}: a malformed overwrite delta ({diff.size} bytes)")
    pos = diff[4:4 + 4 * count].view("<u4")
    if count and int(pos.max()) >= old.size:
        raise BadRequest(f"{where}: an overwrite delta writes past the tensor's {old.size} bytes")
    new = old.copy()
    new[pos] = diff[4 + 4 * count:]
    return new


# ---------------------------------------------------------------------------------------------- safetensors bytes
def tensor_table(path: str) -> tuple[int, dict]:
    """(offset of the data section, {name: (dtype, shape, begin, end)}) from a safetensors header."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return 8 + n, {k: (v["dtype"], v["shape"], *v["data_offsets"]) for k, v in header.items() if k != "__metadata__"}


def read_checkpoint(model_dir: str) -> dict[str, tuple[str, list, np.ndarray]]:
    """{name: (safetensors dtype, shape, raw bytes)} of every *.safetensors file of an HF model directory."""
    out = {}
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors"):
            start, table = tensor_table(os.path.join(model_dir, f))
            data = np.fromfile(os.path.join(model_dir, f), dtype=np.uint8)
            out.update({k: (d, s, data[start + b:start + e]) for k, (d, s, b, e) in table.items()})
    return out


# ---------------------------------------------------------------------------------------------- trainer side
def write_version(source_dir: str, version: int, deltas: dict, checksums: dict, encoding: str,
                  checksum_format: str) -> int:
    """Write one version's directory (under a .partial name, then renamed: an engine never reads half of it);
    returns the bytes of its delta file (what crosses the shared filesystem)."""
    from safetensors.numpy import save

    final = version_dir(source_dir, version)
    tmp = final + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    wire = 0
    if deltas:
        blob = save({k: np.frombuffer(v, dtype=np.uint8) for k, v in deltas.items()}, metadata=checksums)
        wire = len(blob)
        with open(os.path.join(tmp, DELTA_FILE), "wb") as f:
            f.write(blob)
    index = {"metadata": {"version": f"{version:06d}", "base_version": f"{version - 1:06d}",
                          "delta_encoding": encoding, "compression_format": COMPRESSION,
                          "checksum_format": checksum_format},
             "weight_map": {name: DELTA_FILE for name in deltas}}
    with open(os.path.join(tmp, INDEX), "w") as f:
        json.dump(index, f)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    return wire + os.path.getsize(os.path.join(final, INDEX))

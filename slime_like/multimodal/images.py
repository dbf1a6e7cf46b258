"""Load one image of a data record, bounded, with errors that name where it came from.

A record's image may be a local path (relative to the data file's folder), a `file://` URL, a
`data:image/...;base64,` URL or raw base64. After the data stage an image travels in one form only, a PNG data URL
(`image_to_data_url`): JSON-serialisable (debug dumps, Ray), and what SGLang's `image_data` takes as is.
Remote URLs (http/https) are refused: a rollout must not fetch from the network on its data's behalf.
"""
from __future__ import annotations

import base64
import binascii
import io
import os
import re
from urllib.parse import unquote, urlparse

# Bounds: an encoded image (file or decoded base64) and its pixel count. Checked before decoding the pixels
# (PIL reads the size from the header), so a decompression bomb is refused without being decoded.
MAX_IMAGE_BYTES = 32 * 1024 * 1024
MAX_IMAGE_PIXELS = 6000 * 6000
# A string this long made only of base64 characters is taken as base64 when it is not an existing file.
_MIN_RAW_BASE64_CHARS = 64
_BASE64_RE = re.compile(r"^[A-Za-z0-9+/\s]+={0,2}\s*$")
_DATA_URL_RE = re.compile(r"^data:image/[A-Za-z0-9.+-]+;base64,", re.IGNORECASE)


class ImageLoadError(ValueError):
    """A record's image could not be used; the message names where, the value and the fix."""


def _show(value, limit: int = 80) -> str:
    text = value if isinstance(value, str) else repr(value)
    return repr(text if len(text) <= limit else text[:limit] + f"...({len(text)} chars)")


def load_image(value, *, where: str, base_dir: str | None = None,
               max_bytes: int = MAX_IMAGE_BYTES, max_pixels: int = MAX_IMAGE_PIXELS):
    """The RGB PIL image `value` names (path, file:// URL, data URL, raw base64, or a PIL image as is).

    Raises ImageLoadError naming `where` (e.g. "prompt row 17, key 'images'[0]"), the value (truncated) and the fix.
    """
    from PIL import Image

    if isinstance(value, Image.Image):
        return _checked(value, where, value, max_pixels)
    if isinstance(value, dict) and isinstance(value.get("bytes"), (bytes, bytearray)):
        return _decode(bytes(value["bytes"]), where, value, max_bytes, max_pixels)  # parquet's image struct
    if isinstance(value, dict) and isinstance(value.get("path"), str):
        value = value["path"]
    if not isinstance(value, str) or not value.strip():
        raise ImageLoadError(f"{where}: {_show(value)} is not an image reference; give a file path, a file:// URL, "
                             "a data:image/...;base64, URL or base64 text")
    text = value.strip()
    if _DATA_URL_RE.match(text):
        return _decode(_b64(text.split(",", 1)[1], where, value), where, value, max_bytes, max_pixels)
    scheme = urlparse(text).scheme.lower()
    if scheme in ("http", "https", "ftp", "s3", "gs"):
        raise ImageLoadError(f"{where}: {_show(value)}: remote images are not fetched; download it and give the "
                             "local path (or a file:// URL, or base64)")
    if scheme == "file":
        path = unquote(urlparse(text).path)
    else:
        path = text if os.path.isabs(text) or not base_dir else os.path.join(base_dir, text)
    if not os.path.exists(path):
        if len(text) >= _MIN_RAW_BASE64_CHARS and _BASE64_RE.match(text):
            return _decode(_b64(text, where, value), where, value, max_bytes, max_pixels)
        rel = f" (relative paths are read from the data file's folder {base_dir})" if base_dir and scheme != "file" else ""
        raise ImageLoadError(f"{where}: image file {_show(value)} not found{rel}; fix the path or embed the image "
                             "as base64")
    return _read_file(path, where, value, max_bytes, max_pixels)


def load_embedded_image(value, *, where: str, max_bytes: int = MAX_IMAGE_BYTES, max_pixels: int = MAX_IMAGE_PIXELS):
    """load_image for a server: only a data:image/...;base64, URL or raw base64 text, never a file or a URL (an
    engine must not read its own files or fetch on a client's behalf)."""
    text = value.strip() if isinstance(value, str) else None
    if text and _DATA_URL_RE.match(text):
        data = _b64(text.split(",", 1)[1], where, value)
    elif text and _BASE64_RE.match(text):
        data = _b64(text, where, value)
    else:
        raise ImageLoadError(f"{where}: {_show(value)} must be a data:image/...;base64, URL or base64 text (files "
                             "and URLs are not read here)")
    return _decode(data, where, value, max_bytes, max_pixels)


def _b64(text: str, where: str, value) -> bytes:
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageLoadError(f"{where}: {_show(value)} is not valid base64 ({e}); encode the image bytes with "
                             "standard base64") from None


def _read_file(path: str, where: str, value, max_bytes: int, max_pixels: int):
    if not os.path.isfile(path):
        raise ImageLoadError(f"{where}: {_show(value)} is not a file; give an image file's path")
    size = os.path.getsize(path)
    if size > max_bytes:
        raise ImageLoadError(f"{where}: image file {_show(value)} is {size} bytes, over the {max_bytes}-byte limit; "
                             "downscale or recompress it")
    with open(path, "rb") as f:
        return _decode(f.read(), where, value, max_bytes, max_pixels)


def _decode(data: bytes, where: str, value, max_bytes: int, max_pixels: int):
    from PIL import Image, UnidentifiedImageError

    if len(data) > max_bytes:
        raise ImageLoadError(f"{where}: image {_show(value)} is {len(data)} bytes, over the {max_bytes}-byte limit; "
                             "downscale or recompress it")
    try:
        img = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise ImageLoadError(f"{where}: {_show(value)} is not an image Pillow can read (PNG, JPEG, ...); give an "
                             "image file") from None
    except Image.DecompressionBombError as e:  # Pillow's own bound (far above ours) refused the header
        raise ImageLoadError(f"{where}: image {_show(value)} has too many pixels ({e}); downscale it") from None
    _check_pixels(img.size, where, value, max_pixels)  # from the header: before decoding the pixels
    try:
        img.load()
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise ImageLoadError(f"{where}: image {_show(value)} could not be decoded ({e}); the file is damaged or "
                             "truncated") from None
    return _checked(img, where, value, max_pixels)


def _check_pixels(size, where: str, value, max_pixels: int) -> None:
    width, height = size
    if width < 1 or height < 1 or width * height > max_pixels:
        raise ImageLoadError(f"{where}: image {_show(value)} is {width}x{height} = {width * height} pixels, outside "
                             f"1..{max_pixels}; downscale it")


def _checked(img, where: str, value, max_pixels: int):
    _check_pixels(img.size, where, value, max_pixels)
    return img if img.mode == "RGB" else img.convert("RGB")


def image_to_data_url(img) -> str:
    """`img` as a PNG `data:image/png;base64,...` URL: the one form images travel in after the data stage."""
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")

"""slime_like.multimodal.images: every accepted image form, and a clear error for each bad one."""
import base64

import pytest

from mm_helpers import b64, pattern_image, png_bytes, png_header_only
from slime_like.multimodal.images import ImageLoadError, MAX_IMAGE_PIXELS, image_to_data_url, load_image

WHERE = "prompt row 3, key 'images'[0]"


def _same_pixels(a, b):
    return a.size == b.size and a.tobytes() == b.tobytes()


def test_every_accepted_form_gives_the_same_rgb_image(tmp_path):
    img = pattern_image(1)
    (tmp_path / "imgs").mkdir()
    path = tmp_path / "imgs" / "a.png"
    path.write_bytes(png_bytes(img))
    data = png_bytes(img)
    forms = {
        "relative path": load_image("imgs/a.png", where=WHERE, base_dir=str(tmp_path)),
        "absolute path": load_image(str(path), where=WHERE),
        "file url": load_image(f"file://{path}", where=WHERE),
        "data url": load_image("data:image/png;base64," + b64(data), where=WHERE),
        "raw base64": load_image(b64(data), where=WHERE),
        "parquet image struct": load_image({"bytes": data, "path": None}, where=WHERE),
        "PIL image": load_image(img.convert("RGBA"), where=WHERE),
    }
    for name, got in forms.items():
        assert got.mode == "RGB", name
        assert _same_pixels(got, img), name


def test_data_url_round_trips_pixels():
    img = pattern_image(2, size=(30, 20))
    url = image_to_data_url(img)
    assert url.startswith("data:image/png;base64,")
    assert _same_pixels(load_image(url, where=WHERE), img)


@pytest.mark.parametrize("value, expected", [
    ("missing/none.png", "not found"),
    ("https://example.com/a.png", "remote images are not fetched"),
    (12, "is not an image reference"),
    ("data:image/png;base64,@@@@", "not valid base64"),
])
def test_bad_values_name_where_and_value(tmp_path, value, expected):
    with pytest.raises(ImageLoadError) as err:
        load_image(value, where=WHERE, base_dir=str(tmp_path))
    msg = str(err.value)
    assert msg.startswith(WHERE) and expected in msg
    assert repr(str(value))[:20] in msg or repr(value)[:20] in msg


def test_not_an_image_and_damaged_image(tmp_path):
    (tmp_path / "notes.png").write_text("hello, I am text")
    with pytest.raises(ImageLoadError, match="not an image Pillow can read"):
        load_image("notes.png", where=WHERE, base_dir=str(tmp_path))
    truncated = png_bytes(pattern_image(3))[:200]
    (tmp_path / "cut.png").write_bytes(truncated)
    with pytest.raises(ImageLoadError, match="could not be decoded"):
        load_image("cut.png", where=WHERE, base_dir=str(tmp_path))


def test_size_bounds_apply_before_decoding(tmp_path):
    # header claims 7000x7000 (> MAX_IMAGE_PIXELS): refused from the header, nothing decoded
    bomb = png_header_only(7000, 7000)
    assert 7000 * 7000 > MAX_IMAGE_PIXELS
    with pytest.raises(ImageLoadError, match=r"7000x7000 = 49000000 pixels, outside 1..36000000"):
        load_image(base64.b64encode(bomb).decode(), where=WHERE)
    (tmp_path / "big.png").write_bytes(png_bytes(pattern_image(4)))
    with pytest.raises(ImageLoadError, match="over the 100-byte limit"):
        load_image("big.png", where=WHERE, base_dir=str(tmp_path), max_bytes=100)
    with pytest.raises(ImageLoadError, match="over the 100-byte limit"):
        load_image(b64(png_bytes(pattern_image(4))), where=WHERE, max_bytes=100)


def test_a_directory_is_not_an_image(tmp_path):
    with pytest.raises(ImageLoadError, match="is not a file"):
        load_image(str(tmp_path), where=WHERE)

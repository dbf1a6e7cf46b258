"""The package installs from a wheel: every module of the source tree is in it, and the extras add up to the
pinned stack of requirements.txt."""
import pathlib
import shutil
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_subpackage_has_an_init():
    missing = [d.relative_to(ROOT).as_posix() for d in (ROOT / "slime_like").rglob("*")
               if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")) and not (d / "__init__.py").exists()]
    assert missing == []


def test_wheel_holds_every_module_and_pinned_extras(tmp_path):
    src = tmp_path / "src"  # a copy: the in-tree build would leave build/ and *.egg-info behind
    shutil.copytree(ROOT / "slime_like", src / "slime_like", ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("setup.py", "requirements.txt", "MANIFEST.in", "README.md"):
        shutil.copy(ROOT / f, src / f)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("slime_like-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "slime_like").rglob("*.py")}
    assert sources - names == set()
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    pins = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    for pin in filter(None, pins):  # every pin of requirements.txt reaches `slime_like[all]` with its version
        assert any(r.replace(" ", "").startswith(pin.replace(" ", "")) and ('extra == "all"' in r or ";" not in r)
                   for r in requires), pin

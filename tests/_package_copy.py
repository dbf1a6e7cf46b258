"""A copy of the checkout as pip sees it, and a fresh venv to install it into (shared by the tests that install the
package: the light-core dry run and the installed demo)."""
import os
import shutil
import venv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_FILES = ("setup.py", "requirements.txt", "MANIFEST.in", "README.md", "CHANGELOG.md")


def copy_checkout(tmp):
    """tmp/src: slime_like/ and the packaging files (a copy: an in-tree build would leave build/ and *.egg-info in
    the checkout), and a fresh venv at tmp/venv; returns (src, env_dir)."""
    src = tmp / "src"
    shutil.copytree(os.path.join(ROOT, "slime_like"), src / "slime_like", ignore=shutil.ignore_patterns("__pycache__"))
    for f in PACKAGE_FILES:
        shutil.copy(os.path.join(ROOT, f), src / f)
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=True)
    return src, env_dir


def venv_env(env_dir):
    """The environment of a command run in that venv: its bin/ first, nothing of this interpreter's paths."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env

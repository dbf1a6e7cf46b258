"""`pip install ".[all]"` then `slime-like demo DIR` runs the CPU demo end to end from the installed package, in a
fresh venv, from a directory outside the checkout (issue 32).

The venv must not download torch (several hundred MB; CPU wheels are not on PyPI's default index): it sees the
tested stack of this project's .venv through a .pth line naming .venv's site-packages (a plain path line: .venv's
own .pth files, among them the editable install of the checkout, are not run). `venv --system-site-packages`
would not do: it exposes the base interpreter's packages, not .venv's. pip then installs the package with
`--no-index --no-build-isolation`, so it can fetch nothing: the install proves every pin of the `all` extra is
already satisfied by the stack the tests run on (a missing or different version fails the install instead of
being downloaded), and pip installs only slime_like itself into the venv.
"""
import os
import subprocess
import sysconfig

import pytest
from _package_copy import copy_checkout, venv_env


pytestmark = pytest.mark.slow

# lines a new user cannot act on (issue 32): library notices the console filters, Ray's own start and dedup lines
NOISE = ("Transformer Engine and Apex are not installed", "Apex is not installed", "full scope is deprecated",
         "Rerun State Machine", "RerunStateMachine", "deduplicates logs", "Started a local Ray instance",
         "UserWarning", "Traceback", "Writing model shards", "Loading weights")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    src, env_dir = copy_checkout(tmp_path_factory.mktemp("all"))
    python = env_dir / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # ensurepip's setuptools (65 on Python 3.11, no bdist_wheel without `wheel`) would shadow the tested stack's
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", "setuptools"], check=True,
                   capture_output=True, env=venv_env(env_dir))
    with open(os.path.join(purelib, "tested_stack.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")  # this interpreter's (.venv's) site-packages
    r = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation",
                        f"{src}[all]"], capture_output=True, text=True, timeout=900, env=venv_env(env_dir))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return env_dir


def test_slime_like_demo_runs_end_to_end_from_the_installed_package(installed, tmp_path):
    where = subprocess.run([str(installed / "bin" / "python"), "-c", "import slime_like; print(slime_like.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, env=venv_env(installed))
    assert where.stdout.strip().startswith(str(installed)), where.stdout + where.stderr  # not the checkout's copy
    run_dir = tmp_path / "demo"
    # a short demo: 11 rollouts, so the eval before the first update and the one after rollout 9 both run
    r = subprocess.run(["slime-like", "demo", str(run_dir), "--num-rollout", "11"], capture_output=True, text=True,
                       cwd=tmp_path, env=dict(venv_env(installed), PYTHONUNBUFFERED="1"), timeout=1800)
    console = r.stdout + r.stderr
    assert r.returncode == 0, console[-4000:]
    for noise in NOISE:
        assert noise not in console, (noise, console[-4000:])
    assert "[demo] sft: saved the warmed-up checkpoint" in console and "rollout 10 |" in r.stdout
    summary = r.stdout[r.stdout.index("[slime_like] run finished: 11 rollouts (0-10) in "):]
    assert f"curve       : {run_dir / 'learning_curve.png'}" in summary
    assert "eval/arith/accuracy : " in summary and "(before the first update) -> " in summary
    change = summary.split("eval/arith/accuracy : ", 1)[1].splitlines()[0]
    assert f"held-out accuracy: {change};" in r.stdout  # the verdict states the summary's change, word for word
    assert (run_dir / "learning_curve.png").stat().st_size > 20_000 and (run_dir / "metrics.jsonl").exists()
    import yaml

    import slime_like
    assert yaml.safe_load(open(run_dir / "config.yaml"))["slime_like_version"] == slime_like.__version__

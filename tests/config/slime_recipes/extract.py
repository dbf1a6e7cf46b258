"""Re-derive recipes.json from a checkout of THUDM/slime (a maintainer's tool; the tests only read the JSON).

    python tests/config/slime_recipes/extract.py SLIME_CHECKOUT/scripts COMMIT > tests/config/slime_recipes/recipes.json

Each scripts/run-*.sh is run by bash with PATH set to a directory of stubs only: `ray job submit ... -- python3
train.py ARGS` records the entry script and its argv; pkill, ray start, ssh, nvidia-smi and every other command do
nothing (a command not stubbed is "not found"). Paths of the recipe's environment ($BASE_DIR, ...) become
/PLACEHOLDER/... so the test can swap in a placeholder checkpoint. The output is data (the flag lists slime's
recipes pass), not slime's scripts.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

RECORD = """#!/bin/bash
# record "python3 ENTRY ARGS..." wherever it appears in our argv (ray job submit ... -- python3 train.py ...)
while [ $# -gt 0 ] && [ "$1" != python3 ] && [ "$1" != python ]; do shift; done
[ $# -gt 0 ] || exit 0
shift
printf '%s\\0' "$@" >> "$RECIPE_OUT"
printf '\\n' >> "$RECIPE_OUT.count"
"""
NOOP = "#!/bin/bash\nexit 0\n"
MKTEMP = "#!/bin/bash\necho sglang_config.yaml\n"
PIP = "#!/bin/bash\necho 'megatron-core 0.16.1 /PLACEHOLDER/Megatron-LM'\n"  # `pip list | grep megatron-core`
REAL = ("dirname", "seq", "grep", "wc", "cat", "awk", "sed", "tr", "head", "basename")  # harmless text tools
NOOPS = ("pkill", "sleep", "nvidia-smi", "ssh", "rm", "hostname", "ibv_devinfo", "rocm-smi", "ifconfig",
         "ip", "pdsh", "mkdir", "cp", "ls", "touch", "date", "amd-smi", "git")
# slime bugs that cut a recipe's command short, repaired so the record holds the flags the recipe means to pass
FIXES = {"run-kimi-k2-Instruct.sh": ("--update-weight-buffer-size $(( 4 * 512 * 1024 * 1024))\n",
                                     "--update-weight-buffer-size $(( 4 * 512 * 1024 * 1024)) \\\n")}
PLACEHOLDERS = {"BASE_DIR": "/PLACEHOLDER/base", "BASE_FOLDER": "/PLACEHOLDER/base", "MODEL_DIR": "/PLACEHOLDER/model",
                "DATA_DIR": "/PLACEHOLDER/data", "MASTER_ADDR": "127.0.0.1", "WANDB_KEY": "PLACEHOLDER_KEY"}


def _stubs(root: str) -> str:
    d = os.path.join(root, "bin")
    os.makedirs(d)
    for name, text in [("ray", RECORD), ("python3", RECORD), ("python", RECORD), ("mktemp", MKTEMP), ("pip", PIP),
                       *[(n, NOOP) for n in NOOPS]]:
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
        os.chmod(os.path.join(d, name), 0o755)
    for name in REAL:
        if shutil.which(name):
            os.symlink(shutil.which(name), os.path.join(d, name))
    return d


def extract(scripts_dir: str) -> dict:
    out = {}
    with tempfile.TemporaryDirectory() as root:
        bin_dir = _stubs(root)
        shutil.copytree(scripts_dir, os.path.join(root, "scripts"))
        # some recipes source ${SCRIPT_DIR}/scripts/models/... (written to be copied to the repository root)
        os.symlink(os.path.join(root, "scripts"), os.path.join(root, "scripts", "scripts"))
        for name, (old, new) in FIXES.items():
            path = os.path.join(root, "scripts", name)
            with open(path) as f:
                text = f.read()
            assert old in text, f"{name}: the repaired line changed upstream; review FIXES"
            with open(path, "w") as f:
                f.write(text.replace(old, new))
        runs = [n for n in os.listdir(scripts_dir) if n.startswith("run-") and n.endswith(".sh")]
        runs += ["low_precision/" + n for n in os.listdir(os.path.join(scripts_dir, "low_precision"))
                 if n.startswith("run-") and n.endswith(".sh")]
        for name in sorted(runs):
            rec = os.path.join(root, name.replace("/", "_") + ".argv")
            env = {"PATH": bin_dir, "HOME": root, "RECIPE_OUT": rec, **PLACEHOLDERS}
            r = subprocess.run(["/bin/bash", "--noprofile", "--norc", os.path.join(root, "scripts", name)],
                               cwd=root, env=env, capture_output=True, text=True, timeout=60)
            if not os.path.exists(rec):
                raise SystemExit(f"{name}: no train.py call recorded (rc {r.returncode}): {r.stderr[-2000:]}")
            with open(rec) as f:
                argv = [t for t in f.read().split("\0") if t]
            with open(rec + ".count") as f:
                assert f.read().count("\n") == 1, f"{name}: more than one train.py call"
            out[name] = {"entry": argv[0], "argv": argv[1:]}
        for name in sorted(os.listdir(os.path.join(scripts_dir, "models"))):
            out["models/" + name] = {"argv": _model_args(root, bin_dir, name)}
    return out


def _model_args(root: str, bin_dir: str, name: str) -> list:
    """MODEL_ARGS of scripts/models/<name> as bash sees it after `source`."""
    script = 'source "$1" && printf "%s\\0" "${MODEL_ARGS[@]}"'
    r = subprocess.run(["/bin/bash", "--noprofile", "--norc", "-c", script, "_",
                        os.path.join(root, "scripts", "models", name)], cwd=root, capture_output=True, text=True,
                       env={"PATH": bin_dir, "HOME": root, **PLACEHOLDERS}, timeout=60, check=True)
    return [t for t in r.stdout.split("\0") if t]


if __name__ == "__main__":
    recipes = extract(sys.argv[1])
    rows = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in recipes.items())
    sys.stdout.write(f'{{"slime_commit": {json.dumps(sys.argv[2])},\n "recipes": {{\n{rows}\n }}\n}}\n')

#!/usr/bin/env bash
# Create bench/.venv-trl: TRL's GRPOTrainer and its own pinned stack, kept apart from the main .venv so
# TRL's dependencies (datasets, accelerate, ...) never change what slime_like runs on.
# torch stays pinned to the CPU build the main stack uses: an unpinned torch pulls GB of CUDA wheels.
# Idempotent: a second run only checks the versions.
set -euo pipefail
cd "$(dirname "$0")/.."                      # bench/
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
VENV=.venv-trl
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
echo '*' > "$VENV/.gitignore"                # git never sees the venv (as Python 3.13's venv does by itself)
# torch first and alone, so the resolver can never pick another torch for trl's sake.
"$VENV/bin/python" -m pip install -q torch==2.13.0
"$VENV/bin/python" -m pip install -q trl==1.16.0 transformers==5.23.0 tokenizers==0.23.3 \
    safetensors==0.8.0 "numpy==2.4.6" torch==2.13.0
"$VENV/bin/python" - <<'PY'
import torch, transformers, trl
assert torch.__version__.startswith("2.13.0"), torch.__version__
print(f"setup_env: bench/.venv-trl ready (torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__})")
PY

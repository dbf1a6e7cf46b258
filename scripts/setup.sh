#!/usr/bin/env bash
# Create .venv and install the pinned CPU stack (torch 2.13.0 CPU build, megatron-core, ray, transformers).
# Idempotent: a second run only checks that everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade "pip>=24" >/dev/null
# torch first and pinned: an unpinned torch would pull several GB of CUDA wheels.
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -r requirements.txt
.venv/bin/python -m pip install -q --no-deps -e .
# omegaconf 2.3 (what hydra-core pins, i.e. what RLinf's and verl's users have) beside the venv's 2.4, for the
# front-end test that reads RLinf / ROLL files under both (tests/config/test_user_files.py puts it first on
# PYTHONPATH). Its parser needs the antlr4 runtime 4.9.x; --no-deps keeps both out of the venv itself.
[ -d .venv/side/omegaconf-2.3/omegaconf ] || .venv/bin/python -m pip install -q --no-deps \
    --target .venv/side/omegaconf-2.3 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3
echo "setup: .venv ready ($(.venv/bin/python -c 'import torch, megatron.core as m; print("torch", torch.__version__, "megatron-core", m.__version__)'))"

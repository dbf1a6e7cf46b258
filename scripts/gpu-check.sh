#!/usr/bin/env bash
# The project's GPU check suite (slime_like/tools/gpu_check): one GPU, no network, under 7 minutes.
#   bash scripts/gpu-check.sh --out DIR              # on a GPU machine
#   bash scripts/gpu-check.sh --cpu-smoke --out DIR  # the same code on CPU (2-layer model, gloo)
# GPU_CHECK_WHEELS=DIR: wheels to install first (no index, no deps) into a private target dir, e.g. megatron-core's.
# PYTHON: the interpreter (default: .venv/bin/python when present, else python3). Other arguments go to the suite.
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}"
EXTRA=""
if [ -n "${GPU_CHECK_WHEELS:-}" ]; then
  shopt -s nullglob
  WHEELS=("$GPU_CHECK_WHEELS"/*.whl)
  [ ${#WHEELS[@]} -gt 0 ] || { echo "gpu-check: GPU_CHECK_WHEELS=$GPU_CHECK_WHEELS holds no .whl file" >&2; exit 2; }
  EXTRA="$(mktemp -d /tmp/gpu_check_site.XXXXXX)"
  "$PY" -m pip install -q --no-index --no-deps --target "$EXTRA" "${WHEELS[@]}" || exit 2
  echo "gpu-check: installed $(printf '%s ' "${WHEELS[@]##*/}")into $EXTRA"
fi
command -v nvidia-smi >/dev/null && timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
export PYTHONPATH="$ROOT${EXTRA:+:$EXTRA}${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m slime_like.tools.gpu_check "$@"

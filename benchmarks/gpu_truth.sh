#!/usr/bin/env bash
# The workbook on a real NVIDIA card, in one go (about 8 minutes on 16 cores and one card, most of it compiling):
#   1. scripts/setup.sh builds llama.cpp for the card (the CUDA plan of `python -m v100lab.base.cudabuild`, the
#      toolkit, the CUDA wheel, the self-test on the card; or the CPU build, with the reason on one line);
#   2. the GPU self-test again, as JSON (layers offloaded, the buffers per device);
#   3. llama-bench pp512/tg128 of the default model, gemma3-270m and synth-1b (~1B, written with gguf and
#      quantized by llama.cpp) at -ngl 0 / half / all and -fa 0 / 1;
#   4. the measured rows beside the CUDA class's prediction for that card (benchmarks/gpu_truth.py).
#
#   benchmarks/gpu_truth.sh [OUT_DIR]        (default: $OUT, else ./gpu-truth)
#
# Everything it prints is also kept in OUT_DIR: nvidia-smi.csv, setup.log, selftest-gpu.json, bench.jsonl,
# table.md, table.json, timings.txt.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-${OUT:-gpu-truth}}"
mkdir -p "$out"
t0=$(date +%s)
step() { echo "gpu_truth: [$(( $(date +%s) - t0 ))s] $*" >&2; echo "$(( $(date +%s) - t0 )) $*" >>"$out/timings.txt"; }

smi="${V100LAB_NVIDIA_SMI:-nvidia-smi}"
"$smi" --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader >"$out/nvidia-smi.csv" \
  || { echo "gpu_truth: no NVIDIA card answers ($smi); this script is for a machine with one" >&2; exit 2; }
step "card: $(head -n 1 "$out/nvidia-smi.csv")"

export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
step "setup (build for the card)"
scripts/setup.sh gemma 2>&1 | tee "$out/setup.log" >&2
vpy=.venv/bin/python
"$vpy" -c 'from v100lab.base.buildflags import read_record; import json; print(json.dumps(read_record()))' \
  | tee "$out/build.json" >&2

step "self-test on the card"
"$vpy" -m v100lab.measure.selftest --gpu --json >"$out/selftest-gpu.json" || echo "gpu_truth: the GPU self-test fails (see $out/selftest-gpu.json)" >&2

bench="$("$vpy" -c 'from v100lab.measure.llamabench import find_llama_bench; p = find_llama_bench(); print(p or "")')"
[ -n "$bench" ] || { echo "gpu_truth: no llama-bench (scripts/build-tools.sh failed? see $out/setup.log)" >&2; exit 1; }
step "models"
"$vpy" benchmarks/gpu_truth.py models >"$out/models.tsv"
: >"$out/bench.jsonl"
while IFS=$'\t' read -r name path half n; do
  step "llama-bench $name ($n layers): -ngl 0,$half,99 -fa 0,1"
  "$bench" -m "$path" -p 512 -n 128 -ngl "0,$half,99" -fa 0,1 -r 3 -t "$(nproc)" -o jsonl >>"$out/bench.jsonl" \
    2>"$out/bench-$name.log" || echo "gpu_truth: llama-bench failed on $name (see $out/bench-$name.log)" >&2
done <"$out/models.tsv"

step "table"
"$vpy" benchmarks/gpu_truth.py table --bench "$out/bench.jsonl" --nvidia-smi "$out/nvidia-smi.csv" \
  --json "$out/table.json" | tee "$out/table.md"
step "done"

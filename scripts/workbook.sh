#!/usr/bin/env bash
# The main job: set up (first run only), calibrate this machine for `--device host` and its batched decode (first
# run only, a few minutes; later runs check an hour-old profile's drift, ~1 min), then run every notebook on
# params/default.yaml and write HTML reports under reports/ (open reports/index.html). Extra arguments go to
# `v100lab batch`. Each step says what it does and how long it takes; the long ones show a bar with the time left.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
# llama-server of llama-cpp-python's own llama.cpp commit (setup builds it; here it is only checked: a build
# that failed is not retried). Without it the notebooks say so and show predictions, labelled.
scripts/build-tools.sh .venv || echo "workbook: no same-commit llama-server; server measurements are skipped" >&2
if ! .venv/bin/python -c 'import sys; from v100lab.predict.rates import stored_calibration; sys.exit(not stored_calibration())'; then
  echo "workbook: calibrating this machine once (v100lab calibrate, the quick plan: ~5-10 min on 2 cores, building" \
       "its models included; \`v100lab calibrate --precise\` is the full procedure, 20-70 min)" >&2
  # --force: on a noisy machine the profile is stored anyway, its quality recorded and shown beside every
  # host prediction, rather than the workbook not running at all
  .venv/bin/v100lab calibrate --force
elif [ "${V100LAB_DRIFT_CHECK:-quick}" != 0 ] && .venv/bin/python -c \
    'import sys; from v100lab.measure.drift_check import needs_check; from v100lab.predict.rates import stored_calibration; sys.exit(not needs_check(stored_calibration()))'; then
  # a shared VM's speed moves over hours: an hour-old profile is brought up to now by a drift check on calibration's
  # own Q4_0 rung and prompt point (~1 min; V100LAB_DRIFT_CHECK=all checks every weight type's rung, a few minutes;
  # 0 skips it). A failed check leaves the profile as it was.
  echo "workbook: this host was last calibrated or checked over an hour ago; a drift check (v100lab calibrate --check)" >&2
  if [ "${V100LAB_DRIFT_CHECK:-quick}" = all ]; then check=(--check); else check=(--check --types Q4_0); fi
  .venv/bin/v100lab calibrate "${check[@]}" || echo "workbook: the drift check failed; predictions use the calibration as it is" >&2
fi
# batched decode (for notebook 10's -np predictions), once, when the same-commit llama-batched-bench is there
if [ -x .venv/bin/llama-batched-bench ] && \
   ! .venv/bin/python -c 'import sys; from v100lab.predict.serving import stored_batching; sys.exit(not stored_batching())'; then
  # only the weight type of the scenario's model (notebook 10's -np curve): seconds, not every type's minutes
  model="$(.venv/bin/python -c 'import sys; from v100lab.workbook.scenario import read_parameters; print(read_parameters(sys.argv[1]).get("model") or "default")' params/default.yaml)"
  echo "workbook: measuring batched decode once for $model's weight type (v100lab calibrate --batching --model, ~30 s)" >&2
  .venv/bin/v100lab calibrate --batching --model "$model" || echo "workbook: batched-decode calibration failed; -np predictions use the roofline" >&2
fi
exec .venv/bin/v100lab batch params/default.yaml --out reports "$@"

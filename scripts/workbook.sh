#!/usr/bin/env bash
# The main job: set up (first run only), calibrate this machine for `--device host` (first run only,
# about 1.5 minutes), then run every notebook on params/default.yaml and write HTML reports under
# reports/ (open reports/index.html). Extra arguments go to `v100lab batch`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
# llama-server of llama-cpp-python's own llama.cpp commit (setup builds it; here it is only checked: a build
# that failed is not retried). Without it the notebooks say so and show predictions, labelled.
scripts/build-tools.sh .venv || echo "workbook: no same-commit llama-server; server measurements are skipped" >&2
if ! .venv/bin/python -c 'import sys; from v100lab.rates import stored_calibration; sys.exit(not stored_calibration())'; then
  echo "workbook: calibrating this machine once (v100lab calibrate)" >&2
  # a noisy machine is refused (nothing stored); the workbook then stores one anyway, its quality recorded
  # and shown beside every host prediction, rather than not running at all
  .venv/bin/v100lab calibrate || { echo "workbook: calibration refused; calibrating again with --force" >&2
                                   .venv/bin/v100lab calibrate --force; }
fi
exec .venv/bin/v100lab batch params/default.yaml --out reports "$@"

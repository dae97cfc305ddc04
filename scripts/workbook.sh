#!/usr/bin/env bash
# The main job: set up (first run only), then run every notebook on params/default.yaml and write
# HTML reports under reports/ (open reports/index.html). Extra arguments go to `v100lab batch`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
exec .venv/bin/v100lab batch params/default.yaml --out reports "$@"

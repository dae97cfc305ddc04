#!/usr/bin/env bash
# The tests: set up with the test extras (first run only), then run pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh test
exec .venv/bin/python -m pytest "$@"

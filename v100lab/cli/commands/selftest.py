"""``v100lab selftest [--timeout S] [--gpu] [--json]``: does this llama.cpp build run here without crashing?

Loads the default model in a worker process and runs a 64-token prompt (a batched decode) and a short
generation at 1 thread and at all cores, under a timeout; prints the llama.cpp build (commit, system-info
line), the build flags ``scripts/setup.sh`` recorded, the CPU and its flags, and PASS or FAIL with the reason
and the rebuild command. Exit status 0 when it passes, 1 when it fails.
"""

from __future__ import annotations

import json
import math
import sys

from v100lab.measure import selftest
from v100lab.base.errors import ConfigError

NAME = "selftest"
HELP = "check that this llama.cpp build loads a model and decodes without crashing"


def add_arguments(p):
    p.add_argument("--timeout", type=float, default=selftest.SELFTEST_TIMEOUT_S, metavar="S",
                   help="seconds each configuration may take before it counts as a hang (default %(default)g)")
    p.add_argument("--gpu", action="store_true",
                   help="check the GPU build on the card instead: every layer offloaded, a model buffer on the GPU")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")


def run(args) -> int:
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise ConfigError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    run_it = selftest.run_gpu_selftest if args.gpu else selftest.run_selftest
    report = run_it(timeout=args.timeout)
    if args.json:
        json.dump(report.as_dict(), sys.stdout, indent=1)
        print()
    else:
        print(report.format())
    return 0 if report.passed else 1

"""``v100lab bench MODEL [llama.cpp flags] [--tests pp512,tg128] [--depth 0,1024] [-r 5] [--backend ...]``.

llama-bench's measurement through the harness: one model load, each test at each depth, r repetitions.
Prints a llama-bench-style table, or with ``--json`` one JSON document (a list of rows with llama-bench's
field names). Rows are appended to ``--results FILE`` (JSONL) as they are measured; a configuration already
recorded there with status "ok" is not measured again (its stored row is shown). Exit status 1 when any test failed (as llama-bench).
"""

from __future__ import annotations

import json
import sys

from v100lab.measure import harness
from v100lab.models import zoo
from v100lab.facts.config import add_flag_arguments, from_flag_args
from v100lab.base.errors import ConfigError
from v100lab.facts.store import check_writable

NAME = "bench"
HELP = "measure llama.cpp speed llama-bench style (in-process, or through llama-server)"

# Row fields too bulky for the terminal (the results file keeps them in sidecar files)
_BULKY = ("raw_log", "monitor_series")


def add_arguments(p):
    p.add_argument("model", metavar="MODEL", help="GGUF path or zoo alias (e.g. default)")
    add_flag_arguments(p)
    p.add_argument("--tests", default=",".join(harness.DEFAULT_TESTS),
                   help="comma-separated tests: ppN, tgN, ppN+tgN (default pp512,tg128)")
    p.add_argument("--depth", default="0", help="comma-separated context depths (default 0)")
    p.add_argument("-r", "--repetitions", type=int, default=harness.DEFAULT_REPETITIONS,
                   help=f"repetitions per test (default {harness.DEFAULT_REPETITIONS})")
    p.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the warmup run")
    p.add_argument("--backend", default="inprocess",
                   help="inprocess (default), server:URL, server-bin:PATH (PATH optional), "
                        "or llama-cpp-python-server")
    p.add_argument("--results", metavar="FILE", help="append rows to this JSONL file (and resume from it)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")


def run(args) -> int:
    if args.results:
        check_writable(args.results)                      # before the model is resolved or anything measured
    cfg = from_flag_args(args)
    if cfg.spec_type != "none" and not str(args.backend).startswith("server"):
        raise ConfigError(f"--spec-type {cfg.spec_type}: speculative decoding runs in llama-server only "
                          "(--backend server-bin or server:URL)")
    tests = harness.make_tests(args.tests, args.depth)     # bad spelling → ConfigError (exit 2)
    path = zoo.model_path(args.model)                       # bad model → ModelNotFoundError (exit 2)
    rows = harness.run_tests(path, cfg, tests, (0,), args.repetitions, warmup=args.warmup, backend=args.backend,
                           results=args.results)
    shown = [{k: v for k, v in r.items() if k not in _BULKY} for r in rows]
    if args.json:
        json.dump(shown, sys.stdout, indent=1, default=str)
        print()
    else:
        print(harness.format_markdown(shown))
    crashed = [r for r in rows if r.get("status") in ("crashed", "timeout")]
    if crashed:   # one line: what happened to llama.cpp, and what to run next
        signals = sorted({(r.get("crash") or {}).get("signal") or r["status"] for r in crashed})
        print(f"v100lab bench: llama.cpp {'/'.join(signals)} in {len(crashed)} of {len(rows)} test(s) "
              f"(rows marked crashed/timeout); check the build with `v100lab selftest`", file=sys.stderr)
    return 1 if any(r.get("status") != "ok" for r in rows) else 0

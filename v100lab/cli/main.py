"""The ``v100lab`` command: a thin dispatcher over ``v100lab.cli.commands.*``.

Each subcommand lives in its own module under ``v100lab/cli/commands/`` exposing ``NAME``, ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``. Errors: one line on stderr and exit status 2 for
bad input (any :class:`~v100lab.base.errors.V100labError`), 1 for a failed run; ``--json`` output is one
JSON document on stdout and nothing else.
"""

from __future__ import annotations

import argparse
import logging
import sys

from v100lab import __version__
from v100lab.cli.commands import (batch, bench, calibrate, doctor, inspect, models, plan, selftest, serve_bench,
                              tune)
from v100lab.base.errors import V100labError

# Order is the order of `v100lab --help`.
COMMANDS = {"models": models, "inspect": inspect, "plan": plan, "bench": bench, "calibrate": calibrate,
            "tune": tune, "doctor": doctor, "selftest": selftest, "batch": batch, "serve-bench": serve_bench}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, like every other bad input
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="v100lab", description="Predict and measure llama.cpp memory and speed.")
    parser.add_argument("--version", action="version", version=f"v100lab {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, mod in COMMANDS.items():
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except V100labError as exc:
        print(f"v100lab {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print(f"v100lab {args.command}: interrupted", file=sys.stderr)
        return 130

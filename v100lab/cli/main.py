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
from v100lab.base.safeio import term_text

# Order is the order of `v100lab --help`.
COMMANDS = {"models": models, "inspect": inspect, "plan": plan, "bench": bench, "calibrate": calibrate,
            "tune": tune, "doctor": doctor, "selftest": selftest, "batch": batch, "serve-bench": serve_bench}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, like every other bad input
        self.exit(2, f"{self.prog}: error: {message}\n")


class _TerminalSafe(logging.Formatter):
    """Every log line on one line and free of terminal escapes: messages carry names, paths and server
    bodies from outside (:func:`~v100lab.base.safeio.term_text`)."""

    def formatMessage(self, record):
        return term_text(super().formatMessage(record))


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
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_TerminalSafe("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, handlers=[handler])
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
    except OSError as exc:   # a full disk or a vanished folder a check could not foresee: one line, not a traceback
        where = f": {term_text(exc.filename, limit=200)}" if exc.filename else ""
        print(f"v100lab {args.command}: error: {term_text(exc.strerror or exc, limit=300)}{where}", file=sys.stderr)
        return 1

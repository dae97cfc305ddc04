"""``v100lab batch PARAMS... [--notebooks GLOB] [--out DIR] [--no-input] [--timeout S] [--force]
[--engine local|ray] [--address auto|HOST:PORT|ray://HOST:PORT] [--task-timeout S]``.

Every notebook once per parameter file (papermill), an HTML report per run and ``DIR/index.html``;
see :mod:`v100lab.workbook.runner`. A progress bar over the runs with one status line per run goes to
stderr, the summary table to stdout (or one JSON document with ``--json``). Exit status 1 when any
run failed, 2 for bad input (a missing or invalid parameter file, no notebook matching).
"""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path

from tqdm.auto import tqdm

from v100lab.workbook import runner
from v100lab.base.errors import ConfigError
from v100lab.workbook.fleet import RayEngine, probe_address
from v100lab.base.safeio import check_creatable, term_text

NAME = "batch"
HELP = "run every notebook for each parameter file (papermill) and export HTML reports with an index"
DEFAULT_TIMEOUT_S = 1200.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0   # a week per cell: beyond that, 0 (no limit) says it better


def add_arguments(p):
    p.add_argument("params", nargs="+", metavar="PARAMS", help="parameter files (params/*.yaml)")
    p.add_argument("--notebooks", action="append", metavar="GLOB",
                   help=f"notebooks to run, a glob or path; repeatable (default {runner.DEFAULT_NOTEBOOKS})")
    p.add_argument("--out", default="reports", metavar="DIR", help="output folder (default reports/)")
    p.add_argument("--no-input", action="store_true",
                   help="also export a reader's report without code cells (NAME.reader.html)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"per-cell execution timeout in seconds; 0 = none (default {DEFAULT_TIMEOUT_S:g}: "
                        "a hung cell must not hold the batch forever)")
    p.add_argument("--force", action="store_true", help="re-run runs whose inputs are unchanged")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON document")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: one run after another here (default); ray: one Ray task per run (v100lab.workbook.fleet)")
    p.add_argument("--address", metavar="ADDR", default=None,
                   help="with --engine ray: auto, HOST:PORT or ray://HOST:PORT of a running cluster "
                        "(default: start a local Ray instance)")
    p.add_argument("--task-timeout", type=float, default=0.0, metavar="S",
                   help="with --engine ray: seconds a run may take once started; 0 = none (default)")


def _status_line(r: runner.RunResult) -> str:
    h = r.headline or {}
    head = ""
    if h.get("measured_tok_s") is not None or h.get("predicted_tok_s") is not None:
        head = (f"  {h.get('metric', '')} measured {runner.format_tps(h.get('measured_tok_s'))} / "
                f"predicted {runner.format_tps(h.get('predicted_tok_s'))} {h.get('unit') or 'tok/s'}")
    cached = " (unchanged, not re-run)" if r.cached else ""
    reason = f"  — {r.reason}" if r.reason else ""
    return term_text(f"[{r.status}]{cached} {r.scenario} × {_stem(r.notebook)}  "
                     f"{runner.format_duration(r.duration_s)}{head}{reason}")


def _progress_label(run) -> str:
    """The progress bar's note for a run: its scenario and notebook, escaped (names come from files)."""
    return term_text(f"{run.scenario.scenario} × {Path(run.notebook).stem}", limit=80)


def _stem(path: str) -> str:
    return Path(path).stem


def _summary_table(result: runner.BatchResult) -> str:
    rows = runner.summary_rows(result.runs)
    header = ("scenario", "notebook", "status", "time", "measured", "predicted", "report")
    table = [header]
    for row in rows:
        status = row["status"] + (" (cached)" if row["cached"] else "")
        table.append((row["scenario"], row["notebook"], status, runner.format_duration(row["duration_s"]),
                      runner.format_tps(row["measured_tok_s"]), runner.format_tps(row["predicted_tok_s"]),
                      row["report"] or "-"))
    widths = [min(max(len(str(r[i])) for r in table), 40) for i in range(len(header))]
    lines = ["  ".join(term_text(c, limit=40).ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    n_fail = len(result.failed)
    lines.append("")
    lines.append(f"{len(rows)} run{'s' if len(rows) != 1 else ''}, {len(rows) - n_fail} ok, {n_fail} failed; wall time "
                 f"{runner.format_duration(result.wall_s)}; index: {result.index}")
    return "\n".join(lines)


def run(args) -> int:
    if not args.verbose:
        # papermill logs each failure as ERROR and nbconvert warns about images without alt text;
        # the status line and the index already say what failed, so keep the progress bar readable
        for name in ("papermill", "traitlets", "nbclient"):
            logging.getLogger(name).setLevel(logging.CRITICAL)

    patterns = args.notebooks or [runner.DEFAULT_NOTEBOOKS]
    notebooks = runner.find_notebooks(patterns)
    if not math.isfinite(args.timeout) or not 0 <= args.timeout <= MAX_TIMEOUT_S:
        raise ConfigError(f"--timeout must be a number of seconds in [0, {MAX_TIMEOUT_S:g}] (0 = none), "
                          f"got {args.timeout:g}")
    timeout = args.timeout or None
    engine = None
    if args.engine == "ray":
        if not math.isfinite(args.task_timeout) or args.task_timeout < 0:
            raise ConfigError(f"--task-timeout must be a number of seconds >= 0 (0 = none), got {args.task_timeout:g}")
        engine = RayEngine(args.address, task_timeout=args.task_timeout or None)
        if args.address not in (None, "auto"):
            probe_address(args.address)          # a wrong address fails now, not after Ray's retries
    elif args.address is not None or args.task_timeout:
        raise ConfigError("--address and --task-timeout go with --engine ray")
    total = len(runner.plan_runs(args.params, notebooks))  # validates every parameter file first
    # the output folder, before anything runs: not a file, creatable, writable
    check_creatable(Path(args.out), what="--out", error=ConfigError, folder=True)
    bar = tqdm(total=total, unit="run", desc="batch", file=sys.stderr, dynamic_ncols=True)

    def on_start(run, i, n):
        bar.set_postfix_str(_progress_label(run), refresh=True)

    def on_result(r, i, n):
        bar.write(_status_line(r), file=sys.stderr)
        bar.update(1)

    try:
        result = runner.run_batch(args.params, notebooks, args.out, timeout=timeout,
                                    no_input=args.no_input, force=args.force, on_start=on_start,
                                    on_result=on_result, engine=engine)
    finally:
        bar.close()
    if args.json:
        json.dump({"index": str(result.index), "wall_s": round(result.wall_s, 3), "ok": result.ok,
                   "runs": runner.summary_rows(result.runs)}, sys.stdout, indent=2)
        print()
    else:
        print(_summary_table(result))
    return 0 if result.ok else 1

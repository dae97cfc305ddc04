"""Batch runs of the workbook: papermill per (parameter file × notebook), HTML reports, an index page.

``run_batch`` runs every notebook once per parameter file with papermill, in the venv's own Python
(the ``python3`` kernel spec: jupyter_client starts it with the interpreter running the batch), with
the parameter file's mapping as papermill's parameters — exactly what
``papermill notebooks/X.ipynb out.ipynb -f params/Y.yaml`` injects. Each run keeps its executed
notebook and is exported with nbconvert to one self-contained HTML report (images embedded; no
external script: require.js, MathJax and mermaid are left out, and a Content-Security-Policy forbids
every script, so a report stays inert even if some output slipped past escaping); ``no_input`` adds a
reader's variant without code. ``DIR/index.html`` lists every run.

Layout of the output folder::

    DIR/index.html
    DIR/<params stem>/<notebook stem>.ipynb        executed notebook
    DIR/<params stem>/<notebook stem>.html         report
    DIR/<params stem>/<notebook stem>.reader.html  report without code (--no-input)
    DIR/<params stem>/<notebook stem>.run.json     record: inputs digest, status, reason, headline
    DIR/<params stem>/<notebook stem>.kernel.log   the kernel process's own stdout/stderr

Failures never stop the batch. A cell that raises is marked by papermill (an anchor before the
failing cell, ``#papermill-error-cell``); a cell timeout and a dead kernel are not, so the batch
reads the reason from the exception and inserts the same anchor before the cell that was running.
The index links each failure to that anchor in the report.

A re-run skips a run whose record says it finished (status ok) with the same inputs digest —
sha256 of the parameter file's bytes, the notebook's bytes and the package version — unless
``force``.

**Headline.** A notebook publishes its headline figure with ``publish_headline(measured, predicted,
...)``: it displays one output carrying a custom MIME type, ``application/vnd.v100lab.headline+json``
(the JSON figures), beside a ``text/plain`` line for people (nbconvert and JupyterLab show that
line; they ignore the unknown type). The batch reads the last such output from the executed
notebook — no sidecar file, no scrapbook, and the figure travels inside the ``.ipynb``.

Everything from a parameter file, a model file or a notebook's output is HTML-escaped in the index
(``v100lab.workbook.render.escape``); link targets are our own file names.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import math
import os
import re
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence
from urllib.parse import quote

from v100lab import __version__
from v100lab.base.errors import ConfigError, OutputError
from v100lab.predict.drift_scaling import agree
from v100lab.workbook.render import HEADLINE_MIME, MACHINE_BAND, escape
from v100lab.base.safeio import check_creatable, write_atomic
from v100lab.workbook.levers.course import keys_of
from v100lab.workbook.scenario import Scenario, keys, load_scenario, parameters_cell_source, read_parameters

log = logging.getLogger(__name__)

DEFAULT_NOTEBOOKS = "notebooks/[0-9][0-9]_*.ipynb"
KERNEL_NAME = "python3"
ERROR_ANCHOR = "papermill-error-cell"        # papermill's own anchor (papermill/execute.py)
ERROR_MARKER_TAG = "papermill-error-cell-tag"  # papermill removes cells with this tag on re-execution
STATUSES = ("ok", "error", "timeout", "dead kernel", "failed")

# No script may run in a report or the index, whatever a notebook printed.
CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; font-src data:; "
       "base-uri 'none'; form-action 'none'")

# nbconvert's "lab" template, minus every external script (self-contained, nothing fetched)
_REPORT_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}
<meta http-equiv="Content-Security-Policy" content="{{ resources.v100lab_csp }}">
{%- endblock html_head_js -%}
{% block jupyter_widgets %}{% endblock jupyter_widgets %}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""


def read_headline(nb) -> dict[str, Any] | None:
    """The last headline published in an executed notebook (a NotebookNode or dict), or None."""
    found = None
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []) or []:
            data = out.get("data") or {}
            if HEADLINE_MIME in data:
                value = data[HEADLINE_MIME]
                if isinstance(value, str):  # some writers store JSON MIME data as text
                    try:
                        value = json.loads(value)
                    except ValueError:
                        continue
                if isinstance(value, dict):
                    found = dict(value)
    return found


# --------------------------------------------------------------------------------------------
# notebooks and their parameters cell
# --------------------------------------------------------------------------------------------

def find_notebooks(patterns: str | Sequence[str] = DEFAULT_NOTEBOOKS) -> list[Path]:
    """Notebook paths matching one or more globs (or plain paths), sorted, without duplicates."""
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [os.fspath(patterns)]
    out: list[Path] = []
    for pattern in patterns:
        text = os.fspath(pattern)
        matches = [text] if os.path.isfile(text) else sorted(glob.glob(text))
        if not matches:
            raise ConfigError(f"no notebook matches '{text}'")
        for m in matches:
            p = Path(m)
            if p.suffix != ".ipynb":
                raise ConfigError(f"not a notebook (.ipynb): {m}")
            if p.resolve() not in {q.resolve() for q in out}:
                out.append(p)
    return out


def parameters_cell(nb):
    """The cell tagged ``parameters`` (papermill's convention), or None."""
    for cell in nb.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            return cell
    return None


def notebook_keys(path: str | os.PathLike) -> tuple[str, ...]:
    """The scenario keys a notebook's parameters cell holds: those its steps read
    (:func:`v100lab.workbook.levers.course.keys_of`; every key for a notebook outside the course)."""
    return keys_of(path)


def paired_source(path: str | os.PathLike) -> Path | None:
    """The jupytext pair of a notebook: the percent-format ``.py`` beside an ``.ipynb`` of the same stem
    (None when there is none). The ``.py`` is the source people edit; the ``.ipynb`` is what papermill runs."""
    p = Path(path).with_suffix(".py")
    return p if p.is_file() else None


def sync_parameters_cell(path: str | os.PathLike) -> bool:
    """Rewrite a notebook's ``parameters`` cell from the schema, for the keys the notebook reads
    (:func:`notebook_keys`); True when a file changed. The one writer of that cell.

    Adds the cell (first, tagged) when the notebook has none; outputs are left as they are. A notebook with
    a jupytext pair (:func:`paired_source`) has the cell rewritten in both files, the ``.ipynb`` first, so
    the pair stays in sync and the text file is the newer one (jupytext reads the inputs from it)."""
    import nbformat  # heavy: the batch runner's notebook stack, loaded when a batch runs

    p = Path(path)
    ipynb = p.with_suffix(".ipynb")
    source = parameters_cell_source(notebook_keys(ipynb))
    changed = False
    if ipynb.is_file():
        nb = nbformat.read(ipynb, as_version=4)
        if _set_parameters(nb, source):
            nbformat.write(nb, ipynb)
            changed = True
    py = paired_source(ipynb)
    if py is not None:
        import jupytext  # heavy: the batch runner's notebook stack, loaded when a batch runs

        text_nb = jupytext.read(py, fmt="py:percent")
        if _set_parameters(text_nb, source):
            jupytext.write(text_nb, py, fmt="py:percent")
            changed = True
    return changed


def _set_parameters(nb, source: str) -> bool:
    import nbformat  # heavy: the batch runner's notebook stack, loaded when a batch runs

    cell = parameters_cell(nb)
    if cell is not None and cell.source == source:
        return False
    if cell is None:
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["tags"] = ["parameters"]
        nb.cells.insert(0, cell)
    else:
        cell.source = source
    return True


def sync_notebooks(patterns: str | Sequence[str] = DEFAULT_NOTEBOOKS) -> list[Path]:
    """:func:`sync_parameters_cell` for every notebook matching ``patterns``; the notebooks that changed.
    Run after changing the scenario schema or a notebook's keys: ``python -m v100lab.workbook.runner``."""
    return [p for p in find_notebooks(patterns) if sync_parameters_cell(p)]


# --------------------------------------------------------------------------------------------
# runs
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Run:
    """One planned run: a parameter file × a notebook, and where its outputs go."""

    params: Path
    notebook: Path
    scenario: Scenario
    parameters: dict[str, Any] = field(repr=False)   # the file's raw mapping (papermill's parameters)
    folder: str                                      # sub-folder of the output dir (params stem)
    stem: str                                        # file stem of the outputs (notebook stem)

    def rel(self, suffix: str) -> str:
        return f"{self.folder}/{self.stem}{suffix}"


@dataclass(frozen=True)
class RunResult:
    """What one run did. Paths are relative to the output folder (the index links them as they are)."""

    params: str
    notebook: str
    scenario: str
    model: str
    device: str
    status: str                    # one of STATUSES
    reason: str                    # one line; "" when ok
    duration_s: float              # papermill's wall time for the run (0 when nothing ran)
    started: str                   # ISO time (UTC)
    digest: str                    # inputs digest (parameter file, notebook, package version)
    executed: str | None           # executed notebook
    report: str | None             # HTML report
    reader: str | None = None      # HTML report without code
    failed_cell: int | None = None  # index of the failing cell in the executed notebook
    headline: dict[str, Any] | None = None
    kernel_log: str | None = None  # the kernel process's own stdout/stderr
    cached: bool = False           # skipped: an earlier run with the same inputs finished ok
    node: str = ""                 # where it ran, when an engine other than the local one ran it

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def failure_link(self) -> str | None:
        if self.ok or not self.report or self.failed_cell is None:
            return None
        return f"{self.report}#{ERROR_ANCHOR}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BatchResult:
    runs: tuple[RunResult, ...]
    out_dir: Path
    index: Path
    wall_s: float

    @property
    def failed(self) -> tuple[RunResult, ...]:
        return tuple(r for r in self.runs if not r.ok)

    @property
    def ok(self) -> bool:
        return not self.failed


def slug(text: str) -> str:
    """A file-name-safe form of ``text`` (letters, digits, ``._-``)."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return s or "run"


def inputs_digest(params: str | os.PathLike, notebook: str | os.PathLike) -> str:
    """sha256 over the parameter file, the notebook and the package version: what a run depends on."""
    h = hashlib.sha256()
    for part in (f"v100lab {__version__}".encode(), Path(params).read_bytes(), Path(notebook).read_bytes()):
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def plan_runs(params_files: Sequence[str | os.PathLike], notebooks: Sequence[str | os.PathLike]) -> list[Run]:
    """Validate every parameter file (ConfigError names the file and key) and pair it with each notebook."""
    if not params_files:
        raise ConfigError("name at least one parameter file, e.g. params/default.yaml")
    if not notebooks:
        raise ConfigError("no notebooks to run")
    runs = []
    folders: dict[str, Path] = {}
    for pf in params_files:
        p = Path(pf)
        raw = read_parameters(p)
        scenario = load_scenario(p)
        folder = slug(p.stem)
        n = 2
        while folder in folders and folders[folder].resolve() != p.resolve():
            folder = f"{slug(p.stem)}-{n}"
            n += 1
        folders[folder] = p
        stems: set[str] = set()
        for nb in notebooks:
            nbp = Path(nb)
            stem, n = slug(nbp.stem), 2
            while stem in stems:
                stem = f"{slug(nbp.stem)}-{n}"
                n += 1
            stems.add(stem)
            runs.append(Run(params=p, notebook=nbp, scenario=scenario, parameters=raw, folder=folder, stem=stem))
    return runs


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


now_iso, one_line = _now, _one_line   # for the other engines (v100lab.workbook.fleet)


def _mark_failure(executed: Path, reason: str) -> int | None:
    """Insert papermill-style markers before the cell that was running when execution stopped
    (papermill does this for cell errors only). Returns that cell's index, or None."""
    import nbformat  # heavy: the batch runner's notebook stack, loaded when a batch runs

    nb = nbformat.read(executed, as_version=4)
    started = [i for i, c in enumerate(nb.cells)
               if c.get("metadata", {}).get("papermill", {}).get("start_time")]
    if not started:
        return None
    index = started[-1]
    # HTML blocks (a <div> on its own line) pass through Markdown renderers intact; inline spans
    # like papermill's own markers get split up by nbconvert's renderer
    style = 'style="color:#b00020; font-size:1.5em; font-weight:600;"'
    banner = nbformat.v4.new_markdown_cell(
        f'<div {style}>\nExecution stopped: {escape(reason)}. <a href="#{ERROR_ANCHOR}">Go to the cell.</a>\n</div>')
    anchor = nbformat.v4.new_markdown_cell(
        f'<div id="{ERROR_ANCHOR}" {style}>\nExecution stopped here: {escape(reason)}\n</div>')
    for c in (banner, anchor):
        c.metadata["tags"] = [ERROR_MARKER_TAG]
    nb.cells.insert(index, anchor)
    nb.cells.insert(0, banner)
    nb.metadata.setdefault("papermill", {})["exception"] = True
    nbformat.write(nb, executed)
    return index + 2  # after the anchor, and the banner at the top


def _error_cell_index(executed: Path) -> int | None:
    """Index of the failing cell in a notebook papermill marked (the cell after its anchor)."""
    import nbformat  # heavy: the batch runner's notebook stack, loaded when a batch runs

    nb = nbformat.read(executed, as_version=4)
    for i, c in enumerate(nb.cells):
        if c.cell_type == "markdown" and f'id="{ERROR_ANCHOR}"' in c.source:
            return i + 1
    return None


def _kernel_manager_class(log_path: Path):
    """A kernel manager whose kernel writes its stdout/stderr (ipykernel's own log, and C libraries
    such as llama.cpp writing to fd 2 outside a cell's capture) to ``log_path`` instead of the
    batch's terminal, where it would tear through the progress bar."""
    from jupyter_client.manager import AsyncKernelManager  # heavy: the batch runner's notebook stack, loaded when a batch runs

    class KernelWithLog(AsyncKernelManager):
        async def _async_launch_kernel(self, kernel_cmd, **kw):
            with open(log_path, "ab") as f:  # the child inherits the descriptor
                kw["stdout"] = kw["stderr"] = f
                return await super()._async_launch_kernel(kernel_cmd, **kw)

    return KernelWithLog


def export_html(executed: str | os.PathLike, html_path: str | os.PathLike, *, exclude_input: bool = False,
                title: str | None = None) -> Path:
    """Export an executed notebook to one self-contained, script-free HTML file."""
    import nbformat  # heavy: the batch runner's notebook stack, loaded when a batch runs
    from nbconvert import HTMLExporter  # heavy: the batch runner's notebook stack, loaded when a batch runs

    nb = nbformat.read(Path(executed), as_version=4)
    if title is not None:
        nb.metadata["title"] = title  # nbconvert escapes it into <title>
    exporter = HTMLExporter(template_name="lab", raw_template=_REPORT_TEMPLATE, embed_images=True,
                            exclude_input=exclude_input, exclude_input_prompt=exclude_input,
                            exclude_output_prompt=exclude_input)
    body, _ = exporter.from_notebook_node(
        nb, resources={"metadata": {"name": slug(Path(html_path).stem)}, "v100lab_csp": CSP})
    return write_atomic(html_path, body, what="report", error=OutputError)


def _record_path(out_dir: Path, run: Run) -> Path:
    return out_dir / run.rel(".run.json")


def _load_record(path: Path) -> RunResult | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return RunResult(**data)
    except (OSError, ValueError, TypeError):
        return None


def _cached(out_dir: Path, run: Run, digest: str, no_input: bool) -> RunResult | None:
    rec = _load_record(_record_path(out_dir, run))
    if rec is None or not rec.ok or rec.digest != digest:
        return None
    if not rec.executed or not (out_dir / rec.executed).exists() or not rec.report \
            or not (out_dir / rec.report).exists():
        return None
    if no_input and not (rec.reader and (out_dir / rec.reader).exists()):
        export_html(out_dir / rec.executed, out_dir / run.rel(".reader.html"), exclude_input=True,
                    title=_title(run))
        rec = replace(rec, reader=run.rel(".reader.html"))
        _write_record(out_dir, run, rec)
    return replace(rec, cached=True)


def _write_record(out_dir: Path, run: Run, result: RunResult) -> None:
    write_atomic(_record_path(out_dir, run), json.dumps(replace(result, cached=False).as_dict(), indent=1),
                 what="run record", error=OutputError)


def _title(run: Run) -> str:
    return f"{run.scenario.scenario} · {run.notebook.stem}"


class _KeysNotShown(logging.Filter):
    """Drops papermill's "Passed unknown parameter: KEY" for scenario keys: a parameter file sets keys for every
    notebook, and each notebook's parameters cell shows only those it reads (the validation cell still reads
    them all). Any other name is left to warn."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        prefix = "Passed unknown parameter: "
        return not (msg.startswith(prefix) and msg[len(prefix):].strip() in keys())


@contextlib.contextmanager
def _quiet_about_keys_not_shown():
    quiet = _KeysNotShown()
    logging.getLogger("papermill").addFilter(quiet)
    try:
        yield
    finally:
        logging.getLogger("papermill").removeFilter(quiet)


def execute_run(run: Run, out_dir: str | os.PathLike, *, timeout: float | None = None, no_input: bool = False,
                force: bool = False) -> RunResult:
    """Run one notebook with papermill and export its report; never raises for a failing notebook."""
    import papermill as pm  # heavy: the batch runner's notebook stack, loaded when a batch runs
    from nbclient.exceptions import CellTimeoutError, DeadKernelError  # heavy: the batch runner's notebook stack, loaded when a batch runs
    from papermill.exceptions import PapermillExecutionError  # heavy: the batch runner's notebook stack, loaded when a batch runs

    # absolute: the kernel runs in the notebook's folder, so a relative --out would point elsewhere there
    out = Path(out_dir).resolve()
    digest = inputs_digest(run.params, run.notebook)
    if not force:
        cached = _cached(out, run, digest, no_input)
        if cached is not None:
            return cached
    (out / run.folder).mkdir(parents=True, exist_ok=True)
    executed = out / run.rel(".ipynb")
    executed.unlink(missing_ok=True)
    kernel_log = out / run.rel(".kernel.log")
    for stale in (kernel_log, out / run.rel(".html"), out / run.rel(".reader.html")):
        stale.unlink(missing_ok=True)  # a run that fails early must not leave an old report behind
    started = _now()
    t0 = time.perf_counter()
    status, reason, failed_cell = "ok", "", None
    try:
        with _quiet_about_keys_not_shown():
            pm.execute_notebook(str(run.notebook), str(executed), parameters=dict(run.parameters),
                                kernel_name=KERNEL_NAME, progress_bar=False, log_output=False,
                                execution_timeout=timeout, cwd=str(run.notebook.parent.resolve()),
                                kernel_manager_class=_kernel_manager_class(kernel_log))
    except PapermillExecutionError as exc:
        status, reason = "error", f"{exc.ename}: {exc.evalue}"
    except CellTimeoutError as exc:
        status = "timeout"
        reason = (f"a cell ran longer than the {timeout:g} s cell timeout" if timeout
                  else f"timed out waiting for the kernel ({_one_line(exc)})")
    except DeadKernelError as exc:
        status, reason = "dead kernel", f"the kernel died while a cell ran ({_one_line(exc) or 'no reason given'})"
    except Exception as exc:  # kernel did not start, unreadable notebook, ...: record, go on
        status, reason = "failed", f"{type(exc).__name__}: {exc}"
        log.debug("run %s × %s failed", run.params, run.notebook, exc_info=True)
    duration = time.perf_counter() - t0
    reason = _one_line(reason)

    has_nb = executed.exists()
    if has_nb and status == "error":
        failed_cell = _error_cell_index(executed)
    elif has_nb and status in ("timeout", "dead kernel"):
        failed_cell = _mark_failure(executed, reason)

    headline, report, reader = None, None, None
    if has_nb:
        import nbformat  # heavy: the batch runner's notebook stack, loaded when a batch runs

        try:
            headline = read_headline(nbformat.read(executed, as_version=4))
            export_html(executed, out / run.rel(".html"), title=_title(run))
            report = run.rel(".html")
            if no_input:
                export_html(executed, out / run.rel(".reader.html"), exclude_input=True, title=_title(run))
                reader = run.rel(".reader.html")
        except Exception as exc:  # a report that cannot be exported is a failed run, not a crash
            log.debug("export of %s failed", executed, exc_info=True)
            if status == "ok":
                status, reason = "failed", _one_line(f"export failed: {type(exc).__name__}: {exc}")
    result = RunResult(params=str(run.params), notebook=str(run.notebook), scenario=run.scenario.scenario,
                       model=run.scenario.model, device=run.scenario.device, status=status, reason=reason,
                       duration_s=round(duration, 3), started=started, digest=digest,
                       executed=run.rel(".ipynb") if has_nb else None, report=report, reader=reader,
                       failed_cell=failed_cell, headline=headline,
                       kernel_log=run.rel(".kernel.log") if kernel_log.exists() else None)
    _write_record(out, run, result)
    return result


# --------------------------------------------------------------------------------------------
# the batch and its index
# --------------------------------------------------------------------------------------------

def cached_run(run: Run, out_dir: Path, *, no_input: bool = False) -> RunResult | None:
    """The recorded result of ``run`` in ``out_dir`` when it finished ok with the same inputs (a re-run skips
    it), else None."""
    return _cached(out_dir, run, inputs_digest(run.params, run.notebook), no_input)


def write_record(out_dir: Path, run: Run, result: RunResult) -> None:
    """Store ``result`` as the run's ``.run.json`` record (what a re-run reads back)."""
    _write_record(out_dir, run, result)


class LocalEngine:
    """Runs one after another, here: the default engine. An engine has one method, ``run``, which executes
    ``runs`` (the plan; ``out`` exists) and calls ``started(i)`` when the run at index ``i`` starts and
    ``finished(i, result)`` as each one ends, in any order; ``v100lab.workbook.fleet.RayEngine`` is the other."""

    def run(self, runs: Sequence[Run], out: Path, *, timeout: float | None, no_input: bool, force: bool,
            started: Callable[[int], None], finished: Callable[[int, RunResult], None]) -> None:
        for i, run in enumerate(runs):
            started(i)
            finished(i, execute_run(run, out, timeout=timeout, no_input=no_input, force=force))


def run_batch(params_files: Sequence[str | os.PathLike], notebooks: Sequence[str | os.PathLike] | str,
              out_dir: str | os.PathLike = "reports", *, timeout: float | None = None, no_input: bool = False,
              force: bool = False, on_start: Callable[[Run, int, int], None] | None = None,
              on_result: Callable[[RunResult, int, int], None] | None = None, engine=None) -> BatchResult:
    """Every notebook × every parameter file; then ``out_dir/index.html``.

    ``notebooks``: paths and/or globs (``find_notebooks``; a pattern that matches nothing is an error).
    Parameter files are validated before anything runs (ConfigError naming file and key).
    ``timeout`` is papermill's per-cell execution timeout in seconds (None: no limit).
    ``engine``: what executes the runs (:class:`LocalEngine` when None). The index lists the runs in the
    plan's order whatever order they finish in; on Ctrl-C it lists those that finished.
    """
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise ConfigError(f"timeout must be a finite number of seconds > 0, got {timeout}")
    notebooks = find_notebooks(notebooks)
    runs = plan_runs(params_files, notebooks)
    out = Path(out_dir).resolve()
    check_creatable(out, what="output folder", error=ConfigError, folder=True)   # before any run
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    done: dict[int, RunResult] = {}

    def started(i: int) -> None:
        if on_start:
            on_start(runs[i], i, len(runs))

    def finished(i: int, result: RunResult) -> None:
        log.info("%s × %s: %s %s", runs[i].params, runs[i].notebook, result.status, result.reason)
        done[i] = result
        if on_result:
            on_result(result, i, len(runs))

    try:
        (engine or LocalEngine()).run(runs, out, timeout=timeout, no_input=no_input, force=force,
                                      started=started, finished=finished)
    except KeyboardInterrupt:
        write_index(out, [done[i] for i in sorted(done)], time.perf_counter() - t0)  # what finished stays reachable
        raise
    results = [done[i] for i in sorted(done)]
    wall = time.perf_counter() - t0
    index = write_index(out, results, wall)
    return BatchResult(runs=tuple(results), out_dir=out, index=index, wall_s=wall)


def format_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s:02d} s"


def format_tps(x) -> str:
    return "—" if x is None else f"{x:.1f}"


#: a headline whose measured / predicted ratio (or median error) is outside this band is marked in the index
OFF_BAND = 0.15


def _ratio(h: dict | None) -> str:
    if not h or not h.get("measured_tok_s") or not h.get("predicted_tok_s"):
        return "—"
    return f"{h['measured_tok_s'] / h['predicted_tok_s']:.2f}"


def _off(h: dict | None) -> bool:
    """The headline's prediction is off by more than :data:`OFF_BAND`: its ratio, or its median error."""
    if not h:
        return False
    med = h.get("median_error")
    if med is not None and abs(med) > OFF_BAND:
        return True
    m, p = h.get("measured_tok_s"), h.get("predicted_tok_s")
    return bool(m and p and abs(m / p - 1) > OFF_BAND)


def _measured_cell(h: dict) -> str:
    """The measured figure with its spread and, when it is not tok/s, its unit."""
    m = h.get("measured_tok_s")
    if m is None:
        return "—"
    sd = h.get("sd")
    unit = h.get("unit") or "tok/s"
    nd = 1 if abs(m) >= 1 else 3                  # a load time under a second keeps its digits
    return (f"{m:,.{nd}f}" + (f" ± {sd:,.{nd}f}" if sd is not None else "")
            + (f" <span class='muted'>{escape(unit)}</span>" if unit != "tok/s" else ""))


def _error_cell(h: dict) -> str:
    """The median error (predicted / measured − 1) over the points measured, or the ratio's; marked when off."""
    med = h.get("median_error")
    if med is None:
        m, p = h.get("measured_tok_s"), h.get("predicted_tok_s")
        if not (m and p):
            return "—"
        med = p / m - 1
    n = h.get("points") or 1
    mark = " <span class='off' title='outside ±15 %'>⚠</span>" if _off(h) else ""
    return f"{100 * med:+.0f} %<div class='muted'>{n} pt{'s' if n != 1 else ''}</div>{mark}"


def _reference_cell(h: dict) -> str:
    """The run's reference at its start and end (tok/s) and how far it moved; marked when beyond its noise.
    "—" without one, or when the record is not numbers (a notebook's output is never trusted)."""
    try:
        ref = h.get("reference") or {}
        start, end, shift = ref.get("start"), ref.get("end"), ref.get("shift")
        if not start:
            return "—"
        text = f"{float(start['tps']):,.1f}" + (f" → {float(end['tps']):,.1f}" if end else " → —")
        if shift:
            text += f"<div class='muted'>{100 * (float(shift['ratio']) - 1):+.1f} %</div>"
            if shift.get("moved") is True:
                text += (" <span class='off' title='the machine moved beyond the noise while this run measured'>"
                         "⚠ moved</span>")
        if ref.get("machine_ratio"):
            mr = float(ref["machine_ratio"])
            text += (f"<div class='muted'>×{mr:.2f} of calibration"
                     + (" ⚠" if abs(mr - 1) > MACHINE_BAND else "") + "</div>")
        return text
    except (AttributeError, KeyError, TypeError, ValueError):
        return "—"


@dataclass(frozen=True)
class Agreement:
    """One configuration measured by several notebooks of one scenario: each run's figure with its spread (the
    drift between its references included) and whether every pair agrees within their combined spreads."""

    scenario: str
    setup: str
    metric: str
    figures: tuple[tuple[str, float, float], ...]   # (notebook stem, measured, spread)
    agree: bool
    widest: float                                   # the largest gap between two figures, relative to the lower


def agreements(results: Iterable[RunResult]) -> list[Agreement]:
    """Every (scenario, setup, metric) that two or more runs measured (their headlines' ``measured_points``), in
    the order first seen; a verdict over every pair (:func:`v100lab.predict.drift_scaling.agree`)."""
    groups: dict[tuple[str, str, str], list[tuple[str, float, float]]] = {}
    for r in results:
        for p in (r.headline or {}).get("measured_points") or ():
            try:
                fig = (Path(r.notebook).stem, float(p["measured"]), float(p.get("sd") or 0.0))
                key = (r.params, str(p["setup"]), str(p["metric"]))
            except (KeyError, TypeError, ValueError):
                continue
            if math.isfinite(fig[1]) and math.isfinite(fig[2]):
                groups.setdefault(key, []).append(fig)
    out = []
    for (scenario, setup, metric), figs in groups.items():
        if len({nb for nb, _, _ in figs}) < 2:
            continue
        ok = all(agree(a, sa, b, sb) for i, (_, a, sa) in enumerate(figs) for _, b, sb in figs[i + 1:])
        vals = [v for _, v, _ in figs]
        out.append(Agreement(scenario, setup, metric, tuple(figs), ok,
                             max(vals) / min(vals) - 1 if min(vals) > 0 else math.inf))
    return out


def _agreement_html(found: Sequence[Agreement]) -> str:
    if not found:
        return ""
    rows = []
    for a in found:
        figs = "<br>".join(f"{escape(nb)}: {v:,.1f} ± {sd:,.1f}" for nb, v, sd in a.figures)
        verdict = ("<span class='ok'>agree</span>" if a.agree else
                   f"<span class='off'>⚠ differ</span><div class='muted'>up to {100 * a.widest:.0f} % apart</div>")
        rows.append(f"<tr><td>{escape(a.scenario)}</td><td class='conf'>{escape(a.setup)}</td>"
                    f"<td>{escape(a.metric)}</td><td class='num'>{figs}</td><td>{verdict}</td></tr>")
    return f"""<h2>The same configuration in several notebooks</h2>
<p class="muted">Each figure ± its spread: the repetitions' and how far the run's reference moved while it was
measured. Agree: every two figures within twice their combined spreads; ⚠ differ: the machine moved between the
runs by more than their references saw.</p>
<table>
<thead><tr><th>scenario</th><th>setup</th><th>metric</th><th>measured</th><th>verdict</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody>
</table>
"""


def _href(rel: str) -> str:
    return escape(quote(rel, safe="/#"))


_INDEX_CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-size: 0.92em; }
th, td { border-bottom: 1px solid #ddd; padding: 0.35em 0.7em; text-align: left; vertical-align: top;
         max-width: 24em; overflow-wrap: anywhere; }
th { background: #f4f4f4; white-space: nowrap; overflow-wrap: normal; word-break: keep-all; }
.off { color: #b00020; font-weight: 600; }
td.finding { font-size: 0.85em; max-width: 28em; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.ok { color: #176f2c; font-weight: 600; }
.fail { color: #b00020; font-weight: 600; }
.reason { color: #555; font-size: 0.9em; max-width: 40em; }
.muted { color: #777; }
td.conf { font-size: 0.85em; color: #333; max-width: 22em; }
"""


def index_html(results: Sequence[RunResult], wall_s: float) -> str:
    """The index page: one row per run, everything escaped, no script."""
    n_fail = sum(not r.ok for r in results)
    n_cached = sum(r.cached for r in results)
    run_sum = sum(r.duration_s for r in results)
    rows = []
    nodes = any(r.node for r in results)   # the column only when an engine said where runs ran
    for i, r in enumerate(results, 1):
        h = r.headline or {}
        status_cls = "ok" if r.ok else "fail"
        partial = r.ok and h.get("partial")
        status = escape(r.status) + (" (partial)" if partial else "") \
            + (" <span class='muted'>(cached)</span>" if r.cached else "")
        cell = f"<span class='{status_cls}'>{status}</span>"
        if r.reason:
            cell += f"<div class='reason'>{escape(r.reason)}</div>"
        if partial:
            cell += f"<div class='reason'>{escape(h['partial'])}</div>"
        if r.failure_link:
            cell += f"<div><a href='{_href(r.failure_link)}'>failing cell</a></div>"
        links = []
        if r.report:
            links.append(f"<a href='{_href(r.report)}'>report</a>")
        if r.reader:
            links.append(f"<a href='{_href(r.reader)}'>reader</a>")
        if r.executed:
            links.append(f"<a href='{_href(r.executed)}'>notebook</a>")
        if r.kernel_log and not r.ok:
            links.append(f"<a href='{_href(r.kernel_log)}'>kernel log</a>")
        model = escape(r.model)
        if h.get("model") and h.get("model") != r.model:
            model += f"<div class='muted'>{escape(h['model'])}</div>"
        metric = f"<div class='muted'>{escape(h['metric'])}</div>" if h.get("metric") else ""
        rows.append(
            "<tr>"
            f"<td class='num'>{i}</td><td>{escape(r.scenario)}<div class='muted'>{escape(r.params)}</div></td>"
            f"<td>{model}</td><td>{escape(r.device)}</td><td>{escape(Path(r.notebook).stem)}</td>"
            f"<td>{cell}</td><td class='num'>{escape(format_duration(r.duration_s))}</td>"
            f"<td class='conf'>{escape(h.get('configuration') or '—')}</td>"
            f"<td class='num'>{_measured_cell(h)}{metric}</td>"
            f"<td class='num'>{escape(format_tps(h.get('predicted_tok_s')))}</td>"
            f"<td class='num'>{_reference_cell(h)}</td>"
            f"<td class='num'>{_error_cell(h)}</td><td class='num'>{escape(_ratio(h))}</td>"
            f"<td class='finding'>{escape(h.get('finding') or '—')}</td><td>{' · '.join(links) or '—'}</td>"
            + (f"<td class='conf'>{escape(r.node or '—')}</td>" if nodes else "") +
            "</tr>")
    summary = (f"{len(results)} run{'s' if len(results) != 1 else ''}, {len(results) - n_fail} ok, {n_fail} failed"
               + (f", {n_cached} unchanged (not re-run)" if n_cached else "")
               + f". Batch wall time {format_duration(wall_s)}; run time of the listed runs "
               f"{format_duration(run_sum)}.")
    node_th = "<th>node</th>" if nodes else ""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{escape(CSP)}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>v100lab batch reports</title>
<style>{_INDEX_CSS}</style>
</head>
<body>
<h1>v100lab batch reports</h1>
<p>{escape(summary)}</p>
<p class="muted">Generated {escape(_now())} by v100lab {escape(__version__)}. Headline: the figure each
notebook publishes (decode tok/s unless marked), measured on this machine vs predicted for the same model and
configuration (the configuration column: model, depth, flags, threads), ± the spread of the repetitions. Error: the
median of predicted / measured − 1 over every point the notebook measured (⚠ beyond ±15 %); ratio: measured /
predicted at the headline's point; finding: what the notebook found, in one line. "ok (partial)": the notebook ran,
but measured nothing, for the reason given. Reference: one small fixed configuration (the default model, a short
decode, the scenario's threads) decoded at the run's start and after each step that measured speeds, tok/s, first
→ last; ⚠ when it moved beyond its noise; × its calibration's prediction. The ± of a measured figure includes how
far the reference moved while it was measured.</p>
<table>
<thead><tr><th>#</th><th>scenario</th><th>model</th><th>device</th><th>notebook</th><th>status</th>
<th>duration</th><th>configuration</th>
<th>measured</th><th>predicted</th><th>reference</th><th>error</th><th>ratio</th><th>finding</th><th>links</th>{node_th}</tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody>
</table>
{_agreement_html(agreements(results))}
</body>
</html>
"""


def write_index(out_dir: str | os.PathLike, results: Sequence[RunResult], wall_s: float) -> Path:
    return write_atomic(Path(out_dir) / "index.html", index_html(results, wall_s), what="batch index",
                        error=OutputError)


def summary_rows(results: Iterable[RunResult]) -> list[dict[str, Any]]:
    """One plain dict per run, for the command's summary table and --json."""
    rows = []
    for r in results:
        h = r.headline or {}
        rows.append({"scenario": r.scenario, "notebook": Path(r.notebook).stem, "status": r.status,
                     "cached": r.cached, "duration_s": r.duration_s,
                     "measured_tok_s": h.get("measured_tok_s"), "predicted_tok_s": h.get("predicted_tok_s"),
                     "sd": h.get("sd"), "median_error": h.get("median_error"), "finding": h.get("finding") or "",
                     "configuration": h.get("configuration") or "", "partial": h.get("partial") or "",
                     "reference": h.get("reference"),
                     "reason": r.reason, "report": r.report, "reader": r.reader, "executed": r.executed,
                     "node": r.node})
    return rows


if __name__ == "__main__":   # python -m v100lab.workbook.runner [NOTEBOOK ...]: rewrite the parameters cells
    import sys

    for changed in sync_notebooks(sys.argv[1:] or DEFAULT_NOTEBOOKS):
        print(f"rewrote the parameters cell of {changed}")

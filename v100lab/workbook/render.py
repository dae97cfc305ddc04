"""Safe display helpers: every string from a model file or a parameter file is escaped where it is shown.

Model names, chat templates and any other GGUF metadata, and every value of a parameter file, are
*untrusted text*: a file downloaded from a hub can carry ``<script>`` or ``<img onerror=...>``. Exported
reports are meant to be sent to other people, so nothing from those sources may reach HTML unescaped.
Notebooks display such strings only through these helpers:

* ``md(template, **values)`` — Markdown whose *template* is trusted (written in the notebook) and whose
  *values* are escaped for both Markdown (backslash before every punctuation character that Markdown
  gives a meaning to, newlines folded) and HTML (``< > & " '`` as entities; nbconvert's and JupyterLab's
  Markdown renderers pass raw HTML through, so Markdown escaping alone would not be enough).
* ``html(template, **values)`` — the same for an HTML template (values HTML-escaped).
* ``title(text)`` — a heading; ``code(text)`` — a ``<pre>`` block (chat templates); ``table(df)`` —
  a DataFrame as HTML with every header, index label and cell escaped (pandas ``to_html(escape=True)``);
  ``kv_table(mapping)`` — metadata as a two-column table.
* ``mpl_text(value)`` — a string for matplotlib titles, labels and legends. Text drawn into a PNG is
  pixels, so it cannot run in a browser (the inline backend's default format is PNG, and the
  workbook keeps it). An SVG figure is embedded in the report as markup; matplotlib's SVG backend
  escapes text and the comments it writes beside glyph paths (checked by a test with matplotlib
  3.11). Either way ``$`` would make mathtext parse a model name as math (or fail to draw):
  ``mpl_text`` escapes it.

Terminal output (the command line) has its own hazard: a model name or a log line holding ESC sequences
can recolour, retitle or rewrite the terminal. ``term_text(value, limit=None)`` (from
:mod:`v100lab.base.safeio`) escapes every control character (``\\x1b``) and shortens with an ellipsis; every
command prints untrusted strings through it.

Plain ``print()`` output and tracebacks are escaped by nbconvert itself (as ``text/plain``), and so is a
DataFrame shown as a cell's last expression (pandas escapes by default); raw ``IPython.display.HTML`` or
``Markdown`` built by string concatenation is what these helpers replace.
"""

from __future__ import annotations

import html as _html
import math
import numbers
import re
import shlex
import string
from typing import Any, Iterable, Mapping

from v100lab.base.errors import ConfigError
from v100lab.base.safeio import shorten, term_text, shell_word

# the MIME type of the headline a notebook publishes (:func:`publish_headline`), which the batch reads back
HEADLINE_MIME = "application/vnd.v100lab.headline+json"

# CommonMark lets a backslash escape any ASCII punctuation character. These are the ones that can
# start or end Markdown syntax (emphasis, links, images, code, headings, lists, tables, math,
# autolinks). "&", "<", ">", '"' and "'" are left to the HTML escaping that follows, so the entities
# it writes are not broken up by backslashes.
_MD_PUNCT = re.compile(r"([\\`*_{}\[\]()#+\-.!|~$:=^])")
_NEWLINES = re.compile(r"\s*[\r\n]+\s*")


def escape(value: Any) -> str:
    """HTML-escape ``str(value)``, quotes included (safe in text and in quoted attributes)."""
    return _html.escape("" if value is None else str(value), quote=True)


def md_escape(value: Any) -> str:
    """Escape ``str(value)`` for use inside Markdown that is rendered to HTML (inline: newlines fold)."""
    text = _NEWLINES.sub(" ", "" if value is None else str(value))
    return escape(_MD_PUNCT.sub(r"\\\1", text))


class _EscapingFormatter(string.Formatter):
    """``str.format`` whose substituted fields are escaped after formatting (so ``{x:.1f}`` works)."""

    def __init__(self, escaper):
        self._escaper = escaper

    def format_field(self, value, format_spec):
        return self._escaper(format(value, format_spec))


_MD = _EscapingFormatter(md_escape)
_HTML = _EscapingFormatter(escape)


def md_text(template: str, /, **values: Any) -> str:
    """The Markdown text of ``md`` (for callers that assemble a larger document)."""
    return _MD.format(template, **values)


def md(template: str, /, **values: Any):
    """``IPython.display.Markdown`` of ``template.format(**values)`` with every value escaped.

    Example: ``md("Model **{name}** decodes at {tps:.1f} tok/s", name=spec.name, tps=42.0)``.
    """
    from IPython.display import Markdown  # optional dependency: IPython (only a notebook displays it)

    return Markdown(md_text(template, **values))


def html_text(template: str, /, **values: Any) -> str:
    return _HTML.format(template, **values)


def html(template: str, /, **values: Any):
    """``IPython.display.HTML`` of ``template.format(**values)`` with every value HTML-escaped."""
    from IPython.display import HTML  # optional dependency: IPython (only a notebook displays it)

    return HTML(html_text(template, **values))


def title(text: Any, level: int = 2):
    """A heading whose text is escaped."""
    from IPython.display import HTML  # optional dependency: IPython (only a notebook displays it)

    if level not in range(1, 7):
        raise ValueError(f"heading level must be 1..6, got {level}")
    return HTML(f"<h{level}>{escape(text)}</h{level}>")


def code(text: Any, max_chars: int | None = 20000):
    """A ``<pre>`` block of escaped text (chat templates, logs); long text is cut with a note."""
    from IPython.display import HTML  # optional dependency: IPython (only a notebook displays it)

    body = "" if text is None else str(text)
    note = ""
    if max_chars is not None and len(body) > max_chars:
        note = f"\n… ({len(body) - max_chars} more characters not shown)"
        body = body[:max_chars]
    return HTML(f"<pre>{escape(body)}{escape(note)}</pre>")


def table_html(data, *, index: bool = False, caption: Any = None, float_format: str | None = None,
               max_rows: int | None = None, max_colwidth: int | None = 200) -> str:
    """Escaped HTML for a DataFrame (or anything ``pandas.DataFrame()`` accepts); missing values show as "—"."""
    import pandas as pd  # heavy third-party dependency

    df = data if isinstance(data, pd.DataFrame) else pd.DataFrame(data)
    fmt = (lambda x: format(x, float_format)) if float_format else None
    with pd.option_context("display.max_colwidth", max_colwidth):
        body = df.to_html(escape=True, index=index, float_format=fmt, max_rows=max_rows, border=0,
                          classes="v100lab-table", render_links=False, notebook=False, na_rep="—")
    head = f"<p><b>{escape(caption)}</b></p>\n" if caption is not None else ""
    return head + body


def table(data, **kwargs):
    """``IPython.display.HTML`` of ``table_html(data, **kwargs)``."""
    from IPython.display import HTML  # optional dependency: IPython (only a notebook displays it)

    return HTML(table_html(data, **kwargs))


def _short(value: Any, limit: int) -> str:
    if isinstance(value, (list, tuple)):
        head = ", ".join(map(str, value[:8]))
        text = f"[{head}{', …' if len(value) > 8 else ''}] ({len(value)} items)"
    else:
        text = str(value)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more characters)"


def kv_table(mapping: Mapping[str, Any] | Iterable[tuple[str, Any]], *, key: str = "key",
             value: str = "value", limit: int = 300, caption: Any = None):
    """Metadata as an escaped two-column table; long values and arrays are shortened."""
    items = mapping.items() if isinstance(mapping, Mapping) else mapping
    rows = [{key: str(k), value: _short(v, limit)} for k, v in items]
    return table(rows, caption=caption)


def mpl_text(value: Any) -> str:
    """A string safe for matplotlib text: ``$`` escaped so mathtext never parses it.

    PNG figures (the inline backend's default) are pixels and carry no markup; this guards the
    figure itself (a model name with two ``$`` would render as math or fail to draw).
    """
    return ("" if value is None else str(value)).replace("$", r"\$")


# ------------------------------------------------------------------------------------------------
# presentation helpers for the notebooks: tables whose prose reads left to right, commands that never wrap
# ------------------------------------------------------------------------------------------------

_LEFT = "text-align: left; vertical-align: top;"
_RIGHT = "text-align: right; vertical-align: top; font-variant-numeric: tabular-nums;"
_CODE = "font-family: monospace; white-space: pre;"


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, bool)


def text_table_html(data, *, code: Iterable[str] = (), caption: Any = None, float_format: str = ",.2f",
                    max_rows: int | None = 200) -> str:
    """Escaped HTML for a DataFrame whose columns are mostly prose: text left-aligned (notebook themes
    right-align every cell), numbers right-aligned, and the ``code`` columns (flags, commands) in monospace
    that never wraps mid-flag. Every header and cell is escaped; missing values show as "—"."""
    import pandas as pd  # heavy third-party dependency

    df = data if isinstance(data, pd.DataFrame) else pd.DataFrame(data)
    code = set(code)
    if max_rows is not None and len(df) > max_rows:
        df = df.head(max_rows)
    numeric = {c for c in df.columns if len(df) and all(_is_number(v) or v is None or
                                                        (isinstance(v, float) and math.isnan(v)) for v in df[c])}

    def cell(col, v) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            text = "—"
        elif _is_number(v) and not isinstance(v, numbers.Integral):
            text = format(v, float_format)
        else:
            text = str(v)
        style = (_RIGHT if col in numeric else _LEFT) + (_CODE if col in code else "")
        return f"<td style=\"{style}\">{escape(text)}</td>"

    head = "".join(f"<th style=\"{_RIGHT if c in numeric else _LEFT}\">{escape(c)}</th>" for c in df.columns)
    rows = "\n".join("<tr>" + "".join(cell(c, v) for c, v in zip(df.columns, r)) + "</tr>"
                     for r in df.itertuples(index=False, name=None))
    top = f"<p><b>{escape(caption)}</b></p>\n" if caption is not None else ""
    return (f"{top}<table class=\"v100lab-table\" style=\"border-collapse: collapse;\">\n"
            f"<thead><tr>{head}</tr></thead>\n<tbody>\n{rows}\n</tbody>\n</table>")


def text_table(data, **kwargs):
    """``IPython.display.HTML`` of :func:`text_table_html`."""
    from IPython.display import HTML  # optional dependency: IPython (only a notebook displays it)

    return HTML(text_table_html(data, **kwargs))


def command_lines(argv: Iterable[Any]) -> list[str]:
    """A command's arguments grouped for display: the program (and its first argument when that is not a flag),
    then one flag with its values per line — so a line break never falls inside a flag or between a flag and
    its value."""
    parts = [str(a) for a in argv]
    lines: list[list[str]] = []
    for a in parts:
        if not lines or (a.startswith("-") and not _negative_number(a)):
            lines.append([a])
        else:
            lines[-1].append(a)
    return [" ".join(shlex_quote(x) for x in line) for line in lines]


def _negative_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def shlex_quote(text: str) -> str:
    """A shell word as the reader would type it (:func:`v100lab.base.safeio.shell_word`: control characters
    escaped)."""
    return shell_word(text)


def command(argv: Iterable[Any] | str):
    """A command line as a block of monospace that never wraps: one flag and its value per line, continued with
    a backslash (a shell reads it as one command). ``argv``: a list of arguments, or a string split as a shell
    would. Escaped like every other helper here."""
    from IPython.display import HTML  # optional dependency: IPython (only a notebook displays it)

    args = shlex.split(argv) if isinstance(argv, str) else list(argv)
    lines = command_lines(args)
    body = " \\\n    ".join(lines)
    return HTML(f"<pre style=\"{_CODE} overflow-x: auto; text-align: left;\">{escape(body)}</pre>")


# --------------------------------------------------------------------------------------------
# the headline a notebook publishes
# --------------------------------------------------------------------------------------------

def _number(name: str, value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"publish_headline: {name} must be a finite number or None, got {value!r}")
    return float(value)


def headline_record(measured_tok_s: float | None, predicted_tok_s: float | None, *, metric: str = "tg",
                    model: str = "", device: str = "", note: str = "", configuration: str = "",
                    partial: str = "", unit: str = "tok/s", sd: float | None = None,
                    median_error: float | None = None, worst_error: float | None = None, points: int = 0,
                    finding: str = "", sd_repetitions: float | None = None,
                    reference: dict[str, Any] | None = None,
                    measured_points: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The headline as a plain dict (what ``publish_headline`` displays). ``configuration``: the conditions
    both figures are for (flags, depth, threads); ``partial``: why the notebook measured nothing, when it did
    not (the index shows "ok (partial)" with it); ``unit`` of the two figures; ``sd``: the measured figure's
    spread; ``median_error``/``worst_error`` (predicted / measured − 1) over ``points`` measured points;
    ``finding``: one line of what the notebook found; ``sd_repetitions``: the repetitions' own spread when ``sd``
    includes the drift between the run's references; ``reference``: the run's start and end references and their
    shift (:func:`v100lab.workbook.levers.steps.reference_end`); ``measured_points``: every measured figure by
    setup (:func:`v100lab.workbook.levers.steps.measured_points`), which the batch index compares across notebooks."""
    if isinstance(points, bool) or not isinstance(points, int) or points < 0:
        raise ConfigError(f"publish_headline: points must be a count, got {points!r}")
    return {"metric": str(metric), "measured_tok_s": _number("measured_tok_s", measured_tok_s),
            "predicted_tok_s": _number("predicted_tok_s", predicted_tok_s), "model": str(model),
            "device": str(device), "note": str(note), "configuration": str(configuration), "partial": str(partial),
            "unit": str(unit), "sd": _number("sd", sd), "median_error": _number("median_error", median_error),
            "worst_error": _number("worst_error", worst_error), "points": points, "finding": str(finding),
            "sd_repetitions": _number("sd_repetitions", sd_repetitions),
            "reference": dict(reference) if reference else None,
            "measured_points": [dict(p) for p in measured_points or ()]}


#: a machine this far from its calibration (its base rung's ratio) is flagged beside every comparison
MACHINE_BAND = 0.15


def machine_text(m: dict[str, Any] | None) -> str:
    """A run's machine check in words: "calibration's Q4_0 rung at ×0.83 of its calibration figure (prompt ×0.90):
    beyond the drift check's tolerance, predictions not rescaled"; "" without one."""
    if not m or not m.get("tg"):
        return ""
    pp = f" (prompt ×{m['pp']:.2f})" if m.get("pp") else ""
    verdict = ("beyond the drift check's tolerance, predictions not rescaled (v100lab calibrate --check would)"
               if m.get("moved") else "within the drift check's tolerance")
    when = f", checked {m['measured_at']}" if m.get("measured_at") else ""
    return f"calibration's Q4_0 rung at ×{m['tg']:.2f} of its calibration figure{pp}{when}: {verdict}"


def reference_text(rec: dict[str, Any] | None) -> str:
    """A reference record in words: "SmolLM2-135M-Instruct.Q4_1.gguf tg32 -t 2: 170.1 ± 2.1 tok/s (predicted 165.0:
    ×1.03); calibration's Q4_0 rung at ×0.98 …"; "not measured" for None."""
    if not rec:
        return "not measured"
    pred = rec.get("predicted_tps")
    machine = machine_text(rec.get("machine"))
    return (f"{rec.get('model')} {rec.get('test')} -t {rec.get('threads')}: {rec['tps']:,.1f} ± {rec.get('sd') or 0:,.1f} "
            "tok/s" + (f" (predicted {pred:,.1f}: ×{rec['tps'] / pred:.2f})" if pred else "")
            + (f"; {machine}" if machine else ""))


def reference_shift_text(ref: dict[str, Any] | None) -> str:
    """The run's references in one clause: "reference 170.1 → 150.3 tok/s (−11.6 %, moved beyond its noise: the
    spreads include it)" or "… (+1.2 %, within its noise)", and where the machine stood against its calibration;
    "" without both."""
    if not ref or not ref.get("end") or not ref.get("shift"):
        return ""
    s, e, sh = ref["start"], ref["end"], ref["shift"]
    verdict = ("moved beyond its noise: the spreads include it, predictions stand against a moving machine"
               if sh.get("moved") else "within its noise")
    mr = ref.get("machine_ratio")
    if not mr:
        machine = ""
    else:
        machine = (f"; the machine at ×{mr:.2f} of its calibration at the start"
                   + (" (beyond ±15 %: every prediction of this run is off by about that much before the model's own "
                      "error)" if abs(mr - 1) > MACHINE_BAND else ""))
    return (f"reference {s['tps']:,.1f} → {e['tps']:,.1f} tok/s ({100 * (sh['ratio'] - 1):+.1f} %, {verdict})"
            + machine)


def headline_text(h: dict[str, Any]) -> str:
    unit = h.get("unit") or "tok/s"

    def f(x):
        return "—" if x is None else f"{x:,.{1 if abs(x) >= 1 else 3}f} {unit}"
    who = " · ".join(x for x in (h.get("model"), h.get("device")) if x)
    m, sd = h.get("measured_tok_s"), h.get("sd")
    spread = f" ± {sd:,.{1 if abs(m) >= 1 else 3}f}" if sd is not None and m is not None else ""
    med = (f" · median error {100 * h['median_error']:+.0f} % over {h.get('points')} point(s)"
           if h.get("median_error") is not None else "")
    return (f"headline ({h.get('metric')}): measured {f(h.get('measured_tok_s'))}{spread} vs predicted "
            f"{f(h.get('predicted_tok_s'))}" + med + (f" · {who}" if who else "")
            + (f" · {h['finding']}" if h.get("finding") else "")
            + (f" · {h['configuration']}" if h.get("configuration") else "")
            + (f" · {h['note']}" if h.get("note") else "")
            + (f" · {reference_shift_text(h.get('reference'))}" if reference_shift_text(h.get("reference")) else "")
            + (f" · partial: {h['partial']}" if h.get("partial") else ""))


def publish_headline(measured_tok_s: float | None, predicted_tok_s: float | None, *, metric: str = "tg",
                     model: str = "", device: str = "", note: str = "", configuration: str = "",
                     partial: str = "", **figures) -> dict[str, Any]:
    """Display this notebook's headline figure (read back by the batch index).

    ``metric`` names what the figures are ("tg" decode, "pp" prompt processing). The output is a
    ``text/plain`` line for people plus the JSON under ``HEADLINE_MIME`` for the batch.
    """
    record = headline_record(measured_tok_s, predicted_tok_s, metric=metric, model=model, device=device,
                             note=note, configuration=configuration, partial=partial, **figures)
    from IPython.display import display  # optional dependency: IPython (only a notebook displays it)

    display({HEADLINE_MIME: record, "text/plain": headline_text(record)}, raw=True)
    return record

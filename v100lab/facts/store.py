"""The JSONL results store: one measurement row per line, never lost, never duplicated.

Why a line-per-row file and not a database: a sweep can run for hours and may be killed (kill -9, an
out-of-memory killer, a closed laptop). Each row is appended, flushed and fsync'ed before the next
configuration starts, so everything measured before the kill is on disk; the only thing a kill can leave
is a *torn last line* (a row half-written). Nothing already in the file is ever removed or rewritten: a
tail after the last newline (a complete row an editor left without its newline, a torn row, a note the
user typed) is kept, and the next append writes the missing newline first (with a warning when the tail
is not a row). A failed append (a full disk) removes the bytes it wrote, so no partial row is left.

Nothing in the file can stop a resume: a line that does not parse, or a row of unexpected shape (a list,
a string where a number belongs, no ``key``), is reported as a logging warning with its line number and
skipped (:func:`row_problem` says what is wrong), and every other row is used.

Before a sweep measures anything, :func:`check_writable` makes sure its rows can be stored (the path is
creatable and writable, its folder is a folder, the sidecar folder is usable) — creating nothing, so a
refusal leaves no trace.

Resume: every row carries a ``key`` (a hash of what was measured: model header, backend, run config, test,
depth, repetitions). A sweep asks :meth:`ResultsStore.done_keys` and skips keys already recorded with
status ``ok``; a configuration recorded as ``failed`` is tried again (the failure may have been transient)
and its new row is appended — :meth:`ResultsStore.latest` gives one row per key, preferring ``ok``.

Bulky per-run data goes to sidecar files in ``<results>.runs/``, written before the row so a row never points
at a missing file: llama.cpp's raw log once per model load (``<load_id>.log``, row field ``log_file``) and the
monitor's sample series per row (``<run_id>.monitor.json``, row field ``monitor_file``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import stat
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator, Mapping

from v100lab.base.errors import V100labError
from v100lab.base.safeio import check_creatable, term_text, write_atomic

log = logging.getLogger(__name__)

MAX_TAIL_CHECK_BYTES = 64 << 20   # a tail without a newline larger than this is not parsed (only kept)

# what a stored row's fields must be when present (None is always allowed); "ok" rows need the speeds
_NUMBER_FIELDS = ("avg_ts", "stddev_ts", "avg_ns", "stddev_ns", "cv")
_INT_FIELDS = ("n_prompt", "n_gen", "n_depth", "repetitions")
_STR_FIELDS = ("status", "log_file", "monitor_file", "run_id", "load_id", "test", "backend")
_LIST_FIELDS = ("samples_ts", "samples_ns")
_OK_NEEDS = ("avg_ts",)


class StoreError(V100labError):
    """A results file that cannot be written (a path that is a folder, a parent that is a file, no
    permission, a full disk)."""


def row_key(row: Mapping[str, Any]) -> str:
    """The identity of a measurement: what was measured, not how it turned out.

    Two rows with the same key measured the same model file (by header hash and size) with the same backend,
    run config, test, depth and number of repetitions.
    """
    ident = {
        "model": row.get("model_header_sha256") or row.get("model_filename"),
        "model_file_size": row.get("model_file_size"),
        "backend": row.get("backend"),
        "config": row.get("config"),
        "n_prompt": row.get("n_prompt"),
        "n_gen": row.get("n_gen"),
        "n_depth": row.get("n_depth"),
        "repetitions": row.get("repetitions"),
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def row_problem(row: Any) -> str | None:
    """What makes a stored row unusable (None when it is fine): not an object, no string ``key``, a field
    of the wrong type (a string for ``avg_ts``, a list for ``status``), or an "ok" row without its speeds."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    key = row.get("key")
    if not isinstance(key, str) or not key:
        return "no 'key' (a non-empty string)" if key is None else f"'key' is a {type(key).__name__}, not a string"
    for name in _STR_FIELDS:
        if row.get(name) is not None and not isinstance(row[name], str):
            return f"'{name}' is a {type(row[name]).__name__}, not a string"
    for name in _NUMBER_FIELDS:
        if row.get(name) is not None and not _is_number(row[name]):
            return f"'{name}' is {_short(row[name])}, not a finite number"
    for name in _INT_FIELDS:
        v = row.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            return f"'{name}' is {_short(v)}, not an integer"
    for name in _LIST_FIELDS:
        v = row.get(name)
        if v is not None and (not isinstance(v, list) or not all(_is_number(x) for x in v)):
            return f"'{name}' is not a list of numbers"
    if row.get("config") is not None and not isinstance(row["config"], dict):
        return f"'config' is a {type(row['config']).__name__}, not an object"
    if row.get("status") == "ok":
        missing = [n for n in _OK_NEEDS if row.get(n) is None]
        if missing:
            return f"status 'ok' without {', '.join(missing)}"
    return None


def _short(v) -> str:
    text = json.dumps(v, default=str) if not isinstance(v, str) else repr(v)
    return term_text(text, limit=40)


def check_writable(path: str | os.PathLike) -> Path:
    """Make sure rows can be appended to the results file at ``path`` — before anything is measured.

    Raises :class:`StoreError` (one line) when the path is a folder or a special file, a parent on the way
    is a file, the file or the folder that would hold it is not writable, or the sidecar folder
    ``<path>.runs`` is not a writable folder. Creates nothing (no file, no folder), so a refusal leaves no
    trace. Returns the path.
    """
    p = Path(path)
    check_creatable(p, what="results file", error=StoreError)
    check_creatable(p.with_name(p.name + ".runs"), what="results sidecar folder", error=StoreError, folder=True)
    return p


class ResultsStore:
    """Append-only JSONL file of result rows (see the module docstring)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._checked_tail = False

    def check_writable(self) -> None:
        """:func:`check_writable` for this store's path (call it before measuring)."""
        check_writable(self.path)

    # ---- writing ---------------------------------------------------------------------------
    @property
    def sidecar_dir(self) -> Path:
        return self.path.with_name(self.path.name + ".runs")

    def append(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """Write one row durably (flush + fsync) and return it as stored (sidecar fields replaced by a path)."""
        row = dict(row)
        row.setdefault("key", row_key(row))
        raw_log = row.pop("raw_log", None)
        series = row.pop("monitor_series", None)
        line = json.dumps(row, default=_json_default, allow_nan=False) + "\n"   # a bad row fails before any write
        try:
            if raw_log is not None or series is not None:
                self.sidecar_dir.mkdir(parents=True, exist_ok=True)
            if raw_log is not None:
                # one log per model load: every row of that load points at the same file (rewritten, so it
                # holds the longest version: later rows may add decode-time messages)
                name = f"{row.get('load_id') or row.get('run_id') or row['key']}.log"
                write_atomic(self.sidecar_dir / name, raw_log, what="run log", error=StoreError)
                row["log_file"] = f"{self.sidecar_dir.name}/{name}"
            if series is not None:
                name = f"{row.get('run_id') or row['key']}.monitor.json"
                write_atomic(self.sidecar_dir / name, json.dumps(series, default=_json_default),
                             what="monitor samples", error=StoreError)
                row["monitor_file"] = f"{self.sidecar_dir.name}/{name}"
            line = json.dumps(row, default=_json_default, allow_nan=False) + "\n"
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a+b", buffering=0) as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                try:
                    _append_line(f, line.encode())
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)
        except OSError as exc:
            raise StoreError(f"results file {term_text(self.path)}: cannot append a row "
                             f"({exc.strerror or exc})") from None
        return row

    # ---- reading ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows())

    def rows(self) -> list[dict[str, Any]]:
        """Every usable row in file order. A torn last line, a line that does not parse and a row of
        unexpected shape (see :func:`row_problem`) are skipped, each with a warning naming its line."""
        if not self.path.exists():
            return []
        data = _read_regular(self.path)
        out = []
        lines = data.split(b"\n")
        for i, raw in enumerate(lines):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except (ValueError, RecursionError):
                torn = i == len(lines) - 1
                log.warning("%s: skipping %s line %d", self.path, "a torn last" if torn else "an unreadable", i + 1)
                continue
            problem = row_problem(row)
            if problem:
                log.warning("%s: skipping line %d: %s", self.path, i + 1, problem)
                continue
            out.append(row)
        return out

    def done_keys(self) -> set[str]:
        """Keys recorded with status ``ok`` (what a resumed sweep skips)."""
        return {r["key"] for r in self.rows() if r.get("status") == "ok" and "key" in r}

    def latest(self) -> list[dict[str, Any]]:
        """One row per key: the last ``ok`` row if any, else the last row; in first-seen order."""
        best: dict[str, dict[str, Any]] = {}
        for r in self.rows():
            k = r.get("key") or row_key(r)
            prev = best.get(k)
            if prev is None or r.get("status") == "ok" or prev.get("status") != "ok":
                best[k] = r
        return list(best.values())

    def raw_log(self, row: Mapping[str, Any]) -> str | None:
        """llama.cpp's raw log for ``row``'s model load (None when it has none)."""
        p = self._side_path(row, "log_file")
        return p.read_text() if p else None

    def monitor_series(self, row: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """The monitor's samples while ``row``'s test ran (None when it has none)."""
        p = self._side_path(row, "monitor_file")
        return json.loads(p.read_text()) if p else None

    def _side_path(self, row: Mapping[str, Any], field: str) -> Path | None:
        """The sidecar file a row names, only inside ``<results>.runs/`` (a row cannot point elsewhere)."""
        rel = row.get(field)
        if not rel or not isinstance(rel, str):
            return None
        p = self.path.parent / rel
        try:
            inside = p.resolve().is_relative_to(self.sidecar_dir.resolve())
        except (OSError, ValueError):
            return None
        return p if inside and p.is_file() else None


def _append_line(f, line: bytes) -> None:
    """Append ``line`` to the locked file ``f`` after a newline, durably; on failure (a full disk) cut the
    file back to its size before, so only bytes this call wrote are removed and no partial row is left."""
    f.seek(0, os.SEEK_END)
    size = f.tell()
    data = memoryview(_tail_newline(f, size) + line)
    fd = f.fileno()
    try:
        while data:                                   # unbuffered: a short write is seen, not hidden in a buffer
            data = data[os.write(fd, data):]
        os.fsync(fd)
    except OSError:
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        except OSError:
            log.warning("%s: could not remove a partial row after a failed write", f.name)
        raise


def _tail_newline(f, size: int) -> bytes:
    """``b"\\n"`` when the file does not end with one (its last line is kept as it is), else ``b""``.

    An unterminated last line that parses as JSON is a row an editor left without its newline; one that
    does not (a torn write, a note) is kept too, with a warning saying where the new row goes."""
    if size == 0:
        return b""
    f.seek(size - 1)
    if f.read(1) == b"\n":
        return b""
    cut = _last_line_start(f, size)
    if size - cut > MAX_TAIL_CHECK_BYTES or not _parses(_read_at(f, cut, size - cut)):
        log.warning("%s: the last line (%d bytes at byte %d) is not a complete row (a torn write or text "
                    "added by hand); it is kept and the new row starts on the next line", f.name, size - cut, cut)
    f.seek(0, os.SEEK_END)
    return b"\n"


def _read_at(f, offset: int, n: int) -> bytes:
    f.seek(offset)
    return f.read(n)


def _read_regular(path: Path) -> bytes:
    """The whole results file; StoreError when it is not a regular file (a FIFO would block, /dev/zero
    would never end) or cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise StoreError(f"results file {term_text(path)}: cannot read it ({exc.strerror or exc})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StoreError(f"results file {term_text(path)} is not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    except OSError as exc:
        raise StoreError(f"results file {term_text(path)}: cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _last_line_start(f, size: int) -> int:
    """The offset just after the last newline before ``size`` (0 when there is none)."""
    pos, step = size, 1 << 16
    while pos > 0:
        start = max(0, pos - step)
        f.seek(start)
        i = f.read(pos - start).rfind(b"\n")
        if i >= 0:
            return start + i + 1
        pos = start
    return 0


def _parses(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return True


def _json_default(o):
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "as_dict"):
        return o.as_dict()
    if hasattr(o, "__dataclass_fields__"):

        return asdict(o)
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")

"""The JSONL results store: one measurement row per line, never lost, never duplicated.

Why a line-per-row file and not a database: a sweep can run for hours and may be killed (kill -9, an
out-of-memory killer, a closed laptop). Each row is appended, flushed and fsync'ed before the next
configuration starts, so everything measured before the kill is on disk; the only thing a kill can leave
is a *torn last line* (a row half-written). Readers skip a torn last line, and the next append truncates
it away first, so the file stays valid JSONL.

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
import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

log = logging.getLogger(__name__)


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


class ResultsStore:
    """Append-only JSONL file of result rows (see the module docstring)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._checked_tail = False

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
        if raw_log is not None or series is not None:
            self.sidecar_dir.mkdir(parents=True, exist_ok=True)
        if raw_log is not None:
            # one log per model load: every row of that load points at the same file (rewritten, so it
            # holds the longest version: later rows may add decode-time messages)
            name = f"{row.get('load_id') or row.get('run_id') or row['key']}.log"
            _write_durably(self.sidecar_dir / name, raw_log)
            row["log_file"] = f"{self.sidecar_dir.name}/{name}"
        if series is not None:
            name = f"{row.get('run_id') or row['key']}.monitor.json"
            _write_durably(self.sidecar_dir / name, json.dumps(series, default=_json_default))
            row["monitor_file"] = f"{self.sidecar_dir.name}/{name}"
        line = json.dumps(row, default=_json_default, allow_nan=False) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                self._drop_torn_tail(f)
                f.write(line.encode())
                f.flush()
                os.fsync(f.fileno())
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
        return row

    @staticmethod
    def _drop_torn_tail(f) -> None:
        """If the file does not end with a newline, the last line is a torn write: cut it off."""
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        # find the last newline; everything after it is the torn row
        pos = size
        step = 1 << 16
        cut = 0
        while pos > 0:
            start = max(0, pos - step)
            f.seek(start)
            chunk = f.read(pos - start)
            i = chunk.rfind(b"\n")
            if i >= 0:
                cut = start + i + 1
                break
            pos = start
        log.warning("%s: dropping a torn last line (%d bytes) left by an interrupted write", f.name, size - cut)
        f.truncate(cut)
        f.seek(0, os.SEEK_END)

    # ---- reading ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows())

    def rows(self) -> list[dict[str, Any]]:
        """Every complete row in file order (a torn or unreadable line is skipped with a warning)."""
        if not self.path.exists():
            return []
        out = []
        with open(self.path, "rb") as f:
            data = f.read()
        lines = data.split(b"\n")
        for i, raw in enumerate(lines):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except ValueError:
                torn = i == len(lines) - 1
                log.warning("%s: skipping %s line %d", self.path, "a torn last" if torn else "an unreadable", i + 1)
                continue
            if isinstance(row, dict):
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
        rel = row.get(field)
        if not rel:
            return None
        p = self.path.parent / rel
        return p if p.exists() else None


def _write_durably(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _json_default(o):
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "as_dict"):
        return o.as_dict()
    if hasattr(o, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(o)
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def write_rows(path: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> ResultsStore:
    """Append ``rows`` to the store at ``path`` (convenience for scripts)."""
    store = ResultsStore(path)
    for r in rows:
        store.append(r)
    return store

"""A results file survives every corruption without losing a complete row, and its path
is checked (creatable, writable) before anything is measured — creating nothing when it is refused."""

from __future__ import annotations

import json
import logging
import os

import pytest

from v100lab.base.errors import V100labError
from v100lab.facts.store import ResultsStore, StoreError, check_writable, row_problem, row_key


def _row(i, status="ok", **kw):
    r = {"model_header_sha256": "abc", "model_file_size": 10, "backend": "inprocess", "config": {"n_ctx": 256},
         "n_prompt": 0, "n_gen": 8, "n_depth": i, "repetitions": 2, "status": status, "avg_ts": 1.0 + i,
         "stddev_ts": 0.1}
    r.update(kw)
    return r


def _stored(p, rows):
    s = ResultsStore(p)
    for r in rows:
        s.append(r)
    return s


# ------------------------------------------------------------------------------------------------
# unterminated last lines: kept, whether they parse or not
# ------------------------------------------------------------------------------------------------

def test_complete_last_row_without_newline_is_kept(tmp_path):
    p = tmp_path / "r.jsonl"
    s = _stored(p, [_row(0), _row(1)])
    p.write_bytes(p.read_bytes().rstrip(b"\n"))                 # an editor dropped the final newline
    assert [r["n_depth"] for r in s.rows()] == [0, 1]
    s.append(_row(2))
    lines = p.read_text().splitlines()
    assert [json.loads(x)["n_depth"] for x in lines] == [0, 1, 2]  # nothing deleted, newline added
    assert p.read_bytes().endswith(b"\n")


def test_only_row_without_newline_is_kept(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps({**_row(0), "key": row_key(_row(0))}))  # a one-row file written by hand
    s = ResultsStore(p)
    s.append(_row(1))
    assert [r["n_depth"] for r in s.rows()] == [0, 1]


def test_torn_tail_is_kept_and_the_row_goes_after_it(tmp_path, caplog):
    p = tmp_path / "r.jsonl"
    s = _stored(p, [_row(0)])
    with open(p, "ab") as f:
        f.write(b'{"model_header_sha256": "abc", "n_dep')
    with caplog.at_level(logging.WARNING, logger="v100lab.facts.store"):
        assert [r["n_depth"] for r in s.rows()] == [0]
        s.append(_row(1))
    assert any("torn" in m and "kept" in m for m in caplog.messages)
    lines = p.read_text().splitlines()
    assert lines[1] == '{"model_header_sha256": "abc", "n_dep'
    assert [json.loads(lines[i])["n_depth"] for i in (0, 2)] == [0, 1]


def test_wrong_shape_last_line_without_newline_is_kept_not_cut(tmp_path):
    """A tail that parses (here a list) is not a torn write: it stays in the file (and is skipped)."""
    p = tmp_path / "r.jsonl"
    s = _stored(p, [_row(0)])
    with open(p, "ab") as f:
        f.write(b"[1, 2, 3]")
    s.append(_row(1))
    assert p.read_text().splitlines()[1] == "[1, 2, 3]"
    assert [r["n_depth"] for r in s.rows()] == [0, 1]


# ------------------------------------------------------------------------------------------------
# rows of unexpected shape: reported with the line number, skipped, never fatal
# ------------------------------------------------------------------------------------------------

BAD_LINES = {
    "list": ("[\"not\", \"a\", \"row\"]", "not an object"),
    "string avg_ts": (None, "'avg_ts' is"),
    "list key": (None, "'key' is a list"),
    "missing key": (None, "no 'key'"),
    "string n_depth": (None, "'n_depth' is"),
    "ok without avg_ts": (None, "without avg_ts"),
    "number": ("42", "not an object"),
    "unreadable": ("{not json", None),
    "NaN avg_ts": ('{"key": "k", "status": "ok", "avg_ts": NaN}', "not a finite number"),
}


def _bad(kind: str) -> str:
    line, _ = BAD_LINES[kind]
    if line is not None:
        return line
    good = {**_row(9), "key": "deadbeef"}
    if kind == "string avg_ts":
        good["avg_ts"] = "fast"
    elif kind == "list key":
        good["key"] = ["a"]
    elif kind == "missing key":
        del good["key"]
    elif kind == "string n_depth":
        good["n_depth"] = "3"
    elif kind == "ok without avg_ts":
        del good["avg_ts"]
    return json.dumps(good)


@pytest.mark.parametrize("kind", list(BAD_LINES))
def test_bad_row_is_reported_with_its_line_and_skipped(tmp_path, caplog, kind):
    p = tmp_path / "r.jsonl"
    _stored(p, [_row(0)])
    with open(p, "a") as f:
        f.write(_bad(kind) + "\n")
    s = _stored(p, [_row(1)])
    with caplog.at_level(logging.WARNING, logger="v100lab.facts.store"):
        rows = s.rows()
        done = s.done_keys()
        latest = s.latest()
    assert [r["n_depth"] for r in rows] == [0, 1]                 # both complete rows survive
    assert done == {row_key(_row(0)), row_key(_row(1))} and len(latest) == 2
    warned = [m for m in caplog.messages if "line 2" in m]
    assert warned, caplog.messages
    expect = BAD_LINES[kind][1]
    if expect:
        assert any(expect in m for m in warned), warned


def test_row_problem_accepts_what_append_writes(tmp_path):
    s = _stored(tmp_path / "r.jsonl", [_row(0), _row(1, status="failed", avg_ts=None, stddev_ts=None,
                                                     reason="oom", samples_ts=[])])
    assert all(row_problem(r) is None for r in s.rows()) and len(s.rows()) == 2


def test_sidecar_paths_cannot_point_outside(tmp_path):
    p = tmp_path / "r.jsonl"
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    s = ResultsStore(p)
    assert s.raw_log({"log_file": "../secret.txt"}) is None
    assert s.raw_log({"log_file": str(secret)}) is None
    assert s.raw_log({"log_file": ["a"]}) is None


# ------------------------------------------------------------------------------------------------
# the path is checked before anything runs, and a refusal creates nothing
# ------------------------------------------------------------------------------------------------

def _listing(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_parent_is_a_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    before = _listing(tmp_path)
    with pytest.raises(StoreError, match="is a file, not a folder") as ei:
        check_writable(tmp_path / "afile" / "sub" / "r.jsonl")
    assert isinstance(ei.value, V100labError) and "\n" not in str(ei.value)
    assert _listing(tmp_path) == before                          # no orphan .runs/ folder, nothing


def test_path_is_a_directory(tmp_path):
    (tmp_path / "d").mkdir()
    before = _listing(tmp_path)
    with pytest.raises(StoreError, match="is a folder"):
        check_writable(tmp_path / "d")
    assert _listing(tmp_path) == before


def test_sidecar_name_taken_by_a_file(tmp_path):
    (tmp_path / "r.jsonl.runs").write_text("x")
    with pytest.raises(StoreError, match="not a folder"):
        check_writable(tmp_path / "r.jsonl")


def test_fifo_is_not_a_results_file(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(StoreError, match="FIFO"):
        check_writable(tmp_path / "pipe")
    with pytest.raises(StoreError, match="not a regular file"):      # reading it does not block either
        ResultsStore(tmp_path / "pipe").rows()


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write a read-only file (os.access says so too)")
def test_read_only_file_and_folder(tmp_path):
    ro = tmp_path / "ro.jsonl"
    ro.write_text("")
    ro.chmod(0o444)
    with pytest.raises(StoreError, match="not writable"):
        check_writable(ro)
    d = tmp_path / "rodir"
    d.mkdir()
    d.chmod(0o555)
    try:
        with pytest.raises(StoreError, match="not writable"):
            check_writable(d / "new" / "r.jsonl")
        assert not (d / "new").exists()
    finally:
        d.chmod(0o755)


def test_creatable_paths_pass_and_create_nothing(tmp_path):
    assert check_writable(tmp_path / "a" / "b" / "r.jsonl") == tmp_path / "a" / "b" / "r.jsonl"
    assert _listing(tmp_path) == []
    s = _stored(tmp_path / "r.jsonl", [_row(0)])
    s.check_writable()                                             # an existing store passes too


def test_append_failure_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(StoreError) as ei:
        ResultsStore(tmp_path / "afile" / "r.jsonl").append(_row(0))
    assert "\n" not in str(ei.value) and "cannot append" in str(ei.value)

"""The JSONL results store: durable appends, torn last lines, resume keys, sidecar files."""

from __future__ import annotations

import json

from v100lab.facts.store import ResultsStore, row_key


def _row(i, status="ok", **kw):
    r = {"model_header_sha256": "abc", "model_file_size": 10, "backend": "inprocess", "config": {"n_ctx": 256},
         "n_prompt": 0, "n_gen": 8, "n_depth": i, "repetitions": 2, "status": status, "avg_ts": 1.0 + i}
    r.update(kw)
    return r


def test_append_and_read_back(tmp_path):
    s = ResultsStore(tmp_path / "r.jsonl")
    assert s.rows() == [] and s.done_keys() == set()
    for i in range(3):
        s.append(_row(i))
    rows = s.rows()
    assert [r["n_depth"] for r in rows] == [0, 1, 2]
    assert all(r["key"] == row_key(_row(r["n_depth"])) for r in rows)
    assert len(s.done_keys()) == 3
    assert all(line.endswith("}") for line in (tmp_path / "r.jsonl").read_text().splitlines())


def test_key_ignores_outcome_but_not_what_was_measured():
    assert row_key(_row(1)) == row_key(_row(1, status="failed", avg_ts=None))
    assert row_key(_row(1)) != row_key(_row(2))
    assert row_key(_row(1)) != row_key(_row(1, repetitions=5))
    assert row_key(_row(1)) != row_key(_row(1, config={"n_ctx": 512}))
    assert row_key(_row(1)) != row_key(_row(1, backend="server:http://127.0.0.1:1"))


def test_torn_last_line_is_skipped_and_kept(tmp_path):
    p = tmp_path / "r.jsonl"
    s = ResultsStore(p)
    s.append(_row(0))
    s.append(_row(1))
    with open(p, "ab") as f:                      # what kill -9 in the middle of a write leaves
        f.write(b'{"model_header_sha256": "abc", "n_depth": 2, "sta')
    assert [r["n_depth"] for r in s.rows()] == [0, 1]
    before = p.read_bytes()
    s.append(_row(3))
    assert p.read_bytes().startswith(before + b"\n")      # never cut: the new row goes on the next line
    lines = p.read_text().splitlines()
    assert len(lines) == 4 and lines[2].endswith('"sta')
    assert [r["n_depth"] for r in s.rows()] == [0, 1, 3]


def test_failed_rows_are_not_done_and_latest_prefers_ok(tmp_path):
    s = ResultsStore(tmp_path / "r.jsonl")
    s.append(_row(0, status="failed", reason="oom"))
    assert s.done_keys() == set()
    s.append(_row(0))
    s.append(_row(0, status="failed", reason="later failure"))
    latest = s.latest()
    assert len(latest) == 1 and latest[0]["status"] == "ok"
    assert len(s.rows()) == 3


def test_sidecars_hold_raw_log_and_series(tmp_path):
    s = ResultsStore(tmp_path / "r.jsonl")
    stored = s.append(_row(0, raw_log="llama_context: n_ctx = 256\n", load_id="L1", run_id="R1",
                           monitor_series=[{"t": 0.0, "rss_bytes": 1}]))
    assert "raw_log" not in stored and "monitor_series" not in stored
    line = json.loads((tmp_path / "r.jsonl").read_text())
    assert line["log_file"] == "r.jsonl.runs/L1.log" and line["monitor_file"] == "r.jsonl.runs/R1.monitor.json"
    assert s.raw_log(line) == "llama_context: n_ctx = 256\n"
    assert s.monitor_series(line) == [{"t": 0.0, "rss_bytes": 1}]
    # a second row of the same load points at the same (rewritten) log
    s.append(_row(1, raw_log="llama_context: n_ctx = 256\nmore\n", load_id="L1", run_id="R2"))
    assert s.raw_log(s.rows()[1]).endswith("more\n")
    assert s.raw_log(s.rows()[0]).endswith("more\n")

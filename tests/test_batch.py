"""``v100lab batch``: real papermill runs of small test notebooks (ok, raising, timing out, killing
their kernel), HTML reports, the index, re-runs. Kernel starts cost a few seconds each, so one batch
is shared by several tests."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from v100lab.workbook import runner, render
from v100lab.cli import main as cli
from v100lab.base.errors import ConfigError

NB = Path(__file__).parent / "data" / "notebooks"


def _params(path: Path, **extra) -> Path:
    lines = ["scenario: batch-test", "model: default", "n_gen: 7", "n_prompt: 21"]
    lines += [f"{k}: {v}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    d = tmp_path_factory.mktemp("batch")
    params = _params(d / "bt.yaml")
    out = d / "out"
    started, finished = [], []
    result = runner.run_batch([params], [NB / "ok.ipynb", NB / "raise.ipynb", NB / "kill.ipynb"], out,
                                timeout=120, no_input=True,
                                on_start=lambda r, i, n: started.append((i, n)),
                                on_result=lambda r, i, n: finished.append(r.status))
    return {"result": result, "params": params, "out": out, "started": started, "finished": finished}


def _run(batch, stem) -> runner.RunResult:
    return next(r for r in batch["result"].runs if Path(r.notebook).stem == stem)


def test_every_run_recorded_and_failures_do_not_stop_the_batch(batch):
    res = batch["result"]
    assert [Path(r.notebook).stem for r in res.runs] == ["ok", "raise", "kill"]
    assert [r.status for r in res.runs] == ["ok", "error", "dead kernel"]
    assert batch["started"] == [(0, 3), (1, 3), (2, 3)] and batch["finished"] == ["ok", "error", "dead kernel"]
    assert not res.ok and len(res.failed) == 2
    assert all(r.duration_s > 0 and not r.cached for r in res.runs)


def test_ok_run_keeps_executed_notebook_reports_and_headline(batch):
    out, r = batch["out"], _run(batch, "ok")
    assert r.reason == "" and r.failure_link is None
    nb = nbformat.read(out / r.executed, as_version=4)
    # papermill injected the file's parameters after the parameters cell
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and "n_gen = 7" in injected[0].source
    assert r.headline["measured_tok_s"] == 7.0 and r.headline["predicted_tok_s"] == 21.0  # traced from params
    assert runner.read_headline(nb) == r.headline
    full = (out / r.report).read_text()
    reader = (out / r.reader).read_text()
    assert "publish_headline" in full and "publish_headline" not in reader  # reader: no code
    assert "headline (tg): measured 7.0 tok/s" in reader                    # outputs kept
    for html in (full, reader):
        assert "<script" not in html.lower()                                # self-contained, no script
        assert 'http-equiv="Content-Security-Policy"' in html
        assert not re.search(r"""(src|href)=["']https?://""", html)        # nothing fetched
    assert (out / r.kernel_log).exists()
    # the kernel ran in the batch's own interpreter (the venv's python3 kernel spec)
    printed = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if o.output_type == "stream")
    assert Path(sys.executable).resolve() in {Path(x).resolve() for x in printed.split()}
    record = json.loads((out / "bt" / "ok.run.json").read_text())
    assert record["status"] == "ok" and record["digest"] == runner.inputs_digest(batch["params"], NB / "ok.ipynb")


def test_cell_error_links_to_the_failing_cell(batch):
    out, r = batch["out"], _run(batch, "raise")
    assert r.reason == "ValueError: deliberate failure for the batch test"
    nb = nbformat.read(out / r.executed, as_version=4)
    assert "raise ValueError" in nb.cells[r.failed_cell].source
    assert r.failure_link == f"{r.report}#{runner.ERROR_ANCHOR}"
    assert f'id="{runner.ERROR_ANCHOR}"' in (out / r.report).read_text()
    assert r.headline is None


def test_dead_kernel_recorded_from_the_exception(batch):
    out, r = batch["out"], _run(batch, "kill")
    assert "kernel died" in r.reason
    nb = nbformat.read(out / r.executed, as_version=4)
    assert "os._exit" in nb.cells[r.failed_cell].source
    html = (out / r.report).read_text()
    assert f'id="{runner.ERROR_ANCHOR}"' in html and "kernel died" in html


def test_index_summarises_every_run(batch):
    out = batch["out"]
    html = (out / "index.html").read_text()
    assert "<script" not in html.lower() and "Content-Security-Policy" in html
    for stem in ("ok", "raise", "kill"):
        assert f"href='bt/{stem}.html'" in html
    assert "href='bt/ok.reader.html'" in html
    assert "href='bt/raise.html#papermill-error-cell'" in html
    assert "deliberate failure for the batch test" in html and "dead kernel" in html
    assert "batch-test" in html and ">7.0<" in html and ">21.0<" in html and ">0.33<" in html
    assert "Batch wall time" in html and "3 runs, 1 ok, 2 failed" in html


def test_rerun_skips_unchanged_ok_runs_and_reruns_the_rest(batch, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(batch["out"], out)
    ok_nb = out / "bt" / "ok.ipynb"
    mtime = ok_nb.stat().st_mtime_ns
    res = runner.run_batch([batch["params"]], [NB / "ok.ipynb", NB / "raise.ipynb"], out, timeout=120)
    ok, err = res.runs
    assert ok.cached and ok.status == "ok" and ok_nb.stat().st_mtime_ns == mtime
    assert ok.headline == _run(batch, "ok").headline
    assert not err.cached and err.status == "error"          # a failed run is never skipped
    assert "(cached)" in (out / "index.html").read_text()
    # --force runs it again
    forced = runner.run_batch([batch["params"]], [NB / "ok.ipynb"], out, timeout=120, force=True)
    assert not forced.runs[0].cached and ok_nb.stat().st_mtime_ns != mtime


def test_inputs_digest_tracks_params_notebook_and_version(tmp_path, monkeypatch):
    p = _params(tmp_path / "a.yaml")
    nb = tmp_path / "n.ipynb"
    shutil.copy(NB / "ok.ipynb", nb)
    d0 = runner.inputs_digest(p, nb)
    assert runner.inputs_digest(p, nb) == d0
    p.write_text(p.read_text() + "# a comment\n")
    d1 = runner.inputs_digest(p, nb)
    nb.write_text(nb.read_text().replace("plumbing only", "plumbing"))
    d2 = runner.inputs_digest(p, nb)
    monkeypatch.setattr(runner, "__version__", "99.0")
    d3 = runner.inputs_digest(p, nb)
    assert len({d0, d1, d2, d3}) == 4


def test_cli_timeout_run_json_and_exit_status(tmp_path, capsys):
    params = _params(tmp_path / "t.yaml")
    out = tmp_path / "out"
    rc = cli.main(["batch", str(params), "--notebooks", str(NB / "sleep.ipynb"), "--out", str(out),
                   "--timeout", "2", "--json"])
    captured = capsys.readouterr()
    assert rc == 1
    doc = json.loads(captured.out)           # stdout is one JSON document
    (run,) = doc["runs"]
    assert run["status"] == "timeout" and "2 s cell timeout" in run["reason"] and doc["ok"] is False
    assert "[timeout]" in captured.err       # the status line
    rec = json.loads((out / "t" / "sleep.run.json").read_text())
    nb = nbformat.read(out / rec["executed"], as_version=4)
    assert "time.sleep(600)" in nb.cells[rec["failed_cell"]].source
    assert f'id="{runner.ERROR_ANCHOR}"' in (out / rec["report"]).read_text()
    assert "t/sleep.html#papermill-error-cell" in (out / "index.html").read_text()


def test_cli_summary_table(batch, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(batch["out"], out)
    rc = cli.main(["batch", str(batch["params"]), "--notebooks", str(NB / "ok.ipynb"), "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0                           # the one run is ok (unchanged: not re-run)
    assert "scenario" in captured.out and "batch-test" in captured.out and "ok (cached)" in captured.out
    assert "1 run, 1 ok, 0 failed" in captured.out


@pytest.mark.parametrize("args, words", [
    (["--notebooks", "no/such/*.ipynb"], "no notebook matches"),
    (["--timeout", "-1"], "timeout"),
])
def test_cli_bad_input_exits_2(tmp_path, capsys, args, words):
    params = _params(tmp_path / "p.yaml")
    rc = cli.main(["batch", str(params), "--out", str(tmp_path / "o"), *args]
                  + ([] if "--notebooks" in args else ["--notebooks", str(NB / "ok.ipynb")]))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and words in err[-1]


def test_cli_invalid_params_file_exits_2_before_running(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("scenario: x\nn_ctxx: 5\n")
    out = tmp_path / "o"
    rc = cli.main(["batch", str(bad), "--notebooks", str(NB / "ok.ipynb"), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "n_ctxx" in err and "bad.yaml" in err
    assert not (out / "index.html").exists()


def test_plan_runs_folders_do_not_collide(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    p1, p2 = _params(tmp_path / "a" / "x.yaml"), _params(tmp_path / "b" / "x.yaml")
    runs = runner.plan_runs([p1, p2], [NB / "ok.ipynb"])
    assert [r.folder for r in runs] == ["x", "x-2"]
    with pytest.raises(ConfigError):
        runner.plan_runs([], [NB / "ok.ipynb"])


def test_headline_record_validates_numbers():
    h = render.headline_record(10, None, model="m")
    assert h["measured_tok_s"] == 10.0 and h["predicted_tok_s"] is None
    for bad in (math.nan, math.inf, True, "12"):
        with pytest.raises(ConfigError, match="measured_tok_s"):
            render.headline_record(bad, 1.0)
    assert "measured 10.0 tok/s vs predicted —" in render.headline_text(h)


def test_index_shows_the_configuration_and_partial_runs():
    """The index names each headline's configuration (model, depth, flags, threads) in a column of its own, and a
    notebook that ran but measured nothing is "ok (partial)" with the reason."""
    full = render.headline_record(30.0, 40.0, model="m", configuration="depth 1024 · -fa on · -c 2048 · -t 2")
    partial = render.headline_record(None, 39.1, model="m", configuration="-ngl 65",
                                       partial="this llama.cpp build has no GPU backend")
    runs = [runner.RunResult(params="p.yaml", notebook=f"{n}.ipynb", scenario="s", model="m", device="host",
                               status="ok", reason="", duration_s=1.0, started="", digest="", executed=None,
                               report=None, headline=h) for n, h in (("a", full), ("b", partial), ("c", None))]
    html = runner.index_html(runs, 3.0)
    assert "<th>configuration</th>" in html
    assert "depth 1024 · -fa on · -c 2048 · -t 2" in html
    assert html.count("ok (partial)") == 1 + html.count('"ok (partial)"'), "one partial run (and the legend)"
    row_b = html.split("<tr>")[3]
    assert "ok (partial)" in row_b and "no GPU backend" in row_b
    assert "partial" not in html.split("<tr>")[2] and "partial" not in html.split("<tr>")[4]
    rows = runner.summary_rows(runs)
    assert rows[1]["partial"] == "this llama.cpp build has no GPU backend" and rows[0]["partial"] == ""
    assert rows[0]["configuration"].startswith("depth 1024")
    assert "partial: this llama.cpp build" in render.headline_text(partial)


def test_read_headline_takes_the_last_one():
    nb = nbformat.v4.new_notebook()
    outs = [nbformat.v4.new_output("display_data", data={render.HEADLINE_MIME: render.headline_record(v, 2.0),
                                                         "text/plain": "x"}) for v in (1.0, 3.0)]
    cell = nbformat.v4.new_code_cell("x")
    cell.outputs = outs
    nb.cells = [cell]
    assert runner.read_headline(nb)["measured_tok_s"] == 3.0
    assert runner.read_headline(nbformat.v4.new_notebook()) is None


def test_plain_papermill_with_a_params_file(tmp_path):
    """The notebooks also run with papermill's own CLI and `-f params/...yaml` (the README shows it)."""
    papermill = Path(sys.executable).with_name("papermill")
    if not papermill.exists():
        pytest.skip("papermill's command is not installed beside this interpreter")
    out = tmp_path / "out.ipynb"
    ci = Path(__file__).resolve().parents[1] / "params" / "ci.yaml"
    proc = subprocess.run([str(papermill), str(NB / "ok.ipynb"), str(out), "-f", str(ci), "--no-progress-bar"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    from v100lab.workbook.scenario import load_scenario

    scn = load_scenario(ci)
    h = runner.read_headline(nbformat.read(out, as_version=4))
    assert h["measured_tok_s"] == scn.n_gen and h["predicted_tok_s"] == scn.n_prompt


def test_unreadable_notebook_is_a_failed_run_not_a_crash(tmp_path):
    bad = tmp_path / "broken.ipynb"
    bad.write_text("{ this is not a notebook")
    out = tmp_path / "out"
    res = runner.run_batch([_params(tmp_path / "p.yaml")], [bad], out)
    (r,) = res.runs
    assert r.status == "failed" and r.reason and r.report is None and r.executed is None
    html = (out / "index.html").read_text()
    assert "failed" in html and "broken" in html and not res.ok


def test_relative_out_dir_from_another_working_directory(tmp_path, monkeypatch):
    """The README's main command passes `--out reports`, relative to the checkout; the kernel runs in
    the notebook's own folder, so the batch must not resolve the output folder there."""
    params = _params(tmp_path / "rel.yaml")
    monkeypatch.chdir(tmp_path)
    result = runner.run_batch([params], [NB / "ok.ipynb"], "reports", timeout=120)
    assert [r.status for r in result.runs] == ["ok"], result.runs[0].reason
    assert (tmp_path / "reports" / "index.html").exists()
    assert (tmp_path / "reports" / result.runs[0].report).exists()


def test_keys_a_notebook_does_not_show_are_not_warned_about(caplog):
    """A parameter file sets keys for every notebook; a notebook's parameters cell shows only those it reads, so
    papermill's "Passed unknown parameter" warning is dropped for scenario keys (and kept for any other name)."""
    import logging

    log = logging.getLogger("papermill")
    with caplog.at_level(logging.WARNING, logger="papermill"):
        with runner._quiet_about_keys_not_shown():
            log.warning("Passed unknown parameter: quants")
            log.warning("Passed unknown parameter: not_a_key")
        log.warning("Passed unknown parameter: depths")
    assert [r.getMessage() for r in caplog.records] == ["Passed unknown parameter: not_a_key",
                                                          "Passed unknown parameter: depths"]


def test_index_reports_findings_spreads_and_marks_predictions_off_by_more_than_15_percent(tmp_path):
    """A small batch: each run's headline with its spread, the median error over its points (marked beyond ±15 %),
    its one-line finding; a headline in another unit (seconds, MiB) shows its measured value with the unit; the
    headers never wrap mid-word."""
    params = _params(tmp_path / "f.yaml")
    out = tmp_path / "out"
    result = runner.run_batch([params], [NB / "finding.ipynb"], out, timeout=120, no_input=True)
    assert [r.status for r in result.runs] == ["ok"]
    html = (out / "index.html").read_text()
    row = html.split("<tbody>")[1]
    assert "7.0 ± 1.5" in row and ">21.0<" in row
    assert "+200 %" in row and "4 pts" in row and "⚠" in row, "21 predicted for 7 measured is far off: marked"
    assert "no difference beyond the noise between -fa on and -fa off" in row
    assert "white-space: nowrap" in html and "<th>finding</th>" in html and "<th>error</th>" in html

    close = render.headline_record(100.0, 110.0, sd=2.0, median_error=0.1, points=3, finding="best -t 2")
    load = render.headline_record(0.42, None, unit="s", sd=0.01, points=4, finding="fastest mmap 0.420 s")
    runs = [runner.RunResult(params="p.yaml", notebook=f"{n}.ipynb", scenario="s", model="m", device="host",
                                   status="ok", reason="", duration_s=1.0, started="", digest="", executed=None,
                                   report=None, headline=h) for n, h in (("a", close), ("b", load))]
    rows = runner.index_html(runs, 2.0).split("<tbody>")[1].split("<tr>")
    assert "+10 %" in rows[1] and "⚠" not in rows[1], "inside ±15 %: no mark"
    assert "0.420 ± 0.010 <span class='muted'>s</span>" in rows[2] and "fastest mmap" in rows[2]
    assert runner.summary_rows(runs)[0]["finding"] == "best -t 2"

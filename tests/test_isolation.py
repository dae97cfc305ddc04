"""Crash isolation: llama.cpp crashing or hanging costs one row, never the caller (pytest, a kernel, the CLI).

The faults are real signals in a real worker process running real llama.cpp: ``V100LAB_FAULT`` (read by the
worker, see v100lab.models.worker) crashes it with SIGSEGV or SIGABRT, or hangs it, at the N-th llama_decode.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from v100lab.measure import calibration, harness
from v100lab.models import worker
from v100lab.measure.backends.isolated import IsolatedBackend
from v100lab.facts.config import RunConfig
from v100lab.base.errors import ConfigError, RunFailed
from v100lab.facts.store import ResultsStore

CFG = RunConfig(n_ctx=256, n_threads=1)


# ---- the worker itself --------------------------------------------------------------------------------------
def test_worker_returns_results_and_reraises_errors():
    with worker.Worker() as w:
        assert w.call(os.getpid) == w.pid != os.getpid()          # it really is another process
        assert w.call(sorted, [3, 1, 2]) == [1, 2, 3]
        with pytest.raises(ConfigError, match="bad test"):
            w.call(harness.parse_test, "xx12")                       # the package's own errors come back whole
        assert w.call(max, 4, 9) == 9                              # and the worker lives on


@pytest.mark.parametrize("kind,sig", [("segv", "SIGSEGV"), ("abort", "SIGABRT")])
def test_worker_crash_is_an_exception_with_the_signal(kind, sig):
    w = worker.Worker()
    with pytest.raises(worker.WorkerCrashed) as exc:
        w.call(worker.fire_fault, kind)
    assert exc.value.status == "crashed" and exc.value.signal_name == sig
    assert sig in str(exc.value)
    assert w.closed
    with pytest.raises(RunFailed, match="closed"):
        w.call(os.getpid)
    w.close()


def test_worker_hang_is_a_timeout_and_the_child_is_gone():
    w = worker.Worker()
    t0 = time.monotonic()
    with pytest.raises(worker.WorkerCrashed) as exc:
        w.call(worker.fire_fault, "hang", timeout=1.5)
    assert exc.value.status == "timeout" and time.monotonic() - t0 < 10
    with pytest.raises(ProcessLookupError):
        os.kill(w.pid, 0)
    w.close()


def test_describe_exit():
    assert worker.describe_exit(-signal.SIGSEGV)[0] == "SIGSEGV"
    assert worker.describe_exit(128 + signal.SIGABRT)[0] == "SIGABRT"
    assert worker.describe_exit(3) == (None, "exit status 3")


def test_parse_fault():
    assert worker.parse_fault("") is None
    assert worker.parse_fault("segv@3:calib") == ("segv", 3, "calib")
    assert worker.parse_fault("hang") == ("hang", 1, "")
    with pytest.raises(ValueError):
        worker.parse_fault("explode@1")


# ---- sweeps, calibration, the CLI, a notebook ---------------------------------------------------------------
@pytest.fixture
def crashing_copy(tmp_path, default_model):
    """A copy of the default model whose name the fault switch matches (``crashme``)."""
    p = tmp_path / "crashme.gguf"
    shutil.copyfile(default_model, p)
    return p


@pytest.mark.slow
def test_sweep_records_crashed_and_timeout_rows_and_completes(tmp_path, monkeypatch, default_model, crashing_copy):
    res = tmp_path / "r.jsonl"
    monkeypatch.setenv(worker.FAULT_ENV, "segv@2:crashme")
    rows = harness.sweep(default_model, CFG, "model", [str(crashing_copy), str(default_model)], tests="pp32,tg4",
                       repetitions=1, results=res, progress=False, monitor=False)
    by_model = [(os.path.basename(r["model_filename"]), r["test"], r["status"]) for r in rows]
    assert ("crashme.gguf", "pp32", "crashed") in by_model
    assert all(s == "ok" for m, _, s in by_model if m != "crashme.gguf")         # the sweep went on
    crashed = [r for r in rows if r["status"] == "crashed"]
    assert all(r["crash"]["signal"] == "SIGSEGV" and "SIGSEGV" in r["reason"] for r in crashed)
    assert all(r["crash"]["log_tail"] for r in crashed)                        # llama.cpp's last words kept
    stored = ResultsStore(res).rows()
    assert [r["status"] for r in stored] == [r["status"] for r in rows]        # and stored, not lost

    monkeypatch.setenv(worker.FAULT_ENV, "hang@1:crashme")
    rows = harness.run_tests(crashing_copy, CFG, "tg4", (0,), 1, backend=IsolatedBackend(timeout=3), monitor=False)
    assert [r["status"] for r in rows] == ["timeout"]
    assert "timed out after 3 s" in rows[0]["reason"]


@pytest.mark.slow
def test_a_crash_after_load_costs_one_test_the_next_runs_in_a_new_worker(monkeypatch, default_model):
    monkeypatch.setenv(worker.FAULT_ENV, "abort@1")   # every worker aborts at its first decode...
    rows = harness.run_tests(default_model, CFG, "pp16,tg2", (0,), 1, monitor=False, warmup=False)
    assert [r["status"] for r in rows] == ["crashed", "crashed"]               # ...each test, in its own worker
    assert len({r["run_id"] for r in rows}) == 2


@pytest.mark.slow
def test_calibrate_survives_one_crashed_point(fresh_cache, monkeypatch, small_calibration):
    pts = small_calibration([("F16", 0, True), ("Q4_0", 0, True), ("F16", 128, False), ("F16", 256, False),
                             ("F16", 384, False)])
    monkeypatch.setattr(calibration, "wait_for_quiet", lambda *a, **k: 0.0)
    monkeypatch.setenv(worker.FAULT_ENV, "segv@1:pure-Q4_0")
    cal = calibration.calibrate(threads=[1], repetitions=1, store=False, settle_rounds=0)
    crashed = [p for p in cal["points"] if p.get("status") == "crashed"]
    assert [p["config"] for p in crashed] == [pts[1].name]
    assert "SIGSEGV" in crashed[0]["reason"]
    assert cal["threads"]["1"]                                                 # it still fitted

    # with two of five points gone there is too little left: it refuses, with a message, and stores nothing
    monkeypatch.setenv(worker.FAULT_ENV, "segv@1:synth-llama")
    with pytest.raises(RunFailed, match="not enough to fit"):
        calibration.calibrate(threads=[1], repetitions=1, store=True, settle_rounds=0)
    from v100lab.facts import devices

    assert calibration.PROFILE_KEY not in (devices.read_host_profile() or {})


@pytest.mark.slow
def test_cli_bench_exits_1_with_one_line_naming_the_signal(tmp_path):
    env = dict(os.environ, **{worker.FAULT_ENV: "segv@1"})
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "v100lab", "bench", "default", "--tests", "pp64", "-r", "1", "-t", "1",
                        "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1, r.stderr
    assert time.monotonic() - t0 < 60
    rows = json.loads(r.stdout)
    assert [x["status"] for x in rows] == ["crashed"]
    err = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and "SIGSEGV" in err[0] and "Traceback" not in r.stderr


@pytest.mark.slow
def test_notebook_whose_measurement_crashes_shows_the_failed_row(tmp_path):
    papermill = pytest.importorskip("papermill")
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "from v100lab.measure import harness\n"
        "from v100lab.facts.config import RunConfig\n"
        "rows = harness.run_tests('default', RunConfig(n_ctx=256, n_threads=1), 'pp32', (0,), 1, monitor=False)\n"
        "print('STATUS', rows[0]['status'], rows[0]['reason'])")]
    src, out = tmp_path / "crash.ipynb", tmp_path / "out.ipynb"
    nbformat.write(nb, src)
    os.environ[worker.FAULT_ENV] = "segv@1"          # the kernel (and its workers) inherit it
    try:
        papermill.execute_notebook(str(src), str(out), kernel_name="python3", progress_bar=False, cwd=str(tmp_path))
    finally:
        del os.environ[worker.FAULT_ENV]
    text = "".join(o.get("text", "") for c in nbformat.read(out, 4).cells for o in c.get("outputs", []))
    assert "STATUS crashed" in text and "SIGSEGV" in text

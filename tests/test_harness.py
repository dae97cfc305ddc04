"""The measurement harness, in-process: tests, statistics, rows, run-config fields, sweeps, CLI.

Real llama.cpp (llama-cpp-python) on the default model, tiny tests (pp32, tg8, r=2). No speed is asserted:
only structure, that each RunConfig field reaches llama.cpp (seen in its own log), and relationships.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from pathlib import Path

import pytest

from v100lab.measure import harness
from v100lab.measure.backends import BenchTest
from v100lab.facts.config import RunConfig
from v100lab.base.errors import ConfigError

CFG = RunConfig(n_ctx=256, n_threads=1)


# ---- tests and statistics -------------------------------------------------------------------

@pytest.mark.parametrize("spec,expected", [
    ("pp512", (512, 0, 0)), ("tg128", (0, 128, 0)), ("pp512+tg128", (512, 128, 0)),
    ("tg128 @ d1024", (0, 128, 1024)), ("PP64@d8", (64, 0, 8)),
])
def test_parse_test(spec, expected):
    t = harness.parse_test(spec)
    assert (t.n_prompt, t.n_gen, t.n_depth) == expected


@pytest.mark.parametrize("bad", ["p512", "tg", "pp-1", "tgx", "pp0", ""])
def test_parse_test_rejects(bad):
    with pytest.raises(ConfigError):
        harness.parse_test(bad)


def test_names_follow_llama_bench():
    assert BenchTest(512, 0).name == "pp512"
    assert BenchTest(0, 128, 1024).name == "tg128 @ d1024"
    assert BenchTest(512, 128).name == "pp512+tg128"


def test_make_tests_crosses_depths():
    ts = harness.make_tests("pp32,tg8", "0,16")
    assert [t.name for t in ts] == ["pp32", "pp32 @ d16", "tg8", "tg8 @ d16"]
    with pytest.raises(ConfigError):
        harness.make_tests("pp32", "0,x")


def test_summarize_is_llama_bench_statistics():
    s = harness.summarize([1_000_000_000, 2_000_000_000], n_tokens=10)
    assert s["samples_ts"] == [10.0, 5.0]
    assert s["avg_ts"] == pytest.approx(7.5)
    assert s["stddev_ts"] == pytest.approx(statistics.stdev([10.0, 5.0]))   # sample sd (n - 1)
    assert s["stddev_ts"] == pytest.approx(math.sqrt(12.5))
    assert s["cv"] == pytest.approx(math.sqrt(12.5) / 7.5)
    assert s["noisy"] is True
    quiet = harness.summarize([1_000_000_000, 1_010_000_000], n_tokens=10)
    assert quiet["noisy"] is False
    one = harness.summarize([500_000_000], n_tokens=4)
    assert one["stddev_ts"] == 0.0 and one["avg_ts"] == pytest.approx(8.0)


# ---- real runs --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rows(default_model):
    return harness.run_tests(default_model, CFG, "pp32,tg8", (0,), 2, monitor=True)


def test_rows_have_llama_bench_fields(rows, default_model):
    assert [r["test"] for r in rows] == ["pp32", "tg8"]
    for r in rows:
        assert r["status"] == "ok", r["reason"]
        for f in ("n_prompt", "n_gen", "n_depth", "avg_ts", "stddev_ts", "samples_ts", "samples_ns",
                  "n_gpu_layers", "n_batch", "n_ubatch", "type_k", "type_v", "flash_attn", "n_threads",
                  "model_filename", "model_type", "model_size", "model_n_params", "build_commit", "cpu_info",
                  "gpu_info", "test_time", "backend", "load", "env", "config", "timestamp", "model_header_sha256"):
            assert f in r, f
        assert len(r["samples_ns"]) == 2 and len(r["samples_ts"]) == 2
        assert r["avg_ts"] == pytest.approx(statistics.fmean(r["samples_ts"]))
        assert all(ts == pytest.approx(1e9 * (r["n_prompt"] + r["n_gen"]) / ns)
                   for ts, ns in zip(r["samples_ts"], r["samples_ns"]))
        assert r["timing"] == "decode"
        assert r["backend"] == "inprocess"
        assert r["model_type"].startswith("llama")
        assert r["model_size"] > 0 and r["model_n_params"] > 100e6
        assert r["env"]["llama_cpp_python"] and r["env"]["llama_cpp_build"]
        assert r["config"] == CFG.as_dict()
    pp, tg = rows
    assert (pp["n_prompt"], pp["n_gen"]) == (32, 0) and (tg["n_prompt"], tg["n_gen"]) == (0, 8)


def test_header_hash_is_sha_of_header_bytes(rows, default_model):
    from v100lab.gguf.header import read_header

    n = read_header(default_model).header_bytes
    with open(default_model, "rb") as f:
        assert rows[0]["model_header_sha256"] == hashlib.sha256(f.read(n)).hexdigest()
    assert rows[0]["model_file_size"] == default_model.stat().st_size


def test_rows_keep_load_facts_raw_log_and_monitor(rows):
    r = rows[0]
    assert r["load"]["n_ctx"] == 256
    assert r["load"]["kv_caches"], "KV cache line parsed from llama.cpp's log"
    assert "llama_context" in r["raw_log"]
    assert r["monitor"]["samples"] >= 2
    assert r["monitor"]["rss_max_bytes"] > 50 * 2**20
    assert all("rss_bytes" in s for s in r["monitor_series"])


def _load(model, **changes):
    from v100lab.measure.backends.inprocess import InProcessBackend

    s = InProcessBackend().open(model, CFG.with_(**changes))
    try:
        return s.load, s.info
    finally:
        s.close()


def test_every_context_field_reaches_llama_cpp(default_model):
    """Seen in llama.cpp's own log: n_ctx, n_batch, n_ubatch, n_seq_max, kv_unified, cache types, flash attn."""
    load, info = _load(default_model, n_ctx=512, n_batch=64, n_ubatch=32, n_parallel=2,
                       cache_type_k="q8_0", cache_type_v="q8_0", flash_attn="on")
    assert (load["n_ctx"], load["n_batch"], load["n_ubatch"], load["n_seq_max"]) == (512, 64, 32, 2)
    assert info["n_ctx_seq"] == 256                         # not unified: each sequence gets n_ctx / n_seq
    kv = load["kv_caches"][0]
    assert (kv["type_k"], kv["type_v"]) == ("q8_0", "q8_0")
    assert load["flash_attn"] == "enabled"
    load_u, info_u = _load(default_model, n_ctx=512, n_parallel=2, kv_unified=True)
    assert load_u["kv_unified"] is True and info_u["n_ctx_seq"] == 512


def test_repetitions_clear_the_kv_cache(default_model):
    """pp200 three times in a 256-cell context only fits if the cache is cleared between repetitions."""
    rows = harness.run_tests(default_model, CFG, "pp200", (0,), 3, monitor=False)
    assert rows[0]["status"] == "ok", rows[0]["reason"]
    assert len(rows[0]["samples_ns"]) == 3


def _pos_max(session) -> int:
    import llama_cpp

    return llama_cpp.llama_memory_seq_pos_max(llama_cpp.llama_get_memory(session._ctx), 0)


def test_a_filled_context_is_kept_for_the_next_load_of_the_same_model_and_context(default_model, tmp_path, caplog):
    """``depth_states`` (calibration's extra loads of its depth points): the first load fills the context and keeps
    the state in a file; a later load of the same model and context — at another thread count — restores it
    instead of decoding the fill, and measures at that depth; another context is another file; a file that does
    not restore (not a state) is filled again and replaced."""
    from v100lab.measure.backends.inprocess import InProcessBackend, depth_state_name

    test = BenchTest(n_gen=4, n_depth=96)
    with InProcessBackend().open(default_model, CFG, tmp_path) as s:
        m = s.run(test, 2)
        assert s.depth_restores == 0 and _pos_max(s) == 96 + 4 - 1 and len(m.samples_ns) == 2
    kept = tmp_path / depth_state_name(default_model, CFG, 96)
    assert kept.is_file() and kept.stat().st_size > 96 * 1024           # 96 cells × 30 layers of K and V
    two = CFG.with_(n_threads=2)
    assert depth_state_name(default_model, two, 96) == kept.name        # threads do not shape the cache
    with InProcessBackend().open(default_model, two, tmp_path) as s:
        s._fill_depth(96)
        assert s.depth_restores == 1 and _pos_max(s) == 95
        assert s.run(test, 1).samples_ns[0] > 0 and s.depth_restores == 1
    bigger = CFG.with_(n_ctx=512)
    assert depth_state_name(default_model, bigger, 96) != kept.name
    (tmp_path / depth_state_name(default_model, bigger, 96)).write_bytes(b"not a llama.cpp state")
    with caplog.at_level("WARNING"), InProcessBackend().open(default_model, bigger, tmp_path) as s:
        s._fill_depth(96)
        assert s.depth_restores == 0 and _pos_max(s) == 95
    assert "does not fit this context" in caplog.text
    assert (tmp_path / depth_state_name(default_model, bigger, 96)).stat().st_size > 96 * 1024
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({kept.name, depth_state_name(default_model, bigger, 96)})


def test_depth_that_does_not_fit_is_a_failed_row(default_model):
    rows = harness.run_tests(default_model, CFG, "tg8", (0, 300), 1, monitor=False)
    assert [r["status"] for r in rows] == ["ok", "failed"]
    assert "context too small" in rows[1]["reason"]
    assert rows[1]["n_depth"] == 300


def test_sweep_and_observations(default_model, tmp_path):
    res = tmp_path / "sweep.jsonl"
    rows = harness.sweep(default_model, CFG, "n_depth", [0, 16], tests="tg8", repetitions=2, results=res,
                       progress=False, monitor=False)
    assert [(r["lever"], r["value"], r["n_depth"]) for r in rows] == [("n_depth", "0", 0), ("n_depth", "16", 16)]
    obs = harness.rows_to_observations(rows, "smollm2")
    from v100lab.facts.results import tidy_frame

    df = tidy_frame(obs)
    assert list(df["metric"]) == ["tg_tps", "tg_tps"] and set(df["source"]) == {"measured"}
    assert list(df["value"]) == ["0", "16"] and (df["tok_s"] > 0).all()
    assert all("backend inprocess" in n for n in df["note"])
    assert list(df["repetitions"]) == [2, 2] and (df["sd"] >= 0).all()     # the spread is a column, not a note
    # each row says what llama.cpp ran: two depths are two setups, the rest of the line is the same
    a, b = list(df["setup"])
    assert "tg8 · depth 0" in a and "tg8 · depth 16" in b and a.replace("depth 0", "depth 16") == b
    assert f"-t {CFG.threads}" in a and a.startswith(Path(default_model).name) and a.endswith("inprocess")
    again = harness.sweep(default_model, CFG, "n_depth", [0, 16], tests="tg8", repetitions=2, results=res,
                        progress=False, monitor=False)
    assert [r["run_id"] for r in again] == [r["run_id"] for r in rows]     # resumed: nothing re-measured
    assert len(res.read_text().splitlines()) == 2


def test_sweep_rejects_unknown_lever(default_model):
    with pytest.raises(ConfigError):
        harness.sweep(default_model, CFG, "warp_speed", [1], progress=False)


def test_failed_config_row_has_llama_cpp_reason(default_model):
    rows = harness.run_tests(default_model, CFG.with_(cache_type_v="q8_0", flash_attn="off"), "tg8", (0,), 1,
                           monitor=False)
    assert rows[0]["status"] == "failed"
    assert "quantized V cache requires flash_attn" in rows[0]["reason"]
    assert rows[0]["avg_ts"] is None and rows[0]["samples_ts"] == []
    assert harness.rows_to_observations(rows, "x") == []


# ---- CLI ----------------------------------------------------------------------------------------

def test_cli_json_one_document(capsys, tmp_path):
    from v100lab.cli.main import main

    res = tmp_path / "r.jsonl"
    rc = main(["bench", "default", "-c", "256", "-t", "1", "--tests", "tg8", "-r", "2", "--json",
               "--results", str(res)])
    out = capsys.readouterr().out
    assert rc == 0
    doc = json.loads(out)
    assert len(doc) == 1 and doc[0]["test"] == "tg8" and doc[0]["status"] == "ok"
    assert "raw_log" not in doc[0]
    assert len(res.read_text().splitlines()) == 1
    rc = main(["bench", "default", "-c", "256", "-t", "1", "--tests", "tg8", "-r", "2", "--json",
               "--results", str(res)])
    again = json.loads(capsys.readouterr().out)
    assert rc == 0 and again[0]["run_id"] == doc[0]["run_id"]
    assert len(res.read_text().splitlines()) == 1


@pytest.mark.parametrize("argv,status", [
    (["bench", "default", "--tests", "qq12"], 2),
    (["bench", "/no/such/model.gguf"], 2),
    (["bench", "default", "-c", "256", "-t", "1", "--tests", "tg8", "-r", "1", "-ctv", "q8_0", "-fa", "off"], 1),
])
def test_cli_errors(argv, status, capsys):
    from v100lab.cli.main import main

    assert main(argv) == status
    if status == 1:
        assert "quantized V cache requires flash_attn" in capsys.readouterr().out

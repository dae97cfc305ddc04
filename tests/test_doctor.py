"""v100lab doctor: findings from real llama.cpp logs captured here, and from GPU logs written with
llama.cpp's own format strings (tests/data/logs/SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from v100lab.cli.main import main
from v100lab.advise.doctor import GpuFact, LogError, diagnose, diagnose_file, guess_device, normalize_line

LOGS = Path(__file__).parent / "data" / "logs"

GPU_CASES = {
    "gpu-v100-ngl0-server.log": {"no-offload", "far-below-ceiling"},
    "gpu-v100-partial-lowram-server.log": {"partial-offload", "mmap-low-ram"},
    "gpu-v100-oom-server.log": {"over-capacity"},
    "gpu-v100-seed-stage6-server.log": {"above-ceiling"},
    "gpu-v100-seed-final-oldbuild-server.log": {"quantized-v-no-fa"},
    "gpu-v100-debug-fallback-bench.log": {"debug-build", "cpu-fallback", "far-below-ceiling"},
}


def _file_line(path: Path, line_no: int) -> str:
    return normalize_line(path.read_text().splitlines()[line_no - 1])


@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_gpu_fixture_findings(name):
    d = diagnose_file(LOGS / name)
    assert set(d.codes) == GPU_CASES[name], d.format_text()
    for f in d.findings:
        assert f.fix and "\n" not in f.fix and "\n" not in f.title
        if f.line_no:   # the evidence is the file's own line, at that number
            assert _file_line(LOGS / name, f.line_no) == f.evidence


def test_no_offload_numbers_and_device_from_log():
    d = diagnose_file(LOGS / "gpu-v100-ngl0-server.log")
    assert d.device == "v100-16gb" and d.device_guessed
    f = d.finding("no-offload")
    assert f.numbers["offloaded_layers"] == 0 and f.numbers["offloadable_layers"] == 65
    assert f.numbers["host_model_mib"] == pytest.approx(15770.34)
    assert "--gpu-layers" in f.fix
    slow = d.finding("far-below-ceiling")
    assert slow.numbers["tok_s"] == pytest.approx(4.57)


def test_above_ceiling_is_bandwidth_over_file_size():
    from v100lab.predict.speed import ceiling_tps

    d = diagnose_file(LOGS / "gpu-v100-seed-stage6-server.log")
    f = d.finding("above-ceiling")
    size = round(14.40 * 2**30)   # print_info: file size = 14.40 GiB
    assert d.model_bytes == size
    assert f.numbers["ceiling_tok_s"] == pytest.approx(ceiling_tps(size, 900), rel=1e-3)
    assert f.numbers["tok_s"] == 64.0 > f.numbers["ceiling_tok_s"]
    # on a faster card the same 64 tok/s is possible: no finding
    d32 = diagnose_file(LOGS / "gpu-v100-seed-stage6-server.log", device="h100-sxm")
    assert "above-ceiling" not in d32.codes


def test_capacity_uses_the_given_device():
    # the same buffers: over a 16 GB card's memory, inside a 32 GB card's — but the log says the allocation
    # failed, so the doctor reports it either way and says why
    d16 = diagnose_file(LOGS / "gpu-v100-oom-server.log", device="v100-16gb")
    f = d16.finding("over-capacity")
    assert f.numbers["failed_alloc_mib"] == pytest.approx(17496.13)
    assert f.numbers["needed_mib"] > f.numbers["capacity_mib"]
    d32 = diagnose_file(LOGS / "gpu-v100-oom-server.log", device="v100-32gb")
    assert "something else holds" in d32.finding("over-capacity").title


def test_buffers_over_capacity_without_failure(tmp_path):
    # the stage-6 buffers (14067 + 68 + 150 + 515 MiB on CUDA0) judged against a smaller card → over-capacity
    small = tmp_path / "small.yaml"
    small.write_text("id: small-gpu\nname: a 12 GB card\nkind: gpu\nmemory_gib: 12\nbandwidth_gbs: 900\n")
    d = diagnose_file(LOGS / "gpu-v100-seed-stage6-server.log", device=small)
    f = d.finding("over-capacity")
    assert f is not None and f.numbers["used_mib"] == pytest.approx(14067.38 + 68 + 149.62 + 515, abs=0.1)
    assert "CUDA0 model buffer size" in f.evidence
    assert "near-capacity" not in diagnose_file(LOGS / "gpu-v100-seed-stage6-server.log", device="v100-16gb").codes


def test_partial_offload_and_low_ram_numbers():
    d = diagnose_file(LOGS / "gpu-v100-partial-lowram-server.log")
    p = d.finding("partial-offload")
    assert (p.numbers["offloaded_layers"], p.numbers["offloadable_layers"]) == (58, 65)
    m = d.finding("mmap-low-ram")
    assert m.numbers["free_ram_bytes"] == 1800 * 2**20
    assert m.numbers["mapped_bytes"] == pytest.approx(2270.12 * 2**20, rel=1e-6)
    # with plenty of free RAM given, the mmap finding goes away
    d2 = diagnose_file(LOGS / "gpu-v100-partial-lowram-server.log", free_ram_bytes=64 * 2**30)
    assert "mmap-low-ram" not in d2.codes


@pytest.mark.parametrize("name", ["real-inprocess-default-load.log", "real-llama-server-default.log",
                                  "real-llama-bench-default.log"])
def test_real_cpu_logs_are_clean(name, tmp_path):
    path = LOGS / name              # committed fixtures: a missing one fails the test
    # a CPU of 33 GB/s (the read bandwidth of the machine the fixtures were captured on) — fixed, so the test
    # does not depend on the machine running it
    cpu = tmp_path / "cpu.yaml"
    cpu.write_text("id: cpu33\nname: a CPU\nkind: cpu\nmemory_gib: 24\nbandwidth_gbs: 33\n")
    d = diagnose_file(path, device=cpu)
    assert d.findings == (), d.format_text()   # the CPU_REPACK → CPU line is not a device fallback
    assert d.model_bytes == round(92.10 * 2**20)


def test_real_server_log_speed_against_a_slow_device(tmp_path):
    path = LOGS / "real-llama-server-default.log"
    d0 = diagnose_file(path)
    tg = [s for s in d0.speeds if s.phase == "tg"]
    pp = [s for s in d0.speeds if s.phase == "pp"]
    assert len(tg) == 1 and len(pp) == 1 and tg[0].n_tokens >= 1
    # a device whose ceiling is below the measured decode speed: the doctor must call it impossible
    bw = 0.5 * tg[0].tps * d0.model_bytes / 1e9
    slow = tmp_path / "slow.yaml"
    slow.write_text(f"id: slow\nname: slow\nkind: cpu\nmemory_gib: 8\nbandwidth_gbs: {bw}\n")
    f = diagnose_file(path, device=slow).finding("above-ceiling")
    assert f is not None and f.numbers["ceiling_tok_s"] == pytest.approx(tg[0].tps / 2, rel=1e-3)
    assert f.line_no == tg[0].line_no


@pytest.mark.parametrize("name", ["real-inprocess-default-qv-nofa.log", "real-llama-server-default-qv-nofa.log"])
def test_real_quantized_v_refusal(name):
    path = LOGS / name
    d = diagnose_file(path)
    f = d.finding("quantized-v-no-fa")
    assert f is not None and f.severity == "error"
    assert "flash_attn" in f.evidence and "--flash-attn on" in f.fix
    assert _file_line(path, f.line_no) == f.evidence


def test_cpu_only_build_with_a_gpu_device():
    d = diagnose_file(LOGS / "real-inprocess-default-load.log", device="v100-16gb")
    f = d.finding("no-gpu-backend")
    assert f is not None and "-DGGML_CUDA=ON" in f.fix and "ARCHITECTURES=70" in f.fix


def test_live_capture_from_llama_cpp(default_model):
    """A log captured now, from llama.cpp in this process: a clean load, and a refused quantized V cache."""
    from v100lab.facts.config import RunConfig
    from v100lab.base.errors import RunFailed
    from v100lab.facts.loadlog import capture_llama_log, load_and_capture

    _, text = load_and_capture(default_model, RunConfig(n_ctx=512))
    assert not [f for f in diagnose(text, source="live").findings if f.severity == "error"]
    with capture_llama_log() as cap:
        with pytest.raises(RunFailed):
            load_and_capture(default_model, RunConfig(n_ctx=512, cache_type_v="q8_0", flash_attn="off"))
    assert "quantized-v-no-fa" in diagnose(cap.text, source="live").codes


def test_several_loads_in_one_log():
    text = (LOGS / "gpu-v100-ngl0-server.log").read_text() + (LOGS / "gpu-v100-seed-stage6-server.log").read_text()
    d = diagnose(text)
    assert d.n_loads == 2
    assert {"no-offload", "above-ceiling"} <= set(d.codes)


def test_llama_bench_json_records():
    recs = [{"model_size": 3825065984, "n_prompt": 0, "n_gen": 128, "avg_ts": 300.0, "model_type": "llama 7B Q4_0"},
            {"model_size": 3825065984, "n_prompt": 512, "n_gen": 0, "avg_ts": 5000.0, "model_type": "llama 7B Q4_0"}]
    d = diagnose(json.dumps(recs), device="v100-16gb")
    assert [s.phase for s in d.speeds] == ["tg", "pp"]
    assert d.codes == ("above-ceiling",)   # 300 > 900 GB/s / 3.83 GB = 235; pp is never judged by the ceiling


def test_normalize_and_guess_device():
    assert normalize_line("0.00.420.442 I llama_context:        CPU  output buffer size =     0.75 MiB") == \
        "llama_context:        CPU  output buffer size =     0.75 MiB"
    assert normalize_line("0.00.848.733 I slot print_timing: id  3 | task 0 |") == "print_timing: id  3 | task 0 |"
    assert normalize_line("......llama_context: x") == "llama_context: x"
    assert guess_device([GpuFact("CUDA0", "Tesla V100-PCIE-16GB")]).id == "v100-16gb"
    assert guess_device([GpuFact("CUDA0", "Tesla V100-SXM2-32GB")]).id == "v100-sxm2-32gb"
    assert guess_device([GpuFact("CUDA0", "Tesla V100-SXM2-16GB")]).id == "v100-sxm2-16gb"
    assert guess_device([GpuFact("CUDA0", "Some Future GPU")]) is None
    assert guess_device([]) is None


# ---- bad input ---------------------------------------------------------------------------------

def test_not_a_log(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("hello\nthis is not a llama.cpp log\n")
    with pytest.raises(LogError, match="not a llama.cpp log"):
        diagnose_file(p)
    b = tmp_path / "model.bin"
    b.write_bytes(b"GGUF\x00\x00\x00\x03" * 10)
    with pytest.raises(LogError, match="binary"):
        diagnose_file(b)
    with pytest.raises(LogError, match="no such file"):
        diagnose_file(tmp_path / "missing.log")
    with pytest.raises(LogError, match="directory"):
        diagnose_file(tmp_path)


def test_cli_exit_status_and_json(capsys, tmp_path):
    assert main(["doctor", str(LOGS / "gpu-v100-ngl0-server.log")]) == 0
    out = capsys.readouterr().out
    assert "no-offload" in out and "fix:" in out and "line 17" in out
    assert main(["doctor", str(LOGS / "gpu-v100-seed-stage6-server.log"), "--device", "v100-16gb", "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["device"] == "v100-16gb" and not doc["device_guessed"]
    assert [f["code"] for f in doc["findings"]] == ["above-ceiling"]
    assert set(doc["findings"][0]) == {"code", "severity", "title", "evidence", "line", "fix", "numbers"}
    p = tmp_path / "x.txt"
    p.write_text("nothing to see\n")
    assert main(["doctor", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a llama.cpp log" in err
    assert main(["doctor", str(tmp_path / "missing.log")]) == 2
    assert main(["doctor", str(LOGS / "gpu-v100-ngl0-server.log"), "--device", "no-such-card"]) == 2

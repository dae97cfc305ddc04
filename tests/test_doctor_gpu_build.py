"""The doctor's commonest finding: a GPU in the machine, a llama.cpp log without a GPU backend.

The logs are real CPU-only llama.cpp logs (the committed llama-server -lv 4 log, and one captured now through
the package); the GPU's presence is a recorded nvidia-smi answer (tests/data/nvidia-smi).
"""

from __future__ import annotations

import stat
from pathlib import Path

from v100lab.base import cudabuild
from v100lab.cli.main import main
from v100lab.advise.doctor import diagnose, diagnose_file

DATA = Path(__file__).parent / "data"
SERVER_LOG = DATA / "logs" / "real-llama-server-default.log"
V100 = cudabuild.parse_nvidia_smi((DATA / "nvidia-smi" / "v100-driver535.csv").read_text())


def test_a_real_cpu_only_server_log_on_a_gpu_box():
    d = diagnose_file(SERVER_LOG, host_gpus=V100)
    f = d.finding("cpu-only-build")
    assert f is not None and f.severity == "error", d.format_text()
    assert f.title.startswith("this llama.cpp was built without CUDA: nvidia-smi lists Tesla V100-SXM2-16GB (sm_70)")
    assert "CPU_Mapped model buffer" in f.evidence and f.line_no > 0
    assert "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=70" in f.fix and "scripts/setup.sh" in f.fix
    assert f.numbers["host_gpus"] == ["Tesla V100-SXM2-16GB"]


def test_no_finding_without_a_gpu_in_the_machine():
    assert "cpu-only-build" not in diagnose_file(SERVER_LOG).codes


def test_a_cuda_build_with_ngl_0_is_no_offload_not_a_cpu_only_build():
    d = diagnose_file(DATA / "logs" / "gpu-v100-ngl0-server.log", host_gpus=V100)
    assert "no-offload" in d.codes and "cpu-only-build" not in d.codes


def test_the_cli_asks_nvidia_smi(tmp_path, monkeypatch, capsys):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat '{DATA / 'nvidia-smi' / 'v100-and-rtx3090.csv'}'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(cudabuild.NVIDIA_SMI_ENV, str(smi))
    assert main(["doctor", str(SERVER_LOG)]) == 0
    out = capsys.readouterr().out
    assert "built without CUDA" in out and "CMAKE_CUDA_ARCHITECTURES=70;86" in out
    assert main(["doctor", "--no-host-gpus", str(SERVER_LOG)]) == 0
    assert "built without CUDA" not in capsys.readouterr().out


def test_a_log_captured_now_with_every_layer_asked_for(default_model):
    """llama.cpp of this venv (a CPU build here), -ngl all: no GPU buffer, so a GPU box would be told."""
    from v100lab.facts.config import RunConfig
    from v100lab.facts.loadlog import load_and_capture

    facts, text = load_and_capture(default_model, RunConfig(n_ctx=256))
    if any(d != "host" for d in facts.devices):
        import pytest
        pytest.skip("this llama.cpp has a GPU backend: the log shows a GPU buffer")
    f = diagnose(text, source="live", host_gpus=V100).finding("cpu-only-build")
    assert f is not None and "Tesla V100-SXM2-16GB" in f.title


# ---- the GPU self-test setup.sh runs after a CUDA build
def test_gpu_selftest_on_this_llama_cpp(default_model):
    import llama_cpp
    import pytest

    from v100lab.measure.selftest import run_gpu_selftest

    if llama_cpp.llama_supports_gpu_offload():
        pytest.skip("this llama.cpp has GPU offload")
    r = run_gpu_selftest(default_model, timeout=120)
    assert not r.passed and r.gpu_offload is False and "built without GPU offload" in r.message
    assert r.format().endswith("FAIL: " + r.message)


def test_judging_the_gpu_probe():
    from v100lab.measure.selftest import judge_gpu_probe

    full = {"gpu_offload": True, "offloaded": 31, "offloadable": 31,
            "buffers": {"host": {"model": 28.1}, "CUDA0": {"model": 92.1, "KV": 5.6}}}
    assert judge_gpu_probe(full) == (True, "31/31 layers offloaded; model buffer on CUDA0")
    ok, why = judge_gpu_probe({**full, "offloaded": 20})
    assert not ok and "only 20/31 layers" in why
    ok, why = judge_gpu_probe({**full, "buffers": {"host": {"model": 120.0}}})
    assert not ok and "no model buffer on a GPU device" in why


def test_a_gpu_build_without_a_device_says_what_its_backend_said():
    # the line is what this project's CUDA 13.5 build for sm_75 printed when it was loaded on a machine without a
    # driver (benchmarks/RESULTS.md, "CUDA toolkit check")
    from v100lab.measure.selftest import judge_gpu_probe

    said = ["ggml_cuda_init: failed to initialize CUDA: CUDA driver version is insufficient for CUDA runtime version"]
    ok, why = judge_gpu_probe({"gpu_offload": False, "backend_log": said})
    assert not ok and why == ("this GPU build of llama.cpp finds no usable device: ggml_cuda_init: failed to "
                              "initialize CUDA: CUDA driver version is insufficient for CUDA runtime version")
    ok, why = judge_gpu_probe({"gpu_offload": False, "backend_log": ["llama_model_loader: loaded meta data"]})
    assert not ok and "built without GPU offload" in why

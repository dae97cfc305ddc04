"""The safe llama.cpp build flags: a pure function of /proc/cpuinfo, checked for every class of host.

The fixtures (tests/data/cpuinfo, see SOURCES.md there) cover an AVX2-only CPU, AVX-512 without AMX and
AVX-512 with AMX, so the AMX rule is tested whatever CPU runs the tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from v100lab.base import buildflags

DATA = Path(__file__).parent / "data" / "cpuinfo"
# the flags line of an AMX host on which the native build crashed (llama.cpp issue #20824)
AMX_FLAGS = ("avx2 avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx_vnni avx512_bf16 avx512vbmi "
             "avx512_vbmi2 avx512_vnni avx512_bitalg avx512_vpopcntdq amx_bf16 avx512_fp16 amx_tile amx_int8")


def flags_of(args: list[str]) -> dict[str, str]:
    return dict(a.removeprefix("-D").split("=") for a in args)


def text(name: str) -> str:
    return (DATA / name).read_text()


def test_amx_host_gets_every_native_feature_but_amx():
    f = flags_of(buildflags.safe_cmake_args(text("sapphire-rapids-amx.txt")))
    assert f["GGML_NATIVE"] == "OFF"                     # -march=native would turn AMX back on
    assert {f[k] for k in ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")} == {"OFF"}
    for on in ("GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2", "GGML_AVX_VNNI", "GGML_AVX512",
               "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16"):
        assert f[on] == "ON", on


def test_the_issue_flags_line_alone_is_read_the_same_way():
    f = flags_of(buildflags.safe_cmake_args(f"model name\t: x\nflags\t\t: fma f16c bmi2 avx {AMX_FLAGS}\n"))
    assert f["GGML_AVX512_BF16"] == "ON" and f["GGML_AMX_INT8"] == "OFF" and f["GGML_NATIVE"] == "OFF"


def test_avx512_without_amx_or_bf16():
    f = flags_of(buildflags.safe_cmake_args(text("cascade-lake-avx512.txt")))
    assert f["GGML_AVX512"] == "ON" and f["GGML_AVX512_VNNI"] == "ON"
    assert f["GGML_AVX512_BF16"] == "OFF" and f["GGML_AVX512_VBMI"] == "OFF" and f["GGML_AVX_VNNI"] == "OFF"
    assert f["GGML_AMX_TILE"] == "OFF"


def test_avx2_only_names_avx512_off():
    f = flags_of(buildflags.safe_cmake_args(text("zen2-avx2.txt")))
    assert f["GGML_AVX2"] == "ON" and f["GGML_FMA"] == "ON" and f["GGML_F16C"] == "ON"
    # ggml's options default ON when GGML_NATIVE is OFF: every absent feature must be named OFF explicitly
    assert all(f[k] == "OFF" for k in ("GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16",
                                        "GGML_AVX_VNNI"))


def test_avx512_needs_all_five_foundation_flags():
    # ggml adds -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw for GGML_AVX512: one missing → OFF
    f = flags_of(buildflags.safe_cmake_args("flags\t: avx avx2 avx512f avx512cd avx512vl avx512dq\n"))
    assert f["GGML_AVX512"] == "OFF"


def test_every_option_is_named_once():
    args = buildflags.safe_cmake_args(text("zen2-avx2.txt"))
    names = [a.split("=")[0] for a in args]
    assert len(names) == len(set(names)) == 1 + len(buildflags.X86_OPTIONS) + len(buildflags.AMX_OPTIONS)


def test_other_machines_keep_llama_cpps_defaults():
    assert buildflags.safe_cmake_args(text("sapphire-rapids-amx.txt"), machine="aarch64") == []
    assert buildflags.safe_cmake_args("", machine="arm64") == []


def test_unreadable_cpuinfo_still_turns_native_and_amx_off():
    f = flags_of(buildflags.safe_cmake_args("", machine="x86_64"))
    assert f["GGML_NATIVE"] == "OFF" and f["GGML_AMX_TILE"] == "OFF" and "GGML_AVX512" not in f


def test_cpu_facts():
    cpu = buildflags.parse_cpuinfo(text("sapphire-rapids-amx.txt"))
    assert cpu.model == "Intel(R) Xeon(R) Processor" and cpu.has_amx
    assert "amx_tile" in cpu.relevant_flags and "avx512f" in cpu.relevant_flags and "pcid" not in cpu.relevant_flags
    assert not buildflags.parse_cpuinfo(text("zen2-avx2.txt")).has_amx


def test_command_line_prints_the_flags_and_records_a_build(tmp_path):
    out = subprocess.run([sys.executable, "-m", "v100lab.base.buildflags", "--cpuinfo",
                          str(DATA / "sapphire-rapids-amx.txt"), "--machine", "x86_64"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == buildflags.safe_cmake_args(text("sapphire-rapids-amx.txt"))
    path = buildflags.write_record(" ".join(out), "safe", prefix=str(tmp_path))
    rec = buildflags.read_record(prefix=str(tmp_path))
    assert rec["cmake_args"] == " ".join(out) and rec["source"] == "safe"
    assert json.loads(path.read_text()) == rec
    assert buildflags.read_record(prefix=str(tmp_path / "nowhere")) == {}


@pytest.mark.slow
def test_selftest_passes_on_this_build_and_reports_it():
    """The build this suite runs on passes its own self-test (setup.sh made it), and says what it is."""
    from v100lab.measure import selftest

    report = selftest.run_selftest(threads=(1,), n_prompt=64, n_gen=4)
    assert report.passed, report.format()
    assert [s.name for s in report.steps] == ["pp64", "tg4"]
    assert all(s.tokens_per_s and s.tokens_per_s > 0 for s in report.steps)
    assert report.build.get("system_info") and report.build.get("build_commit")
    assert set(report.tools) == {"llama-server", "llama-bench", "llama-batched-bench"}  # found or not, each said
    assert "PASS" in report.format() and "llama-server:" in report.format()


@pytest.mark.slow
def test_selftest_fails_with_the_signal_and_the_rebuild_command(monkeypatch):
    from v100lab.measure import selftest
    from v100lab.models import worker

    monkeypatch.setenv(worker.FAULT_ENV, "segv@1")       # a build that crashes on its first decode
    report = selftest.run_selftest(threads=(1,), n_prompt=64, n_gen=4)
    assert not report.passed
    assert "SIGSEGV" in report.message and "v100lab.base.buildflags" in report.message
    assert report.steps[0].status == "crashed"


# ---- GGML_F16_STEP of a build (ggml-cpu simd-mappings.h), which decides the f16 kernels' scalar tail

def test_f16_step_follows_the_safe_flags_not_the_cpu():
    # the AMX host's safe build names AVX-512 but never -mavx512fp16: step 64 although the CPU has avx512_fp16
    spr = text("sapphire-rapids-amx.txt")
    flags = buildflags.parse_cpuinfo(spr).flags
    assert "avx512_fp16" in flags
    amx = " ".join(buildflags.safe_cmake_args(spr))
    assert buildflags.f16_simd_step(amx, flags, "x86_64") == 64
    # the same CPU with llama.cpp's native build compiles __AVX512FP16__ in: step 128
    assert buildflags.f16_simd_step("-DGGML_NATIVE=ON", flags, "x86_64") == 128
    # an AVX2-only build on that CPU (a stand-in for an older one): 32, so head_dim 96 has no tail there
    avx2 = amx.replace("-DGGML_AVX512=ON", "-DGGML_AVX512=OFF")
    assert buildflags.f16_simd_step(avx2, flags, "x86_64") == 32


def test_f16_step_of_a_native_build_on_other_cpus():
    assert buildflags.f16_simd_step(None, {"avx", "avx2", "fma"}, "x86_64") == 32
    assert buildflags.f16_simd_step("", {"sse4_2"}, "x86_64") == 16
    assert buildflags.f16_simd_step(None, (), "aarch64") == 32


def test_repacked_types_follow_the_builds_simd_not_the_cpu():
    """repack.cpp's ggml_repack_get_optimal_repack_type on x86: Q4_0, Q4_K, IQ4_NL and MXFP4 with AVX2, Q2_K only
    with AVX-512 — the build's, as its flags say, not the CPU's."""
    spr = text("sapphire-rapids-amx.txt")
    flags = buildflags.parse_cpuinfo(spr).flags
    amx = " ".join(buildflags.safe_cmake_args(spr))
    assert buildflags.repack_types(amx, flags, "x86_64") == {"Q4_0", "Q4_K", "IQ4_NL", "MXFP4", "Q2_K"}
    avx2 = amx.replace("-DGGML_AVX512=ON", "-DGGML_AVX512=OFF")
    assert buildflags.repack_types(avx2, flags, "x86_64") == {"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"}
    no_avx2 = avx2.replace("-DGGML_AVX2=ON", "-DGGML_AVX2=OFF")
    assert buildflags.repack_types(no_avx2, flags, "x86_64") == frozenset()
    # a native build compiles for the host it is built on
    assert "Q2_K" in buildflags.repack_types(None, flags, "x86_64")
    assert buildflags.repack_types("-DGGML_NATIVE=ON", {"avx", "avx2"}, "x86_64") == buildflags.REPACK_TYPES_AVX2
    assert buildflags.repack_types(None, {"sse4_2"}, "x86_64") == frozenset()


def test_f16_step_of_a_stored_calibrations_system_info():
    """A stored calibration is judged with its own build's step, read from the llama_print_system_info() line
    calibration stores: an AVX-512 build and an AVX2 one."""
    avx512 = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | "
              "AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |")
    avx2 = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 |"
    assert buildflags.f16_simd_step_of_system_info(avx512) == 64
    assert buildflags.f16_simd_step_of_system_info(avx2) == 32
    assert buildflags.f16_simd_step_of_system_info(avx2.replace("AVX2 = 1", "AVX2 = 0")) == 32      # AVX
    assert buildflags.f16_simd_step_of_system_info("CPU : NEON = 1 | ARM_FMA = 1 |") is None
    assert buildflags.f16_simd_step_of_system_info("") is None


def test_last_level_cache_is_the_highest_data_level(tmp_path):
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K"),
                                             (3, "Unified", "307200K")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert buildflags.last_level_cache_bytes(str(tmp_path)) == 300 * 2**20
    assert buildflags.last_level_cache_bytes(str(tmp_path / "missing")) is None

"""Notebook 14's lever: the build described from its flags (SIMD level, repacked types), the rungs it decodes, and
the CUDA build a catalog card gets — pure functions of their inputs, checked on recorded flag sets and catalog
cards (nothing compiled, llama.cpp not loaded)."""

from __future__ import annotations

import pytest

from v100lab.base import buildflags
from v100lab.facts.devices import get_device
from v100lab.workbook.levers import build
from v100lab.workbook.scenario import load_scenario, read_parameters
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AVX2_CPU = ("sse4_2", "avx", "avx2", "fma", "f16c", "bmi2")
AVX512_CPU = AVX2_CPU + ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")


def _args(flags) -> str:
    return " ".join(buildflags.safe_cmake_args("flags : " + " ".join(flags), "x86_64"))


def test_the_simd_level_compiled_follows_the_flags_not_the_cpu():
    assert build.simd_level(AVX512_CPU) == "AVX-512" and build.simd_level(AVX2_CPU) == "AVX2"
    assert build.simd_level(()) == "none"
    assert build.compiled_level(_args(AVX512_CPU), AVX512_CPU) == "AVX-512"
    avx2_only = build._variant(_args(AVX512_CPU), GGML_AVX512=False)
    assert build.compiled_level(avx2_only, AVX512_CPU) == "AVX2", "an AVX2-only build on an AVX-512 CPU"
    assert build._left_off(avx2_only, AVX512_CPU) == ["GGML_AVX512"]
    assert build._left_off(_args(AVX512_CPU), AVX512_CPU) == [], "the safe build leaves nothing off"
    assert "native" in build.compiled_level("-DGGML_NATIVE=ON", AVX2_CPU)


def test_the_flag_difference_is_what_a_rebuild_needs():
    safe = _args(AVX512_CPU)
    avx2_only = build._variant(safe, GGML_AVX512=False)
    assert build._diff(avx2_only, safe) == "-DGGML_AVX512=OFF"
    assert build._same_flags(safe, safe + " ") and not build._same_flags(safe, avx2_only)


@pytest.mark.parametrize("quant, base", [("Q4_K_M", "Q4_K"), ("Q4_0", "Q4_0"), ("Q3_K_S", "Q3_K"), ("Q8_0", "Q8_0"),
                                         ("IQ4_NL", "IQ4_NL"), ("Q2_K", "Q2_K")])
def test_a_mix_is_named_after_its_type(quant, base):
    assert build.base_type(quant) == base


def _ci(**changes):
    return load_scenario({**read_parameters(ROOT / "params" / "ci.yaml"), "measure": False, **changes})


def test_the_rungs_decoded_are_the_own_quant_a_repacked_one_and_a_plain_one():
    sc = _ci(quants=["Q8_0", "Q6_K", "Q4_K_M", "Q4_0"])
    rungs = build.measured_rungs(sc)
    assert rungs[0] == "Q4_1", "the default model's own quant first"
    assert len(rungs) <= build.MEASURED_RUNGS
    assert rungs == ["Q4_1", "Q4_0"], "Q4_1 is not repacked: the contrast is a repacked single type"
    assert build.measured_rungs(_ci(quants=["Q8_0", "Q4_K_M"])) == ["Q4_1", "Q4_K_M"]


@pytest.mark.parametrize("card, cuda13_alone, arch", [("v100-16gb", False, 70), ("p40", False, 61), ("t4", True, 75),
                                                      ("h100-sxm", True, 90)])
def test_a_catalog_card_gets_its_architecture_and_a_toolkit_that_compiles_it(card, cuda13_alone, arch):
    dev = get_device(card)
    alone, with12 = build.card_plan(dev), build.card_plan(dev, machine_cuda12=True)
    assert alone.cuda is cuda13_alone
    assert with12.cuda and with12.archs == (arch,)
    assert f"-DCMAKE_CUDA_ARCHITECTURES={arch}" in with12.cmake_args
    if not cuda13_alone:
        assert "needs a CUDA 12.x toolkit" in alone.reason and with12.toolkit.version == (12, 9)
    else:
        assert with12.toolkit.source == "registry", "the registry's toolkit is preferred where it serves the card"


def test_the_plans_table_and_the_cards_speed_for_the_scenario():
    sc = _ci()
    plans = build.cuda_plans(sc)
    assert plans["where"].iloc[0].startswith("this machine")
    v100 = plans[plans["where"].str.contains("V100")]
    assert set(v100["CUDA build"]) == {"yes", "no"} and set(v100[v100["CUDA build"] == "yes"]["architectures"]) == {"70"}
    assert build.cuda_arch(sc) == 70
    gpu = build.gpu_build_speed(sc)
    pred = gpu[(gpu["source"] == "predicted") & (gpu["metric"] == "tg_tps")].set_index("value")["result"]
    assert pred["CUDA build (sm_70)"] > pred["CPU-only build"], "the card's bandwidth against its host's"
    none = build.cuda_plans(sc.with_(compare_gpu="none"))
    assert len(none) == 1 and not len(build.gpu_build_speed(sc.with_(compare_gpu="none")))

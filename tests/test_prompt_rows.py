"""A CPU prompt's cost per matrix row: ggml-cpu's generic product calls vec_dot once per row and token, so a
matrix of short rows (SmolLM2's 576) pays more per weight than calibration's prompt model (rows of 1024 and 2816)
whose cost per weight holds that share; llamafile's sgemm types and repacked weights are tiled instead."""

from __future__ import annotations

import math

import pytest

from v100lab.facts.config import RunConfig
from v100lab.facts.spec import TensorInfo
from v100lab.measure import calibration
from v100lab.predict import rates, speed
from v100lab.predict.rates import DeviceRates


def test_the_calibration_models_rows_per_weight_is_its_specs():
    s = calibration.CALIB_WIDE
    kv = s.n_head_kv * (s.n_embd // s.n_head)
    weights = 2 * s.n_embd * s.n_embd + 2 * s.n_embd * kv + 3 * s.n_embd * s.n_ff   # wq wo, wk wv, gate up down
    rows = 2 * s.n_embd + 2 * kv + 2 * s.n_ff + s.n_embd                            # output rows of each
    assert rates.PP_CALIB_ROWS_PER_WEIGHT == pytest.approx(rows / weights, rel=1e-12)


def _cpu(pp: float = 4e-10, row: float = 2e-8) -> DeviceRates:
    return DeviceRates("host", "cpu", 20.0, 0.8, {"Q4_1": 1e-9, "Q4_0": 1e-9}, 0.0, {"Q4_1": pp, "Q4_0": pp}, pp,
                       0.0, 0.0, 0.0, 0.0, None, "test", tg_row_s=row)


def _matrix(k: int, n: int, type_name: str) -> TensorInfo:
    return TensorInfo("blk.0.ffn_up.weight", (k, n), type_name, 0, k * n // 2)


def test_short_rows_cost_more_per_weight_on_the_generic_path_only():
    r = _cpu()
    long_rows = 1 / rates.PP_CALIB_ROWS_PER_WEIGHT          # the calibration model's mean row: its own cost
    cal = speed._pp_matrix_compute_s(_matrix(round(long_rows), 512, "Q4_1"), 1e6, r)
    assert cal == pytest.approx(1e6 * r.pp_cost("Q4_1"), rel=1e-3)
    short = speed._pp_matrix_compute_s(_matrix(576, 512, "Q4_1"), 1e6, r)
    want = 1e6 * (r.pp_cost("Q4_1") - r.tg_row_s * rates.PP_CALIB_ROWS_PER_WEIGHT + r.tg_row_s / 576)
    assert short == pytest.approx(want) and short > cal
    # Q4_0 is llamafile's sgemm's (or repacked): tiles, no per-row term
    assert speed._pp_matrix_compute_s(_matrix(576, 512, "Q4_0"), 1e6, r) == pytest.approx(1e6 * r.pp_cost("Q4_0"))
    gpu = DeviceRates("t4", "cuda", 320.0, 0.8, {}, 0.0, {"Q4_1": 4e-12}, 4e-12, 0.0, 0.0, 0.0, 0.0, None, "test")
    assert gpu.pp_row_cost("Q4_1") == 0.0


def test_the_default_models_prompt_is_predicted_slower_for_its_short_rows():
    """SmolLM2's rows hold 576 weights: with a calibrated row cost its pp prediction drops; with none it stands."""
    from v100lab.models.resolve import resolve

    _, spec = resolve("default")
    cfg = RunConfig(n_threads=1, n_ctx=1024)
    # a Zen 3 core's calibrated order of magnitude: 60 ps a weight and token, 17.5 ns a row and token
    with_rows = speed.prompt_terms(spec, "host", cfg, 0, 512, rates=_cpu(pp=6e-11, row=1.75e-8))
    without = speed.prompt_terms(spec, "host", cfg, 0, 512, rates=_cpu(pp=6e-11, row=0.0))
    assert with_rows["matmul:Q4_1"] > without["matmul:Q4_1"] * 1.1
    assert math.isclose(with_rows["attention"], without["attention"])

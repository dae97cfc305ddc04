"""Rates: the host's stored calibration turned into rates, GPU classes fitted on published rows."""

from __future__ import annotations

import numpy as np
import pytest

from v100lab import rates, speed
from v100lab.config import RunConfig
from v100lab.devices import Device, device_from_mapping, get_device
from v100lab.seed import load_seed_claims


# ---- CPUs: a stored calibration -------------------------------------------------------------------

def _cal(bw1=20.0, bw2=30.0):
    def per(th, bw):
        return {"bandwidth_gbs": bw, "efficiency": 1.0, "tg_s_per_weight": {"Q4_0": 8e-11 / th, "F16": 9e-11 / th},
                "attn_s_per_op": 1e-11 / th, "overhead_token_s": 0.0, "overhead_layer_s": 1e-5,
                "pp_s_per_weight": {"Q4_0": 2e-11 / th, "F16": 2e-11 / th}, "pp_attn_s_per_op": 1e-11 / th,
                "pp_overhead_s": 0.0}
    return {"version": 1, "threads": {"1": per(1, bw1), "2": per(2, bw2)}}


def test_thread_interpolation_and_extrapolation_are_monotone():
    dev = device_from_mapping({"id": "host", "name": "h", "kind": "cpu", "memory_gib": 8, "bandwidth_gbs": 30}, "t")
    cal = _cal()
    cal["threads"]["4"] = {**cal["threads"]["2"], "tg_s_per_weight": {"Q4_0": 2e-11, "F16": 2.25e-11},
                           "pp_s_per_weight": {"Q4_0": 0.5e-11, "F16": 0.5e-11}}
    costs = [rates.cpu_rates_from_calibration(dev, cal, th).tg_cost("Q4_0") for th in (1, 2, 3, 4, 8)]
    assert costs == sorted(costs, reverse=True)
    assert costs[0] == pytest.approx(8e-11) and costs[1] == pytest.approx(4e-11)
    assert "extrapolated" in rates.cpu_rates_from_calibration(dev, cal, 8).source
    # a type the host never calibrated borrows the nearest bits-per-weight type's cost
    r = rates.cpu_rates_from_calibration(dev, cal, 2)
    assert r.tg_cost("Q4_1") == r.tg_cost("Q4_0")


def test_apple_table_and_fit():
    df = rates.load_apple_table()
    assert len(df) == 84 and df["comparable"].sum() == 79
    assert df["source"].str.contains("discussions/4167").all()
    fit = rates.gpu_class_fit("apple")
    assert 0.3 < fit.efficiency <= 1.2
    assert fit.overhead_layer_s >= 0
    assert set(fit.pp_efficiency) == {"F16", "Q8_0", "Q4_0"}


def test_apple_rows_leave_one_chip_out_is_a_real_split():
    loco = speed.apple_rows()
    ins = speed.apple_rows("none")
    comp = loco[loco["comparable"]]
    assert set(comp["test"]) == {"tg128", "pp512"}
    assert (comp["predicted"] > 0).all()
    # each chip's fit excludes that chip
    assert all(f"but {c}" in f for c, f in zip(comp["chip"], comp["fit_on"]))
    # and the held-out predictions differ from the in-sample ones
    assert not np.allclose(comp["predicted"].values, ins[ins["comparable"]]["predicted"].values)
    with pytest.raises(Exception):
        speed.apple_rows("random")


def test_cuda_class_borrows_apple_efficiency_and_anchor_overhead():
    apple, cuda = rates.gpu_class_fit("apple"), rates.gpu_class_fit("gpu")
    assert cuda.efficiency == apple.efficiency
    assert "anchor" in cuda.source
    claims = load_seed_claims()
    roles = {a["id"]: a["role"] for a in claims["anchors"]}
    assert "validation" in roles.values()          # at least one published row is kept out of the fit


def test_pascal_prompt_rate_uses_fp32_where_fp16_is_slower():
    """One GPU rates function for every caller: a card whose FP16 is crippled (Pascal) is rated on FP32."""
    fit = rates.gpu_class_fit("gpu")
    pascal = Device(id="p40", name="P40-like", kind="gpu", memory_gib=24, bandwidth_gbs=346, fp16_tflops=0.18,
                    fp32_tflops=11.8)
    fast16 = Device(id="v", name="V100-like", kind="gpu", memory_gib=16, bandwidth_gbs=900, fp16_tflops=112,
                    fp32_tflops=14)
    r = rates.gpu_rates(pascal, fit)
    assert r.pp_default_s_per_weight == pytest.approx(2.0 / (fit.pp_default_efficiency * 11.8e12))
    assert rates.gpu_rates(fast16, fit).pp_default_s_per_weight == pytest.approx(2.0 / (fit.pp_default_efficiency * 112e12))
    assert rates.rates_for(pascal, RunConfig()) == r          # rates_for uses the same function
    with pytest.raises(Exception, match="fp16_tflops"):
        rates.gpu_rates(Device(id="x", name="x", kind="gpu", memory_gib=8, bandwidth_gbs=100), fit)


def test_catalog_gpu_rates_come_from_the_class_fit():
    dev = get_device("v100-16gb")
    r = rates.rates_for(dev, RunConfig())
    assert r.efficiency == rates.gpu_class_fit("gpu").efficiency and not r.tg_s_per_weight

"""Rates: the host's stored calibration turned into rates, GPU classes fitted on published rows."""

from __future__ import annotations

import numpy as np
import pytest

from v100lab.predict import rates, speed
from v100lab.facts.config import RunConfig
from v100lab.facts.devices import Device, catalog, device_from_mapping, get_device

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


def test_cuda_table_rows_have_sources_and_known_cards():
    df = rates.load_cuda_table()
    assert len(df) >= 40 and df["device"].nunique() >= 15
    assert set(df["test"]) == {"pp512", "tg128"} and set(df["fa"]) <= {0, 1}
    assert (df["tps"] > 0).all()
    assert df["source_url"].str.match(r"^https://github\.com/ggml-org/llama\.cpp/(discussions|pull)/\d+$").all()
    assert df["read_from"].fillna("").str.len().gt(0).all()
    for card in df["device"].unique():
        dev = get_device(card)                    # every card is in the catalog, with its own source
        assert dev.kind == "gpu" and dev.source_url.startswith("https://") and dev.fp32_tflops, card


def _loco_error(d, test, fa=None):
    e = d[(d["test"] == test) & ((d["fa"] == fa) if fa is not None else True)]["error"].abs()
    return float(e.median()), len(e)


def test_cuda_class_leave_one_card_out():
    """Judged on cards the fit did not see. Tolerances from the published spread: two cards of the same chip
    and bandwidth differ by 0-2 % (Quadro RTX 6000/8000, RTX 4090/4090 D), one card's own rows by build and
    host (the scoreboard thread reports +12 % on an RTX 3060 after closing desktop GPU users), so a model
    of bandwidth, kernels and overheads should sit within 8 % at the median for decode (about 5 % today).
    Prompt speed depends on the clock a card sustains under its power limit, which the class models from the board
    power (rates.prompt_power_factor) but no spec sheet gives outright: 12 % (9 % today; 13.5 % without it)."""
    loco, ins = speed.cuda_rows(), speed.cuda_rows("none")
    assert all(f == f"all cards but {c}" for c, f in zip(loco["device"], loco["fit_on"]))
    assert not np.allclose(loco["predicted"].values, ins["predicted"].values)
    for fa in (0, 1):
        med, n = _loco_error(loco, "tg128", fa)
        assert n >= 5 and med <= 0.08, (fa, med)
    med, n = _loco_error(loco, "pp512")
    assert n >= 20 and med <= 0.12, med
    with pytest.raises(Exception, match="split"):
        speed.cuda_rows("random")


def test_cuda_class_fit_terms_are_physical():
    fit = rates.gpu_class_fit("gpu")
    assert 0.5 < fit.efficiency <= 1.0 and fit.efficiency_f16 and 0.5 < fit.efficiency_f16 <= 1.0
    assert fit.overhead_layer_s > 0 and fit.tg_fp32_flop_per_weight > 0
    assert fit.overhead_layer_fa_s < 0          # flash attention fuses KQ, softmax and KQV: fewer kernels per layer
    assert fit.n_rows == len(rates.load_cuda_table()) and "15013" in fit.source
    assert rates.gpu_class_fit("apple").efficiency_f16 is None     # the Apple class is untouched


def test_prompt_power_limit_is_fitted_and_physical():
    """MMQ prompts run at the FP32 rate a card sustains under its board power: the knee is fitted (not pinned at
    zero) in a physical range, a card below it is slowed in proportion to its watts, decode is untouched, and a
    card without a board power is taken as unconstrained. L40 and RTX 6000 Ada (same AD102, 300 W) are the
    catalog's power-bound pair: their published pp512 sit at 0.74-0.77 of the RTX 4090's (450 W) while their FP32
    rates are 1.10x it."""
    fit = rates.gpu_class_fit("gpu")
    knee = fit.pp_power_knee_w_per_tflop
    assert 2.0 < knee < 20.0, knee
    l40, r4090 = get_device("l40"), get_device("rtx-4090")
    assert l40.board_power_w == 300 and r4090.board_power_w == 450
    f_l40 = rates.prompt_power_factor(l40, knee)
    assert f_l40 == pytest.approx(300 / (90.5 * knee)) and f_l40 < 0.9
    assert rates.prompt_power_factor(r4090, 0.0) == 1.0
    unlimited = Device(id="x", name="x", kind="gpu", memory_gib=48, bandwidth_gbs=864, fp16_tflops=181.05,
                       fp32_tflops=90.5, compute_capability="8.9")
    assert rates.prompt_power_factor(unlimited, knee) == 1.0
    slow, free = rates.gpu_rates(l40, fit), rates.gpu_rates(unlimited, fit)
    assert slow.pp_cost("Q4_0") == pytest.approx(free.pp_cost("Q4_0") / f_l40)
    assert slow.efficiency == free.efficiency and slow.tg_add_s_per_weight == free.tg_add_s_per_weight
    spec = rates.arch_spec("llama2-7b", "Q4_0")
    cfg, depth, n_prompt = rates.cuda_bench_config("pp512", 0)
    pp = {d: speed.predict(spec, [d], cfg, depth=depth, n_prompt=n_prompt).pp_tps for d in ("l40", "rtx-4090")}
    assert pp["l40"] < pp["rtx-4090"]          # the FP32 rate alone says 1.10x; the power limit says less
    for dev in catalog().values():
        if dev.kind == "gpu":
            assert dev.board_power_w and 50 <= dev.board_power_w <= 1000, dev.id


def test_prompt_kernel_families_follow_mmq_rules():
    """ggml_cuda_should_use_mmq (mmq.cu): int8 mma from Turing on, dp4a on Pascal 6.1, cuBLAS on Volta and below
    6.1 (P100). The dp4a family gets its own factor from the Pascal row, below 1 (dp4a is slower per FLOP)."""
    cc = {d: get_device(d) for d in ("p40", "p100-16gb", "v100-16gb", "t4", "rtx-4090")}
    assert rates.cuda_prompt_dp4a(cc["p40"]) and not rates.cuda_prompt_cublas_for_quantized(cc["p40"])
    assert rates.cuda_prompt_cublas_for_quantized(cc["p100-16gb"]) and rates.cuda_prompt_cublas_for_quantized(cc["v100-16gb"])
    assert not any(f(cc[d]) for d in ("t4", "rtx-4090") for f in (rates.cuda_prompt_dp4a,
                                                                rates.cuda_prompt_cublas_for_quantized))
    fit = rates.gpu_class_fit("gpu")
    assert fit.pp_dp4a_factor is not None and 0.2 < fit.pp_dp4a_factor < 1.0
    no_pascal = rates.fit_cuda_rows(rates.load_cuda_table().query("device != 'p40'"))
    assert no_pascal.pp_dp4a_factor is None


def test_v100_predictions_stay_sane():
    """v100-16gb against the published V100 row (the scoreboard's Tesla V100, 900 GB/s like every V100): decode
    within 10 % (in the fit, and also when the V100 is left out); FA on faster than off, as published; prompt
    within -45 %..+10 %: llama.cpp runs quantized prompts on Volta through cuBLAS, not MMQ (mmq.cu,
    ggml_cuda_should_use_mmq), a kernel path no other published card takes, so it is predicted low."""
    df = rates.load_cuda_table()
    v = df[df["device"] == "v100-32gb"].set_index(["test", "fa"])["tps"]
    spec = rates.arch_spec("llama2-7b", "Q4_0")
    got = {}
    for fa in (0, 1):
        cfg, depth, n_prompt = rates.cuda_bench_config("tg128", fa)
        got[fa] = speed.predict(spec, ["v100-16gb"], cfg, depth=depth, n_prompt=n_prompt)
        assert got[fa].tg_tps == pytest.approx(v[("tg128", fa)], rel=0.10)
    assert got[1].tg_tps > got[0].tg_tps
    assert -0.45 <= got[0].pp_tps / v[("pp512", 0)] - 1 <= 0.10
    loco = speed.cuda_rows()
    assert loco[(loco["device"] == "v100-32gb") & (loco["test"] == "tg128")]["error"].abs().max() <= 0.10


def test_pascal_prompt_rate_uses_fp32_where_fp16_is_slower():
    """One GPU rates function for every caller: a card whose FP16 is crippled (Pascal) is rated on FP32."""
    fit = rates.gpu_class_fit("gpu")
    pascal = Device(id="p40", name="P40-like", kind="gpu", memory_gib=24, bandwidth_gbs=346, fp16_tflops=0.18,
                    fp32_tflops=11.8, compute_capability="6.1", board_power_w=250, host_link_gbs=15.75)
    fast16 = Device(id="v", name="V100-like", kind="gpu", memory_gib=16, bandwidth_gbs=900, fp16_tflops=112,
                    fp32_tflops=14)
    r = rates.gpu_rates(pascal, fit, RunConfig())
    assert r.pp_cost("F16") == pytest.approx(2.0 / (fit.pp_efficiency["F16"] * 11.8e12))
    assert rates.gpu_rates(fast16, fit).pp_cost("F16") == pytest.approx(2.0 / (fit.pp_efficiency["F16"] * 112e12))
    # quantized types (MMQ) are rated on the FP32 rate on every card
    assert rates.gpu_rates(fast16, fit).pp_default_s_per_weight == pytest.approx(2.0 / (fit.pp_default_efficiency * 14e12))
    assert rates.rates_for(pascal, RunConfig()) == r          # rates_for uses the same function
    # a device lacking fields gets them inferred (and named) first
    sparse = Device(id="p40-file", name="P40-like", kind="gpu", memory_gib=24, bandwidth_gbs=346, fp16_tflops=0.18,
                    compute_capability="6.1")
    assert {a.field for a in rates.rates_for(sparse, RunConfig()).assumptions} >= {"fp32_tflops", "board_power_w"}
    with pytest.raises(Exception, match="fp16_tflops"):
        rates.gpu_rates(Device(id="x", name="x", kind="gpu", memory_gib=8, bandwidth_gbs=100), fit)


def test_catalog_gpu_rates_come_from_the_class_fit():
    dev = get_device("v100-16gb")
    r = rates.rates_for(dev, RunConfig())
    assert r.efficiency == rates.gpu_class_fit("gpu").efficiency and not r.tg_s_per_weight


# ---- a card outside the catalog, given as a device file with its spec sheet's headline figures ----------

def test_sparse_device_file_prediction_names_what_it_assumed(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("name: Mine\nkind: gpu\nmemory_gib: 24\nbandwidth_gbs: 936\nfp16_tflops: 71\n"
                    "compute_capability: \"8.6\"\n")
    spec = rates.arch_spec("llama2-7b", "Q4_0")
    p = speed.predict(spec, [str(path)], RunConfig())
    assert any("board_power_w assumed" in n and "compute capability 8.6" in n for n in p.notes), p.notes
    cat = speed.predict(spec, ["rtx-3090"], RunConfig())
    assert not any("assumed" in n for n in cat.notes)
    assert p.tg_tps == pytest.approx(cat.tg_tps, rel=0.05)


def test_device_file_leave_one_card_out_never_sees_the_card(monkeypatch):
    """Each card's fit and its fields' inference exclude it; judged on the published decode rows: the median within
    10 % and no card more than 10 points worse than its own catalog entry (the issue's target)."""
    events = []
    fit, complete = speed.fit_cuda_rows, speed.complete_gpu

    def spy_fit(df):
        events.append(("fit", set(df["device"])))
        return fit(df)

    def spy_complete(dev, reference=None):
        events.append(("complete", dev.id, {d.id for d in reference}))
        return complete(dev, reference)

    monkeypatch.setattr(speed, "fit_cuda_rows", spy_fit)
    monkeypatch.setattr(speed, "complete_gpu", spy_complete)
    files = speed.cuda_rows("device-file")
    monkeypatch.undo()
    done = [e for e in events if e[0] == "complete"]
    assert len(done) == files["device"].nunique()
    for i, e in enumerate(events):
        if e[0] == "complete":
            assert events[i - 1][0] == "fit" and e[1] not in events[i - 1][1] and e[1] not in e[2]
    assert all(c not in ref.split(",") for c, ref in zip(files["device"], files["inferred_from"]))
    loco = speed.cuda_rows()
    tg = (files["test"] == "tg128").values
    err_file, err_cat = files["error"].abs().values[tg], loco["error"].abs().values[tg]
    assert np.median(err_file) <= 0.10
    assert (err_file - err_cat).max() <= 0.10
    assert files["assumed"].str.contains("fp32_tflops").all()
    raw = speed.cuda_rows("device-file", infer=False)
    assert not np.allclose(raw["predicted"].values, files["predicted"].values)


def test_plan_warns_when_a_missing_field_moves_the_prediction(tmp_path, capsys):
    import json

    from v100lab.cli.main import main

    sparse = tmp_path / "sparse.yaml"
    sparse.write_text("name: Mine\nkind: gpu\nmemory_gib: 24\nbandwidth_gbs: 936\nfp16_tflops: 71\n"
                      "compute_capability: \"8.6\"\n")
    full = tmp_path / "full.yaml"
    full.write_text(sparse.read_text() + "fp32_tflops: 35.6\nboard_power_w: 350\nhost_link_gbs: 31.5\n")
    docs = {}
    for path in (sparse, full):
        assert main(["plan", "skeleton:llama2-7b:Q4_0", "-d", str(path), "--json"]) == 0
        docs[path.stem] = json.loads(capsys.readouterr().out)
    lacks = [w for w in docs["sparse"]["warnings"] if "lacks" in w]
    # FP32 spans 2x across compute capability 8.6's cards and sets the prompt rate; the host link does not
    # matter with every layer on the GPU
    assert any("fp32_tflops" in w and "spec sheet" in w for w in lacks), lacks
    assert not any("host_link_gbs" in w for w in lacks)
    assert not any("lacks" in w for w in docs["full"]["warnings"])
    assert any("assumed" in n for n in docs["sparse"]["predicted"]["notes"])

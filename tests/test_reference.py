"""A run's reference measurement: the arithmetic (start against end, spreads that include the drift, agreement
of one configuration across notebooks) on constructed rows, the index that shows it, and one real reference
pair decoded by llama.cpp on the default model."""

from __future__ import annotations

import math

import pytest

from v100lab.facts.config import RunConfig
from v100lab.facts.results import Observation, tidy_frame
from v100lab.predict.drift_scaling import agree, reference_shift, spread_with_drift
from v100lab.workbook import runner
from v100lab.workbook.levers import steps
from v100lab.workbook.levers.baseline import headline_figures
from v100lab.workbook.render import headline_record, headline_text


def _ref(tps, sd, when="start", reps=3):
    return {"when": when, "tps": tps, "sd": sd, "repetitions": reps, "model": "m.gguf", "test": "tg32", "threads": 2}


# ------------------------------------------------------------------------------------------------
# start against end
# ------------------------------------------------------------------------------------------------

def test_a_reference_that_moved_beyond_its_noise_says_so():
    moved = reference_shift(_ref(170.0, 2.0), _ref(136.0, 2.0, "end"))
    assert moved["ratio"] == pytest.approx(0.8) and moved["drift"] == pytest.approx(0.2) and moved["moved"]
    # the same 20 % drop, but with repetitions as noisy as the drop: not beyond the noise
    noisy = reference_shift(_ref(170.0, 60.0), _ref(136.0, 60.0, "end"))
    assert noisy["drift"] == pytest.approx(0.2) and not noisy["moved"]
    # a steady machine: inside the tolerance whatever the spread
    steady = reference_shift(_ref(170.0, 0.5), _ref(172.0, 0.5, "end"))
    assert not steady["moved"] and steady["drift"] == pytest.approx(2 / 170, abs=1e-4)
    assert reference_shift(_ref(170.0, 2.0), None) is None


def test_the_spread_of_a_measurement_includes_the_drift():
    # repetitions' sd 3 on 100 tok/s, references 10 % apart: sqrt(3² + 10²)
    assert spread_with_drift(100.0, 3.0, 0.10) == pytest.approx(math.hypot(3.0, 10.0))
    assert spread_with_drift(100.0, 3.0, 0.0) == pytest.approx(3.0)


def test_agreement_within_the_combined_spreads():
    assert agree(170.1, 2.1, 176.6, 4.7)                 # 6.5 apart, 2 × 5.1 allowed
    assert not agree(170.1, 2.1, 136.6, 11.0)            # 33.5 apart, 2 × 11.2 allowed
    assert agree(170.1, 2.1 + 20, 136.6, 11.0)           # with a drift term as wide as the gap


def _frame(drifted_sd=2.0):
    common = dict(model="m", quant="Q4_1", device="host", metric="tg_tps", unit="tok/s")
    return tidy_frame([
        Observation(**common, lever="n_depth", value="0", result=170.0, source="measured", sd=drifted_sd,
                    repetitions=3, setup="m.gguf · tg128 · depth 0 · -t 2"),
        Observation(**common, lever="n_depth", value="0", result=160.0, source="predicted"),
        Observation(**common, lever="n_depth", value="512", result=150.0, source="measured", sd=1.0, repetitions=3,
                    setup="m.gguf · tg128 · depth 512 · -t 2"),
        Observation(**common, lever="n_depth", value="512", result=150.0, source="predicted"),
        Observation(model="m", quant="Q4_1", device="host", metric="bytes", unit="bytes", lever="x", value="1",
                    result=1e6, source="measured", sd=0.0, repetitions=1, setup="m.gguf"),
    ])


def test_with_drift_widens_measured_speeds_only():
    df = _frame()
    df.attrs["conditions"] = "c"
    wide = steps.with_drift(df, 0.10)
    m = wide[(wide["source"] == "measured") & (wide["unit"] == "tok/s")]
    assert list(m["sd"]) == pytest.approx([math.hypot(2.0, 17.0), math.hypot(1.0, 15.0)])
    assert float(wide[wide["unit"] == "bytes"]["sd"].iloc[0]) == 0.0, "a memory figure does not drift with speed"
    assert (wide[wide["source"] == "predicted"]["sd"] == 0).all()
    assert wide.attrs["conditions"] == "c" and list(df["sd"])[0] == 2.0, "the frame given is left as it is"
    assert steps.with_drift(df, None) is df
    # the headline's spread then includes it
    assert headline_figures(wide, lever="n_depth")["sd"] > headline_figures(df, lever="n_depth")["sd"]


def test_measured_points_by_setup():
    pts = steps.measured_points(_frame())
    assert [(p["setup"], p["metric"], p["measured"]) for p in pts] == [
        ("m.gguf · tg128 · depth 0 · -t 2", "tg_tps", 170.0), ("m.gguf · tg128 · depth 512 · -t 2", "tg_tps", 150.0)]


# ------------------------------------------------------------------------------------------------
# the headline and the index
# ------------------------------------------------------------------------------------------------

def _pair(start, end):
    return {"start": _ref(start, 2.0), "end": _ref(end, 2.0, "end"),
            "shift": reference_shift(_ref(start, 2.0), _ref(end, 2.0, "end")), "machine_ratio": 0.9}


def test_the_headline_says_when_the_machine_moved():
    h = headline_record(150.0, 160.0, sd=20.0, sd_repetitions=2.0, reference=_pair(170.0, 136.0))
    text = headline_text(h)
    assert "reference 170.0 → 136.0 tok/s (-20.0 %, moved beyond its noise" in text
    assert "×0.90 of its calibration at the start" in text and "beyond ±15 %" not in text
    far = headline_text(headline_record(150.0, 160.0, reference={**_pair(170.0, 171.0), "machine_ratio": 0.7}))
    assert "×0.70 of its calibration at the start (beyond ±15 %" in far
    steady = headline_text(headline_record(150.0, 160.0, reference=_pair(170.0, 171.0)))
    assert "within its noise" in steady


def test_a_machine_check_stands_at_every_calibrated_thread_count_and_says_when_it_moved():
    from v100lab.measure.reference import machine_ratios
    from v100lab.predict.drift_scaling import at_every_thread_count, ratios

    rec = {"rungs": [{"config": "calib-wide:Q4_0", "type": "Q4_0", "threads": 2, "test": "tg", "ratio": 0.8,
                      "standard_error": None},
                     {"config": "calib-wide-pp:Q4_0", "type": "Q4_0", "threads": 2, "test": "pp", "ratio": 0.97,
                      "standard_error": None}]}
    both = at_every_thread_count(rec, [1, 2])
    assert sorted((r["threads"], r["test"]) for r in both["rungs"]) == [(1, "pp"), (1, "tg"), (2, "pp"), (2, "tg")]
    assert all(r["measured_threads"] == 2 for r in both["rungs"])
    # the decode rung moved beyond the 10 % tolerance, the prompt rung did not: decode scaled, prompt as calibrated
    assert ratios(both, 1) == {"tg": {"Q4_0": 0.8}, "pp": 1.0, "bandwidth_gbs": None, "moved": 1}
    assert machine_ratios(both, 2) == {"tg": 0.8, "pp": 0.97, "moved": True, "measured_at": None}
    calm = {"rungs": [dict(rec["rungs"][0], ratio=0.95)]}
    assert machine_ratios(calm, 2) == {"tg": 0.95, "pp": None, "moved": False, "measured_at": None}
    assert machine_ratios(None, 2) is None and machine_ratios(calm, 1) is None


def test_a_recent_machine_check_of_the_same_calibration_is_reused_and_an_old_one_is_not(fresh_cache, monkeypatch):
    """A batch's notebooks start minutes apart: the check one of them made is the next one's, as long as it is
    recent, of the same calibration and at the same thread count; otherwise the rungs are decoded again."""
    import json

    from v100lab.base.clock import utc_stamp
    from v100lab.facts import devices
    from v100lab.measure import drift_check, reference
    from v100lab.predict import rates

    class Measured(Exception):
        pass

    def measuring(*a, **k):
        raise Measured

    devices.write_host_profile({"id": "host", "name": "host CPU (test)", "kind": "cpu", "memory_gib": 8.0,
                                "bandwidth_gbs": 20.0, "fingerprint": devices.host_fingerprint(),
                                rates.PROFILE_KEY: {"threads": {"2": {"bandwidth_gbs": 10.0, "efficiency": 1.0}},
                                                    "measured_at": "2026-12-07T10:00:00Z"}})
    monkeypatch.setattr(drift_check, "check", measuring)
    kept = {"rungs": [{"type": "Q4_0", "threads": 2, "test": "tg", "ratio": 1.2, "standard_error": None}],
            "measured_at": utc_stamp()}
    path = fresh_cache / "machine-check.json"

    def keep(**over):
        path.write_text(json.dumps({"measured_at": kept["measured_at"], "threads": 2,
                                    "calibration_measured_at": "2026-12-07T10:00:00Z", "record": kept, **over}))

    keep()
    assert reference.machine_check(2) == kept
    for stale in ({"measured_at": "2026-12-07T09:00:00Z"}, {"threads": 1},
                  {"calibration_measured_at": "2026-12-06T10:00:00Z"}):
        keep(**stale)
        with pytest.raises(Measured):
            reference.machine_check(2)
    keep()
    with pytest.raises(Measured):
        reference.machine_check(2, reuse_s=0)


def _run(nb, points, reference=None, params="params/default.yaml"):
    return runner.RunResult(params=params, notebook=f"notebooks/{nb}.ipynb", scenario="default", model="default",
                            device="host", status="ok", reason="", duration_s=1.0, started="", digest="",
                            executed=None, report=None,
                            headline=headline_record(points[0]["measured"] if points else None, None,
                                                     measured_points=points, reference=reference))


def _pt(setup, measured, sd):
    return {"setup": setup, "metric": "tg_tps", "measured": measured, "sd": sd, "repetitions": 3}


def test_the_index_shows_whether_notebooks_agree_on_one_configuration():
    a, b = "SmolLM2 · tg128 · depth 0 · -c 2048 · -t 2", "SmolLM2 · tg128 · depth 1024 · -c 2048 · -t 2"
    results = [_run("02_bandwidth_ceiling", [_pt(a, 170.1, 2.1)], _pair(170.0, 168.0)),
               _run("03_baseline", [_pt(a, 176.6, 4.7)]),
               _run("09_threads", [_pt(a, 136.6, 11.0)], _pair(170.0, 130.0)),
               _run("07_flash_attention", [_pt(b, 114.2, 0.6)]),
               _run("12_final_config", [_pt(b, 112.0, 1.3)]),
               _run("06_context", [_pt(a, 150.0, 5.0)], params="params/other.yaml")]   # another scenario
    found = runner.agreements(results)
    assert [(x.setup, len(x.figures), x.agree) for x in found] == [(a, 3, False), (b, 2, True)]
    assert found[0].widest == pytest.approx(176.6 / 136.6 - 1)
    html = runner.index_html(results, 1.0)
    assert "The same configuration in several notebooks" in html and "⚠ differ" in html and ">agree<" in html
    assert "09_threads: 136.6 ± 11.0" in html
    assert "⚠ moved" in html and "170.0 → 130.0" in html, "the run whose reference moved is marked"


def test_the_index_survives_a_reference_that_is_not_numbers():
    bad = _run("03_baseline", [_pt("s", 1.0, 0.1)])
    bad = runner.RunResult(**{**bad.as_dict(), "headline": {**bad.headline, "reference": {"start": {"tps": "<b>"}},
                                                            "measured_points": "nonsense"}})
    other = _run("02_x", [])
    other = runner.RunResult(**{**other.as_dict(), "headline": {
        **other.headline, "measured_points": [{"setup": "s", "metric": "tg_tps", "measured": "x"}]}})
    html = runner.index_html([bad, other], 1.0)
    assert "<b>" not in html and "several notebooks" not in html


# ------------------------------------------------------------------------------------------------
# real llama.cpp: the references of one run
# ------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_run_records_its_start_and_end_references(monkeypatch):
    from pathlib import Path

    from v100lab.workbook.scenario import load_scenario

    monkeypatch.setattr(steps, "_REFS", {})       # this test's run only: later tests' frames decode no reference

    sc = load_scenario(Path(__file__).resolve().parents[1] / "params" / "ci.yaml")
    start = steps.reference_start(sc)
    assert start is not None and start["tps"] > 0 and start["threads"] == 1 and start["when"] == "start"
    assert start["model"].endswith(".gguf") and start["repetitions"] == 3
    assert steps.reference_start(sc) is start, "one start per run (kernel)"
    # no step has measured yet: the end is decoded when asked
    ref = steps.reference_end()
    assert ref["start"] is start and ref["end"]["tps"] > 0 and ref["end"]["when"] == "end"
    assert ref["shift"]["ratio"] == pytest.approx(ref["end"]["tps"] / start["tps"], rel=1e-3)
    assert isinstance(ref["shift"]["moved"], bool)
    # a step that measured speeds: the reference decoded after it, its spreads widened by the drift since the last
    common = dict(model="m", quant="Q4_1", device="host", lever="n_depth", value="0", metric="tg_tps", unit="tok/s")
    df = steps.lever_frame([Observation(**common, result=100.0, source="measured", sd=1.0, repetitions=3),
                            Observation(**common, result=90.0, source="predicted")])
    shift = df.attrs["reference_shift"]
    assert shift["ratio"] > 0
    measured = df[df["source"] == "measured"]["sd"].iloc[0]
    assert measured == pytest.approx(spread_with_drift(100.0, 1.0, shift["drift"]))
    after = steps.reference_end()
    assert after["end"]["when"] == "after measuring", "the end is the reference after the last measuring step"
    # a step that measured no speed decodes nothing
    assert "reference_shift" not in steps.lever_frame([Observation(**common, result=90.0, source="predicted")]).attrs


@pytest.mark.slow
def test_a_run_start_checks_the_machine_on_calibrations_rung_and_leaves_predictions_alone(fresh_cache,
                                                                                          small_calibration,
                                                                                          monkeypatch):
    """A tiny real calibration whose stored Q4_0 decode figure is halved (the machine "moved" deterministically to
    twice its calibrated speed): a run's start decodes that rung again, finds it about ×2 and says so, and this
    run's host predictions stay the calibration's — the stored profile untouched."""
    from pathlib import Path

    from v100lab.facts import devices
    from v100lab.measure import calibration
    from v100lab.predict import rates
    from v100lab.workbook.scenario import load_scenario

    monkeypatch.setattr(steps, "_REFS", {})
    monkeypatch.setattr(calibration, "wait_for_quiet", lambda *a, **k: 0.0)
    small_calibration([("F16", 0, False), ("Q4_0", 0, False), ("Q4_0", 128, False)])
    cal = calibration.calibrate(threads=[1], repetitions=2, passes=1, settle_rounds=0, force=True)
    for p in cal["points"]:
        if p["config"] == "calib-wide:Q4_0" and p.get("tg_tps"):
            p["tg_tps"] /= 2
    devices.write_host_profile({"id": "host", "name": "host CPU (test)", "kind": "cpu", "memory_gib": 8.0,
                                "bandwidth_gbs": 20.0, "fingerprint": devices.host_fingerprint(),
                                rates.PROFILE_KEY: cal})
    sc = load_scenario(Path(__file__).resolve().parents[1] / "params" / "ci.yaml")
    host = devices.get_device("host")
    unscaled = dict(rates.rates_for(host, RunConfig(n_threads=1)).tg_s_per_weight)
    assert unscaled
    start = steps.reference_start(sc)
    m = start["machine"]
    assert m["tg"] > 1.5 and m["moved"] is True
    assert "drift" not in rates.stored_calibration()
    assert rates.rates_for(host, RunConfig(n_threads=1)).tg_s_per_weight == pytest.approx(unscaled, rel=1e-12)
    ref = steps.reference_end()
    assert ref["machine_ratio"] == pytest.approx(m["tg"], rel=1e-3) and ref["machine_moved"] is True
    text = headline_text(headline_record(1.0, 1.0, reference=ref))
    assert f"×{m['tg']:.2f} of its calibration at the start (beyond ±15 %" in text

"""The drift check: calibration's own rungs decoded again, the machine's move from its
calibration measured, and the calibrated rates brought up to it — each weight type by its own rung.

The arithmetic (:mod:`v100lab.predict.drift_scaling`) is tested on stored records; the measurement (:mod:`v100lab.measure.drift_check`, and
``v100lab calibrate --check``) on a real, tiny calibration (``small_calibration``) with real llama.cpp."""

from __future__ import annotations

import datetime as dt
import os
import re
import statistics

import pytest

from v100lab.measure import calibration, drift_check
from v100lab.facts import devices
from v100lab.predict import drift_scaling, rates, speed
from v100lab.facts.config import RunConfig
from v100lab.base.errors import ConfigError, RunFailed
from v100lab.gguf.skeleton import skeleton_spec

NOW = dt.datetime(2026, 12, 4, 21, 0, tzinfo=dt.timezone.utc)

FIT = {"bandwidth_gbs": 20.0, "efficiency": 1.0, "tg_s_per_weight": {"Q4_0": 1e-10, "Q4_K": 2e-10, "F16": 3e-10},
       "tg_row_s": 1e-8, "attn_s_per_op": 4e-11, "attn_s_per_head_cell": 3e-8, "overhead_token_s": 0.0,
       "overhead_layer_s": 2e-5, "attn_split_layer_s": 1e-5,
       "pp_s_per_weight": {"Q4_0": 1e-11, "Q4_K": 2e-11}, "pp_attn_s_per_op": 1e-12, "pp_overhead_s": 0.0}


def _rung(t, th, ratio, test="tg", tps=None, se=None):
    return {"config": f"calib-wide:{t}", "type": t, "threads": th, "test": test, "calibration_tps": 100.0,
            "tps": tps or [100.0 * ratio], "ratio": ratio, "standard_error": se}


def _record(applied=True, **over):
    rec = {"measured_at": "2026-12-04T20:55:00Z", "calibration_measured_at": "2026-12-04T18:00:00Z", "loads": 3,
           "rungs": [_rung("Q4_0", 1, 1.25), _rung("Q4_K", 1, 0.8), _rung("Q8_0", 1, 0.5),
                     _rung("Q4_0", 1, 2.0, test="pp")],
           "bandwidth_gbs": {"1": 30.0}, "applied": applied}
    rec.update(over)
    return rec


def test_a_check_scales_each_type_by_its_own_rung_and_the_rest_by_the_base_rung():
    """Each type's cost per weight and its rows' cost divided by its rung's ratio (F16, without a rung: the nearest
    type's by bits per weight, Q8_0's), attention and the per-layer costs by the Q4_0 rung's, the prompt by the
    prompt rung's; the bandwidth is the one measured with the check, and the efficiency — the best bandwidth a rung
    reached over STREAM's — is that rung's moved by its own ratio, over the bandwidth now. A thread count the check
    did not measure is left as calibrated."""
    out = drift_scaling.scaled_fit(FIT, _record(), 1)
    assert out["tg_s_per_weight"] == pytest.approx({"Q4_0": 1e-10 / 1.25, "Q4_K": 2e-10 / 0.8, "F16": 3e-10 / 0.5})
    assert out["tg_row_s_by_type"] == pytest.approx({"Q4_0": 1e-8 / 1.25, "Q4_K": 1e-8 / 0.8, "F16": 1e-8 / 0.5})
    for key in ("attn_s_per_op", "attn_s_per_head_cell", "overhead_layer_s", "attn_split_layer_s", "tg_row_s"):
        assert out[key] == pytest.approx(FIT[key] / 1.25), key
    assert out["pp_s_per_weight"] == pytest.approx({"Q4_0": 1e-11 / 2, "Q4_K": 2e-11 / 2})
    assert out["pp_attn_s_per_op"] == pytest.approx(1e-12 / 2)
    assert out["bandwidth_gbs"] == 30.0 and out["efficiency"] == 1.0       # STREAM was the best: it stays so
    # Q4_K's rung reached 1.5 × STREAM's 20 GB/s; with a check that finds Q4_K at ×0.8 and the memory at 10 GB/s, it
    # reaches 24 GB/s: 2.4 × the bandwidth now. A fit stored without the type: the base (Q4_0) rung's ratio
    fit = dict(FIT, efficiency=1.5, efficiency_type="Q4_K")
    assert drift_scaling.scaled_fit(fit, _record(bandwidth_gbs={"1": 10.0}), 1)["efficiency"] == pytest.approx(2.4)
    assert drift_scaling.scaled_fit(dict(fit, efficiency_type=None), _record(bandwidth_gbs={"1": 10.0}), 1)["efficiency"] \
        == pytest.approx(1.5 * 20 * 1.25 / 10)
    assert drift_scaling.scaled_fit(fit, _record(bandwidth_gbs={"1": 40.0}), 1)["efficiency"] == 1.0
    assert FIT["tg_s_per_weight"]["Q4_0"] == 1e-10          # the calibration itself is not changed
    assert drift_scaling.scaled_fit(FIT, _record(), 2) == FIT
    assert drift_scaling.scaled_fit(FIT, None, 1) == FIT


def _store(cal):
    devices.write_host_profile({"id": "host", "name": "host CPU (test)", "kind": "cpu", "memory_gib": 8.0,
                                "bandwidth_gbs": 20.0, "fingerprint": devices.host_fingerprint(),
                                rates.PROFILE_KEY: cal})


def _calibration(**over):
    current = rates.current_build_facts()
    cal = {"version": calibration.CALIBRATION_VERSION, "measured_at": "2026-12-04T18:00:00Z",
           "build": dict(current["build"]), "cpu": dict(current["cpu"]), "points": [],
           "threads": {"1": dict(FIT, tg_fit_rel_err=[0.01, -0.02]), "2": dict(FIT, tg_fit_rel_err=[0.01])}}
    cal.update(over)
    return cal


def test_an_applied_check_moves_a_prediction_by_the_rungs_ratios(fresh_cache):
    """A Q4_0 model on 1 thread, predicted from a calibration and from the same calibration with a check that found
    every rung 25 % faster and the memory 25 % faster: the prediction is 25 % faster. Only an applied check counts,
    and the profile's line says which one is in use."""
    spec = skeleton_spec("llama2-7b", "Q4_0")
    cfg = RunConfig(n_ctx=1024, n_threads=1, n_gpu_layers=0, flash_attn="on")
    _store(_calibration())
    base = speed.predict(spec, ["host"], cfg, depth=256).tg_tps
    rungs = [_rung(t, 1, 1.25) for t in ("Q4_0", "Q4_K")]
    _store(_calibration(drift=_record(rungs=rungs, bandwidth_gbs={"1": 25.0})))
    p = speed.predict(spec, ["host"], cfg, depth=256)
    assert p.tg_tps == pytest.approx(1.25 * base, rel=1e-6)
    assert any("drift check of 2026-12-04 20:55 UTC" in n and ", applied" in n and "not applied" not in n
               for n in p.notes)
    _store(_calibration(drift=_record(applied=False, rungs=rungs, bandwidth_gbs={"1": 25.0})))
    assert speed.predict(spec, ["host"], cfg, depth=256).tg_tps == pytest.approx(base, rel=1e-9)
    # at 2 threads the check measured nothing: the calibration's own rates (a machine of one core predicts 2 at 1)
    if (os.cpu_count() or 1) < 2:
        return
    cfg2 = RunConfig(n_ctx=1024, n_threads=2, n_gpu_layers=0, flash_attn="on")
    _store(_calibration())
    base2 = speed.predict(spec, ["host"], cfg2, depth=256).tg_tps
    _store(_calibration(drift=_record(rungs=rungs)))
    assert speed.predict(spec, ["host"], cfg2, depth=256).tg_tps == pytest.approx(base2, rel=1e-9)


def test_the_profile_line_says_how_far_the_machine_moved_and_warns_when_not_applied(fresh_cache):
    rungs = [_rung("Q4_0", 1, 0.70, tps=[70.0, 71.0, 69.0], se=0.01), _rung("Q4_K", 1, 1.05, se=0.02),
             _rung("Q4_0", 1, 1.05, test="pp")]
    _store(_calibration(drift=_record(rungs=rungs)))
    d = rates.describe_host_rates(now=NOW)
    assert ("drift check of 2026-12-04 20:55 UTC (5 min old): decode at ×0.70–×1.05 of calibration (median ×0.88), "
            "prompt ×1.05, 1 of 3 rungs moved, applied") in d.line
    assert not any("moved" in w for w in d.warnings)
    _store(_calibration(drift=_record(applied=False, rungs=rungs)))
    d = rates.describe_host_rates(now=NOW)
    assert "not applied" in d.line
    assert any("found the machine moved from its calibration (Q4_0 tg at 1 t ×0.70)" in w for w in d.warnings)
    # a move inside its loads' noise is not one: ×0.85 with a standard error of 10 %
    _store(_calibration(drift=_record(applied=False, rungs=[_rung("Q4_0", 1, 0.85, se=0.10)])))
    assert not any("moved" in w for w in rates.describe_host_rates(now=NOW).warnings)


def test_a_check_that_finds_nothing_moved_changes_nothing(fresh_cache):
    """Rungs within 10 % of their calibration figure, or within two standard errors of their loads' median, have not
    moved: they scale nothing, the bandwidth the check measured is not taken, and the line says the calibration's
    rates stand. One rung that moved scales what it prices, and brings the bandwidth in."""
    quiet = _record(rungs=[_rung("Q4_0", 1, 1.08), _rung("Q4_K", 1, 0.85, se=0.10), _rung("Q4_0", 1, 1.09, test="pp")],
                    bandwidth_gbs={"1": 60.0})
    assert drift_scaling.scaled_fit(FIT, quiet, 1) == FIT
    assert drift_scaling.ratios(quiet, 1) == {"tg": {"Q4_0": 1.0, "Q4_K": 1.0}, "pp": 1.0, "bandwidth_gbs": None, "moved": 0}
    _store(_calibration(drift=quiet))
    d = rates.describe_host_rates(now=NOW)
    assert "no rung moved beyond its noise, the calibration's rates stand" in d.line and not d.warnings
    one = _record(rungs=[_rung("Q4_0", 1, 1.08), _rung("Q4_K", 1, 0.8)], bandwidth_gbs={"1": 60.0})
    out = drift_scaling.scaled_fit(FIT, one, 1)
    assert out["tg_s_per_weight"]["Q4_K"] == pytest.approx(2e-10 / 0.8)
    assert out["tg_s_per_weight"]["Q4_0"] == FIT["tg_s_per_weight"]["Q4_0"] and out["bandwidth_gbs"] == 60.0


def test_combine_joins_every_references_loads():
    a = {"measured_at": "t1", "calibration_measured_at": "c", "loads": 2, "bandwidth_gbs": {"1": 20.0},
         "rungs": [_rung("Q4_0", 1, 0.9, tps=[90.0, 92.0])]}
    b = {"measured_at": "t2", "calibration_measured_at": "c", "loads": 2, "bandwidth_gbs": {"1": 24.0},
         "rungs": [_rung("Q4_0", 1, 1.2, tps=[120.0, 118.0])]}
    out = drift_check.combine([a, b])
    (r,) = out["rungs"]
    assert r["tps"] == [90.0, 92.0, 120.0, 118.0] and r["ratio"] == pytest.approx(1.05)
    assert r["standard_error"] is not None and out["checks"] == 2 and out["loads"] == 4
    assert out["bandwidth_gbs"] == {"1": 22.0} and out["measured_at"] == "t2" and out["first_measured_at"] == "t1"
    assert drift_check.combine([]) is None


def test_a_check_needs_a_calibration_holding_its_rungs(fresh_cache):
    with pytest.raises(ConfigError, match="no calibration stored"):
        drift_check.check()
    cal = _calibration(points=[{"config": "calib-wide:Q4_0", "threads": 1, "tg_tps": 30.0}])
    with pytest.raises(ConfigError, match="no thread count 4"):
        drift_check.plan(cal, threads=[4])
    with pytest.raises(ConfigError, match="no calibration rung for type 'Q9_9'"):
        drift_check.plan(cal, types=["Q9_9"])
    with pytest.raises(ConfigError, match="holds none of the rungs"):
        drift_check.plan(_calibration(points=[{"config": "other", "threads": 1, "tg_tps": 30.0}]))
    todo = drift_check.plan(cal)
    assert [(cp.name, th, test) for cp, th, test in todo] == [("calib-wide:Q4_0", 1, "tg")]


@pytest.mark.slow
def test_a_real_check_measures_calibrations_rungs_and_is_applied(fresh_cache, small_calibration, monkeypatch, capsys):
    """A tiny real calibration, then a real check of its two rungs: every rung measured `loads` times against the
    figure calibration stored, its ratio their median's; stored applied, the profile's line and the rates say so;
    `calibrate --check --no-apply` records it without applying, and a check against a calibration that changed is
    refused."""
    from v100lab.cli import main as cli

    small_calibration([("F16", 0, False), ("Q4_0", 0, False), ("Q4_0", 128, False)])
    monkeypatch.setattr(calibration, "wait_for_quiet", lambda *a, **k: 0.0)
    cal = calibration.calibrate(threads=[1], repetitions=2, passes=1, settle_rounds=0, force=True)
    # the machine "moves" deterministically: the stored Q4_0 figure halved, so that the check finds that rung twice
    # as fast as calibration says (its F16 rung where it was)
    for p in cal["points"]:
        if p["config"] == "calib-wide:Q4_0":
            p["tg_tps"] /= 2
    devices.write_host_profile({rates.PROFILE_KEY: cal})
    rec = drift_check.check(loads=2)
    by = {r["type"]: r for r in rec["rungs"]}
    assert sorted(by) == ["F16", "Q4_0"] and all(len(r["tps"]) == 2 for r in by.values())
    stored_tps = {p["config"]: p["tg_tps"] for p in cal["points"]}
    for t, r in by.items():
        assert r["calibration_tps"] == pytest.approx(stored_tps[f"calib-wide:{t}"], abs=0.01)
        assert r["ratio"] == pytest.approx(statistics.median(r["tps"]) / r["calibration_tps"], rel=1e-3)
    assert rec["bandwidth_gbs"]["1"] > 0 and rec["applied"] is False
    drift_check.store(rec)
    stored = rates.stored_calibration()[drift_scaling.DRIFT_KEY]
    assert stored["applied"] is True and stored["rungs"] == rec["rungs"]
    # (F16's rung may move too on a noisy machine: only Q4_0's move is certain)
    assert by["Q4_0"]["ratio"] > 1.5 and "Q4_0" in [r["type"] for r in drift_scaling.moved(stored)]
    line = rates.describe_host_rates().line
    assert "drift check of" in line and re.search(r"[12] of 2 rungs moved, applied, llama\.cpp", line)
    r = rates.rates_for(devices.get_device("host"), RunConfig(n_threads=1))
    assert "scaled by the drift check of" in r.source

    assert cli.main(["calibrate", "--check", "--no-apply", "--types", "Q4_0", "--loads", "1"]) == 0
    out = capsys.readouterr().out
    assert "calib-wide:Q4_0" in out and "calib-wide:F16" not in out and "recorded, not applied" in out
    assert rates.stored_calibration()[drift_scaling.DRIFT_KEY]["applied"] is False

    other = dict(rec, calibration_measured_at="2020-01-01T00:00:00Z")
    with pytest.raises(RunFailed, match="calibration changed"):
        drift_check.store(other)


def test_the_base_rung_is_calibrations_depth_rung():
    """Attention and the per-layer costs are pinned on calibration's depth rung; the check scales them by its ratio."""
    assert drift_scaling.BASE_TYPE == calibration.DEPTH_TYPE and drift_check.PROMPT_POINT.type_name == calibration.DEPTH_TYPE


def test_calibrate_check_errors_are_one_line(fresh_cache, capsys):
    from v100lab.cli import main as cli

    assert cli.main(["calibrate", "--check"]) == 2
    assert "no calibration stored" in capsys.readouterr().err
    assert cli.main(["calibrate", "--no-apply"]) == 2
    assert "go with --check" in capsys.readouterr().err
    assert cli.main(["calibrate", "--check", "--show"]) == 2
    assert cli.main(["calibrate", "--check", "--passes", "5"]) == 2
    assert "not with --check" in capsys.readouterr().err


def test_an_hour_old_profile_needs_a_check_and_a_fresh_check_renews_it():
    """scripts/workbook.sh checks the drift of a profile whose newest measurement, the calibration or its check, is
    over an hour old; nothing without a calibration."""
    assert drift_check.needs_check(None) is False
    cal = _calibration()                                                   # 18:00
    assert drift_check.needs_check(cal, now=NOW) is True                   # 21:00
    assert drift_check.needs_check(cal, now=dt.datetime(2026, 12, 4, 18, 30, tzinfo=dt.timezone.utc)) is False
    assert drift_check.needs_check(_calibration(drift=_record()), now=NOW) is False        # checked 20:55
    assert drift_check.needs_check(_calibration(measured_at=None), now=NOW) is True

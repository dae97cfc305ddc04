"""The host profile's provenance and quality: what every host prediction says about its rates (age, fit
residuals, the llama.cpp build and CPU it was made with), the warnings when those differ from the ones in
use, and calibration's refusal to store a profile that fails its quality bounds.

Profiles are written into a temporary cache (``fresh_cache``); the refusal is tested on a real, tiny
calibration (``small_calibration``) whose thresholds make any real measurement "too noisy"."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys

import pytest

from v100lab.measure import calibration
from v100lab.facts import devices
from v100lab.predict import rates
from v100lab.base.errors import RunFailed

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)


def _calibration(current, **over):
    """A stored calibration as calibrate() writes it, made 3 h before NOW with this machine's build and CPU."""
    costs = {t: 2e-10 for t in ("F16", "Q8_0", "Q4_0", "Q4_K", "Q6_K")}
    cal = {
        "version": calibration.CALIBRATION_VERSION, "measured_at": "2026-12-01T09:00:00Z",
        "llama_cpp_python": current["build"]["llama_cpp_python"], "build_commit": "0c1e570",
        "build": {**current["build"], "build_commit": "0c1e570"}, "cpu": dict(current["cpu"]),
        "points": [{"config": f"p{i}", "threads": 1, "tg_tps": 100.0, "tg_cv": cv} for i, cv in
                   enumerate((0.02, 0.03, 0.15, 0.01))],
        "threads": {"1": {"bandwidth_gbs": 20.0, "efficiency": 1.0, "tg_s_per_weight": costs, "attn_s_per_op": 1e-11,
                          "attn_tail_s_per_op": 0.0, "overhead_token_s": 0.0, "overhead_layer_s": 1e-5,
                          "pp_s_per_weight": {t: c / 10 for t, c in costs.items()}, "pp_overhead_s": 0.0,
                          "pp_attn_s_per_op": 1e-12, "tg_fit_rel_err": [0.12, -0.03, 0.05, 0.01],
                          "pp_fit_rel_err": [0.02, -0.04]}},
    }
    cal.update(over)
    return cal


def _store(cal):
    """A host profile measured on this machine (so --device host uses it) holding ``cal``."""
    fp = devices.host_fingerprint()
    devices.write_host_profile({"id": "host", "name": "host CPU (test)", "kind": "cpu", "memory_gib": 8.0,
                                "bandwidth_gbs": 20.0, "fingerprint": fp, rates.PROFILE_KEY: cal})


# ---- the description -----------------------------------------------------------------------------

def test_age_and_quality_from_a_stored_profile(fresh_cache):
    current = rates.current_build_facts()
    _store(_calibration(current))
    d = rates.describe_host_rates(now=NOW)
    assert d.calibrated and d.warnings == ()
    assert d.line.startswith("host calibration of 2026-12-01 09:00 UTC (3 h old)")
    assert "max residual 12 % (tg, 1 thread(s); median 4 %)" in d.line
    assert "1 of 4 points noisy" in d.line and "llama.cpp 0c1e570" in d.line
    assert d.max_residual == pytest.approx(0.12) and d.age_s == pytest.approx(3 * 3600)
    # an older profile (local time with an offset, no quality, build or CPU recorded) is still described
    _store({"measured_at": "2026-11-28T12:00:00+0000", "threads": {"1": {"tg_fit_rel_err": [0.3, 0.1]}}})
    d = rates.describe_host_rates(now=NOW)
    assert "(3 days old)" in d.line and "max residual 30 % (tg" in d.line and d.warnings == ()


def test_uncalibrated_host_says_what_is_assumed(fresh_cache):
    d = rates.describe_host_rates(now=NOW)
    assert not d.calibrated and d.line.startswith("uncalibrated host: assumed 70%")


def test_another_build_or_cpu_is_a_warning_naming_which(fresh_cache):
    current = rates.current_build_facts()
    other_build = {**current["build"], "llama_cpp_python": "0.0.1", "build_flags": "-DGGML_NATIVE=ON"}
    d = rates.describe_host_rates(_calibration(current, build=other_build, llama_cpp_python="0.0.1"), now=NOW)
    assert len(d.warnings) == 1
    assert "another llama.cpp build" in d.warnings[0] and "llama-cpp-python 0.0.1 → " in d.warnings[0]
    assert "build flags differ" in d.warnings[0]
    other_cpu = {**current["cpu"], "model": "Some Other CPU", "flags": "sse4_2"}
    d = rates.describe_host_rates(_calibration(current, cpu=other_cpu), now=NOW)
    assert len(d.warnings) == 1 and "another CPU" in d.warnings[0]
    assert "CPU model 'Some Other CPU' →" in d.warnings[0]
    # the same CPU model string on another host under the VM: the last-level cache gives it away
    moved = {**current["cpu"], "llc_bytes": 32 * 2**20}
    d = rates.describe_host_rates(_calibration(current, cpu=moved),
                                  current={**current, "cpu": {**current["cpu"], "llc_bytes": 300 * 2**20}}, now=NOW)
    assert len(d.warnings) == 1 and "last-level cache 32 MiB → 300 MiB" in d.warnings[0]
    # a rebuild of the same version (another libggml-cpu) is a different build too
    if current["build"]["ggml_cpu_sha256"]:
        rebuilt = {**current["build"], "ggml_cpu_sha256": "000000000000"}
        d = rates.describe_host_rates(_calibration(current, build=rebuilt), now=NOW)
        assert len(d.warnings) == 1 and "libggml-cpu 000000000000 →" in d.warnings[0]


def test_host_predictions_carry_the_description(fresh_cache):
    from v100lab.predict import speed
    from v100lab.facts.config import RunConfig
    from v100lab.gguf.skeleton import skeleton_spec

    current = rates.current_build_facts()
    _store(_calibration(current, cpu={**current["cpu"], "model": "Some Other CPU"}))
    pred = speed.predict(skeleton_spec("llama2-7b", "Q4_0"), ["host"], RunConfig(n_ctx=2048, n_threads=1))
    assert any(n.startswith("host: host calibration of ") for n in pred.notes)
    assert any(n.startswith("host: warning: the host profile was made on another CPU") for n in pred.notes)


def test_plan_shows_age_quality_and_warnings(fresh_cache):
    current = rates.current_build_facts()
    _store(_calibration(current, build={**current["build"], "llama_cpp_python": "0.0.1"}, llama_cpp_python="0.0.1",
                        measured_at=(dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=3))
                        .strftime("%Y-%m-%dT%H:%M:%SZ")))
    r = subprocess.run([sys.executable, "-m", "v100lab", "plan", "skeleton:llama2-7b:Q4_0", "--device", "host",
                        "-t", "1", "-c", "2048"], capture_output=True, text=True, env=dict(os.environ), timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(ln.startswith("note: host: host calibration of ") and "(3 h old)" in ln and "max residual 12 %" in ln
               for ln in lines), r.stdout
    assert any(ln.startswith("note: host: warning: the host profile was made with another llama.cpp build "
                             "(llama-cpp-python 0.0.1 → ") for ln in lines), r.stdout


def test_notebook_run_environment_shows_the_profile(fresh_cache):
    from v100lab.workbook.levers.baseline import run_environment

    current = rates.current_build_facts()
    _store(_calibration(current, cpu={**current["cpu"], "cpu_count": 999}))
    df = run_environment()
    row = df[df["fact"] == "host speed profile"].iloc[0]
    assert row["value"].startswith("host calibration of ") and "max residual 12 %" in row["value"]
    warn = df[(df["fact"] == "warning") & (df["note"] == "host speed profile")]
    assert len(warn) == 1 and "cores '999' →" in warn.iloc[0]["value"]


def test_tune_notes_carry_the_description(fresh_cache):
    from v100lab.advise.tune import tune

    current = rates.current_build_facts()
    _store(_calibration(current))
    res = tune("skeleton:llama2-7b:Q4_0", "host", min_ctx=2048)
    assert any(n.startswith("host: host calibration of ") for n in res.notes)


# ---- refusing a bad profile ------------------------------------------------------------------------

def test_quality_refusal_rule():
    q = {"noisy_points": 2, "measured_points": 8, "noisy_cv": 0.1, "max_residual": 0.25, "max_residual_fit": "tg",
         "max_residual_threads": 2}
    assert calibration._quality_refusal(q, 0.25, 0.25) is None                 # at the bounds: stored
    why = calibration._quality_refusal({**q, "noisy_points": 3, "max_residual": 0.3}, 0.25, 0.25)
    assert "3 of 8 points still noisy" in why and "misses a point by 30.0 % (tg, 2 thread(s)" in why


def test_a_machine_that_moved_between_the_passes_is_refused():
    """A calibration whose passes ran at different speeds is of no one moment: an AVX2 calibration whose rungs ran
    14 % faster in the first pass than in the other two predicted the default model 20-25 % slow."""
    def point(name, th, loads, settling=0):
        return {"config": name, "threads": th, "tg_cv": 0.01, "tg_tps": loads[0], "tg_pass_tps": loads,
                **({"settling_loads": settling} if settling else {})}

    steady = {"passes": 3, "threads": {}, "points": [
        point("a", 1, [20.0, 20.4, 19.8]), point("b", 1, [10.0, 9.9, 10.2, 10.1], settling=1),   # settling left out
        point("pair", 1, [30.0, 30.5, 30.2, 29.8, 30.1, 30.6, 30.0, 29.9, 30.3])]}               # 3 loads a pass
    assert rates.pass_drift(steady)["1"] < 0.03
    q = rates.calibration_quality(steady)
    assert q["max_pass_drift"] < 0.03 and calibration._quality_refusal(q, 0.25, 0.25) is None
    slowed = {**steady, "points": [point("a", 1, [23.0, 20.0, 20.1]), point("b", 1, [11.5, 10.0, 9.9]),
                                   point("c", 2, [40.0, 40.2, 39.9])]}
    d = rates.pass_drift(slowed)
    assert d["1"] == pytest.approx(0.15, abs=0.01) and d["2"] < 0.01
    q = rates.calibration_quality(slowed)
    why = calibration._quality_refusal(q, 0.25, 0.25)
    assert why and "moved by 15 % between the passes" in why
    # every prediction from such a profile says so
    cal = {**_calibration(rates.current_build_facts()), "passes": 3, "points": slowed["points"]}
    assert any("moved by 15 % between the calibration's passes" in w
               for w in rates.describe_host_rates(cal, now=NOW, stored=False).warnings)
    # one pass, or loads that do not split into the passes: nothing to judge
    assert rates.pass_drift({**slowed, "passes": 1}) == {}
    assert rates.pass_drift({"passes": 2, "points": [point("a", 1, [20.0, 25.0, 21.0])]}) == {}


def test_thread_counts_that_disagree_are_named_refused_and_warned(fresh_cache):
    """Two cores give at most twice one core's speed: a profile whose 2-thread decode rates are 2.7-4.2x its
    1-thread ones (as a real one did, the VM fast for the 2-thread points) measured its thread counts in different
    phases of the machine. calibration_quality names the types, calibrate refuses to store it, and every prediction
    from it carries a warning. Scaling at or under the thread ratio (plus the tolerance) is not flagged."""
    current = rates.current_build_facts()
    cal = _calibration(current)
    one = cal["threads"]["1"]
    two = {**one, "tg_s_per_weight": {t: c / (4.2 if t == "Q4_K" else 1.8) for t, c in one["tg_s_per_weight"].items()},
           "tg_fit_rel_err": [0.01]}
    cal["threads"]["2"] = two
    assert rates.superlinear_scaling(cal) == ["Q4_K 4.2x from 1 to 2 threads"]
    q = rates.calibration_quality(cal)
    assert q["superlinear"] == ["Q4_K 4.2x from 1 to 2 threads"]
    why = calibration._quality_refusal({**q, "noisy_points": 0}, 0.25, 0.5)
    assert why and "Q4_K 4.2x from 1 to 2 threads" in why and "different phases" in why
    _store(cal)
    d = rates.describe_host_rates(now=NOW)
    assert any("thread counts disagree" in w and "Q4_K 4.2x" in w for w in d.warnings)
    # a profile stored before the check (its quality record without the key) is judged from its rates
    _store({**cal, "quality": {k: v for k, v in q.items() if k != "superlinear"}})
    assert any("Q4_K 4.2x" in w for w in rates.describe_host_rates(now=NOW).warnings)
    # 2.3x from 1 to 2 threads is within the tolerance (15 %); a single thread count has nothing to compare
    two["tg_s_per_weight"] = {t: c / 2.3 for t, c in one["tg_s_per_weight"].items()}
    assert rates.superlinear_scaling(cal) == []
    assert rates.superlinear_scaling({"threads": {"2": two}}) == []
    # the row's cost is part of a weight's cost: a 2-thread fit that put more of the time
    # in the row and less in the weights is not superlinear (a row of 1024 weights costs 1.8x less at 2 threads) ...
    c = one["tg_s_per_weight"]["Q4_0"]
    one_r = {**one, "tg_row_s": 0.0}
    two_r = {**two, "tg_row_s": 1024 * c / 1.8 - 1024 * c / 4.2,
             "tg_s_per_weight": {**one["tg_s_per_weight"], "Q4_0": c / 4.2}}
    assert rates.superlinear_scaling({"threads": {"1": one_r, "2": two_r}}) == []
    # ... while the same per-weight rates without the row's cost are
    assert rates.superlinear_scaling({"threads": {"1": one_r, "2": {**two_r, "tg_row_s": 0.0}}}) == [
        "Q4_0 4.2x from 1 to 2 threads"]


@pytest.mark.slow
def test_calibrate_refuses_a_noisy_machine_then_force_stores_it(fresh_cache, small_calibration, monkeypatch):
    small_calibration([("F16", 0, True), ("Q4_0", 0, True), ("F16", 256, False)])
    monkeypatch.setattr(calibration, "wait_for_quiet", lambda *a, **k: 0.0)   # noisy is what this test wants
    # a cv threshold below 0: every real measurement is "noisy", even after its rerun (at 0, two repetitions that
    # agree to a few ppm store a cv that rounds to 0.0, and that point was not counted: a flake on a quiet machine)
    with pytest.raises(RunFailed) as err:
        calibration.calibrate(threads=[1], repetitions=2, rerun_above_cv=-1.0, settle_rounds=0)
    msg = str(err.value)
    assert "not stored" in msg and "3 of 3 points still noisy" in msg and "--force" in msg
    assert rates.PROFILE_KEY not in (devices.read_host_profile() or {})

    cal = calibration.calibrate(threads=[1], repetitions=2, rerun_above_cv=-1.0, force=True, settle_rounds=0)
    stored = devices.read_host_profile()[rates.PROFILE_KEY]
    assert stored == json.loads(json.dumps(cal))
    assert stored["forced"] is True and "3 of 3 points" in stored["quality"]["refused"]
    q = stored["quality"]
    assert q["noisy_points"] == 3 and q["threads"]["1"]["tg_points"] == 3 and "tg_max_residual" in q["threads"]["1"]
    assert stored["measured_at"].endswith("Z")
    assert stored["build"]["llama_cpp_python"] and stored["cpu"]["model"] == rates.current_build_facts()["cpu"]["model"]
    d = rates.describe_host_rates()
    assert "stored with --force" in d.line and "3 of 3 points noisy" in d.line
    # the only warning such a profile may carry is the tiny model's speed moving between its passes (rates.pass_drift)
    assert all("between the calibration's passes" in w for w in d.warnings)


def test_calibrate_show_says_what_attention_costs(fresh_cache, capsys):
    """`calibrate --show` prints, per thread count, attention's cost beside the decode rates — the per multiply-add
    cost from the streaming rung's depths, the head_dim tail and the split-KV cost where the fit found them."""
    from v100lab.cli import main as cli

    current = rates.current_build_facts()
    cal = _calibration(current)
    cal["threads"]["1"].update({"attn_s_per_op": 3.19e-10, "attn_tail_s_per_op": 1.5e-9})
    cal["threads"]["2"] = dict(cal["threads"]["1"], attn_s_per_op=1.56e-10, attn_split_layer_s=2.9e-5,
                               attn_s_per_missed_head_cell=3.4e-8, attn_cache_bytes=2.83 * 2**20)
    _store(cal)
    assert cli.main(["calibrate", "--show"]) == 0
    out = capsys.readouterr().out
    assert "attention: 0.319 ns per multiply-add (KV read from DRAM), +1.500 ns in a head's scalar tail\n" in out
    assert "attention: 0.156 ns per multiply-add (KV read from DRAM), +1.500 ns in a head's scalar tail, " \
           "29 us per layer on the split-KV path; 34.0 ns per query head × KV cell that misses once a layer's KV " \
           "cells pass 2.8 MiB" in out


def test_calibrate_show_says_how_many_parameters_the_residuals_are_over(fresh_cache, capsys):
    """The fit's residuals mean something only with points to spare: `--show` prints the parameter count beside the
    point count, and says so when none are left (each residual then 0 by construction)."""
    from v100lab.cli import main as cli

    cal = _calibration(rates.current_build_facts())
    n = len(cal["threads"]["1"]["tg_fit_rel_err"])
    cal["threads"]["1"]["tg_parameters"] = n - 2
    cal["threads"]["2"] = dict(cal["threads"]["1"], tg_parameters=n)
    _store(cal)
    assert cli.main(["calibrate", "--show"]) == 0
    out = capsys.readouterr().out
    assert f"over {n} points for {n - 2} parameters\n" in out
    assert f"over {n} points for {n} parameters (no degree of freedom left: the residuals are 0 by construction)" in out
    assert rates.calibration_quality(cal)["threads"]["2"]["tg_parameters"] == n


# ---- a miss against the point's own noise ------------------------------------------------------------------------

def test_median_standard_error_is_of_the_loads_logs():
    """sqrt(pi/2) x the sd of the loads' logarithms / sqrt(n); None under three loads; loads that agree give 0."""
    import math
    import statistics

    loads = [30.0, 33.0, 27.0, 36.0]
    want = math.sqrt(math.pi / 2) * statistics.stdev(math.log(x) for x in loads) / 2
    assert rates.median_standard_error(loads) == pytest.approx(want)
    assert rates.median_standard_error([30.0, 33.0]) is None and rates.median_standard_error(None) is None
    assert rates.median_standard_error([20.0, 20.0, 20.0]) == 0.0
    # nine loads as spread as four have a smaller error: the median of more moments of the machine
    assert rates.median_standard_error(loads * 2 + [31.5]) < rates.median_standard_error(loads)


def test_misses_are_judged_against_their_own_loads(fresh_cache, capsys):
    """A point missed by more than 10 % is named with its loads' standard error: beyond NOISE_Z of them it is the
    model's miss, within them the machine's noise can account for it, with under three loads nobody can tell. The
    profile's line and `calibrate --show` say which."""
    from v100lab.cli import main as cli

    cal = _calibration(rates.current_build_facts())
    steady, shaky = [100.0, 101.0, 99.0, 100.5, 99.5], [70.0, 130.0, 85.0, 115.0, 100.0]
    cal["points"][0]["tg_pass_tps"] = steady           # missed by +12 %, its median within ~0.4 %: the model's miss
    cal["points"][1]["tg_pass_tps"] = shaky
    cal["threads"]["1"]["tg_fit_rel_err"] = [0.12, -0.14, 0.11, 0.01]   # p2: no loads recorded
    misses = {m["config"]: m for m in rates.point_misses(cal)}
    assert sorted(misses) == ["p0", "p1", "p2"]
    assert misses["p0"]["beyond_noise"] is True and misses["p0"]["loads"] == 5
    assert misses["p1"]["beyond_noise"] is False and misses["p1"]["standard_error"] > 0.07
    assert misses["p2"]["beyond_noise"] is None and misses["p2"]["standard_error"] is None
    q = rates.calibration_quality(cal)
    assert q["misses_beyond_noise"] == 1 and len(q["misses"]) == 3
    _store(cal)
    line = rates.describe_host_rates(now=NOW).line
    assert ("3 point(s) missed by > 10 %: 1 by more than 2 standard errors of its own loads (p0 at 1 t +12 %), "
            "1 within them (the machine's noise can account for it), 1 with too few loads to tell") in line
    assert cli.main(["calibrate", "--show"]) == 0
    out = capsys.readouterr().out
    assert "fit misses p0 at 1 thread(s) by +12.0 % (its 5 loads' median ± 0.4 %: beyond 2 standard errors)" in out
    assert "fit misses p1 at 1 thread(s) by -14.0 % (its 5 loads' median ±" in out and "within 2 standard" in out
    assert "fit misses p2 at 1 thread(s) by +11.0 % (0 load(s): too few to tell" in out
    # residuals whose count does not match the stored points (an older or partial calibration): nothing is named
    cal["threads"]["1"]["tg_fit_rel_err"] = [0.3]
    assert rates.point_misses(cal) == []


def test_a_quick_profile_says_so_and_how_far_its_reference_moved(fresh_cache, capsys):
    """A quick calibration (one load a point) says so beside every host prediction, with how far its reference
    rung moved between its first and last load; past MAX_PASS_DRIFT that is a warning and a reason to refuse it."""
    from v100lab.cli import main as cli
    from v100lab.predict import speed
    from v100lab.facts.config import RunConfig
    from v100lab.gguf.skeleton import skeleton_spec

    current = rates.current_build_facts()
    quiet = _calibration(current, plan="quick", passes=1, reference_spread={"1": 0.03})
    d = rates.describe_host_rates(quiet, now=NOW, stored=False)
    assert "quick calibration (one load a point; its reference rung moved 3 % between its first and last load" in d.line
    assert d.warnings == () and d.quality["plan"] == "quick"
    assert calibration._quality_refusal(rates.calibration_quality(quiet), 0.25, 0.25) is None
    moved = {**quiet, "reference_spread": {"1": 0.18}}
    d = rates.describe_host_rates(moved, now=NOW, stored=False)
    assert any("moved by 18 % under the quick calibration" in w for w in d.warnings)
    assert "moved by 18 % between the reference rung's first and last load" in calibration._quality_refusal(
        rates.calibration_quality(moved), 0.25, 0.25)
    # a precise profile (or one stored before the plans) says nothing of a plan
    assert "quick calibration" not in rates.describe_host_rates(_calibration(current), now=NOW, stored=False).line
    _store(quiet)
    pred = speed.predict(skeleton_spec("llama2-7b", "Q4_0"), ["host"], RunConfig(n_ctx=2048, n_threads=1))
    assert any(n.startswith("host: host calibration of ") and "quick calibration" in n for n in pred.notes)
    assert cli.main(["calibrate", "--show"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("quick calibration in ")
    assert "1 thread(s): the reference rung (calib-wide:Q4_0) moved 3.0 % between its first and last load" in out


@pytest.mark.parametrize("argv, message", [
    (["calibrate", "--passes", "2"], "--passes and --settle-rounds go with --precise"),
    (["calibrate", "--settle-rounds", "0"], "--passes and --settle-rounds go with --precise"),
    (["calibrate", "--check", "--precise"], "not with --check"),
    (["calibrate", "--batching", "--precise"], "--precise is a calibration's plan"),
    (["calibrate", "--precise", "--passes", "0"], "--passes must be between 1 and"),
    (["calibrate", "--types", "Q4_0"], "--types goes with --check or --batching"),
    (["calibrate", "--model", "default"], "--model goes with --batching"),
    (["calibrate", "--batching", "--model", "default", "--types", "Q4_0"], "--types or --model, not both"),
    (["calibrate", "--batching", "--types", "Q4_0,IQ9_X"], "no calibration model of type IQ9_X"),
])
def test_calibrate_plan_flags_are_checked_before_anything_runs(fresh_cache, capsys, argv, message):
    from v100lab.cli import main as cli

    assert cli.main(argv) != 0
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1

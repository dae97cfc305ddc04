"""Measuring a drift check: calibration's own rungs decoded again now, against the figures calibration stored.

``v100lab calibrate --check`` (a few minutes on 2 cores, against calibration's 20-70): each weight type's decode rung
(calib-wide, the files calibration measured) and the :data:`v100lab.predict.drift_scaling.BASE_TYPE` prompt point, :data:`LOADS`
loads each, at each calibrated thread count, thread counts and types taking turns within each round of loads as
calibration's passes do; then the memory bandwidth with calibration's kernel. :func:`check` returns the record
:mod:`v100lab.predict.drift_scaling` reads (each rung's loads, their median's ratio to calibration's figure and its standard error);
:func:`store` puts it beside the calibration, applied or only recorded. :func:`combine` joins several records (the
benchmark's references before each pass and after the last) into one.

Nothing here is a validation model: the check measures calibration's own files only, so the rows
``benchmarks/bench_speed.py`` judges stay out of every figure that scales a prediction.
"""

from __future__ import annotations

import datetime as _dt
import logging
import statistics
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

from v100lab.measure import calibration
from v100lab.facts import devices
from v100lab.predict import drift_scaling
from v100lab.base.clock import parse_utc, utc_stamp
from v100lab.base.errors import ConfigError, RunFailed
from v100lab.predict.rates import PROFILE_KEY, median_standard_error, stored_calibration

log = logging.getLogger(__name__)

#: loads of each rung a check: three give each ratio a standard error (the median of a point's loads', as
#: calibration's points are judged) — on a 2-core VM a load's speed moves with an sd of 5-10 % from one
#: few-second moment to the next
LOADS = 3
#: the prompt's reference: calib-wide-pp in the base type at depth 0 (pp512 on 8 layers, a few seconds a load)
PROMPT_POINT = calibration.CalPoint(calibration.PROMPT_LABEL, calibration.CALIB_WIDE, drift_scaling.BASE_TYPE, decode=False)


def rung_point(type_name: str) -> calibration.CalPoint:
    """Calibration's decode rung of ``type_name`` (its config string is the stored point's: ``calib-wide:Q4_0``)."""
    return calibration.CalPoint("calib-wide", calibration.wide_spec(type_name), type_name, prompt=False)


def _stored(cal: Mapping[str, Any]) -> dict[tuple[str, int, str], float]:
    """(config, threads, test) → the tok/s calibration stored for that point."""
    out = {}
    for p in cal.get("points") or ():
        for test in ("tg", "pp"):
            if p.get(f"{test}_tps") and p.get("config"):
                out[(str(p["config"]), int(p["threads"]), test)] = float(p[f"{test}_tps"])
    return out


def _rung(config: str, type_name: str, threads: int, test: str, stored_tps: float, tps: Sequence[float]) -> dict:
    med = statistics.median(tps)
    se = median_standard_error(tps)
    return {"config": config, "type": type_name, "threads": threads, "test": test,
            "calibration_tps": round(stored_tps, 2), "tps": [round(x, 2) for x in tps],
            "ratio": round(med / stored_tps, 4), "standard_error": None if se is None else round(se, 4)}


def plan(cal: Mapping[str, Any], threads: Iterable[int] | None = None, types: Iterable[str] | None = None,
         prompt: bool = True) -> list[tuple[calibration.CalPoint, int, str]]:
    """The (point, threads, test) a check measures: every rung calibration stored a decode figure for (of ``types``
    when given) at every calibrated thread count (of ``threads``), and the prompt point. ConfigError when none is."""
    stored = _stored(cal)
    cal_threads = sorted(int(k) for k in (cal.get("threads") or {}))
    ths = sorted(set(threads)) if threads else cal_threads
    if missing := [th for th in ths if th not in cal_threads]:
        raise ConfigError(f"drift check: the calibration has no thread count {missing[0]} "
                          f"(calibrated: {', '.join(map(str, cal_threads)) or 'none'})")
    wanted = list(types) if types else list(calibration.CALIB_TYPES)
    if unknown := [t for t in wanted if t not in calibration.CALIB_TYPES]:
        raise ConfigError(f"drift check: no calibration rung for type '{unknown[0]}' "
                          f"(known: {', '.join(calibration.CALIB_TYPES)})")
    out = []
    for th in ths:
        for t in wanted:
            cp = rung_point(t)
            if (cp.name, th, "tg") in stored:
                out.append((cp, th, "tg"))
        if prompt and (PROMPT_POINT.name, th, "pp") in stored:
            out.append((PROMPT_POINT, th, "pp"))
    if not any(test == "tg" for _, _, test in out):
        raise ConfigError("drift check: the stored calibration holds none of the rungs a check measures "
                          "(made by an older version?): run `v100lab calibrate`")
    return out


def check(cal: Mapping[str, Any] | None = None, threads: Iterable[int] | None = None,
          types: Iterable[str] | None = None, loads: int = LOADS, prompt: bool = True, bandwidth: bool = True,
          progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Decode calibration's rungs now (:func:`plan`), ``loads`` rounds of every rung, thread counts and types in
    turn; return the drift record (``applied`` False: :func:`store` decides). A rung whose load crashes or hangs is
    left out with a warning; RunFailed when no rung could be measured."""
    cal = cal if cal is not None else stored_calibration()
    if not cal:
        raise ConfigError("no calibration stored for this host: run `v100lab calibrate` first (a drift check "
                          "compares the machine now with a calibration)")
    if loads < 1:
        raise ConfigError(f"drift check: loads must be >= 1, got {loads}")
    todo = plan(cal, threads, types, prompt)
    stored = _stored(cal)
    say = progress or (lambda s: log.info("%s", s))
    # only the rungs checked: after a quick calibration the precise plan's other models were never built
    paths = calibration.calibration_model_paths(retired=False, only=calibration.plan_models([cp for cp, _, _ in todo]))
    t0 = time.perf_counter()
    seen: dict[tuple[str, int, str], list[float]] = {}
    failed: set[tuple[str, int, str]] = set()
    for k in range(loads):
        for cp, th, test in todo:
            key = (cp.name, th, test)
            if key in failed:
                continue
            say(f"{cp.name} {test}, {th} thread(s), load {k + 1} of {loads}")
            try:
                m = calibration.measure(paths[(cp.label, cp.type_name)], th, depth=0,
                                        n_gen=calibration.CALIB_N_GEN if test == "tg" else 0,
                                        n_prompt=calibration.CALIB_N_PROMPT if test == "pp" else 0,
                                        repetitions=3, pp_repetitions=2)
            except RunFailed as exc:
                log.warning("drift check: %s at %d thread(s) failed (%s); left out", cp.name, th, exc)
                failed.add(key)
                seen.pop(key, None)
                continue
            seen.setdefault(key, []).append(1.0 / m[test].s_per_token)
    if not seen:
        raise RunFailed("drift check: no rung could be measured (see `v100lab selftest`)")
    record: dict[str, Any] = {
        "measured_at": utc_stamp(), "calibration_measured_at": cal.get("measured_at"), "loads": loads,
        "rungs": [_rung(cp.name, cp.type_name, th, test, stored[(cp.name, th, test)], seen[(cp.name, th, test)])
                  for cp, th, test in todo if (cp.name, th, test) in seen],
        "applied": False}
    if bandwidth:
        record["bandwidth_gbs"] = {}
        for th in sorted({th for _, th, _ in todo}):
            say(f"memory bandwidth, {th} thread(s)")
            calibration.wait_for_quiet()
            record["bandwidth_gbs"][str(th)] = calibration.measure_memory_bandwidth(threads=th)["bandwidth_gbs"]
    record["seconds"] = round(time.perf_counter() - t0, 1)
    return record


#: a calibration (or its last check) older than this is checked again by ``scripts/workbook.sh`` before its notebooks
STALE_AFTER_S = 3600.0


def needs_check(cal: Mapping[str, Any] | None, max_age_s: float = STALE_AFTER_S,
                now: _dt.datetime | None = None) -> bool:
    """Whether the host's rates are older than ``max_age_s``: its calibration, and its drift check if it has one
    (False without a calibration: there is nothing to check against)."""
    if not cal:
        return False
    now = now or _dt.datetime.now(_dt.timezone.utc)
    stamps = [parse_utc(cal.get("measured_at")), parse_utc((cal.get(drift_scaling.DRIFT_KEY) or {}).get("measured_at"))]
    newest = max((s for s in stamps if s is not None), default=None)
    return newest is None or (now - newest).total_seconds() > max_age_s


def combine(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Several checks of one calibration as one: each rung's loads joined (its ratio the median of all of them),
    the bandwidth the median of the checks'. None without records."""
    if not records:
        return None
    if len({rec.get("calibration_measured_at") for rec in records}) > 1:
        raise ConfigError("drift check: the records to combine were measured against different calibrations")
    loads: dict[tuple[str, int, str], list[float]] = {}
    first: dict[tuple[str, int, str], Mapping[str, Any]] = {}
    for rec in records:
        for r in rec.get("rungs") or ():
            key = (r["config"], int(r["threads"]), r["test"])
            loads.setdefault(key, []).extend(float(x) for x in r["tps"])
            first.setdefault(key, r)
    bws: dict[str, list[float]] = {}
    for rec in records:
        for th, bw in (rec.get("bandwidth_gbs") or {}).items():
            bws.setdefault(th, []).append(float(bw))
    out = {"measured_at": records[-1].get("measured_at"), "first_measured_at": records[0].get("measured_at"),
           "calibration_measured_at": records[0].get("calibration_measured_at"), "checks": len(records),
           "loads": sum(int(rec.get("loads") or 0) for rec in records),
           "rungs": [_rung(r["config"], r["type"], int(r["threads"]), r["test"], float(r["calibration_tps"]),
                           loads[key]) for key, r in first.items()],
           "applied": False}
    if bws:
        out["bandwidth_gbs"] = {th: statistics.median(v) for th, v in bws.items()}
    return out


def only_types(record: Mapping[str, Any], types: Iterable[str]) -> dict[str, Any]:
    """``record`` with the decode rungs of ``types`` only (the prompt rung and the bandwidth kept)."""
    keep = set(types)
    return {**record, "rungs": [r for r in record.get("rungs") or () if r.get("test") == "pp" or r["type"] in keep]}


def without_check(profile: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the host ``profile`` without its drift check: the calibration's own rates."""
    cal = dict(profile.get(PROFILE_KEY) or {})
    cal.pop(drift_scaling.DRIFT_KEY, None)
    return {**profile, PROFILE_KEY: cal}


def with_check(profile: Mapping[str, Any], record: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the host ``profile`` whose calibration carries ``record``, applied: what predictions would say
    with it (``speed.predict(..., profile=...)``), nothing stored."""
    cal = dict(profile.get(PROFILE_KEY) or {})
    cal[drift_scaling.DRIFT_KEY] = {**record, "applied": True}
    return {**profile, PROFILE_KEY: cal}


def store(record: Mapping[str, Any], apply: bool = True) -> dict[str, Any]:
    """Put ``record`` beside the stored calibration (``applied`` = ``apply``: predictions then use the scaled
    rates) and return it. RunFailed when the stored calibration is not the one the record was measured against
    (a calibration finished meanwhile): nothing is written."""
    prof = devices.read_host_profile() or {}
    cal = prof.get(PROFILE_KEY)
    if not cal or cal.get("measured_at") != record.get("calibration_measured_at"):
        raise RunFailed("drift check not stored: the host's calibration changed while it ran; run the check again")
    rec = {**record, "applied": bool(apply)}
    devices.write_host_profile({PROFILE_KEY: {**cal, drift_scaling.DRIFT_KEY: rec}})
    return rec

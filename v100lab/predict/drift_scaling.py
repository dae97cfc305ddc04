"""A drift check: how far this machine has moved from its calibration, and the calibrated rates brought up to now.

On a shared VM the host's speed moves in phases: on a 2-core Zen 3 calibration's own rungs ran 5-31 % slower 35-100
minutes after calibration, and 16-55 % faster three hours later, every type by its own factor. A calibration is
20-70 minutes of measuring; a drift check decodes calibration's own rungs again, a few loads each
(:mod:`v100lab.measure.drift_check`, ``v100lab calibrate --check``), and stores what it found beside the calibration
(key :data:`DRIFT_KEY`). This module is the record's arithmetic, no measuring:

* :func:`ratios` — per thread count, each weight type's decode ratio (the rung's median tok/s now over the figure
  calibration stored for it; 1.0 for a rung that has not moved beyond 10 % and its loads' noise, :func:`has_moved`),
  the prompt rung's ratio, and the memory bandwidth now (when a decode rung moved);
* :func:`scaled_fit` — one thread count's fitted costs with each type's decode cost (its weights and its rows)
  divided by that type's ratio, everything else decode costs (attention, the per-layer overheads) by the
  :data:`BASE_TYPE` rung's, the prompt costs by the prompt rung's, and the bandwidth replaced by the one measured
  now (on a VM in a phase 16-55 % faster than its calibration, it took the decode median error on rows calibration
  never saw from 27.0 % to 6.0 %; ``benchmarks/bench_speed.py`` judges it);
* :func:`describe` — the clause every host prediction carries about it.

A check is applied (``applied``: predictions use the scaled costs) or only recorded; a new calibration drops it.
"""

from __future__ import annotations

import datetime as _dt
import statistics
from typing import Any, Mapping

from v100lab.base.clock import age_text, parse_utc
from v100lab.gguf.llama_context import nearest_type

#: the key of the drift check inside the stored calibration (``speed_calibration``)
DRIFT_KEY = "drift"
#: the rung whose ratio scales what is not a weight type's (attention, overheads): calibration's depth rung
#: (calibration.DEPTH_TYPE, the type attention and the per-layer costs are pinned on)
BASE_TYPE = "Q4_0"
#: a rung within this of its calibration figure has not moved (the residual target of a calibration point)
TOLERANCE = 0.10
#: a ratio is beyond the noise when it is this many of its loads' standard errors away from 1
NOISE_Z = 2.0
#: decode costs of a fitted thread count (seconds; divided by a ratio when applied)
_BASE_SCALED = ("attn_s_per_op", "attn_tail_s_per_op", "attn_s_per_head_cell", "attn_split_layer_s",
                "attn_s_per_missed_head_cell", "attn_s_per_kv_byte", "overhead_token_s", "overhead_layer_s")
_PP_SCALED = ("pp_attn_s_per_op", "pp_attn_s_per_head_cell", "pp_overhead_s")


def has_moved(rung: Mapping[str, Any], tolerance: float = TOLERANCE, z: float = NOISE_Z) -> bool:
    """Whether a rung of a check has moved from its calibration figure: by more than ``tolerance`` and by more than
    ``z`` standard errors of its loads' median (a rung with too few loads to tell counts on the tolerance alone)."""
    ratio, se = rung.get("ratio"), rung.get("standard_error")
    if not ratio or abs(ratio - 1) <= tolerance:
        return False
    return se is None or abs(ratio - 1) > z * se * ratio


def ratios(record: Mapping[str, Any] | None, threads: int) -> dict[str, Any]:
    """What a drift ``record`` says at ``threads``: ``{"tg": {type: ratio}, "pp": ratio or None, "bandwidth_gbs":
    GB/s or None, "moved": how many rungs moved}`` (empty ``tg`` when the record has no rung at that thread count).

    A rung that has not moved (:func:`has_moved`) counts as 1.0, and the bandwidth measured with the check is taken
    only when a decode rung moved: a check's few loads see a few moments of the machine (applied as measured on a
    quiet VM, they moved a 1-thread prediction from +2.6 % to +11 % against llama-bench while no rung had moved beyond
    its noise). A machine that has not moved keeps its calibration."""
    out: dict[str, Any] = {"tg": {}, "pp": None, "bandwidth_gbs": None, "moved": 0}
    tg_moved = False
    for r in (record or {}).get("rungs") or ():
        if int(r.get("threads", -1)) != threads or not r.get("ratio"):
            continue
        went = has_moved(r)
        ratio = float(r["ratio"]) if went else 1.0
        out["moved"] += went
        if r.get("test") == "pp":
            out["pp"] = ratio
        else:
            out["tg"][str(r["type"])] = ratio
            tg_moved |= went
    bw = ((record or {}).get("bandwidth_gbs") or {}).get(str(threads))
    out["bandwidth_gbs"] = float(bw) if bw and tg_moved else None
    return out


def scaled_fit(fit: Mapping[str, Any], record: Mapping[str, Any] | None, threads: int) -> dict[str, Any]:
    """``fit`` (one thread count's fitted costs, as calibration stores them) brought up to the phase ``record``
    measured at ``threads`` (its moved rungs only: :func:`ratios`): a type's decode cost per weight and its rows'
    cost (``tg_row_s_by_type``) divided by its own rung's ratio (a type without a rung: the nearest type's by bits
    per weight), the other decode costs by the :data:`BASE_TYPE` rung's, the prompt costs by the prompt rung's, and
    the bandwidth the one measured now.
    ``fit`` unchanged (a copy) when the record has no decode rung at ``threads``, or none of its rungs there moved."""
    r = ratios(record, threads)
    out = dict(fit)
    if not r["tg"] or not r["moved"]:
        return out
    base = r["tg"].get(BASE_TYPE) or statistics.median(r["tg"].values())

    def ratio_of(t: str) -> float:
        if t in r["tg"]:
            return r["tg"][t]
        near = nearest_type(t, r["tg"])
        return r["tg"][near] if near else base

    costs = fit.get("tg_s_per_weight") or {}
    out["tg_s_per_weight"] = {t: c / ratio_of(t) for t, c in costs.items()}
    row = float(fit.get("tg_row_s") or 0.0)
    out["tg_row_s"] = row / base
    out["tg_row_s_by_type"] = {t: row / ratio_of(t) for t in costs}
    for key in _BASE_SCALED:
        if fit.get(key):
            out[key] = float(fit[key]) / base
    if r["pp"]:
        out["pp_s_per_weight"] = {t: c / r["pp"] for t, c in (fit.get("pp_s_per_weight") or {}).items()}
        for key in _PP_SCALED:
            if fit.get(key):
                out[key] = float(fit[key]) / r["pp"]
    if r["bandwidth_gbs"]:
        # the bandwidth measured now. The efficiency (calibration.fit_cpu: the best bandwidth a rung reached, over
        # STREAM's, >= 1) is that rung's bandwidth moved by its own ratio (``efficiency_type``; a fit stored before
        # it: the base rung's), over the bandwidth now; 1 where STREAM itself was the best
        old_bw = float(fit.get("bandwidth_gbs") or r["bandwidth_gbs"])
        old_eff = float(fit.get("efficiency") or 1.0)
        out["bandwidth_gbs"] = r["bandwidth_gbs"]
        if old_eff > 1.0:
            moved_by = ratio_of(fit["efficiency_type"]) if fit.get("efficiency_type") else base
            out["efficiency"] = max(1.0, old_eff * old_bw * moved_by / r["bandwidth_gbs"])
        else:
            out["efficiency"] = 1.0
    return out


def at_every_thread_count(record: Mapping[str, Any], thread_counts) -> dict[str, Any]:
    """``record`` (a check measured at one thread count) with each of its rungs standing at every one of
    ``thread_counts`` too: a run's machine check decodes calibration's rungs at the run's threads only, and its
    ratio stands for the machine at the others (a noisy neighbour slows one thread and two alike). A rung's
    ``measured_threads`` keeps where it was measured."""
    rungs = []
    for r in record.get("rungs") or ():
        for th in sorted({int(t) for t in thread_counts} | {int(r["threads"])}):
            rungs.append({**r, "threads": th, "measured_threads": int(r.get("measured_threads", r["threads"]))})
    return {**record, "rungs": rungs}


def moved(record: Mapping[str, Any] | None, tolerance: float = TOLERANCE, z: float = NOISE_Z) -> list[dict]:
    """The rungs of ``record`` that have moved (:func:`has_moved`)."""
    return [dict(r) for r in (record or {}).get("rungs") or () if has_moved(r, tolerance, z)]


def span(record: Mapping[str, Any] | None, test: str = "tg") -> tuple[float, float, float] | None:
    """(lowest, median, highest) ratio of the record's ``test`` rungs, or None."""
    xs = [float(r["ratio"]) for r in (record or {}).get("rungs") or ()
          if r.get("ratio") and r.get("test", "tg") == test]
    return (min(xs), statistics.median(xs), max(xs)) if xs else None


def describe(record: Mapping[str, Any] | None, now: _dt.datetime | None = None) -> tuple[str, list[str]]:
    """(one clause for the profile's line, warnings) on a drift check: "drift check of 2026-12-04 21:10 UTC (5 min
    old): decode at ×0.84–×1.12 of calibration (median ×0.97), prompt ×1.05, 3 of 22 rungs moved, applied" (or "no
    rung moved beyond its noise, the calibration's rates stand"). A warning when the check found rungs that moved
    (:func:`moved`) and was not applied. ("", []) without a record."""
    if not record:
        return "", []
    now = now or _dt.datetime.now(_dt.timezone.utc)
    when = parse_utc(record.get("measured_at"))
    head = "drift check" + (f" of {when:%Y-%m-%d %H:%M} UTC ({age_text((now - when).total_seconds())})" if when else "")
    said = []
    tg = span(record, "tg")
    if tg:
        lo, med, hi = tg
        said.append(f"decode at ×{lo:.2f}–×{hi:.2f} of calibration (median ×{med:.2f})")
    pp = span(record, "pp")
    if pp:
        said.append(f"prompt ×{pp[1]:.2f}")
    applied = bool(record.get("applied"))
    gone = moved(record)
    said.append(f"{len(gone)} of {len(record.get('rungs') or ())} rungs moved" if gone
                else "no rung moved beyond its noise")
    clause = head + ": " + ", ".join(said) + (
        (", applied" if gone else ", the calibration's rates stand") if applied else ", not applied")
    warnings = []
    if gone and not applied:
        warnings.append(f"the {head} found the machine moved from its calibration ("
                        + ", ".join(f"{r['type']} {r.get('test', 'tg')} at {r['threads']} t ×{r['ratio']:.2f}"
                                    for r in gone[:3]) + (", ..." if len(gone) > 3 else "")
                        + "): predictions use the calibration's rates; `v100lab calibrate --check` applies a new "
                          "check, `v100lab calibrate` remakes the profile")
    return clause, warnings


# --------------------------------------------------------------------------------------------
# a run's reference measurement (v100lab.measure.reference): start against end, spreads that include the drift
# --------------------------------------------------------------------------------------------

#: a reference within this of its start has not moved (the harness's noisy band: cv 5 %)
REFERENCE_TOLERANCE = 0.05


def reference_shift(start: Mapping[str, Any] | None, end: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """How far a run's reference moved from its start to its end: ``{"ratio": end / start, "standard_error": of
    the ratio (both means' standard errors), "moved": beyond :data:`REFERENCE_TOLERANCE` and :data:`NOISE_Z`
    standard errors (:func:`has_moved`), "drift": |ratio − 1|}``. None without both records."""
    if not start or not end or not start.get("tps") or not end.get("tps"):
        return None
    s, e = float(start["tps"]), float(end["tps"])
    ratio = e / s

    def rel_se(rec) -> float:
        n = max(1, int(rec.get("repetitions") or 1))
        return float(rec.get("sd") or 0.0) / float(rec["tps"]) / n ** 0.5

    se = ratio * (rel_se(start) ** 2 + rel_se(end) ** 2) ** 0.5
    rung = {"ratio": ratio, "standard_error": se if se > 0 else None}
    return {"ratio": round(ratio, 4), "standard_error": round(se, 4),
            "moved": has_moved(rung, tolerance=REFERENCE_TOLERANCE), "drift": round(abs(ratio - 1), 4)}


def spread_with_drift(value: float, sd: float, drift: float) -> float:
    """The spread of a measured ``value`` taken between a start and an end reference ``drift`` apart (|end / start
    − 1|): its repetitions' ``sd`` and the drift's share of the value, combined in quadrature. A measurement made
    somewhere between the two references may have seen either machine, so the whole difference counts."""
    return (float(sd) ** 2 + (float(value) * float(drift)) ** 2) ** 0.5


def agree(a: float, sd_a: float, b: float, sd_b: float, z: float = NOISE_Z) -> bool:
    """Whether two measurements of one configuration agree: their difference within ``z`` of their combined
    spreads (the spreads combined in quadrature)."""
    return abs(float(a) - float(b)) <= z * (float(sd_a) ** 2 + float(sd_b) ** 2) ** 0.5

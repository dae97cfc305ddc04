"""The reference measurement: one small, fixed configuration decoded at a run's start and at its end.

On a shared VM the same configuration decodes 10-30 % apart minutes apart, more than the spread of the
repetitions one measurement takes back to back. A notebook run therefore measures one small configuration that
never changes — the default model, :data:`TEST` (a short decode) at depth 0, ``-c`` :data:`N_CTX`, the
scenario's threads, :data:`REPETITIONS` repetitions in one load (a few seconds) — before it measures anything
and again after each step that measured speeds (``v100lab.workbook.levers.steps``). Two successive records say
how far the machine moved while the step between them measured
(:func:`v100lab.predict.drift_scaling.reference_shift`), the first and the last how far it moved during the
run.

Where the machine stands against its calibration is measured on calibration's own files, never on a model the run
judges: :func:`machine_check` decodes calibration's base rung (decode, and its prompt point) once at the run's start,
against the figures calibration stored for them. The ratio is shown beside the run's comparisons and flagged beyond
the drift check's tolerance (:data:`v100lab.predict.drift_scaling.TOLERANCE`); it is not applied to the run's
predictions. One load of a rung that streams its weights from memory read ×1.1-1.3 fast in most runs of the default
batch, while the default model's own reference sat on its unscaled prediction (median ×1.00): scaling by it moved
the headlines away from their measurements (docs/measuring.md). ``v100lab calibrate --check`` is the way to bring a
calibration to the machine's present speed.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timezone
from typing import Any

from v100lab.base.clock import parse_utc, utc_stamp
from v100lab.base.errors import ConfigError, RunFailed
from v100lab.base.safeio import cache_dir, read_json_dict, write_atomic
from v100lab.facts.config import RunConfig
from v100lab.facts.devices import get_device
from v100lab.measure import drift_check, harness
from v100lab.models import zoo
from v100lab.models.resolve import resolve
from v100lab.predict import drift_scaling, speed
from v100lab.predict.rates import stored_calibration

log = logging.getLogger(__name__)

#: the reference decode: short, so that a reference costs a few seconds (load included)
TEST = "tg32"
#: a small context: the reference is about the machine, not about the KV cache
N_CTX = 512
#: repetitions in the one load: enough for a spread
REPETITIONS = 3
#: the model every reference decodes
MODEL = zoo.DEFAULT_ALIAS


def config(threads: int) -> RunConfig:
    """The reference's llama.cpp configuration at ``threads`` (0: llama.cpp's choice)."""
    return RunConfig(n_ctx=N_CTX, n_threads=threads)


def predicted_tps(threads: int, model: str = MODEL) -> float | None:
    """What the host's calibration predicts for the reference (tok/s at the middle of the decode), or None
    when the host has no prediction for it."""
    try:
        spec = resolve(model, build=True).spec
        n_gen = harness.parse_test(TEST).n_gen
        p = speed.predict(spec, [get_device("host")], config(threads), depth=n_gen // 2, n_prompt=1)
        return float(p.tg_tps) if p.tg_tps == p.tg_tps and p.tg_tps > 0 else None
    except Exception as exc:  # a prediction that cannot be made leaves the reference unjudged, not the run failed
        log.debug("no prediction for the reference: %s", exc)
        return None


def measure(threads: int, model: str = MODEL, *, when: str = "") -> dict[str, Any]:
    """Decode the reference now: ``{"when", "measured_at", "model", "test", "threads", "tps", "sd",
    "repetitions", "seconds"}`` (``tps`` the mean of the repetitions, ``sd`` their standard deviation).
    RunFailed when llama.cpp could not run it."""
    path = zoo.model_path(model)
    t0 = time.perf_counter()
    rows = harness.run_tests(str(path), config(threads), [TEST], [0], REPETITIONS, monitor=False,
                             lever="reference", value=when or None)
    row = rows[0] if rows else {}
    if row.get("status") != "ok" or not row.get("avg_ts"):
        raise RunFailed(f"the reference measurement failed: {row.get('reason') or 'no result'}")
    return {"when": when, "measured_at": utc_stamp(), "model": path.name, "test": TEST,
            "threads": int(row.get("n_threads") or threads), "tps": round(float(row["avg_ts"]), 3),
            "sd": round(float(row.get("stddev_ts") or 0.0), 3), "repetitions": REPETITIONS,
            "seconds": round(time.perf_counter() - t0, 2)}


#: loads of each of calibration's rungs a machine check takes: one, a few seconds (the drift check's tolerance, not
#: its loads' spread, then decides whether the machine moved)
MACHINE_LOADS = 1
#: a machine check this recent (same calibration, same thread count) is reused by the next run rather than measured
#: again: a batch's notebooks start minutes apart, and the check is shown, not applied (a few seconds per notebook)
MACHINE_CHECK_REUSE_S = 600.0
_MACHINE_CHECK_FILE = "machine-check.json"


def machine_check(threads: int, *, reuse_s: float = MACHINE_CHECK_REUSE_S) -> dict[str, Any] | None:
    """Calibration's base rung (:data:`v100lab.predict.drift_scaling.BASE_TYPE`: decode and its prompt point)
    measured at ``threads``, :data:`MACHINE_LOADS` load(s) each, against the figures calibration stored: a drift
    check record (:func:`v100lab.measure.drift_check.check`) whose rungs stand at every calibrated thread count
    (:func:`v100lab.predict.drift_scaling.at_every_thread_count`). A check of the same calibration and thread count
    made less than ``reuse_s`` seconds ago (kept in the cache directory) is returned instead of measuring again; its
    ``measured_at`` says when. None when the host has no calibration at ``threads`` or the rungs could not be
    measured (a warning says why)."""
    cal = stored_calibration()
    if not cal or str(threads) not in (cal.get("threads") or {}):
        return None
    path = cache_dir() / _MACHINE_CHECK_FILE
    kept = read_json_dict(path, "machine check") or {}
    stamp = parse_utc(kept.get("measured_at"))
    if (reuse_s > 0 and stamp is not None and kept.get("threads") == threads
            and kept.get("calibration_measured_at") == cal.get("measured_at")
            and 0 <= (datetime.now(timezone.utc) - stamp).total_seconds() < reuse_s
            and isinstance(kept.get("record"), dict)):
        return kept["record"]
    try:
        rec = drift_check.check(cal, threads=[threads], types=[drift_scaling.BASE_TYPE], loads=MACHINE_LOADS,
                                prompt=True, bandwidth=False)
    except (ConfigError, RunFailed, OSError) as exc:
        log.warning("no machine check at the start of this run: %s", exc)
        return None
    out = drift_scaling.at_every_thread_count(rec, [int(k) for k in cal["threads"]])
    try:
        write_atomic(path, json.dumps({"measured_at": rec.get("measured_at") or utc_stamp(), "threads": threads,
                                       "calibration_measured_at": cal.get("measured_at"), "record": out}),
                     what="machine check", error=OSError)
    except OSError as exc:  # not kept: the next run measures again
        log.warning("machine check not kept for the next run: %s", exc)
    return out


def machine_ratios(check: dict[str, Any] | None, threads: int) -> dict[str, Any] | None:
    """What a machine check says at ``threads``: ``{"tg": decode ratio, "pp": prompt ratio or None, "moved": a rung
    beyond the drift check's tolerance, "measured_at": when}``, ratios as measured (1.0 not substituted)."""
    if not check:
        return None
    got = {r["test"]: float(r["ratio"]) for r in check.get("rungs") or () if int(r["threads"]) == threads}
    if "tg" not in got:
        return None
    return {"tg": got["tg"], "pp": got.get("pp"), "moved": bool(drift_scaling.ratios(check, threads)["moved"]),
            "measured_at": check.get("measured_at")}

"""The reference measurement: one small, fixed configuration decoded at a run's start and at its end.

On a shared VM the same configuration decodes 10-30 % apart minutes apart, more than the spread of the
repetitions one measurement takes back to back. A notebook run therefore measures one small configuration that
never changes — the default model, :data:`TEST` (a short decode) at depth 0, ``-c`` :data:`N_CTX`, the
scenario's threads, :data:`REPETITIONS` repetitions in one load (a few seconds) — before it measures anything
and again after each step that measured speeds (``v100lab.workbook.levers.steps``). Two successive records say
how far the machine moved while the step between them measured
(:func:`v100lab.predict.drift_scaling.reference_shift`), the first and the last how far it moved during the
run, and the prediction the calibration makes for the same configuration says where the machine stands against
its calibration.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from v100lab.base.clock import utc_stamp
from v100lab.base.errors import RunFailed
from v100lab.facts.config import RunConfig
from v100lab.facts.devices import get_device
from v100lab.measure import harness
from v100lab.models import zoo
from v100lab.models.resolve import resolve
from v100lab.predict import speed

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

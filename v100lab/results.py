"""The one tidy table every predicted, measured and claimed number flows through.

One row per observation:

==============  ==========================================================================
model           model label (alias or file stem; the seed's model for claimed rows)
quant           file type, e.g. Q4_K_M
device          device id from the catalog ("host" for this machine's CPU)
lever           what was varied: "quant", "n_gpu_layers", "n_ctx", "depth", "cache_type", ...
value           the lever's setting, as text ("2048", "q8_0", "Q4_0")
metric          what was observed: "tg_tps", "pp_tps", "ceiling_tg_tps", "kv_cache_bytes", ...
result          the number
unit            "tok/s", "bytes", "s", "ppl", ...
source          "predicted" | "measured" | "claimed"
above_ceiling   True when a tok/s figure exceeds the bandwidth ceiling for its model and device
note            free text (e.g. "stand-in model", "noisy: cv 12%")
tok_s           ``result`` where unit is tok/s, else NaN (convenience column for plots)
==============  ==========================================================================
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

SOURCES = ("predicted", "measured", "claimed")
TIDY_COLUMNS = ("model", "quant", "device", "lever", "value", "metric", "result", "unit", "source",
                "above_ceiling", "note")
TPS = "tok/s"


@dataclass(frozen=True)
class Observation:
    model: str
    quant: str
    device: str
    lever: str
    value: str
    metric: str
    result: float
    unit: str
    source: str
    above_ceiling: bool | None = None
    note: str = ""

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")


def tidy_frame(observations: Iterable[Observation | dict]):
    """A pandas DataFrame with exactly ``TIDY_COLUMNS`` (+ ``tok_s``), one row per observation."""
    import numpy as np
    import pandas as pd

    rows = [asdict(o) if isinstance(o, Observation) else dict(o) for o in observations]
    for r in rows:
        if r.get("source") not in SOURCES:
            raise ValueError(f"tidy row with bad source {r.get('source')!r}: {r}")
        r["value"] = "" if r.get("value") is None else str(r["value"])
    df = pd.DataFrame(rows, columns=list(TIDY_COLUMNS))
    df["tok_s"] = np.where(df["unit"] == TPS, df["result"], np.nan)
    return df


def concat(*frames):
    """Stack tidy frames (ignoring empty ones)."""
    import pandas as pd

    frames = [f for f in frames if f is not None and len(f)]
    if not frames:
        return tidy_frame([])
    return pd.concat(frames, ignore_index=True)

"""The one tidy table every predicted, measured and claimed number flows through.

One row per observation. The columns are declared once, as the fields of :class:`Observation` (each with
its kind: text, number, count or flag); every row is checked when it is made, and every frame when it is
built (:func:`tidy_frame`, :func:`concat`, :func:`check_frame`): a wrong source, a missing or unknown
column, or a result that is not a number is a :class:`TidyError` naming the column.

==============  ==========================================================================
model           model label (alias or file stem; the seed's model for claimed rows)
quant           file type, e.g. Q4_K_M
device          device id from the catalog ("host" for this machine's CPU)
lever           what was varied: "quant", "n_gpu_layers", "n_ctx", "depth", "cache_type", ...
value           the lever's setting, as text ("2048", "q8_0", "Q4_0")
metric          what was observed: "tg_tps", "pp_tps", "weights_ceiling_tg_tps", "kv_cache_bytes", ...
result          the number
unit            "tok/s", "bytes", "s", "ppl", ...
source          "predicted" | "measured" | "claimed"
above_ceiling   True when a tok/s figure exceeds the bandwidth ceiling for its model and device
cache_type      the KV cache type the row is for ("f16", "q8_0"); "" when the row is not about one
fits            whether the configuration fits the device's memory (predicted); None when not judged
group           rows drawn together (one panel of the memory breakdown, "MODEL on DEVICE"); "" for none
bound           what limits a predicted speed ("memory", "compute", "overhead", ...); "" for other rows
sd              standard deviation of ``result`` over its repetitions (0 for a prediction or a single run)
repetitions     how many runs ``result`` is the mean of (1 for a prediction or a single run)
setup           what llama.cpp ran for a measured row, in one line (file, test, depth, flags, threads, backend):
                two rows with the same setup measured the same thing, in whichever notebook; "" for other rows
note            free text for people ("stand-in model", "noisy: cv 12%"): nothing joins or filters on it
tok_s           ``result`` where unit is tok/s, else NaN (convenience column for plots; frames only)
==============  ==========================================================================

:func:`compare` puts measured, predicted and claimed figures of the same thing side by side (with their
ratio) — the one join every summary, caption and headline uses; :func:`flag_above_ceiling` marks measured and
claimed decode figures above the physical ceiling of their model and device.
"""

from __future__ import annotations

import numbers
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Iterable, Mapping, Sequence

from v100lab.base.errors import V100labError

SOURCES = ("predicted", "measured", "claimed")
TPS = "tok/s"

TEXT, NUMBER, COUNT, FLAG = "text", "number", "count", "flag"


class TidyError(V100labError, ValueError):
    """A tidy row or frame that breaks the schema (the message names the column)."""


_REQUIRED_MARK = object()


def _col(kind: str, default: Any = _REQUIRED_MARK):
    """A column of the table: its kind (how a value is checked) and its default. A column without a default is
    required; a flag column's default is None (not judged)."""
    if default is _REQUIRED_MARK:
        default = None if kind == FLAG else MISSING
    return field(default=default, metadata={"kind": kind})


@dataclass(frozen=True)
class Observation:
    """One row of the tidy table (see the module's table for what each column holds)."""

    model: str = _col(TEXT)
    quant: str = _col(TEXT)
    device: str = _col(TEXT)
    lever: str = _col(TEXT)
    value: str = _col(TEXT)
    metric: str = _col(TEXT)
    result: float = _col(NUMBER)
    unit: str = _col(TEXT)
    source: str = _col(TEXT)
    above_ceiling: bool | None = _col(FLAG)
    note: str = _col(TEXT, "")
    cache_type: str = _col(TEXT, "")
    fits: bool | None = _col(FLAG)
    group: str = _col(TEXT, "")
    bound: str = _col(TEXT, "")
    sd: float = _col(NUMBER, 0.0)
    repetitions: int = _col(COUNT, 1)
    setup: str = _col(TEXT, "")

    def __post_init__(self):
        for f in fields(self):
            checked = _checked(f.name, f.metadata["kind"], getattr(self, f.name), "tidy row")
            object.__setattr__(self, f.name, checked)


# The schema, declared once: column → kind, in the table's order
SCHEMA: dict[str, str] = {f.name: f.metadata["kind"] for f in fields(Observation)}
TIDY_COLUMNS = tuple(SCHEMA)
_REQUIRED = tuple(f.name for f in fields(Observation) if f.default is MISSING)


def _is_bool(v) -> bool:
    """A Python bool or numpy's (what a pandas comparison gives)."""
    return isinstance(v, bool) or (type(v).__module__ == "numpy" and type(v).__name__ in ("bool_", "bool"))


def _checked(name: str, kind: str, v: Any, where: str):
    """``v`` as column ``name`` holds it, or a TidyError naming the column."""
    if kind == TEXT:
        if name == "value":          # a lever's setting is kept as text: 2048 → "2048"
            return "" if v is None else str(v)
        if not isinstance(v, str):
            raise TidyError(f"{where}: column '{name}' must be text, got {v!r} ({type(v).__name__})")
        if name == "source" and v not in SOURCES:
            raise TidyError(f"{where}: column 'source' must be one of {', '.join(SOURCES)}, got {v!r}")
        return v
    if kind == NUMBER:
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TidyError(f"{where}: column '{name}' must be a number, got {v!r} ({type(v).__name__})")
        return float(v)
    if kind == COUNT:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise TidyError(f"{where}: column '{name}' must be a whole number ≥ 1, got {v!r}")
        return int(v)
    if v is None or (isinstance(v, float) and v != v):       # FLAG: None (or NaN, pandas' missing) = unjudged
        return None
    if not _is_bool(v):
        raise TidyError(f"{where}: column '{name}' must be True, False or None, got {v!r}")
    return bool(v)


def observation(row: Mapping[str, Any]) -> Observation:
    """A row given as a mapping, checked: an unknown or missing column is a TidyError naming it."""
    unknown = [k for k in row if k not in SCHEMA and k != "tok_s"]
    if unknown:
        raise TidyError(f"tidy row: unknown column '{unknown[0]}'")
    missing = [k for k in _REQUIRED if k not in row]
    if missing:
        raise TidyError(f"tidy row: missing column '{missing[0]}'")
    return Observation(**{k: v for k, v in row.items() if k in SCHEMA})


def tidy_frame(observations: Iterable[Observation | Mapping[str, Any]]):
    """A pandas DataFrame with exactly ``TIDY_COLUMNS`` (+ ``tok_s``), one row per observation, each row
    checked against the schema (mappings too) and the frame checked as a whole."""
    import numpy as np  # heavy third-party dependency (only frames need it)
    import pandas as pd  # heavy third-party dependency (only frames need it)

    rows = [asdict(o if isinstance(o, Observation) else observation(o)) for o in observations]
    df = pd.DataFrame(rows, columns=list(TIDY_COLUMNS))
    df = _typed(df)
    df["tok_s"] = np.where(df["unit"] == TPS, df["result"], np.nan)
    return check_frame(df)


def _typed(df):
    """Column dtypes as the schema has them (an empty frame included)."""
    for name, kind in SCHEMA.items():
        if kind == NUMBER:
            df[name] = df[name].astype(float)
        elif kind == COUNT:
            df[name] = df[name].astype(int)
        elif kind == FLAG:
            df[name] = df[name].astype(object).where(df[name].notna(), None)
        else:
            df[name] = df[name].astype(object)
    return df


def check_frame(df):
    """``df`` when it is a tidy frame; else a TidyError naming the first column that breaks the schema
    (missing, a source not in ``SOURCES``, a number column that is not numeric, a text column with non-text,
    a flag column with something other than True/False/None)."""
    import pandas as pd  # heavy third-party dependency (only frames need it)

    for name, kind in SCHEMA.items():
        if name not in df.columns:
            raise TidyError(f"tidy frame: missing column '{name}'")
        col = df[name]
        if kind in (NUMBER, COUNT):
            if not pd.api.types.is_numeric_dtype(col) or pd.api.types.is_bool_dtype(col):
                raise TidyError(f"tidy frame: column '{name}' must be numeric, has dtype {col.dtype}")
        elif kind == TEXT:
            bad = col[~col.map(lambda v: isinstance(v, str))]
            if len(bad):
                raise TidyError(f"tidy frame: column '{name}' must be text, has {bad.iloc[0]!r}")
        else:
            bad = col[~col.map(lambda v: v is None or _is_bool(v) or (isinstance(v, float) and v != v))]
            if len(bad):
                raise TidyError(f"tidy frame: column '{name}' must be True, False or None, has {bad.iloc[0]!r}")
    bad = df.loc[~df["source"].isin(SOURCES), "source"]
    if len(bad):
        raise TidyError(f"tidy frame: column 'source' must be one of {', '.join(SOURCES)}, has {bad.iloc[0]!r}")
    return df


def concat(*frames):
    """Stack tidy frames (ignoring empty ones); the result is checked like any tidy frame."""
    import pandas as pd  # heavy third-party dependency (only frames need it)

    frames = [f for f in frames if f is not None and len(f)]
    if not frames:
        return tidy_frame([])
    return check_frame(pd.concat(frames, ignore_index=True))


# ------------------------------------------------------------------------------------------------
# measured vs predicted (vs claimed)
# ------------------------------------------------------------------------------------------------

# What makes two rows "the same thing": the model, where it ran, the lever's setting, the cache type, the
# metric. Not the quant: a measured row's quant is the file's, which a prediction for it shares anyway.
COMPARE_KEYS = ("model", "device", "lever", "value", "cache_type", "metric")


def compare(df, on: Sequence[str] = COMPARE_KEYS, *, metric: str | Sequence[str] | None = None,
            lever: str | None = None, require: Sequence[str] = ()):
    """Measured, predicted and claimed figures of the same thing side by side: one row per distinct ``on``
    key (in the order the frame first has it; ``metric`` is always part of the key), with columns ``on`` +
    ``measured``, ``predicted``, ``claimed`` (the mean of that source's rows, NaN where it has none),
    ``ratio`` (measured ÷ predicted), ``claimed_ratio`` (claimed ÷ predicted), and ``sd`` / ``repetitions``
    of the measured figure (the largest spread and the fewest runs among its rows).

    ``metric``/``lever`` keep only those rows first; ``require``: sources a row must have (e.g.
    ``("measured", "predicted")`` for the pairs a summary compares). ``note`` is free text and never a key."""
    import numpy as np  # heavy third-party dependency (only frames need it)
    import pandas as pd  # heavy third-party dependency (only frames need it)

    keys = list(dict.fromkeys([*on, "metric"]))
    if "note" in keys:
        raise TidyError("compare: 'note' is free text, not a join key")
    unknown = [k for k in keys if k not in SCHEMA or SCHEMA[k] != TEXT or k == "source"]
    if unknown:
        raise TidyError(f"compare: '{unknown[0]}' is not a key column of the tidy table")
    bad = [s for s in require if s not in SOURCES]
    if bad:
        raise TidyError(f"compare: require names '{bad[0]}', not a source")
    d = check_frame(df) if len(df.columns) else df
    if metric is not None:
        d = d[d["metric"].isin([metric] if isinstance(metric, str) else list(metric))]
    if lever is not None:
        d = d[d["lever"] == lever]
    out = d[keys].drop_duplicates().reset_index(drop=True) if len(d) else pd.DataFrame(columns=keys)
    for s in SOURCES:
        g = d[d["source"] == s]
        agg = {s: ("result", "mean")}
        if s == "measured":
            agg.update(sd=("sd", "max"), repetitions=("repetitions", "min"))
        got = g.groupby(keys, sort=False).agg(**agg).reset_index() if len(g) else \
            pd.DataFrame(columns=keys + list(agg))
        out = out.merge(got, on=keys, how="left")
    for s in (*SOURCES, "sd"):
        out[s] = out[s].astype(float)
    pred = out["predicted"].where(out["predicted"] != 0)
    out["ratio"] = out["measured"] / pred
    out["claimed_ratio"] = out["claimed"] / pred
    out["repetitions"] = out["repetitions"].fillna(0).astype(int)
    out["sd"] = out["sd"].fillna(0.0)
    if require:
        out = out.dropna(subset=list(require)).reset_index(drop=True)
    out[["ratio", "claimed_ratio"]] = out[["ratio", "claimed_ratio"]].replace([np.inf, -np.inf], np.nan)
    return out[keys + ["measured", "predicted", "claimed", "ratio", "claimed_ratio", "sd", "repetitions"]]


# ------------------------------------------------------------------------------------------------
# above the ceiling
# ------------------------------------------------------------------------------------------------

CEILING_METRIC = "physical_ceiling_tg_tps"


def ceilings_of(df) -> dict[tuple, float]:
    """Physical ceilings of a frame's predicted rows: by (model, quant, device, lever, value), and by (model,
    quant, device) the largest of them (the loosest bound, for rows measured at a value nothing predicted)."""
    out: dict[tuple, float] = {}
    c = df[(df["source"] == "predicted") & (df["metric"] == CEILING_METRIC)]
    for model, quant, device, lever, value, result in c[["model", "quant", "device", "lever", "value",
                                                         "result"]].itertuples(index=False):
        out[(model, quant, device, lever, value)] = float(result)
        out[(model, quant, device)] = max(out.get((model, quant, device), 0.0), float(result))
    return out


def flag_above_ceiling(df, ceilings: Mapping[tuple, float] | None = None, *, tolerance: float = 0.0,
                       sources: Sequence[str] = ("measured", "claimed")):
    """A copy of ``df`` with ``above_ceiling`` set on its decode rows (tok/s, metric ``tg_tps…``) from
    ``sources``: True when the figure exceeds the physical ceiling of its model, quant and device by more than
    ``tolerance`` (a fraction) — the ceiling of the same lever value when there is one, else the loosest of
    that model's. ``ceilings`` maps (model, quant, device[, lever, value]) → tok/s; by default the frame's own
    predicted physical-ceiling rows (:func:`ceilings_of`). Rows without a ceiling keep their flag. Prompt speed
    is never flagged: a batch reads each weight once for many tokens, so it can beat the decode ceiling."""
    ceilings = ceilings_of(df) if ceilings is None else ceilings
    if not len(df) or not ceilings:
        return df
    df = df.copy()
    flags = []
    for model, quant, device, lever, value, metric, result, unit, source, flag in df[
            ["model", "quant", "device", "lever", "value", "metric", "result", "unit", "source",
             "above_ceiling"]].itertuples(index=False):
        if source in sources and unit == TPS and str(metric).startswith("tg_tps"):
            c = ceilings.get((model, quant, device, lever, value), ceilings.get((model, quant, device)))
            if c is not None:
                flag = bool(result > c * (1.0 + tolerance))
        flags.append(None if flag is None or flag != flag else bool(flag))
    df["above_ceiling"] = flags
    return check_frame(df)

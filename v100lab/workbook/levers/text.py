"""The words the summaries and captions share: picking rows of a tidy frame, numbers as a reader reads them,
a measured series per lever value with its spread, and whether a difference is larger than the noise. Every
string that came from a model or a parameter file is escaped (:mod:`v100lab.workbook.render`).
"""

from __future__ import annotations

import math
from typing import Sequence

from v100lab.workbook.render import md_text


def pick(df, **eq):
    """The rows of ``df`` whose columns equal the given values (a list/tuple/set: any of them; None: any)."""
    m = df
    for k, v in eq.items():
        if v is None:
            continue
        m = m[m[k].isin(v)] if isinstance(v, (list, tuple, set)) else m[m[k] == v]
    return m


def mean_of(df, **eq) -> float | None:
    """The mean ``result`` of :func:`pick`'s rows, None when there are none."""
    m = pick(df, **eq)
    return float(m["result"].mean()) if len(m) else None


def fmt(x: float | None, nd: int = 1) -> str:
    """A number with thousands separators and ``nd`` decimals; "—" for none or not finite."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return f"{x:,.{nd}f}"


def pct(a: float | None, b: float | None) -> str:
    """a relative to b, as a signed percentage."""
    if a is None or b is None or not b:
        return "—"
    return f"{100 * (a / b - 1):+.0f} %"


def md(template: str, **values) -> str:
    """A sentence with every value escaped for Markdown (:func:`v100lab.workbook.render.md_text`)."""
    return md_text(template, **values)


def markdown(lines: Sequence[str]):
    """Join sentences (already escaped with :func:`md`) into one Markdown output, one bullet each."""
    from IPython.display import Markdown  # optional dependency: IPython (only a notebook displays it)

    return Markdown("\n".join(f"- {line}" for line in lines if line))


def points(df, metric: str, lever: str | None = None, source: str = "measured", **eq):
    """The rows of ``metric`` from ``source`` per lever value: mean, standard deviation over the repetitions
    (the rows' ``sd``; 0 for predictions) and repetitions (the rows' ``repetitions``), in the lever's order.
    Columns ``result``, ``sd``, ``r``."""
    import pandas as pd  # heavy third-party dependency

    m = pick(df, metric=metric, source=source, lever=lever, **eq)
    if not len(m):
        return pd.DataFrame(columns=["result", "sd", "r"])
    g = m.groupby("value", sort=False).agg(result=("result", "mean"), sd=("sd", "max"), r=("repetitions", "min"))
    try:
        return g.loc[sorted(g.index, key=float)]
    except ValueError:
        return g


def difference(a: float, a_sd: float, a_r: int, b: float, b_sd: float, b_r: int, unit: str = "tok/s") -> str:
    """``b`` against ``a`` in words: "+12 %" when the gap is larger than their standard deviations together,
    "no difference beyond the noise (± x)" when it is not, and "single runs: no spread to judge" when either
    was measured once."""
    if min(a_r, b_r) < 2:
        return f"{pct(b, a)} (single runs: no spread to tell it from noise)"
    noise = a_sd + b_sd
    if abs(b - a) <= noise:
        return f"no difference beyond the noise (± {noise:,.1f} {unit})"
    return pct(b, a)


def claim_verdict(ratio: float, sd: float, below: float, runs: int = 2) -> str:
    """A claim that a measured ratio is below ``below`` (the seed's "lower with more slots") against the ratio and
    its spread (one sd): holds, fails, or not borne out (the bound inside the noise); ``runs`` < 2 (a single
    sample on either side) has no spread to judge with."""
    if runs < 2:
        side = "below" if ratio < below else "not below"
        return f"{side} {below:g}, but from single requests: no spread to tell it from noise"
    if ratio + sd < below:
        return "lower beyond the noise: the claim holds here"
    if ratio - sd > below:
        return "higher beyond the noise: the claim fails here"
    return "no difference beyond the noise: the claim is not borne out here"


def ends(pts):
    """The first and last point of a measured series (:func:`points`) as (value, mean, sd, r) pairs."""
    first, last = pts.iloc[0], pts.iloc[-1]
    return ((pts.index[0], first["result"], first["sd"], int(first["r"])),
            (pts.index[-1], last["result"], last["sd"], int(last["r"])))


def best_of(pts, unit: str = "tok/s", flag: str = "") -> str:
    """The highest value of a measured series (:func:`points`) in words. "best X: +n % over Y" only when X beats
    the runner-up Y by more than their two standard deviations together; "no difference beyond the noise
    between X and Y (± n)" when it does not; unjudged when either was measured once. Captions and summaries both
    use this, so they never disagree about a winner. ``flag`` names the values ("-ub 512")."""
    if len(pts) < 2:
        return ""
    order = pts.sort_values("result", ascending=False)
    (bv, b), (sv, s) = list(order.iterrows())[:2]
    bv, sv = f"{flag} {bv}".strip(), f"{flag} {sv}".strip()
    if min(int(b["r"]), int(s["r"])) < 2:
        return f"{bv} highest, {pct(b['result'], s['result'])} over {sv} (single runs: no spread to tell it from noise)"
    noise = float(b["sd"]) + float(s["sd"])
    if b["result"] - s["result"] <= noise:
        return f"no difference beyond the noise between {bv} and {sv} (± {noise:,.1f} {unit})"
    return f"best {bv}: {pct(b['result'], s['result'])} over {sv}, beyond the noise (± {noise:,.1f} {unit})"

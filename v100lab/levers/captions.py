"""What to look at under each plot: one or two sentences (``caption_*``), written from the numbers of the
frame the plot drew — the points to compare, how far apart they are, and whether a difference is larger than
the noise of the repetitions (a difference inside it is called "no difference", never a winner). Every string
that came from a model or a parameter file is escaped (:mod:`v100lab.render`).
"""

from __future__ import annotations

import math

from v100lab.results import TPS
from v100lab.scenario import Scenario
from v100lab.levers._study import GIB, HOST, MIB, spread, study
from v100lab.levers.summaries import _fmt, _md, _one, _pct, _pick


def _caption(*sentences: str):
    """One paragraph under a plot (sentences already escaped), led by "What to look at"."""
    from IPython.display import Markdown

    text = " ".join(s for s in sentences if s)
    return Markdown(f"**What to look at.** {text}" if text else "")


def _where(device: str) -> str:
    return "this machine" if device == HOST else device


def points(df, metric: str, lever: str | None = None, source: str = "measured", **eq):
    """The rows of ``metric`` from ``source`` per lever value: mean, standard deviation over the repetitions
    (from the measured rows' notes; 0 for predictions) and repetitions, in the lever's order."""
    import pandas as pd

    m = _pick(df, metric=metric, source=source, lever=lever, **eq)
    if not len(m):
        return pd.DataFrame(columns=["result", "sd", "r"])
    sp = m["note"].map(spread)
    g = m.assign(sd=sp.map(lambda x: x[0]), r=sp.map(lambda x: x[1])).groupby("value", sort=False).agg(
        result=("result", "mean"), sd=("sd", "max"), r=("r", "min"))
    try:
        return g.loc[sorted(g.index, key=float)]
    except ValueError:
        return g


def difference(a: float, a_sd: float, a_r: int, b: float, b_sd: float, b_r: int, unit: str = "tok/s") -> str:
    """``b`` against ``a`` in words: "+12 %" when the gap is larger than their standard deviations together,
    "no difference beyond the noise (± x)" when it is not, and "single runs: no spread to judge" when either
    was measured once."""
    if min(a_r, b_r) < 2:
        return f"{_pct(b, a)} (single runs: no spread to tell it from noise)"
    noise = a_sd + b_sd
    if abs(b - a) <= noise:
        return f"no difference beyond the noise (± {noise:,.1f} {unit})"
    return _pct(b, a)


def _against(measured: float | None, predicted: float | None) -> str:
    """A measurement against its prediction in words: "42 % below the prediction (55.1)"."""
    if measured is None or not predicted:
        return "no prediction to compare with"
    r = measured / predicted - 1
    side = "below" if r < 0 else "above"
    return f"{abs(100 * r):.0f} % {side} the prediction ({_fmt(predicted)})"


def _change(a: float | None, b: float | None) -> str:
    """How a predicted value moves from ``a`` to ``b``: "falls 3 %", "rises 12 %", "stays within 1 %"."""
    if a is None or b is None or not a:
        return "—"
    r = b / a - 1
    if abs(r) < 0.01:
        return "stays within 1 %"
    return f"{'rises' if r > 0 else 'falls'} {abs(100 * r):.0f} %"


def _runs(sd: float, r: int) -> str:
    return f" ± {_fmt(sd)} over {r} runs" if r > 1 else " (one run)"


def _ends(pts):
    """The first and last point of a measured series as (value, mean, sd, r) pairs."""
    first, last = pts.iloc[0], pts.iloc[-1]
    return ((pts.index[0], first["result"], first["sd"], int(first["r"])),
            (pts.index[-1], last["result"], last["sd"], int(last["r"])))


def _series_change(pts, what: str, lever_text: str) -> str:
    """How a measured series changes from its first value to its last, with the noise judged."""
    if len(pts) == 1:
        return _md("{what}: {a} tok/s at {lever} {va}{runs} — one value, nothing to compare.", what=what,
                   a=_fmt(pts["result"].iloc[0]), lever=lever_text, va=pts.index[0],
                   runs=_runs(pts["sd"].iloc[0], int(pts["r"].iloc[0])))
    if len(pts) < 2:
        return ""
    (va, a, asd, ar), (vb, b, bsd, br) = _ends(pts)
    return _md("{what} goes from {a} tok/s at {lever} {va} to {b} at {lever} {vb}: {d}.", what=what, a=_fmt(a),
               b=_fmt(b), lever=lever_text, va=va, vb=vb, d=difference(a, asd, ar, b, bsd, br))


def _not_measured(df) -> str:
    why = df.attrs.get("why_not_measured")
    if why and not (df["source"] == "measured").any():
        return _md("Only predictions: {why}.", why=why)
    return ""


# ------------------------------------------------------------------------------------------------
# 00
# ------------------------------------------------------------------------------------------------

def caption_staircase(sc: Scenario, stairs):
    """Under the staircase: where the claims leave the ceiling (left), and how far the stages' flags move
    decode here (right)."""
    seed = stairs[stairs["device"] != HOST]
    out = []
    cl = _pick(seed, source="claimed", metric="tg_tps")
    ceil = _pick(seed, metric="strict_ceiling_tg_tps")
    if len(cl) and len(ceil):
        above = list(dict.fromkeys(cl[cl["above_ceiling"].fillna(False).astype(bool)]["value"]))
        out.append(_md("Left: follow the grey bars against the dotted line — the claims climb to {hi} tok/s while "
                       "the strict ceiling of the assumed model on {dev} tops out at {c} tok/s{tail}.",
                       hi=f"{cl['result'].max():g}", dev=cl["device"].iloc[0], c=_fmt(ceil["result"].max()),
                       tail=(f"; stage(s) {', '.join(above)} claim more than any card can read" if above else
                             "; every claim stays under it")))
    pts = points(stairs[stairs["device"] == HOST], "tg_tps", "stage")
    if len(pts) >= 2:
        order = list(dict.fromkeys(_pick(stairs, lever="stage")["value"]))
        pts = pts.reindex([v for v in order if v in pts.index])
        lo, hi = pts["result"].idxmin(), pts["result"].idxmax()
        steps = [(abs(pts["result"].iloc[i + 1] / pts["result"].iloc[i] - 1), i) for i in range(len(pts) - 1)
                 if pts["result"].iloc[i]]
        i = max(steps)[1] if steps else 0
        a, b = pts.iloc[i], pts.iloc[i + 1]
        out.append(_md("Right: here the stages' flags give {model} {a} ({va}) to {b} tok/s ({vb}); the largest step "
                       "between neighbouring stages, {sa} → {sb}, is {d} — compare it with the step the seed claims "
                       "there.", model=_pick(stairs, device=HOST)["model"].iloc[0], a=_fmt(pts.loc[lo, "result"]),
                       va=lo, b=_fmt(pts.loc[hi, "result"]), vb=hi, sa=pts.index[i], sb=pts.index[i + 1],
                       d=difference(a["result"], a["sd"], int(a["r"]), b["result"], b["sd"], int(b["r"]))))
    return _caption(*out, _not_measured(stairs))


# ------------------------------------------------------------------------------------------------
# 01
# ------------------------------------------------------------------------------------------------

def caption_memory(sc: Scenario, mem):
    """Under the memory breakdown: what dominates each bar, and how close the GPU's bar comes to its line."""
    out = []
    pred = _pick(mem, source="predicted", metric="bytes")
    for group, g in pred.groupby("note", sort=False):
        for dev, d in g.groupby("device", sort=False):
            total = d["result"].sum()
            if not total:
                continue
            top = d.loc[d["result"].idxmax()]
            cap = _one(mem, metric="capacity_bytes", device=dev, note=group)
            line = _md("{model}, {dev}'s bar: {comp} take {share} of {total} GiB", model=d["model"].iloc[0],
                       comp=top["value"], share=f"{100 * top['result'] / total:.0f} %", total=_fmt(total / GIB, 2),
                       dev=_where(dev))
            if dev != HOST and cap:
                line += _md(", {left} GiB {side} the red line ({cap} GiB)", left=_fmt(abs(cap - total) / GIB, 2),
                            side="short of" if cap >= total else "over", cap=_fmt(cap / GIB, 1))
            out.append(line + ".")
    meas = _pick(mem, source="measured", metric="bytes")
    if len(meas):
        p = _pick(mem, source="predicted", metric="bytes", note=meas["note"].iloc[0], device=HOST)
        p = p[p["value"].isin(meas["value"])]
        out.append(_md("The hatched bar is llama.cpp's own log: {d} from the plan's bar above it.",
                       d=_pct(p["result"].sum(), meas["result"].sum())))
    return _caption(*out)


def caption_fit(sc: Scenario, grid):
    """Under the what-fits heatmap: per model and device, how many cells are red and where the border runs."""
    out = []
    names = grid.attrs.get("device_names") or {}
    fits = _pick(grid, metric="fits", lever="n_ctx")
    margin = _pick(grid, metric="margin_bytes", lever="n_ctx")
    for (model, dev), f in fits.groupby(["model", "device"], sort=False):
        red = f[f["result"] < 0.5]
        m = _pick(margin, model=model, device=dev)
        where = "this machine's RAM" if dev == HOST else names.get(dev, dev)
        if not len(red):
            out.append(_md("{model} on {where}: every cell is green, at least {lo} GiB to spare — nothing here is "
                           "near a limit.", model=model, where=where, lo=_fmt(m["result"].min() / GIB, 2)))
            continue
        nowhere = [q for q, g in f.groupby("quant", sort=False) if g["result"].max() < 0.5]
        everywhere = [q for q, g in f.groupby("quant", sort=False) if g["result"].min() >= 0.5]
        out.append(_md("{model} on {where}: {k} of {n} cells are red{nowhere}{everywhere}; read a row left to right "
                       "to see the context that pushes a quant over.", model=model, where=where, k=len(red), n=len(f),
                       nowhere=f" — no context fits at {', '.join(nowhere)}" if nowhere else "",
                       everywhere=f"; every context and cache type fits at {', '.join(everywhere)}"
                       if everywhere else ""))
    return _caption(*out)


# ------------------------------------------------------------------------------------------------
# 02
# ------------------------------------------------------------------------------------------------

def caption_ceilings(sc: Scenario, ceil):
    """Under the ceilings per quant: the gap between ceiling and prediction, and the seed's table against it."""
    out = []
    for (model, dev), g in _pick(ceil, source="predicted").groupby(["model", "device"], sort=False):
        c = _pick(g, metric="ceiling_tg_tps").set_index("value")["result"]
        p = _pick(g, metric="tg_tps").set_index("value")["result"]
        both = [q for q in c.index if q in p.index]
        if both:
            r = [p[q] / c[q] for q in both]
            out.append(_md("{model} on {dev}: the dark bar (predicted) reaches {a}–{b} % of the light one "
                           "(bandwidth / weights) — the rest is compute, overhead and KV reads.", model=model,
                           dev=_where(dev), a=f"{100 * min(r):.0f}", b=f"{100 * max(r):.0f}"))
    cl = _pick(ceil, source="claimed")
    if len(cl):
        gaps = []
        for _, r in cl.iterrows():
            ours = _one(ceil, source="predicted", metric="ceiling_tg_tps", model=r["model"], value=r["value"])
            if ours:
                gaps.append((abs(r["result"] / ours - 1), r["value"], r["result"], ours))
        if gaps:
            worst = max(gaps)
            out.append(_md("The grey bars (the seed's own table) sit within {w} of bandwidth / weights; the widest "
                           "gap is {q}: {c:g} claimed vs {o}.", w=f"{100 * worst[0]:.0f} %", q=worst[1],
                           c=worst[2], o=_fmt(worst[3])))
    return _caption(*out)


def caption_catalog(sc: Scenario, cat):
    """Under the catalog: which devices sit on their overhead tick (bandwidth no longer matters there)."""
    p = _pick(cat, metric="tg_tps", source="predicted").set_index("value")
    floor = _pick(cat, metric="overhead_floor_tg_tps").set_index("value")
    ceil = _pick(cat, metric="ceiling_tg_tps").groupby("value")["result"].max()
    if not len(p):
        return _caption()
    on_floor = [d for d in p.index if d in floor.index and p.loc[d, "result"] >= 0.8 * floor.loc[d, "result"]]
    out = []
    if on_floor:
        fast = max(on_floor, key=lambda d: ceil.get(d, 0))
        # the slowest card whose prediction is within 15 % of the fastest card's: same speed, different bandwidth
        alike = [d for d in on_floor if abs(p.loc[d, "result"] / p.loc[fast, "result"] - 1) <= 0.15] or [fast]
        slow = min(alike, key=lambda d: ceil.get(d, math.inf))
        ms = floor.loc[fast, "note"].split(" ms")[0]
        out.append(_md("The black ticks: {k} of {n} devices predict within 20 % of their per-token overhead "
                       "limit — {slow} and {fast} both about {a}–{b} tok/s although their bandwidth ceilings "
                       "differ {x}×. For a {mb} MB model a token's fixed cost ({ms} ms of launches and "
                       "synchronisation on {fast}) outweighs reading its weights: bandwidth stops mattering.", k=len(on_floor),
                       n=len(p), slow=slow, fast=fast, a=_fmt(min(p.loc[slow, "result"], p.loc[fast, "result"]), 0),
                       b=_fmt(max(p.loc[slow, "result"], p.loc[fast, "result"]), 0),
                       x=_fmt(ceil.get(fast, math.nan) / ceil.get(slow, math.nan), 0),
                       mb=_fmt(cat.attrs.get("weights_mb"), 0), ms=ms))
    off = [d for d in p.index if d not in on_floor]
    if off and not on_floor:
        out.append(_md("No device comes near its tick: at {mb} MB of weights per token, bytes (or compute) set the "
                       "speed everywhere, so the dark bars follow the light ones.",
                       mb=_fmt(cat.attrs.get("weights_mb"), 0)))
    elif off:
        out.append(_md("Where a bar stops short of its tick ({k} device(s), e.g. {d}), bytes or compute still "
                       "set the speed.", k=len(off), d=", ".join(off[:3])))
    spilled = [d for d in p.index if not str(p.loc[d, "note"]).startswith("fits")]
    if spilled:
        out.append(_md("{k} device(s) cannot hold it (orange): their prediction keeps the layers that do not fit on "
                       "the CPU beside them.", k=len(spilled)))
    return _caption(*out)


def caption_roofline(sc: Scenario, roof):
    """Under this machine's roofline: the measured point against the two lines."""
    out = []
    m = _pick(roof, source="measured", metric="tg_tps")
    if len(m):
        r = m.iloc[0]
        c = _one(roof, metric="ceiling_tg_tps", value=r["value"], model=r["model"])
        p = _one(roof, metric="tg_tps", source="predicted", value=r["value"], model=r["model"])
        sd, n = spread(r["note"])
        out.append(_md("The orange square ({q}: {v} tok/s{sd}) sits at {f} of the light-blue bandwidth line; the "
                       "calibrated prediction for it is {p} tok/s.", q=r["value"], v=_fmt(r["result"]),
                       sd=f" ± {_fmt(sd, 1)} over {n} runs" if n > 1 else ", one run",
                       f=f"{100 * r['result'] / c:.0f} %" if c else "—", p=_fmt(p)))
    pred = _pick(roof, source="predicted", metric="tg_tps")
    if len(pred) > 1:
        bounds = pred["note"].str.extract(r"bound: (\w[\w-]*)")[0].value_counts()
        why = {"memory": "so across quants it rises and falls with the bytes read, like the line",
               "compute": "so de-quantizing the weights, not reading them, sets its speed: fewer bits buy less "
                          "than the line promises",
               "overhead": "so a token's fixed cost, not its bytes, sets its speed"}
        if len(bounds):
            out.append(_md("The prediction is {b}-bound for {k} of {n} quants, {why}.", b=bounds.index[0],
                           k=int(bounds.iloc[0]), n=len(pred), why=why.get(bounds.index[0], "")))
    return _caption(*out, _not_measured(roof))


def caption_apple(sc: Scenario, apple_df):
    """Under the Apple Silicon comparison: how many points fall inside the ±15 % band."""
    out = []
    for metric, name in (("tg_tps", "decode"), ("pp_tps", "prompt")):
        c = _pick(apple_df, metric=metric, source="claimed").set_index(["value", "quant"])["result"]
        p = _pick(apple_df, metric=metric, source="predicted").set_index(["value", "quant"])["result"]
        j = c.to_frame("pub").join(p.to_frame("pred"), how="inner")
        if len(j):
            err = (j["pred"] / j["pub"] - 1).abs()
            worst = err.idxmax()
            out.append(_md("{name}: {k} of {n} points inside the grey ±15 % band; the furthest is {chip} {q} "
                           "({e}).", name=name.capitalize(), k=int((err <= 0.15).sum()), n=len(j), chip=worst[0],
                           q=worst[1], e=_pct(j.loc[worst, "pred"], j.loc[worst, "pub"])))
    return _caption(*out)


# ------------------------------------------------------------------------------------------------
# 03, 04
# ------------------------------------------------------------------------------------------------

def caption_baseline(sc: Scenario, base):
    """Under the baseline: measured against predicted and the ceiling, with the spread."""
    out = []
    for metric, name in (("tg_tps", "decode"), ("pp_tps", "prompt processing")):
        m = points(base, metric)
        if not len(m):
            continue
        r = m.iloc[0]
        model = _pick(base, metric=metric, source="measured")["model"].iloc[0]
        p = _one(base, metric=metric, source="predicted", model=model, device=HOST)
        c = _one(base, metric="strict_ceiling_tg_tps", model=model, device=HOST) if metric == "tg_tps" else None
        out.append(_md("{name}: the orange bar is {v} tok/s{runs}, {e}{ceil}.", name=name.capitalize(),
                       v=_fmt(r["result"]), runs=_runs(r["sd"], int(r["r"])), e=_against(r["result"], p),
                       ceil=f" and {100 * r['result'] / c:.0f} % of the strict ceiling ({_fmt(c)})" if c else ""))
    st = study(sc)
    if st.device.id != HOST:
        p = _one(base, metric="tg_tps", source="predicted", device=st.device.id)
        out.append(_md("The {dev} bars are the scenario's model there: predicted only ({p} tok/s decode).",
                       dev=st.device.id, p=_fmt(p)))
    return _caption(*out, _not_measured(base))


def caption_ladder(sc: Scenario, ladder):
    """Under the quant ladder: the measured spread across quants against the noise, and the prediction's."""
    out = []
    for metric, name in (("tg_tps", "Decode"), ("pp_tps", "Prompt processing")):
        pts = points(ladder, metric, "quant")
        if len(pts) >= 2:
            lo, hi = pts["result"].idxmin(), pts["result"].idxmax()
            out.append(_md("{name}: slowest {ql} {a} tok/s, fastest {qh} {b} — {d}.", name=name, ql=lo,
                           a=_fmt(pts.loc[lo, "result"]), qh=hi, b=_fmt(pts.loc[hi, "result"]),
                           d=difference(pts.loc[lo, "result"], pts.loc[lo, "sd"], int(pts.loc[lo, "r"]),
                                        pts.loc[hi, "result"], pts.loc[hi, "sd"], int(pts.loc[hi, "r"]))))
    if not out:
        p = points(ladder, "tg_tps", "quant", source="predicted")
        if len(p):
            out.append(_md("Predicted decode from {a} ({qa}) to {b} tok/s ({qb}).", a=_fmt(p["result"].min()),
                           qa=p["result"].idxmin(), b=_fmt(p["result"].max()), qb=p["result"].idxmax()))
    return _caption(*out, _not_measured(ladder))


def caption_file_sizes(sc: Scenario, ladder):
    """Under the file sizes: predicted vs written, and how much the smallest rung saves."""
    out = []
    f = _pick(ladder, metric="file_bytes")
    meas = f[f["source"] == "measured"].set_index("value")["result"]
    pred = f[f["source"] == "predicted"].groupby("value")["result"].mean()
    both = [q for q in meas.index if q in pred.index]
    if both:
        errs = {q: abs(pred[q] / meas[q] - 1) for q in both}
        worst = max(errs, key=errs.get)
        out.append(_md("Each pair of bars agrees within {w} ({q} the widest): the file size follows from the "
                       "header's shapes and llama-quantize's per-tensor types.", w=f"{100 * errs[worst]:.1f} %",
                       q=worst))
    sizes = meas if len(meas) else pred
    if len(sizes) > 1:
        out.append(_md("{small} is {r} of {big}'s size: that ratio is the decode ceiling's, inverted.",
                       small=sizes.idxmin(), big=sizes.idxmax(), r=f"{100 * sizes.min() / sizes.max():.0f} %"))
    return _caption(*out)


def caption_quality(sc: Scenario, qual):
    """Under the quality plots: which rung costs the most, against the reference."""
    ppl = _pick(qual, metric="perplexity")
    if not len(ppl):
        return _caption(_not_measured(qual) or "")
    ref = _one(ppl, value="F16")
    q = ppl[ppl["value"] != "F16"]
    out = []
    if len(q) and ref:
        worst, best = q.loc[q["result"].idxmax()], q.loc[q["result"].idxmin()]
        out.append(_md("Against the dashed F16 line ({r}): {qb} is {db} and {qw} {dw}.", r=_fmt(ref, 2),
                       qb=best["value"], db=_pct(best["result"], ref), qw=worst["value"],
                       dw=_pct(worst["result"], ref)))
    kl = _pick(qual, metric="kl_divergence")
    if len(kl) > 1:
        k = kl.set_index("value")["result"]
        out.append(_md("KL divergence (right) orders the rungs more sharply: {lo} {a} to {hi} {b} nats per token.",
                       lo=k.idxmin(), a=f"{k.min():.4f}", hi=k.idxmax(), b=f"{k.max():.4f}"))
    return _caption(*out)


# ------------------------------------------------------------------------------------------------
# 05, 06
# ------------------------------------------------------------------------------------------------

def caption_gpu_layers(sc: Scenario, ngl):
    """Under the -ngl sweep: where the curve is flat, where it climbs, and what does not fit."""
    p = points(ngl, "tg_tps", "n_gpu_layers", source="predicted")
    if len(p) < 2:
        return _caption(_not_measured(ngl))
    model, dev = _pick(ngl, metric="tg_tps", source="predicted")[["model", "device"]].iloc[0]
    vals = [int(float(v)) for v in p.index]
    res = list(p["result"])
    half = len(res) // 2
    out = [_md("{model} on {dev}: {a} tok/s with -ngl {v0}, {m} at -ngl {vh}, {b} at -ngl {vn}. The first half of "
               "the layers buys {g1}, the second half {g2}: while any layer is left on the CPU, reading it at the "
               "host's bandwidth dominates a token's time.", model=model, dev=dev, a=_fmt(res[0]), v0=vals[0],
               m=_fmt(res[half]), vh=vals[half], b=_fmt(res[-1]), vn=vals[-1], g1=_pct(res[half], res[0]),
               g2=_pct(res[-1], res[half]))]
    fits = _pick(ngl, metric="fits", lever="n_gpu_layers")
    bad = [int(float(v)) for v, f in zip(fits["value"], fits["result"]) if f < 0.5]
    if bad:
        out.append(_md("The red band (-ngl {a} and up) does not fit the card at these flags: llama.cpp would stop "
                       "at -ngl {m}.", a=min(bad), m=ngl.attrs.get("max_gpu_layers")))
    else:
        out.append(_md("Every value fits the card at these flags (-c {c}); the spill plot below raises the context.",
                       c=sc.n_ctx))
    return _caption(*out, _md("Nothing here is measured: {why}.", why=ngl.attrs["why_not_measured"])
                    if ngl.attrs.get("why_not_measured") and not (ngl["source"] == "measured").any() else "")


def caption_spill(sc: Scenario, spill_df):
    """Under the spill plot: the step, and the KV cache's own (small) share of it."""
    sp = _pick(spill_df, metric="tg_tps")
    if len(sp) < 2:
        return _caption()
    sp = sp.assign(v=sp["value"].astype(int)).sort_values("v")
    first, last = sp.iloc[0], sp.iloc[-1]
    s0 = _one(spill_df, metric="layers_spilled", value=first["value"]) or 0
    s1 = _one(spill_df, metric="layers_spilled", value=last["value"]) or 0
    allg = _one(spill_df, metric="tg_tps_all_layers", value=last["value"])
    kv0 = _one(spill_df, metric="kv_bytes_read_per_token", value=first["value"])
    kv1 = _one(spill_df, metric="kv_bytes_read_per_token", value=last["value"])
    if s0 == s1:
        return _caption(_md("The dark bars stay level: {n} layer slot(s) off the card at every context from {a} to "
                            "{b} — no spill at these sizes.", n=int(s0), a=first["value"], b=last["value"]))
    return _caption(_md("Compare the two bars at -c {c}: with every layer on the card it would decode at {all} tok/s; "
                        "with the {n} layer slot(s) that no longer fit on the CPU it decodes at {fit} ({pct}). The "
                        "KV cache a token reads barely moves ({kv}), so the drop is the spilled layers, read at the "
                        "host's bandwidth.", c=last["value"], all=_fmt(allg), n=int(s1), fit=_fmt(last["result"]),
                        pct=_pct(last["result"], allg), kv=_pct(kv1, kv0)))


def caption_kv(sc: Scenario, kv):
    """Under the KV memory plot: the slope, the cache types' ratio, measured against predicted."""
    out = []
    pred = _pick(kv, source="predicted", metric="kv_cache_bytes")
    if len(pred):
        model = pred["model"].iloc[0]
        g = _pick(pred, model=model)
        big = str(max(int(v) for v in g["value"]))
        by_ct = g[g["value"] == big].set_index("note")["result"]
        f16 = by_ct.get("cache_type=f16")
        ratios = ", ".join(f"{n.replace('cache_type=', '')} {f16 / r:.1f}× smaller" for n, r in by_ct.items()
                           if f16 and n != "cache_type=f16" and r)
        out.append(_md("Each line doubles with -c (the axis is log 2): {model} needs {mib} MiB of f16 cache at "
                       "-c {c}{ratios}.", model=model, mib=_fmt((f16 or by_ct.max()) / MIB, 0), c=big,
                       ratios=f"; {ratios}" if ratios else ""))
    meas = _pick(kv, source="measured")
    if len(meas):
        errs = []
        for _, r in meas.iterrows():
            p = _one(kv, source="predicted", model=r["model"], value=r["value"], note=r["note"])
            if p:
                errs.append(abs(p / r["result"] - 1))
        if errs:
            out.append(_md("The hollow (predicted) and filled (llama.cpp's log) markers coincide: at most {e} apart.",
                           e=f"{100 * max(errs):.1f} %"))
    return _caption(*out)


def caption_depth(sc: Scenario, depth_df):
    """Under decode vs depth: how much the measured line falls, against the noise, and the prediction's fall."""
    out = []
    pts = points(depth_df, "tg_tps", "n_depth")
    if len(pts) >= 2:
        out.append(_series_change(pts, "Measured decode", "depth"))
    st = study(sc)
    model = st.measured_label if st.measuring else st.label
    p = points(depth_df, "tg_tps", "n_depth", source="predicted", model=model)
    if len(p) >= 2:
        out.append(_md("The prediction for it {d} over the same depths: each token reads the KV cache of every "
                       "token before it.", d=_change(p["result"].iloc[0], p["result"].iloc[-1])))
    return _caption(*out, _not_measured(depth_df))


# ------------------------------------------------------------------------------------------------
# 07 – 12
# ------------------------------------------------------------------------------------------------

def _two_way(df, metric: str, lever: str, name: str, flag: str) -> str:
    pts = points(df, metric, lever)
    if len(pts) < 2:
        return ""
    (va, a, asd, ar), (vb, b, bsd, br) = _ends(pts)
    return _md("{name}: {flag} {va} {a} vs {flag} {vb} {b} tok/s — {d}.", name=name, flag=flag, va=va, a=_fmt(a),
               vb=vb, b=_fmt(b), d=difference(a, asd, ar, b, bsd, br))


def caption_flash_attn(sc: Scenario, fa):
    """Under -fa off vs on: the measured difference against the noise, at the depth compared."""
    out = [_md("Both settings ran at depth {d}.", d=fa.attrs.get("depth", 0))]
    for metric, name in (("tg_tps", "Decode"), ("pp_tps", "Prompt")):
        out.append(_two_way(fa, metric, "flash_attn", name, "-fa"))
    st = study(sc)
    model = st.measured_label if st.measuring else st.label
    p = points(fa, "tg_tps", "flash_attn", source="predicted", model=model)
    if len(p) == 2:
        off = _fmt(p.loc["off", "result"]) if "off" in p.index else "—"
        on = _fmt(p.loc["on", "result"]) if "on" in p.index else "—"
        out.append(_md("Predicted decode: {a} (off) vs {b} tok/s (on).", a=off, b=on))
    return _caption(*out, _not_measured(fa))


def caption_batch(sc: Scenario, batch):
    """Under -ub: prompt speed from the smallest to the largest micro-batch, against the noise."""
    pts = points(batch, "pp_tps", "n_ubatch")
    n = batch.attrs.get("n_prompt", sc.n_prompt)
    out = []
    if len(pts) >= 2:
        (va, a, asd, ar), (vb, b, bsd, br) = _ends(pts)
        out.append(_md("The {n}-token prompt takes {sa} steps at -ub {va} and {sb} at -ub {vb}; prompt processing "
                       "goes from {a} to {b} tok/s: {d}.", n=n, sa=-(-n // int(va)), va=va, sb=-(-n // int(vb)), vb=vb,
                       a=_fmt(a), b=_fmt(b), d=difference(a, asd, ar, b, bsd, br)))
    return _caption(*out, _not_measured(batch))


def caption_threads(sc: Scenario, threads):
    """Under -t: which of prompt processing and decode gains from threads, against the noise."""
    out = [_series_change(points(threads, "pp_tps", "n_threads"), "Prompt processing", "-t"),
           _series_change(points(threads, "tg_tps", "n_threads"), "Decode", "-t")]
    return _caption(*out, _not_measured(threads))


def caption_parallel(sc: Scenario, par):
    """Under --parallel: the ceilings' shape, and the measured totals where llama-server ran."""
    out = []
    c = points(par, "strict_ceiling_tg_tps", "n_parallel", source="predicted")
    per = points(par, "strict_ceiling_tg_tps_per_stream", "n_parallel", source="predicted")
    if len(c) >= 2:
        out.append(_md("The dotted lines are the bandwidth ceilings: all slots together {a} → {b} tok/s from "
                       "-np {va} to -np {vb} (the weights are read once per step for every slot), each stream "
                       "{c} → {d}.",
                       a=_fmt(c["result"].iloc[0]), b=_fmt(c["result"].iloc[-1]), va=c.index[0], vb=c.index[-1],
                       c=_fmt(per["result"].iloc[0]) if len(per) else "—",
                       d=_fmt(per["result"].iloc[-1]) if len(per) else "—"))
    out.append(_series_change(points(par, "tg_tps", "n_parallel"), "Measured total decode", "-np"))
    return _caption(*out, _not_measured(par))


def caption_load(sc: Scenario, load):
    """Under the load times: which mode loads fastest, and whether the gap is beyond the runs' spread."""
    ld = _pick(load, metric="load_s")
    if not len(ld):
        return _caption(_not_measured(load))
    g = ld.groupby("value")["result"].agg(["median", "min", "max", "count"])
    fast, slow = g["median"].idxmin(), g["median"].idxmax()
    if int(g["count"].min()) < 2:
        verdict = "single runs: no spread to tell them apart"
    elif g.loc[fast, "max"] >= g.loc[slow, "min"]:
        verdict = "their ranges overlap: no difference beyond the noise"
    else:
        verdict = f"{slow} {_pct(g.loc[slow, 'median'], g.loc[fast, 'median'])}, beyond the runs' ranges"
    return _caption(_md("Load time (left): fastest {fast} {a} s, slowest {slow} {b} s (medians of {n} run(s)) — "
                        "{verdict}. The first load of a run reads the file from disk; later ones find it in the page "
                        "cache.", fast=fast, a=f"{g.loc[fast, 'median']:.3f}", slow=slow,
                        b=f"{g.loc[slow, 'median']:.3f}", n=int(g["count"].max()), verdict=verdict))


def caption_own_staircase(sc: Scenario, stairs):
    """Under the scenario's own staircase: the predicted climb on the device, and the measured one here."""
    st = study(sc)
    out = []
    p = _pick(stairs, metric="tg_tps", source="predicted", device=st.device.id, model=st.label)
    if len(p) > 1:
        out.append(_md("Predicted on {dev}: {a} → {b} tok/s over {n} stages, each one change.",
                       dev=_where(st.device.id), a=_fmt(p["result"].iloc[0]), b=_fmt(p["result"].iloc[-1]), n=len(p)))
    pts = points(stairs, "tg_tps", "stage")
    if len(pts) >= 2:
        order = list(dict.fromkeys(_pick(stairs, lever="stage")["value"]))
        pts = pts.reindex([v for v in order if v in pts.index])
        out.append(_series_change(pts, "Measured here", "stage"))
    return _caption(*out, _not_measured(stairs))

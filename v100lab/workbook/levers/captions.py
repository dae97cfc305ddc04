"""What to look at under each plot: one or two sentences (``caption_*``), written from the numbers of the
frame the plot drew — the points to compare, how far apart they are, and whether a difference is larger than
the noise of the repetitions (a difference inside it is called "no difference", never a winner). Every string
that came from a model or a parameter file is escaped (:mod:`v100lab.workbook.render`).
"""

from __future__ import annotations

import math

from v100lab.facts.results import compare
from v100lab.workbook.scenario import Scenario
from v100lab.workbook.levers.steps import GIB, HOST, MIB, study
from v100lab.workbook.levers.text import claim_verdict, difference, ends, fmt, md, mean_of, pct, pick, points, best_of


def _caption(*sentences: str):
    """One paragraph under a plot (sentences already escaped), led by "What to look at"."""
    from IPython.display import Markdown  # optional dependency: IPython (only a notebook displays it)

    text = " ".join(s for s in sentences if s)
    return Markdown(f"**What to look at.** {text}" if text else "")


def _where(device: str) -> str:
    return "this machine" if device == HOST else device


def _against(measured: float | None, predicted: float | None) -> str:
    """A measurement against its prediction in words, with the workbook's one sign convention (error =
    predicted / measured − 1, as the summaries and the index give it): "predicted 55.1, error +31 %"."""
    if not measured or not predicted:
        return "no prediction to compare with"
    return f"predicted {fmt(predicted)}, error {100 * (predicted / measured - 1):+.0f} %"


def _change(a: float | None, b: float | None) -> str:
    """How a predicted value moves from ``a`` to ``b``: "falls 3 %", "rises 12 %", "stays within 1 %"."""
    if a is None or b is None or not a:
        return "—"
    r = b / a - 1
    if abs(r) < 0.01:
        return "stays within 1 %"
    return f"{'rises' if r > 0 else 'falls'} {abs(100 * r):.0f} %"


def _runs(sd: float, r: int) -> str:
    return f" ± {fmt(sd)} over {r} runs" if r > 1 else " (one run)"


def _series_change(pts, what: str, lever_text: str) -> str:
    """How a measured series changes from its first value to its last, with the noise judged."""
    if len(pts) == 1:
        return md("{what}: {a} tok/s at {lever} {va}{runs} — one value, nothing to compare.", what=what,
                   a=fmt(pts["result"].iloc[0]), lever=lever_text, va=pts.index[0],
                   runs=_runs(pts["sd"].iloc[0], int(pts["r"].iloc[0])))
    if len(pts) < 2:
        return ""
    (va, a, asd, ar), (vb, b, bsd, br) = ends(pts)
    return md("{what} goes from {a} tok/s at {lever} {va} to {b} at {lever} {vb}: {d}.", what=what, a=fmt(a),
               b=fmt(b), lever=lever_text, va=va, vb=vb, d=difference(a, asd, ar, b, bsd, br))


def _not_measured(df) -> str:
    why = df.attrs.get("why_not_measured")
    if why and not (df["source"] == "measured").any():
        return md("Only predictions: {why}.", why=why)
    return ""


# ------------------------------------------------------------------------------------------------
# 00
# ------------------------------------------------------------------------------------------------

def caption_staircase(sc: Scenario, stairs):
    """Under the staircase: where the claims leave the ceiling (left), and how far the stages' flags move
    decode here (right)."""
    seed = stairs[stairs["device"] != HOST]
    out = []
    cl = pick(seed, source="claimed", metric="tg_tps")
    ceil = pick(seed, metric="physical_ceiling_tg_tps")
    if len(cl) and len(ceil):
        above = list(dict.fromkeys(cl[cl["above_ceiling"].fillna(False).astype(bool)]["value"]))
        out.append(md("Left: follow the grey bars against the dotted line — the claims climb to {hi} tok/s while "
                       "the physical ceiling of the assumed model on {dev} tops out at {c} tok/s{tail}.",
                       hi=f"{cl['result'].max():g}", dev=cl["device"].iloc[0], c=fmt(ceil["result"].max()),
                       tail=(f"; stage(s) {', '.join(above)} claim more than any card can read" if above else
                             "; every claim stays under it")))
    pts = points(stairs[stairs["device"] == HOST], "tg_tps", "stage")
    if len(pts) >= 2:
        order = list(dict.fromkeys(pick(stairs, lever="stage")["value"]))
        pts = pts.reindex([v for v in order if v in pts.index])
        lo, hi = pts["result"].idxmin(), pts["result"].idxmax()
        steps = [(abs(pts["result"].iloc[i + 1] / pts["result"].iloc[i] - 1), i) for i in range(len(pts) - 1)
                 if pts["result"].iloc[i]]
        i = max(steps)[1] if steps else 0
        a, b = pts.iloc[i], pts.iloc[i + 1]
        out.append(md("Right: here the stages' flags give {model} {a} ({va}) to {b} tok/s ({vb}); the largest step "
                       "between neighbouring stages, {sa} → {sb}, is {d} — compare it with the step the seed claims "
                       "there.", model=pick(stairs, device=HOST)["model"].iloc[0], a=fmt(pts.loc[lo, "result"]),
                       va=lo, b=fmt(pts.loc[hi, "result"]), vb=hi, sa=pts.index[i], sb=pts.index[i + 1],
                       d=difference(a["result"], a["sd"], int(a["r"]), b["result"], b["sd"], int(b["r"]))))
    return _caption(*out, _not_measured(stairs))


# ------------------------------------------------------------------------------------------------
# 01
# ------------------------------------------------------------------------------------------------

def caption_memory(sc: Scenario, mem):
    """Under the memory breakdown: what dominates each bar, and how close the GPU's bar comes to its line."""
    out = []
    pred = pick(mem, source="predicted", metric="bytes")
    for group, g in pred.groupby("group", sort=False):
        for dev, d in g.groupby("device", sort=False):
            total = d["result"].sum()
            if not total:
                continue
            top = d.loc[d["result"].idxmax()]
            cap = mean_of(mem, metric="capacity_bytes", device=dev, group=group)
            line = md("{model}, {dev}'s bar: {comp} take {share} of {total} GiB", model=d["model"].iloc[0],
                       comp=top["value"], share=f"{100 * top['result'] / total:.0f} %", total=fmt(total / GIB, 2),
                       dev=_where(dev))
            if dev != HOST and cap:
                line += md(", {left} GiB {side} the red line ({cap} GiB)", left=fmt(abs(cap - total) / GIB, 2),
                            side="short of" if cap >= total else "over", cap=fmt(cap / GIB, 1))
            out.append(line + ".")
    c = compare(mem, ("model", "device", "lever", "value", "group"), metric="bytes", require=("measured",))
    if len(c):
        out.append(md("The hatched bar is llama.cpp's own log: {d} from the plan's bar above it.",
                       d=pct(c["predicted"].sum(), c["measured"].sum())))
    return _caption(*out)


def caption_fit(sc: Scenario, grid):
    """Under the what-fits heatmap: per model and device, how many cells are red and where the border runs."""
    out = []
    names = grid.attrs.get("device_names") or {}
    fits = pick(grid, metric="fits", lever="n_ctx")
    margin = pick(grid, metric="margin_bytes", lever="n_ctx")
    for (model, dev), f in fits.groupby(["model", "device"], sort=False):
        red = f[f["result"] < 0.5]
        m = pick(margin, model=model, device=dev)
        where = "this machine's RAM" if dev == HOST else names.get(dev, dev)
        if not len(red):
            out.append(md("{model} on {where}: every cell is green, at least {lo} GiB to spare — nothing here is "
                           "near a limit.", model=model, where=where, lo=fmt(m["result"].min() / GIB, 2)))
            continue
        nowhere = [q for q, g in f.groupby("quant", sort=False) if g["result"].max() < 0.5]
        everywhere = [q for q, g in f.groupby("quant", sort=False) if g["result"].min() >= 0.5]
        out.append(md("{model} on {where}: {k} of {n} cells are red{nowhere}{everywhere}; read a row left to right "
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
    for (model, dev), g in pick(ceil, source="predicted").groupby(["model", "device"], sort=False):
        c = pick(g, metric="weights_ceiling_tg_tps").set_index("value")["result"]
        p = pick(g, metric="tg_tps").set_index("value")["result"]
        both = [q for q in c.index if q in p.index]
        if both:
            r = [p[q] / c[q] for q in both]
            out.append(md("{model} on {dev}: the dark bar (predicted) reaches {a}–{b} % of the light one "
                           "(bandwidth / weights) — the rest is compute, overhead and KV reads.", model=model,
                           dev=_where(dev), a=f"{100 * min(r):.0f}", b=f"{100 * max(r):.0f}"))
    cl = compare(ceil, ("model", "value"), metric="weights_ceiling_tg_tps", require=("claimed", "predicted"))
    if len(cl):
        gaps = [(abs(r - 1), v, c, p) for v, c, p, r in zip(cl["value"], cl["claimed"], cl["predicted"],
                                                            cl["claimed_ratio"]) if r == r]
        if gaps:
            worst = max(gaps)
            out.append(md("The grey bars (the seed's own table) sit within {w} of bandwidth / weights; the widest "
                           "gap is {q}: {c:g} claimed vs {o}.", w=f"{100 * worst[0]:.0f} %", q=worst[1],
                           c=worst[2], o=fmt(worst[3])))
    return _caption(*out)


def caption_catalog(sc: Scenario, cat):
    """Under the catalog: which devices sit on their overhead tick (bandwidth no longer matters there)."""
    p = pick(cat, metric="tg_tps", source="predicted").set_index("value")
    floor = pick(cat, metric="overhead_floor_tg_tps").set_index("value")
    ceil = pick(cat, metric="weights_ceiling_tg_tps").groupby("value")["result"].max()
    if not len(p):
        return _caption()
    on_floor = [d for d in p.index if d in floor.index and p.loc[d, "result"] >= 0.8 * floor.loc[d, "result"]]
    out = []
    if on_floor:
        fast = max(on_floor, key=lambda d: ceil.get(d, 0))
        # the slowest card whose prediction is within 15 % of the fastest card's: same speed, different bandwidth
        alike = [d for d in on_floor if abs(p.loc[d, "result"] / p.loc[fast, "result"] - 1) <= 0.15] or [fast]
        slow = min(alike, key=lambda d: ceil.get(d, math.inf))
        ms = f"{1e3 / floor.loc[fast, 'result']:.3f}"    # the limit is 1 / the fixed time per token
        out.append(md("The black ticks: {k} of {n} devices predict within 20 % of their per-token overhead "
                       "limit — {slow} and {fast} both about {a}–{b} tok/s although their bandwidth ceilings "
                       "differ {x}×. For a {mb} MB model a token's fixed cost ({ms} ms of launches and "
                       "synchronisation on {fast}) outweighs reading its weights: bandwidth stops mattering.", k=len(on_floor),
                       n=len(p), slow=slow, fast=fast, a=fmt(min(p.loc[slow, "result"], p.loc[fast, "result"]), 0),
                       b=fmt(max(p.loc[slow, "result"], p.loc[fast, "result"]), 0),
                       x=fmt(ceil.get(fast, math.nan) / ceil.get(slow, math.nan), 0),
                       mb=fmt(cat.attrs.get("weights_mb"), 0), ms=ms))
    off = [d for d in p.index if d not in on_floor]
    if off and not on_floor:
        out.append(md("No device comes near its tick: at {mb} MB of weights per token, bytes (or compute) set the "
                       "speed everywhere, so the dark bars follow the light ones.",
                       mb=fmt(cat.attrs.get("weights_mb"), 0)))
    elif off:
        out.append(md("Where a bar stops short of its tick ({k} device(s), e.g. {d}), bytes or compute still "
                       "set the speed.", k=len(off), d=", ".join(off[:3])))
    spilled = [d for d in p.index if p.loc[d, "fits"] is not None and not p.loc[d, "fits"]]
    if spilled:
        out.append(md("{k} device(s) cannot hold it (orange): their prediction keeps the layers that do not fit on "
                       "the CPU beside them.", k=len(spilled)))
    return _caption(*out)


def caption_roofline(sc: Scenario, roof):
    """Under this machine's roofline: the measured point against the two lines."""
    out = []
    m = compare(roof, ("model", "value"), metric="tg_tps", require=("measured",))
    if len(m):
        r = m.iloc[0]
        c = mean_of(roof, metric="weights_ceiling_tg_tps", value=r["value"], model=r["model"])
        p = None if r["predicted"] != r["predicted"] else float(r["predicted"])
        n = int(r["repetitions"])
        out.append(md("The orange square ({q}: {v} tok/s{sd}) sits at {f} of the light-blue bandwidth line; the "
                       "calibrated prediction for it is {p} tok/s.", q=r["value"], v=fmt(r["measured"]),
                       sd=f" ± {fmt(r['sd'], 1)} over {n} runs" if n > 1 else ", one run",
                       f=f"{100 * r['measured'] / c:.0f} %" if c else "—", p=fmt(p)))
    pred = pick(roof, source="predicted", metric="tg_tps")
    if len(pred) > 1:
        bounds = pred.loc[pred["bound"] != "", "bound"].value_counts()
        why = {"memory": "so across quants it rises and falls with the bytes read, like the line",
               "compute": "so de-quantizing the weights, not reading them, sets its speed: fewer bits buy less "
                          "than the line promises",
               "overhead": "so a token's fixed cost, not its bytes, sets its speed"}
        if len(bounds):
            out.append(md("The prediction is {b}-bound for {k} of {n} quants, {why}.", b=bounds.index[0],
                           k=int(bounds.iloc[0]), n=len(pred), why=why.get(bounds.index[0], "")))
    return _caption(*out, _not_measured(roof))


def caption_apple(sc: Scenario, apple_df):
    """Under the Apple Silicon comparison: how many points fall inside the ±15 % band."""
    out = []
    for metric, name in (("tg_tps", "decode"), ("pp_tps", "prompt")):
        j = compare(apple_df, ("value", "quant"), metric=metric, require=("claimed", "predicted")).rename(
            columns={"claimed": "pub", "predicted": "pred"}).set_index(["value", "quant"])
        if len(j):
            err = (j["pred"] / j["pub"] - 1).abs()
            worst = err.idxmax()
            out.append(md("{name}: {k} of {n} points inside the grey ±15 % band; the furthest is {chip} {q} "
                           "({e}).", name=name.capitalize(), k=int((err <= 0.15).sum()), n=len(j), chip=worst[0],
                           q=worst[1], e=pct(j.loc[worst, "pred"], j.loc[worst, "pub"])))
    return _caption(*out)


# ------------------------------------------------------------------------------------------------
# 03, 04
# ------------------------------------------------------------------------------------------------

def caption_baseline(sc: Scenario, base):
    """Under the baseline: measured against predicted and the ceiling, with the spread."""
    out = []
    for metric, name in (("tg_tps", "decode"), ("pp_tps", "prompt processing")):
        m = compare(base, ("model", "device"), metric=metric, require=("measured",))
        if not len(m):
            continue
        r = m.iloc[0]
        p = None if r["predicted"] != r["predicted"] or not r["predicted"] else float(r["predicted"])
        c = mean_of(base, metric="physical_ceiling_tg_tps", model=r["model"], device=HOST) if metric == "tg_tps" \
            else None
        out.append(md("{name}: the orange bar is {v} tok/s{runs}, {e}{ceil}.", name=name.capitalize(),
                       v=fmt(r["measured"]), runs=_runs(r["sd"], int(r["repetitions"])), e=_against(r["measured"], p),
                       ceil=f" and {100 * r['measured'] / c:.0f} % of the physical ceiling ({fmt(c)})" if c else ""))
    st = study(sc)
    if st.device.id != HOST:
        p = mean_of(base, metric="tg_tps", source="predicted", device=st.device.id)
        out.append(md("The {dev} bars are the scenario's model there: predicted only ({p} tok/s decode).",
                       dev=st.device.id, p=fmt(p)))
    return _caption(*out, _not_measured(base))


def caption_machine(sc: Scenario, base):
    """Under the machine's series while the baseline ran: peak memory against the model's weights, and how busy
    the GPU or the CPU was."""
    series = base.attrs.get("monitor_series") or []
    samples = [s for _, ss in series for s in ss]
    if not samples:
        return _caption(_not_measured(base))
    st = study(sc)
    weights = st.measured_spec.weight_bytes if st.measured_spec is not None else 0
    gpus = [g for s in samples for g in (s.get("gpus") or ())]
    if gpus:
        peak = max(g.get("mem_used_bytes") or 0 for g in gpus)
        util = [g["util_pct"] for g in gpus if g.get("util_pct") is not None]
        power = [g["power_w"] for g in gpus if g.get("power_w") is not None]
        return _caption(md("The card held at most {p} MiB against {w} MiB of weights{u}{pw}: a card holding far "
                           "less than the weights, or sitting idle, is the seed's first diagnosis (not offloaded).",
                           p=fmt(peak / MIB), w=fmt(weights / MIB),
                           u=f", busy {sum(util) / len(util):.0f} % of the time on average" if util else "",
                           pw=f", drawing {sum(power) / len(power):.0f} W on average" if power else ""))
    rss = [s["rss_bytes"] for s in samples if s.get("rss_bytes")]
    cpu = [s["cpu_pct"] for _, ss in series for s in ss[1:] if s.get("cpu_pct") is not None]
    return _caption(md("No NVIDIA GPU here, so llama.cpp's own process: at most {p} MiB resident against {w} MiB "
                       "of weights (the weights are mapped from the file, so they count once read), and {c} % CPU "
                       "on average with -t {t} (100 % = one core; llama.cpp's threads spin while they wait, so "
                       "this says how many cores it held, not how much work it did).",
                       p=fmt(max(rss) / MIB) if rss else "?", w=fmt(weights / MIB),
                       c=f"{sum(cpu) / len(cpu):.0f}" if cpu else "?", t=sc.run_config().threads))


def caption_ladder(sc: Scenario, ladder):
    """Under the quant ladder: the measured spread across quants against the noise, and the prediction's."""
    out = []
    for metric, name in (("tg_tps", "Decode"), ("pp_tps", "Prompt processing")):
        pts = points(ladder, metric, "quant")
        if len(pts) >= 2:
            lo, hi = pts["result"].idxmin(), pts["result"].idxmax()
            out.append(md("{name}: {ql} {a} to {qh} {b} tok/s — {d}.", name=name, ql=lo,
                           a=fmt(pts.loc[lo, "result"]), qh=hi, b=fmt(pts.loc[hi, "result"]), d=best_of(pts)))
    if not out:
        p = points(ladder, "tg_tps", "quant", source="predicted")
        if len(p):
            out.append(md("Predicted decode from {a} ({qa}) to {b} tok/s ({qb}).", a=fmt(p["result"].min()),
                           qa=p["result"].idxmin(), b=fmt(p["result"].max()), qb=p["result"].idxmax()))
    return _caption(*out, _not_measured(ladder))


def caption_file_sizes(sc: Scenario, ladder):
    """Under the file sizes: predicted vs written, and how much the smallest rung saves."""
    out = []
    c = compare(ladder, metric="file_bytes")
    meas = c.dropna(subset=["measured"]).set_index("value")["measured"]
    pred = c.dropna(subset=["predicted"]).groupby("value", sort=False)["predicted"].mean()
    both = c.dropna(subset=["measured", "ratio"])
    errs = {q: abs(1 / r - 1) for q, r in zip(both["value"], both["ratio"]) if r}    # predicted ÷ measured − 1
    if errs:
        worst = max(errs, key=errs.get)
        out.append(md("Each pair of bars agrees within {w} ({q} the widest): the file size follows from the "
                       "header's shapes and llama-quantize's per-tensor types.", w=f"{100 * errs[worst]:.1f} %",
                       q=worst))
    sizes = meas if len(meas) else pred
    if len(sizes) > 1:
        out.append(md("{small} is {r} of {big}'s size: that ratio is the decode ceiling's, inverted.",
                       small=sizes.idxmin(), big=sizes.idxmax(), r=f"{100 * sizes.min() / sizes.max():.0f} %"))
    return _caption(*out)


def caption_quality(sc: Scenario, qual):
    """Under the quality plots: which rung costs the most, against the reference."""
    ppl = pick(qual, metric="perplexity")
    if not len(ppl):
        return _caption(_not_measured(qual) or "")
    ref = mean_of(ppl, value="F16")
    q = ppl[ppl["value"] != "F16"]
    out = []
    if len(q) and ref:
        worst, best = q.loc[q["result"].idxmax()], q.loc[q["result"].idxmin()]
        out.append(md("Against the dashed F16 line ({r}): {qb} is {db} and {qw} {dw}.", r=fmt(ref, 2),
                       qb=best["value"], db=pct(best["result"], ref), qw=worst["value"],
                       dw=pct(worst["result"], ref)))
    kl = pick(qual, metric="kl_divergence")
    if len(kl) > 1:
        k = kl.set_index("value")["result"]
        out.append(md("KL divergence (right) orders the rungs more sharply: {lo} {a} to {hi} {b} nats per token.",
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
    model, dev = pick(ngl, metric="tg_tps", source="predicted")[["model", "device"]].iloc[0]
    vals = [int(float(v)) for v in p.index]
    res = list(p["result"])
    half = len(res) // 2
    out = [md("{model} on {dev}: {a} tok/s with -ngl {v0}, {m} at -ngl {vh}, {b} at -ngl {vn}. The first half of "
               "the layers buys {g1}, the second half {g2}: while any layer is left on the CPU, reading it at the "
               "host's bandwidth dominates a token's time.", model=model, dev=dev, a=fmt(res[0]), v0=vals[0],
               m=fmt(res[half]), vh=vals[half], b=fmt(res[-1]), vn=vals[-1], g1=pct(res[half], res[0]),
               g2=pct(res[-1], res[half]))]
    fits = pick(ngl, metric="fits", lever="n_gpu_layers")
    bad = [int(float(v)) for v, f in zip(fits["value"], fits["result"]) if f < 0.5]
    if bad:
        out.append(md("The red band (-ngl {a} and up) does not fit the card at these flags: llama.cpp would stop "
                       "at -ngl {m}.", a=min(bad), m=ngl.attrs.get("max_gpu_layers")))
    else:
        out.append(md("Every value fits the card at these flags (-c {c}); the spill plot below raises the context.",
                       c=sc.n_ctx))
    return _caption(*out, md("Nothing here is measured: {why}.", why=ngl.attrs["why_not_measured"])
                    if ngl.attrs.get("why_not_measured") and not (ngl["source"] == "measured").any() else "")


def caption_spill(sc: Scenario, spill_df):
    """Under the spill plot: the step, and the KV cache's own (small) share of it."""
    sp = pick(spill_df, metric="tg_tps")
    if len(sp) < 2:
        return _caption()
    sp = sp.assign(v=sp["value"].astype(int)).sort_values("v")
    first, last = sp.iloc[0], sp.iloc[-1]
    s0 = mean_of(spill_df, metric="layers_spilled", value=first["value"]) or 0
    s1 = mean_of(spill_df, metric="layers_spilled", value=last["value"]) or 0
    allg = mean_of(spill_df, metric="tg_tps_all_layers", value=last["value"])
    kv0 = mean_of(spill_df, metric="kv_bytes_read_per_token", value=first["value"])
    kv1 = mean_of(spill_df, metric="kv_bytes_read_per_token", value=last["value"])
    if s0 == s1:
        return _caption(md("The dark bars stay level: {n} layer slot(s) off the card at every context from {a} to "
                            "{b} — no spill at these sizes.", n=int(s0), a=first["value"], b=last["value"]))
    return _caption(md("Compare the two bars at -c {c}: with every layer on the card it would decode at {all} tok/s; "
                        "with the {n} layer slot(s) that no longer fit on the CPU it decodes at {fit} ({pct}). The "
                        "KV cache a token reads barely moves ({kv}), so the drop is the spilled layers, read at the "
                        "host's bandwidth.", c=last["value"], all=fmt(allg), n=int(s1), fit=fmt(last["result"]),
                        pct=pct(last["result"], allg), kv=pct(kv1, kv0)))


def caption_kv(sc: Scenario, kv):
    """Under the KV memory plot: the slope, the cache types' ratio, measured against predicted."""
    out = []
    pred = pick(kv, source="predicted", metric="kv_cache_bytes")
    if len(pred):
        model = pred["model"].iloc[0]
        g = pick(pred, model=model)
        big = str(max(int(v) for v in g["value"]))
        by_ct = g[g["value"] == big].set_index("cache_type")["result"]
        f16 = by_ct.get("f16")
        ratios = ", ".join(f"{ct} {f16 / r:.1f}× smaller" for ct, r in by_ct.items() if f16 and ct != "f16" and r)
        out.append(md("Each line doubles with -c (the axis is log 2): {model} needs {mib} MiB of f16 cache at "
                       "-c {c}{ratios}.", model=model, mib=fmt((f16 or by_ct.max()) / MIB, 0), c=big,
                       ratios=f"; {ratios}" if ratios else ""))
    c = compare(kv, metric="kv_cache_bytes", require=("measured", "predicted"))
    if len(c):
        errs = [abs(p / m - 1) for m, p in zip(c["measured"], c["predicted"]) if p and m]
        if errs:
            out.append(md("The hollow (predicted) and filled (llama.cpp's log) markers coincide: at most {e} apart.",
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
        out.append(md("The prediction for it {d} over the same depths: each token reads the KV cache of every "
                       "token before it.", d=_change(p["result"].iloc[0], p["result"].iloc[-1])))
    return _caption(*out, _not_measured(depth_df))


# ------------------------------------------------------------------------------------------------
# 07 – 12
# ------------------------------------------------------------------------------------------------

def _two_way(df, metric: str, lever: str, name: str, flag: str) -> str:
    pts = points(df, metric, lever)
    if len(pts) < 2:
        return ""
    (va, a, asd, ar), (vb, b, bsd, br) = ends(pts)
    return md("{name}: {flag} {va} {a} vs {flag} {vb} {b} tok/s — {d}.", name=name, flag=flag, va=va, a=fmt(a),
               vb=vb, b=fmt(b), d=difference(a, asd, ar, b, bsd, br))


def caption_flash_attn(sc: Scenario, fa):
    """Under -fa off vs on: the measured difference against the noise, at the depth compared."""
    out = [md("Both settings ran at depth {d}.", d=fa.attrs.get("depth", 0))]
    for metric, name in (("tg_tps", "Decode"), ("pp_tps", "Prompt")):
        out.append(_two_way(fa, metric, "flash_attn", name, "-fa"))
    st = study(sc)
    model = st.measured_label if st.measuring else st.label
    p = points(fa, "tg_tps", "flash_attn", source="predicted", model=model)
    if len(p) == 2:
        off = fmt(p.loc["off", "result"]) if "off" in p.index else "—"
        on = fmt(p.loc["on", "result"]) if "on" in p.index else "—"
        out.append(md("Predicted decode: {a} (off) vs {b} tok/s (on).", a=off, b=on))
    return _caption(*out, _not_measured(fa))


def caption_batch(sc: Scenario, batch):
    """Under -ub: prompt speed from the smallest to the largest micro-batch, against the noise."""
    pts = points(batch, "pp_tps", "n_ubatch")
    n = batch.attrs.get("n_prompt", sc.n_prompt)
    out = []
    if len(pts) >= 2:
        (va, a, asd, ar), (vb, b, bsd, br) = ends(pts)
        out.append(md("The {n}-token prompt takes {sa} steps at -ub {va} and {sb} at -ub {vb}; prompt processing "
                       "goes from {a} to {b} tok/s: {d}.", n=n, sa=-(-n // int(va)), va=va, sb=-(-n // int(vb)), vb=vb,
                       a=fmt(a), b=fmt(b), d=difference(a, asd, ar, b, bsd, br)))
        out.append(md("Across every -ub measured: {d}.", d=best_of(pts)))
    return _caption(*out, _not_measured(batch))


def caption_threads(sc: Scenario, threads):
    """Under -t: which of prompt processing and decode gains from threads, against the noise."""
    out = [_series_change(points(threads, "pp_tps", "n_threads"), "Prompt processing", "-t"),
           _series_change(points(threads, "tg_tps", "n_threads"), "Decode", "-t")]
    return _caption(*out, _not_measured(threads))


def caption_parallel(sc: Scenario, par):
    """Under --parallel: the ceilings' shape, the measured totals and streams where llama-server ran, and the
    measured total against the serving model's prediction at the most slots."""
    out = []
    c = points(par, "physical_ceiling_tg_tps", "n_parallel", source="predicted")
    per = points(par, "physical_ceiling_tg_tps_per_stream", "n_parallel", source="predicted")
    if len(c) >= 2:
        out.append(md("The dotted lines are the bandwidth ceilings: all slots together {a} → {b} tok/s from "
                       "-np {va} to -np {vb} (the weights are read once per step for every slot), each stream "
                       "{c} → {d}.",
                       a=fmt(c["result"].iloc[0]), b=fmt(c["result"].iloc[-1]), va=c.index[0], vb=c.index[-1],
                       c=fmt(per["result"].iloc[0]) if len(per) else "—",
                       d=fmt(per["result"].iloc[-1]) if len(per) else "—"))
    out.append(_series_change(points(par, "tg_tps", "n_parallel"), "Measured decode of all streams together",
                              "-np"))
    out.append(_series_change(points(par, "tg_tps_per_stream", "n_parallel"), "Each stream", "-np"))
    j = compare(par, metric="tg_tps", lever="n_parallel", require=("measured", "predicted"))
    if len(j):
        j = j.assign(v=j["value"].astype(int)).sort_values("v")
        r = j.iloc[-1]
        out.append(md("At -np {v} the total measured {m} tok/s: {against}.", v=r["value"], m=fmt(r["measured"]),
                       against=_against(r["measured"], r["predicted"])))
    return _caption(*out, _not_measured(par))


def _latency_at(df, metric: str, value, group: str, source: str = "measured") -> float | None:
    return mean_of(df, metric=metric, value=str(value), group=group, source=source)


def caption_parallel_latency(sc: Scenario, lat):
    """Under the latency percentiles: TTFT and ITL of one user at -np 1 against every slot busy at the most
    slots (median and p99), and the serving model's median beside them."""
    lo, hi = min(sc.parallel_slots), max(sc.parallel_slots)
    g1, gn = "concurrency 1", f"concurrency {hi}"
    out = []
    for m, name in (("ttft", "time to first token"), ("itl", "gap between tokens (ITL)")):
        a = _latency_at(lat, f"{m}_ms_median", lo, g1)
        b = _latency_at(lat, f"{m}_ms_median", hi, gn)
        b99 = _latency_at(lat, f"{m}_ms_p99", hi, gn)
        if a is None or b is None:
            continue
        pb = _latency_at(lat, f"{m}_ms_median", hi, gn, "predicted")
        out.append(md("Median {name}: {a} ms for one user at -np {lo}, {b} ms with all {hi} slots busy (p99 {b99} "
                       "ms; predicted median {pb} ms).", name=name, a=fmt(a), lo=lo, b=fmt(b), hi=hi,
                       b99=fmt(b99), pb=fmt(pb)))
    if not out:
        a = _latency_at(lat, "ttft_ms_median", lo, g1, "predicted")
        b = _latency_at(lat, "ttft_ms_median", hi, gn, "predicted")
        if a is not None and b is not None:
            out.append(md("Predicted median time to first token: {a} ms for one user at -np {lo}, {b} ms with all "
                           "{hi} slots busy (their prompts share the steps).", a=fmt(a), lo=lo, b=fmt(b), hi=hi))
    return _caption(*out, _not_measured(lat))


def caption_one_user(sc: Scenario, one):
    """Under the one-user test: the seed's words, the measured ratio at the slot count tested with its
    verdict, and the predicted ratio."""
    claim = one.attrs.get("claim") or {}
    n = claim.get("tested_at")
    out = [md("The seed: \"{advice}\".", advice=claim.get("advice", ""))] if claim else []
    metric = claim.get("metric", "one_user_tg_ratio")
    if n is None:
        return _caption(*out, "The sweep has no -np above 1: nothing to test.", _not_measured(one))
    m = pick(one, metric=metric, source="measured", value=str(n))
    a = mean_of(one, metric="tg_tps_per_stream", source="measured", value="1")
    b = mean_of(one, metric="tg_tps_per_stream", source="measured", value=str(n))
    if len(m) and a is not None and b is not None:
        r, sd, runs = float(m["result"].iloc[0]), float(m["sd"].iloc[0]), int(m["repetitions"].iloc[0])
        out.append(md("One user decodes at {a} tok/s with -np 1 and {b} with -np {n}: ratio {r} ± {sd} — {v}.",
                       a=fmt(a), b=fmt(b), n=n, r=f"{r:.3f}", sd=f"{sd:.3f}",
                       v=claim_verdict(r, sd, float(claim.get("below", 1.0)), runs)))
    p = pick(one, metric=metric, source="predicted", value=str(n))
    if len(p):
        out.append(md("Predicted ratio {r}: a lone request is a batch of one whatever -np, so the model sees no "
                       "speed cost; the cost of more slots for one user is its context (the next figure).",
                       r=f"{float(p['result'].iloc[-1]):.3f}"))
    return _caption(*out, _not_measured(one))


def caption_slot_context(sc: Scenario, ctx):
    """Under the context per slot: the split at the fewest and the most slots, llama-server's own figure, the
    unified alternative, and the KV cache it costs."""
    lo, hi = str(min(sc.parallel_slots)), str(max(sc.parallel_slots))
    out = []
    a = mean_of(ctx, metric="n_ctx_seq", source="predicted", group="split", value=lo)
    b = mean_of(ctx, metric="n_ctx_seq", source="predicted", group="split", value=hi)
    u = mean_of(ctx, metric="n_ctx_seq", source="predicted", group="--kv-unified", value=hi)
    if a is not None and b is not None:
        mb = mean_of(ctx, metric="n_ctx_seq", source="measured", value=hi)
        seen = f" (llama-server reported {mb:,.0f})" if mb is not None else ""
        out.append(md("Each slot gets {a} tokens of context at -np {lo} and {b} at -np {hi}{seen}: -c is split "
                       "across the slots. With --kv-unified the slots share one stream of {u} cells, so one "
                       "long conversation can use it all while the others wait for room.", a=f"{a:,.0f}", lo=lo,
                       b=f"{b:,.0f}", hi=hi, seen=seen, u=f"{u:,.0f}" if u is not None else "—"))
    k1 = mean_of(ctx, metric="kv_cache_bytes", source="predicted", group="split", value=lo)
    kn = mean_of(ctx, metric="kv_cache_bytes", source="predicted", group="split", value=hi)
    if k1 is not None and kn is not None:
        km = mean_of(ctx, metric="kv_cache_bytes", source="measured", value=hi)
        seen = f" (llama-server log: {fmt(km / MIB)} MiB)" if km is not None else ""
        out.append(md("KV cache and state: {a} MiB at -np {lo}, {b} MiB at -np {hi}{seen} ({ch}): the cells are -c "
                       "either way, so only per-sequence state (recurrent layers), sliding windows and padding "
                       "change with the slots.", a=fmt(k1 / MIB), lo=lo, b=fmt(kn / MIB), hi=hi, seen=seen,
                       ch=_change(k1, kn)))
    return _caption(*out, _not_measured(ctx))


def caption_load(sc: Scenario, load):
    """Under the load times: which mode loads fastest, and whether the gap is beyond the runs' spread."""
    ld = pick(load, metric="load_s")
    if not len(ld):
        return _caption(_not_measured(load))
    g = ld.groupby("value")["result"].agg(["median", "min", "max", "count"])
    fast, slow = g["median"].idxmin(), g["median"].idxmax()
    if int(g["count"].min()) < 2:
        verdict = "single runs: no spread to tell them apart"
    elif g.loc[fast, "max"] >= g.loc[slow, "min"]:
        verdict = "their ranges overlap: no difference beyond the noise"
    else:
        verdict = f"{slow} {pct(g.loc[slow, 'median'], g.loc[fast, 'median'])}, beyond the runs' ranges"
    return _caption(md("Load time (left): fastest {fast} {a} s, slowest {slow} {b} s (medians of {n} run(s)) — "
                        "{verdict}. The first load of a run reads the file from disk; later ones find it in the page "
                        "cache.", fast=fast, a=f"{g.loc[fast, 'median']:.3f}", slow=slow,
                        b=f"{g.loc[slow, 'median']:.3f}", n=int(g["count"].max()), verdict=verdict))


def caption_own_staircase(sc: Scenario, stairs):
    """Under the scenario's own staircase: the predicted climb on the device, and the measured one here."""
    st = study(sc)
    out = []
    p = pick(stairs, metric="tg_tps", source="predicted", device=st.device.id, model=st.label)
    if len(p) > 1:
        out.append(md("Predicted on {dev}: {a} → {b} tok/s over {n} stages, each one change.",
                       dev=_where(st.device.id), a=fmt(p["result"].iloc[0]), b=fmt(p["result"].iloc[-1]), n=len(p)))
    pts = points(stairs, "tg_tps", "stage")
    if len(pts) >= 2:
        order = list(dict.fromkeys(pick(stairs, lever="stage")["value"]))
        pts = pts.reindex([v for v in order if v in pts.index])
        out.append(_series_change(pts, "Measured here", "stage"))
    return _caption(*out, _not_measured(stairs))

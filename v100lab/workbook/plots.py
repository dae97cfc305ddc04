"""Figures of the workbook, drawn from the one tidy table (:mod:`v100lab.facts.results`).

Every function takes a tidy frame (or a frame from :mod:`v100lab.workbook.levers`) and returns a matplotlib
``Figure`` with a title, axis labels with units, and a legend that names the source of each series —
measured (this machine), predicted (the speed or memory model) or claimed (the seed, or published rows).
A measured or claimed tok/s figure above the ceiling of its model and device (``above_ceiling``) gets a
red ✕ marker and its own legend entry: such a point means the measurement or the model size is wrong.

Figures are built with ``matplotlib.figure.Figure`` rather than ``pyplot``: nothing is registered with
pyplot's global state, so a notebook shows each figure exactly once (as the cell's value) and a batch
run never accumulates open figures. Text that came from a model file or a parameter file passes through
:func:`v100lab.workbook.render.mpl_text` (no mathtext surprises from a ``$`` in a model name).
"""

from __future__ import annotations

import textwrap
from typing import Iterable, Sequence

from v100lab.workbook.render import mpl_text
from v100lab.facts.results import compare

SOURCE_COLORS = {"measured": "#d95f02", "predicted": "#1b6fb5", "claimed": "#6a6a6a"}
SOURCE_MARKERS = {"measured": "s", "predicted": "o", "claimed": "D"}
SOURCE_LINES = {"measured": "-", "predicted": "--", "claimed": ":"}
ABOVE_STYLE = dict(marker="X", s=140, color="#c0001a", edgecolors="white", linewidths=0.8, zorder=6)
ABOVE_LABEL = "above the physical ceiling"
METRIC_LABELS = {"tg_tps": "decode (tg), tok/s", "pp_tps": "prompt processing (pp), tok/s",
                 "pg_tps": "prompt + decode, tok/s", "tg_tps_per_stream": "decode per stream, tok/s",
                 "weights_ceiling_tg_tps": "bandwidth ceiling, tok/s",
                 "physical_ceiling_tg_tps": "physical ceiling, tok/s"}
LEVER_LABELS = {"n_gpu_layers": "-ngl (layers offloaded)", "n_ctx": "context size -c (tokens)",
                "n_depth": "tokens already in the context (depth)", "n_ubatch": "-ub physical batch (tokens)",
                "flash_attn": "-fa flash attention", "n_parallel": "-np parallel slots",
                "n_threads": "-t threads", "quant": "quantization", "stage": "stage",
                "device": "device", "config": "configuration", "load_mode": "how the model is loaded"}


def _inline_formatter() -> None:
    """Make IPython show a bare ``Figure`` as a PNG (what ``%matplotlib inline`` registers; a kernel that
    never imported pyplot has not done it). Nothing happens outside IPython."""
    try:
        # optional dependency: IPython (only a notebook displays figures)
        from IPython import get_ipython
        from IPython.core.pylabtools import select_figure_formats  # optional: only inside a notebook kernel
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and not getattr(shell, "_v100lab_png", False):
        select_figure_formats(shell, {"png"}, bbox_inches="tight")
        shell._v100lab_png = True


def _figure(ncols: int = 1, nrows: int = 1, width: float = 6.4, height: float = 4.2, **kw):
    import seaborn as sns  # heavy third-party dependency (plotting)
    from matplotlib.figure import Figure  # heavy third-party dependency (plotting)

    _inline_formatter()

    with sns.axes_style("whitegrid"):
        fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
        axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def _numeric(values: Iterable[str]) -> bool:
    try:
        for v in values:
            float(v)
        return True
    except (TypeError, ValueError):
        return False


def _order(values: Sequence[str]) -> list[str]:
    """Values in order of appearance, numeric ones sorted numerically."""
    seen = list(dict.fromkeys(str(v) for v in values))
    if _numeric(seen):
        return sorted(seen, key=float)
    return seen


def _first(df, column: str, default: str = ""):
    """The frame's first value of ``column`` (a panel's model, device, quant...), ``default`` when empty."""
    return df[column].iloc[0] if len(df) else default


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, transform=ax.transAxes, color="#555")
    ax.set_xticks([])
    ax.set_yticks([])


def _mark_above(ax, xs, ys, seen: set) -> None:
    if not len(xs):
        return
    label = None if "above" in seen else ABOVE_LABEL
    seen.add("above")
    ax.scatter(xs, ys, label=label, **ABOVE_STYLE)


def _series_label(source: str, model: str, device: str, many_models: bool) -> str:
    where = "this machine" if device == "host" else device
    if many_models:
        return mpl_text(f"{source}: {model} @ {where}")
    return mpl_text(f"{source} @ {where}")


def _dedupe_legend(ax, **kw) -> None:
    handles, labels = ax.get_legend_handles_labels()
    keep = dict(zip(labels, handles))
    if keep:
        ax.legend(keep.values(), keep.keys(), **{"fontsize": 8, "frameon": True, **kw})


# ------------------------------------------------------------------------------------------------
# the general one: tok/s against one lever
# ------------------------------------------------------------------------------------------------

def _suptitle(fig, title: str, df=None, note: str = "", fontsize: float = 12) -> None:
    """The figure's title, and under it the conditions its numbers were taken at (``df.attrs["conditions"]``:
    model, depth, -fa, -c, threads) and any ``note`` — every figure names its conditions."""
    lines = [mpl_text(title)]
    cond = (df.attrs.get("conditions") if df is not None else "") or ""
    extra = [x for x in (cond, note) if x]
    width = max(60, int(fig.get_figwidth() * 15))   # characters that fit the figure at this size
    fig.suptitle("\n".join(lines + [mpl_text(textwrap.fill(x, width)) for x in extra]),
                 fontsize=fontsize - (1 if extra else 0))


def _with_spread(g):
    """Rows of one series aggregated per x: the mean, and the largest standard deviation over the repetitions
    of its rows (``sd``: 0 for predictions and single runs)."""
    return g.groupby("x", as_index=False).agg(result=("result", "mean"), sd=("sd", "max"))


def _serving_series(ax, d, metric: str, to_x) -> None:
    """The serving model's prediction and llama-server's measurement of ``metric`` (± sd where measured)."""
    for source in ("predicted", "measured"):
        g = d[(d["metric"] == metric) & (d["source"] == source)]
        if not len(g):
            continue
        agg = _with_spread(g.assign(x=to_x(g["value"])))
        yerr = agg["sd"] if source == "measured" and (agg["sd"] > 0).any() else None
        ax.errorbar(agg["x"], agg["result"], yerr=yerr, fmt=SOURCE_LINES[source], marker=SOURCE_MARKERS[source],
                    color=SOURCE_COLORS[source], capsize=3 if yerr is not None else 0, markersize=7,
                    label=("measured (llama-server)" + (" ± sd" if yerr is not None else "")) if source ==
                    "measured" else "predicted (serving model)")


def _value_ticks(ax, order: Sequence[str], numeric: bool) -> None:
    """Ticks at the lever's values (a numeric axis otherwise ticks at 1.5, 2.5 between slot counts)."""
    if not numeric:
        ax.set_xticks(list(range(len(order))))
        ax.set_xticklabels([mpl_text(v) for v in order], rotation=30 if len(order) > 4 else 0,
                           ha="right" if len(order) > 4 else "center")
    elif len(order) <= 12:
        ax.set_xticks([float(v) for v in order])
        ax.set_xticklabels([mpl_text(v) for v in order], rotation=30 if len(order) > 6 else 0)
    else:
        from matplotlib.ticker import MaxNLocator  # heavy third-party dependency (plotting)

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def sweep(df, title: str, *, metrics: Sequence[str] = ("tg_tps", "pp_tps"), lever: str | None = None,
          ceiling: bool = True, log_y: bool = False, note: str = ""):
    """tok/s against the lever's values, one panel per metric; one line per (source, model, device).

    Measured points carry error bars (± one standard deviation over the repetitions). The physical ceiling of
    each model and device is drawn as a thin dotted line on the decode panel, labelled with its depth when the
    frame says it (``attrs["depth"]``); measured/claimed points above it are marked. The subtitle names the
    conditions (``attrs["conditions"]``), and what was not measured (``attrs["why_not_measured"]``) when
    nothing was."""
    d = df[df["unit"] == "tok/s"]
    if lever is not None:
        d = d[d["lever"] == lever]
    metrics = [m for m in metrics if d["metric"].isin([m, f"physical_ceiling_{m}"]).any()] or list(metrics[:1])
    fig, axes = _figure(ncols=len(metrics))
    lev = _first(d, "lever", lever or "")
    order = _order(d["value"].tolist())
    numeric = _numeric(order) and len(order) > 2
    pos = {v: (float(v) if numeric else i) for i, v in enumerate(order)}
    many = d[["model", "device"]].drop_duplicates().shape[0] > 1
    seen: set = set()
    bars = not numeric and len(order) <= 4
    depth = df.attrs.get("depth")
    for ax, metric in zip(axes[0], metrics):
        m = d[d["metric"] == metric]
        if not len(m) and not (d["metric"] == f"physical_ceiling_{metric}").any():
            _empty(ax, "nothing to show for this metric in this run")
            continue
        groups = list(m.groupby(["source", "model", "device"], sort=False))
        width = 0.8 / max(1, len(groups))
        for k, ((source, model, device), g) in enumerate(groups):
            g = g.assign(x=g["value"].map(pos)).sort_values("x")
            agg = _with_spread(g)
            yerr = agg["sd"] if source == "measured" and (agg["sd"] > 0).any() else None
            label = _series_label(source, model, device, many) + (" (± sd)" if yerr is not None else "")
            if bars:
                shift = (k - (len(groups) - 1) / 2) * width
                ax.bar(agg["x"] + shift, agg["result"], width=width * 0.95, color=SOURCE_COLORS.get(source),
                       alpha=0.9 - 0.25 * (k // 3), label=label, yerr=yerr, capsize=3 if yerr is not None else 0,
                       error_kw={"elinewidth": 1, "ecolor": "#333"})
                for x, y, e in zip(agg["x"] + shift, agg["result"], agg["sd"]):
                    text = f"{y:,.3g}" + (f" ± {e:,.2g}" if yerr is not None and e > 0 else "")
                    ax.annotate(text, (x, y + (e if yerr is not None else 0)), xytext=(0, 2),
                                textcoords="offset points", ha="center", fontsize=7)
                g = g.assign(x=g["x"] + shift)
            else:
                ax.errorbar(agg["x"], agg["result"], yerr=yerr, fmt=SOURCE_LINES.get(source, "-"),
                            marker=SOURCE_MARKERS.get(source, "o"), color=SOURCE_COLORS.get(source),
                            alpha=0.9 if source != "predicted" or not many else 0.7, label=label, markersize=6,
                            capsize=3 if yerr is not None else 0, elinewidth=1)
            above = g[g["above_ceiling"].fillna(False).astype(bool) & g["source"].isin(["measured", "claimed"])]
            _mark_above(ax, above["x"], above["result"], seen)
        if ceiling and metric.startswith("tg"):
            own = f"physical_ceiling_{metric}"     # a per-stream panel has its own ceiling when the frame has one
            c = d[d["metric"] == (own if (d["metric"] == own).any() else "physical_ceiling_tg_tps")]
            at = f" at depth {depth}" if depth is not None else (" at each depth" if lev == "n_depth" else "")
            for (model, device), g in c.groupby(["model", "device"], sort=False):
                g = g.assign(x=g["value"].map(pos)).sort_values("x")
                agg = g.groupby("x", as_index=False)["result"].max()
                ax.plot(agg["x"], agg["result"], ":" if not bars else "_", color="#999", linewidth=1.2,
                        markersize=40 if bars else 6,
                        label=mpl_text(f"physical ceiling{at}: {model} @ "
                                       f"{'this machine' if device == 'host' else device}"
                                       if many else f"physical ceiling{at} (bandwidth / bytes per token)"))
        ax.set_title(mpl_text(METRIC_LABELS.get(metric, metric)), fontsize=10)
        ax.set_xlabel(LEVER_LABELS.get(lev, lev))
        ax.set_ylabel("tokens per second (tok/s)")
        if bars:
            ax.set_xlim(-0.75, len(order) - 0.25)
        _value_ticks(ax, order, numeric)
        if log_y:
            ax.set_yscale("log")
        ax.set_ylim(bottom=0 if not log_y else None)
        _dedupe_legend(ax)
    why = df.attrs.get("why_not_measured") or ""
    measured = (d["source"] == "measured").any()
    _suptitle(fig, title, df, "; ".join(x for x in (note, "" if measured or not why else f"not measured here: {why}")
                                        if x))
    return fig


# ------------------------------------------------------------------------------------------------
# 00: the staircase
# ------------------------------------------------------------------------------------------------

def staircase(df):
    """Left: the seed's device — claimed range per stage, predicted decode speed, physical ceiling.
    Right: this machine — each stage's flags measured vs predicted for the measured model."""
    fig, axes = _figure(ncols=2, width=7.0, height=4.6)
    seen: set = set()
    seed = df[df["device"] != "host"]
    here = df[df["device"] == "host"]
    stages = _order(df[df["lever"] == "stage"]["value"].tolist())
    x = {s: i for i, s in enumerate(stages)}
    at = f" at depth {df.attrs['depth']}" if df.attrs.get("depth") is not None else ""
    ax = axes[0][0]
    cl = seed[(seed["source"] == "claimed") & (seed["metric"] == "tg_tps")]
    if len(cl):
        rng = cl.groupby("value")["result"].agg(["min", "max"]).reindex(stages).dropna()
        ax.vlines([x[s] for s in rng.index], rng["min"], rng["max"], color=SOURCE_COLORS["claimed"], linewidth=6,
                  alpha=0.6, label="claimed by the seed (range)")
        above = cl[cl["above_ceiling"].fillna(False).astype(bool)]
        _mark_above(ax, [x[v] for v in above["value"]], above["result"], seen)
    for metric, style, lab in (("tg_tps", dict(marker="o", color=SOURCE_COLORS["predicted"], linestyle="--"),
                                "predicted decode"),
                               ("physical_ceiling_tg_tps", dict(marker="_", color="#999", linestyle=":", markersize=18),
                                f"physical ceiling{at} (bandwidth / bytes per token)")):
        p = seed[(seed["source"] == "predicted") & (seed["metric"] == metric)]
        if len(p):
            p = p.assign(x=p["value"].map(x)).sort_values("x")
            ax.plot(p["x"], p["result"], label=lab, **style)
    dev = _first(seed, "device", "the seed's device")
    model = _first(seed, "model")
    ax.set_title(mpl_text(f"{model} on {dev}"), fontsize=10)
    _stage_axis(ax, stages)
    _dedupe_legend(ax, loc="upper left")
    ax = axes[0][1]
    tg = here[here["metric"] == "tg_tps"]
    if not len(tg):
        why = df.attrs.get("why_not_measured") or "nothing measured in this run"
        _empty(ax, mpl_text(f"not measured here: {why}"))
    else:
        for source, g in tg.groupby("source", sort=False):
            g = _with_spread(g.assign(x=g["value"].map(x)))
            g = g.set_index("x").reindex(range(len(stages))).reset_index()   # a refused stage leaves a gap
            yerr = g["sd"].fillna(0) if source == "measured" and (g["sd"] > 0).any() else None
            ax.errorbar(g["x"], g["result"], yerr=yerr, fmt=SOURCE_LINES[source], marker=SOURCE_MARKERS[source],
                        color=SOURCE_COLORS[source], capsize=3 if yerr is not None else 0, elinewidth=1,
                        label=f"{source} here" + (" (± sd)" if yerr is not None else ""))
        c = here[here["metric"] == "physical_ceiling_tg_tps"]
        if len(c):
            c = c.assign(x=c["value"].map(x)).sort_values("x")
            ax.plot(c["x"], c["result"], ":", color="#999", marker="_", markersize=18, label=f"physical ceiling{at} here")
        above = tg[tg["above_ceiling"].fillna(False).astype(bool) & (tg["source"] == "measured")]
        _mark_above(ax, [x[v] for v in above["value"]], above["result"], seen)
        ax.set_title(mpl_text(f"{tg['model'].iloc[0]} on this machine"), fontsize=10)
        _stage_axis(ax, stages)
        fails = df.attrs.get("failures") or []
        for f in fails:
            if f.get("value") in x:
                ax.annotate("refused by llama.cpp", (x[f["value"]], 0), xytext=(0, 12), textcoords="offset points",
                            ha="center", fontsize=7, color="#c0001a", rotation=90)
        _dedupe_legend(ax, loc="upper left")
    _suptitle(fig, "The seed's staircase: claimed vs predicted (its V100) vs measured (this machine)", df)
    return fig


def _stage_axis(ax, stages):
    ax.set_xticks(list(range(len(stages))))
    ax.set_xticklabels([mpl_text(s) for s in stages], rotation=30, ha="right", fontsize=8)
    ax.set_xlabel("stage")
    ax.set_ylabel("decode speed (tok/s)")
    ax.set_ylim(bottom=0)


# ------------------------------------------------------------------------------------------------
# 01: memory
# ------------------------------------------------------------------------------------------------

def _bytes_unit(max_bytes: float) -> tuple[float, str]:
    return (2**30, "GiB") if max_bytes >= 2**30 else (2**20, "MiB")


def memory_breakdown(df):
    """Stacked bars: bytes per component on each device, predicted (and measured from llama.cpp's log),
    one panel per group (scenario model on its device; the measured model on this machine); the device's
    capacity as a vertical line when it is an accelerator. Components stack in the order the frame lists
    them; ``group`` says which rows share a panel."""
    d = df[(df["lever"] == "component") & (df["metric"] == "bytes")]
    groups = list(dict.fromkeys(d["group"]))
    fig, axes = _figure(ncols=max(1, len(groups)), width=6.6, height=3.6)
    comps = list(dict.fromkeys(d["value"]))
    palette = ["#1b6fb5", "#e6a01a", "#7a49a5", "#4daf4a", "#a6761d", "#999999"]
    for ax, group in zip(axes[0], groups):
        g = d[d["group"] == group]
        bars = list(dict.fromkeys(zip(g["source"], g["device"])))
        scale, unit = _bytes_unit(g.groupby(["source", "device"])["result"].sum().max())
        for i, (source, dev) in enumerate(bars):
            left = 0.0
            sub = g[(g["source"] == source) & (g["device"] == dev)].set_index("value")["result"]
            for comp, color in zip(comps, palette):
                v = float(sub.get(comp, 0.0)) / scale
                if v <= 0:
                    continue
                ax.barh(i, v, left=left, color=color, edgecolor="white", hatch="//" if source == "measured" else None,
                        label=comp)
                left += v
            ax.text(left, i, f" {left:.2f} {unit}", va="center", fontsize=8)
        cap = df[(df["group"] == group) & (df["metric"] == "capacity_bytes") & (df["device"] != "host")]
        for dev, c in cap.groupby("device")["result"].max().items():
            ax.axvline(c / scale, color="#c0001a", linestyle="--", linewidth=1,
                       label=mpl_text(f"{dev} memory ({c / 2**30:.0f} GiB)"))
        ax.set_yticks(list(range(len(bars))))
        ax.set_yticklabels([mpl_text(f"{s} · {'this machine' if dv == 'host' else dv}") for s, dv in bars], fontsize=8)
        ax.set_xlabel(f"memory ({unit})")
        ax.set_title(mpl_text(group), fontsize=10)
        ax.set_xlim(right=ax.get_xlim()[1] * 1.15)
        _dedupe_legend(ax, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4)
    _suptitle(fig, "Where the memory goes: weights, KV cache, compute and output buffers (hatched: measured)", df)
    return fig


def fit_heatmap(grid):
    """The VRAM triangle: per model and device (one row of panels each: the scenario's, and the GPU beside
    this machine when there is one), one heatmap per cache type, quants × context sizes, coloured by the
    margin left on the device (GiB; red: does not fit), annotated with the margin."""
    import numpy as np  # heavy third-party dependency
    import seaborn as sns  # heavy third-party dependency (plotting)

    g = grid[(grid["lever"] == "n_ctx") & (grid["metric"] == "margin_bytes")].copy()
    g["cache type"] = g["cache_type"]
    types = list(dict.fromkeys(g["cache type"]))
    groups = list(dict.fromkeys(zip(g["model"], g["device"])))
    n_q = max([3] + [g[(g["model"] == m) & (g["device"] == d)]["quant"].nunique() for m, d in groups])
    fig, axes = _figure(ncols=max(1, len(types)), nrows=max(1, len(groups)), width=4.6, height=0.5 * n_q + 1.4)
    if not len(g):
        _empty(axes[0][0], "no configuration to show")
        return fig
    names = grid.attrs.get("device_names") or {}
    for row, (model, dev) in enumerate(groups):
        sub = g[(g["model"] == model) & (g["device"] == dev)]
        lim = max(1e-9, float(np.nanmax(np.abs(sub["result"]))) / 2**30)   # each device on its own scale
        for i, (ax, ct) in enumerate(zip(axes[row], types)):
            t = sub[sub["cache type"] == ct]
            wide = t.pivot_table(index="quant", columns="value", values="result", aggfunc="max") / 2**30
            wide = wide[_order(list(wide.columns))].reindex(list(dict.fromkeys(t["quant"])))
            sns.heatmap(wide, ax=ax, cmap="RdYlGn", center=0, vmin=-lim, vmax=lim, annot=True, fmt=".2f",
                        cbar=i == len(types) - 1, cbar_kws={"label": "margin left (GiB)"},
                        annot_kws={"fontsize": 8}, linewidths=0.5, linecolor="white")
            n_red = int((wide < 0).sum().sum())
            ax.set_title(mpl_text(f"KV cache {ct}: " + (f"{n_red} of {wide.size} do not fit" if n_red
                                                         else "everything fits")), fontsize=9)
            ax.set_xlabel("context size -c (tokens)")
            where = "this machine (RAM)" if dev == "host" else names.get(dev, dev)
            ax.set_ylabel(mpl_text(f"{textwrap.shorten(model, 40)}\non {textwrap.shorten(where, 34)}\n\nquantization")
                          if i == 0 else "", fontsize=9)
    _suptitle(fig, "What fits: margin left on the device in GiB (red, negative: does not fit)", grid)
    return fig


# ------------------------------------------------------------------------------------------------
# 02: ceilings
# ------------------------------------------------------------------------------------------------

def ceilings(df):
    """Per quant, one panel per model: the seed's ceiling, the physical ceiling, the predicted decode speed,
    and the seed's own table where it claims one."""
    d = df[df["lever"] == "quant"]
    models = list(dict.fromkeys(d["model"]))
    fig, axes = _figure(ncols=max(1, len(models)), width=6.2, height=4.2)
    series = (("weights_ceiling_tg_tps", "predicted", "bandwidth ceiling (bandwidth / weights)", "#9ecae1"),
              ("physical_ceiling_tg_tps", "predicted", "physical ceiling (bytes per token)", "#4292c6"),
              ("tg_tps", "predicted", "predicted decode (what fits on the device)", "#08306b"),
              ("weights_ceiling_tg_tps", "claimed", "the seed's table (claimed ceiling)", "#6a6a6a"))
    seen: set = set()
    for ax, model in zip(axes[0], models):
        m = d[d["model"] == model]
        qs = list(dict.fromkeys(m["value"]))
        width = 0.8 / len(series)
        for k, (metric, source, label, color) in enumerate(series):
            s = m[(m["metric"] == metric) & (m["source"] == source)].groupby("value")["result"].mean()
            xs = [i + (k - 1.5) * width for i, q in enumerate(qs) if q in s.index]
            if xs:
                ax.bar(xs, [s[q] for q in qs if q in s.index], width=width, color=color, label=label)
        cl = m[(m["source"] == "claimed") & m["above_ceiling"].fillna(False).astype(bool)]
        _mark_above(ax, [qs.index(v) + 1.5 * width for v in cl["value"]], cl["result"], seen)
        ax.set_xticks(list(range(len(qs))))
        ax.set_xticklabels([mpl_text(q) for q in qs])
        ax.set_xlabel("quantization")
        ax.set_ylabel("decode speed (tok/s)")
        dev = m["device"].iloc[0]
        ax.set_title(mpl_text(f"{model} on {'this machine' if dev == 'host' else dev}"), fontsize=10)
        _dedupe_legend(ax, loc="upper left")
    _suptitle(fig, "The bandwidth ceiling per quant: tok/s ≤ bandwidth / bytes read per token", df)
    return fig


def catalog(df):
    """Every device: the seed's ceiling and the predicted decode speed of the model (orange: the model does
    not fit, the prediction spills layers to a CPU), and the per-token overhead limit (a black tick: 1 / the
    fixed time a token costs whatever its bytes) — where the prediction sits on that tick, bandwidth no longer
    matters."""
    d = df[df["lever"] == "device"]
    pred = d[(d["metric"] == "tg_tps") & (d["source"] == "predicted")].set_index("value")
    ceil = d[d["metric"] == "weights_ceiling_tg_tps"].groupby("value")["result"].max()
    floor = d[d["metric"] == "overhead_floor_tg_tps"].groupby("value")["result"].max()
    devs = list(pred.sort_values("result").index)
    fig, axes = _figure(width=8.0, height=0.32 * max(6, len(devs)) + 1.8)
    ax = axes[0][0]
    ys = list(range(len(devs)))
    ax.barh(ys, [ceil.get(dv, float("nan")) for dv in devs], color="#c6dbef", label="bandwidth ceiling "
            "(bandwidth / weights)")
    fits = [pred.loc[dv, "fits"] in (None, True) for dv in devs]   # None: not judged, drawn as fitting
    ax.barh(ys, list(pred.loc[devs, "result"]), height=0.5, color=["#1b6fb5" if f else "#e6a01a" for f in fits],
            hatch=None, label="predicted decode (fits)")
    if not all(fits):
        ax.barh([], [], color="#e6a01a", label="predicted decode (does not fit: layers spill to the CPU)")
    if len(floor):
        ax.scatter([floor.get(dv, float("nan")) for dv in devs], ys, marker="|", s=160, color="#111", zorder=5,
                   label="per-token overhead limit (1 / fixed time per token)")
    ax.set_yticks(ys)
    ax.set_yticklabels([mpl_text(dv) for dv in devs], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("decode speed (tok/s, log scale)")
    model, quant = _first(d, "model"), _first(d, "quant")
    ax.set_title(mpl_text(f"{model} {quant} across the catalog"), fontsize=10)
    _dedupe_legend(ax, loc="lower right")
    _suptitle(fig, "The same model on every device: ceiling, prediction and the overhead limit", df)
    return fig


def roofline(df):
    """This machine: per quant, the plain bandwidth ceiling, the calibrated prediction (its bound in the
    label) and the measured decode speed of the model that runs here."""
    d = df[(df["lever"] == "quant") & (df["unit"] == "tok/s")]
    calibrated = df.attrs.get("calibrated")
    note = "" if calibrated is None else ("calibrated with `v100lab calibrate`" if calibrated else
                                          "host NOT calibrated: run `v100lab calibrate` for a real roofline")
    fig = sweep(d, "This machine's roofline: bandwidth ceiling vs calibrated prediction vs measured",
                metrics=("tg_tps",), note=note)
    ax = fig.axes[0]
    c = d[d["metric"] == "weights_ceiling_tg_tps"]
    order = _order(d["value"].tolist())
    if len(c):
        s = c.groupby("value")["result"].max().reindex(order)
        ax.plot(range(len(order)), s.values, "-", color="#9ecae1", linewidth=2,
                label=f"bandwidth ceiling ({df.attrs.get('host_bandwidth_gbs', 0):g} GB/s / weights)")
        _dedupe_legend(ax)
    return fig


def apple(df):
    """Published Apple Silicon rows (x) against the prediction for the same chip (y), tg and pp, log-log,
    with the line of perfect agreement and ±15 %."""
    import numpy as np  # heavy third-party dependency

    fig, axes = _figure(ncols=2, width=5.0, height=4.6)
    seen: set = set()
    for ax, metric in zip(axes[0], ("tg_tps", "pp_tps")):
        m = df[df["metric"] == metric]
        pre = m[m["source"] == "predicted"].set_index(["value", "quant"])["result"]
        j = compare(m, ("value", "quant"), require=("claimed", "predicted")).rename(columns={"claimed": "published"})
        if not len(j):
            _empty(ax, "no rows")
            continue
        for q, g in j.groupby("quant"):
            ax.scatter(g["published"], g["predicted"], label=mpl_text(q), s=28, alpha=0.85)
        lo, hi = float(j[["published", "predicted"]].min().min()) * 0.8, float(j[["published", "predicted"]].max().max()) * 1.2
        xs = np.array([lo, hi])
        ax.plot(xs, xs, "-", color="#444", linewidth=1, label="predicted = published")
        ax.fill_between(xs, xs * 0.85, xs * 1.15, color="#999", alpha=0.15, label="±15 %")
        above = m[(m["source"] == "claimed") & m["above_ceiling"].fillna(False).astype(bool)]
        if len(above):
            a = above.set_index(["value", "quant"])["result"].to_frame("published").join(
                pre.to_frame("predicted"), how="inner")
            _mark_above(ax, a["published"], a["predicted"], seen)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"published {METRIC_LABELS[metric]}")
        ax.set_ylabel(f"predicted {METRIC_LABELS[metric]}")
        ax.set_title(f"{'tg128' if metric == 'tg_tps' else 'pp512'} · Llama 2 7B", fontsize=10)
        _dedupe_legend(ax, loc="upper left")
    _suptitle(fig, "Published llama.cpp rows on Apple Silicon vs the speed model (fit leaves each chip out)", df)
    return fig


# ------------------------------------------------------------------------------------------------
# 04: quant ladder and quality
# ------------------------------------------------------------------------------------------------

def quant_ladder(df):
    """Decode, prompt processing and file size per quant: measured (the ladder built here) vs predicted."""
    fig = sweep(df[df["unit"] == "tok/s"], "The quant ladder: speed measured vs predicted", lever="quant")
    return fig


def file_sizes(df):
    """File size per quant: the file llama.cpp's quantizer wrote here vs the size predicted from the
    architecture and llama-quantize's per-tensor types."""
    d = df[(df["metric"] == "file_bytes")]
    fig, axes = _figure(width=7.0, height=3.8)
    ax = axes[0][0]
    if not len(d):
        _empty(ax, "no file sizes in this run")
        return fig
    scale, unit = _bytes_unit(float(d["result"].max()))
    groups = list(dict.fromkeys(zip(d["source"], d["model"], d["device"])))
    qs = _order(d["value"].tolist())
    qs = list(dict.fromkeys(d["value"]))
    width = 0.8 / len(groups)
    many = len({(m, dv) for _, m, dv in groups}) > 1
    for k, (source, model, dev) in enumerate(groups):
        s = d[(d["source"] == source) & (d["model"] == model) & (d["device"] == dev)].set_index("value")["result"]
        xs = [i + (k - (len(groups) - 1) / 2) * width for i, q in enumerate(qs) if q in s.index]
        ax.bar(xs, [s[q] / scale for q in qs if q in s.index], width=width, color=SOURCE_COLORS[source],
               alpha=0.55 + 0.4 * (k % 2), hatch="//" if source == "measured" else None,
               label=_series_label(source, model, dev, many))
    ax.set_xticks(list(range(len(qs))))
    ax.set_xticklabels([mpl_text(q) for q in qs])
    ax.set_xlabel("quantization")
    ax.set_ylabel(f"file size ({unit})")
    _dedupe_legend(ax)
    _suptitle(fig, "File size per quant: written by llama.cpp's quantizer vs predicted", df)
    return fig


def quality(df):
    """Perplexity per quant (the F16 reference as a line) and KL divergence from the reference."""
    fig, axes = _figure(ncols=2, width=5.4, height=4.0)
    if not len(df):
        why = df.attrs.get("why_not_measured") or "nothing measured"
        _empty(axes[0][0], mpl_text(f"not measured: {why}"))
        _empty(axes[0][1], "")
        return fig
    ppl = df[df["metric"] == "perplexity"]
    ref = ppl[ppl["value"] == "F16"]
    q = ppl[ppl["value"] != "F16"]
    ax = axes[0][0]
    ax.bar(range(len(q)), q["result"], color=SOURCE_COLORS["measured"], label="measured perplexity")
    if len(ref):
        ax.axhline(float(ref["result"].iloc[0]), color="#444", linestyle="--",
                   label=f"F16 reference ({float(ref['result'].iloc[0]):.2f})")
    ax.set_xticks(range(len(q)))
    ax.set_xticklabels([mpl_text(v) for v in q["value"]])
    ax.set_xlabel("quantization")
    ax.set_ylabel("perplexity (lower is better)")
    lo = float(ppl["result"].min()) if len(ppl) else 0
    ax.set_ylim(bottom=lo * 0.95)
    _dedupe_legend(ax)
    ax = axes[0][1]
    k = df[df["metric"] == "kl_divergence"]
    ax.bar(range(len(k)), k["result"], color="#7a49a5", label="KL divergence from F16")
    ax.set_xticks(range(len(k)))
    ax.set_xticklabels([mpl_text(v) for v in k["value"]])
    ax.set_xlabel("quantization")
    ax.set_ylabel("mean KL divergence (nats per token)")
    _dedupe_legend(ax)
    model = df["model"].iloc[0]
    corpus = df.attrs.get("corpus", "")
    _suptitle(fig, f"Quality per quant, measured: {model}", df, f"scored on {corpus}")
    return fig


# ------------------------------------------------------------------------------------------------
# 05, 06, 07
# ------------------------------------------------------------------------------------------------

def gpu_layers(df):
    """Predicted decode and prompt speed against -ngl; the values that do not fit are shaded."""
    fig = sweep(df, "-ngl: decode and prompt speed against the layers offloaded", lever="n_gpu_layers")
    fits = df[(df["metric"] == "fits") & (df["lever"] == "n_gpu_layers")]
    if len(fits) and _numeric(fits["value"]):
        bad = [float(v) for v, f in zip(fits["value"], fits["result"]) if f < 0.5]
        for ax in fig.axes:
            if bad:
                ax.axvspan(min(bad) - 0.5, max(bad) + 0.5, color="#c0001a", alpha=0.08,
                           label="does not fit on the device")
                _dedupe_legend(ax)
    return fig


def _np_axis(ax, order: Sequence[str]) -> None:
    ax.set_xlabel(LEVER_LABELS["n_parallel"])
    ax.set_xticks([float(v) for v in order])
    ax.set_xticklabels(order)


def _not_measured_note(df) -> str:
    why = df.attrs.get("why_not_measured") or ""
    return "" if (df["source"] == "measured").any() or not why else f"not measured here: {why}"


def parallel(df):
    """--parallel with every slot busy (concurrency = -np): decode of all streams together (left) and of each
    stream (right) against the slot count — measured through llama-server where it ran (± sd over the
    requests), the serving model's prediction, and the bandwidth ceiling of N slots (weights read once per step
    for all of them: the total's ceiling rises, each stream's falls)."""
    d = df[(df["lever"] == "n_parallel") & (df["unit"] == "tok/s")]
    fig, axes = _figure(ncols=2)
    order = _order(d["value"].tolist())
    x = {v: float(v) for v in order}
    depth = df.attrs.get("depth")
    at = f" at depth {depth}" if depth is not None else ""
    for ax, metric, title in ((axes[0][0], "tg_tps", "decode, all streams together (tok/s)"),
                              (axes[0][1], "tg_tps_per_stream", "decode per stream (tok/s)")):
        c = d[(d["metric"] == f"physical_ceiling_{metric}")]
        if len(c):
            c = c.assign(x=c["value"].map(x)).groupby("x", as_index=False)["result"].max()
            ax.plot(c["x"], c["result"], ":", marker="_", markersize=14, color="#777",
                    label=f"bandwidth ceiling of N slots{at}")
        _serving_series(ax, d, metric, lambda v: v.map(x))
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("tokens per second (tok/s)")
        _np_axis(ax, order)
        tops = d[d["metric"].str.endswith(metric)]["result"]
        ax.set_ylim(bottom=0, top=max(1.0, float(tops.max()) if len(tops) else 1.0) * 1.12)
        _dedupe_legend(ax, loc="lower right")
    _suptitle(fig, "--parallel, every slot busy (concurrency = -np): all streams together and each stream", df,
              _not_measured_note(df))
    return fig


LATENCY_PANELS = (("ttft", "time to first token, TTFT (ms)"), ("tpot", "time per output token, TPOT (ms)"),
                  ("itl", "inter-token latency, ITL (ms)"))
GROUP_COLORS = ("#d95f02", "#7a49a5", "#1b9e77", "#a6761d")


def parallel_latency(df):
    """TTFT, TPOT and ITL against -np, one panel each: for one user (concurrency 1) and with every slot busy,
    the measured median (line), p90 and p99 (the band reaches p99, a tick marks p90), and the serving model's
    median (dashed)."""
    d = df[(df["lever"] == "n_parallel") & (df["unit"] == "ms")]
    fig, axes = _figure(ncols=3, width=4.6, height=3.9)
    order = _order(d["value"].tolist())
    groups = sorted(set(d["group"]), key=lambda g: (g != "concurrency 1", g))
    busy = "every slot busy (concurrency = -np)"
    for ax, (m, title) in zip(axes[0], LATENCY_PANELS):
        for i, grp in enumerate(["concurrency 1", "busy"] if groups else []):
            sel = d[d["group"] == "concurrency 1"] if grp == "concurrency 1" else \
                d[(d["group"] == d["value"].map(lambda v: f"concurrency {v}")) & (d["value"] != "1")]
            name = "one user" if grp == "concurrency 1" else busy
            color = GROUP_COLORS[i]
            meas = sel[sel["source"] == "measured"]
            med = meas[meas["metric"] == f"{m}_ms_median"].assign(x=lambda t: t["value"].astype(float)).sort_values("x")
            if len(med):
                hi = meas[meas["metric"] == f"{m}_ms_p99"].set_index("value")["result"]
                p90 = meas[meas["metric"] == f"{m}_ms_p90"].set_index("value")["result"]
                ax.plot(med["x"], med["result"], "-", marker="s", color=color, label=f"{name}: measured median")
                ax.fill_between(med["x"], med["result"], [hi.get(v, r) for v, r in zip(med["value"], med["result"])],
                                color=color, alpha=0.15, label=f"{name}: median to p99")
                ax.scatter(med["x"], [p90.get(v, float("nan")) for v in med["value"]], marker="_", s=120,
                           color=color, label=f"{name}: p90")
            pred = sel[(sel["source"] == "predicted") & (sel["metric"] == f"{m}_ms_median")]
            if len(pred):
                pred = pred.assign(x=pred["value"].astype(float)).groupby("x", as_index=False)["result"].mean()
                ax.plot(pred["x"], pred["result"], "--", marker="o", markerfacecolor="none", color=color,
                        label=f"{name}: predicted median")
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("milliseconds")
        if order:
            _np_axis(ax, order)
        ax.set_ylim(bottom=0)
    handles, labels = axes[0][0].get_legend_handles_labels()
    keep = dict(zip(labels, handles))
    if keep:      # one legend for the three panels, under them
        fig.legend(keep.values(), keep.keys(), loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    _suptitle(fig, "--parallel: latency percentiles for one user and with every slot busy (vLLM's definitions)", df,
              _not_measured_note(df))
    return fig


def one_user(df):
    """The seed's "use 1 slot for one user": one user's decode speed against -np (left: measured ± sd and
    predicted) and the same as a ratio to -np 1 (right), with the seed's claim drawn as the bound it puts the
    ratio under (below the line at the slot count it names)."""
    d = df[df["lever"] == "n_parallel"]
    fig, axes = _figure(ncols=2, width=5.6, height=4.0)
    order = _order(d["value"].tolist())
    claim = df.attrs.get("claim") or {}
    ratio_metric = claim.get("metric", "one_user_tg_ratio")
    for ax, metric, ylabel in ((axes[0][0], "tg_tps_per_stream", "one user's decode (tok/s)"),
                               (axes[0][1], ratio_metric, "÷ one user's decode at -np 1")):
        _serving_series(ax, d, metric, lambda v: v.astype(float))
        cl = d[(d["metric"] == metric) & (d["source"] == "claimed")]
        for v, r in zip(cl["value"].astype(float), cl["result"]):
            ax.annotate("", xy=(v, r * 0.9), xytext=(v, r), arrowprops=dict(arrowstyle="->", color=SOURCE_COLORS["claimed"],
                                                                            lw=2))
            ax.scatter([v], [r], marker=SOURCE_MARKERS["claimed"], s=60, color=SOURCE_COLORS["claimed"],
                       label=mpl_text(f"the seed: below {r:g} at -np {v:g}"))
        if metric == ratio_metric:
            ax.axhline(1.0, color="#999", lw=0.8)
        ax.set_ylabel(ylabel)
        if order:
            _np_axis(ax, order)
        ax.set_ylim(bottom=0)
        _dedupe_legend(ax, loc="lower left")
    advice = claim.get("advice", "")
    _suptitle(fig, "One user (concurrency 1) against -np: the seed's advice tested", df,
              "; ".join(x for x in (f"the seed: '{advice}'" if advice else "", _not_measured_note(df)) if x))
    return fig


def slot_context(df):
    """What -np does to each slot: the context one slot gets (left; -c split across the slots, or one
    unified stream) and the KV cache + recurrent state and the whole memory plan (right, MiB) — predicted,
    and measured from llama-server's log where it ran."""
    d = df[df["lever"] == "n_parallel"]
    fig, axes = _figure(ncols=2, width=5.6, height=4.0)
    order = _order(d["value"].tolist())
    styles = {"split": "#1b6fb5", "--kv-unified": "#e6a01a"}
    for ax, metrics, ylabel in ((axes[0][0], ("n_ctx_seq",), "context per slot (tokens)"),
                                (axes[0][1], ("kv_cache_bytes", "memory_bytes"), "MiB")):
        for metric in metrics:
            for grp, color in styles.items():
                for source in ("predicted", "measured"):
                    g = d[(d["metric"] == metric) & (d["group"] == grp) & (d["source"] == source)]
                    if not len(g):
                        continue
                    g = g.assign(x=g["value"].astype(float)).groupby("x", as_index=False)["result"].mean()
                    y = g["result"] / (2**20 if metric.endswith("_bytes") else 1)
                    what = {"n_ctx_seq": "", "kv_cache_bytes": "KV + state, ", "memory_bytes": "all memory, "}[metric]
                    hollow = dict(markerfacecolor="none", markersize=10) if source == "predicted" else {}
                    ax.plot(g["x"], y, (":" if metric == "memory_bytes" else SOURCE_LINES[source]),
                            marker=SOURCE_MARKERS[source], color=color,
                            label=mpl_text(f"{what}{grp}, {source}" + (" (llama-server's log)" if source == "measured"
                                                                     else "")), **hollow)
        ax.set_ylabel(ylabel)
        if order:
            _np_axis(ax, order)
        ax.set_ylim(bottom=0)
        _dedupe_legend(ax, fontsize=7)
    axes[0][0].set_title("llama-server splits -c across the slots unless --kv-unified", fontsize=10)
    axes[0][1].set_title("KV cache + recurrent state, and the whole memory plan", fontsize=10)
    _suptitle(fig, "--parallel: context and memory per slot count", df, _not_measured_note(df))
    return fig


def spill(df):
    """Per context size: the decode speed with the layers that fit, and with every layer on the device;
    the number of layer slots that spill to the CPU written on each bar."""
    d = df[df["lever"] == "n_ctx"]
    ctx = _order(d["value"].tolist())
    fig, axes = _figure(width=7.0, height=4.2)
    ax = axes[0][0]
    fit = d[d["metric"] == "tg_tps"].set_index("value")["result"]
    allg = d[d["metric"] == "tg_tps_all_layers"].set_index("value")["result"]
    sp = d[d["metric"] == "layers_spilled"].set_index("value")["result"]
    xs = list(range(len(ctx)))
    ax.bar([x - 0.2 for x in xs], [allg.get(c, float("nan")) for c in ctx], width=0.4, color="#c6dbef",
           label="predicted, every layer on the device (if it fit)")
    ax.bar([x + 0.2 for x in xs], [fit.get(c, float("nan")) for c in ctx], width=0.4,
           color=SOURCE_COLORS["predicted"], label="predicted, layers that fit (the rest on the CPU)")
    for x, c in zip(xs, ctx):
        n = int(sp.get(c, 0))
        ax.annotate(f"{n} spilled", (x + 0.2, fit.get(c, 0)), xytext=(0, 3), textcoords="offset points",
                    ha="center", fontsize=8)
    ax.set_xticks(xs)
    ax.set_xticklabels(ctx)
    ax.set_xlabel("context size -c (tokens), -ngl 999")
    ax.set_ylabel("decode speed (tok/s)")
    dev, model = _first(d, "device"), _first(d, "model")
    ax.set_title(mpl_text(f"{model} on {dev}"), fontsize=10)
    _dedupe_legend(ax, loc="upper right")
    fig.suptitle("The spill effect: a larger context pushes layers off the GPU", fontsize=12)
    return fig


def kv_memory(df):
    """KV cache (+ recurrent state) size against context size, one line per cache type and source, one
    panel per model."""
    d = df[df["metric"] == "kv_cache_bytes"].copy()
    d["cache type"] = d["cache_type"]
    groups = list(dict.fromkeys(zip(d["model"], d["device"])))
    fig, axes = _figure(ncols=max(1, len(groups)), width=5.6, height=4.0)
    palette = ["#1b6fb5", "#e6a01a", "#4daf4a", "#7a49a5", "#a6761d"]
    for ax, (model, dev) in zip(axes[0], groups):
        g = d[(d["model"] == model) & (d["device"] == dev)]
        scale, unit = _bytes_unit(float(g["result"].max()))
        for (ct, source), s in g.groupby(["cache type", "source"], sort=False):
            color = palette[list(dict.fromkeys(d["cache type"])).index(ct) % len(palette)]
            s = s.assign(x=s["value"].astype(float)).sort_values("x")
            hollow = dict(markerfacecolor="none", markersize=11, markeredgewidth=1.5) if source == "predicted" else {}
            ax.plot(s["x"], s["result"] / scale, SOURCE_LINES[source], marker=SOURCE_MARKERS[source], color=color,
                    label=mpl_text(f"{ct}, {source}"), **hollow)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context size -c (tokens)")
        ax.set_ylabel(f"KV cache + recurrent state ({unit})")
        ax.set_title(mpl_text(f"{model} @ {'this machine' if dev == 'host' else dev}"), fontsize=10)
        _dedupe_legend(ax)
    _suptitle(fig, "KV cache memory: context × cache type, measured (llama.cpp's log) vs predicted", df)
    return fig


def load_times(df):
    """Load time and time to the first token per load mode (measured; the speed model has no load term)."""
    d = df[df["unit"] == "s"]
    fig, axes = _figure(ncols=2, width=4.8, height=3.6)
    if not len(d):
        why = df.attrs.get("why_not_measured") or "nothing measured"
        _empty(axes[0][0], mpl_text(f"not measured: {why}"))
        _empty(axes[0][1], "")
        return fig
    import seaborn as sns  # heavy third-party dependency (plotting)

    for ax, metric, label in ((axes[0][0], "load_s", "load model + create context (s)"),
                              (axes[0][1], "first_token_s", "prompt + first token after loading (s)")):
        m = d[d["metric"] == metric]
        sns.barplot(data=m, x="value", y="result", ax=ax, color=SOURCE_COLORS["measured"], errorbar=("ci", 95)
                    if m.groupby("value").size().max() > 1 else None)
        ax.set_xlabel("how the model is loaded")
        ax.set_ylabel(label)
    _suptitle(fig, "mmap vs --no-mmap vs --mlock: measured here (no prediction: loading is not modelled)", df,
              fontsize=11)
    return fig


def speculative(df):
    """Speculative decoding over the draft length, one panel per prompt (``group``): decode tok/s measured
    (± sd) and predicted from the measured acceptance, and the measured acceptance on a second axis."""
    d = df[df["lever"] == "draft_max"]
    groups = list(dict.fromkeys(d["group"])) or [""]
    fig, axes = _figure(ncols=len(groups), width=5.6, height=4.2)
    for ax, name in zip(axes[0], groups):
        g = d[d["group"] == name]
        if not len(g):
            _empty(ax, _not_measured_note(df) or "nothing measured in this run")
            continue
        for source, what in (("measured", "measured (llama-server)"), ("predicted", "predicted from measured α")):
            s = g[(g["metric"] == "tg_tps") & (g["source"] == source)]
            if not len(s):
                continue
            agg = _with_spread(s.assign(x=s["value"].astype(float)))
            yerr = agg["sd"] if source == "measured" and (agg["sd"] > 0).any() else None
            ax.errorbar(agg["x"], agg["result"], yerr=yerr, fmt=SOURCE_LINES[source], marker=SOURCE_MARKERS[source],
                        color=SOURCE_COLORS[source], capsize=3 if yerr is not None else 0, label=what)
        acc = g[g["metric"] == "acceptance"]
        if len(acc):
            ax2 = ax.twinx()
            a = acc.assign(x=acc["value"].astype(float)).sort_values("x")
            ax2.bar(a["x"], a["result"], width=0.35, color="#999", alpha=0.35, label="acceptance (accepted ÷ drafted)")
            ax2.set_ylim(0, 1.05)
            ax2.set_ylabel("accepted ÷ drafted")
            ax2.grid(False)
            ax2.legend(loc="lower right", fontsize=8)
        ax.set_xlabel("draft length (0 = no speculation)")
        ax.set_ylabel(METRIC_LABELS["tg_tps"])
        ax.set_ylim(bottom=0)
        ax.set_title(mpl_text(f"{name} prompt"))
        _dedupe_legend(ax, loc="lower left", fontsize=8)
    _suptitle(fig, "n-gram self-speculation: decode speed and acceptance over the draft length", df,
              _not_measured_note(df))
    return fig


def speculative_what_if(df):
    """Predicted decode tok/s over the draft length for a few acceptances α (``group``), best length marked."""
    fig, axes = _figure(width=6.4, height=4.2)
    ax = axes[0][0]
    for name, g in df.groupby("group", sort=False):
        g = g.assign(x=g["value"].astype(float)).sort_values("x")
        line = ax.plot(g["x"], g["result"], marker="o", label=mpl_text(name))[0]
        best = g.loc[g["result"].idxmax()]
        ax.scatter([best["x"]], [best["result"]], s=120, facecolors="none", edgecolors=line.get_color(), zorder=5)
    ax.set_xlabel("draft length (0 = no speculation)")
    ax.set_ylabel("predicted decode, tok/s")
    ax.set_ylim(bottom=0)
    ax.legend(title="per-token acceptance", fontsize=8)
    _suptitle(fig, "Predicted: where a longer draft stops paying (circled: the best length)", df)
    return fig


def machine_during_run(df):
    """The machine watched while the frame's tests ran (``df.attrs["monitor_series"]``: (test, samples) pairs, one
    sample a second), the tests one after another: with an NVIDIA GPU its memory used, utilisation and power per
    card (the seed's ``nvidia-smi -l 1``); without one, llama.cpp's process memory and CPU use."""
    series = df.attrs.get("monitor_series") or []
    gpu = any(s.get("gpus") for _, samples in series for s in samples)
    panels = ((("mem_used_bytes", "GPU memory used (MiB)", 2**20), ("util_pct", "GPU utilisation (%)", 1),
               ("power_w", "GPU power (W)", 1)) if gpu else
              (("rss_bytes", "llama.cpp's resident memory (MiB)", 2**20),
               ("cpu_pct", "llama.cpp's CPU use (%, 100 = one core)", 1)))
    fig, axes = _figure(ncols=len(panels), width=4.2, height=3.2)
    if not series:
        why = df.attrs.get("why_not_measured") or "nothing was measured, so nothing was watched"
        for i, ax in enumerate(axes[0]):
            _empty(ax, mpl_text(f"not watched: {why}") if i == 0 else "")
        return fig
    for ax, (key, label, scale) in zip(axes[0], panels):
        offset, bounds = 0.0, []
        for test, samples in series:
            if gpu:
                n = max(len(s.get("gpus") or ()) for s in samples)
                for i in range(n):
                    pts = [(offset + s["t"], s["gpus"][i][key] / scale) for s in samples
                           if len(s.get("gpus") or ()) > i and s["gpus"][i].get(key) is not None]
                    if pts:
                        ax.plot(*zip(*pts), marker=".", color=SOURCE_COLORS["measured"], label=f"GPU {i}")
            else:
                pts = [(offset + s["t"], s[key] / scale) for s in samples[(1 if key == "cpu_pct" else 0):]
                       if s.get(key) is not None]
                if pts:
                    ax.plot(*zip(*pts), marker=".", color=SOURCE_COLORS["measured"], label="measured")
            bounds.append((offset, test))
            offset += max((s["t"] for s in samples), default=0.0) + 0.5
        for x, test in bounds:
            ax.axvline(x, color="#999", lw=0.6, ls=":")
            ax.text(x, 1.0, f" {mpl_text(test)}", transform=ax.get_xaxis_transform(), va="top", fontsize=8,
                    color="#555")
        ax.set_xlabel("time (s), the tests one after another")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        _dedupe_legend(ax, fontsize=8)
    what = "the GPU, as nvidia-smi -l 1 shows it" if gpu else "no NVIDIA GPU here: llama.cpp's process instead"
    _suptitle(fig, f"The machine while the baseline ran: {what}", df, fontsize=11)
    return fig


# ------------------------------------------------------------------------------------------------
# 14: the build
# ------------------------------------------------------------------------------------------------

def dequant_costs(df):
    """Per weight type, this machine: the calibrated decode cost per weight (de-quantizing and multiplying) beside
    the time the weight's bytes take at the bandwidth; a repacked type's bar is hatched. Without a calibration,
    the bandwidth side alone and why."""
    fig, axes = _figure(width=8.0, height=4.2)
    ax = axes[0][0]
    d = df[df["lever"] == "weight_type"]
    if not len(d):
        _empty(ax, "no rows")
        return fig
    types = list(dict.fromkeys(d["value"]))
    comp = d[d["metric"] == "compute_ps_per_weight"].set_index("value")
    mem = d[d["metric"] == "memory_ps_per_weight"].set_index("value")
    xs = list(range(len(types)))
    ax.bar([x + 0.2 for x in xs], [mem["result"].get(t, float("nan")) for t in types], width=0.4, color="#bdbdbd",
           label="reading its bytes at the bandwidth")
    if len(comp):
        repacked = [str(comp["note"].get(t, "")).find("not repacked") < 0 for t in types]
        ax.bar([x - 0.2 for x in xs], [comp["result"].get(t, float("nan")) for t in types], width=0.4,
               color=SOURCE_COLORS["predicted"], hatch=None, label="de-quantizing and multiplying (calibrated)")
        ax.bar([x - 0.2 for x, r in zip(xs, repacked) if r], [comp["result"][t] for t, r in zip(types, repacked) if r],
               width=0.4, color=SOURCE_COLORS["predicted"], hatch="//", edgecolor="white",
               label="… a type this build repacks")
    else:
        _empty(ax, mpl_text(df.attrs.get("why_not_calibrated") or "not calibrated"))
        ax.bar([x + 0.2 for x in xs], [mem["result"].get(t, float("nan")) for t in types], width=0.4, color="#bdbdbd")
    ax.set_xticks(xs)
    ax.set_xticklabels([mpl_text(t) for t in types])
    ax.set_xlabel("weight type (most bits first)")
    ax.set_ylabel("decode time per weight (ps)")
    _dedupe_legend(ax, loc="upper right")
    _suptitle(fig, "Decode per weight: de-quantizing vs reading, per type", df)
    return fig


def build_speed(df):
    """Decode speed per build (a CPU-only build against the CUDA build): predicted on the scenario's card, and
    measured where this machine has a CUDA build."""
    fig, axes = _figure(width=7.0, height=3.4)
    ax = axes[0][0]
    d = df[df["metric"] == "tg_tps"] if len(df) else df
    if not len(d):
        _empty(ax, mpl_text(df.attrs.get("why_not_measured") or "no NVIDIA card in this scenario"))
        return fig
    rows = list(dict.fromkeys(zip(d["source"], d["value"])))
    ys = list(range(len(rows)))
    vals = [d[(d["source"] == s) & (d["value"] == v)]["result"].mean() for s, v in rows]
    sds = [d[(d["source"] == s) & (d["value"] == v)]["sd"].max() for s, v in rows]
    ax.barh(ys, vals, xerr=sds, color=[SOURCE_COLORS[s] for s, _ in rows], height=0.6)
    for y, (s, v), x in zip(ys, rows, vals):
        ax.text(x, y, f" {x:,.1f}", va="center", fontsize=8)
    ax.set_yticks(ys)
    ax.set_yticklabels([mpl_text(f"{v} ({s})") for s, v in rows], fontsize=8)
    ax.set_xlabel("decode speed (tok/s)")
    card = df.attrs.get("card") or ""
    ax.set_title(mpl_text(f"on {card}" if card else "this machine"), fontsize=10)
    _suptitle(fig, "What the build is worth: a CPU-only build vs the CUDA build", df)
    return fig

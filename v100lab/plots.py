"""Figures of the workbook, drawn from the one tidy table (:mod:`v100lab.results`).

Every function takes a tidy frame (or a frame from :mod:`v100lab.levers`) and returns a matplotlib
``Figure`` with a title, axis labels with units, and a legend that names the source of each series —
measured (this machine), predicted (the speed or memory model) or claimed (the seed, or published rows).
A measured or claimed tok/s figure above the ceiling of its model and device (``above_ceiling``) gets a
red ✕ marker and its own legend entry: such a point means the measurement or the model size is wrong.

Figures are built with ``matplotlib.figure.Figure`` rather than ``pyplot``: nothing is registered with
pyplot's global state, so a notebook shows each figure exactly once (as the cell's value) and a batch
run never accumulates open figures. Text that came from a model file or a parameter file passes through
:func:`v100lab.render.mpl_text` (no mathtext surprises from a ``$`` in a model name).
"""

from __future__ import annotations

from typing import Iterable, Sequence

from v100lab.render import mpl_text

SOURCE_COLORS = {"measured": "#d95f02", "predicted": "#1b6fb5", "claimed": "#6a6a6a"}
SOURCE_MARKERS = {"measured": "s", "predicted": "o", "claimed": "D"}
SOURCE_LINES = {"measured": "-", "predicted": "--", "claimed": ":"}
ABOVE_STYLE = dict(marker="X", s=140, color="#c0001a", edgecolors="white", linewidths=0.8, zorder=6)
ABOVE_LABEL = "above the bandwidth ceiling"
METRIC_LABELS = {"tg_tps": "decode (tg), tok/s", "pp_tps": "prompt processing (pp), tok/s",
                 "pg_tps": "prompt + decode, tok/s", "tg_tps_per_stream": "decode per stream, tok/s",
                 "ceiling_tg_tps": "the seed's ceiling, tok/s", "strict_ceiling_tg_tps": "strict ceiling, tok/s"}
LEVER_LABELS = {"n_gpu_layers": "-ngl (layers offloaded)", "n_ctx": "context size -c (tokens)",
                "n_depth": "tokens already in the context (depth)", "n_ubatch": "-ub physical batch (tokens)",
                "flash_attn": "-fa flash attention", "n_parallel": "-np parallel slots",
                "n_threads": "-t threads", "quant": "quantization", "stage": "stage",
                "device": "device", "config": "configuration", "load_mode": "how the model is loaded"}


def _inline_formatter() -> None:
    """Make IPython show a bare ``Figure`` as a PNG (what ``%matplotlib inline`` registers; a kernel that
    never imported pyplot has not done it). Nothing happens outside IPython."""
    try:
        from IPython import get_ipython
        from IPython.core.pylabtools import select_figure_formats
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and not getattr(shell, "_v100lab_png", False):
        select_figure_formats(shell, {"png"}, bbox_inches="tight")
        shell._v100lab_png = True


def _figure(ncols: int = 1, nrows: int = 1, width: float = 6.4, height: float = 4.2, **kw):
    import seaborn as sns
    from matplotlib.figure import Figure

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

def sweep(df, title: str, *, metrics: Sequence[str] = ("tg_tps", "pp_tps"), lever: str | None = None,
          ceiling: bool = True, log_y: bool = False, note: str = ""):
    """tok/s against the lever's values, one panel per metric; one line per (source, model, device).

    The strict ceiling of each model and device is drawn as a thin dotted line on the decode panel;
    measured/claimed points above it are marked."""
    d = df[df["unit"] == "tok/s"]
    if lever is not None:
        d = d[d["lever"] == lever]
    metrics = [m for m in metrics if (d["metric"] == m).any()] or list(metrics[:1])
    fig, axes = _figure(ncols=len(metrics))
    lev = _first(d, "lever", lever or "")
    order = _order(d["value"].tolist())
    numeric = _numeric(order) and len(order) > 2
    pos = {v: (float(v) if numeric else i) for i, v in enumerate(order)}
    many = d[["model", "device"]].drop_duplicates().shape[0] > 1
    seen: set = set()
    bars = not numeric and len(order) <= 4
    for ax, metric in zip(axes[0], metrics):
        m = d[d["metric"] == metric]
        if not len(m):
            _empty(ax, "nothing to show for this metric in this run")
            continue
        groups = list(m.groupby(["source", "model", "device"], sort=False))
        width = 0.8 / max(1, len(groups))
        for k, ((source, model, device), g) in enumerate(groups):
            g = g.assign(x=g["value"].map(pos)).sort_values("x")
            agg = g.groupby("x", as_index=False)["result"].mean()
            label = _series_label(source, model, device, many)
            if bars:
                shift = (k - (len(groups) - 1) / 2) * width
                ax.bar(agg["x"] + shift, agg["result"], width=width * 0.95, color=SOURCE_COLORS.get(source),
                       alpha=0.9 - 0.25 * (k // 3), label=label)
                for x, y in zip(agg["x"] + shift, agg["result"]):
                    ax.annotate(f"{y:,.3g}", (x, y), xytext=(0, 2), textcoords="offset points", ha="center",
                                fontsize=7)
                g = g.assign(x=g["x"] + shift)
            else:
                ax.plot(agg["x"], agg["result"], SOURCE_LINES.get(source, "-"), marker=SOURCE_MARKERS.get(source, "o"),
                        color=SOURCE_COLORS.get(source), alpha=0.9 if source != "predicted" or not many else 0.7,
                        label=label, markersize=6)
            above = g[g["above_ceiling"].fillna(False).astype(bool) & g["source"].isin(["measured", "claimed"])]
            _mark_above(ax, above["x"], above["result"], seen)
        if ceiling and metric.startswith("tg"):
            c = d[d["metric"] == "strict_ceiling_tg_tps"]
            for (model, device), g in c.groupby(["model", "device"], sort=False):
                g = g.assign(x=g["value"].map(pos)).sort_values("x")
                agg = g.groupby("x", as_index=False)["result"].max()
                ax.plot(agg["x"], agg["result"], ":" if not bars else "_", color="#999", linewidth=1.2,
                        markersize=40 if bars else 6,
                        label=mpl_text(f"strict ceiling: {model} @ {'this machine' if device == 'host' else device}"
                                       if many else "strict ceiling (bytes per token / bandwidth)"))
        ax.set_title(mpl_text(METRIC_LABELS.get(metric, metric)), fontsize=10)
        ax.set_xlabel(LEVER_LABELS.get(lev, lev))
        ax.set_ylabel("tokens per second (tok/s)")
        if bars:
            ax.set_xlim(-0.75, len(order) - 0.25)
        if not numeric:
            ax.set_xticks(list(range(len(order))))
            ax.set_xticklabels([mpl_text(v) for v in order], rotation=30 if len(order) > 4 else 0, ha="right"
                               if len(order) > 4 else "center")
        if log_y:
            ax.set_yscale("log")
        ax.set_ylim(bottom=0 if not log_y else None)
        _dedupe_legend(ax)
    fig.suptitle(mpl_text(title) + (f"\n{mpl_text(note)}" if note else ""), fontsize=12)
    return fig


# ------------------------------------------------------------------------------------------------
# 00: the staircase
# ------------------------------------------------------------------------------------------------

def staircase(df):
    """Left: the seed's device — claimed range per stage, predicted decode speed, strict ceiling.
    Right: this machine — each stage's flags measured vs predicted for the measured model."""
    fig, axes = _figure(ncols=2, width=7.0, height=4.6)
    seen: set = set()
    seed = df[df["device"] != "host"]
    here = df[df["device"] == "host"]
    stages = _order(df[df["lever"] == "stage"]["value"].tolist())
    x = {s: i for i, s in enumerate(stages)}
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
                               ("strict_ceiling_tg_tps", dict(marker="_", color="#999", linestyle=":", markersize=18),
                                "strict ceiling (bytes per token / bandwidth)")):
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
            g = g.groupby("value")["result"].mean().reindex(stages)   # a refused stage leaves a gap
            g = g.reset_index(drop=True).to_frame("result").assign(x=range(len(stages)))
            ax.plot(g["x"], g["result"], SOURCE_LINES[source], marker=SOURCE_MARKERS[source],
                    color=SOURCE_COLORS[source], label=f"{source} here")
        c = here[here["metric"] == "strict_ceiling_tg_tps"]
        if len(c):
            c = c.assign(x=c["value"].map(x)).sort_values("x")
            ax.plot(c["x"], c["result"], ":", color="#999", marker="_", markersize=18, label="strict ceiling here")
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
    fig.suptitle("The seed's staircase: claimed vs predicted (its V100) vs measured (this machine)", fontsize=12)
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
    capacity as a vertical line when it is an accelerator."""
    from v100lab.levers import COMPONENTS

    d = df[(df["lever"] == "component") & (df["metric"] == "bytes")]
    groups = list(dict.fromkeys(d["note"]))
    fig, axes = _figure(ncols=max(1, len(groups)), width=6.6, height=3.6)
    comps = [c for c, _, _ in COMPONENTS]
    palette = ["#1b6fb5", "#e6a01a", "#7a49a5", "#4daf4a", "#a6761d", "#999999"]
    for ax, group in zip(axes[0], groups):
        g = d[d["note"] == group]
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
        cap = df[(df["note"] == group) & (df["metric"] == "capacity_bytes") & (df["device"] != "host")]
        for dev, c in cap.groupby("device")["result"].max().items():
            ax.axvline(c / scale, color="#c0001a", linestyle="--", linewidth=1,
                       label=mpl_text(f"{dev} memory ({c / 2**30:.0f} GiB)"))
        ax.set_yticks(list(range(len(bars))))
        ax.set_yticklabels([mpl_text(f"{s} · {'this machine' if dv == 'host' else dv}") for s, dv in bars], fontsize=8)
        ax.set_xlabel(f"memory ({unit})")
        ax.set_title(mpl_text(group), fontsize=10)
        ax.set_xlim(right=ax.get_xlim()[1] * 1.15)
        _dedupe_legend(ax, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4)
    fig.suptitle("Where the memory goes: weights, KV cache, compute and output buffers (hatched: measured)",
                 fontsize=12)
    return fig


def fit_heatmap(grid):
    """The VRAM triangle: one heatmap per cache type, quants × context sizes, coloured by the margin left on
    the device (GiB; red: does not fit), annotated with the margin."""
    import numpy as np
    import seaborn as sns

    g = grid[(grid["lever"] == "n_ctx") & (grid["metric"] == "margin_bytes")].copy()
    g["cache type"] = g["note"].str.replace("cache_type=", "", regex=False)
    types = list(dict.fromkeys(g["cache type"]))
    fig, axes = _figure(ncols=max(1, len(types)), width=4.6, height=0.5 * max(3, g["quant"].nunique()) + 1.6)
    if not len(g):
        _empty(axes[0][0], "no configuration to show")
        return fig
    lim = max(1e-9, float(np.nanmax(np.abs(g["result"]))) / 2**30)
    for i, (ax, ct) in enumerate(zip(axes[0], types)):
        t = g[g["cache type"] == ct]
        wide = t.pivot_table(index="quant", columns="value", values="result", aggfunc="max") / 2**30
        wide = wide[_order(list(wide.columns))].reindex(list(dict.fromkeys(t["quant"])))
        sns.heatmap(wide, ax=ax, cmap="RdYlGn", center=0, vmin=-lim, vmax=lim, annot=True, fmt=".2f",
                    cbar=i == len(types) - 1, cbar_kws={"label": "margin left on the device (GiB)"},
                    annot_kws={"fontsize": 8}, linewidths=0.5, linecolor="white")
        ax.set_title(mpl_text(f"KV cache {ct}"), fontsize=10)
        ax.set_xlabel("context size -c (tokens)")
        ax.set_ylabel("quantization" if i == 0 else "")
    dev = grid.attrs.get("device_name") or g["device"].iloc[0]
    fig.suptitle(mpl_text(f"What fits on {dev}: margin in GiB (negative = does not fit)"), fontsize=12)
    return fig


# ------------------------------------------------------------------------------------------------
# 02: ceilings
# ------------------------------------------------------------------------------------------------

def ceilings(df):
    """Per quant, one panel per model: the seed's ceiling, the strict ceiling, the predicted decode speed,
    and the seed's own table where it claims one."""
    d = df[df["lever"] == "quant"]
    models = list(dict.fromkeys(d["model"]))
    fig, axes = _figure(ncols=max(1, len(models)), width=6.2, height=4.2)
    series = (("ceiling_tg_tps", "predicted", "the seed's ceiling (bandwidth / weights)", "#9ecae1"),
              ("strict_ceiling_tg_tps", "predicted", "strict ceiling (bytes per token)", "#4292c6"),
              ("tg_tps", "predicted", "predicted decode (what fits on the device)", "#08306b"),
              ("ceiling_tg_tps", "claimed", "the seed's table (claimed ceiling)", "#6a6a6a"))
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
    fig.suptitle("The bandwidth ceiling per quant: tok/s ≤ bandwidth / bytes read per token", fontsize=12)
    return fig


def catalog(df):
    """Every device: the seed's ceiling and the predicted decode speed of the model (hatched: the model does
    not fit, the prediction spills layers to a CPU)."""
    d = df[df["lever"] == "device"]
    pred = d[(d["metric"] == "tg_tps") & (d["source"] == "predicted")].set_index("value")
    ceil = d[d["metric"] == "ceiling_tg_tps"].groupby("value")["result"].max()
    devs = list(pred.sort_values("result").index)
    fig, axes = _figure(width=8.0, height=0.32 * max(6, len(devs)) + 1.5)
    ax = axes[0][0]
    ys = list(range(len(devs)))
    ax.barh(ys, [ceil.get(dv, float("nan")) for dv in devs], color="#c6dbef", label="the seed's ceiling "
            "(bandwidth / weights)")
    fits = [str(pred.loc[dv, "note"]).startswith("fits") for dv in devs]
    ax.barh(ys, list(pred.loc[devs, "result"]), height=0.5, color=["#1b6fb5" if f else "#e6a01a" for f in fits],
            hatch=None, label="predicted decode (fits)")
    if not all(fits):
        ax.barh([], [], color="#e6a01a", label="predicted decode (does not fit: layers spill to the CPU)")
    ax.set_yticks(ys)
    ax.set_yticklabels([mpl_text(dv) for dv in devs], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("decode speed (tok/s, log scale)")
    model, quant = _first(d, "model"), _first(d, "quant")
    ax.set_title(mpl_text(f"{model} {quant} across the catalog"), fontsize=10)
    _dedupe_legend(ax, loc="lower right")
    fig.suptitle("The same model on every device: ceiling and prediction", fontsize=12)
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
    c = d[d["metric"] == "ceiling_tg_tps"]
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
    import numpy as np

    fig, axes = _figure(ncols=2, width=5.0, height=4.6)
    seen: set = set()
    for ax, metric in zip(axes[0], ("tg_tps", "pp_tps")):
        m = df[df["metric"] == metric]
        pub = m[m["source"] == "claimed"].set_index(["value", "quant"])["result"]
        pre = m[m["source"] == "predicted"].set_index(["value", "quant"])["result"]
        j = pub.to_frame("published").join(pre.to_frame("predicted"), how="inner").reset_index()
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
    fig.suptitle("Published llama.cpp rows on Apple Silicon vs the speed model (fit leaves each chip out)",
                 fontsize=12)
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
    fig.suptitle("File size per quant: written by llama.cpp's quantizer vs predicted", fontsize=12)
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
    fig.suptitle(mpl_text(f"Quality per quant, measured: {model}\non {corpus}"), fontsize=11)
    return fig


# ------------------------------------------------------------------------------------------------
# 05, 06, 07
# ------------------------------------------------------------------------------------------------

def gpu_layers(df):
    """Predicted decode and prompt speed against -ngl; the values that do not fit are shaded."""
    fig = sweep(df, "-ngl: decode and prompt speed against the layers offloaded", lever="n_gpu_layers",
                note=df.attrs.get("why_not_measured", ""))
    fits = df[(df["metric"] == "fits") & (df["lever"] == "n_gpu_layers")]
    if len(fits) and _numeric(fits["value"]):
        bad = [float(v) for v, f in zip(fits["value"], fits["result"]) if f < 0.5]
        for ax in fig.axes:
            if bad:
                ax.axvspan(min(bad) - 0.5, max(bad) + 0.5, color="#c0001a", alpha=0.08,
                           label="does not fit on the device")
                _dedupe_legend(ax)
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
    d["cache type"] = d["note"].str.replace("cache_type=", "", regex=False)
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
    fig.suptitle("KV cache memory: context × cache type, measured (llama.cpp's log) vs predicted", fontsize=12)
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
    import seaborn as sns

    for ax, metric, label in ((axes[0][0], "load_s", "load model + create context (s)"),
                              (axes[0][1], "first_token_s", "prompt + first token after loading (s)")):
        m = d[d["metric"] == metric]
        sns.barplot(data=m, x="value", y="result", ax=ax, color=SOURCE_COLORS["measured"], errorbar=("ci", 95)
                    if m.groupby("value").size().max() > 1 else None)
        ax.set_xlabel("how the model is loaded")
        ax.set_ylabel(label)
    fig.suptitle("mmap vs --no-mmap vs --mlock: measured here (no prediction: loading is not modelled)",
                 fontsize=11)
    return fig

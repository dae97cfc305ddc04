"""Each notebook's closing paragraph (``summary_*``), written from the numbers of the frames it is
given — nothing in them is a canned conclusion — with every string that came from a model or a parameter file
escaped (:mod:`v100lab.workbook.render`).
"""

from __future__ import annotations

import os

from v100lab.facts.results import TPS, compare
from v100lab.workbook.scenario import Scenario
from v100lab.workbook.levers.final import final_config
from v100lab.workbook.levers.steps import GIB, HOST, MIB, gpu_subject, study
from v100lab.workbook.levers.text import (claim_verdict, difference, ends, fmt, markdown, md, mean_of, pct, pick, points, best_of)
from v100lab.workbook.levers.threads import thread_values


def _failures_line(*frames) -> str:
    fails = [f for df in frames for f in (df.attrs.get("failures") or [])]
    if not fails:
        return ""
    first = fails[0]
    return md("{n} configuration(s) failed here; the first ({lever} = {value}): {reason}.", n=len(fails),
               lever=first["lever"], value=first["value"], reason=first["reason"])


def _above_line(*frames) -> str:
    """How many measured decode figures of this run exceed the physical ceiling of their model and device."""
    n = k = 0
    for df in frames:
        m = df[(df["source"] == "measured") & (df["unit"] == TPS) & df["metric"].astype(str).str.startswith("tg")] \
            if len(df) and "source" in df else df.iloc[0:0]
        n += len(m)
        k += int(m["above_ceiling"].fillna(False).astype(bool).sum()) if len(m) else 0
    if not k:
        return ""
    return md("{k} of {n} measured decode figures are above the physical ceiling of their model and device "
               "(marked ✕ in the plots).", k=k, n=n)


def _not_measured_line(df) -> str:
    why = df.attrs.get("why_not_measured")
    return md("Nothing was measured for this step: {why}.", why=why) if why else ""


def _pairs(df, metric: str, lever: str | None = None, other: str = "measured"):
    """(value, ``other``, predicted) for every figure from ``other`` ("measured" or "claimed") that has a
    nonzero prediction for the same thing (:func:`v100lab.facts.results.compare`'s keys)."""
    c = compare(df, metric=metric, lever=lever, require=(other, "predicted"))
    c = c[c["predicted"] != 0]
    return list(zip(c["value"], c[other].astype(float), c["predicted"].astype(float)))


def _agreement(pairs) -> str:
    if not pairs:
        return "—"
    errs = sorted(abs(p / m - 1) for _, m, p in pairs if m)     # error = predicted / measured − 1
    if not errs:
        return "—"
    med = errs[len(errs) // 2] if len(errs) % 2 else (errs[len(errs) // 2 - 1] + errs[len(errs) // 2]) / 2
    return f"median |error| {100 * med:.0f} % (worst {100 * errs[-1]:.0f} %, {len(errs)} points)"


def summary_overview(sc: Scenario, stairs):
    """The staircase in sentences: which claims exceed the ceiling, how prediction and measurement compare."""
    lines = []
    seed = stairs[stairs["device"] != HOST]
    claimed = pick(seed, source="claimed", metric="tg_tps")
    if len(claimed):
        above = claimed[claimed["above_ceiling"].fillna(False).astype(bool)]
        stages_above = list(dict.fromkeys(above["value"]))
        dev = claimed["device"].iloc[0]
        lines.append(md("Of the seed's {n} claimed figures, {k} exceed the physical ceiling of its assumed model on "
                         "{dev}{stages}.", n=len(claimed), k=len(above), dev=dev,
                         stages=(" — stage(s) " + ", ".join(stages_above) + ": no card decodes faster than it reads "
                                 "the weights, so the measurement or the model size is wrong") if stages_above else ""))
    for stage in dict.fromkeys(pick(seed, metric="tg_tps", source="predicted")["value"]):
        c = pick(claimed, value=stage)["result"]
        p = mean_of(seed, metric="tg_tps", source="predicted", value=stage)
        s = mean_of(seed, metric="physical_ceiling_tg_tps", value=stage)
        lines.append(md("Stage {stage}: claimed {c}, predicted {p} tok/s (physical ceiling {s}).", stage=stage,
                         c=(f"{c.min():g}–{c.max():g}" if len(c) else "—"), p=fmt(p), s=fmt(s)))
    here = stairs[stairs["device"] == HOST]
    pairs = _pairs(here, "tg_tps", "stage")
    if pairs:
        ms = [m for _, m, _ in pairs]
        lines.append(md("On this machine {model} decoded at {lo}–{hi} tok/s across the stages' flags; "
                         "measured vs predicted: {agree}.", model=here["model"].iloc[0], lo=fmt(min(ms)),
                         hi=fmt(max(ms)), agree=_agreement(pairs)))
    lines += [_above_line(stairs), _failures_line(stairs), _not_measured_line(stairs)]
    return markdown(lines)


def summary_triangle(sc: Scenario, mem, grid):
    """The triangle with numbers: what the chosen configuration needs, what fits, the largest contexts."""
    lines = []
    pred = pick(mem, source="predicted", metric="bytes")
    for (group, dev), g in pred.groupby(["group", "device"], sort=False):
        total = g["result"].sum()
        if not total:
            continue
        cap = mean_of(mem, metric="capacity_bytes", device=dev, group=group)
        parts = ", ".join(f"{v} {r / GIB:.2f}" for v, r in zip(g["value"], g["result"]) if r > 0)
        if cap is None:
            lines.append(md("{model} keeps {total} GiB on {dev}, the CPU beside the GPU ({parts} GiB).",
                             model=g["model"].iloc[0], total=fmt(total / GIB, 2), dev=dev, parts=parts))
            continue
        lines.append(md("{model} {quant} with -c {ctx} needs {total} GiB on {dev} ({parts} GiB) of {cap} GiB: "
                         "{verdict}.", model=g["model"].iloc[0], quant=g["quant"].iloc[0], ctx=sc.n_ctx or "its own",
                         total=fmt(total / GIB, 2), dev="this machine" if dev == HOST else dev, parts=parts,
                         cap=fmt((cap or 0) / GIB, 1),
                         verdict=("fits" if cap and total <= cap else
                                  f"does not fit, {fmt((total - (cap or 0)) / MIB, 0)} MiB over")))
    c = compare(mem, ("model", "device", "lever", "value", "group"), metric="bytes", require=("measured",))
    if len(c):
        lines.append(md("llama.cpp reported {m} MiB of buffers for {model} here; the plan predicted {p} MiB ({d}).",
                         m=fmt(c["measured"].sum() / MIB), model=c["model"].iloc[0],
                         p=fmt(c["predicted"].sum() / MIB), d=pct(c["predicted"].sum(), c["measured"].sum())))
    names = grid.attrs.get("device_names") or {}
    for (model, dev), fits in pick(grid, metric="fits", lever="n_ctx").groupby(["model", "device"], sort=False):
        lines.append(md("Of {n} combinations of quant × context × cache type, {k} fit for {model} on {dev}.",
                         n=len(fits), k=int(fits["result"].sum()), model=model,
                         dev="this machine" if dev == HOST else names.get(dev, dev)))
        mc = pick(grid, metric="max_ctx", model=model, device=dev)
        for ct in dict.fromkeys(mc["cache_type"]):
            g = mc[mc["cache_type"] == ct].sort_values("result")
            if len(g) and g["result"].min() != g["result"].max():
                lo, hi = g.iloc[0], g.iloc[-1]
                lines.append(md("{model}, largest context with {ct}: {hi} tokens at {qh}, {lo} at {ql}.",
                                 model=model, ct=f"KV cache {ct}", hi=int(hi["result"]),
                                 qh=hi["quant"], lo=int(lo["result"]), ql=lo["quant"]))
    lines.append(_failures_line(mem))
    return markdown(lines)


def summary_ceiling(sc: Scenario, ceil, cat, roof, apple_df):
    """The ceiling in sentences: per quant on the device, the seed's table, the catalog, this machine, Apple."""
    st = study(sc)
    lines = []
    mine = pick(ceil, model=st.label, device=st.device.id)
    c = pick(mine, metric="weights_ceiling_tg_tps")
    if len(c):
        hi, lo = c.loc[c["result"].idxmax()], c.loc[c["result"].idxmin()]
        ratios = [(mean_of(mine, metric="tg_tps", value=v) or 0) / r for v, r in zip(c["value"], c["result"])]
        lines.append(md("On {dev} the bandwidth ceiling for {model} runs from {lo} tok/s ({ql}) to {hi} tok/s ({qh}); "
                         "the prediction reaches {a}–{b} % of it.", dev=st.device.id, model=st.label,
                         lo=fmt(lo["result"]), ql=lo["value"], hi=fmt(hi["result"]), qh=hi["value"],
                         a=f"{100 * min(ratios):.0f}", b=f"{100 * max(ratios):.0f}"))
    cl = compare(ceil, ("model", "value"), metric="weights_ceiling_tg_tps", require=("claimed",))
    if len(cl):
        diffs = [f"{v} {c:g} vs {fmt(p if p == p else None)}" for v, c, p in zip(cl["value"], cl["claimed"],
                                                                               cl["predicted"])]
        lines.append(md("The seed's ceiling table against the bandwidth ceiling (bandwidth / weight bytes) of its "
                         "assumed model: {d}.", d="; ".join(diffs)))
    p = pick(cat, metric="tg_tps", source="predicted")
    if len(p):
        best = p.loc[p["result"].idxmax()]
        n_fit = int(p["fits"].fillna(False).astype(bool).sum())
        lines.append(md("Across {n} devices the model fits on {k}; the fastest predicted is {dev} at {tps} tok/s.",
                         n=len(p), k=n_fit, dev=best["value"], tps=fmt(best["result"])))
        floor = pick(cat, metric="overhead_floor_tg_tps").set_index("value")["result"]
        on = [d for d, r in zip(p["value"], p["result"]) if d in floor.index and r >= 0.8 * floor[d]]
        if on:
            lines.append(md("{k} of them predict within 20 % of their per-token overhead limit: for this model the "
                             "fixed cost of a token, not bandwidth, sets the speed there.", k=len(on)))
    m = compare(roof, ("model", "value"), metric="tg_tps", require=("measured",))
    if len(m):
        r = m.iloc[0]
        pr = None if r["predicted"] != r["predicted"] else float(r["predicted"])
        ce = mean_of(roof, metric="weights_ceiling_tg_tps", value=r["value"], model=r["model"])
        lines.append(md("Here {model} {q} decoded at {m} tok/s: {f} of this machine's bandwidth ceiling ({c}), "
                         "predicted {p} ({e}); the host is {cal}.", model=r["model"], q=r["value"],
                         m=fmt(r["measured"]),
                         f=f"{100 * r['measured'] / ce:.0f} %" if ce else "—", c=fmt(ce), p=fmt(pr),
                         e=pct(pr, r["measured"]), cal="calibrated" if roof.attrs.get("calibrated") else
                         "not calibrated (run v100lab calibrate)"))
    for metric, name in (("tg_tps", "tg128"), ("pp_tps", "pp512")):
        c = compare(apple_df, ("value", "quant"), metric=metric, require=("claimed", "predicted"))
        c = c[c["predicted"] != 0]
        pairs = list(zip(c["value"], c["claimed"], c["predicted"]))
        if pairs:
            lines.append(md("Apple Silicon {name}, predicted vs published: {agree}.", name=name,
                             agree=_agreement([(v, m, p) for v, m, p in pairs])))
    lines += [_above_line(roof), _failures_line(roof)]
    return markdown(lines)


def summary_baseline(sc: Scenario, base, diag):
    """The baseline in sentences."""
    st = study(sc)
    lines = []
    for metric, name in (("tg_tps", "decode"), ("pp_tps", "prompt processing")):
        for v, m, p in _pairs(base, metric):
            lines.append(md("{name}: measured {m} tok/s here, predicted {p} ({e}).", name=name.capitalize(),
                             m=fmt(m), p=fmt(p), e=pct(p, m)))
    if st.device.id != HOST:
        p = mean_of(base, metric="tg_tps", source="predicted", device=st.device.id)
        s = mean_of(base, metric="physical_ceiling_tg_tps", device=st.device.id)
        n = pick(base, metric="tg_tps", source="predicted", device=st.device.id)
        lines.append(md("{model} on {dev} with these flags: predicted {p} tok/s of a {s} tok/s ceiling ({note}).",
                         model=st.label, dev=st.device.id, p=fmt(p), s=fmt(s),
                         note=n["note"].iloc[0] if len(n) else ""))
    off = diag[diag["fact"].str.startswith("layers")]
    if len(off):
        lines.append(md("Load log: {fact} — {value}.", fact=off["fact"].iloc[0], value=off["value"].iloc[0]))
    lines += [_above_line(base), _failures_line(base), _not_measured_line(base)]
    return markdown(lines)


def summary_quantization(sc: Scenario, ladder, qual):
    """The quant ladder and quality in sentences."""
    lines = []
    tg = pick(ladder, metric="tg_tps", source="measured")
    if len(tg):
        lines.append(md("Measured decode on the {ladder} ladder: {effect}.", ladder=tg["model"].iloc[0],
                         effect=_effect(ladder, "tg_tps", "quant")))
        for metric, name in (("tg_tps", "decode"), ("pp_tps", "prompt")):
            pairs = _pairs(ladder, metric, "quant")
            if pairs:
                lines.append(md("{name} measured vs predicted: {agree}.", name=name.capitalize(),
                                 agree=_agreement(pairs)))
        sizes = _pairs(ladder, "file_bytes", "quant")
        if sizes:
            lines.append(md("File sizes, predicted from the architecture vs written by the quantizer: {agree}.",
                             agree=_agreement(sizes)))
    p = pick(ladder, metric="tg_tps", source="predicted", device=study(sc).device.id, model=study(sc).label)
    if len(p):
        lines.append(md("{model} on {dev}, predicted decode: {pairs}.", model=study(sc).label, dev=study(sc).device.id,
                         pairs=", ".join(f"{v} {r:.1f}" for v, r in zip(p["value"], p["result"]))))
    ppl = pick(qual, metric="perplexity")
    if len(ppl):
        ref = mean_of(ppl, value="F16")
        worst = ppl.loc[ppl["result"].idxmax()]
        kl = pick(qual, metric="kl_divergence")
        kls = ", ".join(f"{v} {r:.4f}" for v, r in zip(kl["value"], kl["result"]))
        lines.append(md("Perplexity of the F16 reference {r}; the worst quant, {q}, {w} ({d}). KL divergence from "
                         "F16 (nats per token): {kls}.", r=fmt(ref, 2), q=worst["value"], w=fmt(worst["result"], 2),
                         d=pct(worst["result"], ref), kls=kls or "—"))
        lines.append(md("Text scored: {corpus}.", corpus=qual.attrs.get("corpus", "")))
    lines += [_above_line(ladder), _failures_line(ladder, qual), _not_measured_line(qual)]
    return markdown(lines)


def summary_gpu_layers(sc: Scenario, ngl, spill_df):
    """-ngl and the spill effect in sentences."""
    gpu = gpu_subject(sc)
    lines = []
    p = pick(ngl, metric="tg_tps", source="predicted", lever="n_gpu_layers")
    if len(p):
        vals = p.assign(v=p["value"].astype(int)).sort_values("v")
        lines.append(md("Predicted decode for {model} on {dev}: {a} tok/s with -ngl {va}, {b} tok/s with -ngl {vb}; "
                         "at most {m} of {n} layer slots fit.", model=gpu.label, dev=gpu.device.id,
                         a=fmt(vals["result"].iloc[0]), va=vals["value"].iloc[0], b=fmt(vals["result"].iloc[-1]),
                         vb=vals["value"].iloc[-1], m=ngl.attrs.get("max_gpu_layers"), n=ngl.attrs.get("layer_slots")))
    if ngl.attrs.get("why_not_measured"):
        lines.append(md("Not measured: {why}.", why=ngl.attrs["why_not_measured"]))
    sp = pick(spill_df, metric="tg_tps")
    if len(sp) > 1:
        sp = sp.assign(v=sp["value"].astype(int)).sort_values("v")
        small, large = sp.iloc[0], sp.iloc[-1]
        s_small = mean_of(spill_df, metric="layers_spilled", value=small["value"])
        s_large = mean_of(spill_df, metric="layers_spilled", value=large["value"])
        kv_s = mean_of(spill_df, metric="kv_bytes_read_per_token", value=small["value"])
        kv_l = mean_of(spill_df, metric="kv_bytes_read_per_token", value=large["value"])
        if s_small == s_large:
            lines.append(md("With -ngl 999 the same {n} layer slot(s) stay on the CPU at every context from {cs} to "
                             "{cl} tokens on {dev}: predicted {ts} → {tl} tok/s, no spill step here.",
                             n=int(s_small or 0), cs=small["value"], cl=large["value"], dev=gpu.device.id,
                             ts=fmt(small["result"]), tl=fmt(large["result"])))
        else:
            lines.append(md("With -ngl 999, -c {cl} leaves {sl} layer slot(s) on the CPU and predicts {tl} tok/s; "
                             "-c {cs} leaves {ss} and predicts {ts} tok/s ({ratio}×). The KV cache a token reads at "
                             "depth {d} is {kl} KiB vs {ks} KiB ({kd}) while the layers on the CPU go from {sl} to "
                             "{ss}.", cl=large["value"], sl=int(s_large or 0), tl=fmt(large["result"]),
                             cs=small["value"], ss=int(s_small or 0), ts=fmt(small["result"]),
                             ratio=fmt(small["result"] / large["result"] if large["result"] else None, 2),
                             d=spill_df.attrs.get("depth"), kl=fmt((kv_l or 0) / 1024), ks=fmt((kv_s or 0) / 1024),
                             kd=pct(kv_s, kv_l)))
    lines.append(_failures_line(ngl))
    return markdown(lines)


def summary_context(sc: Scenario, kv, depth_df, qv):
    """Context, KV cache and quantized V in sentences."""
    lines = []
    pred = pick(kv, source="predicted")
    if len(pred):
        big = str(max(int(v) for v in pred["value"]))
        per_ct = ", ".join(f"{ct} {r / MIB:,.0f} MiB"
                           for ct, r in pick(pred, value=big, model=pred["model"].iloc[0])[["cache_type",
                                                                                            "result"]].values)
        lines.append(md("KV cache of {model} at -c {ctx}: {per}.", model=pred["model"].iloc[0], ctx=big, per=per_ct))
    if (kv["source"] == "measured").any():
        lines.append(md("KV bytes predicted vs llama.cpp's log: {agree}.",
                        agree=_agreement(_pairs(kv, "kv_cache_bytes"))))
    m = pick(depth_df, metric="tg_tps", source="measured")
    if len(m) > 1:
        (da, a, asd, ar), (db, b, bsd, br) = ends(points(depth_df, "tg_tps", "n_depth"))
        lines.append(md("Measured decode: {a} tok/s at depth {da}, {b} at depth {db} ({d}); "
                         "measured vs predicted: {agree}.", a=fmt(a), da=da, b=fmt(b), db=db,
                         d=difference(a, asd, ar, b, bsd, br), agree=_agreement(_pairs(depth_df, "tg_tps"))))
    p = pick(depth_df, metric="tg_tps", source="predicted", device=study(sc).device.id, model=study(sc).label)
    if len(p) > 1 and not study(sc).same_model_here:
        p = p.assign(v=p["value"].astype(int)).sort_values("v")
        lines.append(md("Predicted for {model} on {dev}: {a} → {b} tok/s from depth {da} to {db}.",
                         model=study(sc).label, dev=study(sc).device.id, a=fmt(p["result"].iloc[0]),
                         b=fmt(p["result"].iloc[-1]), da=p["value"].iloc[0], db=p["value"].iloc[-1]))
    if len(qv):
        row = qv[(qv["flash attention"] == "off") & qv["cache type K / V"].str.endswith("q8_0")]
        if len(row):
            lines.append(md("q8_0 V with flash attention off — predicted: {p}; llama.cpp here: {m}.",
                             p=row["predicted"].iloc[0], m=row["llama.cpp here"].iloc[0]))
    lines += [_above_line(depth_df), _failures_line(kv, depth_df), _not_measured_line(depth_df)]
    return markdown(lines)


def _effect(df, metric: str, lever: str) -> str:
    """The measured effect of a lever on one metric: the range over its values and the best one — a "best"
    only when it beats the runner-up beyond the noise (:func:`~v100lab.workbook.levers.text.best_of`). One value: the
    figure measured."""
    m = pick(df, metric=metric, source="measured", lever=lever)
    if not len(m):
        return ""
    name = METRIC_NAMES.get(metric, metric)
    g = points(df, metric, lever)
    if len(g) < 2:
        v = g.index[0]
        return f"{name} {g.loc[v, 'result']:.1f} tok/s at {v} (one value measured: nothing to compare)"
    return f"{name} {g['result'].min():.1f}–{g['result'].max():.1f} tok/s: {best_of(g)}"


METRIC_NAMES = {"tg_tps": "decode", "pp_tps": "prompt", "tg_tps_per_stream": "per-stream decode"}


def _lever_lines(df, lever: str, name: str, metrics=("pp_tps", "tg_tps"), predicted: bool = True) -> list[str]:
    parts = [e for e in (_effect(df, m, lever) for m in metrics) if e]
    if parts:
        pairs = [p for m in metrics for p in _pairs(df, m, lever)]
        return [md("{name}: {effects}; measured vs predicted: {agree}.", name=name, effects="; ".join(parts),
                    agree=_agreement(pairs) if predicted else "one-stream prediction only")]
    if df.attrs.get("why_not_measured"):
        return [md("{name}: not measured — {why}.", name=name, why=df.attrs["why_not_measured"])]
    return []


def _predicted_line(sc: Scenario, df, lever: str, metric: str, name: str) -> str:
    """The prediction for the scenario's model on its device, over the lever's values."""
    st = study(sc)
    p = pick(df, metric=metric, source="predicted", device=st.device.id, model=st.label, lever=lever)
    if not len(p) or st.same_model_here:
        return ""
    return md("{name} predicted for {model} on {dev}: {vals}.", name=name, model=st.label, dev=st.device.id,
               vals=", ".join(f"{v} {r:,.1f}" for v, r in zip(p["value"], p["result"])))


def summary_flash_attn(sc: Scenario, fa):
    """Flash attention off vs on, in sentences."""
    lines = [md("Compared at depth {d} (tokens already in the context).", d=fa.attrs.get("depth", 0))]
    lines += _lever_lines(fa, "flash_attn", "-fa")
    lines += [_predicted_line(sc, fa, "flash_attn", "tg_tps", "Decode"), _above_line(fa), _failures_line(fa)]
    return markdown(lines)


def summary_batch(sc: Scenario, batch):
    """The micro-batch sweep, in sentences."""
    lines = [md("Prompt of {n} tokens, longer than the largest -ub, so each value splits it into a different "
                 "number of steps.", n=batch.attrs.get("n_prompt", sc.n_prompt))]
    lines += _lever_lines(batch, "n_ubatch", "-ub", metrics=("pp_tps",))
    lines += [_predicted_line(sc, batch, "n_ubatch", "pp_tps", "Prompt processing"), _failures_line(batch)]
    return markdown(lines)


def summary_threads(sc: Scenario, threads):
    """The threads sweep, in sentences."""
    lines = [md("Swept -t over {vals} on a machine with {cores} logical cores; threads beyond the cores share them "
                 "(and spin while they wait).", vals=", ".join(map(str, thread_values(sc))), cores=os.cpu_count())]
    lines += _lever_lines(threads, "n_threads", "-t")
    lines += [_above_line(threads), _failures_line(threads)]
    return markdown(lines)


def summary_parallel(sc: Scenario, par, latency=None, one=None, slots=None):
    """--parallel, in sentences: every slot busy (``par``), and when given the latency percentiles, the
    one-user test of the seed's claim and the context per slot."""
    lines = _lever_lines(par, "n_parallel", "-np, every slot busy (all streams together; each stream)",
                         metrics=("tg_tps", "tg_tps_per_stream"))
    p = pick(par, metric="tg_tps", source="predicted")
    if len(p):
        p = p.assign(v=p["value"].astype(int)).sort_values("v")
        lines.append(md("Predicted for {model} on {dev}: all streams together {a} tok/s at -np {va}, {b} at -np {vb}.",
                         model=p["model"].iloc[-1], dev="this machine" if p["device"].iloc[-1] == HOST else
                         p["device"].iloc[-1], a=fmt(p["result"].iloc[0]), va=p["value"].iloc[0],
                         b=fmt(p["result"].iloc[-1]), vb=p["value"].iloc[-1]))
    c = pick(par, metric="physical_ceiling_tg_tps", source="predicted")
    if len(c) > 1:
        c = c.assign(v=c["value"].astype(int)).sort_values("v")
        one_, many = c.iloc[0], c.iloc[-1]
        lines.append(md("Bandwidth allows {a} tok/s with {va} slot(s) and {b} with {vb} together ({each} each): one "
                         "pass over the weights serves every slot, so the total can grow while each stream slows.",
                         a=fmt(one_["result"]), va=one_["value"], b=fmt(many["result"]), vb=many["value"],
                         each=fmt(many["result"] / many["v"])))
    if latency is not None:
        hi = max(sc.parallel_slots)
        t = mean_of(latency, metric="ttft_ms_p99", source="measured", value=str(hi), group=f"concurrency {hi}")
        i = mean_of(latency, metric="itl_ms_p99", source="measured", value=str(hi), group=f"concurrency {hi}")
        if t is not None and i is not None:
            lines.append(md("With all {hi} slots busy, p99 time to first token {t} ms and p99 gap between tokens {i} "
                             "ms.", hi=hi, t=fmt(t), i=fmt(i)))
    if one is not None:
        claim = one.attrs.get("claim") or {}
        n = claim.get("tested_at")
        m = pick(one, metric=claim.get("metric"), source="measured", value=str(n))
        if n is not None and len(m):
            r, sd, runs = float(m["result"].iloc[0]), float(m["sd"].iloc[0]), int(m["repetitions"].iloc[0])
            lines.append(md("The seed's \"{advice}\": one user at -np {n} decodes at {r} ± {sd} × its -np 1 speed — "
                             "{v}.", advice=claim.get("advice", ""), n=n, r=f"{r:.3f}", sd=f"{sd:.3f}",
                             v=claim_verdict(r, sd, float(claim.get("below", 1.0)), runs)))
    if slots is not None:
        lo, hi = str(min(sc.parallel_slots)), str(max(sc.parallel_slots))
        a = mean_of(slots, metric="n_ctx_seq", source="predicted", group="split", value=lo)
        b = mean_of(slots, metric="n_ctx_seq", source="predicted", group="split", value=hi)
        if a is not None and b is not None:
            lines.append(md("Context per slot: {a} tokens at -np {lo}, {b} at -np {hi} (-c split; --kv-unified shares "
                             "one stream instead).", a=f"{a:,.0f}", lo=lo, b=f"{b:,.0f}", hi=hi))
    lines += [_above_line(par), _failures_line(par)]
    return markdown(lines)


def summary_loading(sc: Scenario, modes, load):
    """The load modes and their measured times, in sentences."""
    lines = []
    if len(modes):
        sel = modes[~modes["selected by"].str.startswith("no flag")]
        lines.append(md("This llama.cpp build has {n} load modes; the flags select {k} of them ({names}); "
                         "mmap supported: {mm}, mlock supported: {ml}.", n=len(modes), k=len(sel),
                         names=", ".join(sel["load mode"]), mm="yes" if modes.attrs.get("supports_mmap") else "no",
                         ml="yes" if modes.attrs.get("supports_mlock") else "no"))
    ld = pick(load, metric="load_s")
    if len(ld):
        g = ld.groupby("value")["result"].median()
        f = pick(load, metric="first_token_s").groupby("value")["result"].median()
        lines.append(md("Loading (median of {r} run(s)): {modes}.", r=int(ld.groupby("value").size().max()),
                         modes="; ".join(f"{k} {g[k]:.2f} s to load, {f.get(k, float('nan')):.2f} s to the first "
                                         "token" for k in g.index)))
    lines += [_failures_line(load), _not_measured_line(load)]
    return markdown(lines)


def summary_final(sc: Scenario, stairs, verdict):
    """The final configuration in sentences."""
    st = study(sc)
    t = final_config(sc)
    b = t.best
    lines = [md("Tuned for {model} on {dev} at -c {ctx}: {q}, predicted {p} tok/s decode (ceiling {c}, "
                 "{bound}-bound) and {pp} tok/s prompt, {m} MiB left of the device.", model=st.label, dev=t.device,
                 ctx=sc.target_ctx, q=b.quant, p=fmt(b.tg_tps), c=fmt(b.weights_ceiling_tg_tps), bound=b.bound,
                 pp=fmt(b.pp_tps, 0), m=fmt(b.margin_bytes / MIB, 0))]
    last = compare(stairs, metric="tg_tps", lever="stage", require=("measured",))
    if len(last):
        r = last.iloc[-1]
        p = None if r["predicted"] != r["predicted"] else float(r["predicted"])
        n = int(r["repetitions"])
        lines.append(md("The tuned flags measured here ({model}, stage {stage}): {m} tok/s{sd}, predicted {p} for "
                         "the same flags and depth.", model=r["model"], stage=r["value"], m=fmt(r["measured"]),
                         sd=f" ± {fmt(r['sd'])} over {n} runs" if n > 1 else " (one run)", p=fmt(p)))
    fit = sum(1 for c in t.candidates if c.fits)
    lines.append(md("{k} of {n} candidate configurations fit with the margin.", k=fit, n=len(t.candidates)))
    p = pick(stairs, metric="tg_tps", source="predicted", device=st.device.id, model=st.label)
    if len(p) > 1:
        lines.append(md("The scenario's staircase, predicted on {dev}: {first} → {last} tok/s over {n} stages.",
                         dev=st.device.id, first=fmt(p["result"].iloc[0]), last=fmt(p["result"].iloc[-1]),
                         n=len(p)))
    pairs = _pairs(stairs, "tg_tps", "stage")
    if pairs:
        lines.append(md("Each stage's flags measured here on {model}: {lo}–{hi} tok/s; measured vs predicted: "
                         "{agree}.", model=st.measured_label, lo=fmt(min(m for _, m, _ in pairs)),
                         hi=fmt(max(m for _, m, _ in pairs)), agree=_agreement(pairs)))
    if len(verdict):
        a = verdict.attrs
        lines.append(md("The seed's command, predicted on its device: {s} tok/s (claimed {lo}–{hi}, ceiling {c}){p}; "
                         "the tuned one: {t} tok/s. Flags that differ: {diff}.", s=fmt(a.get("seed_predicted")),
                         lo=f"{a['claimed'][0]:g}", hi=f"{a['claimed'][1]:g}", c=fmt(a.get("ceiling")),
                         p=f" — {a['seed_problem']}" if a.get("seed_problem") else "", t=fmt(a.get("tuned_predicted")),
                         diff=", ".join(verdict[verdict["seed"] != verdict["tuned"]]["flag"]) or "none"))
    lines += [_above_line(stairs), _failures_line(stairs), _not_measured_line(stairs)]
    return markdown(lines)

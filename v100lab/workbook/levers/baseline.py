"""Notebook 03, the baseline: a real run with llama.cpp's defaults, what its load log says, and the headline measured-vs-predicted figure every notebook quotes.
"""

from __future__ import annotations

from dataclasses import replace

from v100lab.predict import memory, rates
from v100lab.facts.config import RunConfig
from v100lab.measure.harness import environment
from v100lab.base.errors import RunFailed
from v100lab.workbook.render import publish_headline
from v100lab.facts.results import compare
from v100lab.workbook.scenario import Scenario
from v100lab.workbook.levers.text import best_of, points
from v100lab.workbook.levers.steps import (COMPONENTS, HOST, MIB, bench_tests, capture_load, conditions, ctx_for, devices_for,
                                  gpu_backend, lever_frame, loading_study, measure_sweep, measured_points, parameters,
                                  predict_rows, reference_end, study, with_drift)

PARAMETERS = parameters("n_gpu_layers", "n_ctx", "n_batch", "n_ubatch", "cache_type_k", "cache_type_v", "flash_attn",
                        "n_threads", "n_prompt", "n_gen", "repetitions")


_FLAGS_SHOWN = (("n_ctx", "-c"), ("n_threads", "-t"), ("n_batch", "-b"), ("n_ubatch", "-ub"), ("cache_type_k", "-ctk"),
                ("cache_type_v", "-ctv"), ("flash_attn", "-fa"), ("n_parallel", "-np"), ("n_gpu_layers", "-ngl"))


def baseline_title(sc: Scenario, heading: str = "") -> str:
    """What 03 runs, in words: "llama.cpp's defaults", with the flags the scenario sets otherwise
    ("llama.cpp's defaults except -c 2048, -t 2"), after ``heading:`` when one is given."""
    cfg, default = sc.run_config(), RunConfig()
    diff = [f"{flag} {getattr(cfg, k)}" for k, flag in _FLAGS_SHOWN if getattr(cfg, k) != getattr(default, k)]
    diff += [w for w, on in (("--no-mmap", not cfg.use_mmap), ("--mlock", cfg.use_mlock)) if on]
    words = "llama.cpp's defaults" + (f" except {', '.join(diff)}" if diff else "")
    return f"{heading}: {words}" if heading else words


def baseline(sc: Scenario):
    """A real run with the scenario's flags (llama.cpp's defaults unless the scenario changes them): prompt
    processing and decode measured on this machine vs predicted, and predicted for the scenario's model on
    its device (lever "config", value "baseline")."""
    st = study(sc)
    cfg = ctx_for(sc.run_config(), sc.n_prompt + sc.n_gen + 1)
    rows = []
    if not st.same_model_here:
        rows += predict_rows(st.spec, st.label, st.device, cfg, lever="config", value="baseline",
                             n_prompt=sc.n_prompt, n_gen=sc.n_gen,
                             metrics=("tg_tps", "pp_tps", "weights_ceiling_tg_tps", "physical_ceiling_tg_tps"))
    failures, series = [], []
    if st.measuring:
        rows += predict_rows(st.measured_spec, st.measured_label, st.host, cfg, lever="config", value="baseline",
                             n_prompt=sc.n_prompt, n_gen=sc.n_gen,
                             metrics=("tg_tps", "pp_tps", "weights_ceiling_tg_tps", "physical_ceiling_tg_tps"))
        obs, failures = measure_sweep(st, "n_ctx", [cfg.n_ctx], cfg, bench_tests(sc), monitor_series=series)

        rows += [replace(o, lever="config", value="baseline") for o in obs]
    return lever_frame(rows, failures, why_not_measured=st.why_not_measured, depth=sc.n_gen // 2,
                  monitor_series=series,
                  title=baseline_title(sc), conditions=conditions(cfg, st.measured_label or st.label,
                                        depth=f"0 (pp{sc.n_prompt}, tg{sc.n_gen} × {sc.repetitions})"))


def run_environment():
    """Where the measurements of this notebook ran: the CPU and the flags llama.cpp's kernels use, the llama.cpp
    build (commit, its system-info line), the build flags scripts/setup.sh chose and why, the OS — the same
    facts every measured row carries (``env``), so that rows from two builds or CPUs can be told apart."""
    import pandas as pd  # heavy third-party dependency

    env = environment()
    rows = [("CPU", env.get("cpu_model"), f"{env.get('cpu_count')} cores"),
            ("CPU flags llama.cpp uses", env.get("cpu_flags") or "?", "/proc/cpuinfo"),
            ("llama.cpp build", env.get("llama_cpp_build") or "?",
             f"llama-cpp-python {env.get('llama_cpp_python') or '?'}, ggml {env.get('ggml_version') or '?'}"),
            ("llama.cpp system info", env.get("system_info") or "?", "llama_print_system_info()"),
            ("build flags", env.get("build_flags") or "not recorded (llama-cpp-python installed by hand?)",
             {"safe": "the safe flags for this CPU (AMX off)", "user": "your CMAKE_ARGS",
              "native": "llama.cpp's -march=native"}.get(env.get("build_flags_source") or "", "")),
            ("GPU", env.get("gpu") or "none (a CPU build)", "ggml devices"),
            ("OS, Python", f"{env.get('os')}, Python {env.get('python')}", "")]
    hp = rates.describe_host_rates()   # what every --device host prediction rests on
    rows.append(("host speed profile", hp.line, "v100lab calibrate" if hp.calibrated else "an assumption"))
    rows += [("warning", w, "host speed profile") for w in hp.warnings]
    return pd.DataFrame(rows, columns=["fact", "value", "note"])


def load_diagnosis(sc: Scenario):
    """What llama.cpp's load log says for the measured model with the scenario's flags — offloaded layers,
    flash attention, context, and each buffer with its device — beside the memory plan's figure for it.
    Without a measurement: the plan for the scenario's model on its device."""
    import pandas as pd  # heavy third-party dependency

    st = loading_study(sc, load_log=True)
    cfg = sc.run_config()
    rows: list[tuple[str, str, str]] = []
    if not st.measuring:
        p = memory.plan(st.spec, devices_for(st.device), cfg, with_max_ctx=False)
        rows.append(("source", "memory plan (predicted; nothing loaded)", st.why_not_measured))
        rows.append(("layers on the GPU", f"{p.offloaded_layers}/{p.n_layer_total}", "predicted"))
        for dev_name, m in p.devices.items():
            for comp, attr, _ in COMPONENTS:
                if getattr(m, attr):
                    rows.append((f"{comp} buffer", f"{getattr(m, attr) / MIB:.2f} MiB on {dev_name}", "predicted"))
        rows += [("warning", w, "predicted") for w in p.warnings]
        return pd.DataFrame(rows, columns=["fact", "value", "source"])
    try:
        facts = capture_load(st, cfg)
    except RunFailed as exc:
        return pd.DataFrame([("load failed", str(exc), "llama.cpp")], columns=["fact", "value", "source"])
    p = memory.plan(st.measured_spec, [st.host], cfg, with_max_ctx=False)
    host_plan = p.devices[HOST]
    gpu = gpu_backend()
    off = (f"{facts.offloaded_layers}/{facts.offloadable_layers}" if facts.offloaded_layers is not None
           else "no offload line: this llama.cpp build has no GPU backend, every layer runs on the CPU")
    rows.append(("layers offloaded to a GPU", off, "load log"))
    rows.append(("GPU backend", gpu or "none", "ggml devices"))
    rows.append(("flash attention", str(facts.flash_attn or facts.flash_attn_requested or "not reported"), "load log"))
    rows.append(("n_ctx (per sequence)", f"{facts.n_ctx} ({facts.n_ctx_seq})", "load log"))
    if facts.kv_caches:
        k = facts.kv_caches[0]
        rows.append(("KV cache", f"{facts.kv_cells} cells, {k.layers} layers, K {k.type_k} / V {k.type_v}, "
                                 f"{facts.kv_size_mib:.2f} MiB", "load log"))
    by_kind = {kind: comp for comp, _, kind in COMPONENTS if kind}
    attr_of = {kind: attr for _, attr, kind in COMPONENTS if kind}
    for b in facts.buffers:
        predicted = getattr(host_plan, attr_of[b.kind]) / MIB if b.kind in attr_of else float("nan")
        rows.append((f"{by_kind.get(b.kind, b.kind)} buffer {b.buffer}",
                     f"{b.mib:.2f} MiB on {b.device} (plan: {predicted:.2f} MiB for all {b.kind} buffers)",
                     "load log"))
    fallbacks = list(dict.fromkeys(facts.cpu_fallbacks))[:5]
    rows += [("warning", w, "load log") for w in list(dict.fromkeys(facts.warnings))[:5] if w not in fallbacks]
    rows += [("weights not repacked" if "REPACK" in w else "CPU fallback", w,
              "load log: CPU_REPACK is llama.cpp's interleaved layout for faster CPU matrix products; these tensors "
              "stay in the file's layout (slower products, same memory)" if "REPACK" in w else "load log")
             for w in fallbacks]
    return pd.DataFrame(rows, columns=["fact", "value", "source"])


_VALUE_FLAG = {"stage": "stage", "n_threads": "-t", "n_ubatch": "-ub", "flash_attn": "-fa", "n_parallel": "-np",
               "n_depth": "depth", "n_gpu_layers": "-ngl", "quant": "", "config": ""}


def headline_figures(df, metric: str = "tg_tps", lever: str | None = None, value: str | None = None) -> dict:
    """What a headline says, from a tidy frame: over every point of ``lever`` measured and predicted (a
    configuration predicted not to fit left out), the median error (predicted / measured − 1), the worst point,
    and the point whose error is nearest the median (its measured mean, spread and prediction). Empty when
    nothing was both measured and predicted."""
    c = compare(df, metric=metric, lever=lever, require=("measured", "predicted"))
    if value is not None:
        c = c[c["value"] == str(value)]
    if len(c) and "fits" in df:
        p = df[(df["metric"] == metric) & (df["source"] == "predicted") & (df["fits"] == False)]  # noqa: E712
        c = c[~c["value"].isin(set(p["value"]))]
    c = c[(c["measured"] > 0) & (c["predicted"] > 0)]
    if not len(c):
        return {}
    errs = [float(p) / float(m) - 1 for p, m in zip(c["predicted"], c["measured"])]
    ranked = sorted(errs)
    n = len(ranked)
    med = ranked[n // 2] if n % 2 else (ranked[n // 2 - 1] + ranked[n // 2]) / 2
    at = min(range(n), key=lambda i: (abs(errs[i] - med), -i))
    worst = max(range(n), key=lambda i: abs(errs[i]))
    r, w = c.iloc[at], c.iloc[worst]
    return {"measured": float(r["measured"]), "predicted": float(r["predicted"]),
            "sd": float(r["sd"]) if r["sd"] == r["sd"] else None, "model": r["model"], "device": r["device"],
            "lever": r["lever"], "value": r["value"], "median_error": med, "points": n,
            "worst_error": errs[worst], "worst_value": w["value"]}


def headline(df, metric: str = "tg_tps", lever: str | None = None, value: str | None = None):
    """Publish the notebook's headline for the batch index (:func:`headline_figures`): the median error of the
    prediction over what the notebook measured, the point nearest it with its spread, the worst point, and a
    one-line finding (the best lever value, only beyond the noise). When the notebook measured nothing, the
    prediction alone and why (the index shows "ok (partial)"). Displays it; returns None.

    The run's references go with it (:func:`~v100lab.workbook.levers.steps.reference_end`). Measured spreads
    already include the drift of the reference while they were measured (``lever_frame``); a frame made without
    it is widened here by the drift between the run's start and end references."""
    ref = reference_end()
    drift = (df.attrs.get("reference_shift") or {}).get("drift")
    if "reference_shift" not in df.attrs and ref:
        drift = (ref.get("shift") or {}).get("drift")
        df = with_drift(df, drift)
    f = headline_figures(df, metric, lever, value)
    measured = predicted = None
    model = device = chosen = finding = ""
    extra: dict = {}
    if f:
        measured, predicted, model, device = f["measured"], f["predicted"], f["model"], f["device"]
        chosen = df.attrs.get("title") if f["value"] == "baseline" else _value_text(f["lever"], f["value"])
        extra = {k: f[k] for k in ("median_error", "points", "worst_error", "sd")}
        if drift and f["sd"] is not None:   # the repetitions' own spread, the drift's share taken out again
            extra["sd_repetitions"] = max(0.0, f["sd"] ** 2 - (f["measured"] * drift) ** 2) ** 0.5
        parts = []
        if lever is not None:
            parts.append(best_of(points(df, metric, lever), flag=_VALUE_FLAG.get(lever, lever)))
        if f["points"] > 1:
            parts.append(f"largest error at {_value_text(f['lever'], f['worst_value'])} "
                         f"({100 * f['worst_error']:+.0f} %)")
        finding = "; ".join(p for p in parts if p)
    else:
        p = df[(df["metric"] == metric) & (df["source"] == "predicted")]
        if lever is not None:
            p = p[p["lever"] == lever]
        if "fits" in p:
            p = p[p["fits"] != False]  # noqa: E712 - a configuration that does not fit is no headline
        if len(p):
            predicted, model, device = float(p["result"].iloc[-1]), p["model"].iloc[-1], p["device"].iloc[-1]
            chosen = _value_text(p["lever"].iloc[-1], p["value"].iloc[-1])
    configuration = " · ".join(x for x in (chosen, df.attrs.get("conditions") or "") if x)
    fails = df.attrs.get("failures") or []
    partial = "" if (df["source"] == "measured").any() else (
        df.attrs.get("why_not_measured")
        or (f"every measurement failed; the first ({fails[0].get('lever')} = {fails[0].get('value')}): "
            f"{fails[0].get('reason')}" if fails else "nothing was measured in this run"))
    publish_headline(measured, predicted, metric=metric.replace("_tps", ""), model=str(model), device=str(device),
                     configuration=configuration, partial=partial, finding=finding, reference=ref,
                     measured_points=measured_points(df), **extra)


def headline_memory(mem):
    """01's headline: the buffers llama.cpp reported for the measured model against the plan's prediction for the
    same buffers (MiB), with the component furthest off as the finding. Displays it; returns None."""
    ref = reference_end()
    c = compare(mem, ("model", "device", "lever", "value", "group"), metric="bytes", require=("measured", "predicted"))
    if not len(c):
        publish_headline(None, None, metric="memory", unit="MiB", partial=mem.attrs.get("why_not_measured")
                         or "llama.cpp reported no buffers in this run", reference=ref)
        return
    m, p = float(c["measured"].sum()) / MIB, float(c["predicted"].sum()) / MIB
    errs = [(float(pr) / float(me) - 1, v) for pr, me, v in zip(c["predicted"], c["measured"], c["value"]) if me]
    worst = max(errs, key=lambda e: abs(e[0])) if errs else None
    ranked = sorted(e for e, _ in errs)
    med = (ranked[len(ranked) // 2] if len(ranked) % 2 else sum(ranked[len(ranked) // 2 - 1:len(ranked) // 2 + 1]) / 2) \
        if ranked else None
    publish_headline(m, p, metric="memory", unit="MiB", model=str(c["model"].iloc[0]), device=str(c["device"].iloc[0]),
                     configuration=mem.attrs.get("conditions") or "", median_error=med, reference=ref,
                     worst_error=worst[0] if worst else None, points=len(errs),
                     finding=f"buffers in total predicted {100 * (p / m - 1):+.1f} %"
                     + (f"; furthest off: {worst[1]} ({100 * worst[0]:+.0f} %)" if worst else ""))


def headline_load(load):
    """11's headline: the time to load the model and create its context with llama.cpp's default (mmap), measured
    (median of the runs, with their spread), and the modes' ranking as the finding. Displays it; returns None."""
    ref = reference_end()
    ld = load[(load["metric"] == "load_s") & (load["source"] == "measured")] if len(load) else load
    if not len(ld):
        publish_headline(None, None, metric="load", unit="s", partial=load.attrs.get("why_not_measured")
                         or "nothing was measured in this run", reference=ref)
        return
    g = ld.groupby("value")["result"].agg(["median", "std", "count"])
    mode = "mmap" if "mmap" in g.index else g.index[0]
    fast, slow = g["median"].idxmin(), g["median"].idxmax()
    sd = float(g.loc[mode, "std"]) if g.loc[mode, "count"] > 1 else None
    publish_headline(float(g.loc[mode, "median"]), None, metric="load", unit="s", model=str(ld["model"].iloc[0]),
                     device=str(ld["device"].iloc[0]), sd=sd, points=len(g), reference=ref,
                     configuration=" · ".join(x for x in (f"load mode {mode}", load.attrs.get("conditions")) if x),
                     finding=f"fastest {fast} {g.loc[fast, 'median']:.3f} s, slowest {slow} "
                             f"{g.loc[slow, 'median']:.3f} s (medians)")


def _value_text(lever: str, value: str) -> str:
    flag = _VALUE_FLAG.get(lever, lever)
    return f"{flag} {value}".strip() if value != "baseline" else "llama.cpp's defaults"

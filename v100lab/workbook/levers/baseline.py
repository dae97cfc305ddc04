"""Notebook 03, the baseline: a real run with llama.cpp's defaults, what its load log says, and the headline measured-vs-predicted figure every notebook quotes.
"""

from __future__ import annotations

from dataclasses import replace

from v100lab.predict import memory, rates
from v100lab.measure.harness import environment
from v100lab.base.errors import RunFailed
from v100lab.workbook.render import publish_headline
from v100lab.facts.results import compare
from v100lab.workbook.scenario import Scenario
from v100lab.workbook.levers.steps import (COMPONENTS, HOST, MIB, bench_tests, capture_load, conditions, ctx_for, devices_for,
                                  gpu_backend, lever_frame, loading_study, measure_sweep, parameters, predict_rows,
                                  study)

PARAMETERS = parameters("n_gpu_layers", "n_ctx", "n_batch", "n_ubatch", "cache_type_k", "cache_type_v", "flash_attn",
                        "n_threads", "n_prompt", "n_gen", "repetitions")


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
    failures = []
    if st.measuring:
        rows += predict_rows(st.measured_spec, st.measured_label, st.host, cfg, lever="config", value="baseline",
                             n_prompt=sc.n_prompt, n_gen=sc.n_gen,
                             metrics=("tg_tps", "pp_tps", "weights_ceiling_tg_tps", "physical_ceiling_tg_tps"))
        obs, failures = measure_sweep(st, "n_ctx", [cfg.n_ctx], cfg, bench_tests(sc))

        rows += [replace(o, lever="config", value="baseline") for o in obs]
    return lever_frame(rows, failures, why_not_measured=st.why_not_measured, depth=sc.n_gen // 2,
                  conditions=conditions(cfg, st.measured_label or st.label,
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


def headline(df, metric: str = "tg_tps", lever: str | None = None, value: str | None = None):
    """Publish the notebook's headline for the batch index: the measured figure of ``metric`` on this
    machine and the prediction for the same model, device, lever value and conditions (the last pair
    :func:`v100lab.facts.results.compare` gives), with that configuration spelt out (the lever's value and the
    frame's ``conditions``). When the notebook measured nothing, the prediction alone and why (the index shows
    "ok (partial)"). Displays it; returns None (so the cell shows it once)."""
    c = compare(df, metric=metric, lever=lever, require=("measured", "predicted"))
    if value is not None:
        c = c[c["value"] == str(value)]
    measured = predicted = None
    model = device = chosen = ""
    if len(c):
        r = c.iloc[-1]
        measured, predicted = float(r["measured"]), float(r["predicted"])
        model, device = r["model"], r["device"]
        chosen = _value_text(r["lever"], r["value"])
    else:
        p = df[(df["metric"] == metric) & (df["source"] == "predicted")]
        if lever is not None:
            p = p[p["lever"] == lever]
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
                     configuration=configuration, partial=partial)


def _value_text(lever: str, value: str) -> str:
    flag = _VALUE_FLAG.get(lever, lever)
    return f"{flag} {value}".strip() if value != "baseline" else "llama.cpp's defaults"

"""Notebook 06, context and KV cache: KV memory by context and cache type, decode speed vs depth, and quantized V (which needs flash attention).
"""

from __future__ import annotations

from v100lab.gguf import llama_context
from v100lab.predict import memory
from v100lab.base.errors import RunFailed
from v100lab.facts.results import Observation
from v100lab.workbook.scenario import Scenario
from v100lab.predict.work import Placed, decode_work
from v100lab.workbook.levers.steps import (HOST, MIB, bench_tests, capture_load, conditions, ctx_for, devices_for,
                                  lever_frame, measure_sweep, parameters, predict_rows, loading_study, study)

PARAMETERS = parameters("n_ctx", "cache_type_k", "cache_type_v", "flash_attn", "swa_full", "n_threads", "ctx_sizes",
                        "cache_types", "depths", "n_gen", "repetitions")


def kv_memory(sc: Scenario):
    """KV cache (and recurrent state) bytes for every context × cache type: predicted for the scenario's
    model, and for the measured model both predicted and read from llama.cpp's load log (lever "n_ctx", the
    cache type in ``cache_type``)."""
    st = loading_study(sc, load_log=True)
    rows: list[Observation] = []
    failures: list[dict[str, str]] = []
    models = [] if st.same_model_here else [(st.spec, st.label, st.device.id, False)]
    if st.measuring:
        models.append((st.measured_spec, st.measured_label, HOST, True))
    for spec, label, dev, measure in models:
        for ct in sc.cache_types:
            for n_ctx in sc.ctx_sizes:
                cfg = sc.run_config().with_(n_ctx=n_ctx, cache_type_k=ct, cache_type_v=ct,
                                            flash_attn="on" if ct not in ("f16", "f32", "bf16") else
                                            sc.flash_attn)
                kv = llama_context.kv_cache_bytes(spec, cfg) + llama_context.recurrent_bytes(spec, cfg)
                rows.append(Observation(label, spec.file_type, dev, "n_ctx", str(n_ctx), "kv_cache_bytes", float(kv),
                                        "bytes", "predicted", cache_type=ct))
                if measure:
                    try:
                        facts = capture_load(st, cfg)
                    except RunFailed as exc:
                        failures.append({"lever": "n_ctx", "value": f"{n_ctx} {ct}", "test": "load",
                                         "reason": str(exc)})
                        continue
                    mib = facts.kv_size_mib + facts.recurrent_size_mib
                    rows.append(Observation(label, spec.file_type, dev, "n_ctx", str(n_ctx), "kv_cache_bytes",
                                            float(mib * MIB), "bytes", "measured", cache_type=ct))
    return lever_frame(rows, failures, why_not_measured=st.why_not_measured,
                  conditions=f"-fa {sc.flash_attn} (on for a quantized cache) · -np {sc.n_parallel}"
                             + (" · --swa-full" if sc.swa_full else ""))


def depth_sweep(sc: Scenario):
    """Decode speed vs tokens already in the context (llama-bench -d): measured vs predicted on this
    machine, and predicted for the scenario's model on its device (lever "n_depth")."""
    st = study(sc)
    depths = list(sc.depths)
    cfg = ctx_for(sc.run_config(), max(depths) + sc.n_gen + 1)
    rows: list[Observation] = []
    for d in depths:
        if not st.same_model_here:
            rows += predict_rows(st.spec, st.label, st.device, cfg, lever="n_depth", value=d, depth=d,
                                 n_gen=sc.n_gen, metrics=("tg_tps", "physical_ceiling_tg_tps"))
        if st.measuring:
            rows += predict_rows(st.measured_spec, st.measured_label, st.host, cfg, lever="n_depth", value=d,
                                 depth=d, n_gen=sc.n_gen, metrics=("tg_tps", "physical_ceiling_tg_tps"))
    obs, failures = measure_sweep(st, "n_depth", depths, cfg, bench_tests(sc, pp=False))
    rows += obs
    return lever_frame(rows, failures, why_not_measured=st.why_not_measured,
                  conditions=conditions(cfg, st.measured_label or st.label, depth=None,
                                        extra=[f"tg{sc.n_gen} × {sc.repetitions}"]))


def quantized_v(sc: Scenario):
    """Quantized V needs flash attention: for V = f16 and V = q8_0 with flash attention off and on, what the
    memory plan predicts (KV bytes, llama.cpp's refusal) and what llama.cpp does here when it loads."""
    import pandas as pd  # heavy third-party dependency

    st = loading_study(sc, load_log=True)
    spec = st.measured_spec if st.measuring else st.spec
    out = []
    for fa, ctv in (("off", "f16"), ("off", "q8_0"), ("on", "q8_0")):
        cfg = sc.run_config().with_(flash_attn=fa, cache_type_k="q8_0" if ctv == "q8_0" else "f16",
                                    cache_type_v=ctv)
        p = memory.plan(spec, [st.host] if st.measuring else devices_for(st.device), cfg, with_max_ctx=False)
        refused = [w for w in p.warnings if "refuses" in w]
        predicted = ("refused: " + refused[0].split(":")[0]) if refused else \
            f"loads; KV {llama_context.kv_cache_bytes(spec, cfg) / MIB:.1f} MiB"
        measured = "not measured"
        if st.measuring:
            try:
                facts = capture_load(st, cfg)
                measured = f"loaded; KV {facts.kv_size_mib:.1f} MiB, flash attention {facts.flash_attn or '?'}"
            except RunFailed as exc:
                measured = f"refused: {exc}"
        out.append({"flash attention": fa, "cache type K / V": f"{cfg.cache_type_k} / {ctv}",
                    "predicted": predicted, "llama.cpp here": measured})
    return pd.DataFrame(out)


def kv_read_per_token(sc: Scenario, depth: int, flash_attn: str | None = None) -> float:
    """KV cache bytes one decoded token reads at ``depth`` tokens of context, every layer on the scenario's
    device, with the scenario's cache types (the speed model's count; ``flash_attn`` overrides the flag)."""
    st = study(sc)
    cfg = ctx_for(sc.run_config(), depth + 1)
    if flash_attn is not None:
        cfg = cfg.with_(flash_attn=flash_attn)
    placed = {st.device.id: Placed(st.device, tuple(range(st.spec.n_layer)), True)}
    return sum(w.kv_bytes for w in decode_work(st.spec, placed, cfg, depth).values())

"""Notebook 04, quantization: the quant ladder's speed and file size measured vs predicted, and its quality (perplexity, KL divergence).
"""

from __future__ import annotations

from dataclasses import replace

from v100lab.measure import harness, quality
from v100lab.models import zoo
from v100lab.gguf.header import read_spec
from v100lab.facts.results import Observation
from v100lab.workbook.scenario import Scenario
from v100lab.gguf.skeleton import arch_spec_of, skeleton_spec
from v100lab.workbook.levers.by_hand import value_of
from v100lab.workbook.levers.steps import (HOST, bench_tests, conditions, ctx_for, lever_frame, measured_rows,
                                  parameters, predict_rows, spec_at_quant, loading_study, study, threads_text)
from v100lab.workbook.levers.triangle import quant_specs

PARAMETERS = parameters("n_threads", "quants", "ladder_model", "n_prompt", "n_gen", "repetitions", "perplexity_ctx",
                        "perplexity_chunks")


def quant_ladder(sc: Scenario):
    """The quant ladder. When measuring: ``ladder_model``'s real ladder, built here by llama.cpp's quantizer
    and measured (decode, prompt, file size) beside the prediction from each file's own header; otherwise the scenario's
    model predicted on its device per quant (decode, prompt, file bytes). Lever "quant"."""
    st = loading_study(sc)
    cfg = ctx_for(sc.run_config(), sc.n_prompt + sc.n_gen + 1)
    rows: list[Observation] = []
    base_label = st.label
    for q, spec in (quant_specs(sc).items() if not st.measuring else ()):
        rows += predict_rows(spec, base_label, st.device, cfg, lever="quant", value=q, n_prompt=sc.n_prompt,
                             n_gen=sc.n_gen, metrics=("tg_tps", "pp_tps", "physical_ceiling_tg_tps"))
        rows.append(Observation(base_label, q, st.device.id, "quant", q, "file_bytes",
                                float(spec.weight_bytes + spec.header_bytes), "bytes", "predicted",
                                note="header + weights at llama-quantize's type mixture"))
    failures: list[dict[str, str]] = []
    if st.measuring:
        alias = sc.ladder_model
        paths = zoo.ladder(alias, tuple(q.upper() for q in sc.quants))
        label = f"{alias} (synthetic ladder)"
        f16 = read_spec(paths["F16"])
        a = arch_spec_of(f16)
        for q in [q.upper() for q in sc.quants]:
            path = paths[q]
            spec = read_spec(path)
            rows += predict_rows(spec, label, st.host, cfg, lever="quant", value=q, n_prompt=sc.n_prompt,
                                 n_gen=sc.n_gen, metrics=("tg_tps", "pp_tps", "physical_ceiling_tg_tps"))
            rows.append(Observation(label, q, HOST, "quant", q, "file_bytes", float(path.stat().st_size), "bytes",
                                    "measured", note=path.name))
            if a is not None:
                ps = skeleton_spec(a, q)
                rows.append(Observation(label, q, HOST, "quant", q, "file_bytes",
                                        float(ps.weight_bytes + ps.header_bytes), "bytes", "predicted",
                                        note="header + weights at llama-quantize's type mixture"))
        got = harness.sweep(str(paths[sc.quants[0].upper()]), cfg, "model", [str(paths[q.upper()]) for q in sc.quants],
                          tests=bench_tests(sc), repetitions=sc.repetitions, progress=False, monitor=False)
        obs, failures = measured_rows(got, label)
        rows += [replace(o, lever="quant", value=o.quant) for o in obs]
    return lever_frame(rows, failures, why_not_measured=st.why_not_measured, ladder_model=sc.ladder_model,
                  depth=sc.n_gen // 2,
                  conditions=conditions(cfg, f"{sc.ladder_model} (synthetic ladder)" if st.measuring else st.label,
                                        depth=f"0 (pp{sc.n_prompt}, tg{sc.n_gen} × {sc.repetitions})"))


QUALITY_LADDER = "default"


def quality_ladder(sc: Scenario):
    """Quality per quant, measured: perplexity of each rung of the default model's real ladder (SmolLM2-135M,
    its Q4_1 weights dequantized to F16 by llama.cpp as the reference) and its KL divergence from the
    reference, on Python's own ``pydoc_data.topics`` text. Empty (with the reason) when not measuring."""
    rows: list[Observation] = []
    if not sc.measure:
        return lever_frame(rows, why_not_measured="the scenario says measure: false",
                      corpus=quality.CORPUS_NAME)
    if study(sc).remote:     # the ladder is loaded here, rung by rung: not what a remote server measures
        return lever_frame(rows, why_not_measured=study(sc).why_not_restarted(), corpus=quality.CORPUS_NAME)
    ref = f"{QUALITY_LADDER}:F16"
    results = [quality.evaluate(ref, None, n_ctx=sc.perplexity_ctx, n_chunks=sc.perplexity_chunks,
                                n_threads=sc.n_threads or None)]
    for q in sc.quants:
        results.append(quality.evaluate(f"{QUALITY_LADDER}:{q.upper()}", ref, n_ctx=sc.perplexity_ctx,
                                        n_chunks=sc.perplexity_chunks, n_threads=sc.n_threads or None))
    rows = quality.ladder_observations(results, "SmolLM2-135M (default ladder)")
    return lever_frame(rows, corpus=quality.CORPUS_NAME, reference=ref, why_not_measured="",
                  conditions=f"{sc.perplexity_chunks} chunk(s) of {sc.perplexity_ctx} tokens per quant · "
                             f"{threads_text(sc.n_threads)}")


def rung_spec(sc: Scenario, quant: str):
    """The header of one rung of the ladder this notebook shows: the file built here when measuring (the
    ``ladder_model``'s), else the scenario's model described at ``quant``."""
    q = quant.upper()
    if loading_study(sc).measuring:
        return read_spec(zoo.ladder(sc.ladder_model, tuple(x.upper() for x in sc.quants))[q])
    return spec_at_quant(sc.model, q)


def file_size(ladder, quant: str) -> float | None:
    """A rung's file size in the ladder frame: the file written by llama.cpp's quantizer when it was built
    here (measured), else the predicted size."""
    q = quant.upper()
    measured = value_of(ladder, metric="file_bytes", value=q, source="measured")
    return measured if measured is not None else value_of(ladder, metric="file_bytes", value=q, source="predicted")

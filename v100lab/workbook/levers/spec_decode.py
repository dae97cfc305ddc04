"""Notebook 13, speculative decoding: n-gram self-speculation measured through llama-server over draft lengths,
on a prompt that repeats itself (editing a code block) and one that does not, beside the prediction from the
measured acceptance (:mod:`v100lab.predict.speculative`); and the seed's V100 with an MTP head, predicted.

One llama-server per draft length (``--spec-type ngram-simple``; draft length 0 is the server without
speculation), each prompt completed ``repetitions`` times, greedy. Metrics: ``tg_tps`` (llama-server's
``predicted_per_second``), ``acceptance`` (``draft_n_accepted / draft_n``), ``alpha`` (per-token acceptance
from it, :func:`v100lab.predict.speculative.alpha_from_rate`). The prediction takes the measured acceptance and
drafted count, the measured speed without speculation, and the package's cost of verifying k tokens relative
to one (:func:`v100lab.predict.speculative.verify_time` on this machine: its batched-decode curve when calibrated).
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from v100lab.predict import speculative, speed
from v100lab.measure.backends.server import ServerBackend, find_llama_server
from v100lab.base.errors import V100labError
from v100lab.facts.results import TPS, Observation
from v100lab.workbook.scenario import Scenario
from v100lab.advise.seed import seed_mtp_stage
from v100lab.workbook.levers.captions import _caption, _not_measured
from v100lab.workbook.levers.steps import conditions, ctx_for, devices_for, lever_frame, parameters, study
from v100lab.workbook.levers.summaries import _failures_line
from v100lab.workbook.levers.text import fmt, markdown, md

log = logging.getLogger(__name__)

PARAMETERS = parameters("n_ctx", "n_threads", "repetitions")

LEVER = "draft_max"
SPEC_TYPE = "ngram-simple"
DRAFT_LENGTHS = (1, 2, 4, 8)
NGRAM_SIZE_N = 2          # lookup length (1 at draft length 1: ngram-simple never drafts fewer tokens than it,
                          # common/ngram-map.cpp); one token matches too many places to draft well
N_GEN = 64                # tokens generated per completion
MAX_REPETITIONS = 3       # per prompt and draft length: the whole sweep stays within about a minute here

# A prompt whose answer repeats it (a code block to edit, shown twice so that a small model copies it) and one
# whose answer does not (a story).
_CODE = '''def mean(values):
    total = 0
    for v in values:
        total += v
    return total / len(values)


def variance(values):
    m = mean(values)
    total = 0
    for v in values:
        total += (v - m) ** 2
    return total / len(values)
'''
PROMPTS = {
    "repetitive": ("```python\n" + _CODE + "```\n\nThe same code again, unchanged:\n\n```python\n" + _CODE
                   + "```\n\nThe same code again, with `total` renamed to `acc`:\n\n```python\n"),
    "non-repetitive": "Write a short story about a lighthouse keeper who finds a map in a bottle. Once upon a time,",
}


@dataclass(frozen=True)
class Completion:
    """One measured completion: llama-server's timings."""

    prompt: str
    draft_max: int
    tps: float
    n_gen: int
    draft_n: int
    accepted: int


@lru_cache(maxsize=4)
def _measure(sc: Scenario) -> tuple[tuple[Completion, ...], tuple[Mapping[str, str], ...], str]:
    """Every (draft length, prompt, repetition) measured once per scenario: (completions, failures, why not)."""
    st = study(sc)
    if not st.measuring:
        return (), (), st.why_not_measured
    if st.remote:
        return (), (), st.why_not_restarted()
    if find_llama_server() is None:
        return (), (), "no llama-server here (scripts/build-tools.sh builds it)"
    out: list[Completion] = []
    failures: list[Mapping[str, str]] = []
    for n in (0, *DRAFT_LENGTHS):
        cfg = config_for(sc, n)
        try:
            with ServerBackend().open(st.measured_path, cfg) as session:
                session.complete(PROMPTS["non-repetitive"], 4)          # warm-up, unrecorded
                for name, text in PROMPTS.items():
                    for _ in range(min(MAX_REPETITIONS, max(1, sc.repetitions))):
                        tm = session.complete(text, N_GEN)["timings"]
                        out.append(Completion(name, n, float(tm["predicted_per_second"]), int(tm["predicted_n"]),
                                              int(tm.get("draft_n") or 0), int(tm.get("draft_n_accepted") or 0)))
        except V100labError as exc:
            log.warning("draft-max %d: %s", n, exc)
            failures.append({"lever": LEVER, "value": str(n), "reason": str(exc).splitlines()[0]})
    return tuple(out), tuple(failures), ""


def config_for(sc: Scenario, n: int):
    """The scenario's flags with n-gram self-speculation drafting ``n`` tokens (0: no speculation)."""
    base = ctx_for(sc.run_config().with_(use_mlock=False, n_parallel=1), 512)
    if n == 0:
        return base
    return base.with_(spec_type=SPEC_TYPE, draft_max=n, ngram_size_n=min(NGRAM_SIZE_N, n))


def verify_ratios(sc: Scenario) -> dict[int, float]:
    """The package's cost of verifying k tokens of one sequence relative to one, on this machine."""
    st = study(sc)
    spec = st.measured_spec or st.spec
    cfg = config_for(sc, 0)
    one = speculative.verify_time(spec, st.host, cfg, 1)
    return {k: speculative.verify_time(spec, st.host, cfg, k) / one for k in {1, *(n + 1 for n in DRAFT_LENGTHS)}}


def _med(xs) -> tuple[float, float]:
    xs = list(xs)
    return statistics.median(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def spec_sweep(sc: Scenario):
    """Measured tok/s and acceptance over draft lengths for both prompts, and the tok/s predicted from the
    measured acceptance (lever ``draft_max``; ``group`` names the prompt)."""
    st = study(sc)
    done, failures, why = _measure(sc)
    label = st.measured_label or st.label
    quant = (st.measured_spec or st.spec).file_type
    rows: list[Observation] = []
    ratios = verify_ratios(sc) if done else {}
    for name in PROMPTS:
        plain = [c for c in done if c.prompt == name and c.draft_max == 0]
        if not plain:
            continue
        t1 = 1.0 / statistics.median(c.tps for c in plain)
        for n in (0, *DRAFT_LENGTHS):
            cs = [c for c in done if c.prompt == name and c.draft_max == n]
            if not cs:
                continue
            tps, sd = _med(c.tps for c in cs)
            common = dict(model=label, quant=quant, device="host", lever=LEVER, value=str(n), group=name,
                          repetitions=len(cs))
            rows.append(Observation(metric="tg_tps", result=tps, unit=TPS, source="measured", sd=sd,
                                    note="no speculation" if n == 0 else f"{SPEC_TYPE}", **common))
            if n == 0:
                continue
            drafted, acc = sum(c.draft_n for c in cs), sum(c.accepted for c in cs)
            rate = acc / drafted if drafted else 0.0
            rows.append(Observation(metric="acceptance", result=rate, unit="", source="measured",
                                    note=f"{acc} of {drafted} drafted tokens accepted", **common))
            rows.append(Observation(metric="alpha", result=speculative.alpha_from_rate(rate, n), unit="",
                                    source="measured", note="per-token acceptance from the ratio", **common))
            preds = [speculative.tps_from_counts(c.n_gen, c.draft_n, c.accepted, n, lambda k: t1 * ratios[k])
                     for c in cs]
            rows.append(Observation(metric="tg_tps", result=statistics.median(preds), unit=TPS, source="predicted",
                                    note="from the measured acceptance and speed without speculation", **common))
    return lever_frame(rows, failures, why_not_measured=why,
                       conditions=conditions(config_for(sc, 0), label, depth=f"prompt + {N_GEN} generated",
                                             extra=[f"--spec-type {SPEC_TYPE}, lookup length {NGRAM_SIZE_N} "
                                                    "(1 at draft length 1)"]))


def best_draft_rows(df) -> dict[str, Any]:
    """Per prompt: the draft length with the highest measured tok/s, its speed-up over no speculation."""
    out = {}
    m = df[(df.metric == "tg_tps") & (df.source == "measured")]
    for name, g in m.groupby("group"):
        base = g[g.value == "0"].result
        best = g.loc[g.result.idxmax()]
        out[name] = {"draft_max": int(best.value), "tg_tps": float(best.result),
                     "speedup": float(best.result / base.iloc[0]) if len(base) else None}
    return out


def median_error(df) -> float | None:
    """Median |predicted − measured| / measured of tok/s over the speculative configurations measured."""
    m = df[df.metric == "tg_tps"]
    meas = m[m.source == "measured"].set_index(["group", "value"]).result
    pred = m[m.source == "predicted"].set_index(["group", "value"]).result
    both = pred.index.intersection(meas.index)
    if not len(both):
        return None
    return float(((pred[both] - meas[both]).abs() / meas[both]).median())


def spec_ceiling(sc: Scenario, alpha: float, n: int) -> float:
    """The ceiling for speculative decode of the scenario's model on its device: the seed's plain ceiling
    (bandwidth ÷ weight bytes) × tokens per pass at per-token acceptance ``alpha`` and draft length ``n``."""
    st = study(sc)
    return speculative.speculative_ceiling(speed.ceiling_tps(st.spec.weight_bytes, st.device.bandwidth_gbs), alpha, n)


def what_if(sc: Scenario, alphas=(0.3, 0.5, 0.7, 0.9), n_max: int = 8):
    """Predicted tok/s on the scenario's device over draft lengths for a few acceptances (n-gram drafting,
    free): where a longer draft stops paying (lever ``draft_max``, ``group`` = α)."""
    st = study(sc)
    devs = devices_for(st.device)
    cfg = config_for(sc, 0)
    vt = {k: speculative.verify_time(st.spec, devs, cfg, k) for k in range(1, n_max + 2)}
    rows = []
    for a in alphas:
        best_n, best = speculative.best_draft(a, vt.__getitem__, 0.0, n_max)
        for n in range(0, n_max + 1):
            rows.append(Observation(model=st.label, quant=st.spec.file_type, device=st.device.id, lever=LEVER,
                                    value=str(n), metric="tg_tps", result=speculative.speed_tps(a, n, vt[n + 1], 0.0),
                                    unit=TPS, source="predicted", group=f"α {a:g}",
                                    note=f"best draft length {best_n} ({best:.1f} tok/s)"))
    return lever_frame(rows, conditions=conditions(cfg, st.label, depth=0, extra=["n-gram drafting (no draft cost)"]))


def seed_mtp(sc: Scenario):
    """The seed's last stage on its V100 with an MTP head (draft length 2, α assumed), predicted."""
    return lever_frame(seed_mtp_stage())


def caption_speculative(sc: Scenario, df):
    """Under the sweep: per prompt the best draft length and its speed-up, the acceptance there, and the
    prediction's median error over the configurations measured."""
    out = []
    best = best_draft_rows(df)
    for name, b in best.items():
        acc = df[(df.metric == "acceptance") & (df.group == name) & (df.value == str(b["draft_max"]))].result
        a = f", {float(acc.iloc[0]):.0%} of drafted tokens accepted" if len(acc) else ""
        if b["draft_max"] == 0:
            out.append(md("{name} prompt: no draft length beat decoding without speculation ({t} tok/s).",
                          name=name.capitalize(), t=fmt(b["tg_tps"])))
        else:
            out.append(md("{name} prompt: best at draft length {n}, {t} tok/s = {s}× no speculation{a}.",
                          name=name.capitalize(), n=b["draft_max"], t=fmt(b["tg_tps"]), s=f"{b['speedup']:.2f}",
                          a=a))
    err = median_error(df)
    if err is not None:
        out.append(md("Predicted from the measured acceptance: median |error| {e} over the {k} configurations.",
                      e=f"{100 * err:.1f} %", k=int(((df.metric == "tg_tps") & (df.source == "predicted")).sum())))
    return _caption(*out, _not_measured(df))


def summary_speculative(sc: Scenario, df, what=None, mtp=None):
    """Speculative decoding, in sentences: the sweep's best draft lengths and acceptance per prompt, the
    prediction's error, where a longer draft stops paying on the device (``what``), the seed's V100 with MTP."""
    lines = []
    for name, b in best_draft_rows(df).items():
        acc = df[(df.metric == "acceptance") & (df.group == name)]
        rng = f"{acc.result.min():.0%}–{acc.result.max():.0%}" if len(acc) else "—"
        lines.append(md("{name} prompt: {a} of drafted tokens accepted over draft lengths {ns}; best measured: draft "
                        "length {n} at {t} tok/s ({s}× no speculation).", name=name.capitalize(), a=rng,
                        ns=", ".join(map(str, DRAFT_LENGTHS)), n=b["draft_max"], t=fmt(b["tg_tps"]),
                        s=f"{b['speedup']:.2f}" if b["speedup"] else "—"))
    err = median_error(df)
    if err is not None:
        lines.append(md("Predicted from the measured acceptance, tok/s has a median |error| of {e}.",
                        e=f"{100 * err:.1f} %"))
    elif df.attrs.get("why_not_measured"):
        lines.append(md("Nothing measured: {why}.", why=df.attrs["why_not_measured"]))
    if what is not None and len(what):
        for name, g in what.groupby("group", sort=False):
            best = g.loc[g.result.idxmax()]
            lines.append(md("On {dev} at {a}: best draft length {n}, {t} tok/s predicted.", dev=best.device,
                            a=name, n=best.value, t=fmt(best.result)))
    if mtp is not None and len(mtp):
        t = mtp[mtp.metric == "tg_tps"].iloc[0]
        c = mtp[mtp.metric == "speculative_ceiling_tg_tps"].iloc[0]
        lines.append(md("The seed's V100 with MTP (predicted, {note}): {t} tok/s; the ceiling for speculative "
                        "decode is {c} tok/s.", note=t.note.split(";")[0], t=fmt(t.result), c=fmt(c.result)))
    lines.append(_failures_line(df))
    return markdown(lines)


def caption_spec_what_if(sc: Scenario, what):
    """Under the what-if: per α the best draft length on the device and its gain over plain decode."""
    out = []
    for name, g in what.groupby("group", sort=False):
        best = g.loc[g.result.idxmax()]
        plain = g[g.value == "0"].result
        gain = f"{best.result / plain.iloc[0]:.2f}×" if len(plain) and plain.iloc[0] else "—"
        out.append(md("{a}: best at {n} drafted, {t} tok/s ({g} plain).", a=name, n=best.value, t=fmt(best.result),
                      g=gain))
    return _caption(*out)

"""Validate the speed model: (a) this machine, (b) published Apple Silicon rows, (c) the seed's staircase.

    flock /tmp/v100lab-measure.lock .venv/bin/python benchmarks/bench_speed.py            # all three parts
    .venv/bin/python benchmarks/bench_speed.py --part apple,seed                          # no measuring

(a) needs a calibrated host (``v100lab calibrate --precise``: the full procedure; a quick profile is judged too,
and the table says which plan made it). Calibration measured only its own synthetic models
(``calib-wide`` pure-type rungs, ``calib-deep``); every configuration judged here uses other models —
the synth-750m quant ladder (llama.cpp's usual mixes), the default model (SmolLM2-135M Q4_1) and
gemma3-270m (Q4_K_M, sliding window) — and the script refuses to judge a calibration model.
Measured: llama-bench's method through the in-process backend (warmup, then the median of ``-r``
repetitions, CV recorded, a noisy test rerun; the median of ``--passes`` passes, a prompt loaded
calibration.PROMPT_LOADS times a pass). tg is predicted at depth + n_gen / 2 (the middle of
the generated tokens). With ``--part host,llamabench`` llama-bench's passes run between the host part's (before each
and after the last), so that both medians cover the same minutes.

(b) each chip predicted by a fit on the *other* chips (leave-one-chip-out); in-sample figures are printed
only to show how optimistic they would be. (c) predicted tok/s on v100-16gb per stage beside the claims;
claims above the physical ceiling are marked impossible.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Callable

from v100lab.measure import calibration, drift_check
from v100lab.facts import devices
from v100lab.predict import rates, speed
from v100lab.advise import seed
from v100lab.models import zoo
from v100lab.facts.config import RunConfig
from v100lab.facts.devices import get_device
from v100lab.base.errors import V100labError
from v100lab.gguf.header import read_spec

N_GEN = 32
N_PROMPT = 512

# (alias, threads, depth, with pp512) — the validation set; none of these models is used by calibration
VALIDATION = (
    [(f"synth-750m:{q}", 2, 0, True) for q in ("F16",) + zoo.LADDER]
    + [(f"synth-750m:{q}", 1, 0, False) for q in ("Q8_0", "Q4_K_M", "Q4_0", "Q2_K")]
    + [("synth-750m:Q4_K_M", 2, 1024, False), ("synth-750m:Q4_0", 2, 2048, False)]
    + [("default", 2, d, d == 0) for d in (0, 1024, 4096)] + [("default", 1, 0, True)]
    + [("gemma3-270m", 2, d, d == 0) for d in (0, 1024, 4096)] + [("gemma3-270m", 1, 0, True)]
)

# one model per architecture beyond llama, at the usual mix: a hybrid (gated delta net +
# full attention), routed experts, sliding-window attention, MLA (deepseek2) — depths 0-4096, 1 and 2 threads
ARCH_VALIDATION = tuple(
    (alias, th, d, d == 0)
    for alias in ("synth-qwen35-500m:Q4_K_M", "synth-qwen3moe-500m:Q4_K_M", "synth-gemma3-500m:Q4_K_M",
                  "synth-deepseek2-500m:Q4_K_M")
    for th, d in ((2, 0), (2, 1024), (2, 4096), (1, 0), (1, 1024))) + tuple(
    # their tiny siblings (a few MB: the output matrix is most of a token), the same configurations but depth 4096
    (f"{alias}:Q4_K_M", th, d, d == 0)
    for alias in ("synth-qwen35-tiny", "synth-qwen3moe-tiny", "synth-gemma3-tiny", "synth-deepseek2-tiny")
    for th, d in ((2, 0), (2, 1024), (1, 0), (1, 1024)))


def _n_ctx(depth: int) -> int:
    return max(1024, ((depth + max(N_GEN, N_PROMPT) + 256) // 256 + 1) * 256)


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


# what CI can afford after its tests, on all its cores (the thread count `.ci/run`
# calibrates): the default model (tg at two depths, pp) and two rungs of a synthetic ladder, built in seconds
CI_THREADS = os.cpu_count() or 1
CI_VALIDATION = (
    [("default", CI_THREADS, 0, True), ("default", CI_THREADS, 1024, False)]
    + [("synth-280m:Q4_K_M", CI_THREADS, 0, True), ("synth-280m:Q8_0", CI_THREADS, 0, False)]
)


class DriftReferences:
    """Drift checks (:func:`v100lab.measure.drift_check.check`: calibration's own rungs, the files calibration measured) before
    each validation pass and after the last, at each thread count the validation uses that calibration has. Rows are
    judged as measured; the corrected errors beside them predict each row with the stored calibration brought up to
    the phase the references saw (:func:`v100lab.measure.drift_check.combine` of every reference, applied as ``v100lab
    calibrate --check`` applies a check: :func:`v100lab.predict.drift_scaling.scaled_fit`) — with the
    :data:`calibration.DEPTH_TYPE` rung only, or with every type's (``types``). On a shared VM the Q4_0 rung can run
    5-31 % slower an hour after calibration and at its speed again minutes later, and in a fast phase K-quant and F16
    rows ran 12-49 % above their prediction while the Q4_0 rung ran 6 % above its figure: hence the by-type
    correction."""

    #: loads of a rung at each reference: on a 2-core Zen 3 VM the rung's speed moved with an sd of 5-10 % between runs
    #: of one load a few seconds apart; the run's ratio is the median of every reference's loads
    LOADS = 2

    def __init__(self, cal: dict, threads, types=(calibration.DEPTH_TYPE,)) -> None:
        self.cal, self.types = cal, tuple(types)
        calibrated = {int(k) for k in cal.get("threads") or {}}
        self.threads = sorted(th for th in set(threads) if th in calibrated)
        self.records: list[dict] = []

    def run(self) -> None:
        if not self.threads:
            return
        self.records.append(drift_check.check(self.cal, threads=self.threads, types=self.types, loads=self.LOADS,
                                              progress=lambda m: print(f"  drift reference: {m}", file=sys.stderr,
                                                                       flush=True)))

    def combined(self) -> dict | None:
        return drift_check.combine(self.records)

    def profiles(self) -> dict[str, dict]:
        """name → the host profile with the references applied (:func:`corrected_profiles`)."""
        rec = self.combined()
        return corrected_profiles(calibration_only_profile(), rec, by_type=len(self.types) > 1) if rec else {}

    def summary(self) -> dict | None:
        rec = self.combined()
        if not rec:
            return None
        return {"references": len(self.records), "at_utc": [r.get("measured_at") for r in self.records],
                "rungs": rec["rungs"], "bandwidth_gbs": rec.get("bandwidth_gbs")}


def corrected_profiles(profile: dict, record: dict, by_type: bool = True) -> dict[str, dict]:
    """name → ``profile`` (the calibration's own, no check) with a drift ``record`` applied: ``base`` (the
    DEPTH_TYPE rung's ratio for every type) and, with ``by_type``, ``by_type`` (each type's own rung)."""
    out = {"base": drift_check.with_check(profile, drift_check.only_types(record, [calibration.DEPTH_TYPE]))}
    if by_type:
        out["by_type"] = drift_check.with_check(profile, record)
    return out


def predict_row(spec, test: str, depth: int, threads: int, profile: dict | None = None):
    """The prediction a validation row is judged on: tg at the generated tokens' middle depth (depth + N_GEN / 2),
    pp512 from ``depth``, in the row's context, on the host (``profile``: the host profile to predict from)."""
    cfg = RunConfig(n_ctx=_n_ctx(depth), n_threads=threads, n_gpu_layers=0)
    if test == "tg":
        return speed.predict(spec, [get_device("host")], cfg, depth=depth + N_GEN // 2, profile=profile)
    return speed.predict(spec, [get_device("host")], cfg, depth=depth, n_prompt=N_PROMPT, profile=profile)


def predict_llamabench(spec, threads: int, n_gen: int, profile: dict | None = None) -> float:
    """The decode tok/s a llama-bench tg``n_gen`` row is judged on: at its generated tokens' middle depth."""
    cfg = RunConfig(n_ctx=max(512, n_gen + 256), n_threads=threads, n_gpu_layers=0)
    return speed.predict(spec, [get_device("host")], cfg, depth=n_gen // 2, profile=profile).tg_tps


def calibration_only_profile() -> dict:
    """The stored host profile without a drift check (``v100lab calibrate --check``): the raw predictions judged here
    are the calibration's own, whatever a user applied since."""
    return drift_check.without_check(devices.read_host_profile() or {})


def host_part(quick: bool, repetitions: int, validation=VALIDATION, passes: int = 2,
              between: Callable[[], None] | None = None, prompt_loads: int = calibration.PROMPT_LOADS,
              drift_types=(calibration.DEPTH_TYPE,), refs: list | None = None) -> dict:
    """Measure every configuration in ``passes`` passes minutes apart, keep each test's median pass (as
    calibration does: calibration.CALIB_PASSES), then predict it from the stored calibration. ``between`` runs
    before each pass and after the last (the llama-bench passes, spread over the same minutes); so does the drift
    reference (:class:`DriftReferences`, on the calibration rungs of ``drift_types``; none when ``drift_types`` is
    empty), which is appended to ``refs`` when given (for the llama-bench part's corrected figures)."""
    cal = rates.stored_calibration()
    if not cal:
        sys.exit("bench_speed: no calibration stored for this host; run `v100lab calibrate` first")
    stems = calibration.calibration_stems()
    rows = []
    configs = validation[::3] if quick else validation
    # every model resolved (and refused if it is a calibration model) before anything is measured: a model missing
    # late in a pass (an optional package not installed) once lost a whole pass's measurements
    paths = {}
    for alias, *_ in configs:
        if alias not in paths:
            try:
                paths[alias] = zoo.model_path(alias)
            except V100labError as exc:
                sys.exit(f"bench_speed: {exc}")
            if any(paths[alias].name.startswith(s) for s in stems):
                sys.exit(f"bench_speed: {alias} is a calibration model; refusing to judge on it")
    ref = DriftReferences(cal, [c[1] for c in configs], drift_types) if drift_types else None
    if ref is not None and refs is not None:
        refs.append(ref)
    hooks = [h for h in (ref.run if ref else None, between) if h]

    def between_passes() -> None:
        for hook in hooks:
            hook()

    measured: dict[int, dict] = {}
    # each row once a pass (decode, and its prompt where it has one), and each prompt ``prompt_loads`` - 1 more
    # times, alone, in rounds spread through the pass: its figure moves by up to 44 % between passes; as
    # calibration's prompt points are loaded (pass_order)
    plan = calibration.spread_rounds([(i, False) for i in range(len(configs))],
                                     [(i, True) for i, c in enumerate(configs) if c[3]], max(0, prompt_loads - 1))
    # a row's filled context is kept for its later passes (calibration's depth_states): the fills cost no pass
    # but the first
    with calibration.kept_fills() as states:
        for k in range(passes):
            between_passes()
            for i, pp_only in plan:
                alias, threads, depth, with_pp = configs[i]
                path = paths[alias]
                t0 = time.perf_counter()
                m = calibration.measure(path, threads, depth=depth, n_gen=0 if pp_only else N_GEN,
                                        n_prompt=N_PROMPT if with_pp else 0, repetitions=repetitions,
                                        n_ctx=_n_ctx(depth), depth_states=states)
                measured[i] = calibration.combine_passes(measured.get(i), m)
                shown = f"pp {1 / m['pp'].s_per_token:7.2f}" if pp_only else f"tg {1 / m['tg'].s_per_token:7.2f}"
                print(f"  pass {k + 1}/{passes} {alias:<20} t{threads} d{depth:<5} {shown}"
                      f" ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    between_passes()
    corrected = ref.profiles() if ref else {}
    raw = calibration_only_profile()
    for i, (alias, threads, depth, with_pp) in enumerate(configs):
        spec = read_spec(zoo.model_path(alias))
        m = measured[i]

        def predicted(test: str, profile=None) -> float:
            p = predict_row(spec, test, depth, threads, profile)
            return p.tg_tps if test == "tg" else p.pp_tps

        p_tg = predict_row(spec, "tg", depth, threads, raw)
        p_pp = predict_row(spec, "pp", depth, threads, raw) if with_pp else None
        for test, meas, pred in (("tg", m["tg"], p_tg.tg_tps), ("pp", m.get("pp"), p_pp.pp_tps if p_pp else None)):
            if meas is None:
                continue
            mt = 1.0 / meas.s_per_token
            passes_tps = [1.0 / x for x in meas.pass_best] if meas.pass_best else [mt]
            # the same row predicted from the calibration brought up to the references' phase (DriftReferences)
            fixed = {name: predicted(test, prof) / mt - 1 for name, prof in corrected.items()}
            rows.append({"model": alias, "arch": spec.architecture, "file_type": spec.file_type, "threads": threads,
                         "depth": depth,
                         "test": f"{test}{N_GEN if test == 'tg' else N_PROMPT}", "measured_tps": round(mt, 2),
                         "cv": round(meas.cv, 4), "spread": round(meas.spread, 4),
                         "predicted_tps": round(pred, 2), "error": pred / mt - 1,
                         "error_drift_corrected": fixed.get("base"), "pass_tps": [round(x, 2) for x in passes_tps],
                         "error_drift_by_type": fixed.get("by_type"),
                         "bound": p_tg.bound if test == "tg" else p_pp.pp_bound,
                         "weights_ceiling_tg_tps": round(p_tg.weights_ceiling_tg_tps, 1) if test == "tg" else None,
                         "above_ceiling": bool(test == "tg" and mt > p_tg.physical_ceiling_tg_tps)})
    out = {"rows": rows, "calibration_points": [p["config"] for p in cal.get("points", [])][:20],
           "calibration_measured_at": cal.get("measured_at"), "calibration_plan": cal.get("plan") or "precise", "drift_reference": ref.summary() if ref else None}
    for test in ("tg", "pp"):
        errs = [abs(r["error"]) for r in rows if r["test"].startswith(test)]
        if errs:
            out[f"{test}_median_abs_error"] = statistics.median(errs)
            out[f"{test}_worst_abs_error"] = max(errs)
            out[f"{test}_n"] = len(errs)
        for key, name in (("error_drift_corrected", "drift_corrected"), ("error_drift_by_type", "drift_by_type")):
            fixed = [abs(r[key]) for r in rows if r["test"].startswith(test) and r.get(key) is not None]
            if fixed:
                out[f"{test}_{name}_median_abs_error"] = statistics.median(fixed)
                out[f"{test}_{name}_worst_abs_error"] = max(fixed)
        for arch in sorted({r["arch"] for r in rows}):
            errs = [abs(r["error"]) for r in rows if r["test"].startswith(test) and r["arch"] == arch]
            if errs:
                out.setdefault("by_arch", {}).setdefault(arch, {}).update(
                    {f"{test}_median_abs_error": statistics.median(errs), f"{test}_worst_abs_error": max(errs),
                     f"{test}_n": len(errs)})
    return out


class LlamaBenchPasses:
    """The default model's host prediction against llama.cpp's own llama-bench
    (the same-commit build of scripts/build-tools.sh), tg64 and tg128 at 1 and 2 threads, in ``passes`` runs
    minutes apart. Each run's mean (llama-bench's figure) and fastest repetition are kept; the prediction is
    judged against the median of the passes' means (as calibration keeps the median pass), every pass shown.

    :meth:`run_pass` runs one pass (nothing once ``passes`` have run); with the host part the passes are spread
    between its passes (``main``), so that llama-bench's median and the harness's cover the same minutes of a
    shared VM's phases, as calibration's passes do: four passes back to back take only 3 minutes, and llama-bench
    can measure the default model 16 % faster than the harness did minutes before."""

    def __init__(self, passes: int = 3, threads=(1, 2), n_gens=(64, 128), repetitions: int = 5):
        from v100lab.measure.llamabench import find_llama_bench

        self.passes, self.threads, self.n_gens, self.repetitions = passes, threads, n_gens, repetitions
        self.binary = find_llama_bench()
        self.done = 0
        self.started_at: list[str] = []
        self.got: dict[tuple[int, int], dict] = {}
        if self.binary is None:
            print("bench_speed: llama-bench not found (scripts/build-tools.sh); the llama-bench part is skipped",
                  file=sys.stderr)

    def run_pass(self) -> None:
        from v100lab.measure.backends import BenchTest
        from v100lab.measure.llamabench import run_llama_bench

        if self.binary is None or self.done >= self.passes:
            return
        path = zoo.model_path("default")
        self.started_at.append(time.strftime("%H:%M:%S", time.gmtime()))
        for th in self.threads:
            cfg = RunConfig(n_threads=th, n_gpu_layers=0, flash_attn="auto")
            for r in run_llama_bench(path, cfg, [BenchTest(n_gen=n) for n in self.n_gens],
                                     repetitions=self.repetitions, binary=self.binary, timeout=600):
                g = self.got.setdefault((th, int(r["n_gen"])), {"means": [], "best": 0.0})
                g["means"].append(float(r["avg_ts"]))
                g["best"] = max([g["best"]] + [float(x) for x in r.get("samples_ts") or []])
            print(f"  llama-bench pass {self.done + 1}/{self.passes} t{th}: " + ", ".join(
                f"tg{n} {self.got[(th, n)]['means'][-1]:.1f}" for n in self.n_gens), file=sys.stderr, flush=True)
        self.done += 1

    def result(self, corrected: dict | None = None) -> dict:
        """Run the passes not yet run (20 s apart), then judge the prediction on their median — the calibration's
        own, and with each of ``corrected`` (name → host profile: :meth:`DriftReferences.profiles`) beside it."""
        from v100lab.measure.backends.types import tool_version

        if self.binary is None:
            return {"rows": [], "skipped": "llama-bench not found"}
        while self.done < self.passes:
            if self.done:
                time.sleep(20)
            self.run_pass()
        spec = read_spec(zoo.model_path("default"))
        rows = []
        for (th, n), g in sorted(self.got.items()):
            # the calibration's own rates (no drift check a user applied)
            pred = predict_llamabench(spec, th, n, calibration_only_profile())
            typical = statistics.median(g["means"])     # the passes' median, as calibration keeps (combine_passes)
            fixed = {name: predict_llamabench(spec, th, n, prof) / typical - 1
                     for name, prof in (corrected or {}).items()}
            rows.append({"model": "default", "threads": th, "test": f"tg{n}",
                         "means_tps": [round(x, 2) for x in g["means"]],
                         "median_mean_tps": round(typical, 2), "best_sample_tps": round(g["best"], 2),
                         "predicted_tps": round(pred, 2), "error": pred / typical - 1,
                         "error_vs_best_sample": pred / g["best"] - 1,
                         "error_drift_corrected": fixed.get("base"), "error_drift_by_type": fixed.get("by_type")})
        return {"rows": rows, "binary": str(self.binary), "build": tool_version(self.binary),
                "passes_started_at_utc": self.started_at}


def print_llamabench(res: dict) -> None:
    print("### the default model against llama-bench\n")
    if not res["rows"]:
        print(f"skipped: {res.get('skipped')}\n")
        return
    print(f"llama-bench: {res['binary']} ({res.get('build')}); passes started at "
          f"{', '.join(res.get('passes_started_at_utc') or ['?'])} UTC\n")
    print("| model | threads | test | llama-bench mean per pass | median of the passes | fastest repetition | "
          "predicted | error | error vs fastest | drift-corrected | by type |")
    print("|---|--:|---|---|--:|--:|--:|--:|--:|--:|--:|")
    for r in res["rows"]:
        fixed = [_pct(r[k]) if r.get(k) is not None else "—" for k in ("error_drift_corrected", "error_drift_by_type")]
        print(f"| {r['model']} | {r['threads']} | {r['test']} | {' / '.join(f'{x:.1f}' for x in r['means_tps'])} | "
              f"{r['median_mean_tps']} | {r['best_sample_tps']} | {r['predicted_tps']} | {_pct(r['error'])} | "
              f"{_pct(r['error_vs_best_sample'])} | {fixed[0]} | {fixed[1]} |")
    print()


def print_host(res: dict) -> None:
    print("### (a) this machine: measured vs predicted (configurations never used in calibration)\n")
    print(f"Host profile: the {res.get('calibration_plan', 'precise')} calibration of {res.get('calibration_measured_at')}"
          + ("" if res.get("calibration_plan", "precise") == "precise"
             else " (one load a point: `v100lab calibrate --precise` is the procedure this validation is for)") + "\n")
    ref = res.get("drift_reference")
    if ref and ref.get("rungs"):
        print(f"Drift reference ({ref['references']} references: calibration's own rungs before each pass and after the "
              "last; rung, threads, test: tok/s each load against calibration's, the median's ratio): " + "; ".join(
                  f"{r['config']} t{r['threads']} {r['test']} {' / '.join(f'{x:.1f}' for x in r['tps'])} against "
                  f"{r['calibration_tps']:.1f} (×{r['ratio']:.3f})" for r in ref["rungs"])
              + f". Corrected: every row predicted again from the calibration scaled by the {calibration.DEPTH_TYPE} "
              "rung's ratio (decode) and the prompt rung's (prompt), with the bandwidth measured beside them; by type: "
              "each weight type's part of a token by its own rung (as `v100lab calibrate --check` applies a check).\n")
    print("| model | type | threads | depth | test | measured t/s | cv | passes' spread | predicted t/s | error | "
          "drift-corrected | by type | bound |")
    print("|---|---|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|---|")

    def shown(x) -> str:
        return _pct(x) if x is not None else "—"

    for r in res["rows"]:
        flag = " **above ceiling**" if r["above_ceiling"] else ""
        print(f"| {r['model']} | {r['file_type']} | {r['threads']} | {r['depth']} | {r['test']} | {r['measured_tps']}{flag} "
              f"| {100 * r['cv']:.1f} % | {100 * r.get('spread', 0):.0f} % | {r['predicted_tps']} | {_pct(r['error'])} "
              f"| {shown(r.get('error_drift_corrected'))} | {shown(r.get('error_drift_by_type'))} | {r['bound']} |")
    for test in ("tg", "pp"):
        if f"{test}_n" in res:
            print(f"\n{test}: median |error| {100 * res[f'{test}_median_abs_error']:.1f} %, worst "
                  f"{100 * res[f'{test}_worst_abs_error']:.1f} % over {res[f'{test}_n']} configurations")
        for name, said in (("drift_corrected", f"drift-corrected ({calibration.DEPTH_TYPE} rung)"),
                           ("drift_by_type", "drift-corrected by type")):
            if f"{test}_{name}_median_abs_error" in res:
                print(f"{test}, {said}: median |error| {100 * res[f'{test}_{name}_median_abs_error']:.1f} %, worst "
                      f"{100 * res[f'{test}_{name}_worst_abs_error']:.1f} %")
    for arch, a in (res.get("by_arch") or {}).items():
        print(f"- {arch}: " + "; ".join(f"{t} median {100 * a[f'{t}_median_abs_error']:.1f} %, worst "
                                         f"{100 * a[f'{t}_worst_abs_error']:.1f} % ({a[f'{t}_n']})"
                                         for t in ("tg", "pp") if f"{t}_n" in a))
    print()


def apple_part() -> dict:
    loco = speed.apple_rows("leave-one-chip-out")
    insample = speed.apple_rows("none")
    out = {"rows": loco.to_dict("records")}
    for name, df in (("loco", loco), ("in_sample", insample)):
        d = df[df["comparable"]]
        for test in ("tg128", "pp512"):
            e = d[d["test"] == test]["error"].abs()
            out[f"{name}_{test}_median_abs_error"] = float(e.median())
            out[f"{name}_{test}_worst_abs_error"] = float(e.max())
            out[f"{name}_{test}_n"] = int(len(e))
    newer = loco[~loco["comparable"]]
    out["newer_build_rows"] = newer[["chip", "quant", "test", "published", "predicted", "error", "build"]].to_dict("records")
    fit = rates.gpu_class_fit("apple")
    out["fit_all_rows"] = {"efficiency": fit.efficiency, "overhead_layer_ms": fit.overhead_layer_s * 1e3,
                           "pp_efficiency": dict(fit.pp_efficiency)}
    return out


def print_apple(res: dict) -> None:
    print("### (b) Apple Silicon, LLaMA 2 7B (llama.cpp discussion #4167, build 8e672ef rows)\n")
    f = res["fit_all_rows"]
    print(f"Fit on all {res['loco_tg128_n']} comparable rows: decode efficiency {f['efficiency']:.3f} of peak bandwidth, "
          f"overhead {f['overhead_layer_ms']:.3f} ms per layer, prompt efficiency (of the FP16 ALU peak) "
          + ", ".join(f"{k} {v:.3f}" for k, v in sorted(f["pp_efficiency"].items())) + ".\n")
    print("| split | test | median abs error | worst | rows |")
    print("|---|---|--:|--:|--:|")
    for name, label in (("loco", "leave-one-chip-out (judged)"), ("in_sample", "in-sample (not judged)")):
        for test in ("tg128", "pp512"):
            print(f"| {label} | {test} | {100 * res[f'{name}_{test}_median_abs_error']:.1f} % "
                  f"| {100 * res[f'{name}_{test}_worst_abs_error']:.1f} % | {res[f'{name}_{test}_n']} |")
    print("\nNewer-build rows (not comparable, not judged; predicted with the all-rows fit):\n")
    print("| chip | quant | test | published | predicted | error | build |")
    print("|---|---|---|--:|--:|--:|---|")
    for r in res["newer_build_rows"]:
        print(f"| {r['chip']} | {r['quant']} | {r['test']} | {r['published']:.1f} | {r['predicted']:.1f} | {_pct(r['error'])} "
              f"| {str(r['build'])[:40]} |")
    print()


def seed_part() -> dict:
    rows = seed.seed_staircase("v100-16gb")
    claims = seed.load_seed_claims()
    anchors = []
    for a in claims.get("anchors", []):
        spec = rates.arch_spec(a["arch"], a["quant"])
        dev = get_device(a["device"])
        cfg = RunConfig.from_mapping(a.get("config") or {"flash_attn": a.get("flash_attn", "auto"), "n_ctx": 4096})
        depth = int(a.get("depth", rates.APPLE_TG_DEPTH))
        p = speed.predict(spec, [dev], cfg, depth=depth if a["test"] != "pp512" else 0, n_prompt=512)
        pred = p.pp_tps if a["test"] == "pp512" else p.tg_tps
        anchors.append({"id": a["id"], "role": a["role"], "published": a["tps"], "predicted": pred,
                        "error": pred / a["tps"] - 1, "source": a["source"]})
    return {"rows": [r.__dict__ for r in rows], "anchors": anchors, "ceiling_table": claims.get("ceiling_table", [])}


def print_seed(res: dict) -> None:
    print("### (c) the seed's staircase on v100-16gb (qwen35-27b skeleton; host CPU assumed, see seed_claims.yaml)\n")
    by_stage: dict[str, dict] = {}
    for r in res["rows"]:
        s = by_stage.setdefault(r["value"], {"quant": r["quant"], "claimed": [], "impossible": False})
        if r["source"] == "claimed":
            s["claimed"].append(r["result"])
            s["impossible"] |= bool(r["above_ceiling"])
        elif r["metric"] == "tg_tps":
            s["predicted"], s["note"] = r["result"], r["note"]
        else:
            s[r["metric"]] = r["result"]
    print("| stage | quant | claimed t/s | predicted t/s | seed's ceiling | physical ceiling | verdict | prediction note |")
    print("|---|---|--:|--:|--:|--:|---|---|")
    for stage, s in by_stage.items():
        cl = "–".join(f"{v:g}" for v in sorted(set(s["claimed"])))
        verdict = "**impossible** (above the physical ceiling)" if s["impossible"] else "possible"
        print(f"| {stage} | {s['quant']} | {cl} | {s['predicted']:.1f} | {s['weights_ceiling_tg_tps']:.1f} | "
              f"{s['physical_ceiling_tg_tps']:.1f} | {verdict} | {s['note']} |")
    print("\nIndependent published V100 rows (role \"calibration\": the same figure is a row of the CUDA class's fit, "
          "data/cuda_llama7b.csv, so it is reproduced, not validated):\n")
    print("| row | role | published | predicted | error |")
    print("|---|---|--:|--:|--:|")
    for a in res["anchors"]:
        print(f"| {a['id']} | {a['role']} | {a['published']:g} | {a['predicted']:.1f} | {_pct(a['error'])} |")
    print()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", default="host,apple,seed",
                    help="comma-separated: host, arch (hybrid, MoE, SWA and MLA models on this host), llamabench (the "
                         "default model against llama.cpp's llama-bench), apple, seed")
    ap.add_argument("--quick", action="store_true", help="every third host configuration only")
    ap.add_argument("--ci", action="store_true",
                    help="the small validation set CI prints (default model, synth-280m)")
    ap.add_argument("--passes", type=int, default=2,
                    help="passes over the configurations, the median kept per test (default 2)")
    ap.add_argument("--llamabench-passes", type=int, default=None,
                    help="passes of llama-bench (default: --passes). A model that reads under ~100 MB a token, as the "
                         "default does, runs from a shared L3 in some passes: its llama-bench means differed by 40 %% "
                         "between two passes, and a few cheap passes more give a steadier median")
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--prompt-loads", type=int, default=calibration.PROMPT_LOADS,
                    help="loads of each prompt (pp512) a pass, the extra ones spread through the pass (default "
                         f"{calibration.PROMPT_LOADS}, as calibration; a pp512 load of synth-750m takes 23-31 s "
                         "on a 2-core Zen 3)")
    ap.add_argument("--no-drift-reference", action="store_true",
                    help="skip the drift reference (calibration's own rung decoded before each pass; ~10 s a pass and "
                         "thread count; --ci keeps it: on a CI machine the rates can move by up to 35 %% between "
                         "calibration and validation)")
    ap.add_argument("--drift-types", choices=("depth", "all"), default="depth",
                    help=f"the drift reference's rungs: calibration's {calibration.DEPTH_TYPE} rung only (depth), or "
                         "every weight type's rung calibration measured (all: about 2 minutes a reference on a 2-core "
                         "host), which adds the by-type corrections")
    ap.add_argument("--models", help="comma-separated: only the host or arch configurations of these models "
                                     "(aliases as the tables name them, e.g. synth-deepseek2-500m:Q4_K_M)")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.part.split(",") if p.strip()]
    only = {m.strip() for m in (args.models or "").split(",") if m.strip()}

    def chosen(configs):
        return tuple(c for c in configs if not only or c[0] in only)
    drift_types = tuple(calibration.CALIB_TYPES) if args.drift_types == "all" else (calibration.DEPTH_TYPE,)
    res = {}
    lb = None
    refs: list[DriftReferences] = []

    def save() -> None:     # after every part: a printing error late in a long run loses nothing measured
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=2, default=str)
    if "llamabench" in parts:
        lb = LlamaBenchPasses(max(1, args.llamabench_passes or args.passes), threads=(CI_THREADS,) if args.ci else (1, 2))
    if "host" in parts:
        # llama-bench's passes between the host part's (before each, and after the last): both medians then span
        # the same minutes of the VM's phases
        res["host"] = host_part(args.quick, args.repetitions, chosen(CI_VALIDATION if args.ci else VALIDATION), args.passes,
                                between=lb.run_pass if lb else None, prompt_loads=args.prompt_loads,
                                drift_types=() if args.no_drift_reference else drift_types, refs=refs)
        save()
        print_host(res["host"])
    if "arch" in parts:
        res["arch"] = host_part(args.quick, args.repetitions, chosen(ARCH_VALIDATION), args.passes,
                                prompt_loads=args.prompt_loads,
                                drift_types=() if args.no_drift_reference else drift_types)
        save()
        print_host(res["arch"])
    if lb:
        res["llamabench"] = lb.result(refs[0].profiles() if refs else None)
        save()
        print_llamabench(res["llamabench"])
    if "apple" in parts:
        res["apple"] = apple_part()
        print_apple(res["apple"])
    if "seed" in parts:
        res["seed"] = seed_part()
        print_seed(res["seed"])
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())

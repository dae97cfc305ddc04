"""``v100lab calibrate``: measure this host and store the speed model's profile for ``--device host``.

By default the quick plan (:func:`v100lab.measure.calibration.quick_points`: one load of each point the workbook's host
predictions use, a few minutes on 2 cores, building its models included). ``--precise`` is the full procedure, about
20-70 minutes on a 2-core VM (three passes over every point, the median of each kept, then settling rounds for the
uncertain ones). Run it with nothing else busy: llama.cpp's threads spin while they wait, so any other process
collapses throughput. ``--check`` is a drift check of a few minutes instead (:mod:`v100lab.measure.drift_check`).
"""

from __future__ import annotations

import json
import os
import statistics
import sys

from v100lab.measure import calibration, drift_check
from v100lab.predict import drift_scaling
from v100lab.facts.devices import host_profile_path
from v100lab.base.errors import ConfigError, V100labError
from v100lab.predict.rates import (NOISE_Z, RESIDUAL_TARGET, describe_host_rates, stored_calibration, stored_misses, calibration_problem)
from v100lab.predict.serving import batching_path
from v100lab.models.resolve import resolve
from v100lab.workbook.render import term_text

NAME = "calibrate"
MAX_REPETITIONS = 100   # a calibration pass (both thread counts) is 3-4 minutes at 3; 100 would be hours
MAX_PASSES = 20

HELP = "measure this host (bandwidth, llama.cpp's cost per weight type and thread count) for --device host"


def add_arguments(p):
    p.add_argument("-t", "--threads", default="",
                   help="comma-separated thread counts to calibrate (default: 1 and all cores)")
    p.add_argument("-r", "--repetitions", type=int, default=3, help="repetitions per test (default 3)")
    p.add_argument("--precise", action="store_true",
                   help="the full procedure (every point, three passes, settling rounds: 20-70 min on 2 cores) instead "
                        "of the quick plan (one load of each point the workbook's predictions use: a few minutes); "
                        "what the validation benchmarks use")
    p.add_argument("--passes", type=int, default=None,
                   help=f"with --precise: passes over all points, the median kept per point "
                        f"(default {calibration.CALIB_PASSES}; "
                        "a shared VM slows a point for tens of seconds at a time, so one pass is not repeatable)")
    p.add_argument("--settle-rounds", type=int, default=None,
                   help="with --precise: after the passes, rounds that load again every point whose loads leave its median uncertain "
                        f"by more than {100 * calibration.SETTLE_SE:.0f} %% or that the fit misses by more than "
                        f"{100 * RESIDUAL_TARGET:.0f} %% "
                        f"(default {calibration.SETTLE_ROUNDS}; 0: none)")
    p.add_argument("--show", action="store_true", help="print the stored calibration and exit")
    p.add_argument("--force", action="store_true",
                   help="store the calibration even when it fails the quality bounds (too many noisy points, a fit "
                        "residual above 25 %%); the profile is marked and every prediction says so")
    p.add_argument("--batching", action="store_true",
                   help="measure batched decode instead (llama-batched-bench on the calibration models, ~1.5 min): "
                        "the curve `serving` predicts -np / concurrent users with on this CPU (default threads: all cores)")
    p.add_argument("--check", action="store_true",
                   help="a drift check instead (a few minutes): decode calibration's own rungs again, compare them "
                        "with the stored calibration, and bring the rates of the rungs that moved (by more than 10 %% "
                        "and their loads' noise) up to the machine's present speed, each weight type by its own rung; "
                        "the profile line of every prediction then says so")
    p.add_argument("--no-apply", action="store_true",
                   help="with --check: record the check and warn when the machine moved, but keep predicting with "
                        "the calibration's own rates")
    p.add_argument("--types", default="",
                   help="with --check: comma-separated weight types whose rungs to decode (default: every type "
                        "calibration measured; e.g. Q4_0 for a check of about a minute); with --batching: the weight "
                        f"types to measure (default: all {len(calibration.QUICK_TYPES)} of the workbook's, ~1.5 min; "
                        "`serving` borrows a missing type's curve from the nearest one)")
    p.add_argument("--model", default="",
                   help="with --batching: measure only the weight type of this model's matrices (an alias, a path; "
                        "e.g. default: a few seconds per type instead of every type)")
    p.add_argument("--loads", type=int, default=drift_check.LOADS,
                   help=f"with --check: loads of each rung (default {drift_check.LOADS}: their median is kept, their "
                        "spread gives its standard error)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")


def _threads(text: str) -> list[int] | None:
    if not text:
        return None
    try:
        out = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ConfigError(f"--threads: not a list of integers: '{term_text(text, limit=60)}'") from None
    cores = os.cpu_count() or 1
    if not out or any(not 1 <= t <= cores for t in out):
        # more threads than cores only measures the scheduler (llama.cpp's threads spin while they wait)
        raise ConfigError(f"--threads: thread counts must be between 1 and this machine's {cores} cores, "
                          f"got '{term_text(text, limit=60)}'")
    return out


def _summary(cal: dict) -> list[str]:
    lines = [f"{cal.get('plan') or 'precise'} calibration in {cal.get('seconds', '?')} s, llama-cpp-python "
             f"{cal.get('llama_cpp_python')}, build {cal.get('build_commit')}"]
    for th, v in sorted((cal.get("reference_spread") or {}).items(), key=lambda kv: int(kv[0])):
        lines.append(f"{th} thread(s): the reference rung ({calibration.QUICK_REFERENCE}) moved {100 * v:.1f} % between "
                     "its first and last load")
    for th, p in sorted(cal.get("threads", {}).items(), key=lambda kv: int(kv[0])):
        costs = p.get("tg_s_per_weight", {})
        rates = ", ".join(f"{t} {1e-9 / c:.1f}" for t, c in sorted(costs.items(), key=lambda kv: kv[1]))
        lines.append(f"{th} thread(s): bandwidth {p['bandwidth_gbs']:.1f} GB/s (efficiency {p['efficiency']:.2f}), "
                     f"overhead {1e3 * p['overhead_token_s']:.2f} ms/token + {1e3 * p['overhead_layer_s']:.3f} ms/layer")
        row = (f"; + {1e9 * p['tg_row_s']:.1f} ns per matrix row (a 1024-weight row: "
               f"{100 * p['tg_row_s'] / (p['tg_row_s'] + 1024 * statistics.median(costs.values())):.0f} % of its cost)"
               if p.get("tg_row_s") and costs else "")
        lines.append(f"   decode rate, G weights/s: {rates}{row}")
        attn = (f"   attention: {1e9 * p.get('attn_s_per_op', 0):.3f} ns per multiply-add (KV read from DRAM)")
        if p.get("attn_s_per_head_cell"):
            attn += f" + {1e9 * p['attn_s_per_head_cell']:.2f} ns per query head × KV cell"
        if p.get("attn_s_per_kv_byte"):
            attn += f" + {1e12 * p['attn_s_per_kv_byte']:.0f} ps per KV byte read"
        if p.get("attn_tail_s_per_op"):
            attn += f", +{1e9 * p['attn_tail_s_per_op']:.3f} ns in a head's scalar tail"
        if p.get("attn_split_layer_s"):
            attn += f", {1e6 * p['attn_split_layer_s']:.0f} us per layer on the split-KV path"
        if p.get("attn_s_per_missed_head_cell") and p.get("attn_cache_bytes"):
            attn += (f"; {1e9 * p['attn_s_per_missed_head_cell']:.1f} ns per query head × KV cell that misses once a "
                     f"layer's KV cells pass {p['attn_cache_bytes'] / 2**20:.1f} MiB")
        if p.get("attn_nofa_ratio"):
            attn += (f"; with -fa off ×{p['attn_nofa_ratio']:.2f} (its {len(p.get('tg_nofa_fit_points') or [])} "
                     "point(s) beside the flash-attention fit)")
        lines.append(attn)
        if p.get("pp_attn_s_per_op") or p.get("pp_attn_s_per_head_cell"):
            lines.append(f"   prompt attention: {1e9 * p.get('pp_attn_s_per_op', 0):.3f} ns per multiply-add + "
                         f"{1e9 * p.get('pp_attn_s_per_head_cell', 0):.2f} ns per query head × KV cell (64-cell tiles)")
        errs = [abs(e) for e in p.get("tg_fit_rel_err", [])]
        if errs:
            n_par = p.get("tg_parameters")
            dof = "" if n_par is None else f" for {n_par} parameters"
            if n_par is not None and len(errs) <= n_par:
                dof += " (no degree of freedom left: the residuals are 0 by construction)"
            lines.append(f"   fit residual |err|: max {100 * max(errs):.1f} % over {len(errs)} points{dof}")
    noisy = [pt for pt in cal.get("points", []) if pt.get("tg_cv", 0) > 0.10 or pt.get("pp_cv", 0) > 0.10]
    if noisy:
        lines.append(f"noisy points (cv > 10 %): {', '.join(pt['config'] + '/' + str(pt['threads']) + 't' for pt in noisy)}"
                     " — rerun with the machine idle")
    q = cal.get("quality") or {}
    if cal.get("settled"):
        lines.append(f"settling: {sum(cal['settled'].values())} extra load(s) of {len(cal['settled'])} point(s) × "
                     f"thread count whose median was uncertain by > {100 * calibration.SETTLE_SE:.0f} % or that the "
                     f"fit missed by > {100 * RESIDUAL_TARGET:.0f} %")
    if q.get("median_standard_error") is not None:
        lines.append(f"each point's median known to ±{100 * q['median_standard_error']:.1f} % (median over points; "
                     f"{q.get('uncertain_points', 0)} point(s) beyond ±{100 * q.get('uncertain_se', 0.05):.0f} %)")
    if q.get("unsettled_points"):
        lines.append(f"{q['unsettled_points']} of {q.get('measured_points')} points: no other pass within 10 % of "
                     f"their median pass (the machine's speed moved; the median is kept)")
    # the points beyond the residual target, each against its own loads' noise (rates.point_misses)
    for m in stored_misses(cal):
        if m.get("standard_error") is None:
            noise = f"{m['loads']} load(s): too few to tell the machine's noise from the model's miss"
        else:
            noise = (f"its {m['loads']} loads' median ± {100 * m['standard_error']:.1f} %: "
                     + ("beyond" if m["beyond_noise"] else "within") + f" {NOISE_Z:g} standard errors")
        lines.append(f"fit misses {m['config']} at {m['threads']} thread(s) by {100 * m['residual']:+.1f} % ({noise})")
    return lines


def _batching_summary(res: dict) -> list[str]:
    lines = [f"batched decode measured with {res.get('binary')}"]
    for th, p in sorted((res.get("threads") or {}).items(), key=lambda kv: int(kv[0])):
        for t, curve in sorted((p.get("curves") or {}).items()):
            lines.append(f"{th} thread(s) {t}: step(B)/step(1) " + ", ".join(f"B={b} {v:.2f}" for b, v in
                                                                         sorted(curve.items(), key=lambda kv: int(kv[0]))))
    return lines


def _check_lines(rec: dict) -> list[str]:
    lines = [f"drift check of {rec.get('measured_at')} against the calibration of {rec.get('calibration_measured_at')}"
             f" ({rec.get('loads')} load(s) a rung, {rec.get('seconds', '?')} s)",
             f"{'rung':<22} {'threads':>7} {'test':>4} {'calibration t/s':>16} {'now t/s (loads)':>26} {'ratio':>14}"]
    gone = {(r["config"], r["threads"], r["test"]) for r in drift_scaling.moved(rec)}
    for r in rec.get("rungs") or ():
        se = f" ± {100 * r['standard_error']:.1f} %" if r.get("standard_error") is not None else ""
        mark = "  moved" if (r["config"], r["threads"], r["test"]) in gone else ""
        lines.append(f"{r['config']:<22} {r['threads']:>7} {r['test']:>4} {r['calibration_tps']:>16.2f} "
                     f"{' / '.join(f'{x:.1f}' for x in r['tps']):>26} {'×' + format(r['ratio'], '.3f') + se:>14}{mark}")
    for th, bw in sorted((rec.get("bandwidth_gbs") or {}).items(), key=lambda kv: int(kv[0])):
        lines.append(f"memory bandwidth, {th} thread(s): {bw:.1f} GB/s now")
    lines.append(f"{len(gone)} of {len(rec.get('rungs') or ())} rungs moved by more than {100 * drift_scaling.TOLERANCE:.0f} % "
                 f"and {drift_scaling.NOISE_Z:g} standard errors" + ("" if gone else ": the machine is where it was calibrated"))
    if not rec.get("applied"):
        lines.append("recorded, not applied (--no-apply): predictions keep the calibration's rates")
    elif gone:
        lines.append("applied: predictions on this host now use the calibration's rates scaled by the rungs that moved")
    else:
        lines.append("applied, and nothing moved: predictions keep the calibration's rates")
    return lines


def _batching_types(args) -> list[str] | None:
    """--batching's weight types: those of --types, the calibrated type nearest --model's matrices, or None (all)."""
    if args.model:
        _, spec = resolve(args.model)
        return [calibration.batching_type(spec)]
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    unknown = [t for t in types if t not in calibration.QUICK_TYPES]
    if unknown:
        raise ConfigError(f"--types: no calibration model of type {', '.join(unknown)} "
                          f"(known: {', '.join(calibration.QUICK_TYPES)})")
    return types or None


def _run_check(args) -> int:
    if not 1 <= args.loads <= MAX_PASSES:
        raise ConfigError(f"--loads must be between 1 and {MAX_PASSES}, got {args.loads}")
    types = [t.strip() for t in args.types.split(",") if t.strip()] or None
    say = None if args.json else (lambda s: print(f"  {s}", file=sys.stderr, flush=True))
    rec = drift_check.store(drift_check.check(threads=_threads(args.threads), types=types, loads=args.loads,
                                              progress=say), apply=not args.no_apply)
    if args.json:
        json.dump({"profile": str(host_profile_path()), "drift": rec}, sys.stdout, indent=2)
        print()
        return 0
    for line in _check_lines(rec):
        print(term_text(line, limit=400))
    hp = describe_host_rates()
    print(term_text(hp.line, limit=600))
    for w in hp.warnings:
        print(f"warning: {term_text(w, limit=400)}")
    return 0


def run(args) -> int:
    if args.check and (args.show or args.batching):
        raise ConfigError("--check measures a drift check: not with --show or --batching")
    if (args.no_apply or args.loads != drift_check.LOADS) and not args.check:
        raise ConfigError("--no-apply and --loads go with --check")
    if args.types and not (args.check or args.batching):
        raise ConfigError("--types goes with --check or --batching")
    if args.model and not args.batching:
        raise ConfigError("--model goes with --batching")
    if args.model and args.types:
        raise ConfigError("--batching takes --types or --model, not both")
    if args.check and (args.force or args.passes is not None or args.repetitions != 3
                       or args.settle_rounds is not None or args.precise):
        raise ConfigError("--force, --precise, --passes, --repetitions and --settle-rounds are a calibration's: "
                          "not with --check")
    if args.precise and (args.show or args.batching):
        raise ConfigError("--precise is a calibration's plan: not with --show or --batching")
    if not args.precise and (args.passes is not None or args.settle_rounds is not None):
        raise ConfigError("--passes and --settle-rounds go with --precise (the quick plan loads each point once)")
    if args.check:
        return _run_check(args)
    if args.batching and not args.show:
        if not 1 <= args.repetitions <= MAX_REPETITIONS:
            raise ConfigError(f"--repetitions must be between 1 and {MAX_REPETITIONS}, got {args.repetitions}")
        say = None if args.json else (lambda s: print(f"  {s}", file=sys.stderr, flush=True))
        res = calibration.calibrate_batching(threads=_threads(args.threads), repetitions=max(1, args.repetitions - 1),
                                             progress=say, types=_batching_types(args))
        if args.json:
            json.dump({"batching": str(batching_path()), "batch_calibration": res}, sys.stdout, indent=2)
            print()
            return 0
        for line in _batching_summary(res):
            print(term_text(line, limit=400))
        print(f"stored in {batching_path()} (used by `serving` for -np and concurrent users on this host)")
        return 0
    if args.show:
        cal = stored_calibration()
        if not cal:
            raise V100labError("no calibration stored for this host: run `v100lab calibrate`")
        problem = calibration_problem(cal, complete=True)
        if problem:
            raise V100labError(f"the calibration stored in {term_text(host_profile_path())} is unusable "
                               f"({problem}); run `v100lab calibrate` again")
    else:
        if not 1 <= args.repetitions <= MAX_REPETITIONS:
            raise ConfigError(f"--repetitions must be between 1 and {MAX_REPETITIONS}, got {args.repetitions}")
        passes = calibration.CALIB_PASSES if args.passes is None else args.passes
        settle_rounds = calibration.SETTLE_ROUNDS if args.settle_rounds is None else args.settle_rounds
        if not 1 <= passes <= MAX_PASSES:
            raise ConfigError(f"--passes must be between 1 and {MAX_PASSES}, got {passes}")
        if not 0 <= settle_rounds <= MAX_PASSES:
            raise ConfigError(f"--settle-rounds must be between 0 and {MAX_PASSES}, got {settle_rounds}")
        # a bar (loads done / total, time left) on a terminal; a line per load otherwise (logs, CI)
        bar = not args.json and sys.stderr.isatty()
        say = None if args.json else (lambda s: print(f"  {s}", file=sys.stderr, flush=True))
        cal = calibration.calibrate(threads=_threads(args.threads), repetitions=args.repetitions, progress=say,
                                    force=args.force, passes=passes, settle_rounds=settle_rounds,
                                    plan="precise" if args.precise else "quick", bar=bar)
    if args.json:
        json.dump({"profile": str(host_profile_path()), "speed_calibration": cal}, sys.stdout, indent=2)
        print()
        return 0
    for line in _summary(cal):
        print(line)
    if args.show and cal.get(drift_scaling.DRIFT_KEY):
        for line in _check_lines(cal[drift_scaling.DRIFT_KEY]):
            print(term_text(line, limit=400))
    hp = describe_host_rates(cal)
    print(term_text(hp.line, limit=400))
    for w in hp.warnings:
        print(f"warning: {term_text(w, limit=400)}")
    print(f"stored in {host_profile_path()} (used by --device host)")
    return 0

"""Refit a stored calibration with this commit's fit, and judge it on stored validation rows — no measuring.

    .venv/bin/python benchmarks/refit_speed.py CAL.json [VALIDATION.json] [--median-of-passes] [--no-head-cells]
                                               [--no-spill] [--no-kv-bytes] [--pool CAL2.json] [--depth-loads N]
                                               [--prompt-loads N]

``CAL.json``: `v100lab calibrate --json` output (or its ``speed_calibration`` object). Each point's figure is
re-fitted with :func:`v100lab.measure.calibration.fit_cpu`; with ``--median-of-passes`` it is first replaced by the
median of the point's passes (``tg_pass_tps``/``pp_pass_tps``, the rule of :func:`calibration.combine_passes`)
— for calibrations stored before the median was the rule. It prints the calibration's pass drift (:func:`v100lab.predict.rates.pass_drift`) first. ``VALIDATION.json``: `bench_speed.py --json` output (its llama-bench rows judged too, as bench_speed.py predicts them);
its host rows are predicted from the refitted profile (with ``--median-of-passes`` a row measured in two passes
is taken as their mean s/token, rebuilt from its fastest pass and its ``spread``). Issue 18, second round, in
benchmarks/RESULTS.md, used it to apply the median to the measurements of a run made with the fastest pass.
``--no-kv-bytes``: fit without attention's cost per KV byte read (the eighteenth round's model; a calibration
without calib-mha's depth points is fitted without it anyway). ``--no-spill``: fit without attention's head × cells that miss an effective cache (the model before the eighteenth
round). ``--no-head-cells``: fit without attention's cost per query head × KV cell (the model before the eleventh round),
to judge that term on the same measurements. ``--pool CAL2.json``: add the passes of a second calibration of the
same machine and build to every point both measured, each point's figure then the median of all their passes — what
calibrating with more passes would have given (issue 18, twelfth round). ``--depth-loads N`` / ``--prompt-loads N``:
each pass's loads of attention's decode points / the depth-0 prompt points cut to their first N (:func:`cut_loads`),
to judge what the extra loads bought on the same measurements.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import bench_speed  # benchmarks/: the script's own folder (as redrift_speed.py does)
from v100lab.base import buildflags
from v100lab.measure import calibration
from v100lab.predict import rates, speed, work
from v100lab.models import zoo
from v100lab.facts.config import RunConfig
from v100lab.facts.devices import get_device
from v100lab.gguf.header import read_spec


def _median_tps(values) -> float:
    return 1.0 / statistics.median([1.0 / float(x) for x in values])


def use_calibration_step(cal: dict) -> None:
    """Work out head_dim tails with the SIMD step of the build that made ``cal`` (its stored system info), not the
    running build's: an AVX2 calibration refitted under an AVX-512 build would get a tail column at head_dim 96 that
    its build does not have (issue 18, twelfth round)."""
    step = buildflags.f16_simd_step_of_system_info((cal.get("build") or {}).get("system_info") or "")
    if step and step != work.F16_SIMD_STEP:
        print(f"(head_dim tails with the calibration's SIMD step {step}, not this build's {work.F16_SIMD_STEP})")
        work.F16_SIMD_STEP = step


def refit(cal: dict, median_of_passes: bool, head_cells: bool = True, spill: bool = True,
          kv_bytes: bool = True) -> dict:
    """``cal`` with every thread count refitted (and, optionally, each point's figure the median of its passes)."""
    paths = calibration.calibration_model_paths()
    specs = {f"{label}:{t}": read_spec(p) for (label, t), p in paths.items()}
    out = json.loads(json.dumps(cal))
    by_threads: dict[int, list] = {}
    for p in out["points"]:
        if "tg_tps" not in p and "pp_tps" not in p:      # a failed point
            continue
        if median_of_passes:
            for k in ("tg", "pp"):
                if p.get(f"{k}_pass_tps"):
                    p[f"{k}_tps"] = round(_median_tps(p[f"{k}_pass_tps"]), 2)
        base, _, d = p["config"].partition("@d")
        by_threads.setdefault(int(p["threads"]), []).append(
            {"spec": specs[base], "label": base.split(":")[0], "name": p["config"],
             "depth": (int(d) if d else 0) + calibration.CALIB_N_GEN // 2, "tg": (1.0 / p["tg_tps"]) if p.get("tg_tps") else None,
             "pp": (1.0 / p["pp_tps"]) if p.get("pp_tps") else None, "n_prompt": calibration.CALIB_N_PROMPT,
             "pp_depth": int(d) if d else 0})
    for th, pts in sorted(by_threads.items()):
        old = out["threads"][str(th)]
        fit = calibration.fit_cpu(pts, old["bandwidth_gbs"], threads=th, head_cells=head_cells, spill=spill,
                                  kv_bytes=kv_bytes)
        fit["bandwidth_cv"] = old.get("bandwidth_cv")
        out["threads"][str(th)] = fit
        res = fit["tg_fit_rel_err"]
        print(f"{th} thread(s): per-layer overhead {1e6 * fit['overhead_layer_s']:.1f} us, attention "
              f"{1e9 * fit['attn_s_per_op']:.3f} ns/op + {1e9 * fit.get('attn_s_per_head_cell', 0):.2f} ns/head-cell "
              f"(head_dim tail {1e9 * fit.get('attn_tail_s_per_op', 0):.3f}), "
              f"split-KV {1e6 * fit.get('attn_split_layer_s', 0):.0f} us/layer, "
              f"{1e12 * fit.get('attn_s_per_kv_byte', 0):.0f} ps/KV byte, "
              f"{1e9 * fit.get('attn_s_per_missed_head_cell', 0):.1f} ns per missed head-cell beyond "
              f"{fit.get('attn_cache_bytes', 0) / 2**20:.2f} MiB; "
              f"decode residual max {100 * max(map(abs, res)):.1f} %, "
              f"prompt max {100 * max(map(abs, fit.get('pp_fit_rel_err') or [0])):.1f} %")
        print("   decode points beyond 5 %: " + (", ".join(f"{p['name']} {100 * r:+.0f} %" for p, r in zip([q for q in pts if q["tg"]], res)
                                                    if abs(r) > 0.05) or "none"))
    out["quality"] = rates.calibration_quality(out)
    return out


def pool(cal: dict, other: dict) -> dict:
    """``cal`` with each point's passes (``tg_pass_tps``, ``pp_pass_tps``) joined by ``other``'s for the same point
    and thread count, and its figure their median (the rule of :func:`calibration.combine_passes`)."""
    out = json.loads(json.dumps(cal))
    theirs = {(p["config"], int(p["threads"])): p for p in other["points"]}
    for p in out["points"]:
        q = theirs.get((p["config"], int(p["threads"])))
        for k in ("tg", "pp"):
            if q and p.get(f"{k}_pass_tps") and q.get(f"{k}_pass_tps"):
                p[f"{k}_pass_tps"] = list(p[f"{k}_pass_tps"]) + list(q[f"{k}_pass_tps"])
                p[f"{k}_tps"] = round(_median_tps(p[f"{k}_pass_tps"]), 2)
    return out


def cut_loads(cal: dict, keep: int, prompt: bool = False) -> dict:
    """``cal`` as if each of attention's decode points (or, with ``prompt``, each depth-0 prompt-only point) had been
    loaded ``keep`` times a pass instead of the loads it had (:data:`calibration.DEPTH_LOADS`, ``PROMPT_LOADS``): of
    each pass's loads (in ``tg_pass_tps``/``pp_pass_tps``, pass by pass) the first ``keep``, the figure their median
    — what the extra loads bought, judged on the same measurements (issue 18, thirteenth and fourteenth rounds)."""
    out = json.loads(json.dumps(cal))
    key = "pp" if prompt else "tg"
    # the passes: what a point loaded once a pass has (calib-wide F16's decode and prompt)
    passes = min(len(p["tg_pass_tps"]) for p in out["points"] if p.get("tg_pass_tps"))
    for p in out["points"]:
        base, _, d = p["config"].partition("@d")
        ours = (not d and "tg_tps" not in p) if prompt else (bool(d) or base.startswith(calibration.WIDE96_LABEL + ":"))
        runs = p.get(f"{key}_pass_tps") or []
        loads = len(runs) // passes
        if not ours or loads <= 1 or len(runs) % passes:
            continue
        runs = [x for i, x in enumerate(runs) if i % loads < keep]
        p[f"{key}_pass_tps"] = runs
        p[f"{key}_tps"] = round(_median_tps(runs), 2)
    return out


def judge(cal: dict, validation: dict, median_of_passes: bool) -> None:
    host = get_device("host")
    profile = {rates.PROFILE_KEY: cal}
    errs: dict[str, list[float]] = {"tg": [], "pp": []}
    print("\n| model | threads | depth | test | measured t/s | predicted | error |")
    print("|---|--:|--:|---|--:|--:|--:|")
    for r in validation["host"]["rows"]:
        meas = float(r["measured_tps"])
        if median_of_passes and r.get("spread"):
            slow = meas / (1.0 + float(r["spread"]))
            meas = 2.0 / (1.0 / meas + 1.0 / slow)
        spec = read_spec(zoo.model_path(r["model"]))
        d, th = int(r["depth"]), int(r["threads"])
        n_ctx = max(1024, ((d + 512 + 256) // 256 + 1) * 256)
        cfg = RunConfig(n_ctx=n_ctx, n_threads=th, n_gpu_layers=0)
        tg = r["test"].startswith("tg")
        p = speed.predict(spec, [host], cfg, depth=d + 16 if tg else d, n_prompt=512, profile=profile)
        pred = p.tg_tps if tg else p.pp_tps
        errs["tg" if tg else "pp"].append(abs(pred / meas - 1))
        print(f"| {r['model']} | {th} | {d} | {r['test']} | {meas:.2f} | {pred:.2f} | {100 * (pred / meas - 1):+.1f} % |")
    for k, v in errs.items():
        if v:
            print(f"\n{k}: median |error| {100 * statistics.median(v):.1f} %, worst {100 * max(v):.1f} % over {len(v)}")
    lb = (validation.get("llamabench") or {}).get("rows") or []
    if lb:
        # the done-when's comparison: the default model against llama-bench's tg64/tg128, predicted as bench_speed.py
        # predicts them (at the generated tokens' middle depth)
        print("\n| model | threads | llama-bench test | median of the passes t/s | predicted | error |")
        print("|---|--:|---|--:|--:|--:|")
        for r in lb:
            pred = bench_speed.predict_llamabench(read_spec(zoo.model_path(r["model"])), int(r["threads"]),
                                                  int(r["test"][2:]), profile=profile)
            meas = float(r["median_mean_tps"])
            print(f"| {r['model']} | {r['threads']} | {r['test']} | {meas:.2f} | {pred:.2f} | "
                  f"{100 * (pred / meas - 1):+.1f} % |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("calibration")
    ap.add_argument("validation", nargs="?")
    ap.add_argument("--median-of-passes", action="store_true")
    ap.add_argument("--no-head-cells", action="store_true", help="leave the cost per query head × KV cell out")
    ap.add_argument("--no-spill", action="store_true",
                    help="leave out attention's head × cells that miss an effective cache (the seventeenth round's model)")
    ap.add_argument("--no-kv-bytes", action="store_true",
                    help="leave out attention's cost per KV byte read (the eighteenth round's model)")
    ap.add_argument("--pool", metavar="CAL2", help="a second calibration whose passes join this one's, point by point")
    ap.add_argument("--depth-loads", type=int, metavar="N",
                    help=f"keep the first N of each pass's {calibration.DEPTH_LOADS} loads of attention's decode points")
    ap.add_argument("--prompt-loads", type=int, metavar="N",
                    help=f"keep the first N of each pass's {calibration.PROMPT_LOADS} loads of the depth-0 prompt points")
    args = ap.parse_args(argv)
    with open(args.calibration) as f:
        cal = json.load(f)
    cal = cal.get("speed_calibration", cal)
    if args.pool:
        with open(args.pool) as f:
            other = json.load(f)
        cal = pool(cal, other.get("speed_calibration", other))
    if args.depth_loads:
        cal = cut_loads(cal, args.depth_loads)
    if args.prompt_loads:
        cal = cut_loads(cal, args.prompt_loads, prompt=True)
    use_calibration_step(cal)
    # how far the machine moved between the passes (rates.pass_drift; calibration refuses above MAX_PASS_DRIFT)
    moved = ", ".join(f"{th} t {100 * d:.1f} %" for th, d in rates.pass_drift(cal).items())
    print(f"pass drift by thread count: {moved or '— (one pass, or loads that do not split by pass)'}")
    new = refit(cal, args.median_of_passes, head_cells=not args.no_head_cells, spill=not args.no_spill,
                kv_bytes=not args.no_kv_bytes)
    if args.validation:
        with open(args.validation) as f:
            judge(new, json.load(f), args.median_of_passes)
    return 0


if __name__ == "__main__":
    sys.exit(main())

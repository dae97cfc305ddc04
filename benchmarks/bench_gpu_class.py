"""The CUDA class judged leave-one-card-out on published llama-bench rows.

Each card's rows in ``v100lab/data/cuda_llama7b.csv`` are predicted by a CUDA-class fit on every other card's rows
(:func:`v100lab.predict.speed.cuda_rows`); the table says median and worst |error| per test and flash-attention setting,
with the in-sample fit beside it for scale. Then the same split with each card given as a user's device file
would give it — only bandwidth, FP16 TFLOP/s and compute capability, the rest inferred from the other catalog
cards (:func:`v100lab.facts.devices.complete_gpu`) — beside its catalog prediction, the file without inference, and the
file with its board power added. Arithmetic only: nothing is loaded or timed, so no figure here depends on this
machine.

    python benchmarks/bench_gpu_class.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys

from v100lab.predict import rates, speed


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def summary(df) -> list[dict]:
    out = []
    for (test, fa), g in df.groupby(["test", "fa"]):
        e = g["error"].abs()
        worst = g.loc[e.idxmax()]
        out.append({"test": test, "fa": int(fa), "rows": len(g), "cards": int(g["device"].nunique()),
                    "median_abs_error": float(e.median()), "worst_abs_error": float(e.max()),
                    "worst_card": f"{worst['device']} {worst['quant']}"})
    return out


def device_files(loco) -> list[dict]:
    """Per published row: the catalog prediction's error beside the device-file ones (headline fields inferred,
    not inferred, and with the board power added)."""
    headline = speed.SPARSE_DEVICE_FIELDS
    sparse = speed.cuda_rows("device-file")
    raw = speed.cuda_rows("device-file", infer=False)
    powered = speed.cuda_rows("device-file", keep=(*headline, "board_power_w"))
    out = []
    for i, r in loco.iterrows():
        out.append({"device": r["device"], "quant": r["quant"], "fa": int(r["fa"]), "test": r["test"],
                    "published": r["published"], "catalog": r["error"], "file": sparse.at[i, "error"],
                    "file_uninferred": raw.at[i, "error"], "file_with_power": powered.at[i, "error"],
                    "assumed": sparse.at[i, "assumed"]})
    return out


def device_file_summary(rows: list[dict]) -> list[dict]:
    import statistics

    out = []
    for test in sorted({r["test"] for r in rows}):
        g = [r for r in rows if r["test"] == test]
        worse = max(g, key=lambda r: abs(r["file"]) - abs(r["catalog"]))
        out.append({"test": test, "rows": len(g), "cards": len({r["device"] for r in g}),
                    **{k: statistics.median(abs(r[k]) for r in g)
                       for k in ("catalog", "file", "file_uninferred", "file_with_power")},
                    "worst_vs_catalog_points": 100 * (abs(worse["file"]) - abs(worse["catalog"])),
                    "worst_vs_catalog_row": f"{worse['device']} {worse['quant']} fa {worse['fa']}"})
    return out


def run() -> dict:
    loco, ins = speed.cuda_rows("leave-one-card-out"), speed.cuda_rows("none")
    fit = rates.gpu_class_fit("gpu")
    files = device_files(loco)
    return {"device_files": files, "device_file_summary": device_file_summary(files),
            "fit": {"eff_mmvq": fit.efficiency, "eff_float": fit.efficiency_f16,
                    "cuda_core_flop_per_weight": fit.tg_fp32_flop_per_weight,
                    "overhead_layer_us": fit.overhead_layer_s * 1e6, "overhead_layer_fa_us": fit.overhead_layer_fa_s * 1e6,
                    "pp_efficiency": dict(fit.pp_efficiency), "pp_power_knee_w_per_tflop": fit.pp_power_knee_w_per_tflop,
                    "pp_dp4a_factor": fit.pp_dp4a_factor, "n_rows": fit.n_rows, "source": fit.source},
            "loco": summary(loco), "in_sample": summary(ins), "rows": loco.to_dict("records")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    res = run()
    f = res["fit"]
    print(f"### CUDA class fit on all {f['n_rows']} rows\n")
    print(f"decode: MMVQ (quantized) efficiency {f['eff_mmvq']:.3f} of peak bandwidth, float (F16) {f['eff_float']:.3f}; "
          f"CUDA-core work {f['cuda_core_flop_per_weight']:.2f} FP32-FLOP per weight; launch overhead "
          f"{f['overhead_layer_us']:.1f} µs per layer per token, {f['overhead_layer_fa_us']:+.1f} µs with flash attention; "
          "prompt efficiency (quantized: of the FP32 rate sustained under the power limit; F16: of the FP16 tensor "
          "peak) " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(f["pp_efficiency"].items()))
          + f"; power knee {f['pp_power_knee_w_per_tflop']:.2f} W per FP32 TFLOP/s (below it a card's prompt rate "
          "scales with its board power); Pascal dp4a MMQ "
          + (f"{f['pp_dp4a_factor']:.3f}x" if f["pp_dp4a_factor"] else "n/a") + " of int8 mma.\n")
    print("| split | test | fa | median abs error | worst | worst row | rows | cards |")
    print("|---|---|--:|--:|--:|---|--:|--:|")
    for name, label in (("loco", "leave-one-card-out (judged)"), ("in_sample", "in-sample (not judged)")):
        for s in res[name]:
            print(f"| {label} | {s['test']} | {s['fa']} | {100 * s['median_abs_error']:.1f} % | "
                  f"{100 * s['worst_abs_error']:.1f} % | {s['worst_card']} | {s['rows']} | {s['cards']} |")
    print("\nEvery row, leave-one-card-out:\n")
    print("| card | quant | fa | test | published t/s | predicted t/s | error | build |")
    print("|---|---|--:|---|--:|--:|--:|---|")
    for r in res["rows"]:
        build = "" if r["build"] != r["build"] else str(r["build"])   # NaN: no build given
        print(f"| {r['device']} | {r['quant']} | {r['fa']} | {r['test']} | {r['published']:.2f} | {r['predicted']:.2f} "
              f"| {_pct(r['error'])} | {build} |")
    print("\n### A card outside the catalog: its device file with only bandwidth, FP16 TFLOP/s and compute "
          "capability\n")
    print("Leave-one-card-out as above; the card's missing fields are inferred from the other catalog cards (its "
          "spec twins left out too). Median |error|; worst: the row the file predicts worst against the catalog.\n")
    print("| test | rows | cards | catalog entry | device file | file, nothing inferred | file + board_power_w "
          "| worst vs catalog | worst row |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|---|")
    for s in res["device_file_summary"]:
        print(f"| {s['test']} | {s['rows']} | {s['cards']} | {100 * s['catalog']:.1f} % | {100 * s['file']:.1f} % | "
              f"{100 * s['file_uninferred']:.1f} % | {100 * s['file_with_power']:.1f} % | "
              f"{s['worst_vs_catalog_points']:+.1f} points | {s['worst_vs_catalog_row']} |")
    print("\n| card | quant | fa | test | published t/s | catalog entry | device file | nothing inferred "
          "| file + board power | what the file's prediction assumed |")
    print("|---|---|--:|---|--:|--:|--:|--:|--:|---|")
    for r in res["device_files"]:
        print(f"| {r['device']} | {r['quant']} | {r['fa']} | {r['test']} | {r['published']:.2f} | {_pct(r['catalog'])} "
              f"| {_pct(r['file'])} | {_pct(r['file_uninferred'])} | {_pct(r['file_with_power'])} | {r['assumed']} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Validate the prompt model: pp512 predicted against measured, per model and thread count, with each one's spread.

    flock /tmp/v100lab-measure.lock .venv/bin/python benchmarks/bench_prompt.py            # the default set
    .venv/bin/python benchmarks/bench_prompt.py --loads 3 default@1 synth-qwen35-500m:Q4_K_M@2 --json out.json

Each configuration (``MODEL@THREADS``) is measured llama-bench's way (``calibration.measure``: a fresh worker,
a warm-up, the median of two repetitions) ``--loads`` times, in rounds so that one configuration's loads are
minutes apart; its figure is the median load and its spread (max − min) / median. None of these models is a
calibration model. Each other architecture's row is also judged against the llama rows measured in the same
round (their measured / predicted: how fast the machine ran then), which cancels a shared VM's drift. The prediction is ``speed.predict`` from the stored calibration, and a configuration whose
spread exceeds the target (15 %) is marked: its error says more about the machine than about the model.
``benchmarks/bench_ops.py --prompt 512`` says which term a miss comes from.

``--machine-reference Q4_1`` also loads calibration's own prompt model of that type (calib-wide-pp) in every round
at every thread count — never judged, a measure of how fast the machine ran then against its calibration — and
judges every row a second time scaled by that ratio of its own round: on a VM that has moved since its calibration,
that separates the model's error from the machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from v100lab.facts.config import RunConfig
from v100lab.gguf.header import read_spec
from v100lab.measure import calibration
from v100lab.models import zoo
from v100lab.predict import speed

N_PROMPT = 512
TARGET = 0.15
DEFAULT_SET = ("default@1", "default:Q6_K@1", "default:Q4_0@1", "synth-qwen35-500m:Q4_K_M@1",
               "synth-qwen35-tiny:Q4_K_M@1", "default@2", "default:Q6_K@2", "default:Q4_0@2",
               "synth-qwen35-500m:Q4_K_M@2", "synth-qwen35-tiny:Q4_K_M@2")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="*", help="MODEL@THREADS (zoo alias or path); default: the prompt set")
    ap.add_argument("--loads", type=int, default=3)
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--machine-reference", metavar="TYPE", default="",
                    help="calibration's own prompt model of this weight type, loaded each round as the machine's "
                         "measure (not judged)")
    args = ap.parse_args(argv)
    configs = [(m, int(t)) for item in (args.configs or DEFAULT_SET) for m, t in [item.rsplit("@", 1)]]
    stems = calibration.calibration_stems()
    paths = {m: zoo.model_path(m) for m, _ in configs}
    for m, p in paths.items():
        if any(p.name.startswith(s) for s in stems):
            sys.exit(f"bench_prompt: {m} is a calibration model; refusing to judge on it")
    meas: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
    ref_path, ref = None, {}
    if args.machine_reference:
        key = (calibration.PROMPT_LABEL, args.machine_reference)
        ref_path = calibration.calibration_model_paths(only={key}).get(key)
        if ref_path is None:
            sys.exit(f"bench_prompt: no calibration prompt model of type {args.machine_reference}")
        ref = {th: [] for th in sorted({th for _, th in configs})}
    for k in range(args.loads):
        for th in ref:
            tm = calibration.measure(ref_path, th, depth=0, n_gen=0, n_prompt=N_PROMPT, repetitions=2,
                                     retry_noisy=False, n_ctx=1024)
            ref[th].append(1.0 / tm["pp"].s_per_token)
        for m, th in configs:
            t0 = time.time()
            tm = calibration.measure(paths[m], th, depth=0, n_gen=0, n_prompt=N_PROMPT, repetitions=2,
                                     retry_noisy=False, n_ctx=1024)
            meas[(m, th)].append(1.0 / tm["pp"].s_per_token)
            print(f"  load {k + 1}/{args.loads} {m} t{th} pp{N_PROMPT} {meas[(m, th)][-1]:.1f} "
                  f"({time.time() - t0:.0f} s, load average {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    rows = []
    print(f"| model | threads | pp{N_PROMPT} measured (loads) | spread | predicted | error |")
    print("|---|---|---|---|---|---|")
    for (m, th), v in meas.items():
        pred = speed.predict(read_spec(paths[m]), ["host"], RunConfig(n_threads=th, n_ctx=1024, n_gpu_layers=0),
                             0, N_PROMPT).pp_tps
        med = statistics.median(v)
        spread = (max(v) - min(v)) / med
        rows.append({"model": m, "threads": th, "loads": [round(x, 1) for x in v], "measured": round(med, 1),
                     "spread": round(spread, 4), "predicted": round(pred, 1), "error": round(pred / med - 1, 4),
                     "noisy": spread > TARGET})
        print(f"| {m} | {th} | {med:.1f} ({', '.join(f'{x:.1f}' for x in v)}) | {spread:.0%} | {pred:.1f} | "
              f"{pred / med - 1:+.1%}{' (spread above target)' if spread > TARGET else ''} |")
    # a machine whose speed moves between minutes (a shared VM) moves every row of a round alike: each non-llama
    # row is also judged against the llama rows of its own round and thread count (their median measured /
    # predicted: the machine's factor then), which cancels the drift and judges the architecture's terms
    print("\nAgainst the llama rows of the same round (the machine's factor: their median measured / predicted):")
    for r in rows:
        if read_spec(paths[r["model"]]).architecture == "llama":
            continue
        refs = [x for x in rows if x["threads"] == r["threads"] and read_spec(paths[x["model"]]).architecture == "llama"]
        if not refs:
            continue
        errs = []
        for k, got in enumerate(r["loads"]):
            factor = statistics.median(x["loads"][k] / x["predicted"] for x in refs)
            errs.append(r["predicted"] * factor / got - 1)
        r["error_vs_llama_rounds"] = [round(e, 4) for e in errs]
        print(f"  {r['model']} t{r['threads']}: {', '.join(f'{e:+.0%}' for e in errs)} per round "
              f"(median {statistics.median(errs):+.1%})")
    if ref:
        print(f"\nScaled by calibration's own {args.machine_reference} prompt model in each round (measured / predicted "
              "there: how fast the machine ran against its calibration):")
        for th, v in ref.items():
            pred = speed.predict(read_spec(ref_path), ["host"], RunConfig(n_threads=th, n_ctx=1024, n_gpu_layers=0),
                                 0, N_PROMPT).pp_tps
            print(f"  machine t{th}: ×{', ×'.join(f'{x / pred:.2f}' for x in v)} of calibration")
            for r in (r for r in rows if r["threads"] == th):
                errs = [r["predicted"] * (x / pred) / got - 1 for x, got in zip(v, r["loads"])]
                r["error_vs_machine_reference"] = [round(e, 4) for e in errs]
                print(f"  {r['model']} t{th}: {', '.join(f'{e:+.0%}' for e in errs)} per round "
                      f"(median {statistics.median(errs):+.1%})")
    judged = [abs(r["error"]) for r in rows if not r["noisy"]]
    if judged:
        print(f"\nmedian |error| over {len(judged)} configurations within their spread: "
              f"{statistics.median(judged):.1%} (target {TARGET:.0%})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

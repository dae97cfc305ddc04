"""Does a shared VM's speed drift as one, for every workload? A reference test interleaved with targets.

    .venv/bin/python benchmarks/probe_drift.py [--minutes 8] [--threads 1 2] [--json OUT]

Issue 18 (item 1, "frequency behaviour of a shared VM"): the same calibration point measures 1.5-2x apart in
passes minutes apart, and the model's *ratios* between models hold better than its absolute figures. If the
machine's phases slow every workload by the same factor, a short reference test measured next to each point
would take the phase out (drift correction, as a reference star does in photometry); if they do not, it would
add noise. This script measures which: each model stays loaded in its own worker (one per thread count), and the
reference (calib-wide Q4_0, tg16) runs before every target test, round after round, for ``--minutes``.

It prints, per target and thread count: the spread of the target's tok/s over the rounds (cv, max/min), the same
for target ÷ the reference measured just before it, and the correlation of the two logs. A normalised cv well
below the raw one says the drift is common to the workloads.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

from v100lab.measure import calibration
from v100lab.models import zoo
from v100lab.measure.backends.isolated import IsolatedBackend
from v100lab.measure.backends.types import BenchTest
from v100lab.facts.config import RunConfig
from v100lab.facts.devices import cpu_name

REFERENCE = ("calib-wide", "Q4_0")


def _targets() -> dict[str, tuple]:
    paths = calibration.calibration_model_paths()
    return {
        "calib-wide:Q4_K": (paths[("calib-wide", "Q4_K")], 0),
        "calib-wide:F16": (paths[("calib-wide", "F16")], 0),
        "calib-deep:F16@d1024": (paths[("calib-deep", "F16")], 1024),
        "synth-750m:Q4_K_M": (zoo.model_path("synth-750m:Q4_K_M"), 0),
        "default": (zoo.model_path("default"), 0),
    }


def _tps(session, depth: int) -> float:
    test = BenchTest(n_gen=calibration.CALIB_N_GEN, n_depth=depth)
    m = session.run(test, 3, warmup=True)
    return 1e9 * test.n_tokens / min(m.samples_ns)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    ref_path = calibration.calibration_model_paths()[REFERENCE]
    targets = _targets()
    sessions = {}
    rows: list[dict] = []
    try:
        for th in args.threads:
            cfg = RunConfig(n_ctx=2048, n_threads=th, n_gpu_layers=0)
            sessions[(th, "ref")] = IsolatedBackend().open(ref_path, cfg)
            for name, (path, _) in targets.items():
                sessions[(th, name)] = IsolatedBackend().open(path, cfg)
        t_end = time.monotonic() + 60 * args.minutes
        rnd = 0
        while time.monotonic() < t_end:
            for th in args.threads:
                for name, (_, depth) in targets.items():
                    ref = _tps(sessions[(th, "ref")], 0)
                    tgt = _tps(sessions[(th, name)], depth)
                    rows.append({"round": rnd, "threads": th, "target": name, "ref_tps": ref, "tps": tgt,
                                 "t": time.time()})
            rnd += 1
            print(f"round {rnd} done", file=sys.stderr, flush=True)
    finally:
        for s in sessions.values():
            s.close()
    print(f"CPU: {cpu_name()}; {rnd} rounds over {args.minutes} min; reference "
          f"{REFERENCE[0]}:{REFERENCE[1]} tg{calibration.CALIB_N_GEN} before every target test\n")
    print("| target | threads | rounds | raw cv | raw max/min | ÷ reference cv | ÷ reference max/min | corr(log) |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for th in args.threads:
        for name in targets:
            rs = [r for r in rows if r["threads"] == th and r["target"] == name]
            if len(rs) < 3:
                continue
            raw = [r["tps"] for r in rs]
            ref = [r["ref_tps"] for r in rs]
            norm = [a / b for a, b in zip(raw, ref)]
            la, lb = [math.log(x) for x in raw], [math.log(x) for x in ref]
            try:
                corr = statistics.correlation(la, lb)
            except statistics.StatisticsError:
                corr = float("nan")

            def cv(v):
                return statistics.stdev(v) / statistics.fmean(v)
            print(f"| {name} | {th} | {len(rs)} | {100 * cv(raw):.1f} % | {max(raw) / min(raw):.2f} | "
                  f"{100 * cv(norm):.1f} % | {max(norm) / min(norm):.2f} | {corr:+.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_name(), "rows": rows}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

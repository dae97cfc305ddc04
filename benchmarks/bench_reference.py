"""What a run's reference measurement costs, and how far it moves between two decodes a step apart.

    flock /tmp/v100lab-measure.lock .venv/bin/python benchmarks/bench_reference.py [-n 5] [-t 0]

Decodes the reference (``v100lab.measure.reference``: the default model, tg32 at depth 0, ``-c 512``, three
repetitions in one load) ``-n`` times in a row at ``-t`` threads and prints, per decode, its wall time (worker
start and load included) and tok/s ± sd; then the wall time's mean ± sd, and each successive pair's shift
(``reference_shift``: ratio, and whether it moved beyond its noise). The budget is 5 s a reference (two per
notebook run on a quiet machine); the shifts show the noise a reference itself has on this machine.
"""

from __future__ import annotations

import argparse
import statistics

from v100lab.measure import reference
from v100lab.predict.drift_scaling import reference_shift


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=5, help="references decoded in a row")
    ap.add_argument("-t", type=int, default=0, help="threads (0: llama.cpp's choice)")
    args = ap.parse_args()
    recs = []
    for i in range(args.n):
        rec = reference.measure(args.t, when=f"#{i + 1}")
        recs.append(rec)
        print(f"reference #{i + 1}: {rec['seconds']:5.2f} s wall, {rec['tps']:7.1f} ± {rec['sd']:5.1f} tok/s "
              f"({rec['model']} {rec['test']} -t {rec['threads']})", flush=True)
    secs = [r["seconds"] for r in recs]
    print(f"wall time per reference: {statistics.mean(secs):.2f} s ± "
          f"{statistics.stdev(secs) if len(secs) > 1 else 0.0:.2f} (n={len(secs)})")
    pred = reference.predicted_tps(args.t)
    if pred:
        print(f"the calibration predicts {pred:.1f} tok/s: the first reference at ×{recs[0]['tps'] / pred:.2f}")
    for a, b in zip(recs, recs[1:]):
        s = reference_shift(a, b)
        print(f"{a['when']} → {b['when']}: ×{s['ratio']:.3f} (± {s['standard_error']:.3f}), "
              f"{'moved beyond its noise' if s['moved'] else 'within its noise'}")


if __name__ == "__main__":
    main()

"""What ``v100lab batch`` itself costs per run, beside the notebooks' own work.

    flock /tmp/v100lab-measure.lock .venv/bin/python benchmarks/bench_batch.py [-r 5]

Runs the tiny test notebook ``tests/data/notebooks/ok.ipynb`` (validates its parameters, renders
them, publishes a headline) ``-r`` times with ``--force`` semantics on ``params/ci.yaml`` and reports:
papermill's time per run (kernel start + the cells + shutdown), the export time (full report plus
reader's report), the whole run, and a cached re-run of the same batch (inputs unchanged: skipped).
Mean ± sd and the coefficient of variation; the machine is shared, so read the CV.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from v100lab.workbook import runner

ROOT = Path(__file__).resolve().parents[1]


def _stats(xs: list[float]) -> str:
    m = statistics.mean(xs)
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{m:6.2f} s ± {sd:5.2f}  (cv {100 * sd / m if m else 0:4.1f}%, n={len(xs)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    args = ap.parse_args()
    params = ROOT / "params" / "ci.yaml"
    nb = ROOT / "tests" / "data" / "notebooks" / "ok.ipynb"
    with tempfile.TemporaryDirectory() as d:
        (run,) = runner.plan_runs([params], [nb])
        papermill_s, total_s = [], []
        for _ in range(args.repetitions + 1):
            t0 = time.perf_counter()
            r = runner.execute_run(run, d, timeout=300, no_input=True, force=True)
            total_s.append(time.perf_counter() - t0)
            papermill_s.append(r.duration_s)
            assert r.ok, r.reason
        papermill_s, total_s = papermill_s[1:], total_s[1:]  # first run warms caches (imports, kernelspec)
        export_s = [t - p for t, p in zip(total_s, papermill_s)]
        t0 = time.perf_counter()
        res = runner.run_batch([params], [nb], d, timeout=300, no_input=True)
        cached_s = time.perf_counter() - t0
        assert res.runs[0].cached
    print("v100lab batch overhead per run (tests/data/notebooks/ok.ipynb on params/ci.yaml)")
    print(f"  papermill (kernel start, cells, shutdown): {_stats(papermill_s)}")
    print(f"  export (report + reader's report):          {_stats(export_s)}")
    print(f"  whole run:                                  {_stats(total_s)}")
    print(f"  unchanged re-run (skipped) incl. index:     {1000 * cached_s:6.1f} ms")


if __name__ == "__main__":
    main()

"""``v100lab batch`` on the local engine vs on Ray, on one machine: wall time and Ray's overhead per task.

    flock /tmp/v100lab-measure.lock .venv/bin/python benchmarks/bench_fleet.py [PARAMS ...] [--notebooks GLOB]
    flock /tmp/v100lab-measure.lock .venv/bin/python benchmarks/bench_fleet.py --tiny 8

Runs the same batch twice with ``force`` (every run executed, none skipped): the local engine, then the Ray
engine on a local instance (one CPU for tasks, as ``--engine ray`` without ``--address`` starts it: one run
at a time, like the local engine). For each: the wall time, the sum of the runs' papermill times (what the
notebooks themselves cost), and the rest per run — kernel-independent batch work (HTML export, the index)
for the local engine, plus submitting, scheduling, shipping the notebook and the reports' bytes for Ray.
Ray's start (``ray.init``) and stop are timed apart, once per batch.

``--tiny N``: N copies of the trivial test notebook's scenario × ``tests/data/notebooks/ok.ipynb`` instead,
so the per-task overhead is not buried under the notebooks' own noise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from v100lab.workbook import runner
from v100lab.workbook.fleet import LOCAL_CPUS, LOCAL_RESOURCES, RayEngine

ROOT = Path(__file__).resolve().parents[1]


def _timed_batch(params, notebooks, out, engine=None) -> tuple[float, runner.BatchResult]:
    t0 = time.perf_counter()
    res = runner.run_batch(params, notebooks, out, timeout=1200, force=True, engine=engine)
    return time.perf_counter() - t0, res


def _line(name: str, wall: float, res: runner.BatchResult) -> str:
    n = len(res.runs)
    runs = sum(r.duration_s for r in res.runs)
    ok = sum(r.ok for r in res.runs)
    return (f"  {name:6s} wall {wall:7.1f} s   Σ papermill {runs:7.1f} s   rest per run {(wall - runs) / n:5.2f} s"
            f"   ({n} runs, {ok} ok)")


def main() -> None:
    import ray  # optional dependency (the [ray] extra)

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("params", nargs="*", default=[str(ROOT / "params" / "ci.yaml")])
    ap.add_argument("--notebooks", action="append")
    ap.add_argument("--tiny", type=int, default=0, metavar="N")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        if args.tiny:
            params = []
            for k in range(args.tiny):
                p = Path(d) / f"tiny{k}.yaml"
                shutil.copy(ROOT / "params" / "ci.yaml", p)
                params.append(p)
            notebooks = [ROOT / "tests" / "data" / "notebooks" / "ok.ipynb"]
        else:
            params = args.params
            notebooks = runner.find_notebooks(args.notebooks or [str(ROOT / runner.DEFAULT_NOTEBOOKS)])
        print(f"load average before: {os.getloadavg()}")
        local_wall, local = _timed_batch(params, notebooks, Path(d) / "local")
        t0 = time.perf_counter()
        ray.init(address="local", num_cpus=LOCAL_CPUS, resources=dict(LOCAL_RESOURCES), include_dashboard=False,
                 log_to_driver=False)
        start_s = time.perf_counter() - t0
        try:
            ray_wall, fleet = _timed_batch(params, notebooks, Path(d) / "ray", RayEngine())
        finally:
            t0 = time.perf_counter()
            ray.shutdown()
            stop_s = time.perf_counter() - t0
        print(f"load average after: {os.getloadavg()}")
    same = [(r.scenario, r.notebook, r.status) for r in local.runs] == [(r.scenario, r.notebook, r.status)
                                                                        for r in fleet.runs]
    print(f"batch {' '.join(map(str, params)) if not args.tiny else f'{args.tiny} x ok.ipynb'}; same runs and "
          f"statuses: {same}")
    print(_line("local", local_wall, local))
    print(_line("ray", ray_wall, fleet))
    rest_ray = ray_wall - sum(r.duration_s for r in fleet.runs)
    rest_local = local_wall - sum(r.duration_s for r in local.runs)
    print(f"  ray start {start_s:.1f} s, stop {stop_s:.1f} s; Ray's overhead per task "
          f"{(rest_ray - rest_local) / len(fleet.runs):+.2f} s")
    for a, b in zip(local.runs, fleet.runs):
        print(f"    {Path(a.params).stem:10s} {Path(a.notebook).stem:26s} local {a.duration_s:6.1f} s  "
              f"ray {b.duration_s:6.1f} s  {a.status}/{b.status}")


if __name__ == "__main__":
    main()

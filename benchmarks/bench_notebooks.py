"""Workbook run time: every notebook executed with papermill on one scenario, timed one by one.

Targets: the full set on params/default.yaml in <= 10 minutes on 2 cores after setup; each notebook
alone <= 3 minutes. "After setup" means the models the scenario uses are already built in the cache: the
script builds them first (untimed) so the figures measure the notebooks, not llama.cpp's quantizer.

Run it with nothing else measuring (llama.cpp's threads spin; another busy process collapses them):

    flock /tmp/v100lab-measure.lock .venv/bin/python benchmarks/bench_notebooks.py [--params params/default.yaml]

Prints a markdown table (notebook, seconds, status) and the total, plus the machine's load average before
and after (a loaded machine makes every measured figure slower, and the notebooks measure; above 1.5 it says
BUSY), the CPU and the llama.cpp build.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_TOTAL_S = 600
TARGET_EACH_S = 180
BUSY_LOAD = 1.5


def where() -> str:
    """The CPU and the llama.cpp build the figures were taken with (what every measured row records)."""
    from v100lab.measure.harness import environment

    env = environment()
    return (f"{env.get('cpu_model')} ({env.get('cpu_count')} logical cores); llama.cpp {env.get('llama_cpp_build')} "
            f"(llama-cpp-python {env.get('llama_cpp_python')}, build flags {env.get('build_flags_source') or '?'})")


def setup(params: Path) -> float:
    """Build (untimed) every model the scenario's notebooks use; returns the seconds it took."""
    from v100lab.workbook.levers import quantization, steps
    from v100lab.gguf.skeleton import SKELETON_PREFIX
    from v100lab.models import zoo
    from v100lab.workbook.scenario import load_scenario

    t0 = time.perf_counter()
    sc = load_scenario(params)
    if sc.measure:
        zoo.model_path(sc.measured_model) if not sc.measured_model.startswith(SKELETON_PREFIX) else None
        zoo.ladder(sc.ladder_model, tuple(q.upper() for q in sc.quants))
        for q in ("F16",) + tuple(q.upper() for q in sc.quants):
            zoo.model_path(f"{quantization.QUALITY_LADDER}:{q}")
        st = steps.study(sc)
        if st.measuring:
            from v100lab.advise.seed import load_seed_claims

            for stage in load_seed_claims()["stages"]:
                model, _ = steps.stage_model(st, stage["quant"])
                zoo.model_path(model)
    return time.perf_counter() - t0


def run(params: Path, notebooks: list[Path], keep: Path | None = None) -> list[tuple[str, float, str]]:
    import papermill as pm

    from v100lab.workbook.scenario import read_parameters
    from v100lab.workbook.runner import KERNEL_NAME, _quiet_about_keys_not_shown

    parameters = read_parameters(params)
    out = []
    with tempfile.TemporaryDirectory() as scratch:
        tmp = keep or Path(scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        for nb in notebooks:
            t0 = time.perf_counter()
            status = "ok"
            try:
                with _quiet_about_keys_not_shown():   # as `v100lab batch`: each notebook shows only the keys it reads
                    pm.execute_notebook(str(nb), str(Path(tmp) / nb.name), parameters=parameters,
                                        kernel_name=KERNEL_NAME, progress_bar=False, log_output=False,
                                        cwd=str(nb.parent))
            except Exception as exc:  # a failing notebook is a result, not a crash of the benchmark
                status = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
            out.append((nb.stem, time.perf_counter() - t0, status))
            print(f"{nb.stem}: {out[-1][1]:.1f} s {status}", file=sys.stderr, flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(ROOT / "params" / "default.yaml"))
    ap.add_argument("--notebooks", default=str(ROOT / "notebooks" / "[0-9][0-9]_*.ipynb"))
    ap.add_argument("--keep", metavar="DIR", help="keep the executed notebooks in DIR (default: a temporary folder)")
    args = ap.parse_args(argv)
    from v100lab.workbook.runner import find_notebooks

    params = Path(args.params)
    notebooks = find_notebooks(args.notebooks)
    setup_s = setup(params)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    rows = run(params, notebooks, Path(args.keep).resolve() if args.keep else None)
    total = time.perf_counter() - t0
    load1 = os.getloadavg()
    print(f"## Workbook run time: {params.name}, {len(rows)} notebooks\n")
    print("| notebook | seconds | target | status |")
    print("| --- | ---: | ---: | --- |")
    for name, s, status in rows:
        mark = "ok" if s <= TARGET_EACH_S else "OVER"
        print(f"| {name} | {s:.1f} | ≤ {TARGET_EACH_S} ({mark}) | {status} |")
    print(f"| **full set** | **{total:.1f}** | ≤ {TARGET_TOTAL_S} ({'ok' if total <= TARGET_TOTAL_S else 'OVER'}) | |")
    print(f"\nsetup (model builds, untimed above): {setup_s:.1f} s; load average before {load0[0]:.2f}, "
          f"after {load1[0]:.2f} (1 min); cpu_count {os.cpu_count()}")
    print(f"machine: {where()}")
    if max(load0[0], load1[0]) > BUSY_LOAD:
        print(f"BUSY: the load average exceeded {BUSY_LOAD} — other processes shared the cores, so these times "
              "are slower than on a quiet machine (llama.cpp's threads spin while they wait)")
    return 0 if all(st == "ok" for _, _, st in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

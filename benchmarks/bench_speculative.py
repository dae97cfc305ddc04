"""Speculative decoding measured vs predicted: notebook 13's sweep (n-gram self-speculation through llama-server,
draft lengths 1, 2, 4, 8 against none, a repeating and a non-repeating prompt, greedy) on the default model, the
tok/s predicted from each run's measured acceptance beside it, and the median |error| over the configurations.

The prediction takes the measured speed without speculation and the package's cost of verifying n + 1 tokens
relative to one (the batched-decode curve of ``v100lab calibrate --batching`` when stored; the roofline without).

Run it alone on the machine, under the shared lock:
    flock /tmp/v100lab-measure.lock .venv/bin/python benchmarks/bench_speculative.py [-t 2] [-r 3]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from v100lab.workbook.levers import spec_decode
from v100lab.measure.backends.server import find_llama_server
from v100lab.measure.backends.types import tool_version
from v100lab.base.buildflags import host_cpu
from v100lab.workbook.scenario import Scenario
from v100lab.predict.serving import stored_batching


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=0, help="CPU threads (0: all)")
    ap.add_argument("-r", "--repetitions", type=int, default=3, help="completions per prompt and draft length")
    ap.add_argument("--model", default="default")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    binary = find_llama_server()
    if binary is None:
        print("no llama-server: build it with scripts/build-tools.sh", file=sys.stderr)
        return 2
    v = tool_version(binary)
    print(f"host: {host_cpu().model}; llama-server {binary} ({v.get('version') or v.get('error') or v})")
    print(f"batched-decode calibration: {'stored' if stored_batching() else 'none (roofline)'}")
    sc = Scenario(model=args.model, device="host", n_threads=args.threads, repetitions=args.repetitions)
    t0 = time.monotonic()
    df = spec_decode.spec_sweep(sc)
    print(f"measured in {time.monotonic() - t0:.0f} s; {df.attrs.get('conditions', '')}")
    if not (df["source"] == "measured").any():
        print(f"nothing measured: {df.attrs.get('why_not_measured')}", file=sys.stderr)
        return 1
    wide = df.pivot_table(index=["group", "value"], columns=["metric", "source"], values="result", aggfunc="first")
    print(wide.to_string(float_format=lambda x: f"{x:.3f}"))
    for name, b in spec_decode.best_draft_rows(df).items():
        print(f"{name}: best draft length {b['draft_max']}, {b['tg_tps']:.1f} tok/s ({b['speedup']:.2f}× none)")
    err = spec_decode.median_error(df)
    print(f"median |error| of predicted tok/s: {100 * err:.1f} % over "
          f"{int(((df.metric == 'tg_tps') & (df.source == 'predicted')).sum())} configurations")
    for f in df.attrs.get("failures") or []:
        print(f"failed: draft length {f['value']}: {f['reason']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

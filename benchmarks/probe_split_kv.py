"""Decode speed against depth around the CPU flash-attention split-KV threshold (issue 18, item 1).

ggml-cpu's flash attention splits a decode step's KV cells across the threads once the graph spans 512 cells
(ops.cpp, ggml_compute_forward_flash_attn_ext_f16, use_split_kv_path): a barrier and a reduction per layer that
the query-head split below it does not have. This measures calib-deep F16 and the default model at depths
0, 160 (n_kv 256), 300 (n_kv 512), 1024 and 2048, at 2 and 1 threads, in interleaved passes (``calibration.measure``:
tg32, fastest of the repetitions), and prints tok/s per pass and the median — a jump between depth 160 and 300
beyond the slope of the deeper points is the split path's cost. Prints figures, asserts nothing.

    python benchmarks/probe_split_kv.py [--passes 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from v100lab.measure import calibration
from v100lab.models.modelcache import default_model_path

DEPTHS = (0, 160, 300, 1024, 2048)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--threads", default="2,1", help="thread counts, comma-separated (default 2,1)")
    ap.add_argument("--json", help="also write the per-pass figures to this JSON file")
    args = ap.parse_args(argv)
    models = {"calib-deep:F16": calibration.calibration_model_paths()[("calib-deep", "F16")],
              "default": default_model_path()}
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    res: dict[str, list[float]] = {}
    for p in range(args.passes):
        for th in threads:
            for name, path in models.items():
                for d in DEPTHS:
                    t = calibration.measure(path, th, depth=d, repetitions=3)
                    tps = 1.0 / t["tg"].s_per_token
                    res.setdefault(f"{name}|{th}|{d}", []).append(tps)
                    print(f"pass {p + 1}/{args.passes}  {name:15s} t{th} d{d:<5d} {tps:8.1f} tok/s", file=sys.stderr,
                          flush=True)
    print("| model | threads | " + " | ".join(f"depth {d}" for d in DEPTHS) + " |")
    print("|---|--:|" + "--:|" * len(DEPTHS))
    for th in threads:
        for name in models:
            cells = []
            for d in DEPTHS:
                v = res[f"{name}|{th}|{d}"]
                cells.append(f"{statistics.median(v):.1f} ({min(v):.0f}–{max(v):.0f})")
            print(f"| {name} | {th} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Quality per quant on the default model's real ladder: perplexity and KL divergence from the F16
reference (the Q4_1 weights dequantized by llama.cpp), on CPython's pydoc_data.topics.

    .venv/bin/python benchmarks/bench_quality.py [--ctx 256] [--chunks 4] [--quants Q8_0,Q6_K,...]

The figures do not depend on timing (greedy logits, fixed corpus), so they are exact for a given
llama.cpp build; only the run time does.
"""

from __future__ import annotations

import argparse
import time

from v100lab.measure import quality
from v100lab.models import zoo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--quants", default="Q8_0,Q6_K,Q5_K_M,Q4_K_M,Q4_0,Q3_K_M,Q2_K")
    args = ap.parse_args()
    print(f"corpus: {quality.CORPUS_NAME}; n_ctx {args.ctx}, {args.chunks} chunks (second half scored)")
    print("| model | file MiB | perplexity (± se) | KL vs F16 (nats) | top-1 agreement |")
    print("| --- | ---: | ---: | ---: | ---: |")
    t0 = time.perf_counter()
    for name in ["default:F16", "default", *[f"default:{q}" for q in args.quants.split(",")]]:
        r = quality.evaluate(name, "default:F16", n_ctx=args.ctx, n_chunks=args.chunks)
        size = zoo.model_path(name).stat().st_size / 2**20
        print(f"| {name} ({zoo.quant_of(name)}) | {size:.1f} | {r.ppl:.2f} (± {r.ppl_stderr:.2f}) | "
              f"{r.kld_mean:.4f} | {r.top1_agreement:.3f} |")
    print(f"\n{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()

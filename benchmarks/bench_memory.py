"""Memory model against llama.cpp's own buffers (issue 4), and the seed's claims in numbers.

Part 1 loads every configuration below in llama.cpp (llama-cpp-python's CPU build, low-level API so
n_seq_max / kv_unified / flash-attn auto are real), reads the buffer sizes llama.cpp prints (model, KV,
compute, output) through its log callback, and compares them with ``v100lab.memory.plan`` for the host.
Targets: weights and KV within 0.1 %, compute within 5 %, total within 2 % (allowing the log's
two-decimal MiB rounding).

Part 2 (item 7): the qwen35 27B and Gemma-3-27B skeletons on a Tesla V100 16 GB — which quants fit at
2048/4096/8192 with f16 and q8_0 KV, how many layer slots spill to the CPU, and the largest context.

Run:  flock /tmp/v100lab-measure.lock .venv/bin/python benchmarks/bench_memory.py [--markdown]
(memory figures do not depend on timing; the lock only keeps the load off other helpers' measurements).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

from v100lab import zoo
from v100lab.config import RunConfig
from v100lab.errors import RunFailed

TARGETS = {"weights": 0.001, "kv_cache": 0.001, "compute": 0.05, "total": 0.02}

# (model alias, run-config fields): 40 configurations across the default model, gemma3-270m (SWA) and
# synthetic llama models; n_ctx 256…32768, n_ubatch 32…2048, f16/q8_0/q4_0 caches, flash attention
# on/off/auto, n_parallel 1/2/4 with and without kv_unified, swa_full on/off.
CONFIGS: list[tuple[str, dict]] = [
    ("default", dict(n_ctx=256)),
    ("default", dict(n_ctx=2048)),
    ("default", dict(n_ctx=4096)),
    ("default", dict(n_ctx=8192, n_ubatch=2048)),
    ("default", dict(n_ctx=32768, flash_attn="off")),
    ("default", dict(n_ctx=32768, flash_attn="off", n_ubatch=32)),
    ("default", dict(n_ctx=32768, flash_attn="on", n_ubatch=2048)),
    ("default", dict(n_ctx=4096, flash_attn="off", n_ubatch=128)),
    ("default", dict(n_ctx=4096, cache_type_k="q8_0", cache_type_v="q8_0")),
    ("default", dict(n_ctx=4096, cache_type_k="q4_0", cache_type_v="q4_0", flash_attn="on")),
    ("default", dict(n_ctx=4096, cache_type_k="q8_0", flash_attn="off")),
    ("default", dict(n_ctx=4096, n_parallel=2)),
    ("default", dict(n_ctx=4096, n_parallel=4)),
    ("default", dict(n_ctx=4096, n_parallel=4, kv_unified=True)),
    ("default", dict(n_ctx=3000, n_parallel=3, n_ubatch=256)),
    ("default", dict(n_ctx=16384, n_parallel=4, flash_attn="off", n_ubatch=1024)),
    ("default", dict(n_ctx=8192, n_gpu_layers=0, use_mmap=False)),
    ("gemma3-270m", dict(n_ctx=256)),
    ("gemma3-270m", dict(n_ctx=4096)),
    ("gemma3-270m", dict(n_ctx=4096, swa_full=True)),
    ("gemma3-270m", dict(n_ctx=32768)),
    ("gemma3-270m", dict(n_ctx=32768, swa_full=True, n_ubatch=2048)),
    ("gemma3-270m", dict(n_ctx=32768, flash_attn="off", n_ubatch=2048)),
    ("gemma3-270m", dict(n_ctx=8192, n_ubatch=100)),
    ("gemma3-270m", dict(n_ctx=8192, n_ubatch=32, flash_attn="off")),
    ("gemma3-270m", dict(n_ctx=8192, n_parallel=2)),
    ("gemma3-270m", dict(n_ctx=8192, n_parallel=4)),
    ("gemma3-270m", dict(n_ctx=8192, n_parallel=4, kv_unified=True)),
    ("gemma3-270m", dict(n_ctx=8192, n_parallel=2, kv_unified=True, swa_full=True)),
    ("gemma3-270m", dict(n_ctx=4096, cache_type_k="q8_0", cache_type_v="q8_0")),
    ("gemma3-270m", dict(n_ctx=4096, cache_type_k="q4_0", cache_type_v="q4_0", flash_attn="on")),
    ("synth-tiny", dict(n_ctx=4096)),
    ("synth-tiny", dict(n_ctx=16384, flash_attn="off", n_ubatch=1024)),
    ("synth-tiny", dict(n_ctx=32768, n_ubatch=2048, cache_type_k="q8_0", cache_type_v="q8_0")),
    ("synth-tiny:Q4_0", dict(n_ctx=4096)),
    ("synth-tiny:Q4_0", dict(n_ctx=8192, n_parallel=2, flash_attn="off")),
    ("synth-tiny:Q4_K_M", dict(n_ctx=4096, cache_type_k="q4_0", cache_type_v="q4_0")),
    ("synth-tiny:Q4_K_M", dict(n_ctx=2048, n_ubatch=64, flash_attn="off")),
    ("synth-small", dict(n_ctx=8192)),
    ("synth-small", dict(n_ctx=32768, flash_attn="off", n_ubatch=512)),
    ("synth-small", dict(n_ctx=4096, n_parallel=4, cache_type_k="q8_0", cache_type_v="q8_0")),
]
# llama.cpp must refuse these, and the plan must warn (quantized V without flash attention)
REFUSED: list[tuple[str, dict]] = [
    ("default", dict(n_ctx=2048, cache_type_k="q8_0", cache_type_v="q8_0", flash_attn="off")),
    ("gemma3-270m", dict(n_ctx=2048, cache_type_v="q4_0", flash_attn="off")),
]


def _label(kw: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in kw.items())


def run_validation(configs=CONFIGS, refused=REFUSED):
    from v100lab.header import read_spec
    from v100lab.memory import check_against_llama, plan

    rows, refusals = [], []
    for alias, kw in configs:
        path = zoo.resolve(alias)
        spec = read_spec(path)
        cfg = RunConfig(**kw)
        checks, facts, p = check_against_llama(path, cfg, spec)
        rows.append((alias, kw, checks, facts))
    for alias, kw in refused:
        path = zoo.resolve(alias)
        cfg = RunConfig(**kw)
        warned = any("refuses" in w for w in plan(read_spec(path), [], cfg, with_max_ctx=False).warnings)
        try:
            check_against_llama(path, cfg)
            outcome = "loaded (NOT refused)"
        except RunFailed as exc:
            outcome = f"refused: {str(exc).split(': ', 1)[-1]}"
        refusals.append((alias, kw, warned, outcome))
    return rows, refusals


def validation_markdown(rows, refusals) -> str:
    mib = 2**20
    out = ["| # | model | config | weights MiB pred/llama | KV MiB | compute MiB | output MiB | total err | FA |",
           "|---|---|---|---|---|---|---|---|---|"]
    worst = {k: 0.0 for k in TARGETS}
    ok = {k: 0 for k in TARGETS}
    for i, (alias, kw, c, facts) in enumerate(rows, 1):
        for k in TARGETS:
            worst[k] = max(worst[k], abs(c[k].error))
            ok[k] += c[k].within(TARGETS[k])

        def cell(k):
            return f"{c[k].predicted_bytes / mib:.2f} / {c[k].measured_bytes / mib:.2f} ({100 * c[k].error:+.2f}%)"
        out.append(f"| {i} | {alias} | {_label(kw)} | {cell('weights')} | {cell('kv_cache')} | {cell('compute')} | "
                   f"{c['output'].predicted_bytes / mib:.3f} / {c['output'].measured_bytes / mib:.2f} | "
                   f"{100 * c['total'].error:+.2f}% | {facts.flash_attn or '-'} |")
    n = len(rows)
    out += ["", f"Within target (log rounding of ±0.005 MiB allowed): weights {ok['weights']}/{n} (≤ 0.1 %), "
            f"KV {ok['kv_cache']}/{n} (≤ 0.1 %), compute {ok['compute']}/{n} (≤ 5 %), total {ok['total']}/{n} (≤ 2 %). "
            f"Largest |error|: weights {100 * worst['weights']:.3f} %, KV {100 * worst['kv_cache']:.3f} %, "
            f"compute {100 * worst['compute']:.2f} %, total {100 * worst['total']:.2f} %."]
    if refusals:
        out += ["", "Configurations llama.cpp must refuse (quantized V cache without flash attention):", ""]
        for alias, kw, warned, outcome in refusals:
            out.append(f"- {alias} {_label(kw)}: plan warns: {'yes' if warned else 'NO'}; llama.cpp: {outcome}")
    return "\n".join(out)


def seed_claims_markdown(device_id: str = "v100-16gb") -> str:
    """Item 7: the qwen35 27B and Gemma-3-27B skeletons on a V100 16 GB."""
    from v100lab.devices import get_device
    from v100lab.memory import max_ctx, max_gpu_layers, plan
    from v100lab.skeleton import skeleton_spec

    dev = get_device(device_id)
    quants = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K")
    out = []
    for arch in ("qwen35-27b", "gemma3-27b"):
        out += [f"**{arch}** on {dev.name} ({dev.memory_gib:g} GiB, {dev.runtime_overhead_mib:g} MiB runtime overhead "
                "assumed), -ngl all, n_ubatch 512, flash attention on, 1 sequence. Cells: GPU GiB needed with all "
                "layers on the GPU (✓ fits / ✗ does not), and when it does not, the layer slots that spill at the "
                "largest -ngl that fits.", "",
                "| quant | file GiB | KV | 2048 | 4096 | 8192 | largest n_ctx (all layers on GPU) |",
                "|---|---|---|---|---|---|---|"]
        for q in quants:
            spec = skeleton_spec(arch, q)
            for ct in ("f16", "q8_0"):
                cells = []
                for n_ctx in (2048, 4096, 8192):
                    cfg = RunConfig(n_ctx=n_ctx, cache_type_k=ct, cache_type_v=ct)
                    p = plan(spec, dev, cfg, with_max_ctx=False)
                    g = p.devices[dev.id]
                    if p.fits:
                        cells.append(f"✓ {g.total_bytes / 2**30:.2f}")
                    else:
                        ngl = max_gpu_layers(spec, dev, cfg)
                        cells.append(f"✗ {g.total_bytes / 2**30:.2f}, spill {p.n_layer_total - ngl}/{p.n_layer_total}")
                mc = max_ctx(spec, dev, RunConfig(cache_type_k=ct, cache_type_v=ct))
                out.append(f"| {q} | {spec.weight_bytes / 2**30:.2f} | {ct} | " + " | ".join(cells) + f" | {mc} |")
        out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-validation", action="store_true")
    ap.add_argument("--skip-claims", action="store_true")
    args = ap.parse_args(argv)
    import llama_cpp

    t0 = time.time()
    print(f"machine: {platform.machine()}, {platform.system()}; llama-cpp-python {llama_cpp.__version__}; "
          f"date {time.strftime('%Y-%m-%d')}")
    if not args.skip_validation:
        rows, refusals = run_validation()
        print(f"\n### Validation: {len(rows)} configurations\n")
        print(validation_markdown(rows, refusals))
    if not args.skip_claims:
        print("\n### The seed's claims in numbers (skeletons, predicted)\n")
        print(seed_claims_markdown())
    print(f"\n(took {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Write the workbook's notebooks (notebooks/NN_*.ipynb) from the cell lists below, without outputs.

Run ``.venv/bin/python notebooks/make_notebooks.py`` after changing a notebook here or the scenario schema
(the parameters cell comes from ``v100lab.scenario.parameters_cell_source()``). The committed .ipynb files
are the product; ``tests/test_notebooks.py`` checks they carry no outputs and that their parameters cell is
the schema's.

Each notebook: a markdown title and introduction, the ``parameters`` cell, ONE validation cell, then
narrative and cells that each call one package function (and display or plot its result), and a summary
written from this run's numbers by ``v100lab.levers.summary_*``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

from v100lab.scenario import parameters_cell_source

HERE = Path(__file__).resolve().parent

VALIDATE = """\
# Validate the parameters above (papermill's injected ones included): a wrong key or type stops here.
from v100lab import levers, plots, render
from v100lab.scenario import from_notebook

sc = from_notebook(globals())
render.table(levers.scenario_facts(sc))"""

M, C = "md", "code"

NOTEBOOKS: dict[str, list[tuple[str, str]]] = {}

NOTEBOOKS["00_overview"] = [
    (M, """# 00 · Overview: from 4 to 64 tok/s, checked with numbers

A blog post (the *seed*) tells how one 16 GB V100 went from 4 to a claimed 64 tok/s with a ~27B Qwen model
in llama.cpp: the right quantization, all layers on the GPU, a smaller context, a quantized KV cache. Each
step was "calculated". This workbook redoes the calculation — memory, bandwidth ceiling, a calibrated speed
model — and measures every lever with real llama.cpp runs on this machine, so that every claim stands
next to a prediction and a measurement.

Edit the parameters below (or run with `papermill -f params/<scenario>.yaml`); the next cell validates them."""),
    (M, "## The map of the workbook"),
    (C, "render.table(levers.notebook_map())"),
    (M, """## The seed's staircase

Left: each stage of the seed, as it claims it (grey range) and as the speed model predicts it for the seed's
V100 and its assumed model (qwen35 27B; see `params/models/qwen35-27b.yaml`); the dotted marks are the strict
ceiling — bytes a token must read at the card's peak bandwidth. A claim above it is marked ✕: no GPU decodes
faster than it can read the weights. Right: each stage's flags run for real on this machine, with the
measured model, beside the prediction for it."""),
    (C, "stairs = levers.staircase(sc)\nplots.staircase(stairs)"),
    (M, "## What this run showed"),
    (C, "levers.summary_overview(sc, stairs)"),
    (C, "levers.headline(stairs, lever=\"stage\")"),
]

NOTEBOOKS["01_vram_triangle"] = [
    (M, """# 01 · The VRAM triangle: model size × context × card memory

The seed's first argument: of model size, context length and one card's memory you can pick two. Here the
triangle is computed instead of argued: the model's header gives every tensor's size, llama.cpp's own
arithmetic gives the KV cache, compute and output buffers, and the device's capacity (minus the runtime's
overhead) says what fits."""),
    (M, "## The model, from its header"),
    (C, "render.table(levers.header_facts(sc))"),
    (M, """## Where every byte goes

The scenario's configuration, predicted per device and component; when a model runs here, llama.cpp's
own buffer sizes from its load log (hatched) stand beside the prediction for the same model."""),
    (C, "mem = levers.memory_breakdown(sc)\nplots.memory_breakdown(mem)"),
    (M, """## What fits: quant × context × cache type

Each cell is the memory left on the device (GiB) with every layer requested on it; red cells do not fit, so
llama.cpp would leave layers on the CPU (see 05) or refuse to load."""),
    (C, "grid = levers.fit_grid(sc)\nplots.fit_heatmap(grid)"),
    (M, "## The largest context that fits, per quant and cache type (tokens)"),
    (C, "render.table(levers.largest_context(grid))"),
    (M, "## The triangle, stated with this run's numbers"),
    (C, "levers.summary_triangle(sc, mem, grid)"),
]

NOTEBOOKS["02_bandwidth_ceiling"] = [
    (M, """# 02 · The bandwidth ceiling and the roofline

Decoding one token reads (almost) every weight once, so tok/s ≤ bandwidth / bytes read per token — the seed's
ceiling. It is an upper bound, not a prediction: on a GPU decode reaches a fraction of it, on a small CPU
de-quantizing 2–6-bit weights costs more than reading them. The speed model keeps both terms (memory and
compute) per weight type, calibrated on this machine and fitted on published GPU rows."""),
    (M, "## The ceiling per quant on the scenario's device (and the seed's own table)"),
    (C, "ceil = levers.ceilings(sc)\nplots.ceilings(ceil)"),
    (M, "## The same model across the device catalog"),
    (C, "cat = levers.catalog_ceilings(sc)\nplots.catalog(cat)"),
    (M, """## This machine's roofline

The model measured here, across its quant ladder (as llama-quantize would make it): the plain bandwidth
ceiling at this machine's measured bandwidth, the calibrated prediction, and the measured decode speed."""),
    (C, "roof = levers.roofline(sc)\nplots.roofline(roof)"),
    (M, """## Published Apple Silicon rows against the speed model

llama.cpp's public Apple Silicon table (Llama 2 7B, F16/Q8_0/Q4_0; shipped in `v100lab/data`) — each chip
predicted by a fit on the *other* chips, so no row judges its own fit."""),
    (C, "apple = levers.apple(sc)\nplots.apple(apple)"),
    (M, "## What this run showed"),
    (C, "levers.summary_ceiling(sc, ceil, cat, roof, apple)"),
    (C, "levers.headline(roof, lever=\"quant\")"),
]

NOTEBOOKS["03_baseline"] = [
    (M, """# 03 · Baseline: llama.cpp's defaults, measured

The seed's baseline was 4–5 tok/s with nvidia-smi showing a few hundred MB used: the weights were not on the
GPU (`--gpu-layers` defaulted to 0 in older llama.cpp). First admit a number is abnormal, then check it
against what it should be. Here: a real llama-bench-style run (prompt processing and decode, repeated) with
the scenario's flags, the load log's account of where each buffer went, and the prediction for both."""),
    (M, "## Measured vs predicted"),
    (C, "base = levers.baseline(sc)\nplots.sweep(base, \"Baseline: llama.cpp's defaults\", lever=\"config\")"),
    (M, "## What the load log says"),
    (C, "diag = levers.load_diagnosis(sc)\nrender.table(diag)"),
    (M, "## What this run showed"),
    (C, "levers.summary_baseline(sc, base, diag)"),
    (C, "levers.headline(base, lever=\"config\")"),
]

NOTEBOOKS["04_quantization"] = [
    (M, """# 04 · Quantization: speed, size — and quality measured, not judged by impression

The seed chose Q4_0 over Q4_K_M for speed and called Q3_K_M "clearly dumber" by impression. Here the quant
ladder of a synthetic model is built with llama.cpp's own quantizer and measured (decode, prompt, file size)
against the prediction; and quality is measured as perplexity and KL divergence from the unquantized
reference on a text that ships with Python (`pydoc_data.topics`, the Language Reference topics)."""),
    (M, "## Speed per quant"),
    (C, "ladder = levers.quant_ladder(sc)\nplots.quant_ladder(ladder)"),
    (M, "## File size per quant"),
    (C, "plots.file_sizes(ladder)"),
    (M, """## Quality per quant

The default model's real ladder: SmolLM2-135M's weights dequantized to F16 by llama.cpp (the reference),
then quantized to each rung; perplexity of each, and its KL divergence from the reference's next-token
distribution (llama-perplexity's method).

One caveat to read the bars with: SmolLM2 ships as Q4_1, so the "F16" reference is a 4-bit model written
out in 16 bits, and every rung re-quantizes it. Rungs whose grid cannot hold Q4_1's levels (Q5_K_M, Q4_0) lose
more than their bit count suggests; 8 and 6 bits stay near-lossless and 2 bits is worst, as with a true F16
model. The perplexity's standard error is wide on this short text: the KL divergence and the top-1 agreement,
measured at the same positions, are the sharper signal."""),
    (C, "qual = levers.quality_ladder(sc)\nplots.quality(qual)"),
    (M, "## What this run showed"),
    (C, "levers.summary_quantization(sc, ladder, qual)"),
    (C, "levers.headline(ladder, lever=\"quant\")"),
]

NOTEBOOKS["05_gpu_layers"] = [
    (M, """# 05 · -ngl: how many layers on the GPU, and the spill effect

`-ngl k` puts the output layer and the last k − 1 repeating layers on the GPU; the rest run on the CPU from
host memory at host bandwidth, and every token crosses PCIe. The seed's stage 2 → 3 jump (18 → 44 tok/s after
shrinking the context) is predicted here as layers that no longer fit at 8192 tokens coming back onto the
GPU at 2048 — shrinking `--ctx-size` does not make decoding read less KV at an almost empty context."""),
    (M, "## The -ngl sweep"),
    (C, "ngl = levers.gpu_layers_sweep(sc)\nplots.gpu_layers(ngl)"),
    (M, "## The spill effect: context size with -ngl 999"),
    (C, "spill = levers.spill_effect(sc)\nplots.spill(spill)"),
    (M, "## What this run showed"),
    (C, "levers.summary_gpu_layers(sc, ngl, spill)"),
    (C, "levers.headline(ngl, lever=\"n_gpu_layers\")"),
]

NOTEBOOKS["06_context_and_kv_cache"] = [
    (M, """# 06 · Context size and the KV cache

The KV cache grows with the context (cells × layers with a cache × K and V widths × bytes per element); a
quantized cache type shrinks it. Decoding reads the cells in use, so speed falls with depth, not with
`--ctx-size`. And in llama.cpp a quantized V cache needs flash attention — the seed's final command asks for
q8_0 V with flash attention left off."""),
    (M, "## KV cache memory: predicted vs llama.cpp's log"),
    (C, "kv = levers.kv_memory(sc)\nplots.kv_memory(kv)"),
    (M, "## Decode speed against depth"),
    (C, "depth = levers.depth_sweep(sc)\nplots.sweep(depth, \"Decode speed vs tokens already in the context\", "
        "lever=\"n_depth\", metrics=(\"tg_tps\",))"),
    (M, "## Quantized V needs flash attention"),
    (C, "qv = levers.quantized_v(sc)\nrender.table(qv)"),
    (M, "## What this run showed"),
    (C, "levers.summary_context(sc, kv, depth, qv)"),
    (C, "levers.headline(depth, lever=\"n_depth\")"),
]

NOTEBOOKS["07_batch_flash_attn_parallel_mlock"] = [
    (M, """# 07 · Batch size, flash attention, --parallel, mmap/mlock, threads

The remaining levers of the seed: `-b/-ub` (how many prompt tokens one graph processes — prompt speed, not
single-stream decode), flash attention (no gain on the seed's V100), `--parallel` (slots share the same
bandwidth: total tok/s rises, per-stream falls), `--mlock`/`--no-mmap` (loading and the first token), and
CPU threads."""),
    (M, "## Batch and micro-batch"),
    (C, "batch = levers.batch_sweep(sc)\nplots.sweep(batch, \"-ub: prompt processing vs decode\", lever=\"n_ubatch\")"),
    (M, "## Flash attention"),
    (C, "fa = levers.flash_attn_sweep(sc)\nplots.sweep(fa, \"Flash attention off vs on\", lever=\"flash_attn\")"),
    (M, "## --parallel through llama-server"),
    (C, "par = levers.parallel_sweep(sc)\nplots.sweep(par, \"--parallel: total and per-stream decode\", "
        "lever=\"n_parallel\", metrics=(\"tg_tps\", \"tg_tps_per_stream\"), ceiling=False)"),
    (M, "## mmap, --no-mmap, --mlock"),
    (C, "load = levers.mmap_mlock(sc)\nplots.load_times(load)"),
    (M, "## Threads"),
    (C, "threads = levers.threads_sweep(sc)\nplots.sweep(threads, \"-t: CPU threads\", lever=\"n_threads\")"),
    (M, "## What this run showed"),
    (C, "levers.summary_levers(sc, batch, fa, par, load, threads)"),
    (C, "levers.headline(threads, lever=\"n_threads\")"),
]

NOTEBOOKS["08_final_config"] = [
    (M, """# 08 · The final configuration

Everything before, put together by `v100lab tune`: every combination of quant (4 bits and more), KV cache
type, flash attention and micro-batch is predicted for the scenario's device at the context the scenario
needs; those that fit with a margin are ranked by predicted decode speed (measured and chosen by measurement
when the device is this machine). The result is a llama-server command with a reason for every flag."""),
    (M, "## The tuned command"),
    (C, "render.code(levers.tuned_command(sc))"),
    (M, "## Why each flag is there, and what it buys"),
    (C, "render.table(levers.command_reasons(sc))"),
    (M, """## This scenario's own staircase

From llama.cpp's defaults to the tuned configuration, one change per stage: predicted on the scenario's
device, and each stage's flags measured here with the measured model."""),
    (C, "stairs = levers.own_staircase(sc)\nplots.sweep(stairs, \"From llama.cpp's defaults to the tuned command\", "
        "lever=\"stage\", metrics=(\"tg_tps\",))"),
    (M, """## The seed's final command, flag by flag

The seed's own command for its V100, against the tuned one for the same device and assumed model."""),
    (C, "verdict = levers.seed_verdict_table(sc)\nrender.table(verdict)"),
    (M, "## What this run showed"),
    (C, "levers.summary_final(sc, stairs, verdict)"),
    (C, "levers.headline(stairs, lever=\"stage\")"),
]


def build(name: str, cells: list[tuple[str, str]]):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    intro, rest = cells[0], cells[1:]
    out = [nbformat.v4.new_markdown_cell(intro[1])]
    params = nbformat.v4.new_code_cell(parameters_cell_source())
    params.metadata["tags"] = ["parameters"]
    out += [params, nbformat.v4.new_code_cell(VALIDATE)]
    for kind, src in rest:
        out.append(nbformat.v4.new_markdown_cell(src) if kind == M else nbformat.v4.new_code_cell(src))
    for i, c in enumerate(out):
        c["id"] = f"{name[:2]}-{i:02d}"   # stable ids: regenerating changes nothing that did not change
    nb.cells = out
    return nb


def main(names: list[str] | None = None) -> int:
    for name, cells in NOTEBOOKS.items():
        if names and name not in names:
            continue
        nbformat.write(build(name, cells), HERE / f"{name}.ipynb")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

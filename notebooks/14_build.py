# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 14 · The build: what llama.cpp was compiled for decides what it can do
#
# The seed's fourth lever is the build itself: `-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=70` and "a CUDA 11.x/12.x
# toolchain for a V100". A llama.cpp built without CUDA never touches the card, whatever `-ngl` says — the most
# common llama.cpp question there is. On a CPU the build matters as much: it fixes the SIMD instructions the kernels
# use (AVX2, AVX-512), which weight types the CPU backend *repacks* into interleaved blocks that its fastest kernels
# read, and with them the cost of de-quantizing each weight. On a small CPU that cost, not the memory bandwidth,
# is what limits decode. Here: this machine's CPU and build, the cost per weight type beside the bandwidth, the
# measured decode of the quant ladder, and the CUDA build for the scenario's card. Nothing here compiles: a build
# that is not installed is described from its flags and predicted.

# %% tags=["parameters"]
# Parameters (tag: parameters). Generated from v100lab.workbook.scenario; do not edit by hand.
# papermill and `v100lab batch` replace these from a params/*.yaml file; by hand, edit them here.

# -- the scenario: what is studied, for which device
model: str = "default"                    # model studied: GGUF path, http(s) URL or zoo alias (default, gemma3-270m, synth-1b, synth-280m:Q4_0, ...)
stand_in_model: "Optional[str]" = None    # model measured here when `model` is a header-only skeleton or too big for this machine (None: measure `model`); its rows are labelled stand-in
device: str = "host"                      # device the predictions are for: catalog id (v100-16gb, ...) or a device YAML file; host: this machine, measured
compare_gpu: str = "v100-16gb"            # GPU predicted beside this machine when `device` is a CPU: the seed's model on it (01 what fits, 05 -ngl and the spill); none: no GPU
measure: bool = True                      # run real llama.cpp measurements here (False: predictions only)
server_url: "Optional[str]" = None        # an already running llama-server measured instead of this machine, http://HOST:PORT; flags it was started with stay (None: llama.cpp here)

# -- llama.cpp flags (v100lab.facts.config.RunConfig; llama.cpp's defaults)
n_threads: int = 0                        # -t: CPU threads (0: llama.cpp's choice, all cores)

# -- levers swept by the notebooks
quants: list[str] = ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K"]  # quant ladder: predicted for `model`, measured on `ladder_model` (04)

# -- measurement budget
n_gen: int = 128                          # generated tokens per tg test (llama-bench -n)
repetitions: int = 5                      # repetitions per test (llama-bench -r); reports show the spread

# %%
# Validate the parameters above (papermill's injected ones included): a wrong type or value stops here.
from v100lab.workbook import plots, render
from v100lab.workbook.levers import baseline, build, by_hand, exercises, overview
from v100lab.workbook.scenario import from_notebook

sc = from_notebook(globals())
render.text_table(overview.scenario_facts(sc))

# %% [markdown]
# ## This CPU and the build in use
#
# `scripts/setup.sh` compiles llama.cpp with `-DGGML_NATIVE=OFF` and names every x86 feature this CPU has (AMX always
# off: it crashes in this llama.cpp commit). The system-info line is llama.cpp's own account of what it was compiled
# with; the repacked types are the ones `repack.cpp` re-lays out on this build (`ggml_repack_get_optimal_repack_type`:
# Q4_0, Q4_K, IQ4_NL and MXFP4 with AVX2, Q2_K too with AVX-512). Q4_1 has no interleaved kernel at all in this
# commit, so a Q4_1 model — the default one — is multiplied row by row, de-quantizing each block as it goes.

# %%
render.text_table(build.build_facts(sc))

# %% [markdown]
# ### The safe build against an AVX2-only and an AVX-512 one
#
# The same commit with other flags: what each would run, from its flags. Only the build installed here is
# measured; a build's per-type costs belong to it (a host calibration is remade after a rebuild), so another build's
# speed is not predicted from this one's calibration.

# %%
render.text_table(build.simd_builds(sc))

# %% [markdown]
# ## De-quantization per weight type: why a CPU decode here is compute-bound
#
# A decoded token multiplies every weight once. Two times per weight: reading its bytes at the bandwidth decode
# reaches, and de-quantizing and multiplying it — the host calibration's cost per weight of each type, at the
# scenario's threads. The larger one is what a token pays. Bars: the calibrated cost; grey: the bandwidth time;
# a repacked type is marked.

# %%
costs = build.dequant_costs(sc)
plots.dequant_costs(costs)

# %%
build.caption_dequant(sc, costs)

# %% [markdown]
# ### The bandwidth time of a weight, by hand
#
# A Q4_1 block holds 32 weights in 20 bytes (4-bit values, an f16 scale and an f16 minimum): 5 bits a weight.
# At the bandwidth decode reads at, a weight's bytes take bytes ÷ bandwidth; the calibrated cost ÷ that time says how
# many times longer the arithmetic takes than the read.

# %% tags=["by-hand"]
block_bytes, block_weights = 2 + 2 + 32 // 2, 32                     # Q4_1: f16 d, f16 m, 32 nibbles
bw = build.decode_bandwidth_gbs(sc)
t_read = block_bytes / block_weights / (bw * 1e9) * 1e12           # picoseconds per weight
print(f"Q4_1: {8 * block_bytes / block_weights:.2f} bits a weight; at {bw:,.1f} GB/s its bytes take {t_read:.2f} ps")
by_hand.agree("Q4_1 bandwidth time per weight", t_read,
              by_hand.value_of(costs, metric="memory_ps_per_weight", value="Q4_1"), "ps")

# %% [markdown]
# ## Measured: decode over the quant ladder
#
# The measured model's ladder, the rungs notebook 04 builds with llama.cpp's quantizer: every rung predicted with
# the calibration beside its bandwidth ceiling (blue line); two decoded here (± sd) — the model's own quant and the
# contrast the lesson is about (a type this build repacks, where the model's own is not). A compute-bound rung sits
# far below its ceiling, by its de-quantization cost.

# %%
ladder = build.decode_ladder(sc)
plots.roofline(ladder)

# %%
build.caption_decode(sc, ladder)

# %% [markdown]
# ## On a GPU box: the CUDA architecture and the toolkit
#
# `setup.sh` asks nvidia-smi for each card's compute capability and builds for exactly those architectures
# (`-DCMAKE_CUDA_ARCHITECTURES`), with a toolkit that compiles them and that the driver runs: CUDA 13 (the registry's
# nvcc) compiles only compute capability ≥ 7.5, so a V100 (7.0), P100 or P40 needs a CUDA 12.x toolkit on the machine.
# Below: the decision for this machine, and for the scenario's card (its compute capability from the device catalog)
# on a CUDA 13 driver (580) and a CUDA 12 one (535), with the registry's toolkit alone and with a CUDA 12.9.

# %%
plans = build.cuda_plans(sc)
render.text_table(plans)

# %% [markdown]
# ### The architecture number, by hand
#
# nvcc names an architecture by the compute capability without its dot: 7.0 → sm_70, 8.6 → sm_86.

# %% tags=["by-hand"]
card = build.gpu_card(sc)
major, minor = (card.compute_capability or "0.0").split(".") if card is not None else ("0", "0")
arch = int(major) * 10 + int(minor)
print(f"{card.name if card is not None else 'no card'}: compute capability {major}.{minor} → sm_{arch}")
by_hand.agree("CUDA architecture", arch, build.cuda_arch(sc))

# %% [markdown]
# ## What the CUDA build is worth on that card
#
# The GPU lessons' model on the scenario's card: with the CUDA build (every layer that fits on the card) and with a
# CPU-only build (every layer on the card's host CPU, as a llama.cpp built without CUDA runs whatever `-ngl` says).
# Measured only where this machine has a CUDA build and a card; the reason otherwise.

# %%
gpu = build.gpu_build_speed(sc)
plots.build_speed(gpu)

# %%
build.caption_gpu_build(sc, gpu)

# %% [markdown]
# ## What this run showed

# %%
build.summary_build(sc, costs, ladder, plans, gpu)

# %%
baseline.headline(ladder, lever="quant")

# %% [markdown]
# ## Try it
#
# The seed's V100 (compute capability 7.0) needs a CUDA 12.x toolkit. Swap it for a T4 (7.5): which architecture
# does the build name, can the registry's CUDA 13 toolkit compile it, and what happens to decode? Write your guess
# down, then open the answer below (the package's prediction for the GPU lessons' model, on the V100 and on the T4).

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
render.text_table(exercises.what_if(sc, gpu=True, device="t4", cuda_build=True))

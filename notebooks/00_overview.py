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
# # 00 · Overview: from 4 to 64 tok/s, checked with numbers
#
# A blog post (the *seed*) tells how one 16 GB V100 went from 4 to a claimed 64 tok/s with a ~27B Qwen model
# in llama.cpp: the right quantization, all layers on the GPU, a smaller context, a quantized KV cache. Each
# step was "calculated". This workbook redoes the calculation — memory, bandwidth ceiling, a calibrated speed
# model — and measures every lever with real llama.cpp runs on this machine, so that every claim stands
# next to a prediction and a measurement. Words in *italics* on first use are defined in the
# [glossary](GLOSSARY.md).
#
# Edit the parameters below (or run with `papermill -f params/<scenario>.yaml`); the next cell validates them.

# %% tags=["parameters"]
# Parameters (tag: parameters). Generated from v100lab.workbook.scenario; do not edit by hand.
# papermill and `v100lab batch` replace these from a params/*.yaml file; by hand, edit them here.

# -- the scenario: what is studied, for which device
model: str = "default"                  # model studied: GGUF path, http(s) URL or zoo alias (default, gemma3-270m, synth-1b, synth-280m:Q4_0, ...)
stand_in_model: "Optional[str]" = None  # model measured here when `model` is a header-only skeleton or too big for this machine (None: measure `model`); its rows are labelled stand-in
device: str = "host"                    # device the predictions are for: catalog id (v100-16gb, ...) or a device YAML file; host: this machine, measured
compare_gpu: str = "v100-16gb"          # GPU predicted beside this machine when `device` is a CPU: the seed's model on it (01 what fits, 05 -ngl and the spill); none: no GPU
measure: bool = True                    # run real llama.cpp measurements here (False: predictions only)
server_url: "Optional[str]" = None      # an already running llama-server measured instead of this machine, http://HOST:PORT; flags it was started with stay (None: llama.cpp here)
claims: str = "seed"                    # reference rows to plot: seed (the blog post's claimed figures) or none

# -- llama.cpp flags (v100lab.facts.config.RunConfig; llama.cpp's defaults)
n_threads: int = 0                      # -t: CPU threads (0: llama.cpp's choice, all cores)

# -- measurement budget
n_gen: int = 128                        # generated tokens per tg test (llama-bench -n)
repetitions: int = 5                    # repetitions per test (llama-bench -r); reports show the spread

# %%
# Validate the parameters above (papermill's injected ones included): a wrong type or value stops here.
from v100lab.workbook import plots, render
from v100lab.workbook.levers import baseline, by_hand, captions, exercises, overview, summaries
from v100lab.workbook.scenario import from_notebook

sc = from_notebook(globals())
render.text_table(overview.scenario_facts(sc))

# %% [markdown]
# ## The map of the workbook
#
# One lever per notebook, in the order of a course: what fits (01), how fast it can possibly go (02), what
# llama.cpp does out of the box (03), then each lever on its own (04–11), and all of them together (12).

# %%
render.text_table(overview.notebook_map())

# %% [markdown]
# ## The seed's staircase
#
# Left: each stage of the seed, as it claims it (grey range) and as the speed model predicts it for the seed's
# V100 and its assumed model (qwen35 27B; see `params/models/qwen35-27b.yaml`); the dotted marks are the *strict
# ceiling* — bytes a token must read at the card's peak bandwidth. A claim above it is marked ✕: no GPU decodes
# faster than it can read the weights. Right: each stage's flags run for real on this machine, with the
# measured model, beside the prediction for it.

# %%
stairs = overview.staircase(sc)
plots.staircase(stairs)

# %%
captions.caption_staircase(sc, stairs)

# %% [markdown]
# ## The ceiling, by hand
#
# The seed's whole argument fits in one line: decoding a token reads every weight once, so
# tok/s ≤ bandwidth ÷ bytes of weights. Here it is for the seed's last stage, from its assumed model's header
# and the V100's spec sheet, checked against the ceiling the package computed for the staircase above.

# %% tags=["by-hand"]
spec, v100, stage, claimed = overview.seed_stage()   # the last stage: the seed's model at the stage's quant, its V100
weights_gb = spec.weight_bytes / 1e9               # every tensor in the header, in GB (10^9 bytes)
ceiling = v100.bandwidth_gbs / weights_gb          # GB/s ÷ GB read per token = tokens per second, at most
print(f"{v100.name}: {v100.bandwidth_gbs:g} GB/s ÷ {weights_gb:.2f} GB = {ceiling:.1f} tok/s at most; "
      f"the seed claims up to {claimed[1]:g} tok/s")
by_hand.agree(f"the seed's ceiling, stage {stage}", ceiling,
             by_hand.value_of(stairs, metric="weights_ceiling_tg_tps", value=stage, device=v100.id), "tok/s")

# %% [markdown]
# ## What this run showed

# %%
summaries.summary_overview(sc, stairs)

# %%
baseline.headline(stairs, lever="stage")

# %% [markdown]
# ## Try it
#
# Move the seed's model from its GPU to a `t4` (a 16 GB card with about a third of the V100's bandwidth). Before
# you look: how fast should it decode there — what does the ratio of the two bandwidths say? Write your guess
# down, then open the answer below (the package's prediction for the seed's model on the GPU the lesson is
# about, now and with the change).

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
render.text_table(exercises.what_if(sc, device="t4", gpu=True))

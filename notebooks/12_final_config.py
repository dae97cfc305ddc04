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
# # 12 · The final configuration
#
# Everything before, put together by `v100lab tune`: every combination of quant (4 bits and more), KV cache
# type, flash attention and micro-batch is predicted for the scenario's device at the context the scenario
# needs; those that fit with a margin are ranked by predicted decode speed (and by measured speed when the
# device is this machine). The result is a llama-server command with a reason for every flag.

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
claims: str = "seed"                      # reference rows to plot: seed (the blog post's claimed figures) or none

# -- llama.cpp flags (v100lab.facts.config.RunConfig; llama.cpp's defaults)
n_parallel: int = 1                       # -np: parallel sequences (server slots)
n_threads: int = 0                        # -t: CPU threads (0: llama.cpp's choice, all cores)

# -- levers swept by the notebooks
quants: list[str] = ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K"]  # quant ladder: predicted for `model`, measured on `ladder_model` (04)
target_ctx: int = 2048                    # context the tuned configuration must hold (08)

# -- measurement budget
n_gen: int = 128                          # generated tokens per tg test (llama-bench -n)
repetitions: int = 5                      # repetitions per test (llama-bench -r); reports show the spread

# %%
# Validate the parameters above (papermill's injected ones included): a wrong type or value stops here.
from v100lab.workbook import plots, render
from v100lab.workbook.levers import baseline, by_hand, captions, exercises, final, overview, steps, summaries
from v100lab.workbook.scenario import from_notebook

sc = from_notebook(globals())
render.text_table(overview.scenario_facts(sc))

# %% [markdown]
# ## The tuned command

# %%
render.command(final.tuned_command(sc))

# %% [markdown]
# ## Why each flag is there, and what it buys

# %%
render.text_table(final.command_reasons(sc), code=["flag"])

# %% [markdown]
# ## What tune measured, beside what it predicted
#
# The candidates run for real on this machine, and every flag measured both ways (its value and llama.cpp's
# default): a flag stays in the command only for a gain beyond the noise of the two runs.

# %%
render.text_table(final.measured_candidates(sc), code=["candidate"])

# %%
render.text_table(final.flag_checks(sc), code=["flag"])

# %% [markdown]
# ## The same search for the GPU
#
# The tuned command for the GPU the lessons are about (predicted: nothing runs there from here), to copy.

# %%
render.command(final.gpu_command(sc))

# %% [markdown]
# ## The tuned configuration's KV cache, by hand
#
# The same arithmetic as in 01, for the tuned quant, cache types and context.

# %% tags=["by-hand"]
best = final.final_config(sc).best
tuned = steps.spec_at_quant(sc.model, best.quant)     # the scenario's model at the tuned quant
cfg = best.config
layers = by_hand.kv_layers(tuned)
heads = tuned.n_head_kv(layers[0])
cells = -(-(cfg.n_ctx or tuned.n_ctx_train) // 256) * 256
window = tuned.sliding_window or cells
swa_cells = min(cells, -(-(window + min(cfg.n_ubatch, cfg.n_batch, cells)) // 256) * 256)
n_swa = len(tuned.swa_layers)
per_cell = heads * (tuned.head_dim_k * by_hand.bytes_per_element(cfg.cache_type_k)
                    + tuned.head_dim_v * by_hand.bytes_per_element(cfg.cache_type_v))
kv_total = ((len(layers) - n_swa) * cells + n_swa * swa_cells) * per_cell
print(f"{best.quant}, -c {cfg.n_ctx}, K {cfg.cache_type_k} / V {cfg.cache_type_v}: {kv_total / 2**20:,.1f} MiB of "
      f"KV cache beside {tuned.weight_bytes / 2**30:,.2f} GiB of weights")
by_hand.agree("KV cache of the tuned configuration", kv_total, best.kv_bytes, "bytes")

# %% [markdown]
# ## This scenario's own staircase
#
# From llama.cpp's defaults to the tuned configuration, one change per stage: predicted on the scenario's
# device, and each stage's flags measured here with the measured model.

# %%
stairs = final.own_staircase(sc)
plots.sweep(stairs, "From llama.cpp's defaults to the tuned command", lever="stage", metrics=("tg_tps",))

# %%
captions.caption_own_staircase(sc, stairs)

# %% [markdown]
# ## The seed's final command, flag by flag
#
# The seed's own command for its V100, against the tuned one for the same device and assumed model.

# %%
verdict = final.seed_verdict_table(sc)
render.text_table(verdict, code=["seed", "tuned"])

# %% [markdown]
# ## What this run showed

# %%
summaries.summary_final(sc, stairs, verdict)

# %%
baseline.headline(stairs, lever="stage")

# %% [markdown]
# ## Try it
#
# Make the context four times longer (`n_ctx`). Does the configuration still fit, and what does decode halfway
# through it drop to? Write your guess down, then open the answer below (the package's prediction for the seed's model on
# the GPU the lesson is about, now and with the change).

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
render.text_table(exercises.what_if(sc, scale={"n_ctx": 4}, gpu=True))

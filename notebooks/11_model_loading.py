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
# # 11 · Loading the model: mmap, --no-mmap, --mlock
#
# By default llama.cpp maps the GGUF file into memory (mmap): nothing is read until a page is touched, and
# the page cache keeps the file for the next start. `--no-mmap` reads the file into its own buffers;
# `--mlock` pins the model in RAM so the system cannot swap it out. Current llama.cpp folds these flags into
# one *load mode*; the first table shows which modes the build in use has and which flags select them.

# %% tags=["parameters"]
# Parameters (tag: parameters). Generated from v100lab.workbook.scenario; do not edit by hand.
# papermill and `v100lab batch` replace these from a params/*.yaml file; by hand, edit them here.

# -- the scenario: what is studied, for which device
model: str = "default"                  # model studied: GGUF path, http(s) URL or zoo alias (default, gemma3-270m, synth-1b, synth-280m:Q4_0, ...)
stand_in_model: "Optional[str]" = None  # model measured here when `model` is a header-only skeleton or too big for this machine (None: measure `model`); its rows are labelled stand-in
device: str = "host"                    # device the predictions are for: catalog id (v100-16gb, ...) or a device YAML file; host: this machine, measured
measure: bool = True                    # run real llama.cpp measurements here (False: predictions only)
server_url: "Optional[str]" = None      # an already running llama-server measured instead of this machine, http://HOST:PORT; flags it was started with stay (None: llama.cpp here)

# -- llama.cpp flags (v100lab.facts.config.RunConfig; llama.cpp's defaults)
n_ctx: int = 4096                       # -c: context size in tokens (0: the model's training context)
n_threads: int = 0                      # -t: CPU threads (0: llama.cpp's choice, all cores)

# -- measurement budget
n_prompt: int = 512                     # prompt tokens per pp test (llama-bench -p)
repetitions: int = 5                    # repetitions per test (llama-bench -r); reports show the spread

# %%
# Validate the parameters above (papermill's injected ones included): a wrong type or value stops here.
from v100lab.workbook import plots, render
from v100lab.workbook.levers import baseline, by_hand, captions, exercises, loading, overview, summaries
from v100lab.workbook.scenario import from_notebook

sc = from_notebook(globals())
render.text_table(overview.scenario_facts(sc))

# %% [markdown]
# ## The load modes of this llama.cpp build

# %%
modes = loading.load_modes()
render.text_table(modes)

# %% [markdown]
# ## Load time and first token, per mode
#
# Measured here (the speed model has no loading term): the time to load the model and create the context,
# and the time from there to the first token.

# %%
load = loading.mmap_mlock(sc)
plots.load_times(load)

# %%
captions.caption_load(sc, load)

# %% [markdown]
# ## What loading reads, by hand
#
# The file is the header followed by every tensor's data: that is what a load maps or reads, and what
# `--mlock` pins in RAM.

# %% tags=["by-hand"]
spec, machine, label = by_hand.subject(sc)
size = spec.header_bytes + spec.weight_bytes           # the header, then every tensor's data
print(f"{label}: {spec.header_bytes / 1024:,.1f} KiB of header + {spec.weight_bytes / 2**20:,.1f} MiB of tensors; "
      f"copying it at {machine.bandwidth_gbs:g} GB/s takes at least {size / (machine.bandwidth_gbs * 1e9) * 1e3:,.1f} ms")
by_hand.agree(f"{label}: the file's size", size, spec.file_bytes, "bytes")

# %% [markdown]
# ## What this run showed

# %%
summaries.summary_loading(sc, modes, load)

# %%
baseline.headline_load(load)

# %% [markdown]
# ## Try it
#
# Set `use_mmap: false` (`--no-mmap`). Do the bytes the model needs change, or only how they get into memory?
# Write your guess down, then open the answer below (the package's prediction for the scenario's model on its
# device, now and with the change).

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
render.text_table(exercises.what_if(sc, use_mmap=False))

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
# # 03 · Baseline: llama.cpp's defaults (except what the scenario sets), measured
#
# The seed's baseline was 4–5 tok/s with nvidia-smi showing a few hundred MB used: the weights were not on the
# GPU (`--gpu-layers` defaulted to 0 in older llama.cpp). First admit a number is abnormal, then check it
# against what it should be. Here: a real llama-bench-style run (prompt processing and decode, *pp* and *tg*,
# repeated) with the scenario's flags, the load log's account of where each buffer went, and the prediction
# for both.

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
n_gpu_layers: int = 999                 # -ngl: layers offloaded to the GPU (999: all)
n_ctx: int = 4096                       # -c: context size in tokens (0: the model's training context)
n_batch: int = 2048                     # -b: logical batch size
n_ubatch: int = 512                     # -ub: physical batch size, at most n_batch
cache_type_k: str = "f16"               # -ctk: K cache type
cache_type_v: str = "f16"               # -ctv: V cache type (quantized V needs flash attention)
flash_attn: str = "auto"                # -fa: on, off or auto
n_threads: int = 0                      # -t: CPU threads (0: llama.cpp's choice, all cores)

# -- measurement budget
n_prompt: int = 512                     # prompt tokens per pp test (llama-bench -p)
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
# ## Measured vs predicted

# %%
base = baseline.baseline(sc)
plots.sweep(base, baseline.baseline_title(sc, "Baseline"), lever="config")

# %%
captions.caption_baseline(sc, base)

# %% [markdown]
# ### The machine while it ran
#
# The seed's first diagnosis came from `nvidia-smi -l 1`: a few hundred MB on the card and the GPU idle meant
# the weights were not there. The same view, recorded once a second while the baseline ran: with an NVIDIA GPU,
# its memory used, utilisation and power; without one, llama.cpp's own memory and CPU use (100 % = one core).

# %%
plots.machine_during_run(base)

# %%
captions.caption_machine(sc, base)

# %% [markdown]
# ## How close to the ceiling, by hand
#
# The efficiency of a run is what it measured divided by what the bandwidth allows: the ceiling of the model
# measured here at this machine's bandwidth. A GPU decodes at 60–90 % of its ceiling; a CPU that spends its
# time de-quantizing stays further below.

# %% tags=["by-hand"]
spec, machine, label = by_hand.subject(sc)   # the model measured here and this machine (else: the scenario's)
ceiling = machine.bandwidth_gbs * 1e9 / spec.weight_bytes
measured = by_hand.value_of(base, metric="tg_tps", source="measured")
by_hand.agree(f"the ceiling of {label} on {machine.id}", ceiling,
             by_hand.value_of(base, metric="weights_ceiling_tg_tps", model=label, device=machine.id), "tok/s")
if measured:
    print(f"efficiency: measured {measured:,.1f} tok/s ÷ ceiling {ceiling:,.1f} tok/s = {measured / ceiling:.0%}")

# %% [markdown]
# ## What the load log says

# %%
diag = baseline.load_diagnosis(sc)
render.text_table(diag)

# %% [markdown]
# ## Where it ran
#
# A measurement means little without its conditions: the same model decodes at different speeds on another CPU,
# or with llama.cpp built with other flags (AVX2 vs AVX-512 kernels, weights repacked or not — the `REPACK`
# and `AVX512` entries of the system-info line). Every measured row carries these facts.

# %%
render.text_table(baseline.run_environment())

# %% [markdown]
# ## What this run showed

# %%
summaries.summary_baseline(sc, base, diag)

# %%
baseline.headline(base, lever="config")

# %% [markdown]
# ## Try it
#
# Set `n_ctx: 0` — the model's training context, what llama.cpp takes when `-c` is not given. How much memory
# does the baseline need then, and does it still fit? Write your guess down, then open the answer below (the
# package's prediction for the scenario's model on its device, now and with the change).

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
render.text_table(exercises.what_if(sc, n_ctx=0))

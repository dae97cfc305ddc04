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
# # 08 · Batch size: prompt processing, one step at a time
#
# A prompt is processed in steps of `-ub` tokens (the physical batch, *ubatch*; `-b` is the logical batch the
# server hands over, at least as large). Each step reads every weight once for all its tokens, so a larger
# step reads the weights fewer times per prompt — until the step is compute-bound. Decoding produces one token
# per step whatever the batch sizes, so this lever is about prompt processing only. The sweep uses a prompt
# longer than the largest `-ub`, so every value splits it differently.

# %% tags=["parameters"]
# Parameters (tag: parameters). Generated from v100lab.workbook.scenario; do not edit by hand.
# papermill and `v100lab batch` replace these from a params/*.yaml file; by hand, edit them here.

# -- the scenario: what is studied, for which device
model: str = "default"                    # model studied: GGUF path, http(s) URL or zoo alias (default, gemma3-270m, synth-1b, synth-280m:Q4_0, ...)
stand_in_model: "Optional[str]" = None    # model measured here when `model` is a header-only skeleton or too big for this machine (None: measure `model`); its rows are labelled stand-in
device: str = "host"                      # device the predictions are for: catalog id (v100-16gb, ...) or a device YAML file; host: this machine, measured
measure: bool = True                      # run real llama.cpp measurements here (False: predictions only)
server_url: "Optional[str]" = None        # an already running llama-server measured instead of this machine, http://HOST:PORT; flags it was started with stay (None: llama.cpp here)

# -- llama.cpp flags (v100lab.facts.config.RunConfig; llama.cpp's defaults)
n_ctx: int = 4096                         # -c: context size in tokens (0: the model's training context)
n_batch: int = 2048                       # -b: logical batch size
flash_attn: str = "auto"                  # -fa: on, off or auto
n_threads: int = 0                        # -t: CPU threads (0: llama.cpp's choice, all cores)

# -- levers swept by the notebooks
batch_sizes: list[int] = [128, 512, 2048]  # n_ubatch values for the batch sweep, n_batch at least each (07)

# -- measurement budget
n_prompt: int = 512                       # prompt tokens per pp test (llama-bench -p)
repetitions: int = 5                      # repetitions per test (llama-bench -r); reports show the spread

# %%
# Validate the parameters above (papermill's injected ones included): a wrong type or value stops here.
from v100lab.workbook import plots, render
from v100lab.workbook.levers import baseline, batch_size, by_hand, captions, exercises, overview, steps, summaries
from v100lab.workbook.scenario import from_notebook

sc = from_notebook(globals())
render.text_table(overview.scenario_facts(sc))

# %% [markdown]
# ## Prompt processing against -ub

# %%
batch = batch_size.batch_sweep(sc)
plots.sweep(batch, "-ub: prompt processing of a prompt longer than the largest -ub", lever="n_ubatch",
            metrics=("pp_tps",), ceiling=False)

# %%
captions.caption_batch(sc, batch)

# %% [markdown]
# ## Weights read per prompt, by hand
#
# Steps = prompt tokens ÷ `-ub`, rounded up; each step reads every layer's weights once.

# %% tags=["by-hand"]
spec = steps.study(sc).spec
prompt = batch_size.batch_prompt(sc)
per_step = sum(spec.layer_bytes)                          # every repeating layer's weights (header)
small, large = min(sc.batch_sizes), max(sc.batch_sizes)
steps_small, steps_large = -(-prompt // small), -(-prompt // large)
print(f"{prompt} tokens: {steps_small} steps with -ub {small}, {steps_large} with -ub {large}; "
      f"{steps_small * per_step / 1e9:.3f} vs {steps_large * per_step / 1e9:.3f} GB of weights read")
by_hand.agree(f"weights read per prompt with -ub {small}", steps_small * per_step,
             batch_size.prompt_weight_bytes(sc, small), "bytes")
by_hand.agree(f"weights read per prompt with -ub {large}", steps_large * per_step,
             batch_size.prompt_weight_bytes(sc, large), "bytes")

# %% [markdown]
# ## What this run showed

# %%
summaries.summary_batch(sc, batch)

# %%
baseline.headline(batch, metric="pp_tps", lever="n_ubatch")

# %% [markdown]
# ## Try it
#
# Set `n_ubatch: 64`. How many more steps does the prompt take, and what should that do to prompt processing —
# and to decode? Write your guess down, then open the answer below (the package's prediction for the scenario's
# model on its device, now and with the change).

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
render.text_table(exercises.what_if(sc, n_ubatch=64))

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
# # 09 · Threads
#
# `-t` sets how many CPU threads llama.cpp runs. Decoding is bound by memory bandwidth, which a few cores
# already saturate; prompt processing is bound by arithmetic, which grows with every core. Threads beyond the
# cores do no more work — and llama.cpp's threads spin while they wait, so they steal time from each other.

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

# -- levers swept by the notebooks
thread_counts: list[int] = []           # -t values for the threads sweep (07); []: 1 up to this machine's cores

# -- measurement budget
n_prompt: int = 512                     # prompt tokens per pp test (llama-bench -p)
n_gen: int = 128                        # generated tokens per tg test (llama-bench -n)
repetitions: int = 5                    # repetitions per test (llama-bench -r); reports show the spread

# %%
# Validate the parameters above (papermill's injected ones included): a wrong type or value stops here.
from v100lab.workbook import plots, render
from v100lab.workbook.levers import baseline, by_hand, captions, ceiling, exercises, overview, summaries, threads
from v100lab.workbook.scenario import from_notebook

sc = from_notebook(globals())
render.text_table(overview.scenario_facts(sc))

# %% [markdown]
# ## Prompt processing and decode against -t

# %%
sweep = threads.threads_sweep(sc)
plots.sweep(sweep, "-t: CPU threads", lever="n_threads")

# %%
captions.caption_threads(sc, sweep)

# %% [markdown]
# ## The arithmetic a token costs, by hand
#
# A token multiplies every weight it uses once: 2 FLOPs (a multiply and an add) per weight. Multiply by the
# measured prompt speed and the result is the arithmetic rate the threads reached.

# %% tags=["by-hand"]
spec, machine, label = by_hand.subject(sc)
multiplied = spec.n_params - sum(t.n_elements for t in by_hand.not_multiplied(spec))
experts = by_hand.expert_tensors(spec)                     # MoE: a token multiplies its top-k experts only
if experts:
    multiplied -= (1 - spec.expert_used_count / spec.expert_count) * sum(t.n_elements for t in experts)
flops = 2 * multiplied
by_hand.agree(f"FLOPs per token of {label}", flops, ceiling.flops_per_token(sc, spec), "FLOP")
most = max(threads.thread_values(sc))
pp = by_hand.value_of(sweep, metric="pp_tps", source="measured", value=most)
if pp:
    print(f"-t {most}: {pp:,.0f} prompt tok/s × {flops / 1e9:.3f} GFLOP = {pp * flops / 1e9:,.1f} GFLOP/s "
          f"({pp * flops / 1e9 / most:,.1f} per thread)")

# %% [markdown]
# ## What this run showed

# %%
summaries.summary_threads(sc, sweep)

# %%
baseline.headline(sweep, lever="n_threads")

# %% [markdown]
# ## Try it
#
# Set `n_threads: 1`. Which falls more, prompt processing or decode — and why? Write your guess down, then open
# the answer below (the package's prediction for the scenario's model on its device, now and with the change).

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
render.text_table(exercises.what_if(sc, n_threads=1))

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
# # 02 · The bandwidth ceiling and the roofline
#
# Decoding one token reads (almost) every weight once, so tok/s ≤ bandwidth / bytes read per token — the seed's
# ceiling. It is an upper bound, not a prediction: on a GPU decode reaches a fraction of it, on a small CPU
# de-quantizing 2–6-bit weights costs more than reading them. The speed model keeps both terms (memory and
# compute) per weight type, calibrated on this machine and fitted on published GPU rows — the *roofline*.

# %% tags=["parameters"]
# Parameters (tag: parameters). Generated from v100lab.workbook.scenario; do not edit by hand.
# papermill and `v100lab batch` replace these from a params/*.yaml file; by hand, edit them here.

# -- the scenario: what is studied, for which device
model: str = "default"                    # model studied: GGUF path, http(s) URL or zoo alias (default, gemma3-270m, synth-1b, synth-280m:Q4_0, ...)
stand_in_model: "Optional[str]" = None    # model measured here when `model` is a header-only skeleton or too big for this machine (None: measure `model`); its rows are labelled stand-in
device: str = "host"                      # device the predictions are for: catalog id (v100-16gb, ...) or a device YAML file; host: this machine, measured
compare_devices: list[str] = []           # catalog ids to compare the ceiling across (02); []: the whole catalog
measure: bool = True                      # run real llama.cpp measurements here (False: predictions only)
server_url: "Optional[str]" = None        # an already running llama-server measured instead of this machine, http://HOST:PORT; flags it was started with stay (None: llama.cpp here)
claims: str = "seed"                      # reference rows to plot: seed (the blog post's claimed figures) or none

# -- llama.cpp flags (v100lab.facts.config.RunConfig; llama.cpp's defaults)
n_ctx: int = 4096                         # -c: context size in tokens (0: the model's training context)
n_threads: int = 0                        # -t: CPU threads (0: llama.cpp's choice, all cores)

# -- levers swept by the notebooks
quants: list[str] = ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K"]  # quant ladder: predicted for `model`, measured on `ladder_model` (04)

# -- measurement budget
n_gen: int = 128                          # generated tokens per tg test (llama-bench -n)
repetitions: int = 5                      # repetitions per test (llama-bench -r); reports show the spread

# %%
# Validate the parameters above (papermill's injected ones included): a wrong type or value stops here.
from v100lab.workbook import plots, render
from v100lab.workbook.levers import baseline, by_hand, captions, ceiling, exercises, overview, steps, summaries
from v100lab.workbook.scenario import from_notebook

sc = from_notebook(globals())
render.text_table(overview.scenario_facts(sc))

# %% [markdown]
# ## The ceiling per quant on the scenario's device (and the seed's own table)

# %%
ceil = ceiling.ceilings(sc)
plots.ceilings(ceil)

# %%
captions.caption_ceilings(sc, ceil)

# %% [markdown]
# ## Both sides of the roofline, by hand
#
# Memory side: the bytes a token reads, at the device's bandwidth. Compute side: each weight a token
# multiplies costs one multiply and one add — 2 FLOPs per parameter — at the device's FLOP rate. The input
# embedding table is not multiplied (a token looks up its one row) unless the model reuses it as the output
# matrix. Whichever side takes longer is the bound.

# %% tags=["by-hand"]
st = steps.study(sc)
spec, dev = st.spec, st.device
bandwidth_ceiling = dev.bandwidth_gbs * 1e9 / spec.weight_bytes     # bytes/s ÷ bytes per token
print(f"{dev.name}: {dev.bandwidth_gbs:g} GB/s ÷ {spec.weight_bytes / 1e9:.3f} GB = {bandwidth_ceiling:,.1f} tok/s")
by_hand.agree(f"the bandwidth ceiling of {spec.file_type} on {dev.id}", bandwidth_ceiling,
             by_hand.value_of(ceil, metric="weights_ceiling_tg_tps", source="predicted", model=st.label, device=dev.id,
                             value=spec.file_type), "tok/s")

# %% tags=["by-hand"]
multiplied = spec.n_params - sum(t.n_elements for t in by_hand.not_multiplied(spec))
experts = by_hand.expert_tensors(spec)                     # MoE: a token multiplies its top-k experts only
if experts:
    multiplied -= (1 - spec.expert_used_count / spec.expert_count) * sum(t.n_elements for t in experts)
flops = 2 * multiplied                                    # one multiply-add per weight used
print(f"{multiplied / 1e6:,.1f} M weights multiplied per token → {flops / 1e9:.3f} GFLOP per token")
by_hand.agree("FLOPs per decoded token", flops, ceiling.flops_per_token(sc), "FLOP")
if dev.fp16_tflops:
    print(f"{dev.name}: {dev.fp16_tflops:g} TFLOP/s ÷ {flops / 1e9:.3f} GFLOP = {dev.fp16_tflops * 1e12 / flops:,.0f} "
          f"tok/s on the compute side, against {bandwidth_ceiling:,.1f} on the memory side")

# %% [markdown]
# ## The same model across the device catalog
#
# Bandwidth is not the only cost of a token: each one also pays a fixed time — building and launching the
# compute graph, one kernel (or more) per layer, synchronising with the host. The black tick on each bar is
# that limit (1 ÷ the fixed time): a model so small that reading its weights takes less than the fixed time
# sits on its tick whatever the card's bandwidth.

# %%
cat = ceiling.catalog_ceilings(sc)
plots.catalog(cat)

# %%
captions.caption_catalog(sc, cat)

# %% [markdown]
# ## This machine's roofline
#
# The model measured here, across its quant ladder (as llama-quantize would make it): the plain bandwidth
# ceiling at this machine's measured bandwidth, the calibrated prediction, and the measured decode speed.

# %%
roof = ceiling.roofline(sc)
plots.roofline(roof)

# %%
captions.caption_roofline(sc, roof)

# %% [markdown]
# ## Published Apple Silicon rows against the speed model
#
# llama.cpp's public Apple Silicon table (Llama 2 7B, F16/Q8_0/Q4_0; shipped in `v100lab/data`) — each chip
# predicted by a fit on the *other* chips, so no row judges its own fit.

# %%
apple = ceiling.apple(sc)
plots.apple(apple)

# %%
captions.caption_apple(sc, apple)

# %% [markdown]
# ## What this run showed

# %%
summaries.summary_ceiling(sc, ceil, cat, roof, apple)

# %%
baseline.headline(roof, lever="quant")

# %% [markdown]
# ## Try it
#
# Set `device: a100-80gb`. What will the ceiling be? Predict it from the two devices' bandwidths before you
# look. Write your guess down, then open the answer below (the package's prediction for the scenario's model on
# its device, now and with the change).

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
render.text_table(exercises.what_if(sc, device="a100-80gb"))

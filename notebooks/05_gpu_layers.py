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
# # 05 · -ngl: how many layers on the GPU, and the spill effect
#
# `-ngl k` puts the output layer and the last k − 1 repeating layers on the GPU; the rest run on the CPU from
# host memory at host bandwidth, and every token crosses PCIe. When a longer context no longer fits, llama.cpp
# leaves layers on the CPU — the spill — and decode slows by far more than the context's own cost.
#
# On a CPU `-ngl` changes nothing, so when the scenario predicts for this machine's CPU, this notebook predicts
# for the GPU beside it instead (`compare_gpu`, the seed's V100 by default) with the seed's model: what a card
# of that size does with a model too big for it.

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
n_ctx: int = 4096                         # -c: context size in tokens (0: the model's training context)
cache_type_k: str = "f16"                 # -ctk: K cache type
cache_type_v: str = "f16"                 # -ctv: V cache type (quantized V needs flash attention)
n_threads: int = 0                        # -t: CPU threads (0: llama.cpp's choice, all cores)

# -- levers swept by the notebooks
ctx_sizes: list[int] = [2048, 4096, 8192, 16384, 32768]  # context sizes (01 what-fits heatmap, 06 KV memory)
gpu_layers: list[int] = []                # -ngl values for the offload sweep (05); []: every value from 0 to all layers

# -- measurement budget
n_prompt: int = 512                       # prompt tokens per pp test (llama-bench -p)
n_gen: int = 128                          # generated tokens per tg test (llama-bench -n)
repetitions: int = 5                      # repetitions per test (llama-bench -r); reports show the spread

# %%
# Validate the parameters above (papermill's injected ones included): a wrong type or value stops here.
from v100lab.workbook import plots, render
from v100lab.workbook.levers import baseline, by_hand, captions, exercises, offload, overview, steps, summaries
from v100lab.workbook.scenario import from_notebook

sc = from_notebook(globals())
render.text_table(overview.scenario_facts(sc))

# %% [markdown]
# ## The -ngl sweep

# %%
ngl = offload.gpu_layers_sweep(sc)
plots.gpu_layers(ngl)

# %%
captions.caption_gpu_layers(sc, ngl)

# %% [markdown]
# ## One token split across the link, by hand
#
# With half the layers offloaded, a token's time is the device part (its weights at the device's bandwidth),
# plus the host part (the other layers at the host's bandwidth), plus the link: the embedding goes to the
# device, the activations cross once where the layers change sides, and the logits come back — each copy
# costs about 10 µs of latency plus its bytes at the link's speed. The model and GPU are the sweep's.

# %% tags=["by-hand"]
gpu = steps.gpu_subject(sc)                                # the sweep's model and GPU
spec, dev = gpu.spec, gpu.device
host = steps.gpu_host() if dev.kind != "cpu" else dev      # a GPU's layers that do not fit run on its server's CPU
k = spec.n_layer // 2                                       # -ngl k: half the layers
run = spec.n_layer - spec.nextn_layers                      # layers plain decoding runs (MTP layers are skipped)
split = run - (k - 1)                                       # the last k − 1 layers and the output layer go to the device
on_device = sum(spec.layer_bytes[split:run]) + by_hand.output_bytes(spec)
on_host = sum(spec.layer_bytes[:split])
link_s = 0.0 if dev.kind == "cpu" else 3 * 10e-6 + (2 * spec.n_embd + spec.n_vocab) * 4 / (dev.host_link_gbs * 1e9)
t = on_device / (dev.bandwidth_gbs * 1e9) + on_host / (host.bandwidth_gbs * 1e9) + link_s
print(f"-ngl {k}: {on_device / 1e9:.3f} GB at {dev.bandwidth_gbs:g} GB/s + {on_host / 1e9:.3f} GB at "
      f"{host.bandwidth_gbs:g} GB/s + link {link_s * 1e3:.3f} ms = {t * 1e3:.2f} ms per token (≤ {1 / t:,.1f} tok/s)")
by_hand.agree(f"time per token with -ngl {k}", t, offload.offload_split(sc, k)["total_s"], "s")

# %% [markdown]
# ## The spill effect: context size with -ngl 999

# %%
spill = offload.spill_effect(sc)
plots.spill(spill)

# %%
captions.caption_spill(sc, spill)

# %% [markdown]
# ## What this run showed

# %%
summaries.summary_gpu_layers(sc, ngl, spill)

# %%
baseline.headline(ngl, lever="n_gpu_layers")

# %% [markdown]
# ## Try it
#
# Set `n_gpu_layers: 0` (the seed's stage 1: nothing on the GPU). How fast will it decode? Predict it from the
# host's bandwidth before you look. Write your guess down, then open the answer below (the package's prediction
# for the seed's model on the GPU the lesson is about, now and with the change).

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
render.text_table(exercises.what_if(sc, n_gpu_layers=0, gpu=True))

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
# # 01 · The VRAM triangle: model size × context × card memory
#
# The seed's first argument: of model size, context length and one card's memory you can pick two. Here the
# triangle is computed instead of argued: the model's header gives every tensor's size, llama.cpp's own
# arithmetic gives the *KV cache*, compute and output buffers, and the device's capacity (minus the runtime's
# overhead) says what fits.

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
n_gpu_layers: int = 999                   # -ngl: layers offloaded to the GPU (999: all)
n_ctx: int = 4096                         # -c: context size in tokens (0: the model's training context)
n_batch: int = 2048                       # -b: logical batch size
n_ubatch: int = 512                       # -ub: physical batch size, at most n_batch
cache_type_k: str = "f16"                 # -ctk: K cache type
cache_type_v: str = "f16"                 # -ctv: V cache type (quantized V needs flash attention)
flash_attn: str = "auto"                  # -fa: on, off or auto
n_parallel: int = 1                       # -np: parallel sequences (server slots)
swa_full: bool = False                    # --swa-full: full-size cache for sliding-window layers

# -- levers swept by the notebooks
quants: list[str] = ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K"]  # quant ladder: predicted for `model`, measured on `ladder_model` (04)
ctx_sizes: list[int] = [2048, 4096, 8192, 16384, 32768]  # context sizes (01 what-fits heatmap, 06 KV memory)
cache_types: list[str] = ["f16", "q8_0", "q4_0"]  # KV cache types (01, 06)

# %%
# Validate the parameters above (papermill's injected ones included): a wrong type or value stops here.
from v100lab.workbook import plots, render
from v100lab.workbook.levers import baseline, by_hand, captions, exercises, overview, steps, summaries, triangle
from v100lab.workbook.scenario import from_notebook

sc = from_notebook(globals())
render.text_table(overview.scenario_facts(sc))

# %% [markdown]
# ## The model, from its header

# %%
render.text_table(triangle.header_facts(sc))

# %% [markdown]
# ## The KV cache, by hand
#
# Every token in the context keeps a key and a value vector in every layer that has attention: 2 (K and V) ×
# layers × KV heads × head size × bytes per element. *GQA* models have fewer KV heads than query heads, which
# is what makes their cache small; recurrent layers keep a fixed-size state instead, and sliding-window (*SWA*)
# layers keep only their window.

# %% tags=["by-hand"]
spec = steps.study(sc).spec
layers = by_hand.kv_layers(spec)             # the layers with a KV cache (recurrent layers have none)
heads = spec.n_head_kv(layers[0])           # KV heads per layer (header: attention.head_count_kv)
per_token = len(layers) * heads * (spec.head_dim_k + spec.head_dim_v) * 2   # K and V in f16: 2 bytes each
print(f"{len(layers)} layers × {heads} KV heads × ({spec.head_dim_k} + {spec.head_dim_v}) × 2 bytes "
      f"= {per_token / 1024:.1f} KiB per token")
by_hand.agree("KV cache per token (f16)", per_token, triangle.kv_bytes_per_token(spec), "bytes")

# %% tags=["by-hand"]
ctx = sc.n_ctx or spec.n_ctx_train                     # -c 0 means the model's training context
cells = -(-ctx // 256) * 256                           # llama.cpp rounds the cache up to a multiple of 256 cells
window = spec.sliding_window or ctx                    # a sliding-window layer keeps its window + one micro-batch
swa_cells = min(cells, -(-(window + min(sc.n_ubatch, sc.n_batch, ctx)) // 256) * 256)
n_swa = len(spec.swa_layers)
per_cell = heads * (spec.head_dim_k * by_hand.bytes_per_element(sc.cache_type_k)
                    + spec.head_dim_v * by_hand.bytes_per_element(sc.cache_type_v))
kv_total = ((len(layers) - n_swa) * cells + n_swa * swa_cells) * per_cell
print(f"-c {ctx}, K {sc.cache_type_k} / V {sc.cache_type_v}: {kv_total / 2**20:,.1f} MiB of KV cache")
by_hand.agree(f"KV cache at -c {ctx}", kv_total, triangle.kv_cache_bytes(sc), "bytes")

# %% [markdown]
# ## Where every byte goes
#
# The scenario's configuration, predicted per device and component; when a model runs here, llama.cpp's
# own buffer sizes from its load log (hatched) stand beside the prediction for the same model. When the
# scenario predicts for this machine's CPU, the seed's model on the GPU beside it (`compare_gpu`) gets a panel
# too: a small model in RAM is nowhere near a limit, a 27B model on a 16 GB card is.

# %%
mem = triangle.memory_breakdown(sc)
plots.memory_breakdown(mem)

# %%
captions.caption_memory(sc, mem)

# %% [markdown]
# ## What fits: quant × context × cache type
#
# Each cell is the memory left on the device (GiB) with every layer requested on it; red cells do not fit, so
# llama.cpp would leave layers on the CPU (see 05) or refuse to load. One row of panels per model and device:
# the scenario's, and the GPU beside this machine when the scenario predicts for its CPU.

# %%
grid = triangle.fit_grid(sc)
plots.fit_heatmap(grid)

# %%
captions.caption_fit(sc, grid)

# %% [markdown]
# ## The largest context that fits, per quant and cache type (tokens)

# %%
render.text_table(triangle.largest_context(grid))

# %% [markdown]
# ## The triangle, stated with this run's numbers

# %%
summaries.summary_triangle(sc, mem, grid)

# %%
baseline.headline_memory(mem)

# %% [markdown]
# ## Try it
#
# Halve `n_ctx`. How much memory comes back? What happens to decode at depth 0 — and halfway through the
# (shorter) context? Write your guess down, then open the answer below (the package's prediction for the seed's model on
# the GPU the lesson is about, now and with the change).

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
render.text_table(exercises.what_if(sc, scale={"n_ctx": 0.5}, gpu=True))

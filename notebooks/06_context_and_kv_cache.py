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
# # 06 · Context size and the KV cache
#
# The KV cache grows with the context (cells × layers with a cache × K and V widths × bytes per element); a
# quantized cache type shrinks it. Decoding reads the cells in use, so speed falls with *depth*, not with
# `--ctx-size`. And in llama.cpp a quantized V cache needs flash attention — the seed's final command asks for
# q8_0 V with flash attention left off.

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
cache_type_k: str = "f16"                 # -ctk: K cache type
cache_type_v: str = "f16"                 # -ctv: V cache type (quantized V needs flash attention)
flash_attn: str = "auto"                  # -fa: on, off or auto
swa_full: bool = False                    # --swa-full: full-size cache for sliding-window layers
n_threads: int = 0                        # -t: CPU threads (0: llama.cpp's choice, all cores)

# -- levers swept by the notebooks
ctx_sizes: list[int] = [2048, 4096, 8192, 16384, 32768]  # context sizes (01 what-fits heatmap, 06 KV memory)
cache_types: list[str] = ["f16", "q8_0", "q4_0"]  # KV cache types (01, 06)
depths: list[int] = [0, 512, 1024, 2048]  # tokens already in the context when decode is measured (06; llama-bench -d)

# -- measurement budget
n_gen: int = 128                          # generated tokens per tg test (llama-bench -n)
repetitions: int = 5                      # repetitions per test (llama-bench -r); reports show the spread

# %%
# Validate the parameters above (papermill's injected ones included): a wrong type or value stops here.
from v100lab.workbook import plots, render
from v100lab.workbook.levers import baseline, by_hand, captions, context, exercises, overview, steps, summaries
from v100lab.workbook.scenario import from_notebook

sc = from_notebook(globals())
render.text_table(overview.scenario_facts(sc))

# %% [markdown]
# ## KV cache memory: predicted vs llama.cpp's log

# %%
kv = context.kv_memory(sc)
plots.kv_memory(kv)

# %%
captions.caption_kv(sc, kv)

# %% [markdown]
# ## Decode speed against depth

# %%
depth = context.depth_sweep(sc)
plots.sweep(depth, "Decode speed vs tokens already in the context", lever="n_depth", metrics=("tg_tps",))

# %%
captions.caption_depth(sc, depth)

# %% [markdown]
# ## The KV cache a token reads at depth d, by hand
#
# A new token attends to every cell in use — the d tokens already there and itself — in every layer with a
# cache (a sliding-window layer only to its window). Without flash attention llama.cpp multiplies over the
# cells up to the next multiple of 256.

# %% tags=["by-hand"]
spec = steps.study(sc).spec
layers = by_hand.kv_layers(spec)
heads = spec.n_head_kv(layers[0])
per_cell = heads * (spec.head_dim_k * by_hand.bytes_per_element(sc.cache_type_k)
                    + spec.head_dim_v * by_hand.bytes_per_element(sc.cache_type_v))
d = max(sc.depths)
used = d + 1                                                          # the context so far and the new token
cells = used if sc.flash_attn != "off" else max(256, -(-used // 256) * 256)
n_swa = len(spec.swa_layers)
kv_read = ((len(layers) - n_swa) * cells + n_swa * min(cells, spec.sliding_window or cells)) * per_cell
print(f"depth {d}: {kv_read / 2**20:,.2f} MiB of KV cache per token, beside {spec.weight_bytes / 2**20:,.1f} MiB "
      f"of weights ({kv_read / spec.weight_bytes:.1%})")
by_hand.agree(f"KV read per token at depth {d}", kv_read, context.kv_read_per_token(sc, d), "bytes")

# %% [markdown]
# ## Quantized V needs flash attention

# %%
qv = context.quantized_v(sc)
render.text_table(qv)

# %% [markdown]
# ## What this run showed

# %%
summaries.summary_context(sc, kv, depth, qv)

# %%
baseline.headline(depth, lever="n_depth")

# %% [markdown]
# ## Try it
#
# Switch both cache types to q8_0 (`cache_type_k`, `cache_type_v`). How much KV memory comes back, and does
# decode halfway through the context change? Write your guess down, then open the answer below (the package's
# prediction for the scenario's model on its device, now and with the change).

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
render.text_table(exercises.what_if(sc, cache_type_k="q8_0", cache_type_v="q8_0"))

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
# # 07 · Flash attention
#
# `-fa` fuses attention into one kernel: the scores of every query against every cached key are never
# written out as a matrix, and cells beyond the ones in use are skipped instead of multiplied by zero. It
# matters where attention has something to read — deep in a long context — and it is what lets llama.cpp
# keep a quantized V cache (06). The seed found no gain on its V100; here both settings run at the same
# depth, measured against the prediction.

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
n_threads: int = 0                        # -t: CPU threads (0: llama.cpp's choice, all cores)

# -- levers swept by the notebooks
depths: list[int] = [0, 512, 1024, 2048]  # tokens already in the context when decode is measured (06; llama-bench -d)

# -- measurement budget
n_prompt: int = 512                       # prompt tokens per pp test (llama-bench -p)
n_gen: int = 128                          # generated tokens per tg test (llama-bench -n)
repetitions: int = 5                      # repetitions per test (llama-bench -r); reports show the spread

# %%
# Validate the parameters above (papermill's injected ones included): a wrong type or value stops here.
from v100lab.workbook import plots, render
from v100lab.workbook.levers import baseline, by_hand, captions, context, exercises, flash_attention, overview, steps, summaries
from v100lab.workbook.scenario import from_notebook

sc = from_notebook(globals())
render.text_table(overview.scenario_facts(sc))

# %% [markdown]
# ## Flash attention off vs on, at depth

# %%
fa = flash_attention.flash_attn_sweep(sc)
plots.sweep(fa, "Flash attention off vs on, at the deepest of the scenario's depths", lever="flash_attn")

# %%
captions.caption_flash_attn(sc, fa)

# %% [markdown]
# ## The cells a token reads, by hand
#
# At depth d a new token attends to d + 1 cells. The flash-attention kernel reads exactly those; without it,
# the attention is a matrix product over the cache up to the next multiple of 256 cells (the masked ones
# included). Each cell holds K and V for every layer with a cache.

# %% tags=["by-hand"]
spec = steps.study(sc).spec
layers = by_hand.kv_layers(spec)
heads = spec.n_head_kv(layers[0])
cell = heads * (spec.head_dim_k * by_hand.bytes_per_element(sc.cache_type_k)      # one layer's K and V for one cell
                + spec.head_dim_v * by_hand.bytes_per_element(sc.cache_type_v))
d = flash_attention.flash_attn_depth(sc)
cells_on = d + 1                                       # flash attention: the cells in use
cells_off = max(256, -(-cells_on // 256) * 256)        # a matmul over the cells up to the next 256
n_swa = len(spec.swa_layers)                           # sliding-window layers: at most their window (+ a micro-batch)
window = spec.sliding_window or cells_on
swa_cache = -(-(window + min(sc.n_ubatch, sc.n_batch)) // 256) * 256
on = ((len(layers) - n_swa) * cells_on + n_swa * min(cells_on, window)) * cell
off = ((len(layers) - n_swa) * cells_off + n_swa * min(cells_off, swa_cache)) * cell
print(f"depth {d}: -fa on reads {cells_on} cells, -fa off {cells_off} ({on / 2**20:,.2f} vs {off / 2**20:,.2f} MiB "
      f"of KV cache per token)")
by_hand.agree(f"KV read per token at depth {d}, -fa on", on, context.kv_read_per_token(sc, d, "on"), "bytes")
by_hand.agree(f"KV read per token at depth {d}, -fa off", off, context.kv_read_per_token(sc, d, "off"), "bytes")

# %% [markdown]
# ## Fewer bytes, yet not always faster
#
# The cell above counts what each path reads, and on a GPU that decides it. On a CPU, decode attention is
# compute-bound, and the two paths compute differently: without flash attention llama.cpp runs three operations
# over the padded cells (K·Q as a matrix product of long rows, one vectorised softmax, then V times the scores),
# while the fused kernel walks the cells one at a time with an online softmax (a scale, an `expf` and a rescale per
# cell). Calibration decodes its depth rung both ways and measures the ratio of the two paths' attention compute;
# the prediction above uses it, so on a CPU `-fa off` may be predicted faster although it reads more.
# %% [markdown]
# ## What this run showed

# %%
summaries.summary_flash_attn(sc, fa)

# %%
baseline.headline(fa, lever="flash_attn")

# %% [markdown]
# ## Try it
#
# Turn flash attention off (`flash_attn: "off"`). Which rows of the table should change, and which should not?
# Write your guess down, then open the answer below (the package's prediction for the scenario's model on its
# device, now and with the change).

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
render.text_table(exercises.what_if(sc, flash_attn="off"))

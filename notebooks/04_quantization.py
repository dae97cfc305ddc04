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
# # 04 · Quantization: speed, size — and quality measured, not judged by impression
#
# The seed chose Q4_0 over Q4_K_M for speed and called Q3_K_M "clearly dumber" by impression. Here the quant
# ladder of a synthetic model is built with llama.cpp's own quantizer and measured (decode, prompt, file size)
# against the prediction; and quality is measured as perplexity and KL divergence from the unquantized
# reference on a text that ships with Python (`pydoc_data.topics`, the Language Reference topics).

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
n_threads: int = 0                        # -t: CPU threads (0: llama.cpp's choice, all cores)

# -- levers swept by the notebooks
quants: list[str] = ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K"]  # quant ladder: predicted for `model`, measured on `ladder_model` (04)
ladder_model: str = "synth-280m"          # synthetic zoo alias whose quant ladder is built and measured here (04)

# -- measurement budget
n_prompt: int = 512                       # prompt tokens per pp test (llama-bench -p)
n_gen: int = 128                          # generated tokens per tg test (llama-bench -n)
repetitions: int = 5                      # repetitions per test (llama-bench -r); reports show the spread
perplexity_ctx: int = 256                 # tokens per perplexity chunk (even; llama-perplexity -c)
perplexity_chunks: int = 4                # chunks scored per quant (cost: chunks x ctx tokens per model)

# %%
# Validate the parameters above (papermill's injected ones included): a wrong type or value stops here.
from v100lab.workbook import plots, render
from v100lab.workbook.levers import baseline, by_hand, captions, exercises, overview, quantization, summaries
from v100lab.workbook.scenario import from_notebook

sc = from_notebook(globals())
render.text_table(overview.scenario_facts(sc))

# %% [markdown]
# ## Speed per quant

# %%
ladder = quantization.quant_ladder(sc)
plots.quant_ladder(ladder)

# %%
captions.caption_ladder(sc, ladder)

# %% [markdown]
# ## File size per quant

# %%
plots.file_sizes(ladder)

# %%
captions.caption_file_sizes(sc, ladder)

# %% [markdown]
# ## Bits per weight → file size → ceiling, by hand
#
# A quant type stores weights in blocks: Q4_0 keeps 32 weights in 18 bytes (4-bit values and one f16 scale),
# 4.5 bits per weight. llama-quantize gives each tensor its own type (the embedding and the norms are not the
# rung's type), so the file is the header plus each tensor's weights × its bytes per weight — and, read once
# per token, it sets that rung's ceiling.

# %% tags=["by-hand"]
quant = sc.quants[0].upper()
rung = quantization.rung_spec(sc, quant)                        # that rung's header
machine = by_hand.subject(sc)[1]                           # where the ladder is measured (or predicted)
size = rung.header_bytes + sum(t.n_elements * by_hand.bytes_per_element(t.type_name) for t in rung.tensors)
bits = 8 * (size - rung.header_bytes) / rung.n_params     # average bits per weight over the whole file
print(f"{quant}: {rung.n_params / 1e6:,.1f} M weights in {size / 2**20:,.1f} MiB = {bits:.2f} bits per weight; "
      f"read once per token at {machine.bandwidth_gbs:g} GB/s: ≤ {machine.bandwidth_gbs * 1e9 / size:,.0f} tok/s")
by_hand.agree(f"{quant} file size", size, quantization.file_size(ladder, quant), "bytes")

# %% [markdown]
# ## Quality per quant
#
# The default model's real ladder: SmolLM2-135M's weights dequantized to F16 by llama.cpp (the reference),
# then quantized to each rung; perplexity of each, and its KL divergence from the reference's next-token
# distribution (llama-perplexity's method).
#
# One caveat to read the bars with: SmolLM2 ships as Q4_1, so the "F16" reference is a 4-bit model written
# out in 16 bits, and every rung re-quantizes it. Rungs whose grid cannot hold Q4_1's levels lose more than
# their bit count suggests; the widest rungs stay near-lossless and the narrowest is worst, as with a true F16
# model. The perplexity's standard error is wide on this short text: the KL divergence, measured at the same
# positions, is the sharper signal.

# %%
qual = quantization.quality_ladder(sc)
plots.quality(qual)

# %%
captions.caption_quality(sc, qual)

# %% [markdown]
# ## What this run showed

# %%
summaries.summary_quantization(sc, ladder, qual)

# %%
baseline.headline(ladder, lever="quant")

# %% [markdown]
# ## Try it
#
# Take the model to Q8_0. How much more memory does it need, and how much slower should decode be — what does
# the ratio of the file sizes say? Write your guess down, then open the answer below (the package's prediction
# for the scenario's model on its device, now and with the change).

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
render.text_table(exercises.what_if(sc, quant="Q8_0"))

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
# # 10 · --parallel: slots that share one pass over the weights
#
# `-np N` gives llama-server N slots: N conversations decoded together, one token each per step. A step reads
# the weights once for all of them, and each slot's own KV cache — so the total tok/s can rise with the slots
# while each stream gets slower, and the context `-c` is split between the slots. Here llama-server is started on
# 127.0.0.1 once per `-np` with the scenario's flags and driven the way serving benchmarks drive a server
# (`v100lab.measure.loadgen`, vLLM's definitions): a closed loop of one user, then of as many users as slots. Beside
# every measurement, the serving model's prediction (`v100lab.predict.serving`).

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

# -- levers swept by the notebooks
parallel_slots: list[int] = [1, 2, 4]   # -np values through llama-server (07)

# -- measurement budget
n_gen: int = 128                        # generated tokens per tg test (llama-bench -n)
repetitions: int = 5                    # repetitions per test (llama-bench -r); reports show the spread

# %%
# Validate the parameters above (papermill's injected ones included): a wrong type or value stops here.
from v100lab.workbook import plots, render
from v100lab.workbook.levers import baseline, by_hand, captions, exercises, overview, parallel, steps, summaries
from v100lab.workbook.scenario import from_notebook

sc = from_notebook(globals())
render.text_table(overview.scenario_facts(sc))

# %% [markdown]
# ## Every slot busy: all streams together and each stream against -np

# %%
par = parallel.parallel_sweep(sc)
plots.parallel(par)

# %%
captions.caption_parallel(sc, par)

# %% [markdown]
# ## Latency under load: time to first token, time per output token, the gaps between tokens
#
# Median, p90 and p99 over the requests (TTFT, TPOT) and over every gap of every request (ITL), for one user
# and with every slot busy. With equal requests the clients run in lockstep: their prompts share the first
# steps, so TTFT grows with the users, and every later step decodes one token for each of them.

# %%
lat = parallel.parallel_latency(sc)
plots.parallel_latency(lat)

# %%
captions.caption_parallel_latency(sc, lat)

# %% [markdown]
# ## One user: the seed's "use 1 slot" tested
#
# The seed runs `--parallel 1` and says more slots lower the single-stream speed. One user (concurrency 1)
# against the same server with more slots: is its decode slower?

# %%
user = parallel.one_user(sc)
plots.one_user(user)

# %%
captions.caption_one_user(sc, user)

# %% [markdown]
# ## What -np does to each slot's context and to the KV cache
#
# llama-server divides `--ctx-size` between the slots (llama.cpp's `n_ctx_seq`) unless `--kv-unified`, where the
# slots share one stream. Predicted from llama.cpp's context arithmetic and the memory plan, and read from the
# server's own load log where it ran.

# %%
ctx = parallel.slot_context(sc)
plots.slot_context(ctx)

# %%
captions.caption_slot_context(sc, ctx)

# %% [markdown]
# ### The context of one slot, by hand
#
# llama.cpp pads `-c` to a multiple of 256, then gives each of the `-np` streams `-c / -np` cells, padded to 256
# again (`llama_context::llama_context`, src/llama-context.cpp); `-c 0` means the model's training context.

# %% tags=["by-hand"]
n = max(sc.parallel_slots)
c = -(-(sc.n_ctx or steps.study(sc).spec.n_ctx_train) // 256) * 256
per_slot = -(-(c // n) // 256) * 256
print(f"-c {c} over -np {n}: {per_slot} tokens per slot (with --kv-unified: one stream of {c})")
by_hand.agree(f"context per slot at -np {n}", per_slot, parallel.context_per_slot(sc, n), "tokens")

# %% [markdown]
# ## The ceiling of N streams, by hand
#
# One step reads the weights a token multiplies once, and each slot's KV cache (and, in recurrent layers, its
# state) once per slot: N tokens for weights + N × (KV + state) bytes. At depth 1024 (a few turns into a chat):

# %% tags=["by-hand"]
st = steps.study(sc)
spec, dev = st.spec, st.device
read = spec.weight_bytes - sum(t.n_bytes for t in by_hand.not_multiplied(spec))   # weights one step reads
experts = by_hand.expert_tensors(spec)   # MoE: the top-k share of the experts, as the speed model counts it
if experts:
    read -= (1 - spec.expert_used_count / spec.expert_count) * sum(t.n_bytes for t in experts)
layers = by_hand.kv_layers(spec)
heads = spec.n_head_kv(layers[0])
cell = heads * (spec.head_dim_k * by_hand.bytes_per_element(sc.cache_type_k)
                + spec.head_dim_v * by_hand.bytes_per_element(sc.cache_type_v))
d = 1024
used = d + 1 if sc.flash_attn != "off" else max(256, -(-(d + 1) // 256) * 256)
n_swa = len(spec.swa_layers)
kv_slot = ((len(layers) - n_swa) * used + n_swa * min(used, spec.sliding_window or used)) * cell
conv = max((spec.ssm_conv_kernel or 1) - 1, 0) * ((spec.ssm_inner_size or 0)
                                                  + 2 * (spec.ssm_group_count or 0) * (spec.ssm_state_size or 0))
state_slot = len(spec.recurrent_layers) * 2 * 4 * (conv + (spec.ssm_state_size or 0) * (spec.ssm_inner_size or 0))
slots = max(sc.parallel_slots)
one = dev.bandwidth_gbs * 1e9 / (read + kv_slot + state_slot)
many = slots * dev.bandwidth_gbs * 1e9 / (read + slots * (kv_slot + state_slot))
print(f"{dev.name}: one stream ≤ {one:,.1f} tok/s; {slots} streams ≤ {many:,.1f} tok/s together, "
      f"{many / slots:,.1f} each")
by_hand.agree(f"ceiling of {slots} streams at depth {d}", many, parallel.aggregate_ceiling(sc, slots, d), "tok/s")

# %% [markdown]
# ## What this run showed

# %%
summaries.summary_parallel(sc, par, lat, user, ctx)

# %%
baseline.headline(par, lever="n_parallel")

# %% [markdown]
# ## Try it
#
# Set `n_parallel: 4`. How much context does each slot get, and does the KV cache grow? Write your guess down,
# then open the answer below (the package's prediction for the scenario's model on its device, now and with the
# change).

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
render.text_table(exercises.what_if(sc, n_parallel=4))

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
# # 13 · Speculative decoding: more than one token per pass over the weights
#
# One stream's decode cannot beat bandwidth ÷ bytes read per token (notebook 02): every token reads every weight.
# Speculative decoding goes past that line. A cheap draft proposes n tokens — a smaller model (`-md`), a model's own
# MTP layer (`--spec-type draft-mtp`), or a lookup of the text so far (`ngram-*`, no model at all) — and the big
# model checks all n in **one** pass over n + 1 positions, keeping the drafted tokens up to the first it disagrees
# with, plus one of its own. With a per-token acceptance α, a pass yields E = 1 + α + … + αⁿ = (1 − αⁿ⁺¹) / (1 − α)
# tokens. The pass costs the big model on n + 1 tokens (weights read once; a GPU barely notices the extra columns,
# a small CPU pays for each) plus n draft steps. Here: llama-server with n-gram self-speculation on the default
# model, over draft lengths, on a prompt whose answer repeats it (editing a code block) and one whose answer does
# not; beside each, the speed predicted from the acceptance llama-server reports (`draft_n_accepted / draft_n`).

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

# -- measurement budget
repetitions: int = 5                    # repetitions per test (llama-bench -r); reports show the spread

# %%
# Validate the parameters above (papermill's injected ones included): a wrong type or value stops here.
from v100lab.workbook import plots, render
from v100lab.workbook.levers import by_hand, exercises, overview, spec_decode, steps
from v100lab.predict.speculative import alpha_from_rate, tokens_per_pass
from v100lab.workbook.scenario import from_notebook

sc = from_notebook(globals())
render.text_table(overview.scenario_facts(sc))

# %% [markdown]
# ## Measured: decode speed and acceptance over the draft length
#
# One llama-server per draft length (0: no speculation), each prompt completed greedily. Solid: measured (± sd);
# dashed: predicted from that run's measured acceptance, its speed without speculation, and the package's cost of
# verifying n + 1 tokens at once on this machine; grey bars: the share of drafted tokens accepted.

# %%
spec = spec_decode.spec_sweep(sc)
plots.speculative(spec)

# %%
spec_decode.caption_speculative(sc, spec)

# %% [markdown]
# ### Tokens per pass and the ceiling, by hand
#
# llama-server reports r = accepted ÷ drafted. Each pass keeps on average n·r drafted tokens plus its own, so
# E = 1 + n·r; the per-token α whose geometric sum gives that E is what the package recovers. A pass reads the
# weights once, so the ceiling for speculative decode is the plain ceiling (bandwidth ÷ weight bytes) × E.

# %% tags=["by-hand"]
alpha, n = 0.6, 4
e = (1 - alpha ** (n + 1)) / (1 - alpha)
r = (e - 1) / n
print(f"α {alpha}, n {n}: {e:.3f} tokens per pass; llama-server would report {r:.3f} of drafted tokens accepted")
by_hand.agree("tokens per pass", e, tokens_per_pass(alpha, n), "tokens")
by_hand.agree("α from the reported ratio", alpha, alpha_from_rate(r, n))
st = steps.study(sc)
plain = st.device.bandwidth_gbs * 1e9 / st.spec.weight_bytes
print(f"{st.device.name}: plain ceiling {plain:,.1f} tok/s; speculative ceiling {plain * e:,.1f} tok/s")
by_hand.agree("ceiling for speculative decode", plain * e, spec_decode.spec_ceiling(sc, alpha, n), "tok/s")

# %% [markdown]
# ## Predicted on the scenario's device: where a longer draft stops paying
#
# A longer draft yields more tokens per pass only while its tokens are accepted: E approaches 1 / (1 − α), while the
# verification pass keeps growing with n. n-gram drafting costs nothing per token; the best length is where the
# extra columns outweigh what the last drafted token is still worth.

# %%
what = spec_decode.what_if(sc)
plots.speculative_what_if(what)

# %%
spec_decode.caption_spec_what_if(sc, what)

# %% [markdown]
# ## The seed's V100 with an MTP head (predicted)
#
# The seed's last stage on its 16 GB V100, with `--spec-type draft-mtp --spec-draft-n-max 2`: each draft step reads
# one layer and the output head; α is assumed (said in the note). Labelled predicted: nothing here ran on a V100.

# %%
mtp = spec_decode.seed_mtp(sc)
render.text_table(mtp[["value", "metric", "result", "unit", "source", "note"]])

# %% [markdown]
# ## What this run showed

# %%
spec_decode.summary_speculative(sc, spec, what, mtp)

# %% [markdown]
# ## Try it
#
# A verification pass checks the drafted tokens in one batch: it pays when that pass costs little more than a
# single token's, and loses when every extra token costs as much as one. Move the same model to the seed's V100: does
# drafting 4 n-gram tokens at α 0.7 gain more or less there than on this machine, and what bounds one token's decode
# on each? Write your guess down, then open the answer below (the package's prediction for the scenario's model on
# this machine and on the V100).

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["answer"]
render.text_table(exercises.what_if(sc, device="v100-16gb", draft=(0.7, 4)))

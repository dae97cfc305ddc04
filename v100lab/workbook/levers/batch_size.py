"""Notebook 08, ``-b``/``-ub``: how many prompt tokens one graph step processes — prompt processing speed
measured vs predicted over the micro-batch sizes, with a prompt longer than the largest of them.
"""

from __future__ import annotations

import math

from v100lab.workbook.scenario import Scenario
from v100lab.predict.work import layer_matrices
from v100lab.workbook.levers.steps import conditions, ctx_for, lever_frame, lever_rows, parameters, study

PARAMETERS = parameters("n_ctx", "n_batch", "flash_attn", "n_threads", "batch_sizes", "n_prompt",
                        "repetitions")


def batch_prompt(sc: Scenario) -> int:
    """Prompt tokens of the batch sweep: at least ``n_prompt``, and longer than the largest micro-batch (by the
    smallest), so that every ``-ub`` value splits the prompt into a different number of steps — with a prompt
    no longer than a micro-batch, the larger values are the same run."""
    return max(sc.n_prompt, max(sc.batch_sizes) + min(sc.batch_sizes))


def batch_sweep(sc: Scenario):
    """-ub (with -b at least as large): prompt processing measured vs predicted (lever "n_ubatch"), with a
    prompt of :func:`batch_prompt` tokens. Decode processes one token per step whatever the batch sizes, so
    it is not measured here (the frame's ``n_prompt`` attribute says the prompt length)."""
    st = study(sc)
    n_prompt = batch_prompt(sc)
    base = ctx_for(sc.run_config(), n_prompt + 1)
    vals = list(sc.batch_sizes)

    def cfg_of(v):
        return base.with_(n_batch=max(v, base.n_batch), n_ubatch=v)

    rows, failures = lever_rows(sc, "n_ubatch", vals, cfg_of, [f"pp{n_prompt}"], n_prompt=n_prompt)
    return lever_frame(rows, failures, why_not_measured=st.why_not_measured, n_prompt=n_prompt,
                  conditions=conditions(base, st.measured_label or st.label,
                                        depth=f"0 (pp{n_prompt} × {sc.repetitions})",
                                        extra=[f"-b max(-ub, {base.n_batch})"]))


def prompt_weight_bytes(sc: Scenario, n_ubatch: int, n_prompt: int | None = None) -> float:
    """Weight bytes read to process a prompt (default :func:`batch_prompt` tokens) in steps of ``n_ubatch``
    tokens — every layer's matrices once per step (the speed model's memory term of prompt processing)."""
    spec = study(sc).spec
    n_prompt = batch_prompt(sc) if n_prompt is None else n_prompt
    steps = math.ceil(n_prompt / n_ubatch)       # batch_sweep raises -b to at least -ub
    return steps * sum(t.n_bytes for t in layer_matrices(spec, range(spec.n_layer)))

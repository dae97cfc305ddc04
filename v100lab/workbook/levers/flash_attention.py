"""Notebook 07, flash attention: decode and prompt speed with ``-fa off`` and ``-fa on`` at a depth where
attention has cells to read, measured vs predicted.
"""

from __future__ import annotations

from v100lab.workbook.scenario import Scenario
from v100lab.workbook.levers.steps import bench_tests, conditions, ctx_for, lever_frame, lever_rows, parameters, study

PARAMETERS = parameters("n_ctx", "cache_type_k", "cache_type_v", "n_threads", "depths", "n_prompt", "n_gen",
                        "repetitions")


def flash_attn_depth(sc: Scenario) -> int:
    """The depth flash attention is compared at: the deepest of ``depths`` (at depth 0 attention reads
    almost nothing, so on and off cannot differ)."""
    return max(sc.depths) if sc.depths else 0


def flash_attn_sweep(sc: Scenario):
    """Flash attention off vs on at :func:`flash_attn_depth` tokens of context: measured vs predicted (lever
    "flash_attn"; the frame's ``depth`` attribute says where)."""
    st = study(sc)
    depth = flash_attn_depth(sc)
    base = ctx_for(sc.run_config(), depth + sc.n_prompt + sc.n_gen + 1)

    def cfg_of(v):
        return base.with_(flash_attn=v)

    rows, failures = lever_rows(sc, "flash_attn", ["off", "on"], cfg_of, bench_tests(sc), depth=depth)
    return lever_frame(rows, failures, why_not_measured=st.why_not_measured, depth=depth,
                  conditions=conditions(base, st.measured_label or st.label, depth=depth, fa=False,
                                        extra=[f"pp{sc.n_prompt}, tg{sc.n_gen} × {sc.repetitions}"]))

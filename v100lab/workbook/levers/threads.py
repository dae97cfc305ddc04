"""Notebook 09, ``-t``: prompt processing and decode against the number of CPU threads, measured vs
predicted.
"""

from __future__ import annotations

import os

from v100lab.workbook.scenario import Scenario
from v100lab.workbook.levers.steps import bench_tests, conditions, ctx_for, lever_frame, lever_rows, parameters, study

PARAMETERS = parameters("n_ctx", "thread_counts", "n_prompt", "n_gen", "repetitions")


def thread_values(sc: Scenario) -> list[int]:
    """The -t values swept: ``thread_counts``, or 1 up to this machine's cores."""
    return list(sc.thread_counts) or list(range(1, (os.cpu_count() or 1) + 1))


def threads_sweep(sc: Scenario):
    """-t: prompt processing and decode vs CPU threads, measured vs predicted (lever "n_threads")."""
    st = study(sc)
    base = ctx_for(sc.run_config(), sc.n_prompt + sc.n_gen + 1)

    def cfg_of(v):
        return base.with_(n_threads=v)

    rows, failures = lever_rows(sc, "n_threads", thread_values(sc), cfg_of, bench_tests(sc))
    return lever_frame(rows, failures, why_not_measured=st.why_not_measured, depth=sc.n_gen // 2,
                  conditions=conditions(base, st.measured_label or st.label, threads=False,
                                        depth=f"0 (pp{sc.n_prompt}, tg{sc.n_gen} × {sc.repetitions})",
                                        extra=[f"{os.cpu_count()} logical cores here"]))

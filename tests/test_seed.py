"""The seed's staircase: every stage claimed vs predicted, with both ceilings and the verdict."""

from __future__ import annotations

from v100lab.facts.results import tidy_frame
from v100lab.advise.seed import seed_staircase


def test_seed_staircase_rows_are_consistent():
    rows = seed_staircase("v100-16gb")
    stages = {r.value for r in rows}
    assert len(stages) >= 6
    for st in stages:
        srcs = {r.source for r in rows if r.value == st}
        assert srcs == {"claimed", "predicted"}
        strict = next(r.result for r in rows if r.value == st and r.metric == "physical_ceiling_tg_tps")
        for r in rows:
            if r.value == st and r.metric == "tg_tps":
                assert r.above_ceiling == (r.result > strict)
                if r.above_ceiling and r.source == "claimed":
                    assert "impossible" in r.note
    # the seed's own Q4_0 ceiling is 62 tok/s: stage 6's 63–65 must be noted as above it
    st6 = [r for r in rows if r.value.startswith("6 ") and r.source == "claimed"]
    assert st6 and all("seed's own ceiling" in r.note for r in st6)
    tidy_frame(rows)   # valid tidy rows

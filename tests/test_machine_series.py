"""The machine watched while the baseline runs (the seed's `nvidia-smi -l 1`, recorded): a real llama.cpp run on
params/ci.yaml, its once-a-second samples kept with the frame, drawn and described."""

from __future__ import annotations

from pathlib import Path

import pytest

from v100lab.workbook import plots
from v100lab.workbook.levers import baseline, captions
from v100lab.workbook.scenario import load_scenario

CI = Path(__file__).resolve().parents[1] / "params" / "ci.yaml"


@pytest.fixture(scope="module")
def base():
    pytest.importorskip("llama_cpp")
    return baseline.baseline(load_scenario(CI))


def test_the_baseline_keeps_what_the_machine_did_while_each_test_ran(base):
    series = base.attrs["monitor_series"]
    assert [t for t, _ in series] and all(len(samples) >= 2 for _, samples in series), \
        "each measured test was watched from its start to its stop"
    rss = [s["rss_bytes"] for _, samples in series for s in samples if "rss_bytes" in s]
    assert rss and min(rss) > 10 * 2**20, "llama.cpp's worker holds the model: tens of MiB at least"


def test_the_plot_draws_each_quantity_and_marks_each_test(base):
    fig = plots.machine_during_run(base)
    gpu = any(s.get("gpus") for _, ss in base.attrs["monitor_series"] for s in ss)
    assert len(fig.axes) == (3 if gpu else 2)
    for ax in fig.axes:
        assert ax.lines, f"no series drawn on {ax.get_ylabel()!r}"
        assert {t.get_text().strip() for t in ax.texts} >= {t for t, _ in base.attrs["monitor_series"]}
    assert ("nvidia-smi" in fig._suptitle.get_text()) == gpu


def test_the_caption_says_peak_memory_against_the_weights(base):
    text = captions.caption_machine(load_scenario(CI), base).data
    assert "MiB" in text and "of weights" in text


def test_nothing_measured_nothing_watched():
    from v100lab.workbook.levers.steps import lever_frame

    df = lever_frame([], why_not_measured="measure: false in the parameter file")
    fig = plots.machine_during_run(df)
    assert "not watched: measure: false" in fig.axes[0].texts[0].get_text()

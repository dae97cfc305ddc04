"""The rules behind every notebook's headline and "best" (no llama.cpp): a headline is the median error over what
was measured, never a configuration that does not fit; a winner only beyond the two measurements' spread."""

from __future__ import annotations

import pytest

from v100lab.facts.results import Observation, tidy_frame
from v100lab.workbook.levers.baseline import headline_figures
from v100lab.workbook.levers.text import best_of, points
from v100lab.workbook.render import headline_record, headline_text


def _frame(rows, lever="n_depth"):
    obs = []
    for value, measured, sd, predicted, *fits in rows:
        common = dict(model="m", quant="Q4_0", device="host", lever=lever, value=str(value), metric="tg_tps",
                      unit="tok/s")
        if measured is not None:
            obs.append(Observation(**common, result=measured, source="measured", sd=sd, repetitions=3))
        obs.append(Observation(**common, result=predicted, source="predicted", fits=fits[0] if fits else None))
    return tidy_frame(obs)


def test_the_headline_is_the_median_error_not_one_point():
    # errors (predicted / measured − 1): +50 %, +10 %, 0 %, −5 %, −40 %: the median is 0 %, at depth 1024
    df = _frame([(0, 100, 1, 150), (512, 100, 1, 110), (1024, 100, 1, 100), (2048, 100, 1, 95), (4096, 100, 1, 60)])
    f = headline_figures(df, lever="n_depth")
    assert f["points"] == 5 and f["median_error"] == pytest.approx(0.0)
    assert f["value"] == "1024" and f["measured"] == 100 and f["predicted"] == 100 and f["sd"] == 1
    assert f["worst_value"] == "0" and f["worst_error"] == pytest.approx(0.5), "the largest gap is named"


def test_a_configuration_that_does_not_fit_is_never_the_headline():
    df = _frame([(0, 10, 0.1, 10.5, True), (64, 30, 0.1, 31, True), (65, 40, 0.1, 200, False)], lever="n_gpu_layers")
    f = headline_figures(df, lever="n_gpu_layers")
    assert f["points"] == 2 and f["value"] != "65" and abs(f["worst_error"]) < 0.1


def test_nothing_measured_gives_no_figures():
    assert headline_figures(_frame([(0, None, 0, 10)])) == {}


def test_best_only_beyond_the_noise_of_the_best_two():
    # the winner's lead over the runner-up (1.0) is inside their spread (2 + 2): no winner, whatever the worst does
    close = points(_frame([("Q4_0", 202.1, 2, 200), ("Q2_K", 201.1, 2, 200), ("Q8_0", 150, 2, 140)], "quant"),
                   "tg_tps", "quant")
    assert best_of(close).startswith("no difference beyond the noise between Q4_0 and Q2_K")
    clear = points(_frame([("Q4_0", 220, 2, 200), ("Q2_K", 201.1, 2, 200)], "quant"), "tg_tps", "quant")
    assert best_of(clear).startswith("best Q4_0: +9 % over Q2_K")


def test_the_record_carries_spread_error_and_finding():
    h = headline_record(80.0, 100.0, sd=2.5, median_error=0.25, worst_error=0.4, points=4, finding="best x")
    text = headline_text(h)
    assert "± 2.5" in text and "median error +25 % over 4 point(s)" in text and "best x" in text
    assert "measured 1.5 s vs predicted —" in headline_text(headline_record(1.5, None, unit="s"))
    with pytest.raises(Exception, match="points"):
        headline_record(1.0, 1.0, points=-1)


def test_one_sign_convention_for_errors():
    """error = predicted / measured − 1 in captions, summaries and the index alike: a prediction above the
    measurement is a positive error everywhere."""
    from v100lab.workbook.levers.captions import _against
    from v100lab.workbook.levers.summaries import _agreement

    assert _against(362.0, 475.0) == "predicted 475.0, error +31 %"
    assert _agreement([("x", 362.0, 475.0)]).startswith("median |error| 31 %")
    assert headline_figures(_frame([(0, 362.0, 1, 475.0)]))["median_error"] == pytest.approx(475 / 362 - 1)

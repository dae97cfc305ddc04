"""v100lab tune: the search, the margin, the reasons, the seed's command, and --measure on real runs."""

from __future__ import annotations

import json

import pytest

from v100lab.predict import memory
from v100lab.advise.seed import seed_verdict
from v100lab.advise import tune as tune_module
from v100lab.advise.tune import DEFAULT_QUANTS, TIE, margin_bytes, tune
from v100lab.cli.main import main
from v100lab.facts.config import RunConfig
from v100lab.facts.devices import get_device
from v100lab.base.errors import ConfigError, V100labError
from v100lab.gguf.skeleton import skeleton_spec


@pytest.fixture(scope="module")
def seed_tune():
    return tune("qwen35-27b", "v100-16gb", min_ctx=2048)


def _flags(argv):
    return [a for a in argv if a.startswith("--")]


def test_seed_scenario_choice_is_the_fastest_that_fits(seed_tune):
    r = seed_tune
    dev = get_device("v100-16gb")
    best = r.best
    assert best.fits and best.margin_bytes >= margin_bytes(dev)
    fitting = [c for c in r.candidates if c.fits]
    assert best.tg_tps >= max(c.tg_tps for c in fitting) * (1 - TIE)
    # every better-quality quant either fits only partially / not at all, or is slower beyond the tie band
    bpw = {q: skeleton_spec("qwen35-27b", q).bits_per_weight for q in DEFAULT_QUANTS}
    for q in DEFAULT_QUANTS:
        if bpw[q] <= bpw[best.quant]:
            continue
        full = [c for c in fitting if c.quant == q and c.offloaded_layers == c.n_layer_total]
        assert all(c.tg_tps < best.tg_tps * (1 - TIE) for c in full)
    # the memory plan agrees that the chosen configuration leaves the margin
    p = memory.plan(skeleton_spec("qwen35-27b", best.quant), dev, best.config, with_max_ctx=False)
    assert p.devices["v100-16gb"].margin_bytes >= margin_bytes(dev)
    assert p.offloaded_layers == p.n_layer_total


def test_command_spelling_and_one_reason_per_flag(seed_tune):
    r = seed_tune
    assert r.argv[0] == "llama-server" and r.argv[1] == "-m"
    flags = _flags(r.argv)
    for f in ("--gpu-layers", "--ctx-size", "--ubatch-size", "--cache-type-k", "--cache-type-v", "--flash-attn",
              "--parallel"):
        assert f in flags
    assert "-ngl" not in r.argv and "-fa" not in r.argv and "--n-gpu-layers" not in r.argv
    assert r.argv[r.argv.index("--ctx-size") + 1] == "2048"
    reason_flags = [x.flag.split()[0] for x in r.reasons]
    assert reason_flags[0] == "-m"
    assert sorted(reason_flags[1:]) == sorted(flags)
    for x in r.reasons:
        assert x.why and "\n" not in x.why
    # the offload reason carries a real prediction delta against --gpu-layers 0
    gl = next(x for x in r.reasons if x.flag.startswith("--gpu-layers"))
    assert gl.delta_tps is not None and gl.delta_tps > 0


def test_quantized_v_always_with_flash_attention(seed_tune):
    for c in seed_tune.candidates:
        if c.config.kv_quantized_v:
            assert c.config.flash_attn == "on"


def test_quantized_cache_when_only_it_fits(tmp_path):
    """llama2-7b (32 KV heads) at a 32k context: f16 KV (16 GiB) cannot fit a 14 GiB card, q8_0/q4_0 can."""
    dev = tmp_path / "card14.yaml"
    dev.write_text("id: card14\nname: a 14 GB card\nkind: gpu\nmemory_gib: 14\nbandwidth_gbs: 900\n"
                   "runtime_overhead_mib: 512\nhost_link_gbs: 15.75\nfp16_tflops: 112\n")
    r = tune("skeleton:llama2-7b:Q4_0", dev, min_ctx=32768)
    assert r.best.fits and r.best.offloaded_layers == r.best.n_layer_total
    assert r.config.cache_type_v != "f16" and r.config.flash_attn == "on"
    assert r.argv[r.argv.index("--flash-attn") + 1] == "on"
    fa = next(x for x in r.reasons if x.flag.startswith("--flash-attn"))
    assert "required" in fa.why
    f16_full = [c for c in r.candidates if c.config.cache_type_v == "f16" and c.offloaded_layers == c.n_layer_total]
    assert not any(c.fits for c in f16_full)


def test_margin_excludes_a_config_that_fits_only_without_it(tmp_path):
    spec = skeleton_spec("qwen35-27b", "Q4_0")
    cfg = RunConfig(n_ctx=2048, flash_attn="auto")
    probe = tmp_path / "probe.yaml"
    probe.write_text("id: probe\nname: probe\nkind: gpu\nmemory_gib: 64\nbandwidth_gbs: 900\n")
    total = memory.plan(spec, get_device(probe), cfg, with_max_ctx=False).devices["probe"].total_bytes
    # a card whose memory is the plan's total plus 100 MiB: the plan fits, the 256 MiB+ margin does not
    gib = (total + 100 * 2**20) / 2**30
    card = tmp_path / "tight.yaml"
    card.write_text(f"id: tight\nname: tight\nkind: gpu\nmemory_gib: {gib}\nbandwidth_gbs: 900\nhost_link_gbs: 15.75\nfp16_tflops: 112\n")
    assert memory.plan(spec, get_device(card), cfg, with_max_ctx=False).fits
    r = tune("skeleton:qwen35-27b:Q4_0", card, min_ctx=2048)
    same = [c for c in r.candidates if c.config == cfg.with_(n_ubatch=512, n_batch=2048) and c.quant == "Q4_0"]
    assert r.best.margin_bytes >= margin_bytes(get_device(card))
    assert all(not c.fits or c.offloaded_layers < c.n_layer_total or c.margin_bytes >= margin_bytes(get_device(card))
               for c in r.candidates)
    assert not any(c.fits and c.config.n_ubatch == 512 and c.config.cache_type_v == "f16"
                   and c.offloaded_layers == c.n_layer_total for c in same)


def test_seed_verdict_reproduces_or_corrects_the_command():
    v = seed_verdict()
    assert not v.seed_runs and "flash attention" in v.seed_problem   # q8_0 V, -fa left off
    tuned = v.tuned.config
    assert not (tuned.kv_quantized_v and tuned.flash_attn == "off")  # the tuned command runs
    flags = [row[0] for row in v.rows]
    for f in ("-m (quant)", "--gpu-layers", "--ctx-size", "--cache-type-k/v", "--flash-attn", "--mlock"):
        assert f in flags
    df = v.frame()
    assert list(df.columns) == ["flag", "seed", "tuned", "verdict"] and len(df) == len(v.rows)
    obs = v.observations()
    claimed = [o for o in obs if o.source == "claimed"]
    ceiling = v.seed_candidate.weights_ceiling_tg_tps
    assert [o.above_ceiling for o in claimed] == [x > ceiling for x in v.claimed_tps]
    assert "seed:" in v.format_text() and "tuned:" in v.format_text()


def test_tidy_table_of_candidates(seed_tune):
    df = seed_tune.frame()
    assert set(df["source"]) == {"predicted"}
    assert set(df["metric"]) >= {"tg_tps", "pp_tps", "fits", "margin_bytes", "weights_ceiling_tg_tps"}
    assert df["value"].nunique() == len(seed_tune.candidates)


def test_synthetic_ladder_on_the_host():
    r = tune("synth-tiny", "host", min_ctx=256, quants=["Q8_0", "Q4_0"])
    assert {c.quant for c in r.candidates} == {"Q8_0", "Q4_0"}
    assert r.best.fits and r.argv[r.argv.index("--gpu-layers") + 1] == "0"
    assert r.argv[2].endswith(".gguf")


def test_measure_chooses_by_real_runs(default_model):
    r = tune("default", "host", min_ctx=512, measure=True, measure_top=2, n_gen=8, repetitions=2)
    assert r.measured
    timed = [c for c in r.candidates if c.measured_tg_tps is not None]
    # the top 2, and the best one's twins at llama.cpp's defaults (-fa auto, f16 cache) measured beside it
    assert 1 <= len(timed) <= 2 + len(tune_module._DEFAULT_FLAGS)
    assert r.best.measured_tg_tps is not None and r.best.measured_tg_tps > 0
    # the choice is the fastest measured one (best repetition), a tie inside the measurements' own spread, or the
    # default twin of a faster one whose gain is not beyond the noise
    tol = min(0.5, max([TIE] + [c.measured_cv for c in timed if c.measured_cv is not None and c.measured_cv <= 0.5]))
    assert all(c.measured_best_tg_tps >= c.measured_tg_tps for c in timed)
    fastest = max(timed, key=lambda c: c.measured_best_tg_tps)
    assert (r.best.measured_best_tg_tps >= fastest.measured_best_tg_tps * (1 - tol)
            or (tune_module._one_flag_from_default(fastest, r.best) and not tune_module.measured_gain(fastest, r.best)[2]))
    measured_rows = [o for o in r.observations() if o.source == "measured"]
    assert len(measured_rows) == len(timed)


def test_bad_input():
    with pytest.raises(ConfigError, match="architecture description"):
        tune("qwen35-27b", "host", measure=True)
    with pytest.raises(ConfigError, match="min-ctx"):
        tune("qwen35-27b", "v100-16gb", min_ctx=0)
    with pytest.raises(ConfigError, match="parallel"):
        tune("qwen35-27b", "v100-16gb", parallel=0)
    with pytest.raises(ConfigError, match="--parallel 257: llama.cpp refuses more than 256"):
        tune("qwen35-27b", "v100-16gb", parallel=257)
    with pytest.raises(ConfigError, match="--quants"):          # one skeleton names one quant: not ignored
        tune("skeleton:qwen35-27b:Q4_0", "v100-16gb", quants=["NOPE"])
    with pytest.raises(V100labError, match="NOPE"):
        tune("qwen35-27b", "v100-16gb", quants=["Q4_0", "NOPE"])


def test_quants_with_a_single_file(default_model):
    with pytest.raises(ConfigError, match="--quants"):
        tune(str(default_model), "host", quants=["Q4_0"])


def test_measure_on_a_gpu_this_build_cannot_reach():
    import llama_cpp

    if llama_cpp.llama_supports_gpu_offload():
        pytest.skip("this llama-cpp-python can offload to a GPU")
    with pytest.raises(ConfigError, match="GPU build"):
        tune("default", "v100-16gb", measure=True)


def test_cli(capsys):
    assert main(["tune", "qwen35-27b", "--device", "v100-16gb", "--min-ctx", "2048", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for k in ("model", "device", "quant", "argv", "command", "reasons", "candidates", "predicted_tg_tps",
              "margin_bytes", "config"):
        assert k in doc
    assert doc["command"] == " ".join(doc["argv"])
    assert all(set(r) == {"flag", "why", "delta_tps", "delta_bytes"} for r in doc["reasons"])
    assert main(["tune", "qwen35-27b", "--device", "v100-16gb", "--min-ctx", "2048"]) == 0
    out = capsys.readouterr().out
    assert out.count("llama-server -m") == 1 and "why each flag:" in out
    assert main(["tune", "qwen35-27b", "--device", "no-such-card"]) == 2
    assert main(["tune", "qwen35-27b", "--device", "v100-16gb", "--quants", " , "]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2


def test_every_candidate_is_judged_by_plans_rule(seed_tune):
    """fits on every candidate is memory.feasibility (GPU and host, margins, limits), the rule plan prints."""
    dev = get_device("v100-16gb")
    specs = {q: skeleton_spec("qwen35-27b", q) for q in {c.quant for c in seed_tune.candidates}}
    for c in seed_tune.candidates[::4]:
        f = memory.feasibility(specs[c.quant], [dev], c.config)
        assert f.fits == c.fits and tuple(b.line() for b in f.blockers) == tuple(b.line() for b in c.blockers)
    assert any(c.offloaded_layers < c.n_layer_total for c in seed_tune.candidates[::4])   # partial offloads judged too


def _cand(fa="auto", kv="f16", tg=100.0, measured=None, cv=0.02, quant="Q4_0"):
    from v100lab.advise.tune import Candidate

    cfg = RunConfig(n_gpu_layers=0, n_ctx=2048, cache_type_k=kv, cache_type_v=kv, flash_attn=fa)
    return Candidate(quant=quant, config=cfg, fits=True, margin_bytes=1 << 30, used_bytes=1 << 28, offloaded_layers=0,
                     n_layer_total=31, tg_tps=tg, pp_tps=300.0, weights_ceiling_tg_tps=200.0, bound="memory",
                     kv_bytes=1 << 20, compute_bytes=1 << 20, depth=1024, weight_bytes=1 << 27,
                     measured_tg_tps=measured, measured_cv=cv if measured else None,
                     measured_best_tg_tps=measured)


def test_a_flag_is_recommended_only_for_a_measured_gain_beyond_the_noise():
    """-fa off predicted +17 tok/s over llama.cpp's default (auto) but measured equal: not recommended; measured
    clearly faster: recommended; the twin at the default is found among the candidates and measured beside it."""
    import pandas as pd

    from v100lab.workbook.levers.final import judge_flags

    off, auto = _cand("off", tg=131.0, measured=79.3, cv=0.016), _cand("auto", tg=114.0, measured=80.0, cv=0.02)
    assert tune_module._one_flag_from_default(off, auto) == "--flash-attn"
    assert tune_module._one_flag_from_default(off, _cand("auto", quant="Q8_0")) == "", "another quant is no twin"
    assert tune_module._default_twins(off, [off, _cand("on"), auto]) == [auto]
    gain, noise, beyond = tune_module.measured_gain(off, auto)
    assert gain == pytest.approx(-0.7) and noise == pytest.approx(79.3 * 0.016 + 80 * 0.02) and not beyond
    faster = _cand("off", tg=131.0, measured=95.0, cv=0.01)
    assert tune_module.measured_gain(faster, auto)[2]

    rows = pd.DataFrame([
        {"flag": "--flash-attn", "predicted gain": 17.0, "measured gain": -0.7, "noise": 2.9},
        {"flag": "--flash-attn", "predicted gain": 17.0, "measured gain": 15.0, "noise": 2.5},
        {"flag": "--cache-type-k/v", "predicted gain": 3.0, "measured gain": -9.0, "noise": 2.0},
        {"flag": "--cache-type-k/v", "predicted gain": 3.0, "measured gain": float("nan"), "noise": float("nan")}])
    v = list(judge_flags(rows)["verdict"])
    assert v[0].startswith("not recommended") and "no difference beyond the noise" in v[0] and "+17.0" in v[0]
    assert v[1].startswith("recommended")
    assert v[2].startswith("not recommended") and "worse" in v[2]
    assert v[3] == "predicted only"

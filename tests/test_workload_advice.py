"""tune --users: slots, context per slot and cache types for a workload — feasibility first, then the SLO, then
throughput (v100lab.advise.tune_users). Predictions only: skeletons and a real GGUF header, nothing run."""

from __future__ import annotations

import json
import math

import pytest

from v100lab.gguf import llama_context
from v100lab.predict import memory
from v100lab.advise.tune import TIE, NothingFits
from v100lab.cli.main import main
from v100lab.facts.devices import get_device
from v100lab.base.errors import ConfigError
from v100lab.models.resolve import resolve
from v100lab.gguf.skeleton import skeleton_spec
from v100lab.advise.tune_users import Workload, advise, slot_counts, ubatches

SEED_MODEL = "skeleton:qwen35-27b:Q4_K_M"       # params/seed-v100-qwen27b.yaml's model


def _card(tmp_path, name: str, gib: float):
    p = tmp_path / f"{name}.yaml"
    p.write_text(f"id: {name}\nname: a {gib} GB card\nkind: gpu\nmemory_gib: {gib}\nbandwidth_gbs: 900\n"
                 "runtime_overhead_mib: 512\nhost_link_gbs: 15.75\nfp16_tflops: 112\n")
    return p


def _arg(argv, flag):
    return argv[argv.index(flag) + 1]


@pytest.fixture(scope="module")
def seed4():
    return advise(SEED_MODEL, "v100-16gb", Workload(users=4))


@pytest.fixture(scope="module")
def q4_0_users4():
    return advise("qwen35-27b", "v100-16gb", Workload(users=4), quants=["Q4_0"])


def test_every_plan_is_judged_by_memory_feasibility(seed4):
    """fits is memory.feasibility's verdict (every device, with its margin) for every plan; the recommendation and
    the choice at each slot count fit; every slot holds a whole request and --ctx-size is slots × that."""
    dev = get_device("v100-16gb")
    spec = skeleton_spec("qwen35-27b", "Q4_K_M")
    assert seed4.best.fits and seed4.plans[0] is seed4.best
    for p in seed4.plans:
        assert p.fits == memory.feasibility(spec, [dev], p.config).fits, p.label
    for p in (seed4.best, *seed4.per_slots()):
        assert memory.feasibility(spec, [dev], p.config).fits
        cs = llama_context.context_sizes(spec, p.config)
        assert cs.n_ctx_seq >= 512 + 128 and p.config.n_ctx == p.slots * seed4.workload.slot_ctx
        assert not (p.config.kv_quantized_v and p.config.flash_attn != "on")
    argv = seed4.argv
    assert argv[:2] == ("llama-server", "-m")
    assert int(_arg(argv, "--parallel")) == seed4.best.slots
    assert int(_arg(argv, "--ctx-size")) == seed4.best.slots * seed4.workload.slot_ctx
    assert _arg(argv, "--cache-type-k") == seed4.config.cache_type_k
    # one reason per flag of the command
    flags = [a for a in argv if a.startswith("--")]
    assert sorted(r.flag.split()[0] for r in seed4.reasons[1:]) == sorted(flags)


def test_seed_model_on_16gb_serves_four_users_by_shrinking_the_cache(seed4):
    """The seed scenario's Q4_K_M does not fit 16 GB whole even for one slot; for four users the advisor keeps
    as many layers on the card as a quantized cache allows, and four slots do not queue where one does.

    Which slot count wins on throughput depends on the CPU that runs the layers left over (this machine's host
    profile, calibrated or not), so the test asserts what holds on any host: the choice is the fastest plan that
    fits, and the memory facts."""
    b = seed4.best
    assert b.fits and b.candidate.offloaded_layers < b.candidate.n_layer_total
    assert b.output_tps >= max(p.output_tps for p in seed4.plans if p.fits) * (1 - TIE)
    one = next(p for p in seed4.per_slots() if p.slots == 1)
    four = next(p for p in seed4.per_slots() if p.slots == 4)
    assert one.serving.queue_ms > 0 and four.serving.queue_ms == 0
    assert four.ttft_ms < one.ttft_ms          # four users: one slot makes three of them wait a whole request
    # at four slots, the cache type chosen keeps at least as many layers on the GPU as f16 does
    f16 = [p for p in seed4.plans if p.fits and p.slots == 4 and p.config.cache_type_v == "f16"]
    assert f16 and all(p.candidate.offloaded_layers <= four.candidate.offloaded_layers for p in f16)


def test_without_an_slo_throughput_decides(q4_0_users4):
    r = q4_0_users4
    assert r.slo_met and not r.workload.has_slo
    top = max(p.output_tps for p in r.plans if p.fits)
    assert r.best.output_tps >= top * (1 - TIE)
    assert r.best.slots == 4


def test_slo_decides_before_throughput(q4_0_users4):
    """A TPOT limit that four slots miss (each prompt stalls the others): fewer slots meet it, and win."""
    tpot4 = next(p for p in q4_0_users4.per_slots() if p.slots == 4).tpot_ms
    tpot1 = next(p for p in q4_0_users4.per_slots() if p.slots == 1).tpot_ms
    assert tpot1 < tpot4
    limit = (tpot1 + tpot4) / 2
    r = advise("qwen35-27b", "v100-16gb", Workload(users=4, tpot_ms=limit), quants=["Q4_0"])
    assert r.slo_met and r.best.tpot_ms <= limit and r.best.slots < 4
    faster = [p for p in r.plans if p.fits and p.output_tps > r.best.output_tps / (1 - TIE)]   # beyond a tie
    assert faster and all(not p.slo_met for p in faster)
    met = [p for p in r.plans if p.fits and p.slo_met]
    assert r.best.output_tps >= max(p.output_tps for p in met) * (1 - TIE)
    assert "SLO met" in r.format_text()


def test_slo_missed_names_the_closest_and_why(q4_0_users4, capsys):
    r = advise("qwen35-27b", "v100-16gb", Workload(users=4, ttft_ms=1, tpot_ms=1000), quants=["Q4_0"])
    assert not r.slo_met and r.best.fits
    fitting = [p for p in r.plans if p.fits]
    assert not any(p.slo_met for p in fitting)
    assert r.best.excess <= min(p.excess for p in fitting) * (1 + TIE)
    assert r.best.excess == pytest.approx(r.best.ttft_ms / 1.0)
    msg = r.slo_message()
    assert "no configuration that fits meets the SLO" in msg and "TTFT" in msg and "prompt" in msg
    assert "TPOT" not in msg.split(":", 1)[1]        # the TPOT limit is met: not blamed
    # the command prints the closest configuration, exits 1 and says why on one stderr line
    rc = main(["tune", "qwen35-27b", "--quants", "Q4_0", "--device", "v100-16gb", "--users", "4", "--ttft-ms", "1"])
    out, err = capsys.readouterr()
    assert rc == 1 and out.count("llama-server -m") == 1 and "SLO MISSED" in out
    assert err.count("\n") == 1 and "closest" in err


def test_a_quantized_cache_fits_more_slots(tmp_path):
    """llama2-7b (32 KV heads), 4096 tokens per slot, four users on a 10 GB card: f16 KV for four slots (8 GiB)
    does not fit next to the weights, q8_0/q4_0 does — and four slots are what the advisor picks."""
    card = _card(tmp_path, "card10", 10)
    r = advise("skeleton:llama2-7b:Q4_0", card, Workload(users=4, min_ctx=4096))
    b = r.best
    assert b.slots == 4 and b.config.cache_type_v != "f16" and b.config.flash_attn == "on"
    assert b.candidate.offloaded_layers == b.candidate.n_layer_total
    spec = skeleton_spec("llama2-7b", "Q4_0")
    f16 = b.config.with_(cache_type_k="f16", cache_type_v="f16", flash_attn="auto")
    assert not memory.feasibility(spec, [get_device(card)], f16).fits
    assert memory.feasibility(spec, [get_device(card)], b.config).fits
    kv = next(x for x in r.reasons if x.flag.startswith("--cache-type-k"))
    assert "f16 does not fit at -np 4" in kv.why
    assert int(_arg(r.argv, "--ctx-size")) == 4 * 4096


def test_nothing_fits_recommends_nothing(tmp_path, capsys):
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text("id: tiny\nname: a tiny cpu\nkind: cpu\nmemory_gib: 0.05\nbandwidth_gbs: 20\nfp32_tflops: 1\n")
    with pytest.raises(NothingFits) as e:
        advise("skeleton:llama2-7b:Q4_0", tiny, Workload(users=2))
    assert "nothing fits tiny" in str(e.value) and not e.value.result.closest.fits
    rc = main(["tune", "skeleton:llama2-7b:Q4_0", "--device", str(tiny), "--users", "2", "--json"])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert rc == 1 and doc["fits"] is False and doc["argv"] == [] and doc["command"] is None
    assert err.count("\n") == 1 and "nothing fits" in err


def test_real_header_tidy_rows_and_json(default_model, capsys):
    """The default model's own GGUF header on a V100, 8 users: rows named as the --parallel lever names them."""
    _path, spec = resolve("default")
    r = advise("default", "v100-16gb", Workload(users=8, prompt_tokens=128, output_tokens=64))
    b = r.best
    assert b.slots == 8 and b.fits
    assert memory.feasibility(spec, [get_device("v100-16gb")], b.config).fits
    assert b.tg_tps > b.tg_tps_per_stream > 0
    assert b.tg_tps == pytest.approx(b.serving.batch.aggregate_tps)
    assert b.tg_tps_per_stream == pytest.approx(1000 / b.tpot_ms)
    df = r.frame()
    assert set(df["source"]) == {"predicted"}
    assert {"tg_tps", "tg_tps_per_stream", "output_tps", "ttft_ms", "tpot_ms", "fits"} <= set(df["metric"])
    mine = df[df["value"] == b.label].set_index("metric")["result"]
    assert mine["ttft_ms"] == pytest.approx(b.ttft_ms) and mine["tpot_ms"] == pytest.approx(b.tpot_ms)
    assert mine["tg_tps"] == pytest.approx(b.tg_tps) and mine["fits"] == 1.0
    # the command's JSON document (a contract)
    rc = main(["tune", "default", "--device", "v100-16gb", "--users", "8", "--prompt-tokens", "128",
               "--output-tokens", "64", "--ttft-ms", "60000", "--tpot-ms", "1000", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    for k in ("model", "device", "workload", "fits", "slo_met", "slo_message", "quant", "margin_bytes", "slots",
              "slot_ctx", "predicted", "config", "argv", "command", "reasons", "best", "per_slots", "plans", "notes"):
        assert k in doc
    assert doc["slo_met"] is True and doc["workload"]["users"] == 8 and doc["slots"] == 8
    assert set(doc["predicted"]) >= {"tg_tps", "tg_tps_per_stream", "output_tps", "ttft_ms", "tpot_ms"}
    assert doc["command"] == " ".join(doc["argv"]) and "--parallel" in doc["argv"]


def test_together_phases_batch_the_prompts(default_model):
    """phases=together (a benchmark's lockstep loop): every prompt of the batch before the first token."""
    r = advise("default", "v100-16gb", Workload(users=4, prompt_tokens=128, output_tokens=64, phases="together"))
    s = r.best.serving
    assert s.phases == "together" and s.batch.batch == 4
    assert s.ttft_ms == pytest.approx(4 * s.t_pp_s * 1e3)


def test_search_grid():
    assert slot_counts(4) == [1, 2, 3, 4]
    assert slot_counts(40) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 40]
    assert slot_counts(1000)[-1] == 256 and max(slot_counts(1000)) == 256
    assert slot_counts(5, parallel=2) == [2]
    assert ubatches(512) == [512, 256, 128] and ubatches(513)[0] == 1024 and ubatches(10_000)[0] == 2048
    assert ubatches(1) == [128]
    assert Workload(prompt_tokens=500, output_tokens=100).slot_ctx == 768
    assert Workload(min_ctx=2048).slot_ctx == 2048


@pytest.mark.parametrize("kwargs, flag", [
    ({"users": 0}, "--users"), ({"users": True}, "--users"), ({"users": 2.5}, "--users"),
    ({"prompt_tokens": 0}, "--prompt-tokens"), ({"output_tokens": -1}, "--output-tokens"),
    ({"ttft_ms": -5}, "--ttft-ms"), ({"ttft_ms": 0}, "--ttft-ms"), ({"tpot_ms": math.nan}, "--tpot-ms"),
    ({"tpot_ms": math.inf}, "--tpot-ms"), ({"min_ctx": 0}, "--min-ctx"), ({"phases": "random"}, "--phases"),
])
def test_bad_workload(kwargs, flag):
    with pytest.raises(ConfigError, match=flag):
        Workload(**kwargs)


def test_bad_input_through_the_command(capsys):
    for argv, flag in ((["--users", "0"], "--users"), (["--users", "2", "--ttft-ms", "-1"], "--ttft-ms"),
                       (["--tpot-ms", "0"], "--tpot-ms"), (["--users", "2", "--measure"], "--measure"),
                       (["--users", "2", "--parallel", "0"], "--parallel"),
                       (["--users", "2", "--parallel", "257"], "--parallel 257"),
                       (["--prompt-tokens", "-3"], "--prompt-tokens")):
        assert main(["tune", "qwen35-27b", "--device", "v100-16gb", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and flag in err, (argv, err)
    with pytest.raises(ConfigError, match="Workload"):
        advise("qwen35-27b", "v100-16gb", {"users": 4})


def test_single_stream_tune_keeps_its_defaults(capsys):
    """Without a workload flag, tune is unchanged: -c 4096, one slot."""
    assert main(["tune", "skeleton:qwen35-27b:Q4_0", "--device", "v100-16gb", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "workload" not in doc and doc["config"]["n_parallel"] == 1 and doc["min_ctx"] == 4096


def test_many_users_queue_behind_the_slots_that_fit_whole():
    """64 users on 16 GB: the closest plan keeps every layer on the card and queues; the reason says so."""
    r = advise("qwen35-27b", "v100-16gb", Workload(users=64, ttft_ms=5000, tpot_ms=100), quants=["Q4_0"])
    b = r.best
    assert not r.slo_met and b.fits and b.slots < 64 and b.serving.queue_ms > 0
    assert b.candidate.offloaded_layers == b.candidate.n_layer_total
    assert max(p.slots for p in r.per_slots()) == 64          # 64 slots fit only as a partial offload
    assert f"only up to -np {b.slots}" in r.slo_message() and "waiting for one of" in r.slo_message()
